package core_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/core"
)

func TestErrorIsMatchesByCode(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", &core.Error{Code: core.CodeQueueFull, Detail: "some detail"})
	if !errors.Is(err, core.ErrQueueFull) {
		t.Error("a wrapped queue_full error does not match ErrQueueFull")
	}
	if errors.Is(err, core.ErrDraining) || errors.Is(err, core.ErrNoCapableWorker) || errors.Is(err, core.ErrJobNotFound) {
		t.Error("a queue_full error matches a sentinel of another code")
	}
	if errors.Is(errors.New("queue_full"), core.ErrQueueFull) {
		t.Error("a plain error matches ErrQueueFull")
	}
	code, ok := core.CodeOf(err)
	if !ok || code != core.CodeQueueFull {
		t.Errorf("CodeOf = %q, %v", code, ok)
	}
	if code, ok := core.CodeOf(errors.New("x")); ok || code != "" {
		t.Errorf("CodeOf(plain) = %q, %v", code, ok)
	}
	if code, ok := core.CodeOf(nil); ok || code != "" {
		t.Errorf("CodeOf(nil) = %q, %v", code, ok)
	}
	if code, ok := core.CodeOf(core.ErrQueueFull); !ok || code != core.CodeQueueFull {
		t.Errorf("CodeOf(*Error) = %q, %v", code, ok)
	}
	if a := testing.AllocsPerRun(100, func() { core.CodeOf(nil) }); a != 0 {
		t.Errorf("CodeOf(nil) allocates %v times", a)
	}
}

func TestErrorMessage(t *testing.T) {
	withField := (&core.Error{Code: core.CodeInvalidField, Field: "zone", Detail: "bad"}).Error()
	if !strings.Contains(withField, "invalid_field") || !strings.Contains(withField, "zone") || !strings.Contains(withField, "bad") {
		t.Errorf("Error() = %q", withField)
	}
	noField := (&core.Error{Code: core.CodeDraining, Detail: "later"}).Error()
	if !strings.Contains(noField, "draining") || !strings.Contains(noField, "later") {
		t.Errorf("Error() = %q", noField)
	}
}

func TestConfigErrorUnwraps(t *testing.T) {
	inner := errors.New("must be positive")
	err := fmt.Errorf("start: %w", &core.ConfigError{Field: "max-queue-depth", Value: 0, Err: inner})
	if !errors.Is(err, inner) {
		t.Error("ConfigError does not unwrap to its cause")
	}
	var ce *core.ConfigError
	if !errors.As(err, &ce) || ce.Field != "max-queue-depth" {
		t.Fatalf("errors.As: %v", err)
	}
	if msg := ce.Error(); msg != "config --max-queue-depth=0: must be positive" {
		t.Errorf("Error() = %q", msg)
	}
}
