package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
	"github.com/switchyard/switchyard/worker"
)

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        []string
	}{
		{"string", `"hello  big world"`, []string{`"hello "`, `"big "`, `"world"`}},
		{"object", `{"text":"one two","extra":1}`, []string{`"one "`, `"two"`}},
		{"empty", `""`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// An hour of default delay: the job's delay_ms must override it.
			_, _, s := startOnFake(t, worker.Config{}, worker.Tokens(time.Hour))
			start := time.Now()
			s.sendJob(t, &pb.Job{JobId: "t", Generation: 1, Input: []byte(tc.input), Options: []byte(`{"delay_ms":30}`)})
			s.expectAccept(t, "t", 1)
			for i, w := range tc.want {
				o := s.next(t).GetOutput()
				if o == nil || string(o.Data) != w {
					t.Fatalf("output %d = %v, want %s", i, o, w)
				}
			}
			c := s.next(t).GetComplete()
			if c == nil {
				t.Fatal("want Complete")
			}
			if want := fmt.Sprintf(`{"words":%d}`, len(tc.want)); string(c.Result) != want {
				t.Fatalf("result = %s, want %s", c.Result, want)
			}
			if least := time.Duration(len(tc.want)) * 30 * time.Millisecond; time.Since(start) < least {
				t.Fatalf("took %s, less than delay_ms × words = %s", time.Since(start), least)
			}
		})
	}
}

func TestTokensBadInput(t *testing.T) {
	for _, tc := range []struct {
		name, input, options, code, says string
	}{
		{"number", `42`, ``, "bad_input", `input is a number: want a JSON string ("hello world") or an object {"text": "..."}`},
		{"object without text", `{"txt":"a"}`, ``, "bad_input", `input object needs a string field "text"`},
		{"delay too long", `"a"`, `{"delay_ms":20000}`, "bad_options", "delay_ms must be 0..10000, not 20000"},
		{"negative delay", `"a"`, `{"delay_ms":-1}`, "bad_options", "delay_ms must be 0..10000, not -1"},
		{"huge delay", `"a"`, `{"delay_ms":9223372036854775807}`, "bad_options", "delay_ms must be 0..10000"},
		{"delay not a number", `"a"`, `{"delay_ms":"5"}`, "bad_options", `delay_ms is "5": want a whole number of milliseconds, 0..10000`},
		{"options an array", `"a"`, `[1]`, "bad_options", `options are an array: want an object, {"delay_ms": 150}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, s := startOnFake(t, worker.Config{}, worker.Tokens(0))
			s.sendJob(t, &pb.Job{JobId: "b", Generation: 1, Input: []byte(tc.input), Options: []byte(tc.options)})
			s.expectAccept(t, "b", 1)
			if fl := s.expectFail(t, "b", 1); fl.Code != tc.code || !strings.Contains(fl.Message, tc.says) || strings.Contains(fl.Message, "Go ") {
				t.Fatalf("failed %q: %s\nwant %q saying %s", fl.Code, fl.Message, tc.code, tc.says)
			}
		})
	}
}

func TestTokensCancelledPromptly(t *testing.T) {
	cancelledPromptly(t, worker.Tokens(0), &pb.Job{JobId: "c", Generation: 1, Input: []byte(`"a b c"`), Options: []byte(`{"delay_ms":10000}`)})
}
