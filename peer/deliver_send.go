package peer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The request leg's stream, sending end: a lane's Deliver stream. The
// receiving end is deliver_recv.go.

// laneStream is a lane's Deliver stream on the sending side. Two
// goroutines own the gRPC stream: a writer (the open frame, items as the
// lane pushes them, a heartbeat every interval) and a reader (acks to the
// lane; every frame, heartbeats included, proves the receiver alive). The
// lane never blocks on them: it pushes at most laneWindow unacked items,
// the capacity of frames and of acks. Both end when ctx does, which
// dropStream and Transport.Close cause, or when the stream fails; the lane
// waits for them before it goes on.
type laneStream struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	frames chan *pb.DeliverFrame   // pushed, not yet written
	acks   chan *pb.DeliverHandled // read, not yet applied
	done   chan struct{}           // closed once the stream ended; err says why
	err    error
	once   sync.Once
	closec chan struct{} // idle close: the writer half-closes
	last   atomic.Int64  // when a frame last arrived, UnixNano
	tick   *time.Ticker  // the lane's silence check
	wg     sync.WaitGroup
	// The zone label of the lane's node when the stream opened: the zone
	// test it passed (lane.zoneCheck).
	zone  string
	zoned bool
}

var (
	errStreamDropped = errors.New("peer: deliver stream dropped")
	errOpenStalled   = errors.New("peer: opening a deliver stream took longer than the ack timeout ceiling")
)

// open opens the lane's stream. It does not wait for the receiver: the
// open frame and the first items go out together, and a receiver that
// refuses the stream fails it at once.
func (l *lane) open() error {
	r := l.r
	addr, ok := r.cfg.Addr(l.key.node)
	if !ok {
		return ErrUnknownNode
	}
	cc, err := r.client.Conn(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(r.ctx)
	// A connection still being made holds the call up: bound that.
	t := time.AfterFunc(r.cfg.AckTimeoutCeiling, func() { cancel(errOpenStalled) })
	cs, err := pb.NewPeerServiceClient(cc).Deliver(ctx)
	if !t.Stop() && err == nil {
		err = errOpenStalled
	}
	if err != nil {
		cancel(err)
		return err
	}
	st := &laneStream{
		ctx: ctx, cancel: cancel,
		frames: make(chan *pb.DeliverFrame, laneWindow),
		acks:   make(chan *pb.DeliverHandled, laneWindow),
		done:   make(chan struct{}),
		closec: make(chan struct{}),
		tick:   time.NewTicker(r.cfg.Heartbeat),
	}
	st.zone, st.zoned = r.zoneOf(l.key.node)
	st.last.Store(time.Now().UnixNano())
	open := &pb.DeliverFrame{Body: &pb.DeliverFrame_Open{Open: &pb.DeliverOpen{
		Session: r.session, Lane: &pb.PeerLane{Queue: l.key.queue}, HeartbeatIntervalNs: int64(r.cfg.Heartbeat),
	}}}
	st.wg.Add(2)
	go st.write(cs, open, r.cfg.Heartbeat)
	go st.read(cs)
	l.st, l.openFailing = st, false
	r.m.streamsOpen.WithLabelValues(kindDeliver).Inc()
	r.m.streamsOpened.WithLabelValues(kindDeliver).Inc()
	return nil
}

// push hands it to the writer; the window guarantees room.
func (st *laneStream) push(it *item, now time.Time) {
	it.sentAt = now
	f := &pb.DeliverItem{Seq: it.seq}
	if it.fwd != nil {
		f.Body = &pb.DeliverItem_Forward{Forward: it.fwd}
	} else {
		f.Body = &pb.DeliverItem_Message{Message: it.msg}
	}
	st.frames <- &pb.DeliverFrame{Body: &pb.DeliverFrame_Item{Item: f}}
}

// fail records why the stream ended (the first reason) and ends it.
func (st *laneStream) fail(err error) {
	st.once.Do(func() {
		st.err = err
		close(st.done)
	})
	st.cancel(err)
}

func (st *laneStream) lastRecv() time.Time { return time.Unix(0, st.last.Load()) }

func (st *laneStream) write(cs pb.PeerService_DeliverClient, open *pb.DeliverFrame, hb time.Duration) {
	defer st.wg.Done()
	if err := cs.Send(open); err != nil {
		st.fail(err)
		return
	}
	tick := time.NewTicker(hb)
	defer tick.Stop()
	heartbeat := &pb.DeliverFrame{Body: &pb.DeliverFrame_Heartbeat{Heartbeat: &pb.DeliverHeartbeat{}}}
	for {
		var err error
		select {
		case <-st.ctx.Done():
			return
		case <-st.closec:
			// Everything is acked: the receiver ends the stream once it
			// sees the half-close, and the reader sees that.
			if err := cs.CloseSend(); err != nil {
				st.fail(err)
			}
			return
		case f := <-st.frames:
			err = cs.Send(f)
		case <-tick.C:
			err = cs.Send(heartbeat)
		}
		if err != nil {
			st.fail(err)
			return
		}
	}
}

func (st *laneStream) read(cs pb.PeerService_DeliverClient) {
	defer st.wg.Done()
	for {
		a, err := cs.Recv()
		if err != nil {
			st.fail(err)
			return
		}
		st.last.Store(time.Now().UnixNano())
		if h := a.GetHandled(); h != nil {
			select {
			case st.acks <- h:
			case <-st.ctx.Done():
				return
			}
		}
	}
}

// dropStream ends the lane's stream at once and waits for its goroutines.
// Acks that arrived before the end are applied; the items still unacked
// stay in l.unacked.
func (l *lane) dropStream() {
	st := l.st
	st.fail(errStreamDropped)
	st.wg.Wait()
	st.tick.Stop()
	l.r.m.streamsOpen.WithLabelValues(kindDeliver).Dec()
	l.st = st
	l.drainAcks()
	l.st = nil
}

// closeStream closes the lane's stream cleanly (nothing is unacked): it
// half-closes, waits a little for the receiver to end the stream, then
// ends it anyway.
func (l *lane) closeStream() {
	st := l.st
	close(st.closec)
	t := time.NewTimer(silentIntervals * l.r.cfg.Heartbeat)
	select {
	case <-st.done:
	case <-t.C:
	case <-l.r.ctx.Done():
	}
	t.Stop()
	l.dropStream()
}
