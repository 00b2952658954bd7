package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FrameNode is the middle hop (B) of the opaque relay floor, the floor
// BenchmarkProcesses judges Switchyard against:
//
//	HTTP client ──POST──▶ FrameIngress ══Forward══▶ FrameNode ══Attach══▶ RunFrameWorker
//	            ◀──SSE─── FrameIngress ◀═══════════ FrameNode ◀══════════ (the job's frames)
//
// It measures what moving a job and its answers through two gRPC hops costs
// when nothing else is done: each hop reads a frame's 11-byte header to
// route it and passes the message on unchanged (frames.go). It is the
// reference kit's relay (../shared/bench, the relay-node process) made our
// own, so `make bench` and the kit agree on the floor.
//
// Per frame, B does: from an ingress, note which Forward stream the job id
// answers to and send the frame to the worker; from the worker, look the
// job id up, forget it on the last frame, and send the frame back on that
// stream. Nothing else: no queue, no credits, no job record, no event ids
// beyond the worker's seq, no cancellation, no authentication. It serves one
// worker (the last to attach) and expects one ingress (job ids are the
// ingress's own counter). A job that finds no worker, or whose worker is
// lost, ends with one frame flagged frameLast|frameFailed.
type FrameNode struct {
	srv *grpc.Server
	ln  net.Listener
	wg  sync.WaitGroup

	mu       sync.Mutex
	worker   *frameWorker          // nil until one attaches
	routes   map[uint64]frameRoute // jobs sent to a worker, not yet ended
	attached chan struct{}         // closed when the first worker attaches
}

// frameRoute is where a job's answers go, and which worker has it.
type frameRoute struct {
	back *lockedStream
	w    *frameWorker
}

// frameWorker is the attached worker's stream.
type frameWorker struct{ s *lockedStream }

// lockedStream serialises sends on a gRPC stream (one sender at a time).
type lockedStream struct {
	mu sync.Mutex
	s  interface{ SendMsg(any) error }
}

func (l *lockedStream) send(m any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.SendMsg(m)
}

// StartFrameNode listens on addr for ingress (Forward) and worker (Attach)
// streams. Close it when done.
func StartFrameNode(addr string) (*FrameNode, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	n := &FrameNode{ln: ln, srv: grpc.NewServer(), routes: map[uint64]frameRoute{}, attached: make(chan struct{})}
	n.srv.RegisterService(&frameDesc, n)
	n.wg.Go(func() { _ = n.srv.Serve(ln) })
	return n, nil
}

// Addr is the node's address: the ingress's and the worker's to dial.
func (n *FrameNode) Addr() string { return n.ln.Addr().String() }

// WaitWorker waits until a worker has attached.
func (n *FrameNode) WaitWorker(ctx context.Context) error {
	return waitClosed(ctx, n.attached)
}

// waitClosed waits until ch is closed (nil) or ctx ends (its error).
func waitClosed(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the node; every stream on it ends.
func (n *FrameNode) Close() {
	n.srv.Stop()
	n.wg.Wait()
}

// failed is the frame that ends job id with reason.
func failed(id uint64, reason string) *wrapperspb.BytesValue {
	return newFrame(frameHeader{id: id, flags: frameLast | frameFailed}, []byte(reason))
}

// forward serves one ingress: every frame on it is a job for the worker.
func (n *FrameNode) forward(ss grpc.ServerStream) error {
	back := &lockedStream{s: ss}
	for {
		m, h, err := recvFrame(ss, "ingress")
		if m == nil {
			return err
		}
		n.mu.Lock()
		w := n.worker
		if w != nil {
			n.routes[h.id] = frameRoute{back, w}
		}
		n.mu.Unlock()
		if w == nil {
			_ = back.send(failed(h.id, "no worker"))
			continue
		}
		if w.s.send(m) != nil && n.take(h.id, true).back != nil {
			_ = back.send(failed(h.id, "worker lost"))
		}
	}
}

// recvFrame receives the next frame from ss, which from names. At the
// stream's end m is nil, and err too when the stream ended cleanly (EOF).
func recvFrame(ss grpc.ServerStream, from string) (m *wrapperspb.BytesValue, h frameHeader, err error) {
	m = new(wrapperspb.BytesValue)
	if err := ss.RecvMsg(m); err != nil {
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return nil, h, err
	}
	h, _, ok := readFrame(m)
	if !ok {
		return nil, h, fmt.Errorf("frame relay: short frame from %s", from)
	}
	return m, h, nil
}

// take is job id's route, forgotten when last.
func (n *FrameNode) take(id uint64, last bool) frameRoute {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.routes[id]
	if last {
		delete(n.routes, id)
	}
	return r
}

// attach serves the worker: every frame on it answers a job, back to the
// ingress that sent the job. When the worker goes, its jobs fail.
func (n *FrameNode) attach(ss grpc.ServerStream) error {
	w := &frameWorker{s: &lockedStream{s: ss}}
	n.mu.Lock()
	n.worker = w
	select {
	case <-n.attached:
	default:
		close(n.attached)
	}
	n.mu.Unlock()
	defer n.lose(w)
	for {
		m, h, err := recvFrame(ss, "worker")
		if m == nil {
			return err
		}
		if r := n.take(h.id, h.flags&frameLast != 0); r.back != nil {
			_ = r.back.send(m) // a broken ingress stream only loses its own jobs
		}
	}
}

// lose detaches w and fails the jobs it had.
func (n *FrameNode) lose(w *frameWorker) {
	n.mu.Lock()
	if n.worker == w {
		n.worker = nil
	}
	var lost map[uint64]*lockedStream
	for id, r := range n.routes {
		if r.w == w {
			if lost == nil {
				lost = map[uint64]*lockedStream{}
			}
			lost[id] = r.back
			delete(n.routes, id)
		}
	}
	n.mu.Unlock()
	for id, back := range lost {
		_ = back.send(failed(id, "worker lost"))
	}
}
