package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	sse "github.com/tmaxmax/go-sse"
)

// runBench drives jobs through a running node and prints, per concurrency
// level, time to first output and to the terminal event (p50, p99) and
// jobs per second. It is a benchmark: it reports, it never fails on a time.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "node HTTP address")
	queue := fs.String("queue", "demo", "queue to post to")
	jobs := fs.Int("jobs", 500, "jobs per concurrency level")
	levels := fs.String("concurrency", "1,64", "comma-separated concurrency levels")
	input := fs.String("input", "one two three four", "job input (sent as a JSON string)")
	delay := fs.Int("delay-ms", 0, "options.delay_ms for the demo worker (0: as fast as it can)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body, _ := json.Marshal(map[string]any{"input": *input, "options": map[string]any{"delay_ms": *delay}})
	target := strings.TrimRight(*url, "/") + "/v1/queues/" + *queue + "/jobs"

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "concurrency\tjobs\tfailed\tfirst p50\tfirst p99\tlast p50\tlast p99\tjobs/s\t")
	for _, ls := range strings.Split(*levels, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(ls))
		if err != nil || c < 1 {
			return fmt.Errorf("--concurrency %q: want positive integers", *levels)
		}
		r := benchLevel(ctx, client, target, body, *jobs, c)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%s\t%.0f\t\n", c, *jobs, r.failed,
			pct(r.first, 50), pct(r.first, 99), pct(r.last, 50), pct(r.last, 99), float64(len(r.last))/r.wall.Seconds())
	}
	return tw.Flush()
}

type benchResult struct {
	first, last []time.Duration
	failed      int
	wall        time.Duration
}

func benchLevel(ctx context.Context, client *http.Client, target string, body []byte, n, conc int) benchResult {
	var (
		mu  sync.Mutex
		res benchResult
		wg  sync.WaitGroup
	)
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for range next {
				first, last, ok := benchJob(ctx, client, target, body)
				mu.Lock()
				if ok {
					res.first = append(res.first, first)
					res.last = append(res.last, last)
				} else {
					res.failed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.wall = time.Since(start)
	return res
}

func benchJob(ctx context.Context, client *http.Client, target string, body []byte) (first, last time.Duration, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	t0 := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return 0, 0, false
	}
	defer res.Body.Close()
	defer io.Copy(io.Discard, res.Body) //nolint:errcheck // drain for connection reuse
	if res.StatusCode != http.StatusOK {
		return 0, 0, false
	}
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			return 0, 0, false
		}
		switch ev.Type {
		case "output":
			if first == 0 {
				first = time.Since(t0)
			}
		case "done":
			return first, time.Since(t0), true
		case "error":
			return 0, 0, false
		}
	}
	return 0, 0, false
}

func pct(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "-"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)].Round(10 * time.Microsecond).String()
}
