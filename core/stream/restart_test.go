package stream_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
	"github.com/switchyard/switchyard/core/stream"
	"github.com/switchyard/switchyard/internal/coretest"
)

// A restart opens the stream's next generation without renumbering it:
// each event's envelope says the generation it belongs to, and a token
// from the earlier generation, issued before or after the restart, resumes
// exactly after its event. A token whose generation does not hold its seq
// is refused.
func TestRestartKeepsEarlierTokensValid(t *testing.T) {
	ring, err := resume.NewKeyring("k1", resume.Key{ID: "k1", Secret: bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	pos := stream.Positions{Keyring: ring, TTL: time.Hour, Snapshot: 1}
	caller, filter := stream.CallerFingerprint(""), stream.FilterFingerprint(nil)
	j := newJob(100, 1<<20)
	coretest.Append(t, j, core.EventAccepted, `{}`)
	out := coretest.Append(t, j, core.EventOutput, `{"data":"a"}`)
	before, err := pos.Token(j, out.Seq, caller, filter)
	if err != nil {
		t.Fatal(err)
	}
	rs, _ := j.History.Append(core.EventRestart, 2, []byte(`{"reason":"worker_lost","last_seq":2}`))
	coretest.Append(t, j, core.EventOutput, `{"data":"b"}`)
	after, _ := pos.Token(j, out.Seq, caller, filter)

	for name, tok := range map[string]string{"issued before the restart": before, "issued after": after} {
		seq, err := pos.Verify(j, tok, caller, filter)
		if err != nil || seq != out.Seq {
			t.Errorf("token %s: seq %d, err %v; want %d", name, seq, err, out.Seq)
		}
	}
	for _, c := range []struct {
		ev       core.Event
		gen, seq uint64
	}{{out, 1, 2}, {rs, 2, 3}} {
		var m map[string]any
		if err := json.Unmarshal(stream.EventData(j, c.ev, 1), &m); err != nil {
			t.Fatal(err)
		}
		if m["gen"] != float64(c.gen) || m["seq"] != float64(c.seq) {
			t.Errorf("event %d data %v, want gen %d", c.ev.Seq, m, c.gen)
		}
	}
	if m := map[string]any{}; json.Unmarshal(stream.EventData(j, rs, 1), &m) != nil || m["attempt"] != float64(2) || m["last_seq"] != float64(2) || m["reason"] != "worker_lost" {
		t.Errorf("restart event data %s", stream.EventData(j, rs, 1))
	}

	wrong, _ := ring.Sign(resume.Position{Stream: j.ID, Generation: 2, Seq: out.Seq, Snapshot: 1, Caller: caller, Filter: filter}, time.Now(), time.Hour)
	if _, err := pos.Verify(j, wrong, caller, filter); !errors.Is(err, resume.ErrInvalidToken) || resume.ReasonOf(err) != resume.ReasonGenerationMoved {
		t.Errorf("a token naming seq %d in generation 2: %v, want generation_moved", out.Seq, err)
	}
	if f, err := stream.ParseTypes([]string{"restart"}); err != nil || !f[core.EventRestart] {
		t.Errorf("types=restart: %v %v", f, err)
	}
}
