package httpapi

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// countingListener counts the writes on the connections it accepts.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, writes: l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// The flush that follows a job's terminal event is left to the handler's
// return: the event goes out with the end of the chunked response, in one
// write on the connection, and a client reading the response gets every
// event and then its end.
func TestSSESinkTerminalEventGoesWithTheResponsesEnd(t *testing.T) {
	j := &core.Job{ID: "j_flush", History: core.NewHistory(1, 1<<20)}
	var writes, beforeDone atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		s := &sseSink{sseConn: sseConn{w: w, rc: http.NewResponseController(w)}, job: j, snap: 1}
		if err := s.Event(core.Event{Seq: 1, Kind: core.EventOutput, Data: []byte(`{"data":"a"}`)}, []byte("t1")); err != nil {
			t.Errorf("Event: %v", err)
		}
		if err := s.Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		beforeDone.Store(writes.Load())
		if err := s.Event(core.Event{Seq: 2, Kind: core.EventDone, Data: []byte(`{"outcome":"succeeded"}`)}, []byte("t2")); err != nil {
			t.Errorf("Event: %v", err)
		}
		if err := s.Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		if got := writes.Load(); got != beforeDone.Load() {
			t.Errorf("the flush after the terminal event wrote to the connection (%d writes, %d before it)", got, beforeDone.Load())
		}
	}))
	srv.Listener = countingListener{Listener: srv.Listener, writes: &writes}
	srv.Start()
	defer srv.Close()

	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	evs := readAll(t, string(body))
	if len(evs) != 2 || evs[0].Type != "output" || evs[1].Type != "done" || evs[1].LastEventID != "t2" {
		t.Fatalf("parsed %+v from %q, want output then done (id t2)", evs, body)
	}
	if !strings.HasSuffix(string(body), "\n\n") {
		t.Fatalf("stream does not end with a whole event: %q", body)
	}
	// The headers with the output, then the done event with the end of the
	// response: one write each.
	if got := writes.Load(); beforeDone.Load() != 1 || got != 2 {
		t.Fatalf("%d writes on the connection (%d before the done event), want 2 (1)", got, beforeDone.Load())
	}
}
