package apierr_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/internal/promtest"
)

// Server faults are logged at warn and counted as internal; refusals at
// debug, counted by code; a client that left at debug, not counted.
func TestReporter(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		level     string
		countCode string
	}{
		{"refusal", &core.Error{Code: core.CodeQueueFull, Detail: "full"}, "DEBUG", "queue_full"},
		{"refusal of a newer peer", &core.Error{Code: "something_new", Detail: "?"}, "DEBUG", "unknown"},
		{"server fault", errors.New("disk on fire"), "WARN", "internal"},
		{"client left", fmt.Errorf("forward: %w", context.Canceled), "DEBUG", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			apierr.NewMetrics(reg).Reporter("http", log).Report(tc.err, "path", "/v1/x")

			if lines := strings.Split(strings.TrimSpace(logs.String()), "\n"); len(lines) != 1 ||
				!strings.Contains(lines[0], "level="+tc.level) || !strings.Contains(lines[0], "path=/v1/x") {
				t.Errorf("logged %q, want one %s line with the path", logs.String(), tc.level)
			}
			if got := counted(t, reg); got != tc.countCode {
				t.Errorf("counted under %q, want %q", got, tc.countCode)
			}
		})
	}
}

// counted returns the code label of the one switchyard_api_errors_total
// series with the value 1 and transport http ("" when none was counted).
func counted(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	code := ""
	for _, s := range promtest.All(t, reg, "switchyard_api_errors_total") {
		if code != "" || s.Labels["transport"] != "http" || s.Value != 1 {
			t.Fatalf("unexpected series %v", s)
		}
		code = s.Labels["code"]
	}
	return code
}
