package grpctest

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/switchyard/switchyard/internal/tbtest"
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

// RecvEach passes every message in order and returns at io.EOF; another
// error fails the test after the messages before it.
func TestRecvEach(t *testing.T) {
	for _, tc := range []struct {
		name    string
		end     error
		wantErr string
	}{
		{"to EOF", io.EOF, ""},
		{"broken", errors.New("connection reset"), "recv: connection reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := []int{1, 2, 3}
			recv := func() (int, error) {
				if len(msgs) == 0 {
					return 0, tc.end
				}
				m := msgs[0]
				msgs = msgs[1:]
				return m, nil
			}
			var got []int
			failed := strings.Join(tbtest.Run(func(tb testing.TB) {
				RecvEach(tb, recv, func(m int) { got = append(got, m) })
			}), "; ")
			if !slices.Equal(got, []int{1, 2, 3}) || failed != tc.wantErr {
				t.Errorf("got %v, failure %q; want 1 2 3, failure %q", got, failed, tc.wantErr)
			}
		})
	}
}
