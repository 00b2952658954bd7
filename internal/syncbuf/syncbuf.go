// Package syncbuf is a bytes.Buffer for tests that goroutines may write
// and read at once: a log destination or a process's output that the test
// reads while the code under test still writes to it.
package syncbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is an io.Writer whose content may be read at any moment. The zero
// value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines returns the lines written so far that contain substr, without
// their newlines.
func (b *Buffer) Lines(substr string) []string {
	var out []string
	for l := range strings.Lines(b.String()) {
		if strings.Contains(l, substr) {
			out = append(out, strings.TrimSuffix(l, "\n"))
		}
	}
	return out
}
