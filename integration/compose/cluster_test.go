//go:build compose

package compose_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/tcptest"
)

// The settings the bounds below are made of: the binary's defaults, which
// docker-compose.yml keeps, and the drain timeout it sets.
const (
	leaseTTL      = 10 * time.Second // --lease-ttl
	peerHeartbeat = time.Second      // --peer-heartbeat-interval
	workerIdle    = 6 * time.Second  // --worker-idle-timeout: a silent worker session ends
	drainTimeout  = 10 * time.Second // SWITCHYARD_DRAIN_TIMEOUT in docker-compose.yml
)

var (
	nodeServices   = []string{"node-1", "node-2", "node-3"}
	workerServices = []string{"worker-1", "worker-2", "worker-3"}
)

// projectPrefix names every compose project these tests create; a project
// whose test process is gone is swept by the next run.
const projectPrefix = "sy-compose-"

// cluster is one compose project of docker-compose.yml, driven by the
// docker and compose command lines.
type cluster struct {
	t       *testing.T
	project string
	subnet  string // the first three octets of its /24
	file    string
	compose []string // "docker compose" or "docker-compose"
	env     []string
	http    *http.Client

	mu   sync.Mutex
	ids  map[string]string // service -> container id
	urls map[string]string // service -> http://127.0.0.1:<published port>
}

// requireDocker skips the test when there is no Docker engine or compose.
func requireDocker(t *testing.T) []string {
	t.Helper()
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine here (docker info: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	if c := os.Getenv("COMPOSE"); c != "" {
		return strings.Fields(c)
	}
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if _, err := exec.LookPath("docker-compose"); err == nil {
		return []string{"docker-compose"}
	}
	t.Skip("neither the docker compose plugin nor docker-compose is installed")
	return nil
}

// startCluster brings up a fresh cluster for one test case, in a fixed
// order so the queue's dispatcher is known: the three nodes first, until
// each sees all three online; then worker-1, so node-1 claims queue demo;
// then the other two workers. It is torn down, volumes included, when the
// test ends.
//
// Each cluster is a project of its own, on its own subnet and ports, so
// the cases, which call t.Parallel first, overlap, as many at once as go
// test's -parallel allows (make test-compose: COMPOSE_PARALLEL, 2).
func startCluster(t *testing.T, name string) *cluster {
	compose := requireDocker(t)
	file, err := filepath.Abs("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	image := os.Getenv("SWITCHYARD_DEMO_IMAGE")
	if image == "" {
		image = "switchyard:dev"
	}
	if out, err := exec.Command("docker", "image", "inspect", image).CombinedOutput(); err != nil {
		t.Fatalf("image %s: %v (build it with make image IMAGE=%s): %s", image, err, image, lastLines(string(out), 3))
	}
	c := &cluster{
		t: t, project: fmt.Sprintf("%s%d-%s", projectPrefix, os.Getpid(), name), file: file, compose: compose,
		http: &http.Client{Timeout: 3 * time.Second},
		ids:  map[string]string{}, urls: map[string]string{},
	}
	c.sweep()
	t.Cleanup(c.teardown)

	start := time.Now()
	c.upNodes(image)
	waitFor(t, 90*time.Second, "every node sees three nodes online", func() error {
		for _, svc := range nodeServices {
			if err := c.expectOnline(svc, nodeServices...); err != nil {
				return err
			}
		}
		return nil
	})
	c.mustCompose("up", "-d", "worker-1")
	waitFor(t, 30*time.Second, "node-1 dispatches queue demo, with worker-1", func() error {
		q, err := c.queue("node-1")
		if err == nil && (q.Dispatcher != "node-1" || len(q.Consumers) != 1) {
			err = fmt.Errorf("dispatcher %q, %d consumers", q.Dispatcher, len(q.Consumers))
		}
		return err
	})
	c.mustCompose("up", "-d", "worker-2", "worker-3")
	waitFor(t, 30*time.Second, "every node sees the three workers", func() error {
		for _, svc := range nodeServices {
			q, err := c.queue(svc)
			if err != nil {
				return err
			}
			if len(q.Consumers) != 3 {
				return fmt.Errorf("%s sees %d consumers", svc, len(q.Consumers))
			}
		}
		return nil
	})
	var urls []string
	for _, svc := range nodeServices {
		u, _ := c.url(svc)
		urls = append(urls, svc+" "+u)
	}
	t.Logf("cluster %s up in %v (subnet %s.0/24, %s, image %s): %s", c.project, time.Since(start).Round(100*time.Millisecond),
		c.subnet, strings.Join(compose, " "), image, strings.Join(urls, ", "))
	return c
}

// upNodes starts the three nodes on a /24 no Docker network uses yet. Two
// runs at once may pick the same one: the loser's network creation fails
// with an overlap, and it tries the next.
func (c *cluster) upNodes(image string) {
	used := dockerSubnets()
	first := 100 + os.Getpid()%100
	for i := range 100 {
		prefix := fmt.Sprintf("10.77.%d", 100+(first-100+i)%100)
		if used[prefix+".0/24"] {
			continue
		}
		c.subnet = prefix
		// The Python docker-compose gives up on a daemon request after 60s
		// by default; a loaded CI machine's daemon has taken longer. (First,
		// so that the caller's own setting wins.)
		c.env = append([]string{"COMPOSE_HTTP_TIMEOUT=240"}, os.Environ()...)
		c.env = append(c.env,
			"SWITCHYARD_DEMO_IMAGE="+image,
			"SWITCHYARD_DEMO_SUBNET="+prefix,
			"SWITCHYARD_DEMO_BIND=127.0.0.1",
		)
		// Host ports free a moment ago, so nothing else on the machine is
		// in the way; each node advertises its own (taken meanwhile, the
		// up fails and the next round picks others).
		for j, addr := range tcptest.FreeAddrs(c.t, 6) {
			kind := "HTTP"
			if j >= 3 {
				kind = "GRPC"
			}
			_, port, _ := net.SplitHostPort(addr)
			c.env = append(c.env, fmt.Sprintf("SWITCHYARD_DEMO_%s_%d=%s", kind, j%3+1, port))
		}
		out, err := c.runCompose(append([]string{"up", "-d"}, nodeServices...)...)
		if err == nil {
			return
		}
		if !strings.Contains(out, "overlap") && !strings.Contains(out, "already allocated") && !strings.Contains(out, "address already in use") {
			c.t.Fatalf("compose up: %v\n%s", err, lastLines(out, 20))
		}
		_, _ = c.runCompose("down", "--volumes", "--remove-orphans")
	}
	c.t.Fatal("no free subnet in 10.77.100.0-10.77.199.0")
}

// dockerSubnets returns the IPv4 subnets of every Docker network.
func dockerSubnets() map[string]bool {
	used := map[string]bool{}
	ids, _ := exec.Command("docker", "network", "ls", "-q").Output()
	if len(strings.Fields(string(ids))) == 0 {
		return used
	}
	out, _ := exec.Command("docker", append([]string{"network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"}, strings.Fields(string(ids))...)...).Output()
	for _, s := range strings.Fields(string(out)) {
		used[s] = true
	}
	return used
}

// sweep removes the projects of earlier runs whose test process is gone
// (a run killed before its cleanup).
func (c *cluster) sweep() {
	var projects []string
	for _, kind := range [][]string{{"ps", "-a"}, {"network", "ls"}, {"volume", "ls"}} {
		out, _ := exec.Command("docker", append(kind, "--filter", "label=com.docker.compose.project",
			"--format", `{{.Label "com.docker.compose.project"}}`)...).Output()
		for _, p := range strings.Fields(string(out)) {
			if strings.HasPrefix(p, projectPrefix) && !slices.Contains(projects, p) {
				projects = append(projects, p)
			}
		}
	}
	for _, p := range projects {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(p, projectPrefix), "-", 2)[0])
		if err != nil || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue // not ours, or its test is still running
		}
		c.t.Logf("removing project %s, left by a run that is gone", p)
		args := append(slices.Clone(c.compose[1:]), "-p", p, "-f", c.file, "down", "--volumes", "--remove-orphans")
		_ = exec.Command(c.compose[0], args...).Run()
	}
}

