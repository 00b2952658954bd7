package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FrameIngress is the HTTP edge (A) of the opaque relay floor (FrameNode
// shows the whole path). Per job it reads the POST body, sends it as one
// frame on its one long-lived Forward stream to the node, and writes each
// frame that comes back as the smallest SSE event that still carries a
// resume id:
//
//	id: <seq>
//	data: <payload>
//
// flushing after each; the job's last frame ends the response. A failed
// job's last frame is written as "event: error" with its reason as data.
// The body is not decoded (the worker reads what it needs from it), and
// payloads are written as they come: they must be one line of text, which
// RunFrameWorker's are. It is the reference kit's relay-ingress made our
// own: it measures the HTTP/SSE edge plus one gRPC hop, with nothing else.
type FrameIngress struct {
	httpSrv *http.Server
	ln      net.Listener
	grpcSrv *grpc.Server // the gRPC edge, if served
	grpcLn  net.Listener
	conn    *grpc.ClientConn
	up      *lockedStream
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	next    atomic.Uint64

	mu      sync.Mutex
	broken  bool                       // the Forward stream ended: no more jobs
	pending map[uint64]*frameJobWaiter // jobs sent, not yet ended
}

// frameJobWaiter is a request waiting for its job's frames.
type frameJobWaiter struct {
	id     uint64
	frames chan *wrapperspb.BytesValue // closed if the Forward stream breaks
	gone   chan struct{}               // closed when the request returns
}

// framesPerJob bounds the frames buffered for one request before the
// receive loop waits for it.
const framesPerJob = 64

// maxFrameBody bounds a job's POST body (a 16 × 4 KiB demo envelope is
// about 64 KiB).
const maxFrameBody = 1 << 20

// StartFrameIngress serves POST {URL} on addr and, unless grpcAddr is "",
// the gRPC edge (frameedge.go) on grpcAddr, and opens its Forward stream to
// the FrameNode at node. Close it when done.
func StartFrameIngress(addr, grpcAddr, node string) (*FrameIngress, error) {
	in := &FrameIngress{pending: map[uint64]*frameJobWaiter{}}
	var err error
	if in.conn, err = grpc.NewClient(node, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	cs, err := in.conn.NewStream(ctx, &frameDesc.Streams[0], frameForward)
	if err != nil {
		in.Close()
		return nil, fmt.Errorf("open forward stream: %w", err)
	}
	in.up = &lockedStream{s: cs}
	in.wg.Go(func() { in.receive(cs) })
	if in.ln, err = net.Listen("tcp", addr); err != nil {
		in.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /job", in.serveJob)
	in.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	in.wg.Go(func() { _ = in.httpSrv.Serve(in.ln) })
	if grpcAddr != "" {
		if in.grpcLn, err = net.Listen("tcp", grpcAddr); err != nil {
			in.Close()
			return nil, err
		}
		in.grpcSrv = grpc.NewServer()
		in.grpcSrv.RegisterService(&frameEdgeDesc, in)
		in.wg.Go(func() { _ = in.grpcSrv.Serve(in.grpcLn) })
	}
	return in, nil
}

// GRPCAddr is where the gRPC edge listens ("" without one).
func (in *FrameIngress) GRPCAddr() string {
	if in.grpcLn == nil {
		return ""
	}
	return in.grpcLn.Addr().String()
}

// URL is where jobs are posted.
func (in *FrameIngress) URL() string { return "http://" + in.ln.Addr().String() + "/job" }

// Close stops the ingress: requests in flight end, the Forward stream too.
func (in *FrameIngress) Close() {
	if in.httpSrv != nil {
		_ = in.httpSrv.Close()
	}
	if in.grpcSrv != nil {
		in.grpcSrv.Stop()
	}
	in.cancel()
	_ = in.conn.Close()
	in.wg.Wait()
}

func (in *FrameIngress) serveJob(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxFrameBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	jw, err := in.open(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer in.end(jw)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 256)
	for {
		select {
		case m, open := <-jw.frames:
			if !open {
				return // the stream broke: the response ends short of its last frame
			}
			hd, p, _ := readFrame(m)
			if hd.flags&frameFailed != 0 {
				buf = append(buf[:0], "event: error\ndata: "...)
			} else {
				buf = append(buf[:0], "id: "...)
				buf = strconv.AppendUint(buf, uint64(hd.seq), 10)
				buf = append(buf, "\ndata: "...)
			}
			buf = append(append(buf, p...), "\n\n"...)
			if _, err := w.Write(buf); err != nil {
				return
			}
			_ = rc.Flush()
			if hd.flags&frameLast != 0 {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

// errBroken: the Forward stream to the node ended, so no job can be sent.
var errBroken = errors.New("relay stream broken")

// open sends a job whose envelope is body to the node and returns the
// waiter its frames come to; end it with end.
func (in *FrameIngress) open(body []byte) (*frameJobWaiter, error) {
	jw := &frameJobWaiter{id: in.next.Add(1), frames: make(chan *wrapperspb.BytesValue, framesPerJob), gone: make(chan struct{})}
	in.mu.Lock()
	if in.broken {
		in.mu.Unlock()
		return nil, errBroken
	}
	in.pending[jw.id] = jw
	in.mu.Unlock()
	if err := in.up.send(newFrame(frameHeader{id: jw.id}, body)); err != nil {
		in.end(jw)
		return nil, err
	}
	return jw, nil
}

// end forgets jw: frames still to come for it are dropped.
func (in *FrameIngress) end(jw *frameJobWaiter) {
	close(jw.gone)
	in.mu.Lock()
	delete(in.pending, jw.id)
	in.mu.Unlock()
}

// receive hands each frame from the node to the request waiting for its
// job; when the stream ends, every waiting request ends.
func (in *FrameIngress) receive(cs grpc.ClientStream) {
	for {
		m := new(wrapperspb.BytesValue)
		if err := cs.RecvMsg(m); err != nil {
			in.mu.Lock()
			in.broken = true
			for id, jw := range in.pending {
				close(jw.frames)
				delete(in.pending, id)
			}
			in.mu.Unlock()
			return
		}
		h, _, ok := readFrame(m)
		if !ok {
			continue
		}
		in.mu.Lock()
		jw := in.pending[h.id]
		if h.flags&frameLast != 0 {
			delete(in.pending, h.id)
		}
		in.mu.Unlock()
		if jw != nil {
			select {
			case jw.frames <- m:
			case <-jw.gone: // the client left
			}
		}
	}
}
