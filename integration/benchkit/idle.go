package benchkit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sse "github.com/tmaxmax/go-sse"
)

// ServeBareSSE serves, on ln, the plain net/http SSE stream the idle-streams
// benchmark compares an open Switchyard stream with: POST /sse answers
// text/event-stream, writes one event, flushes and holds the stream open
// until the client leaves, nothing else. It serves net/http/pprof under
// /debug/pprof/ too, so both are measured alike (IdleFootprint). It
// returns when ln is closed.
func ServeBareSSE(ln net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "event: accepted\ndata: {}\n\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	return (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
}

// Footprint is a process's memory and goroutines.
type Footprint struct {
	RSS, HeapInuse, StackInuse int64 // bytes
	Goroutines                 int
}

// Sub is f - o.
func (f Footprint) Sub(o Footprint) Footprint {
	return Footprint{f.RSS - o.RSS, f.HeapInuse - o.HeapInuse, f.StackInuse - o.StackInuse, f.Goroutines - o.Goroutines}
}

// MeasureFootprint reads the footprint of process pid, which serves
// net/http/pprof at debugURL (…/debug/pprof/): it collects the process's
// garbage first (heap?gc=1), then reads its RSS from /proc (Linux only),
// its heap and stack in use and its goroutines from the profiles.
func MeasureFootprint(ctx context.Context, client *http.Client, pid int, debugURL string) (Footprint, error) {
	var f Footprint
	heap, err := get(ctx, client, debugURL+"heap?gc=1&debug=1")
	if err != nil {
		return f, err
	}
	for _, l := range strings.Split(heap, "\n") {
		if v, ok := strings.CutPrefix(l, "# HeapInuse = "); ok {
			f.HeapInuse, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(l, "# Stack = "); ok { // in use / from the OS
			f.StackInuse, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	g, err := get(ctx, client, debugURL+"goroutine?debug=1")
	if err != nil {
		return f, err
	}
	if _, err := fmt.Sscanf(g, "goroutine profile: total %d", &f.Goroutines); err != nil {
		return f, fmt.Errorf("goroutine profile: %w", err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return f, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(status)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return f, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			f.RSS = kb << 10
		}
	}
	return f, nil
}

func get(ctx context.Context, client *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	res, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return string(b), err
}

// OpenStreams opens n event streams by POSTing body to target from conc
// goroutines, and returns once each has received its first event (then it
// is open and idle). close ends them all. A stream that fails to open is
// an error: the figures per stream would be wrong.
func OpenStreams(ctx context.Context, client *http.Client, target string, body []byte, n, conc int) (close func(), err error) {
	var (
		mu     sync.Mutex
		bodies []io.Closer
		left   atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	closeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range bodies {
			_ = b.Close()
		}
		bodies = nil
	}
	left.Store(int64(n))
	for range conc {
		wg.Go(func() {
			for left.Add(-1) >= 0 && failed.Load() == nil {
				b, err := openStream(ctx, client, target, body)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				mu.Lock()
				bodies = append(bodies, b)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		closeAll()
		return nil, *e
	}
	return closeAll, nil
}

func openStream(ctx context.Context, client *http.Client, target string, body []byte) (io.Closer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		res.Body.Close()
		return nil, fmt.Errorf("open stream: %s: %s", res.Status, b)
	}
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			res.Body.Close()
			return nil, err
		}
		switch ev.Type {
		case "accepted":
			return res.Body, nil
		case "":
		default:
			res.Body.Close()
			return nil, fmt.Errorf("open stream: first event %q: %s", ev.Type, ev.Data)
		}
	}
	res.Body.Close()
	return nil, fmt.Errorf("open stream: ended before its first event")
}
