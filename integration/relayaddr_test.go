package integration_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/grpctest"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// TestBinaryRelayAddress runs the real binary: two nodes advertise HTTP
// and gRPC addresses that no node can dial (loopback ports nothing listens
// on, as a port published on a client's machine is to the nodes), yet a
// keyed retry that reaches the wrong node is relayed to the job's node and
// answered with the same job, over HTTP and over gRPC: relays dial the
// record's relay addresses (advertise.go), not the client-facing ones.
func TestBinaryRelayAddress(t *testing.T) {
	t.Parallel()
	bin := buildOrSkip(t, "builds and runs the binary")
	dead := func() []string {
		return []string{"--advertise-http-addr", deadAddr(t), "--advertise-grpc-addr", deadAddr(t), "--allow-anonymous"}
	}
	etcdAddr := freeAddr(t)
	a := startProcNode(t, bin, "ra", append([]string{"--etcd-client-addr", etcdAddr}, dead()...)...)
	b := startProcNode(t, bin, "rb", append([]string{"--etcd-endpoints", "https://" + etcdAddr}, dead()...)...)

	// The premise: the advertised addresses in b's view answer nothing.
	var view procView
	waitFor(t, 20*time.Second, "ra and rb online in rb's view", func() bool { return view.allOnline(b, 2) })
	for _, n := range view.Nodes {
		for _, addr := range []string{n.HTTPAddr, n.GRPCAddr} {
			if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
				c.Close()
				t.Fatalf("%s's advertised address %s answers: the test needs one nobody can dial", n.ID, addr)
			}
		}
	}

	// A slow job made on ra (its worker is there, so ra dispatches), with
	// a key; it runs for a while, so its key stays on ra.
	_, wlog := startDemoWorker(t, bin, a.grpc, "relayed", "300ms")
	const env = `{"input":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty","ttl_ms":120000}`
	submit := func(n *procNode) (int, string, []byte) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+n.http+"/v1/queues/relayed/jobs", strings.NewReader(env))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "relay-me")
		res, err := killHTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("X-Job-Id"), body
	}
	var jobID string
	waitFor(t, 15*time.Second, "the keyed job accepted on ra", func() bool {
		status, _, body := submit(a)
		if status != http.StatusAccepted && status != http.StatusOK {
			return false
		}
		jobID = jobIDOfBytes(t, status, body)
		return true
	})

	// The retry through rb, over HTTP: relayed to ra, the same job.
	status, _, body := submit(b)
	if status != http.StatusOK || jobIDOfBytes(t, status, body) != jobID {
		t.Fatalf("the keyed retry through rb: %d %s, want 200 with job %s (relayed to ra)\nworker log:\n%s", status, body, jobID, wlog.String())
	}
	t.Logf("HTTP retry through rb: %d, job %s (made on ra)", status, jobID)

	// And over gRPC: rb relays the Submit to ra's gRPC API.
	conn := grpctest.Dial(t, b.grpc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := pb.NewJobServiceClient(conn).Submit(ctx, &pb.SubmitRequest{Queue: "relayed", EnvelopeJson: []byte(env), IdempotencyKey: "relay-me"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil || ev.GetJobId() != jobID {
		t.Fatalf("the keyed gRPC retry through rb: %v %v, want job %s (relayed to ra)", ev, err, jobID)
	}
	t.Logf("gRPC retry through rb: first event %s, job %s", ev.GetKind(), ev.GetJobId())
}

// jobIDOfBytes is the job_id of a job document.
func jobIDOfBytes(t *testing.T, status int, body []byte) string {
	t.Helper()
	return jobIDOf(t, &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(string(body)))})
}

// deadAddr returns a loopback address that nobody can dial while the test
// runs: its port is bound by a socket that never listens, so a dial is
// refused, and no listener (a node's own, bound to port 0, or another
// test's) can take the port meanwhile. A port merely free a moment ago
// (freeAddr) was once given by the kernel to the node advertising it.
func deadAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
