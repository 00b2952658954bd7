package peer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// A delivery stream's Deliver stream that stalls (its oldest item's ack
// deadline passes), fails, goes silent or cannot be opened is dropped, and
// what it held unacked is resent by unary calls (delivery_unary.go) before
// anything newer, numbers unchanged (docs/cluster.md, "Stall → fallback").

// openStream opens the delivery stream's Deliver stream for n items about
// to be sent. One that cannot be opened leaves them to the unary path,
// logged once until a stream opens again. False when the delivery stream's
// node left the catalog.
func (l *deliveryStream) openStream(n int) bool {
	r := l.r
	err := l.open()
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrUnknownNode):
		return false
	case r.ctx.Err() != nil:
		return true
	}
	r.m.fallbacks.Inc()
	lvl := slog.LevelWarn
	if l.openFailing {
		lvl = slog.LevelDebug // said once until a stream opens again
	}
	l.openFailing = true
	r.log.Log(r.ctx, lvl, "could not open a deliver stream; sending by unary calls", "node", l.key.node, "queue", l.key.queue, "messages", n, "err", err)
	return true
}

// ackDue runs when the ack timer fires: the oldest unacked item whose ack
// is past its deadline (delivery_acks.go) is a stall.
func (l *deliveryStream) ackDue() {
	r := l.r
	// An ack already read counts: apply those first (acked re-arms
	// the timer for the new oldest item).
	l.drainAcks()
	if len(l.unacked) > 0 && !time.Now().Before(l.deadline()) {
		r.m.ackExpiries.Inc()
		head := l.unacked[0]
		l.fallback("an ack deadline passed", fmt.Errorf("%s of job %s unacked after %s", head.kind, jobOf(head), head.timeout))
	}
}

// silenceCheck runs on the stream's tick: a receiver that sent nothing,
// not even a heartbeat, for three intervals is silent.
func (l *deliveryStream) silenceCheck() {
	if silent := time.Since(l.st.lastRecv()); silent > silentIntervals*l.r.cfg.Heartbeat {
		l.fallback("the peer went silent", fmt.Errorf("nothing received for %s", silent.Round(time.Millisecond)))
	}
}

// warnEvery rate-limits a delivery stream's fallback warnings: a peer that
// keeps stalling would otherwise log one per message.
const warnEvery = time.Minute

// fallback drops the stream and resends every unacked item, in order, by
// unary calls, before anything newer is sent.
func (l *deliveryStream) fallback(why string, err error) {
	r := l.r
	if r.ctx.Err() != nil {
		return // Close: shutdown drops what is left
	}
	l.dropStream()
	r.m.fallbacks.Inc()
	lvl := slog.LevelDebug
	if now := time.Now(); now.Sub(l.warned) >= warnEvery {
		lvl, l.warned = slog.LevelWarn, now
	}
	r.log.Log(r.ctx, lvl, "deliver stream dropped; resending its unacked messages by unary calls", "node", l.key.node, "queue", l.key.queue, "why", why, "unacked", len(l.unacked), "err", err)
	items := l.unacked
	l.unacked = nil
	l.ackTimer.Stop()
	l.unary(items)
}

// dropStream ends the delivery stream's Deliver stream at once and waits
// for its goroutines. Acks that arrived before the end are applied; the
// items still unacked stay in l.unacked.
func (l *deliveryStream) dropStream() {
	st := l.st
	st.fail(errStreamDropped)
	st.wg.Wait()
	st.tick.Stop()
	l.r.m.streamsOpen.WithLabelValues(kindDeliver).Dec()
	l.st = st
	l.drainAcks()
	l.st = nil
}

// jobOf is the job an item is about, for logs.
func jobOf(it *item) string {
	if it.fwd != nil {
		return it.fwd.GetJobId()
	}
	return it.msg.GetJobId()
}
