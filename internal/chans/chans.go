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
