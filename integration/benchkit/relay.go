package benchkit

import (
	"bytes"
	"context"
	"encoding/json"
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

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Relay is the baseline a cross-node job is measured against: a bare relay
// of the same shape, with nothing else in it.
//
//	HTTP client ──POST──▶ A (net/http) ══gRPC stream══▶ B ══gRPC stream══▶ worker
//	            ◀──SSE─── A ◀══════════════════════════ B ◀═══════════════ (accept, outputs, end)
//
// StartRelay runs A and B as two parts of one process, as the in-process
// nodes of BenchmarkCluster are, joined by a real gRPC connection over
// loopback (one TCP connection from A to B), with a real SDK worker
// (package worker) connected to B's gRPC port, speaking the real
// WorkerService protocol, so the worker's own cost is the same as in the
// Switchyard measurement. StartRelayIngress and StartRelayNode run them as
// processes of their own, with RunBareWorker as the worker
// (BenchmarkProcesses).
//
// What it does, per job:
//
//   - A reads the POST body, decodes the envelope's "input" and "options"
//     (encoding/json, as ingress must), names the job with a counter, and
//     sends it to B as one switchyard.v1.Job message, proto-encoded on a
//     gRPC bidi stream of a hand-registered service
//     (switchyard.bench.v1.Relay/Jobs, which carries existing worker.proto
//     messages: Job one way, WorkerMessage the other; no new proto). Two
//     ways, each its own URL prefix (Target):
//     ModeStreamPerJob opens a new stream for the job on A's one connection
//     to B, sends the job, half-closes, and reads the job's answers from it;
//     ModeSharedStream sends it on one long-lived stream that A opened at
//     start and that carries every job, A demultiplexing the answers by job
//     id to the waiting request (the shape of a delivery stream).
//   - B sends the job to the worker as a NodeMessage on the worker's
//     Connect stream and records, by job id, which A-stream answers it.
//   - B's receive loop on the worker stream sends each Accept, Output and
//     the Complete/Fail/Reject of the job, unchanged, on that A-stream
//     (directly, from that loop: no queue, no extra goroutine).
//   - A writes each answer as one SSE event and flushes: "accepted",
//     "output" (data {"job_id","data"}), then "done" (data {"job_id",
//     "result"}) or "error" — the event types and count a Switchyard job
//     stream has for the same job.
//   - B answers Register with Registered and sends a heartbeat to the worker
//     every heartbeat interval (the SDK ends a session whose node is
//     silent); it ignores the worker's heartbeats.
//
// What it does not do: no queue and no dispatch (a job goes to the one
// worker at once; the worker's Concurrency must cover the client's, or it
// rejects and the job ends "error"), no credits, no capability or zone
// matching, no TTL or deadline handling beyond passing ttl_ms on, no job
// record, history, retention or resume tokens, no event sequence numbers
// or ids, no cancellation when the client leaves (the job runs to its end),
// no authentication between A and B, no per-message acks, no ordering or
// dedup machinery beyond what one gRPC stream gives, no catalog (etcd), no
// metrics, no logging, no retry or fallback when a stream breaks (a broken
// shared stream fails the jobs waiting on it and every later one). Output
// data is assumed to be compact JSON (the SDK's Send marshals it so); data
// with a line break is compacted first.
type Relay struct {
	httpSrv  *http.Server
	httpLn   net.Listener
	grpcSrv  *grpc.Server
	grpcLn   net.Listener
	conn     *grpc.ClientConn // A → B
	seq      atomic.Uint64
	hb       time.Duration
	wg       sync.WaitGroup
	cancel   context.CancelFunc
	shared   *sharedStream
	workerMu sync.Mutex
	worker   *relayWorker // the connected worker, nil until one registers
	ready    chan struct{}
}

// Relay modes, each its own URL prefix (Target).
const (
	ModeStreamPerJob = "stream"
	ModeSharedStream = "shared"
)

const (
	relayService = "switchyard.bench.v1.Relay"
	relayMethod  = "/" + relayService + "/Jobs"
	// relayTTL is the ttl_ms sent with every job, Switchyard's default TTL.
	relayTTL = time.Minute
)

// relayDesc registers the A→B stream by hand: a bidi stream whose client
// sends switchyard.v1.Job and whose server sends switchyard.v1.WorkerMessage,
// with gRPC's default (proto) codec.
var relayDesc = grpc.ServiceDesc{
	ServiceName: relayService,
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Jobs",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			return srv.(*Relay).serveJobs(ss)
		},
	}},
}

