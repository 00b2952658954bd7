package worker

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// APIKey is the dial option that presents key on every call, as the
// "authorization" metadata a node checks ("Bearer <key>"). A node that
// checks keys needs it, with a key holding the work role on the worker's
// queue. Pass it in Config.DialOptions together with transport credentials:
// TLS (credentials.NewTLS) when the node serves it, else
// insecure.NewCredentials() (loopback, or a network you trust: the key
// then travels in clear).
func APIKey(key string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearerKey(key))
}

type bearerKey string

var _ credentials.PerRPCCredentials = bearerKey("")

func (k bearerKey) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(k)}, nil
}

// RequireTransportSecurity is false so that a worker on loopback can use a
// key without TLS; over a network, give the connection TLS.
func (bearerKey) RequireTransportSecurity() bool { return false }
