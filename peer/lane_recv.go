package peer

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The request leg, receiving side: what a server remembers of each
// sender's lane, which the Deliver stream (deliver_recv.go) and the unary
// calls that carry a lane's items (Forward, and Post naming a lane) share,
// so each item is handled once and in order whichever call carried it.

// What a receiver remembers of each lane.
const (
	// verdictMemory is how many forward verdicts a lane remembers, so a
	// forward resent on the unary path after its stream ack was lost is
	// answered as it was the first time.
	verdictMemory = 64
	// laneForget: lane state unused this long is dropped (swept at most
	// every laneSweep). Nothing is in flight on a lane by then: its sender
	// closes an idle stream after tens of seconds and gives up on a Post
	// long before.
	laneForget = 10 * time.Minute
	laneSweep  = time.Minute
)

// laneKey names a lane: the messages of one queue between two nodes (on
// the sending side node is the receiver, on the receiving side the
// sender).
type laneKey struct{ node, queue string }

// laneInbox is what a server knows of one sender's lane: the next sequence
// number it expects and the verdicts of its recent forwards. Its mutex
// serialises everything that handles the lane's items (Deliver streams, an
// old one still draining beside a new one, and Post and Forward resends),
// so the lane's items are handled one at a time in sequence order and each
// at most once, whichever call carried it.
type laneInbox struct {
	mu       sync.Mutex
	session  string
	next     uint64
	verdicts [verdictMemory]verdict
	nv       int // verdicts written so far; the ring's next slot is nv % verdictMemory

	// Under server.mu.
	users int       // calls holding it; never forgotten while > 0
	used  time.Time // last acquired
}

type verdict struct {
	seq uint64
	res *pb.ForwardResponse
}

// syncLocked starts afresh when session is a new sender process (or the
// first call on the lane): the last one's numbers say nothing about it.
func (l *laneInbox) syncLocked(session string) {
	if session != l.session {
		l.session, l.next, l.nv = session, 0, 0
		clear(l.verdicts[:])
	}
}

// seenLocked reports whether item seq was handled already (or skipped
// past: a sender never sends a lower number after a higher one).
func (l *laneInbox) seenLocked(seq uint64) bool { return seq < l.next }

// doneLocked records that every item up to seq was handled.
func (l *laneInbox) doneLocked(seq uint64) { l.next = max(l.next, seq+1) }

func (l *laneInbox) rememberLocked(seq uint64, res *pb.ForwardResponse) {
	l.verdicts[l.nv%verdictMemory] = verdict{seq: seq, res: res}
	l.nv++
}

func (l *laneInbox) verdictLocked(seq uint64) (*pb.ForwardResponse, bool) {
	for i := range min(l.nv, verdictMemory) {
		if v := l.verdicts[i]; v.seq == seq && v.res != nil {
			return v.res, true
		}
	}
	return nil, false
}

// acquireLane returns the sender from's lane for queue, held until
// releaseLane.
func (s *server) acquireLane(from, queue string) *laneInbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Sub(s.swept) >= laneSweep {
		s.swept = now
		for k, l := range s.lanes {
			if l.users == 0 && now.Sub(l.used) >= laneForget {
				delete(s.lanes, k)
			}
		}
	}
	k := laneKey{from, queue}
	l := s.lanes[k]
	if l == nil {
		l = &laneInbox{}
		s.lanes[k] = l
	}
	l.users++
	l.used = now
	return l
}

func (s *server) releaseLane(l *laneInbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.users--
	l.used = time.Now()
}

// forwardLocked is a forward item of lane l numbered seq: the verdict it
// got the first time when it was handled already, else the receiver's. A
// forward seen before whose verdict is no longer remembered (or that got
// none: the dispatcher could not decide) is handed to the receiver again,
// which the core.Receiver contract makes safe: a dispatcher takes a (job,
// generation) once. The error is the gRPC status Forward answers with when
// there is no verdict.
func (s *server) forwardLocked(from string, rcv core.Receiver, l *laneInbox, seq uint64, p *pb.PeerDelivery) (*pb.ForwardResponse, error) {
	if l.seenLocked(seq) {
		if res, ok := l.verdictLocked(seq); ok {
			return res, nil
		}
	}
	defer l.doneLocked(seq)
	d, err := DeliveryFromPB(p)
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	err = rcv.HandleForward(from, d)
	res, ok := ForwardResponse(err)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "dispatcher could not take job %s: %v", d.JobID, err)
	}
	l.rememberLocked(seq, res)
	return res, nil
}

// messageLocked handles a message item of lane l numbered seq, unless it
// was handled already.
func (s *server) messageLocked(from string, rcv core.Receiver, l *laneInbox, seq uint64, p *pb.PeerMessage) {
	if l.seenLocked(seq) {
		return
	}
	l.doneLocked(seq)
	m, err := MessageFromPB(p)
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		s.cfg.Logger.Warn("skipped an invalid peer message", "from", from, "err", err)
		return
	}
	s.handleMessage(rcv, from, m)
}

// Forward hands one job to the receiver and answers with its verdict. A
// refusal is an answer; an error the receiver could not classify is
// Unavailable, which the caller retries.
func (s *server) Forward(ctx context.Context, req *pb.ForwardRequest) (*pb.ForwardResponse, error) {
	from, ok := Caller(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	d, err := DeliveryFromPB(req.GetDelivery())
	if err != nil {
		s.cfg.Metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	rcv, err := s.receiver()
	if err != nil {
		return nil, err
	}
	if req.GetLane() != nil && req.GetSession() != "" {
		// A lane's item: checked against the lane's numbers, in its order.
		l := s.acquireLane(from, req.GetLane().GetQueue())
		defer s.releaseLane(l)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.syncLocked(req.GetSession())
		return s.forwardLocked(from, rcv, l, req.GetSeq(), req.GetDelivery())
	}
	err = rcv.HandleForward(from, d)
	res, ok := ForwardResponse(err)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "dispatcher could not take job %s: %v", d.JobID, err)
	}
	return res, nil
}

// postLane is Post for a lane's unary path: each message is checked
// against the lane's numbers, shared with its Deliver streams and Forwards.
func (s *server) postLane(from string, rcv core.Receiver, req *pb.PostRequest) (*pb.PostResponse, error) {
	msgs, seqs, session := req.GetMessages(), req.GetSeqs(), req.GetSession()
	if len(seqs) != len(msgs) {
		return nil, status.Errorf(codes.InvalidArgument, "a lane's Post numbers each message: %d numbers for %d messages", len(seqs), len(msgs))
	}
	l := s.acquireLane(from, req.GetLane().GetQueue())
	defer s.releaseLane(l)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.syncLocked(session)
	for i, p := range msgs {
		if session == "" {
			// No numbers to check against: handled as it comes.
			if m, err := MessageFromPB(p); err == nil {
				s.handleMessage(rcv, from, m)
			} else {
				s.cfg.Metrics.invalid.Inc()
			}
			continue
		}
		s.messageLocked(from, rcv, l, seqs[i], p)
	}
	return &pb.PostResponse{}, nil
}
