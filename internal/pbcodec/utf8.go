package pbcodec

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// CheckUTF8 fails when a string in m is not valid UTF-8, which proto3
// requires of every string field (map keys and values, list elements and
// nested messages included): proto refuses to marshal or unmarshal such a
// message. It walks m by reflection, so a field added later is checked
// too; that costs about 2 µs for a small message, so the hot messages are
// better checked field by field, with a test that walks their
// descriptors (internal/pbtest.StringPaths).
func CheckUTF8(m protoreflect.Message) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = checkValue(fd, v)
		return err == nil
	})
	return err
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch {
	case fd.IsMap():
		var err error
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if err = checkScalar(fd.MapKey(), k.Value()); err == nil {
				err = checkScalar(fd.MapValue(), mv)
			}
			return err == nil
		})
		return err
	case fd.IsList():
		l := v.List()
		for i := range l.Len() {
			if err := checkScalar(fd, l.Get(i)); err != nil {
				return err
			}
		}
		return nil
	}
	return checkScalar(fd, v)
}

func checkScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !utf8.ValidString(v.String()) {
			return fmt.Errorf("field %s is not valid UTF-8", fd.Name())
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return CheckUTF8(v.Message())
	}
	return nil
}

// ErrInvalidUTF8 is the codec's error for a worker session's message
// holding a string that is not valid UTF-8 (it wraps CheckUTF8's, which
// names the field, where the check took that walk).
var ErrInvalidUTF8 = errors.New("string field is not valid UTF-8")

// sessionUTF8 fails with ErrInvalidUTF8, as proto would, when v is a
// worker session's message (NodeMessage, WorkerMessage) holding a string
// that is not UTF-8. The kinds a session carries for every job are
// checked field by field: CheckUTF8's walk by reflection costs more than
// the decoding it stands beside. The rare kinds take that walk.
// TestSessionUTF8Covers tries every place a string can sit in
// either type (found by walking the descriptors, so a field added later
// is tried too).
func sessionUTF8(v any) error {
	var valid, known bool
	switch m := v.(type) {
	case *pb.NodeMessage:
		valid, known = nodeMessageUTF8(m)
	case *pb.WorkerMessage:
		valid, known = workerMessageUTF8(m)
	default:
		return nil
	}
	switch {
	case !known:
		return reflected(v.(protoreflect.ProtoMessage))
	case !valid:
		return ErrInvalidUTF8
	}
	return nil
}

// nodeMessageUTF8 reports whether m's strings are valid UTF-8 (valid),
// when m is of a kind checked field by field (known).
func nodeMessageUTF8(m *pb.NodeMessage) (valid, known bool) {
	switch x := m.GetMsg().(type) {
	case nil, *pb.NodeMessage_Heartbeat:
		return true, true
	case *pb.NodeMessage_Job:
		j := x.Job
		valid = utf8.ValidString(j.GetJobId()) && utf8.ValidString(j.GetQueue()) &&
			utf8.ValidString(j.GetTraceparent()) && utf8.ValidString(j.GetTracestate()) &&
			utf8.ValidString(j.GetAffinityKey()) && utf8.ValidString(j.GetOutputCredit().GetJobId())
		for _, c := range j.GetCapabilities() {
			valid = valid && utf8.ValidString(c)
		}
		return valid, true
	case *pb.NodeMessage_OutputCredit:
		return utf8.ValidString(x.OutputCredit.GetJobId()), true
	case *pb.NodeMessage_Cancel:
		return utf8.ValidString(x.Cancel.GetJobId()) && utf8.ValidString(x.Cancel.GetReason()), true
	}
	return false, false
}

// workerMessageUTF8 is nodeMessageUTF8 for a WorkerMessage.
func workerMessageUTF8(m *pb.WorkerMessage) (valid, known bool) {
	switch x := m.GetMsg().(type) {
	case nil, *pb.WorkerMessage_Heartbeat:
		return true, true
	case *pb.WorkerMessage_Output:
		return utf8.ValidString(x.Output.GetJobId()), true
	case *pb.WorkerMessage_Accept:
		return utf8.ValidString(x.Accept.GetJobId()), true
	case *pb.WorkerMessage_Complete:
		return utf8.ValidString(x.Complete.GetJobId()), true
	case *pb.WorkerMessage_Reject:
		return utf8.ValidString(x.Reject.GetJobId()) && utf8.ValidString(x.Reject.GetReason()), true
	case *pb.WorkerMessage_Fail:
		return utf8.ValidString(x.Fail.GetJobId()) && utf8.ValidString(x.Fail.GetCode()) &&
			utf8.ValidString(x.Fail.GetMessage()), true
	}
	return false, false
}

func reflected(m interface {
	ProtoReflect() protoreflect.Message
}) error {
	if err := CheckUTF8(m.ProtoReflect()); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidUTF8, err)
	}
	return nil
}
