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

func TestNotify(t *testing.T) {
	ch := make(chan struct{}, 1)
	Notify(ch)
	Notify(ch) // pending already: must not block
	select {
	case <-ch:
	default:
		t.Fatal("Notify sent nothing")
	}
	select {
	case <-ch:
		t.Fatal("two signals pending on a channel buffered to one")
	default:
	}
}
