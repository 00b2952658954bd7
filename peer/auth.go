package peer

import (
	"context"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// MinSecretBytes is the shortest cluster secret a node accepts.
const MinSecretBytes = 16

type callerKey struct{}

// Caller returns the authenticated node id of the peer behind a server-side
// context: the node its connection's handshake proved (handshake.go).
func Caller(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(callerKey{}).(string)
	return id, ok
}

// authenticator holds what the interceptors need: every call's caller is
// the node its connection's handshake authenticated, and must speak a
// protocol version this node serves.
type authenticator struct {
	metrics  *Metrics
	versions *versionGate
}

var errUnauthenticated = status.Error(codes.Unauthenticated, "peer call on a connection without the cluster handshake")

func (a *authenticator) check(ctx context.Context) (context.Context, error) {
	p, ok := grpcpeer.FromContext(ctx)
	var info AuthInfo
	if ok {
		info, ok = p.AuthInfo.(AuthInfo)
	}
	if !ok || info.Node == "" {
		// Not reachable through the server's credentials, which run the
		// handshake on every connection; kept as the last word.
		a.metrics.authFailures.Inc()
		return ctx, errUnauthenticated
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if err := a.versions.check(info.Node, md); err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, callerKey{}, info.Node), nil
}

func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := a.check(ctx)
	if err != nil {
		return nil, err
	}
	// Pings and Figures calls are counted where they are answered; routing
	// messages where they are sent (by the router, once handed over), by
	// the kinds they carry.
	if isTraffic(info.FullMethod) {
		a.metrics.activity.Mark(callerOf(ctx))
	}
	switch info.FullMethod {
	case pb.PeerService_Ping_FullMethodName:
		a.metrics.messages.WithLabelValues(kindPing).Inc()
	case pb.PeerService_Figures_FullMethodName:
		a.metrics.messages.WithLabelValues(kindFigures).Inc()
	}
	return h(ctx, req)
}

func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := a.check(ss.Context())
	if err != nil {
		return err
	}
	caller := callerOf(ctx)
	a.metrics.activity.Mark(caller)
	return h(srv, &authedStream{ServerStream: ss, ctx: ctx, activity: a.metrics.activity, caller: caller})
}

func callerOf(ctx context.Context) string {
	id, _ := Caller(ctx)
	return id
}

// authedStream carries the caller and marks its traffic (Activity) on
// every message either way.
type authedStream struct {
	grpc.ServerStream
	ctx      context.Context
	activity *Activity
	caller   string
}

func (s *authedStream) Context() context.Context { return s.ctx }

func (s *authedStream) SendMsg(m any) error {
	return s.activity.sendMarked(s.caller, s.ServerStream.SendMsg, m)
}

func (s *authedStream) RecvMsg(m any) error {
	return s.activity.recvMarked(s.caller, s.ServerStream.RecvMsg, m)
}

// versionCreds adds the protocol version a client speaks to every call
// (version.go): per call, so that a server can serve several versions
// during a rolling upgrade.
type versionCreds struct{ md map[string]string }

func newVersionCreds() versionCreds {
	return versionCreds{md: map[string]string{MetadataVersion: strconv.Itoa(Version)}}
}

func (c versionCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return c.md, nil
}

// RequireTransportSecurity is false: the version is no secret; who calls
// is the connection's handshake's to prove.
func (versionCreds) RequireTransportSecurity() bool { return false }
