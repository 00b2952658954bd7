// Package chans holds what several packages ask of a channel alike.
package chans

// Closed reports whether ch is closed, without blocking. It is for a
// channel that is only ever closed, never sent on: a done or lost signal.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Notify sends on ch without blocking: ch is a wake-up signal, buffered
// to one, whose receiver looks at everything that changed when it wakes.
// A signal already pending stands for this one too, so none is lost.
func Notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
