package coretest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// failures is a testing.TB that records what a check of this package
// reports; its Fatalf ends the goroutine, as testing's does.
type failures struct {
	testing.TB
	got []string
}

func (f *failures) Helper()             {}
func (f *failures) Logf(string, ...any) {}

func (f *failures) Errorf(format string, args ...any) {
	f.got = append(f.got, fmt.Sprintf(format, args...))
}

func (f *failures) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

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
		f := &failures{}
		WantConfigError(f, tc.err, tc.flag)
		if pass := len(f.got) == 0; pass != tc.pass {
			t.Errorf("%s: passed %v, want %v (%q)", tc.name, pass, tc.pass, f.got)
		}
	}
}
