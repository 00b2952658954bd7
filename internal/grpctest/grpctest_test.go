package grpctest

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A served server answers at the address, to a Dial connection; once its
// test ends both are closed and their goroutines are gone.
func TestServe(t *testing.T) {
	defer goleak.VerifyNone(t)
	t.Run("served", func(t *testing.T) {
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health.NewServer())
		addr := Serve(t, srv)
		res, err := healthpb.NewHealthClient(Dial(t, addr)).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check = %v, %v; want SERVING", res, err)
		}
	})
}
