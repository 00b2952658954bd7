package coretest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/tbtest"
)

// WantConfigError passes the refusal of the flag named (wrapped or not)
// and, for no flag, no error; it fails anything else.
func TestWantConfigError(t *testing.T) {
	refusal := &core.ConfigError{Field: "max-ttl", Value: 0, Err: errors.New("must be positive")}
	for _, tc := range []struct {
		name string
		err  error
		flag string
		pass bool
	}{
		{"valid", nil, "", true},
		{"refused, want valid", refusal, "", false},
		{"the flag's refusal", refusal, "max-ttl", true},
		{"the flag's refusal, wrapped", fmt.Errorf("node: %w", refusal), "max-ttl", true},
		{"another flag's refusal", refusal, "default-ttl", false},
		{"not a ConfigError", errors.New("config --max-ttl=0: must be positive"), "max-ttl", false},
		{"valid, want refused", nil, "max-ttl", false},
	} {
		got := tbtest.Run(func(tb testing.TB) { WantConfigError(tb, tc.err, tc.flag) })
		if pass := len(got) == 0; pass != tc.pass {
			t.Errorf("%s: passed %v, want %v (%q)", tc.name, pass, tc.pass, got)
		}
	}
}
