package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

// restartWorker attaches a second worker to the fixture's queue and
// detaches the first, whose job (which produced output) then restarts on
// the second if it opted in. It returns the second worker's offer,
// accepted.
func (f *chatFixture) restartOnSecond(t *testing.T) (*core.Worker, core.Offer) {
	t.Helper()
	conn := chatConn{offers: make(chan core.Offer, 8), cancels: make(chan string, 8)}
	w2, err := f.s.e.AttachWorker(context.Background(), core.WorkerSpec{Queue: DefaultOpenAIQueue, Name: "w2", Capabilities: []string{"model=demo"}, Concurrency: 4}, conn)
	if err != nil {
		t.Fatal(err)
	}
	f.w.Detach(context.Background())
	select {
	case o := <-conn.offers:
		w2.Accept(o.JobID, o.Gen)
		return w2, o
	case <-time.After(5 * time.Second):
		t.Fatal("the job was not offered again")
	}
	return nil, core.Offer{}
}

// X-Switchyard-On-Worker-Lost: restart moves a completion whose worker is
// lost: without stream the answer is the last run's text alone; with
// stream the client gets a chunk with no choices and switchyard_restart
// between the runs. Without the header the completion fails worker_lost;
// a bad value is refused.
func TestChatRestart(t *testing.T) {
	t.Run("not streamed", func(t *testing.T) {
		f := newChatFixture(t, nil)
		done := make(chan *http.Response, 1)
		go func() { done <- f.post(t.Context(), t, chatBody+`}`, map[string]string{OnWorkerLostHeader: "restart"}) }()
		o := f.offer(t)
		f.w.Output(o.JobID, o.Gen, []byte(`"abandoned "`))
		w2, o2 := f.restartOnSecond(t)
		w2.Output(o2.JobID, o2.Gen, []byte(`"fresh"`))
		w2.End(o2.JobID, o2.Gen, "", "", nil)
		res := <-done
		var got ChatCompletion
		if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || got.Choices[0].Message.Content != "fresh" || got.Usage.CompletionTokens != 1 {
			t.Errorf("%d %+v, want the second run's text alone", res.StatusCode, got)
		}
	})
	t.Run("streamed", func(t *testing.T) {
		f := newChatFixture(t, nil)
		res := f.post(t.Context(), t, chatBody+`,"stream":true}`, map[string]string{OnWorkerLostHeader: "restart"})
		o := f.offer(t)
		f.w.Output(o.JobID, o.Gen, []byte(`"abandoned "`))
		w2, o2 := f.restartOnSecond(t)
		w2.Output(o2.JobID, o2.Gen, []byte(`"fresh"`))
		w2.End(o2.JobID, o2.Gen, "", "", nil)
		lines := dataLines(t, res.Body)
		var shapes []string
		for _, l := range lines[:len(lines)-1] {
			var c struct {
				Choices []struct {
					Delta struct{ Content *string }
				}
				SwitchyardRestart *ChatRestart `json:"switchyard_restart"`
			}
			if err := json.Unmarshal([]byte(l), &c); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			switch {
			case c.SwitchyardRestart != nil:
				r := c.SwitchyardRestart
				if len(c.Choices) != 0 || r.Reason != "worker_lost" || r.Gen != 2 || r.Attempt != o2.Gen || r.Restarts != 1 {
					t.Errorf("restart chunk %s", l)
				}
				shapes = append(shapes, "restart")
			case len(c.Choices) == 1 && c.Choices[0].Delta.Content != nil:
				shapes = append(shapes, *c.Choices[0].Delta.Content)
			default:
				shapes = append(shapes, "end")
			}
		}
		if got := strings.Join(shapes, "|"); got != "|abandoned |restart|fresh|end" {
			t.Errorf("chunks %q", got)
		}
	})
	t.Run("without the header", func(t *testing.T) {
		f := newChatFixture(t, nil)
		done := make(chan *http.Response, 1)
		go func() { done <- f.post(t.Context(), t, chatBody+`}`, nil) }()
		o := f.offer(t)
		f.w.Output(o.JobID, o.Gen, []byte(`"partial"`))
		f.w.Detach(context.Background())
		res := <-done
		if code, _, _ := openAIError(t, res); res.StatusCode != http.StatusBadGateway || code != "worker_lost" {
			t.Errorf("%d %s, want 502 worker_lost", res.StatusCode, code)
		}
	})
	t.Run("bad value", func(t *testing.T) {
		f := newChatFixture(t, nil)
		res := f.post(t.Context(), t, chatBody+`}`, map[string]string{OnWorkerLostHeader: "retry"})
		if code, _, param := openAIError(t, res); res.StatusCode != http.StatusBadRequest || code != "invalid_field" || param != OnWorkerLostHeader {
			t.Errorf("%d %s %v, want 400 invalid_field on the header", res.StatusCode, code, param)
		}
	})
}
