package core_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// restartEnv is env with on_worker_lost: restart and, if max >= 0, a
// per-job max_restarts.
func restartEnv(ttl time.Duration, max int) *core.Envelope {
	e := env(ttl)
	e.OnWorkerLost = core.LostRestart
	if max >= 0 {
		e.MaxRestarts = &max
	}
	return e
}

// restartableWithOutput submits at ingress a job that may be restarted
// (restartEnv, no bound) and has worker "a" on host run it until one
// output, which the ingress has seen.
func restartableWithOutput(t *testing.T, ingress, host *clusterNode) (*core.Worker, *core.Job, core.Offer) {
	t.Helper()
	a, fa := host.worker("q", "a", 1)
	j := ingress.submit("q", restartEnv(clusterTTL, -1))
	oa := waitOffers(t, fa, j.ID, 1)[0]
	a.Output(j.ID, oa.Gen, []byte(`"a"`))
	waitFor(t, 5*time.Second, "the output at the ingress", func() bool { return ingress.view(j.ID).Outputs == 1 })
	return a, j, oa
}

// restartData returns the data of the job's restart events.
func restartData(t *testing.T, j *core.Job) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, ev := range events(t, j) {
		if ev.Kind != core.EventRestart {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(ev.Data, &m); err != nil {
			t.Fatalf("restart data %s: %v", ev.Data, err)
		}
		out = append(out, m)
	}
	return out
}

// A job that opted in and loses its worker after output starts again on
// another worker: one restart event (the old generation's last seq, the
// reason) opens stream generation 2 under the next binding generation,
// then the new generation's events; the view lists both attempts.
func TestRestartAfterOutputRunsAgain(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	j := h.submit("q", restartEnv(time.Minute, -1))
	g1 := f1.lastOffer(t).Gen
	w1.Accept(j.ID, g1)
	w1.Output(j.ID, g1, []byte(`"a"`))
	w1.Output(j.ID, g1, []byte(`"b"`))
	w2, f2 := h.attach("q", 1)
	w1.Detach(context.Background())

	o2 := f2.lastOffer(t)
	if o2.JobID != j.ID || o2.Gen != g1+1 {
		t.Fatalf("offer after the restart = %+v, want job %s gen %d", o2, j.ID, g1+1)
	}
	w2.Accept(j.ID, o2.Gen)
	w2.Output(j.ID, o2.Gen, []byte(`"c"`))
	w2.End(j.ID, o2.Gen, "", "", nil)
	wantEnded(t, h, j, core.OutcomeCompleted, "")

	evs := events(t, j)
	want := []struct {
		kind           core.EventKind
		stream, attemp uint64
	}{
		{core.EventAccepted, 1, 0}, {core.EventOutput, 1, g1}, {core.EventOutput, 1, g1},
		{core.EventRestart, 2, g1 + 1}, {core.EventOutput, 2, g1 + 1}, {core.EventDone, 2, g1 + 1},
	}
	if len(evs) != len(want) {
		t.Fatalf("events %v, want %d", kinds(evs), len(want))
	}
	for i, w := range want {
		if ev := evs[i]; ev.Kind != w.kind || ev.Stream != w.stream || ev.Gen != w.attemp || ev.Seq != uint64(i+1) {
			t.Errorf("event %d = %s seq %d stream %d attempt %d, want %s seq %d stream %d attempt %d",
				i, ev.Kind, ev.Seq, ev.Stream, ev.Gen, w.kind, i+1, w.stream, w.attemp)
		}
	}
	rd := restartData(t, j)
	if len(rd) != 1 || rd[0]["last_seq"] != float64(3) || rd[0]["reason"] != "worker_lost" || rd[0]["restarts"] != float64(1) ||
		rd[0]["max_restarts"] != float64(core.DefaultMaxRestarts) || !strings.Contains(rd[0]["detail"].(string), "disconnected") {
		t.Fatalf("restart data = %v", rd)
	}
	if j.StreamGeneration() != 2 || j.History.GenerationOf(3) != 1 || j.History.GenerationOf(4) != 2 {
		t.Fatalf("stream generation %d, of seq 3: %d, of seq 4: %d", j.StreamGeneration(), j.History.GenerationOf(3), j.History.GenerationOf(4))
	}

	v := h.view(j.ID)
	if v.Restarts != 1 || v.StreamGeneration != 2 || len(v.Attempts) != 2 {
		t.Fatalf("view: restarts %d, stream gen %d, attempts %+v", v.Restarts, v.StreamGeneration, v.Attempts)
	}
	a1, a2 := v.Attempts[0], v.Attempts[1]
	if a1.Attempt != g1 || a1.Gen != 1 || a1.Ended.IsZero() || !strings.HasPrefix(a1.Reason, "worker_lost: ") || a1.Node == "" {
		t.Errorf("first attempt = %+v", a1)
	}
	if a2.Attempt != g1+1 || a2.Gen != 2 || a2.Reason != "completed" || a2.Consumer == a1.Consumer || a2.Started.Before(a1.Ended) {
		t.Errorf("second attempt = %+v (first %+v)", a2, a1)
	}
	if got := h.metric("switchyard_job_restarts_total", "reason", "worker_lost"); got != 1 {
		t.Errorf("job_restarts_total{worker_lost} = %v", got)
	}
	if got := h.metric("switchyard_dispatch_reclaims_total"); got != 0 {
		t.Errorf("reclaims_total = %v, a restart is not a reclaim", got)
	}
}

