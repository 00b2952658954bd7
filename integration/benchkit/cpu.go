package benchkit

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"
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

// ProcCPU is the CPU time (user and system) the processes pids have used,
// read from /proc/PID/stat (Linux; clock ticks of 10 ms): the figure for
// processes that export no metrics (a relay, a worker) or whose split
// between nodes and workers matters.
func ProcCPU(pids ...int) (time.Duration, error) {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, err
		}
		// The command name (field 2) may hold spaces: count from its ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
		}
		for _, v := range f[11:13] { // utime, stime: fields 14 and 15
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
			}
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// Syscalls counts the read and write system calls a process has made
// (/proc/PID/io's syscr and syscw, read through procfs; Linux). A write
// is what a process pays per flush, a read per wake-up of a reader that
// found data: per job, they say how many pieces a path cut its bytes into.
type Syscalls struct{ Reads, Writes uint64 }

// ProcSyscalls sums Syscalls over the processes pids.
func ProcSyscalls(pids ...int) (Syscalls, error) {
	var s Syscalls
	for _, pid := range pids {
		p, err := procfs.NewProc(pid)
		if err != nil {
			return Syscalls{}, err
		}
		io, err := p.IO()
		if err != nil {
			return Syscalls{}, err
		}
		s.Reads += io.SyscR
		s.Writes += io.SyscW
	}
	return s, nil
}

// Sub is s less t, call by call.
func (s Syscalls) Sub(t Syscalls) Syscalls {
	return Syscalls{s.Reads - t.Reads, s.Writes - t.Writes}
}

// Add is s and t, call by call.
func (s Syscalls) Add(t Syscalls) Syscalls {
	return Syscalls{s.Reads + t.Reads, s.Writes + t.Writes}
}
