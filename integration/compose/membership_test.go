//go:build compose

package compose_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A node that loses its volume comes back as the same member
// (docs/membership.md): `docker compose rm -sf node-3` (SIGTERM: it
// drains), its volume removed, `up -d node-3`: the node finds its name in
// the running catalog with an empty data directory, replaces its member
// (remove, add as a learner, promote) and serves; the cluster has three
// healthy voting members again, and worker-3 registers anew. Meanwhile the
// load (through node-1 and node-2) loses no job and runs none twice.
func TestComposeReplaceVolume(t *testing.T) {
	t.Parallel()
	c := startCluster(t, "replace")
	members := func(step string) string {
		t.Helper()
		out, err := exec.Command("docker", "exec", c.id("node-1"), "/switchyard", "members", "list", "--url", "http://127.0.0.1:8080").CombinedOutput()
		if err != nil {
			t.Fatalf("members list: %v\n%s", err, out)
		}
		t.Logf("members %s:\n%s", step, out)
		return string(out)
	}
	before := members("at the start")
	old := consumerOn(t, c, "node-3")
	l := startMixedLoad(t, c, "node-1", "node-2")

	at := time.Now()
	c.mustCompose("rm", "-sf", "node-3")
	removed := time.Now()
	c.docker("volume", "rm", c.project+"_node-3-data")
	c.mu.Lock()
	delete(c.ids, "node-3")
	c.mu.Unlock()
	c.forget("node-3")
	c.mustCompose("up", "-d", "--no-deps", "node-3")
	started := time.Now()
	back, err := poll(2*leaseTTL+30*time.Second, rejoined(c, "node-3", old))
	if err != nil {
		t.Errorf("node-3 did not come back: %v\n%s", err, lastLines(c.logs("node-3"), 30))
	}
	after := members("after node-3 replaced its member")
	l.drain(jobTTL + 5*time.Second)

	log := c.logs("node-3")
	for _, want := range []string{"replacing that member", "removed the stale member", "added as a learner", "promoted to a voting member"} {
		if !strings.Contains(log, want) {
			t.Errorf("node-3's log does not say %q:\n%s", want, lastLines(log, 30))
		}
	}
	if strings.Count(after, "true") < 3 || strings.Count(after, "voter") != 3 || after == before {
		t.Errorf("want three healthy voters, node-3 under a new id:\n%s", after)
	}
	led := newLedger(c, "replace-volume", "docker compose rm -sf node-3, docker volume rm, docker compose up -d node-3", at, l.snapshot(), nil)
	led.note("node-3 removed (drained) %v after the fault, started on an empty volume %v after, back (ready, three nodes online in every view, worker-3 registered anew) %v later",
		removed.Sub(at).Round(time.Millisecond), started.Sub(removed).Round(time.Millisecond), back.Round(time.Millisecond))
	led.mustComplete(t, "jobs in flight with output (they finish while node-3 drains)", func(j loadJob, _ []jobRun) bool { return j.OutputBy(at) })
	led.check(t, func(j loadJob) time.Duration {
		if j.OutputBy(at) {
			return drainTimeout + slack
		}
		return untilTTL(j, at)
	})
}