// StartRelay starts A's HTTP listener and B's gRPC listener on loopback
// ephemeral ports and opens A's connection (and shared stream) to B, all in
// this process. heartbeat is the interval B asks the worker for and
// heartbeats at; 0 means 2s, the node's default. Close it when done.
func StartRelay(heartbeat time.Duration) (*Relay, error) {
	r, err := StartRelayNode("127.0.0.1:0", heartbeat)
	if err != nil {
		return nil, err
	}
	if err := r.startIngress("127.0.0.1:0", r.grpcLn.Addr().String()); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// StartRelayNode starts B alone, listening for A-streams and the worker's
// session on addr: the relay's middle node as a process of its own
// (BenchmarkProcesses). Close it when done.
func StartRelayNode(addr string, heartbeat time.Duration) (*Relay, error) {
	if heartbeat <= 0 {
		heartbeat = 2 * time.Second
	}
	r := &Relay{hb: heartbeat, ready: make(chan struct{})}
	var err error
	if r.grpcLn, err = net.Listen("tcp", addr); err != nil {
		return nil, err
	}
	r.grpcSrv = grpc.NewServer()
	r.grpcSrv.RegisterService(&relayDesc, r)
	pb.RegisterWorkerServiceServer(r.grpcSrv, relayWorkerService{r: r})
	r.wg.Go(func() { _ = r.grpcSrv.Serve(r.grpcLn) })
	return r, nil
}

// StartRelayIngress starts A alone, serving HTTP on addr and relaying to
// the B at node: the relay's ingress as a process of its own. Close it when
// done.
func StartRelayIngress(addr, node string) (*Relay, error) {
	r := &Relay{ready: make(chan struct{})}
	if err := r.startIngress(addr, node); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Relay) startIngress(addr, node string) error {
	var err error
	if r.httpLn, err = net.Listen("tcp", addr); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /"+ModeStreamPerJob+"/v1/queues/{queue}/jobs", func(w http.ResponseWriter, req *http.Request) { r.handle(w, req, false) })
	mux.HandleFunc("POST /"+ModeSharedStream+"/v1/queues/{queue}/jobs", func(w http.ResponseWriter, req *http.Request) { r.handle(w, req, true) })
	r.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	r.wg.Go(func() { _ = r.httpSrv.Serve(r.httpLn) })

	if r.conn, err = grpc.NewClient(node, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	cs, err := r.conn.NewStream(ctx, &relayDesc.Streams[0], relayMethod)
	if err != nil {
		return fmt.Errorf("open shared stream: %w", err)
	}
	r.shared = &sharedStream{cs: cs, waiting: map[string]chan *pb.WorkerMessage{}}
	r.wg.Go(r.shared.receive)
	return nil
}

// WorkerAddr is B's gRPC address: point the SDK worker's Server at it.
// Only for a Relay that runs B.
func (r *Relay) WorkerAddr() string { return r.grpcLn.Addr().String() }

// Target is the jobs URL of queue through mode (ModeStreamPerJob or
// ModeSharedStream). The queue name is passed on to the worker, not used.
// Only for a Relay that runs A.
func (r *Relay) Target(mode, queue string) string {
	return "http://" + r.httpLn.Addr().String() + "/" + mode + "/v1/queues/" + queue + "/jobs"
}

// WaitWorker waits until a worker has registered at B (a Relay that runs B).
func (r *Relay) WaitWorker(ctx context.Context) error {
	return waitClosed(ctx, r.ready)
}

// Close stops everything the relay started; a connected worker's stream
// ends (stop the worker first to spare it a reconnect attempt).
func (r *Relay) Close() {
	if r.httpSrv != nil {
		_ = r.httpSrv.Close()
	}
	if r.cancel != nil {
		r.cancel()
	}
	if r.conn != nil {
		_ = r.conn.Close()
	}
	if r.grpcSrv != nil {
		r.grpcSrv.Stop()
	}
	r.wg.Wait()
}

// --- A: HTTP in, gRPC out ---------------------------------------------------

func (r *Relay) handle(w http.ResponseWriter, req *http.Request, shared bool) {
	var env struct {
		Input   json.RawMessage `json:"input"`
		Options json.RawMessage `json:"options"`
	}
	if err := json.NewDecoder(req.Body).Decode(&env); err != nil {
		http.Error(w, "bad envelope: "+err.Error(), http.StatusBadRequest)
		return
	}
	job := &pb.Job{
		JobId: strconv.FormatUint(r.seq.Add(1), 36), Generation: 1, Queue: req.PathValue("queue"),
		Input: env.Input, Options: env.Options, TtlMs: relayTTL.Milliseconds(),
	}
	if shared {
		r.viaShared(w, job)
	} else {
		r.viaStream(req.Context(), w, job)
	}
}

// viaStream opens a stream for this job alone.
func (r *Relay) viaStream(ctx context.Context, w http.ResponseWriter, job *pb.Job) {
	cs, err := r.conn.NewStream(ctx, &relayDesc.Streams[0], relayMethod)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if err := cs.SendMsg(job); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	_ = cs.CloseSend()
	startSSE(w)
	for {
		m := new(pb.WorkerMessage)
		if err := cs.RecvMsg(m); err != nil {
			return
		}
		if writeEvent(w, job.GetJobId(), m) {
			break
		}
	}
	// Let the stream end cleanly (B's trailers) rather than reset it.
	var m pb.WorkerMessage
	for cs.RecvMsg(&m) == nil {
	}
}

// viaShared sends the job on the shared stream and waits for its answers.
func (r *Relay) viaShared(w http.ResponseWriter, job *pb.Job) {
	ch, err := r.shared.send(job)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	startSSE(w)
	for m := range ch {
		if writeEvent(w, job.GetJobId(), m) {
			return
		}
	}
}

// sharedStream is A's one long-lived stream to B, carrying every job sent
// through ModeSharedStream; its receive loop hands each answer to the
// request waiting for that job.
type sharedStream struct {
	cs     grpc.ClientStream
	sendMu sync.Mutex

	mu      sync.Mutex
	broken  error
	waiting map[string]chan *pb.WorkerMessage
}

// answersPerJob bounds the answers buffered for one waiting request before
// the receive loop waits for it: accept, outputs, end of a short job.
const answersPerJob = 64

func (s *sharedStream) send(job *pb.Job) (<-chan *pb.WorkerMessage, error) {
	ch := make(chan *pb.WorkerMessage, answersPerJob)
	s.mu.Lock()
	if s.broken != nil {
		s.mu.Unlock()
		return nil, s.broken
	}
	s.waiting[job.GetJobId()] = ch
	s.mu.Unlock()
	s.sendMu.Lock()
	err := s.cs.SendMsg(job)
	s.sendMu.Unlock()
	if err != nil {
		s.mu.Lock()
		delete(s.waiting, job.GetJobId())
		s.mu.Unlock()
		return nil, err
	}
	return ch, nil
}

func (s *sharedStream) receive() {
	for {
		m := new(pb.WorkerMessage)
		if err := s.cs.RecvMsg(m); err != nil {
			s.mu.Lock()
			s.broken = fmt.Errorf("shared stream: %w", err)
			for id, ch := range s.waiting {
				close(ch)
				delete(s.waiting, id)
			}
			s.mu.Unlock()
			return
		}
		id, terminal := answerOf(m)
		if ch := take(&s.mu, &s.waiting, id, terminal); ch != nil {
			ch <- m
			if terminal {
				close(ch)
			}
		}
	}
}

func startSSE(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
}

// writeEvent writes m as one SSE event and flushes it; true when it was the
// job's end.
func writeEvent(w http.ResponseWriter, id string, m *pb.WorkerMessage) (terminal bool) {
	var b bytes.Buffer
	quoted, _ := json.Marshal(id)
	switch x := m.GetMsg().(type) {
	case *pb.WorkerMessage_Accept:
		b.WriteString("event: accepted\ndata: {\"job_id\":")
		b.Write(quoted)
		b.WriteString("}\n\n")
	case *pb.WorkerMessage_Output:
		b.WriteString("event: output\ndata: {\"job_id\":")
		b.Write(quoted)
		b.WriteString(",\"data\":")
		b.Write(oneLine(x.Output.GetData()))
		b.WriteString("}\n\n")
	case *pb.WorkerMessage_Complete:
		b.WriteString("event: done\ndata: {\"job_id\":")
		b.Write(quoted)
		b.WriteString(",\"result\":")
		if r := x.Complete.GetResult(); len(r) > 0 {
			b.Write(oneLine(r))
		} else {
			b.WriteString("null")
		}
		b.WriteString("}\n\n")
		terminal = true
	case *pb.WorkerMessage_Fail:
		code, _ := json.Marshal(x.Fail.GetCode())
		b.WriteString("event: error\ndata: {\"job_id\":")
		b.Write(quoted)
		b.WriteString(",\"code\":")
		b.Write(code)
		b.WriteString("}\n\n")
		terminal = true
	case *pb.WorkerMessage_Reject:
		b.WriteString("event: error\ndata: {\"job_id\":")
		b.Write(quoted)
		b.WriteString(",\"code\":\"rejected\"}\n\n")
		terminal = true
	default:
		return false
	}
	_, _ = w.Write(b.Bytes())
	_ = http.NewResponseController(w).Flush()
	return terminal
}

// oneLine returns JSON data fit for one SSE data line.
func oneLine(data []byte) []byte {
	if !bytes.ContainsAny(data, "\r\n") {
		return data
	}
	var b bytes.Buffer
	if json.Compact(&b, data) != nil {
		return []byte("null")
	}
	return b.Bytes()
}

// answerOf is the job an answer is about, and whether it ends the job.
func answerOf(m *pb.WorkerMessage) (id string, terminal bool) {
	switch x := m.GetMsg().(type) {
	case *pb.WorkerMessage_Accept:
		return x.Accept.GetJobId(), false
	case *pb.WorkerMessage_Output:
		return x.Output.GetJobId(), false
	case *pb.WorkerMessage_Complete:
		return x.Complete.GetJobId(), true
	case *pb.WorkerMessage_Fail:
		return x.Fail.GetJobId(), true
	case *pb.WorkerMessage_Reject:
		return x.Reject.GetJobId(), true
	}
	return "", false
}

// --- B: gRPC from A, the worker's stream -------------------------------------

// jobStream is one A-stream at B: where the answers of the jobs it carried
// go.
type jobStream struct {
	ss grpc.ServerStream

	mu     sync.Mutex // held while sending, so closed is final once set
	closed bool       // the handler returned or is returning: send nothing
	open   int        // jobs sent to the worker, not yet ended
	eof    bool       // A half-closed: return once open is 0
	idle   chan struct{}
}

// answer sends m on the stream (called by the worker's receive loop only).
func (s *jobStream) answer(m *pb.WorkerMessage, terminal bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed && s.ss.SendMsg(m) != nil {
		s.closed = true
	}
	if terminal {
		s.open--
		if s.open == 0 && s.eof {
			close(s.idle)
		}
	}
}

// serveJobs is B's side of an A-stream: each Job received goes to the
// worker; the answers come back through jobStream.answer.
func (r *Relay) serveJobs(ss grpc.ServerStream) error {
	s := &jobStream{ss: ss, idle: make(chan struct{})}
	defer func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
	}()
	for {
		job := new(pb.Job)
		err := ss.RecvMsg(job)
		if errors.Is(err, io.EOF) {
			s.mu.Lock()
			s.eof = true
			done := s.open == 0
			s.mu.Unlock()
			if !done {
				select {
				case <-s.idle:
				case <-ss.Context().Done():
				}
			}
			return nil
		}
		if err != nil {
			return err
		}
		w := r.currentWorker()
		s.mu.Lock()
		s.open++
		s.mu.Unlock()
		if w == nil || w.offer(job, s) != nil {
			s.answer(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{
				JobId: job.GetJobId(), Generation: job.GetGeneration(), Code: "no_worker", Message: "no worker connected to the relay",
			}}}, true)
		}
	}
}

