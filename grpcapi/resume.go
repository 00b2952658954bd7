package grpcapi

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core/stream"
)

// The token, fingerprint and envelope rules live in core/stream, shared
// with httpapi, so tokens are interchangeable between the two transports.

// resumes are this node's resume tokens as the gRPC door counts them.
func (s *JobServer) resumes() stream.Resumes {
	return stream.Resumes{Keyring: s.cfg.Keyring, TTL: s.cfg.TokenTTL, Snapshot: s.e.Epoch, Metrics: s.m, Log: s.log}
}

// callerFingerprint is who resume tokens are bound to: the identity the
// guard found; without one (a service used alone), the "authorization"
// metadata's anonymous caller (auth.CallerOf).
func callerFingerprint(ctx context.Context) [16]byte {
	var credential string
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		credential = v[0]
	}
	return auth.CallerOf(ctx, credential)
}
