package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/worker"
)

// Each run is one "run started" line and one "run ended" line, with the
// worker, job, generation and trace id, and the handler's error if it failed: the
// lines the compose fault tests parse.
func TestRecordRuns(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	fail := errors.New("stopped after 2 of 5 words")
	for _, tc := range []struct {
		err  error
		want []string
	}{
		{nil, []string{
			`msg="run started" worker=w-3 job=j_1 generation=2 trace_id=4bf92f3577b34da6a3ce929d0e0e4736`,
			`msg="run ended" worker=w-3 job=j_1 generation=2 trace_id=4bf92f3577b34da6a3ce929d0e0e4736` + "\n",
		}},
		{fail, []string{
			`msg="run started" worker=w-3 job=j_1 generation=2 trace_id=4bf92f3577b34da6a3ce929d0e0e4736`,
			`msg="run ended" worker=w-3 job=j_1 generation=2 trace_id=4bf92f3577b34da6a3ce929d0e0e4736 err="stopped after 2 of 5 words"`,
		}},
	} {
		buf.Reset()
		h := recordRuns(func(context.Context, *worker.Job, *worker.Output) (any, error) {
			if !strings.Contains(buf.String(), "run started") {
				t.Error("the handler ran before its start was recorded")
			}
			return nil, tc.err
		}, "w-3", log)
		if _, err := h(context.Background(), &worker.Job{ID: "j_1", Generation: 2, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}, nil); !errors.Is(err, tc.err) {
			t.Fatalf("handler error %v, want %v", err, tc.err)
		}
		lines := strings.SplitAfter(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
		}
		for i, want := range tc.want {
			if !strings.Contains(lines[i]+"\n", want) {
				t.Errorf("line %d: %q, want it to contain %q", i, lines[i], want)
			}
		}
	}
}
