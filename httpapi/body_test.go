package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
)

// offerConn is a core.WorkerConn that hands every offer to the test.
type offerConn struct{ offers chan core.Offer }

func (c offerConn) SendOffer(o core.Offer) error                       { c.offers <- o; return nil }
func (c offerConn) SendCancel(string, uint64, core.Code) error         { return nil }
func (c offerConn) SendCredit(string, uint64, core.OutputCredit) error { return nil }
func (c offerConn) Close(error)                                        {}

// newBodyServer runs the API over a real connection (deadlines need one)
// with the given body timeout, and a worker on queue "q" whose offers the
// test answers.
func newBodyServer(t *testing.T, bodyTimeout time.Duration) (*Server, *httptest.Server, *core.Worker, chan core.Offer) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.BodyTimeout = bodyTimeout
	s, e := newServerWith(t, core.DefaultConfig(), cfg, prometheus.NewRegistry())
	offers := make(chan core.Offer, 8)
	w, err := e.AttachWorker(context.Background(), core.WorkerSpec{Queue: "q", Name: "w", Concurrency: 4}, offerConn{offers})
	if err != nil {
		t.Fatal(err)
	}
	return s, serveConns(t, s), w, offers
}

// rawRequest writes head (a request line and headers) and then body on a
// fresh connection, and returns the connection and a reader of it.
func rawRequest(t *testing.T, ts *httptest.Server, head, body string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head+body); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// A body that stops arriving is answered 408 request_timeout once the body
// timeout has passed, the connection is closed, and no job exists.
func TestBodyTimeoutStalledBody(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s, ts, _, offers := newBodyServer(t, timeout)
	body := `{"input":"never finished"}`
	start := time.Now()
	c, br := rawRequest(t, ts, "POST /v1/queues/q/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)), body[:10])
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	took := time.Since(start)
	var p apierr.Problem
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	t.Logf("stalled body: %d %s after %v", res.StatusCode, p.Code, took.Round(time.Millisecond))
	if res.StatusCode != http.StatusRequestTimeout || p.Code != string(core.CodeRequestTimeout) ||
		res.Header.Get("Content-Type") != "application/problem+json" || !res.Close {
		t.Fatalf("answer %d %+v (close %v), want 408 request_timeout problem+json closing the connection", res.StatusCode, p, res.Close)
	}
	if took < timeout {
		t.Errorf("answered after %v, before the body timeout %v", took, timeout)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the 408 the connection reads %v, want EOF (closed)", err)
	}
	select {
	case o := <-offers:
		t.Fatalf("a stalled body created a job: %+v", o)
	default:
	}
	if n, _ := s.e.Retained(); n != 0 {
		t.Fatalf("%d jobs ended, want none created", n)
	}
}

// The body deadline is lifted once the body is read: a streamed job that
// runs for several body timeouts streams to its end.
func TestBodyTimeoutSparesTheStream(t *testing.T) {
	const timeout = 200 * time.Millisecond
	_, ts, w, offers := newBodyServer(t, timeout)
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/queues/q/jobs", strings.NewReader(`{"input":"slow"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	o := <-offers
	go func() {
		w.Accept(o.JobID, o.Gen)
		time.Sleep(3 * timeout)
		w.Output(o.JobID, o.Gen, []byte(`"late"`))
		w.End(o.JobID, o.Gen, "", "", nil)
	}()
	var got []string
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			t.Fatalf("stream cut after %v: %v", got, err)
		}
		got = append(got, ev.Type)
	}
	if strings.Join(got, ",") != "accepted,output,done" {
		t.Fatalf("events %v, want accepted,output,done", got)
	}
}

// A body on a route that does not read it is bounded too: the server
// drains it after the handler, within the same deadline, and then closes
// the connection.
func TestBodyTimeoutUnreadBody(t *testing.T) {
	const timeout = 300 * time.Millisecond
	_, ts, _, _ := newBodyServer(t, timeout)
	start := time.Now()
	c, br := rawRequest(t, ts, "DELETE /v1/jobs/j_nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nab")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d, want 404", res.StatusCode)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("connection reads %v, want EOF once the body deadline passed", err)
	}
	t.Logf("unread stalled body: %d, connection closed after %v", res.StatusCode, time.Since(start).Round(time.Millisecond))
}
