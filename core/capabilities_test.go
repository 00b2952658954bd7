package core_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/core"
)

func TestParseCapabilities(t *testing.T) {
	c, err := core.ParseCapabilities([]string{"model=b", "gpu=a100", "model=a", "model=b", "path=x/y:z.1_2-3"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c["model"]); got != "[b a]" {
		t.Errorf("model = %s, want [b a] (duplicate dropped, order kept)", got)
	}
	if len(c) != 3 {
		t.Errorf("keys = %v", c)
	}
	if got := strings.Join(c.Strings(), ","); got != "gpu=a100,model=a,model=b,path=x/y:z.1_2-3" {
		t.Errorf("Strings() = %s", got)
	}
	empty, err := core.ParseCapabilities(nil)
	if err != nil || len(empty) != 0 || empty == nil {
		t.Errorf("ParseCapabilities(nil) = %v, %v", empty, err)
	}
	if s := empty.Strings(); len(s) != 0 {
		t.Errorf("empty Strings() = %v", s)
	}
}

func TestParseCapabilitiesRefusals(t *testing.T) {
	for _, p := range []string{
		"model", "=a", "model=", "mo del=a", "model=a b", "model=a=b", "mödel=a",
		strings.Repeat("k", 129) + "=v", "k=" + strings.Repeat("v", 129), "",
	} {
		c, err := core.ParseCapabilities([]string{"ok=1", p})
		if err == nil || c != nil {
			t.Errorf("ParseCapabilities(%q) = %v, %v; want an error", p, c, err)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", p)) {
			t.Errorf("error %q does not quote the bad pair", err)
		}
	}
	if _, err := core.ParseCapabilities([]string{strings.Repeat("k", 128) + "=" + strings.Repeat("v", 128)}); err != nil {
		t.Errorf("128-character key and value refused: %v", err)
	}
}

func TestCapabilitiesSatisfies(t *testing.T) {
	c, err := core.ParseCapabilities([]string{"model=a", "model=b", "gpu=yes"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		req  map[string]string
		want bool
	}{
		{nil, true},
		{map[string]string{}, true},
		{map[string]string{"model": "a"}, true},
		{map[string]string{"model": "b", "gpu": "yes"}, true},
		{map[string]string{"model": "c"}, false},
		{map[string]string{"model": "a", "gpu": "no"}, false},
		{map[string]string{"region": "eu"}, false},
		{map[string]string{"model": ""}, false},
	}
	for _, tt := range tests {
		if got := c.Satisfies(tt.req); got != tt.want {
			t.Errorf("Satisfies(%v) = %v, want %v", tt.req, got, tt.want)
		}
	}
	var none core.Capabilities
	if !none.Satisfies(nil) || none.Satisfies(map[string]string{"model": "a"}) {
		t.Error("a worker with no capabilities must satisfy only empty requirements")
	}
}

// An offer lists a job's required capabilities as Capabilities.Strings
// lists the same pairs, and none as nil.
func TestCapabilityStringsMatchesStrings(t *testing.T) {
	for _, m := range []map[string]string{
		nil,
		{},
		{"model": "a"},
		{"model": "b", "gpu": "a100", "zone": "x/y:z.1_2-3"},
		{"a": "b=c", "a=b": "c", "ab": "", "": "x"},
	} {
		caps := core.Capabilities{}
		for k, v := range m {
			caps[k] = []string{v}
		}
		got, want := core.CapabilityStrings(m), caps.Strings()
		if !slices.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("capabilityStrings(%v) = %#v, want %#v", m, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { core.CapabilityStrings(nil) }); n != 0 {
		t.Errorf("no capabilities: %v allocations, want 0", n)
	}
}
