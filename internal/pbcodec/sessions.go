package pbcodec

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// ErrInvalidUTF8 is what the session checks below wrap when a string is
// not valid UTF-8.
var ErrInvalidUTF8 = errors.New("string field is not valid UTF-8")

// A worker session's two message types are checked where they are
// encoded or decoded with vtproto: NodeMessage by the node before it
// sends one and by the Go worker SDK after it decodes one, WorkerMessage
// by the node after it decodes one. Proto refuses such a message both
// ways, so with these a session refuses what it did with proto's codec.
// The kinds a session carries for every job are checked field by field:
// CheckUTF8's walk by reflection costs more than the decoding it stands
// beside. The rare kinds take that walk. TestSessionChecksCover tries
// every place a string can sit in either type (found by walking the
// descriptors, so a field added later is tried too).

// NodeMessageUTF8 fails with ErrInvalidUTF8 when a string in m is not
// UTF-8.
func NodeMessageUTF8(m *pb.NodeMessage) error {
	ok := true
	switch x := m.GetMsg().(type) {
	case nil, *pb.NodeMessage_Heartbeat:
	case *pb.NodeMessage_Job:
		j := x.Job
		ok = utf8.ValidString(j.GetJobId()) && utf8.ValidString(j.GetQueue()) &&
			utf8.ValidString(j.GetTraceparent()) && utf8.ValidString(j.GetTracestate()) &&
			utf8.ValidString(j.GetAffinityKey()) && utf8.ValidString(j.GetOutputCredit().GetJobId())
		for _, c := range j.GetCapabilities() {
			ok = ok && utf8.ValidString(c)
		}
	case *pb.NodeMessage_OutputCredit:
		ok = utf8.ValidString(x.OutputCredit.GetJobId())
	case *pb.NodeMessage_Cancel:
		ok = utf8.ValidString(x.Cancel.GetJobId()) && utf8.ValidString(x.Cancel.GetReason())
	default:
		return reflected(m)
	}
	if !ok {
		return ErrInvalidUTF8
	}
	return nil
}

// WorkerMessageUTF8 fails with ErrInvalidUTF8 when a string in m is not
// UTF-8.
func WorkerMessageUTF8(m *pb.WorkerMessage) error {
	ok := true
	switch x := m.GetMsg().(type) {
	case nil, *pb.WorkerMessage_Heartbeat:
	case *pb.WorkerMessage_Output:
		ok = utf8.ValidString(x.Output.GetJobId())
	case *pb.WorkerMessage_Accept:
		ok = utf8.ValidString(x.Accept.GetJobId())
	case *pb.WorkerMessage_Complete:
		ok = utf8.ValidString(x.Complete.GetJobId())
	case *pb.WorkerMessage_Reject:
		ok = utf8.ValidString(x.Reject.GetJobId()) && utf8.ValidString(x.Reject.GetReason())
	case *pb.WorkerMessage_Fail:
		ok = utf8.ValidString(x.Fail.GetJobId()) && utf8.ValidString(x.Fail.GetCode()) &&
			utf8.ValidString(x.Fail.GetMessage())
	default:
		return reflected(m)
	}
	if !ok {
		return ErrInvalidUTF8
	}
	return nil
}

func reflected(m interface {
	ProtoReflect() protoreflect.Message
}) error {
	if err := CheckUTF8(m.ProtoReflect()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidUTF8, err)
	}
	return nil
}
