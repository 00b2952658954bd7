package core_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/coretest"
)

func TestDefaultLimitsAreValid(t *testing.T) {
	if err := core.DefaultLimits().Validate(); err != nil {
		t.Fatalf("DefaultLimits().Validate() = %v", err)
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name   string
		adjust func(*core.Limits)
		field  string // "" means valid
	}{
		{"defaults", func(*core.Limits) {}, ""},
		{"zero grace is fine", func(l *core.Limits) { l.MaxGrace = 0 }, ""},
		{"queue bytes equal to input bytes", func(l *core.Limits) { l.MaxQueueBytes = l.MaxInputBytes }, ""},
		{"default ttl equal to max", func(l *core.Limits) { l.DefaultTTL = l.MaxTTL }, ""},
		{"input bytes zero", func(l *core.Limits) { l.MaxInputBytes = 0 }, "max-input-bytes"},
		{"input bytes negative", func(l *core.Limits) { l.MaxInputBytes = -1 }, "max-input-bytes"},
		{"queue depth zero", func(l *core.Limits) { l.MaxQueueDepth = 0 }, "max-queue-depth"},
		{"queue bytes below input bytes", func(l *core.Limits) { l.MaxQueueBytes = l.MaxInputBytes - 1 }, "max-queue-bytes"},
		{"max ttl below 1ms", func(l *core.Limits) { l.MaxTTL = time.Millisecond - 1 }, "max-ttl"},
		{"default ttl zero", func(l *core.Limits) { l.DefaultTTL = 0 }, "default-ttl"},
		{"default ttl above max", func(l *core.Limits) { l.DefaultTTL = l.MaxTTL + 1 }, "default-ttl"},
		{"output bytes zero", func(l *core.Limits) { l.MaxOutputBytes = 0 }, "max-output-bytes"},
		{"grace negative", func(l *core.Limits) { l.MaxGrace = -time.Second }, "max-grace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := core.DefaultLimits()
			tt.adjust(&l)
			coretest.WantConfigError(t, l.Validate(), tt.field)
		})
	}
}

// testLimits are small, distinct ceilings so a test can tell them apart.
func testLimits() core.Limits {
	return core.Limits{
		MaxInputBytes:  100,
		MaxQueueDepth:  10,
		MaxQueueBytes:  1000,
		MaxTTL:         10 * time.Second,
		DefaultTTL:     2 * time.Second,
		MaxOutputBytes: 500,
		MaxGrace:       3 * time.Second,
	}
}

func TestLimitsApplyDefaults(t *testing.T) {
	l := testLimits()
	eff, err := l.Apply(&core.Envelope{Input: json.RawMessage(`"x"`)})
	if err != nil {
		t.Fatal(err)
	}
	want := core.Effective{TTL: 2 * time.Second, MaxInputBytes: 100, MaxQueueDepth: 10, MaxQueueBytes: 1000, MaxOutputBytes: 500}
	if eff != want {
		t.Errorf("Apply = %+v, want %+v", eff, want)
	}
}

func TestLimitsApplyLowering(t *testing.T) {
	l := testLimits()
	in := json.RawMessage(`"x"`)
	tests := []struct {
		name  string
		env   core.Envelope
		check func(core.Effective) bool
	}{
		{"ttl", core.Envelope{TTL: 5 * time.Second}, func(e core.Effective) bool { return e.TTL == 5*time.Second }},
		{"ttl at max", core.Envelope{TTL: 10 * time.Second}, func(e core.Effective) bool { return e.TTL == 10*time.Second }},
		{"ttl 1ms", core.Envelope{TTL: time.Millisecond}, func(e core.Effective) bool { return e.TTL == time.Millisecond }},
		{"input bytes", core.Envelope{Limits: core.RequestLimits{MaxInputBytes: 50}}, func(e core.Effective) bool { return e.MaxInputBytes == 50 && e.MaxQueueDepth == 10 }},
		{"queue depth", core.Envelope{Limits: core.RequestLimits{MaxQueueDepth: 3}}, func(e core.Effective) bool { return e.MaxQueueDepth == 3 && e.MaxInputBytes == 100 }},
		{"queue bytes", core.Envelope{Limits: core.RequestLimits{MaxQueueBytes: 200}}, func(e core.Effective) bool { return e.MaxQueueBytes == 200 }},
		{"output bytes", core.Envelope{Limits: core.RequestLimits{MaxOutputBytes: 7}}, func(e core.Effective) bool { return e.MaxOutputBytes == 7 }},
		{"limits equal to ceilings", core.Envelope{Limits: core.RequestLimits{MaxInputBytes: 100, MaxQueueDepth: 10, MaxQueueBytes: 1000, MaxOutputBytes: 500}},
			func(e core.Effective) bool {
				return e.MaxInputBytes == 100 && e.MaxQueueDepth == 10 && e.MaxQueueBytes == 1000 && e.MaxOutputBytes == 500
			}},
		{"grace", core.Envelope{Grace: time.Second}, func(e core.Effective) bool { return e.Grace == time.Second }},
		{"grace at ceiling", core.Envelope{TTL: 5 * time.Second, Grace: 3 * time.Second}, func(e core.Effective) bool { return e.Grace == 3*time.Second }},
		{"grace capped at the ttl", core.Envelope{TTL: 500 * time.Millisecond, Grace: 2 * time.Second}, func(e core.Effective) bool {
			return e.Grace == 500*time.Millisecond && e.TTL == 500*time.Millisecond
		}},
		{"grace capped at the default ttl", core.Envelope{Grace: 3 * time.Second}, func(e core.Effective) bool { return e.TTL == 2*time.Second && e.Grace == 2*time.Second }},
		{"grace above max capped to it", core.Envelope{TTL: 10 * time.Second, Grace: 3*time.Second + 1}, func(e core.Effective) bool { return e.Grace == 3*time.Second }},
		{"huge grace capped to max", core.Envelope{TTL: 10 * time.Second, Grace: time.Duration(1<<63 - 1)}, func(e core.Effective) bool { return e.Grace == 3*time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := tt.env
			env.Input = in
			eff, err := l.Apply(&env)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if !tt.check(eff) {
				t.Errorf("Apply = %+v", eff)
			}
		})
	}
}

