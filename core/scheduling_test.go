package core_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core"
)

func TestParseEnvelopeScheduling(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		code       core.Code
		key        string
		priority   int
	}{
		{"none", `{"input":1}`, "", "", 0},
		{"nulls", `{"input":1,"affinity_key":null,"priority":null}`, "", "", 0},
		{"key and priority", `{"input":1,"affinity_key":"session-42","priority":-5}`, "", "session-42", -5},
		{"highest", `{"input":1,"priority":5}`, "", "", 5},
		{"longest key", `{"input":1,"affinity_key":"` + strings.Repeat("k", core.MaxAffinityKeyBytes) + `"}`, "", strings.Repeat("k", core.MaxAffinityKeyBytes), 0},
		{"key too long", `{"input":1,"affinity_key":"` + strings.Repeat("k", core.MaxAffinityKeyBytes+1) + `"}`, core.CodeInvalidAffinityKey, "", 0},
		{"empty key", `{"input":1,"affinity_key":""}`, core.CodeInvalidAffinityKey, "", 0},
		{"key a number", `{"input":1,"affinity_key":42}`, core.CodeInvalidAffinityKey, "", 0},
		{"key an object", `{"input":1,"affinity_key":{"id":1}}`, core.CodeInvalidAffinityKey, "", 0},
		{"priority too high", `{"input":1,"priority":6}`, core.CodePriorityOutOfRange, "", 0},
		{"priority too low", `{"input":1,"priority":-6}`, core.CodePriorityOutOfRange, "", 0},
		{"priority past int64", `{"input":1,"priority":99999999999999999999}`, core.CodePriorityOutOfRange, "", 0},
		{"priority not whole", `{"input":1,"priority":1.5}`, core.CodeInvalidField, "", 0},
		{"priority a string", `{"input":1,"priority":"5"}`, core.CodeInvalidField, "", 0},
		{"priority true", `{"input":1,"priority":true}`, core.CodeInvalidField, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, err := core.ParseEnvelope([]byte(tc.body))
			if tc.code != "" {
				ce := wantCode(t, err, tc.code)
				if ce.Field != "affinity_key" && ce.Field != "priority" {
					t.Errorf("field %q, want the one at fault", ce.Field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if env.AffinityKey != tc.key || env.Priority != tc.priority {
				t.Errorf("key %q priority %d, want %q %d", env.AffinityKey, env.Priority, tc.key, tc.priority)
			}
		})
	}
}

// A priority above the key's cap is refused and changes nothing; at the
// cap it is taken.
func TestPriorityCap(t *testing.T) {
	h, _, fc := oneWorker(t, nil)
	capped := 0
	share := core.Share{Weight: 1, MaxPriority: &capped}
	e := env(time.Minute)
	e.Priority = 1
	_, _, err := h.e.Submit(context.Background(), "q", e, core.SubmitOptions{Owner: "bg", Share: share})
	if ce := wantCode(t, err, core.CodePriorityNotAllowed); ce.Field != "priority" {
		t.Errorf("field %q, want priority", ce.Field)
	}
	if n := len(fc.Offers()); n != 0 || h.metric("switchyard_queue_depth", "queue", "q") > 0 {
		t.Fatalf("a refused job reached the queue: %d offers", n)
	}
	e.Priority = 0
	if _, _, err := h.e.Submit(context.Background(), "q", e, core.SubmitOptions{Owner: "bg", Share: share}); err != nil {
		t.Fatalf("priority at the cap: %v", err)
	}
	if o := fc.lastOffer(t); o.Priority != 0 {
		t.Errorf("offer priority %d", o.Priority)
	}
}

func TestSchedulingConfigValidate(t *testing.T) {
	for _, c := range []core.SchedulingConfig{
		{AffinityLoadFactor: 0.9, PriorityAging: time.Second},
		{AffinityLoadFactor: math.NaN(), PriorityAging: time.Second},
		{AffinityLoadFactor: 1.5, PriorityAging: 0},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", c)
		}
	}
	if err := core.DefaultSchedulingConfig().Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
}
