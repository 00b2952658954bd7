package peer

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// Metadata keys every peer call carries.
const (
	MetadataNode = "x-switchyard-node"
	MetadataAuth = "x-switchyard-auth"
)

// MinSecretBytes is the shortest cluster secret a node accepts.
const MinSecretBytes = 16

// Token is the credential node presents: hex(HMAC-SHA256(secret, node)).
func Token(secret []byte, node string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(node))
	return hex.EncodeToString(m.Sum(nil))
}

// verify reports the caller's node id when the metadata authenticates it.
func verify(secret []byte, md metadata.MD) (string, bool) {
	nodes, auths := md.Get(MetadataNode), md.Get(MetadataAuth)
	if len(nodes) != 1 || len(auths) != 1 || nodes[0] == "" {
		return "", false
	}
	got, err := hex.DecodeString(auths[0])
	if err != nil {
		return "", false
	}
	want, _ := hex.DecodeString(Token(secret, nodes[0]))
	if !hmac.Equal(got, want) {
		return "", false
	}
	return nodes[0], true
}

type callerKey struct{}

// Caller returns the authenticated node id of the peer behind a server-side
// context.
func Caller(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(callerKey{}).(string)
	return id, ok
}

// authenticator holds what the interceptors need: every call is checked
// for cluster credentials, then for a protocol version this node serves.
type authenticator struct {
	secret   []byte
	metrics  *Metrics
	versions *versionGate
}

var errUnauthenticated = status.Error(codes.Unauthenticated, "peer call without valid cluster credentials")

func (a *authenticator) check(ctx context.Context) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	id, ok := verify(a.secret, md)
	if !ok {
		a.metrics.authFailures.Inc()
		return ctx, errUnauthenticated
	}
	if err := a.versions.check(id, md); err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, callerKey{}, id), nil
}

func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := a.check(ctx)
	if err != nil {
		return nil, err
	}
	// Pings and Figures calls are counted where they are answered; routing
	// messages where they are sent (by the router, once handed over), by
	// the kinds they carry.
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
	return h(srv, &authedStream{ServerStream: ss, ctx: ctx})
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authedStream) Context() context.Context { return s.ctx }

// tokenCreds adds a node's credentials, and the protocol version it
// speaks, to every call of a client.
type tokenCreds struct{ md map[string]string }

func newTokenCreds(secret []byte, node string) credentials.PerRPCCredentials {
	return tokenCreds{md: map[string]string{MetadataNode: node, MetadataAuth: Token(secret, node), MetadataVersion: strconv.Itoa(Version)}}
}

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return c.md, nil
}

// RequireTransportSecurity is false: the token proves membership over a
// plaintext channel (see the package doc).
func (tokenCreds) RequireTransportSecurity() bool { return false }
