package worker

// wakeup wakes the goroutines that wait, outside a lock, for a change of
// what that lock guards: a waiter takes next with the lock held, releases
// the lock and waits for the channel to close; whoever makes the change
// calls wake with the lock held. The channel is made only when someone
// waits, so a change no one waits for costs nothing. Its zero value is
// ready; the lock it goes with guards it.
type wakeup struct{ c chan struct{} }

// next is the channel the next wake closes.
func (w *wakeup) next() <-chan struct{} {
	if w.c == nil {
		w.c = make(chan struct{})
	}
	return w.c
}

// wake wakes every goroutine waiting on next's channel, if any.
func (w *wakeup) wake() {
	if w.c != nil {
		close(w.c)
		w.c = nil
	}
}
