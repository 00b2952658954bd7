package switchyard

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
)

// peerFigures is httpapi's Config.PeerFigures: every other node of the
// catalog asked for its figures at once, each within ctx's deadline. A
// node this node holds spare is not asked (it would only cost the
// deadline), nor one without a peer address.
func (n *Node) peerFigures(ctx context.Context) []core.NodeFigures {
	var nodes []core.NodeInfo
	for _, nd := range n.views().Nodes() {
		if nd.ID != n.cfg.Name {
			nodes = append(nodes, nd)
		}
	}
	out := make([]core.NodeFigures, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		switch {
		case nd.State == core.StateSpare:
			out[i] = core.NodeFigures{Node: nd.ID, Err: "silent to this node's pings: not asked"}
			continue
		case nd.PeerAddr == "":
			out[i] = core.NodeFigures{Node: nd.ID, Err: "no peer address in its record"}
			continue
		}
		wg.Go(func() {
			f, err := n.peer.Client().Figures(ctx, nd.ID, nd.PeerAddr)
			switch {
			case err != nil:
				out[i] = core.NodeFigures{Node: nd.ID, Err: "no answer: " + status.Convert(err).Message()}
			case f.Node != nd.ID:
				// The address moved to another node since the view was read.
				out[i] = core.NodeFigures{Node: nd.ID, Err: fmt.Sprintf("its address answers as %s", f.Node)}
			default:
				f.At = time.Now()
				out[i] = f
			}
		})
	}
	wg.Wait()
	return out
}
