package grpcapi

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/core"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// methodRoles is the role each rpc of the public gRPC port needs (any one
// of them). An rpc missing here is refused to everyone (permission_denied):
// a new rpc is closed until it is given a rule, and a test fails first.
// What only the service can check it checks itself: the queue of a
// Submit or of a worker's Register, and who owns the job of Resume, Get
// and Cancel (another subject's job is job_not_found).
var methodRoles = map[string]auth.Role{
	pb.WorkerService_Connect_FullMethodName:     auth.Work,
	pb.JobService_Submit_FullMethodName:         auth.Submit,
	pb.JobService_Resume_FullMethodName:         auth.Submit | auth.Admin,
	pb.JobService_SubmitBatched_FullMethodName:  auth.Submit,
	pb.JobService_ResumeBatched_FullMethodName:  auth.Submit | auth.Admin,
	pb.JobService_Get_FullMethodName:            auth.Submit | auth.Admin,
	pb.JobService_Cancel_FullMethodName:         auth.Submit | auth.Admin,
	pb.ClusterService_ListNodes_FullMethodName:  auth.Admin,
	pb.ClusterService_ListQueues_FullMethodName: auth.Admin,
	pb.ClusterService_GetQueue_FullMethodName:   auth.Admin,
}

// guard authenticates every call of the public gRPC server from its
// "authorization" metadata ("Bearer <key>") and checks the rpc's role; the
// identity goes into the call's context for the services. Refusals are
// Unauthenticated and PermissionDenied statuses carrying the codes of
// docs/errors.md, logged and counted as every refusal is.
type guard struct {
	keys *auth.Store
	errs *apierr.Reporter
	// extractTrace: no stats handler traces the calls, so the guard reads
	// the caller's trace context into a JobService call's context itself
	// (trace.go).
	extractTrace bool
}

func (g guard) check(ctx context.Context, method string) (context.Context, error) {
	var credential string
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		credential = v[0]
	}
	id, err := g.keys.Authenticate(credential)
	if err == nil {
		if roles, ok := methodRoles[method]; ok {
			err = id.AllowAny(roles)
		} else {
			err = &core.Error{Code: core.CodePermissionDenied, Detail: "this rpc is open to no key"}
		}
	}
	if err != nil {
		g.errs.Report(err, "method", method)
		return ctx, apierr.Status(err)
	}
	if g.extractTrace && jobCall(method) {
		ctx = callerTrace(ctx)
	}
	return auth.NewContext(ctx, id), nil
}

func (g guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := g.check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (g guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := g.check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return h(srv, &identityStream{ServerStream: ss, ctx: ctx})
}

// identityStream is a server stream whose context carries the caller's
// identity.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// visible returns the job id names when the caller may see it, and the
// answer for a job that does not exist when it may not.
func visible(ctx context.Context, e *core.Engine, id string) (*core.Job, error) {
	j, err := e.Job(id)
	if err != nil {
		return nil, err
	}
	if !auth.FromContext(ctx).SeesJob(j.ID, j.Owner) {
		return nil, core.JobNotFound()
	}
	return j, nil
}