// Without the opt-in ("fail", the default) a lost worker after output
// still fails the job worker_lost, and nothing runs it again.
func TestRestartNotWithoutOptIn(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	e := env(time.Minute)
	e.OnWorkerLost = core.LostFail
	j := h.submit("q", e)
	g := f1.lastOffer(t).Gen
	w1.Output(j.ID, g, []byte(`"a"`))
	wantLostNotRunAgain(t, h, w1, j)
	if got := h.metric("switchyard_job_restarts_total", "reason", "worker_lost"); got != 0 {
		t.Errorf("job_restarts_total = %v", got)
	}
}

// A job restarts at most max_restarts times: the next loss fails it
// worker_lost, saying why it did not restart. A node ceiling of 0 turns
// restarts off.
func TestRestartCeiling(t *testing.T) {
	h, w1, f1 := oneWorker(t, nil)
	j := h.submit("q", restartEnv(time.Minute, 1))
	g := f1.lastOffer(t).Gen
	w1.Output(j.ID, g, []byte(`"a"`))
	w2, f2 := h.attach("q", 1)
	w1.Detach(context.Background())
	g = f2.lastOffer(t).Gen
	w2.Output(j.ID, g, []byte(`"b"`))
	wantLostNotRunAgain(t, h, w2, j)
	if v := h.view(j.ID); !strings.Contains(v.Detail, "used its 1 restarts") || v.Restarts != 1 {
		t.Fatalf("view = %+v", v)
	}

	off := newHarness(t, func(c *core.Config) { c.Limits.MaxRestarts = 0 })
	w, f := off.attach("q", 1)
	j = off.submit("q", restartEnv(time.Minute, -1))
	w.Output(j.ID, f.lastOffer(t).Gen, []byte(`"a"`))
	w.Detach(context.Background())
	wantEnded(t, off, j, core.OutcomeFailed, core.CodeWorkerLost)
}

// A job whose TTL ran out is not restarted: it fails worker_lost (its
// ingress deadline, later, would only have expired it).
func TestRestartNotPastTTL(t *testing.T) {
	h, w1, f1 := oneWorker(t, func(c *core.Config) { c.ExpirySlack = 10 * time.Second })
	j := h.submit("q", restartEnv(100*time.Millisecond, -1))
	w1.Output(j.ID, f1.lastOffer(t).Gen, []byte(`"a"`))
	_, f2 := h.attach("q", 1)
	time.Sleep(200 * time.Millisecond)
	w1.Detach(context.Background())
	wantEnded(t, h, j, core.OutcomeFailed, core.CodeWorkerLost)
	if v := h.view(j.ID); !strings.Contains(v.Detail, "TTL ran out") {
		t.Fatalf("detail %q", v.Detail)
	}
	if n := len(f2.Offers()); n != 0 {
		t.Fatalf("offered again past its TTL")
	}
}

// A release that says the worker may still be running the job (its node
// was only sent a cancel) never restarts it.
func TestRestartNotWhileTheWorkerMayRun(t *testing.T) {
	_, n1, n2 := twoNodes(t)
	_, j, oa := restartableWithOutput(t, n1, n2)
	n1.e.HandleMessage("n2", core.Message{Kind: core.MsgRelease, JobID: j.ID, Gen: oa.Gen, Queue: "q", Running: true, Reason: "left the zone"})
	wantEnded(t, n1.harness, j, core.OutcomeFailed, core.CodeWorkerLost)
	if v := n1.view(j.ID); !strings.Contains(v.Detail, "may still be running") {
		t.Fatalf("detail %q", v.Detail)
	}
}

