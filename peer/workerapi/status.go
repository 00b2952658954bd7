package workerapi

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/core"
)

// toStatus maps an engine error to a gRPC status: the one place this
// transport decides codes.
func toStatus(err error) error {
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
