package grpcapi

import (
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// A Submit whose idempotency key made a job on another node is relayed
// there under core's relay rules (core/relay.go): the other node matches
// the key and streams the same job, and this node copies the stream. The
// caller's credential goes along; the call is marked with this node.

// MetadataRelayedBy marks a relayed call with the relaying node.
const MetadataRelayedBy = "x-switchyard-relayed-by"

// relaySubmit streams req's job from jw.Node to gs: it reads the other
// node's Submit, whatever gs's framing (every node serves Submit, whatever
// its version), and sends each event in a batch of its own when batched.
func (s *JobServer) relaySubmit(gs grpc.ServerStream, batched bool, req *pb.SubmitRequest, jw *core.JobElsewhere) error {
	ctx := gs.Context()
	addr, err := core.RelayTarget(s.cfg.Cluster, jw, first(metadata.ValueFromIncomingContext(ctx, MetadataRelayedBy)),
		core.NodeInfo.RelayGRPC)
	if err != nil {
		return s.fail("Submit", err)
	}
	unreachable := func(err error) error {
		s.log.Warn("relay a keyed submission", "node", jw.Node, "job", jw.Job, "err", err)
		return s.fail("Submit", core.RelayUnreachable(jw))
	}
	creds := insecure.NewCredentials()
	if s.cfg.RelayTLS != nil {
		creds = credentials.NewTLS(s.cfg.RelayTLS)
	}
	// One connection per relay: relays are rare (retries that changed
	// node), and a pooled connection would need an owner to close it.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return unreachable(err)
	}
	defer conn.Close()
	md := metadata.Pairs(MetadataRelayedBy, s.e.Config().Node)
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		md.Set("authorization", v[0])
	}
	st, err := pb.NewJobServiceClient(conn).Submit(metadata.NewOutgoingContext(ctx, md), req)
	if err != nil {
		return unreachable(err)
	}
	hdr, err := st.Header()
	if err != nil {
		return unreachable(err)
	}
	_ = gs.SetHeader(metadata.Pairs(HeaderJobID, first(hdr.Get(HeaderJobID))))
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			// The other node's status, which carries its code: passed on.
			return err
		}
		var m any = ev
		if batched {
			m = &pb.JobEventBatch{Events: []*pb.JobEvent{ev}}
		}
		if err := gs.SendMsg(m); err != nil {
			return err
		}
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