func (r *Relay) currentWorker() *relayWorker {
	r.workerMu.Lock()
	defer r.workerMu.Unlock()
	return r.worker
}

// relayWorker is the connected worker's Connect stream at B.
type relayWorker struct {
	stream grpc.BidiStreamingServer[pb.WorkerMessage, pb.NodeMessage]
	sendMu sync.Mutex

	mu   sync.Mutex
	jobs map[string]*jobStream
}

// offer sends job to the worker; its answers will go to s. An error means
// the job is not the worker's and the caller must end it; once the job is
// in w.jobs its end comes from the worker, or from Connect when the worker
// is lost.
func (w *relayWorker) offer(job *pb.Job, s *jobStream) error {
	id := job.GetJobId()
	w.mu.Lock()
	if w.jobs == nil {
		w.mu.Unlock()
		return errors.New("worker lost")
	}
	w.jobs[id] = s
	w.mu.Unlock()
	if err := w.send(&pb.NodeMessage{Msg: &pb.NodeMessage_Job{Job: job}}); err != nil {
		w.mu.Lock()
		_, mine := w.jobs[id]
		delete(w.jobs, id)
		w.mu.Unlock()
		if mine {
			return err
		}
	}
	return nil
}

func (w *relayWorker) send(m *pb.NodeMessage) error {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	return w.stream.Send(m)
}