// teardown removes the project (unless SWITCHYARD_COMPOSE_KEEP is set and
// the test failed) and checks nothing of it is left. On failure it first
// prints the end of every container's log.
func (c *cluster) teardown() {
	if c.t.Failed() {
		for _, svc := range append(slices.Clone(nodeServices), workerServices...) {
			if id := c.id(svc); id != "" {
				out, _ := exec.Command("docker", "logs", "--tail", "25", id).CombinedOutput()
				c.t.Logf("last log lines of %s:\n%s", svc, out)
			}
		}
		if os.Getenv("SWITCHYARD_COMPOSE_KEEP") != "" {
			c.t.Logf("SWITCHYARD_COMPOSE_KEEP: left project %s running; remove it with: %s -p %s -f %s down --volumes",
				c.project, strings.Join(c.compose, " "), c.project, c.file)
			return
		}
	}
	c.http.CloseIdleConnections()
	start := time.Now()
	// The containers go first, killed and removed by one docker call: the
	// test is over, so nothing needs a graceful stop, and compose down
	// would stop them one request at a time on a daemon that may be slow
	// (a busy CI machine's took over a minute to answer one). Down then
	// removes the network and the volumes.
	if ids := c.containers(); len(ids) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		out, err := exec.CommandContext(ctx, "docker", append([]string{"rm", "--force", "--volumes"}, ids...)...).CombinedOutput()
		cancel()
		if err != nil {
			c.t.Logf("docker rm: %v: %s (compose down tries again)", err, lastLines(string(out), 5))
		}
	}
	if out, err := c.runCompose("down", "--volumes", "--remove-orphans", "--timeout", "2"); err != nil {
		c.t.Errorf("compose down: %v\n%s", err, lastLines(out, 10))
	}
	for _, kind := range [][]string{{"ps", "-a"}, {"network", "ls"}, {"volume", "ls"}} {
		out, _ := exec.Command("docker", append(kind, "-q", "--filter", "label=com.docker.compose.project="+c.project)...).Output()
		if left := strings.Fields(string(out)); len(left) > 0 {
			c.t.Errorf("after compose down, project %s still has %s: %v", c.project, kind[0], left)
		}
	}
	c.t.Logf("cluster %s removed in %v", c.project, time.Since(start).Round(100*time.Millisecond))
}

