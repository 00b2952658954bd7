package core

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// TestSubmissionHashCoversEveryField sets each field of Envelope in turn:
// every one must change the hash, or a retry that differs in it would be
// answered with the first job instead of idempotency_key_reused.
func TestSubmissionHashCoversEveryField(t *testing.T) {
	base := &Envelope{Input: json.RawMessage(`"x"`)}
	zero := submissionHash("q", base)
	typ := reflect.TypeOf(*base)
	for _, f := range reflect.VisibleFields(typ) {
		env := *base
		v := reflect.ValueOf(&env).Elem().FieldByIndex(f.Index)
		setNonZero(t, f.Name, v)
		if submissionHash("q", &env) == zero {
			t.Errorf("Envelope.%s does not count in submissionHash", f.Name)
		}
	}
	if submissionHash("other", base) == zero {
		t.Error("the queue does not count in submissionHash")
	}
	zeroRestarts := 0
	if a, b := submissionHash("q", &Envelope{Input: base.Input, MaxRestarts: &zeroRestarts}), zero; a == b {
		t.Error("max_restarts 0 hashes like max_restarts unset")
	}
}

// setNonZero gives v a value other than its zero value and other than
// what the field parses to by default.
func setNonZero(t *testing.T, name string, v reflect.Value) {
	t.Helper()
	switch v.Interface().(type) {
	case json.RawMessage:
		v.Set(reflect.ValueOf(json.RawMessage(`{"set":true}`)))
	case map[string]string:
		v.Set(reflect.ValueOf(map[string]string{"gpu": "a100"}))
	case RequestLimits:
		v.Set(reflect.ValueOf(RequestLimits{MaxOutputBytes: 1}))
	case LostPolicy:
		v.Set(reflect.ValueOf(LostRestart))
	case *int:
		n := 2
		v.Set(reflect.ValueOf(&n))
	case time.Duration:
		v.Set(reflect.ValueOf(time.Second))
	default:
		switch v.Kind() {
		case reflect.Int, reflect.Int64:
			v.SetInt(3)
		case reflect.String:
			v.SetString("set")
		default:
			t.Fatalf("Envelope.%s: a field of a new kind (%s): teach setNonZero to set it", name, v.Type())
		}
	}
}

// TestSubmissionHashIsStable pins the hash of envelopes that use no field
// newer than Priority: a node of this version and one of the last must
// agree on a key made before the upgrade, or a retry across a rolling
// upgrade is refused idempotency_key_reused.
func TestSubmissionHashIsStable(t *testing.T) {
	cases := []struct {
		env  *Envelope
		want string
	}{
		{&Envelope{Input: json.RawMessage(`"x"`)},
			"9bca71aae652872cd00818d1b602bd395f6776666c5a936d335d91fd0c36cdcc"},
		{&Envelope{Version: 1, TTL: 3 * time.Second, Capabilities: map[string]string{"b": "2", "a": "1"},
			Input: json.RawMessage(`{"p":1}`), Options: json.RawMessage(`{}`), Limits: RequestLimits{MaxInputBytes: 5},
			Zone: "z", Grace: time.Second},
			"00f4313780d5fd03560afd98a52a90b4d84ff3b4a484df2e08bca86509d3af76"},
		{&Envelope{Input: json.RawMessage(`1`), AffinityKey: "k", Priority: 3},
			"8f412fad65ab1565241cd66d505b4abdb31fbb90ab32cc28dae9a973306fa005"},
	}
	for i, c := range cases {
		if got := submissionHash("q", c.env); got != c.want {
			t.Errorf("case %d: hash %s, want %s", i, got, c.want)
		}
	}
}
