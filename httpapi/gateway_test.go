package httpapi

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// refusingJobs is a JobService whose Get and Cancel fail with err, as the
// real service does: through apierr.Status.
type refusingJobs struct {
	pb.UnimplementedJobServiceServer
	err error
}

func (f refusingJobs) Get(context.Context, *pb.GetJobRequest) (*pb.JobStatus, error) {
	return nil, apierr.Status(f.err)
}

func (f refusingJobs) Cancel(context.Context, *pb.CancelJobRequest) (*pb.JobStatus, error) {
	return nil, apierr.Status(f.err)
}

// For every code of the table, a refusal through the gateway is the problem
// document a chi handler writes for the same error, byte for byte (status,
// body, Retry-After), and the service's status has the table's gRPC code.
func TestGatewayErrorsAreTheChiProblems(t *testing.T) {
	s := newTestServer(t)
	for _, code := range apierr.Codes() {
		t.Run(string(code), func(t *testing.T) {
			err := &core.Error{Code: code, Detail: "why: " + string(code), Field: "f"}
			if code == core.CodeQueueFull {
				err.RetryAfter = 1500 * time.Millisecond
			}
			if got := status.Code(refusingJobs{err: err}.errOf()); got != apierr.GRPCCode(code) {
				t.Errorf("gRPC code %s, want %s", got, apierr.GRPCCode(code))
			}
			gw, gerr := s.newGateway(refusingJobs{err: err}, nil)
			if gerr != nil {
				t.Fatal(gerr)
			}
			for _, method := range []string{"GET", "DELETE"} {
				viaGateway, viaChi := httptest.NewRecorder(), httptest.NewRecorder()
				gw.ServeHTTP(viaGateway, httptest.NewRequest(method, "/v1/jobs/j_1", nil))
				s.writeError(viaChi, httptest.NewRequest(method, "/v1/jobs/j_1", nil), err)
				if a, b := dump(viaGateway), dump(viaChi); a != b {
					t.Errorf("%s through the gateway:\n%s\nfrom chi:\n%s", method, a, b)
				}
			}
		})
	}
}

func (f refusingJobs) errOf() error {
	_, err := f.Get(context.Background(), nil)
	return err
}

func dump(rec *httptest.ResponseRecorder) string {
	h := rec.Header()
	return fmt.Sprintf("%d %s|%s|%s\n%s", rec.Code, h.Get("Content-Type"), h.Get("Retry-After"), h.Get("Cache-Control"), rec.Body)
}