// A silent host may still run the job: a job that opted into restarts is
// neither failed nor run elsewhere at silence. Once the host's death is
// proven it restarts on another node, once; the stream says node_gone.
func TestRestartSilentHostWaitsForProof(t *testing.T) {
	net, n1, n2, n3 := threeNodes(t)
	_, j, oa := restartableWithOutput(t, n1, n2)

	c, fc := n3.worker("q", "c", 1)
	n1.e.ReplyLegSilent("n2", j.ID, oa.Gen)
	net.setDispatcher("q", "n3")
	n1.e.ClusterChanged()
	net.settle()
	if v := n1.view(j.ID); v.State.Terminal() || v.Generation != oa.Gen || v.Restarts != 0 {
		t.Fatalf("after silence alone: %+v, want the job waiting for proof", v)
	}
	if o := fc.offersFor(j.ID); len(o) != 0 {
		t.Fatalf("run elsewhere while its silent host may run it: %+v", o)
	}

	net.kill("n2")
	n1.e.ClusterChanged()
	n1.e.ClusterChanged() // a second look changes nothing: restarted once
	oc := offerAt(t, fc, j.ID, oa.Gen+1)
	c.Output(j.ID, oc.Gen, []byte(`"b"`))
	c.End(j.ID, oc.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventRestart, core.EventOutput, core.EventDone)
	if rd := restartData(t, j); len(rd) != 1 || rd[0]["reason"] != "node_gone" || rd[0]["last_seq"] != float64(2) {
		t.Fatalf("restart data = %v", rd)
	}
	if n := len(fc.offersFor(j.ID)); n != 1 {
		t.Fatalf("offered %d times on n3", n)
	}
	wantMetric(t, n1, 1, "switchyard_job_restarts_total", "reason", "node_gone")
	if v := n1.view(j.ID); len(v.Attempts) != 2 || v.Attempts[0].Node != "n2" || v.Attempts[1].Node != "n3" {
		t.Fatalf("attempts = %+v", v.Attempts)
	}
}

// A silent host that answers again goes on with the job: no restart.
func TestRestartSilentHostThatComesBackGoesOn(t *testing.T) {
	_, n1, n2 := twoNodes(t)
	a, j, oa := restartableWithOutput(t, n1, n2)
	n1.e.ReplyLegSilent("n2", j.ID, oa.Gen)
	a.Output(j.ID, oa.Gen, []byte(`"b"`))
	a.End(j.ID, oa.Gen, "", "", nil)
	n1.waitState(j.ID, core.StateCompleted)
	wantKinds(t, j, core.EventAccepted, core.EventOutput, core.EventOutput, core.EventDone)
}

// on_worker_lost and max_restarts are checked: a value other than "fail"
// or "restart", a max_restarts that is not a whole number at least 0, or
// one above the node's ceiling, are refused with their field named.
func TestRestartEnvelopeFields(t *testing.T) {
	limits := core.DefaultLimits()
	for _, tc := range []struct {
		name, body string
		code       core.Code
		field      string
	}{
		{"restart", `{"input":1,"on_worker_lost":"restart","max_restarts":2}`, "", ""},
		{"fail", `{"input":1,"on_worker_lost":"fail"}`, "", ""},
		{"zero", `{"input":1,"on_worker_lost":"restart","max_restarts":0}`, "", ""},
		{"unknown policy", `{"input":1,"on_worker_lost":"retry"}`, core.CodeInvalidField, "on_worker_lost"},
		{"policy not a string", `{"input":1,"on_worker_lost":true}`, core.CodeInvalidField, "on_worker_lost"},
		{"negative", `{"input":1,"max_restarts":-1}`, core.CodeInvalidField, "max_restarts"},
		{"fraction", `{"input":1,"max_restarts":1.5}`, core.CodeInvalidField, "max_restarts"},
		{"string", `{"input":1,"max_restarts":"2"}`, core.CodeInvalidField, "max_restarts"},
		{"above the ceiling", `{"input":1,"max_restarts":4}`, core.CodeLimitAboveCeiling, "max_restarts"},
		{"huge", `{"input":1,"max_restarts":99999999999999999999}`, core.CodeLimitAboveCeiling, "max_restarts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := core.ParseEnvelope([]byte(tc.body))
			if err == nil {
				_, err = limits.Apply(e)
			}
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			ce := wantCode(t, err, tc.code)
			if ce.Field != tc.field {
				t.Errorf("field %q, want %q", ce.Field, tc.field)
			}
		})
	}
	e, _ := core.ParseEnvelope([]byte(`{"input":1}`))
	eff, _ := limits.Apply(e)
	if e.OnWorkerLost != core.LostFail || eff.MaxRestarts != core.DefaultMaxRestarts {
		t.Errorf("defaults: %q, max %d", e.OnWorkerLost, eff.MaxRestarts)
	}
}
