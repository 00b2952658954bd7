package tbtest

import (
	"slices"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Run returns every failure in order; Fatalf ends f there.
func TestRun(t *testing.T) {
	reached := false
	got := Run(func(tb testing.TB) {
		tb.Helper()
		tb.Logf("not a failure")
		tb.Errorf("first %d", 1)
		tb.Fatalf("second %s", "two")
		reached = true
	})
	if want := []string{"first 1", "second two"}; !slices.Equal(got, want) {
		t.Fatalf("failures %q, want %q", got, want)
	}
	if reached {
		t.Fatal("f went on after Fatalf")
	}
	if got := Run(func(testing.TB) {}); len(got) != 0 {
		t.Fatalf("a passing f: failures %q", got)
	}
}
