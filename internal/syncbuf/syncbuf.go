// Package syncbuf is a bytes.Buffer, and a list, for tests that goroutines
// may write and read at once: a log destination or a process's output, or
// what a fake heard, that the test reads while the code under test still
// writes to it.
package syncbuf

import (
	"bytes"
	"slices"
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

// List is a list that goroutines append to while the test reads it: what
// a fake heard, in order. The zero value is empty and ready.
type List[T any] struct {
	mu sync.Mutex
	vs []T
}

// Append adds vs at the end.
func (l *List[T]) Append(vs ...T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.vs = append(l.vs, vs...)
}

// All returns a copy of the list as it is now.
func (l *List[T]) All() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.vs)
}

// Len is how long the list is now.
func (l *List[T]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.vs)
}
