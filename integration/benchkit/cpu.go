package benchkit

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProcessCPU sums process_cpu_seconds_total over the /metrics pages at
// urls: the CPU the nodes' processes have used, so a load generator in
// another process can report CPU per job (the figure is the nodes' only:
// it leaves out the client and the workers unless they run in a node).
// The Prometheus Go client exports it on Linux, at a 10 ms resolution.
func ProcessCPU(ctx context.Context, client *http.Client, urls []string) (time.Duration, error) {
	var sum float64
	for _, u := range urls {
		v, err := scrapeCPU(ctx, client, u)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return time.Duration(sum * float64(time.Second)), nil
}

func scrapeCPU(ctx context.Context, client *http.Client, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, res.Status)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", url, err)
	}
	return 0, fmt.Errorf("%s: no process_cpu_seconds_total", url)
}
