package loadgen

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRefusal(t *testing.T) {
	for _, tc := range []struct {
		body, retry string
		code        string
		wait        time.Duration
	}{
		{`{"code":"draining"}`, "5", "draining", time.Second},
		{`{"code":"queue_full"}`, "", "queue_full", 200 * time.Millisecond},
		{`not json`, "0", "http_503", 200 * time.Millisecond},
	} {
		res := &http.Response{StatusCode: 503, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(tc.body))}
		if tc.retry != "" {
			res.Header.Set("Retry-After", tc.retry)
		}
		if code, wait := Refusal(res); code != tc.code || wait != tc.wait {
			t.Errorf("%s, Retry-After %q: %s %v, want %s %v", tc.body, tc.retry, code, wait, tc.code, tc.wait)
		}
	}
}

// A loop's clients post until Stop; Drain waits for them; Halt cuts a
// request still open, and Count and Snapshot read the record.
func TestLoop(t *testing.T) {
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			select {
			case <-hold:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	defer close(hold)

	type job struct{ status int }
	l := NewLoop[job](2)
	var posted atomic.Int64
	l.Start(2, time.Millisecond, func(k int) {
		for !l.Stopping.Load() {
			j := &job{}
			l.Add(j)
			req, _ := http.NewRequestWithContext(l.Ctx, http.MethodGet, srv.URL, nil)
			if res, err := l.HTTP.Do(req); err == nil {
				res.Body.Close()
				l.Mu.Lock()
				j.status = res.StatusCode
				l.Mu.Unlock()
				posted.Add(1)
			}
			if !l.Pause(time.Millisecond) {
				return
			}
		}
	})
	for posted.Load() < 10 {
		time.Sleep(time.Millisecond)
	}
	l.Stop()
	l.Drain(10 * time.Second)
	if l.Halted.Load() {
		t.Fatal("Drain halted a loop whose clients had stopped")
	}
	ok := l.Count(func(j *job) bool { return j.status == http.StatusOK })
	if snap := l.Snapshot(func(j *job) job { return *j }); ok < 10 || len(snap) < ok {
		t.Fatalf("%d jobs answered 200 of %d recorded, want at least 10", ok, len(snap))
	}

	// A client held in a request past the drain's timeout is cut.
	h := NewLoop[job](1)
	h.Start(1, 0, func(int) {
		req, _ := http.NewRequestWithContext(h.Ctx, http.MethodGet, srv.URL+"/hold", nil)
		if res, err := h.HTTP.Do(req); err == nil {
			res.Body.Close()
		}
	})
	h.Stop()
	h.Drain(50 * time.Millisecond)
	if !h.Halted.Load() {
		t.Fatal("Drain did not halt a client held past its timeout")
	}
}
