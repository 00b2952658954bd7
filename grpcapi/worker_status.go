package grpcapi

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// toStatus maps an engine error to a gRPC status: the one place this
// transport decides codes.
func workerStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	var ce *core.Error
	if !errors.As(err, &ce) {
		return status.Error(codes.Unavailable, err.Error())
	}
	c := codes.InvalidArgument
	switch ce.Code {
	case core.CodeDraining, core.CodeNoCapableWorker:
		c = codes.Unavailable
	case core.CodeQueueFull, core.CodeQueueBytesFull:
		c = codes.ResourceExhausted
	case core.CodeJobNotFound:
		c = codes.NotFound
	case core.CodeTTLOutOfRange, core.CodeLimitAboveCeiling, core.CodeInputTooLarge:
		c = codes.OutOfRange
	}
	return status.Errorf(c, "%s: %s", ce.Code, ce.Detail)
}

// codeUnavailable answers a capability update the node could not apply for
// a reason of its own (the catalog write failed, the session is ending):
// the same list may succeed later.
const codeUnavailable = "unavailable"

// capabilitiesAnswer is the CapabilitiesUpdated for an update of caps that
// ended with err: the set now in effect, or the refusal's code.
func capabilitiesAnswer(caps []string, err error) *pb.CapabilitiesUpdated {
	if err == nil {
		// UpdateCapabilities parsed the same list successfully.
		parsed, _ := core.ParseCapabilities(caps)
		return &pb.CapabilitiesUpdated{Capabilities: parsed.Strings()}
	}
	var ce *core.Error
	if errors.As(err, &ce) {
		return &pb.CapabilitiesUpdated{Code: string(ce.Code), Message: ce.Detail}
	}
	return &pb.CapabilitiesUpdated{Code: codeUnavailable, Message: err.Error()}
}
