package grpctest

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A served server answers at the address; once its test ends it is
// stopped and its goroutines are gone.
func TestServe(t *testing.T) {
	defer goleak.VerifyNone(t)
	t.Run("served", func(t *testing.T) {
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health.NewServer())
		addr := Serve(t, srv)
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		res, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check = %v, %v; want SERVING", res, err)
		}
	})
}
