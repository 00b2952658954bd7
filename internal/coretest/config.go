package coretest

import (
	"errors"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// WantConfigError fails tb unless err is the refusal of the setting flag:
// a *core.ConfigError whose Field is flag and whose message names it as
// "--flag=". For flag "", it fails tb unless err is nil (the setting is
// valid).
func WantConfigError(tb testing.TB, err error, flag string) {
	tb.Helper()
	if flag == "" {
		if err != nil {
			tb.Errorf("got %v, want valid", err)
		}
		return
	}
	var ce *core.ConfigError
	if !errors.As(err, &ce) || ce.Field != flag || !strings.Contains(err.Error(), "--"+flag+"=") {
		tb.Errorf("got %v, want a ConfigError naming --%s", err, flag)
	}
}