// containers returns the ids of every container of the project, running
// or not.
func (c *cluster) containers() []string {
	out, _ := exec.Command("docker", "ps", "-a", "-q", "--filter", "label=com.docker.compose.project="+c.project).Output()
	return strings.Fields(string(out))
}

// runCompose runs a compose command in the project and returns its output.
func (c *cluster) runCompose(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	full := append(slices.Clone(c.compose[1:]), "-p", c.project, "-f", c.file)
	cmd := exec.CommandContext(ctx, c.compose[0], append(full, args...)...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cluster) mustCompose(args ...string) {
	c.t.Helper()
	if out, err := c.runCompose(args...); err != nil {
		c.t.Fatalf("compose %v: %v\n%s", args, err, lastLines(out, 20))
	}
}

// docker runs a docker command; faults go through it rather than compose,
// whose start-up (a second for the Python one) would blur their timing.
func (c *cluster) docker(args ...string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput(); err != nil {
		c.t.Fatalf("docker %v: %v\n%s", args, err, lastLines(string(out), 10))
	}
}

// id is the container id of a service ("" before it exists).
func (c *cluster) id(svc string) string {
	c.mu.Lock()
	id := c.ids[svc]
	c.mu.Unlock()
	if id != "" {
		return id
	}
	out, err := c.runCompose("ps", "-q", svc)
	if id = strings.TrimSpace(out); err != nil || strings.ContainsAny(id, " \n") {
		return ""
	}
	c.mu.Lock()
	c.ids[svc] = id
	c.mu.Unlock()
	return id
}

// The faults. Each returns the moment just before its command ran: times
// measured from there are never less than what a requester waited. (The
// docker command itself takes from tens of milliseconds to most of a second
// here, and it is the fault's own moment that matters.)

// kill sends SIGKILL to a service's container. It returns when the command
// was issued and when the process died as Docker recorded it, which under
// load may be a little after the node already saw its connections close:
// no run can have started on the container after died.
func (c *cluster) kill(svc string) (issued, died time.Time) {
	issued = time.Now()
	c.docker("kill", c.id(svc))
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.FinishedAt}}", c.id(svc)).Output()
	if err != nil {
		c.t.Fatalf("docker inspect %s: %v", svc, err)
	}
	died, err = time.Parse(time.RFC3339Nano, strings.TrimSpace(string(out)))
	if err != nil {
		c.t.Fatalf("docker inspect %s: FinishedAt: %v", svc, err)
	}
	return issued, died
}

// start starts a stopped container again (same container: its logs and
// volume go on).
func (c *cluster) start(svc string) time.Time {
	at := time.Now()
	c.docker("start", c.id(svc))
	c.forget(svc)
	return at
}

// restart stops a container with SIGTERM, giving it the compose file's
// grace period to drain, and starts it again.
func (c *cluster) restart(svc string) time.Time {
	at := time.Now()
	c.docker("restart", "--time", "25", c.id(svc))
	c.forget(svc)
	return at
}

// network is the name of the project's cluster network.
func (c *cluster) network() string { return c.project + "_cluster" }

// disconnect takes a node's container off the cluster network: its packets
// go nowhere, and its published ports do not answer.
func (c *cluster) disconnect(svc string) time.Time {
	at := time.Now()
	c.docker("network", "disconnect", c.network(), c.id(svc))
	return at
}

// connect puts a node back with the address and name it had: a
// reconnected container would otherwise get any free address, and lose the
// service name other containers reach it by.
func (c *cluster) connect(svc string) time.Time {
	ip := c.subnet + "." + strconv.Itoa(10+slices.Index(nodeServices, svc)+1)
	at := time.Now()
	c.docker("network", "connect", "--ip", ip, "--alias", svc, c.network(), c.id(svc))
	c.forget(svc)
	return at
}

// logs returns a container's whole log (stdout and stderr).
func (c *cluster) logs(svc string) string {
	out, err := exec.Command("docker", "logs", c.id(svc)).CombinedOutput()
	if err != nil {
		c.t.Errorf("docker logs %s: %v", svc, err)
	}
	return string(out)
}
