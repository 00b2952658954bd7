package benchkit_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/switchyard/switchyard/integration/benchkit"
)

// ProcSyscalls counts the calls a process makes: fifty writes and fifty
// reads through a pipe show in this process's counts (Sub takes one
// reading from another, Add puts two together), and a process that exited
// has none to give.
func TestProcSyscallsCountsAProcessesCalls(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before, err := benchkit.ProcSyscalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	buf := []byte{1}
	for range 50 {
		if _, err := w.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	after, err := benchkit.ProcSyscalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Other goroutines of the test binary may make calls too: at least
	// ours, and not a count that went backwards.
	d := after.Sub(before)
	if d.Writes < 50 || d.Reads < 50 || d.Writes > 1e6 || d.Reads > 1e6 {
		t.Errorf("50 writes and 50 reads counted as %+v", d)
	}
	if sum := before.Add(d); sum != after {
		t.Errorf("%+v and %+v make %+v, want %+v", before, d, sum, after)
	}

	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if s, err := benchkit.ProcSyscalls(os.Getpid(), cmd.Process.Pid); err == nil {
		t.Errorf("a process that exited and was reaped counted: %+v", s)
	}
}
