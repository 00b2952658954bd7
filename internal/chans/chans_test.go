package chans

import "testing"

func TestClosed(t *testing.T) {
	ch := make(chan struct{})
	if Closed(ch) {
		t.Fatal("Closed of an open channel: true")
	}
	close(ch)
	if !Closed(ch) {
		t.Fatal("Closed of a closed channel: false")
	}
}