func TestLimitsApplyRefusals(t *testing.T) {
	l := testLimits()
	tests := []struct {
		name  string
		env   core.Envelope
		code  core.Code
		field string
	}{
		{"ttl above max", core.Envelope{TTL: 10*time.Second + time.Millisecond}, core.CodeTTLOutOfRange, "ttl_ms"},
		{"ttl below 1ms", core.Envelope{TTL: time.Microsecond}, core.CodeTTLOutOfRange, "ttl_ms"},
		{"ttl negative", core.Envelope{TTL: -time.Second}, core.CodeTTLOutOfRange, "ttl_ms"},
		{"grace negative", core.Envelope{Grace: -1}, core.CodeInvalidField, "grace_ms"},
		{"raise input bytes", core.Envelope{Limits: core.RequestLimits{MaxInputBytes: 101}}, core.CodeLimitAboveCeiling, "limits.max_input_bytes"},
		{"raise queue depth", core.Envelope{Limits: core.RequestLimits{MaxQueueDepth: 11}}, core.CodeLimitAboveCeiling, "limits.max_queue_depth"},
		{"raise queue bytes", core.Envelope{Limits: core.RequestLimits{MaxQueueBytes: 1001}}, core.CodeLimitAboveCeiling, "limits.max_queue_bytes"},
		{"raise output bytes", core.Envelope{Limits: core.RequestLimits{MaxOutputBytes: 501}}, core.CodeLimitAboveCeiling, "limits.max_output_bytes"},
		{"negative input bytes", core.Envelope{Limits: core.RequestLimits{MaxInputBytes: -1}}, core.CodeInvalidField, "limits.max_input_bytes"},
		{"negative queue depth", core.Envelope{Limits: core.RequestLimits{MaxQueueDepth: -1}}, core.CodeInvalidField, "limits.max_queue_depth"},
		{"negative queue bytes", core.Envelope{Limits: core.RequestLimits{MaxQueueBytes: -1}}, core.CodeInvalidField, "limits.max_queue_bytes"},
		{"negative output bytes", core.Envelope{Limits: core.RequestLimits{MaxOutputBytes: -1}}, core.CodeInvalidField, "limits.max_output_bytes"},
		{"input over node max", core.Envelope{Input: json.RawMessage(`"` + strings.Repeat("a", 99) + `"`)}, core.CodeInputTooLarge, "input"},
		{"input over lowered max", core.Envelope{Input: json.RawMessage(`"abcdefghi"`), Limits: core.RequestLimits{MaxInputBytes: 10}}, core.CodeInputTooLarge, "input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := tt.env
			if env.Input == nil {
				env.Input = json.RawMessage(`"x"`)
			}
			eff, err := l.Apply(&env)
			ce := wantCode(t, err, tt.code)
			if ce.Field != tt.field {
				t.Errorf("Field = %q, want %q", ce.Field, tt.field)
			}
			if eff != (core.Effective{}) {
				t.Errorf("Apply returned limits with its error: %+v", eff)
			}
		})
	}
}

func TestLimitsApplyInputAtTheLimit(t *testing.T) {
	l := testLimits()
	// 100 bytes of JSON text exactly: a 98-character string plus its quotes.
	env := &core.Envelope{Input: json.RawMessage(`"` + strings.Repeat("a", 98) + `"`)}
	if _, err := l.Apply(env); err != nil {
		t.Fatalf("input of exactly max_input_bytes refused: %v", err)
	}
	env.Limits.MaxInputBytes = 99
	wantCode(t, func() error { _, err := l.Apply(env); return err }(), core.CodeInputTooLarge)
}
