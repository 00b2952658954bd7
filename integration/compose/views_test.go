//go:build compose

package compose_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// What the nodes say about the cluster, read over their published HTTP
// ports, and the conditions the cases wait for.

// url is the base URL of a node's published HTTP port. A restarted or
// reconnected container may publish another port: forget drops it.
func (c *cluster) url(svc string) (string, error) {
	c.mu.Lock()
	u := c.urls[svc]
	c.mu.Unlock()
	if u != "" {
		return u, nil
	}
	out, err := exec.Command("docker", "port", c.id(svc), "8080/tcp").Output()
	if err != nil {
		return "", fmt.Errorf("docker port %s 8080: %v", svc, err)
	}
	addr := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	if addr == "" {
		return "", fmt.Errorf("%s publishes no port 8080 (yet)", svc)
	}
	u = "http://" + addr
	c.mu.Lock()
	c.urls[svc] = u
	c.mu.Unlock()
	return u, nil
}

func (c *cluster) forget(svc string) {
	c.mu.Lock()
	delete(c.urls, svc)
	c.mu.Unlock()
}

// nodeView is a node's GET /v1/cluster/nodes.
type nodeView struct {
	Nodes []struct {
		ID, State, Zone string
	}
}

// states returns a node's view of every node's state.
func (c *cluster) states(svc string) (map[string]string, error) {
	var v nodeView
	if err := c.getJSON(svc, "/v1/cluster/nodes", &v); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range v.Nodes {
		out[n.ID] = n.State
	}
	return out, nil
}

// expectOnline is nil when svc's view has every one of nodes online.
func (c *cluster) expectOnline(svc string, nodes ...string) error {
	st, err := c.states(svc)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if st[n] != "online" {
			return fmt.Errorf("%s sees %s as %q", svc, n, st[n])
		}
	}
	return nil
}

// queueView is a node's GET /v1/queues/demo.
type queueView struct {
	Dispatcher string
	Consumers  []struct{ ID, Node, Name string }
}

func (c *cluster) queue(svc string) (queueView, error) {
	var q queueView
	err := c.getJSON(svc, "/v1/queues/demo", &q)
	return q, err
}

func (c *cluster) getJSON(svc, path string, into any) error {
	u, err := c.url(svc)
	if err != nil {
		return err
	}
	res, err := c.http.Get(u + path)
	if err != nil {
		return fmt.Errorf("%s: %w", svc, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: GET %s: %s", svc, path, res.Status)
	}
	return json.NewDecoder(res.Body).Decode(into)
}

// waitFor polls cond every 200ms until it returns nil, and fails the test
// with cond's last error after timeout. It returns how long it waited.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	d, err := poll(timeout, cond)
	if err != nil {
		t.Fatalf("waiting %v for %s: %v", timeout, what, err)
	}
	return d
}

// poll is waitFor that returns the last error instead of failing.
func poll(timeout time.Duration, cond func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var errNotYet = errors.New("not yet")

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// consumerOn returns the id of the consumer on node in node-1's view.
func consumerOn(t *testing.T, c *cluster, node string) string {
	t.Helper()
	q, err := c.queue("node-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, cn := range q.Consumers {
		if cn.Node == node {
			return cn.ID
		}
	}
	t.Fatalf("node-1 sees no consumer on %s: %v", node, q.Consumers)
	return ""
}

// rejoined is nil once node is back for good: it answers /readyz (it is not
// fenced), every node sees all three online with three consumers, and its
// worker has registered anew (a consumer id other than old, which no view
// lists any more). A record that merely outlives its holder's lease
// for a while passes none of the last two.
func rejoined(c *cluster, node, old string) func() error {
	return func() error {
		if r := readyz(c, node); !strings.HasPrefix(r, "200") {
			return fmt.Errorf("%s /readyz: %s", node, r)
		}
		if err := allOnline(c)(); err != nil {
			return err
		}
		return newConsumer(c, node, old)
	}
}

// allOnline is nil when every node sees all three nodes online and three
// consumers of queue demo.
func allOnline(c *cluster) func() error {
	return func() error {
		for _, svc := range nodeServices {
			if err := c.expectOnline(svc, nodeServices...); err != nil {
				return err
			}
			q, err := c.queue(svc)
			if err != nil {
				return err
			}
			if len(q.Consumers) != 3 {
				return fmt.Errorf("%s sees %d consumers of demo: %v", svc, len(q.Consumers), q.Consumers)
			}
		}
		return nil
	}
}

// noStaleDispatcher is nil when every node names the same dispatcher for
// queue demo, online in its view, and sees one consumer on each node (none
// left over from a process that is gone).
func noStaleDispatcher(c *cluster) error {
	first := ""
	for _, svc := range nodeServices {
		q, err := c.queue(svc)
		if err != nil {
			return err
		}
		st, err := c.states(svc)
		if err != nil {
			return err
		}
		if st[q.Dispatcher] != "online" {
			return fmt.Errorf("%s names dispatcher %q, which it sees as %q", svc, q.Dispatcher, st[q.Dispatcher])
		}
		if first == "" {
			first = q.Dispatcher
		} else if q.Dispatcher != first {
			return fmt.Errorf("views differ on the dispatcher: %s and %s", first, q.Dispatcher)
		}
		per := map[string]int{}
		for _, cn := range q.Consumers {
			per[cn.Node]++
		}
		for _, n := range nodeServices {
			if per[n] != 1 {
				return fmt.Errorf("%s sees %d consumers on %s", svc, per[n], n)
			}
		}
	}
	return nil
}

// newConsumer is nil when every view has a consumer on node other than
// old, and none is old: the worker registered again, and the record of its
// session with the node's previous process is gone.
func newConsumer(c *cluster, node, old string) error {
	for _, svc := range nodeServices {
		q, err := c.queue(svc)
		if err != nil {
			return err
		}
		found := false
		for _, cn := range q.Consumers {
			if cn.ID == old {
				return fmt.Errorf("%s still lists %s's consumer %s from before the restart", svc, node, old)
			}
			found = found || cn.Node == node
		}
		if !found {
			return fmt.Errorf("%s sees no consumer on %s", svc, node)
		}
	}
	return nil
}

// readyz returns a node's answer to /readyz, for a failure message.
func readyz(c *cluster, svc string) string {
	u, err := c.url(svc)
	if err != nil {
		return err.Error()
	}
	res, err := c.http.Get(u + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 300))
	return res.Status + " " + strings.TrimSpace(string(body))
}
