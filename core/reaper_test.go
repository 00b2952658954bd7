package core_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/core"
)

// A queue with no job and no worker is removed after QueueIdle, from the
// engine and from its metrics; one in use, or used again in time, is not.
func TestQueueReaper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *core.Config) { c.QueueIdle = time.Minute })
		names := func() []string {
			var out []string
			for _, q := range h.e.QueueStats() {
				out = append(out, q.Name)
			}
			return out
		}
		w, fc := h.attach("busy", 1)
		wi, _ := h.attach("idle", 1)
		j := h.submit("busy", env(5*time.Minute))
		w.Accept(j.ID, fc.lastOffer(t).Gen)
		wi.Detach(t.Context())

		time.Sleep(59 * time.Second)
		synctest.Wait()
		if got := names(); len(got) != 2 {
			t.Fatalf("queues before the idle time: %v", got)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := names(); len(got) != 1 || got[0] != "busy" {
			t.Fatalf("queues after the idle time: %v, want only the busy one", got)
		}
		if v := h.metric("switchyard_queue_depth", "queue", "idle"); v != -1 {
			t.Errorf("the reaped queue still has a depth series (%v)", v)
		}

		// The busy queue empties, is used again within the idle time, and
		// survives; then it is idle for good and goes.
		w.End(j.ID, fc.lastOffer(t).Gen, "", "", nil)
		w.Detach(t.Context())
		time.Sleep(30 * time.Second)
		w2, fc2 := h.attach("busy", 1)
		j2 := h.submit("busy", env(5*time.Minute))
		w2.Accept(j2.ID, fc2.lastOffer(t).Gen)
		time.Sleep(45 * time.Second)
		synctest.Wait()
		if got := names(); len(got) != 1 {
			t.Fatalf("a queue in use was reaped: %v", got)
		}
		w2.End(j2.ID, fc2.lastOffer(t).Gen, "", "", nil)
		w2.Detach(t.Context())
		time.Sleep(61 * time.Second)
		synctest.Wait()
		if got := names(); len(got) != 0 {
			t.Fatalf("queues after everything went idle: %+v", h.e.QueueStats())
		}
	})
}
