package peer

import (
	"context"
	"sync"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The per-node unicast queue, receiving side: the Post handler, which skips
// what a resent batch carries again. A Post naming a delivery stream is a
// delivery stream's unary path (unaryDelivery, delivery_recv.go).

// unicastInbox is what a server remembers of one sending node's Posts: it
// serialises them (a resend may arrive while the attempt it replaces is
// still being handled) and skips what it already handled. One per node id
// that ever posted; a node that restarts reuses its entry.
type unicastInbox struct {
	mu      sync.Mutex
	session string
	next    uint64
}

// Post hands each message of the batch to the receiver, in order, and
// answers once all are handled.
//
// A message no receiver could act on (unknown kind, no job id, a forward
// or deliver without its job) is skipped, logged and counted in
// switchyard_peer_messages_invalid_total; the rest of the batch is still
// handled. Refusing the whole batch instead would make the sender resend
// it forever and stall every message queued behind it for a fault that
// resending cannot cure.
func (s *server) Post(ctx context.Context, req *pb.PostRequest) (*pb.PostResponse, error) {
	from, ok := Caller(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	rcv, err := s.receiver()
	if err != nil {
		return nil, err
	}
	if req.GetLane() != nil {
		return s.unaryDelivery(from, rcv, req)
	}
	in := s.unicastInbox(from)
	in.mu.Lock()
	defer in.mu.Unlock()
	session, seq := req.GetSession(), req.GetFirstSeq()
	if session != in.session {
		// A new sender process (or the first Post from this node): what
		// the last one sent says nothing about this one's numbers.
		in.session, in.next = session, 0
	}
	for i, p := range req.GetMessages() {
		n := seq + uint64(i)
		if session != "" && n < in.next {
			continue // handled already: this is a resend whose answer was lost
		}
		s.takeMessage(from, rcv, p)
	}
	if session != "" {
		in.next = max(in.next, seq+uint64(len(req.GetMessages())))
	}
	return &pb.PostResponse{}, nil
}

func (s *server) unicastInbox(from string) *unicastInbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.senders[from]
	if in == nil {
		in = &unicastInbox{}
		s.senders[from] = in
	}
	return in
}