type relayWorkerService struct {
	pb.UnimplementedWorkerServiceServer
	r *Relay
}

// Connect serves one worker session: Register → Registered, heartbeats out,
// answers relayed to the A-stream of their job.
func (s relayWorkerService) Connect(stream grpc.BidiStreamingServer[pb.WorkerMessage, pb.NodeMessage]) error {
	r := s.r
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.GetRegister() == nil {
		return errors.New("relay: first worker message is not Register")
	}
	w := &relayWorker{stream: stream, jobs: map[string]*jobStream{}}
	if err := w.send(&pb.NodeMessage{Msg: &pb.NodeMessage_Registered{Registered: &pb.Registered{
		ConsumerId: "relay-consumer", Node: "relay-b", HeartbeatMs: r.hb.Milliseconds(),
	}}}); err != nil {
		return err
	}
	r.workerMu.Lock()
	r.worker = w
	select {
	case <-r.ready:
	default:
		close(r.ready)
	}
	r.workerMu.Unlock()
	defer func() {
		r.workerMu.Lock()
		if r.worker == w {
			r.worker = nil
		}
		r.workerMu.Unlock()
	}()

	ctx, stop := context.WithCancel(stream.Context())
	defer stop()
	var hb sync.WaitGroup
	defer hb.Wait()
	beat := &pb.NodeMessage{Msg: &pb.NodeMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
	hb.Go(func() { heartbeat(ctx, r.hb, func() error { return w.send(beat) }) })
	for {
		m, err := stream.Recv()
		if err != nil {
			stop()
			// Jobs in flight on this worker end with an error.
			w.mu.Lock()
			jobs := w.jobs
			w.jobs = nil
			w.mu.Unlock()
			for id, js := range jobs {
				js.answer(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{JobId: id, Code: "worker_lost"}}}, true)
			}
			return err
		}
		id, terminal := answerOf(m)
		if id == "" {
			continue // heartbeat, or nothing the relay carries
		}
		if js := take(&w.mu, &w.jobs, id, terminal); js != nil {
			js.answer(m, terminal)
		}
	}
}

// take looks up whom the answer to job id goes to in *m, under mu (which
// guards the map and the variable), and forgets them when the answer is the
// job's last (terminal).
func take[V any](mu *sync.Mutex, m *map[string]V, id string, terminal bool) V {
	mu.Lock()
	defer mu.Unlock()
	v := (*m)[id]
	if terminal {
		delete(*m, id)
	}
	return v
}
