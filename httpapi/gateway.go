package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/switchyard/switchyard/apierr"
	"github.com/switchyard/switchyard/grpcapi"
	pb "github.com/switchyard/switchyard/proto/switchyard/v1"
)

// The unary routes (a job's document and its cancel, the cluster and queue
// views) are the JobService's and ClusterService's rpcs, served as REST by
// grpc-gateway from their google.api.http options: the proto is their one
// definition. The gateway calls the services in process
// (Register…HandlerServer): no loopback connection, no second hop, and no
// dependency on the gRPC listener. That registration cannot serve streaming
// rpcs, and needs not: the streams (submit with SSE, /events) are chi
// handlers written for SSE.
//
// Each route is still a chi route whose handler hands the request to the
// gateway (see routes), so chi answers unknown routes and methods, and a
// walk of the router lists every route the document must describe.

// newGateway returns the gateway serving jobs and cluster. Its services are
// instances of their own whose errors are reported as the HTTP
// transport's: they log and count each refusal with its cause, and
// gatewayError only writes the problem.
func (s *Server) newGateway(jobs pb.JobServiceServer, cluster pb.ClusterServiceServer) (http.Handler, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &gatewayJSON{}),
		runtime.WithErrorHandler(s.gatewayError),
		// The services send no header metadata an HTTP client should see;
		// without this the gateway would forward gRPC's own as
		// Grpc-Metadata-* headers.
		runtime.WithOutgoingHeaderMatcher(func(string) (string, bool) { return "", false }),
		runtime.WithForwardResponseOption(func(_ context.Context, w http.ResponseWriter, _ proto.Message) error {
			w.Header().Set("Cache-Control", "no-store")
			return nil
		}),
	)
	ctx := context.Background()
	if err := pb.RegisterJobServiceHandlerServer(ctx, mux, jobs); err != nil {
		return nil, err
	}
	if err := pb.RegisterClusterServiceHandlerServer(ctx, mux, cluster); err != nil {
		return nil, err
	}
	return mux, nil
}

// JobConfig is the job service's configuration on this node, the one both
// transports apply: the HTTP API's stream policy, keyring and token TTL
// (a resume token from either transport resumes on the other), its
// metrics, cluster view and relay TLS. The node's gRPC job service and the
// gateway's both start from it.
func (s *Server) JobConfig() grpcapi.JobConfig {
	return grpcapi.JobConfig{
		Stream: s.cfg.Stream, Keyring: s.cfg.Keyring, TokenTTL: s.cfg.TokenTTL, StreamMetrics: s.cfg.StreamMetrics,
		Errors: s.cfg.Errors, Cluster: s.cfg.Cluster, RelayTLS: s.cfg.RelayTLS, Logger: s.log,
	}
}

// gatewayServices are the in-process services behind the gateway.
func (s *Server) gatewayServices() (pb.JobServiceServer, pb.ClusterServiceServer, error) {
	jcfg := s.JobConfig()
	jcfg.Transport = "http"
	jobs, err := grpcapi.NewJobServer(s.e, jcfg, nil)
	if err != nil {
		return nil, nil, err
	}
	cluster := grpcapi.NewClusterServer(s.e, grpcapi.ClusterConfig{View: s.cfg.Cluster, Errors: s.cfg.Errors, Transport: "http", Logger: s.log})
	return jobs, cluster, nil
}

// gatewayError answers a gateway call that failed with the problem
// document a chi handler writes for the same error: the status carries the
// core error (apierr.Status) and apierr.FromStatus gets it back. A status
// the services made was reported by them; one the gateway made itself (a
// request it could not map to a call) is reported here.
func (s *Server) gatewayError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	st := status.Convert(err)
	ce := apierr.FromStatus(st)
	if !madeByStatus(st) {
		s.errs.Report(ce, "path", r.URL.Path)
	}
	apierr.WriteProblem(w, r, ce)
}

// madeByStatus reports whether st carries the ErrorInfo apierr.Status puts
// in every status it makes.
func madeByStatus(st *status.Status) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == apierr.Domain {
			return true
		}
	}
	return false
}

// gatewayJSON is the gateway's JSON: protojson with the proto field names,
// zero values written and unset optional fields left out, as every other
// document of the HTTP API — except that 64-bit integers are
// numbers, as they are everywhere else in the API, not the strings protojson
// makes of them. Our 64-bit fields (sequence numbers, byte counts,
// milliseconds) stay far below 2^53, where every JSON reader is exact.
type gatewayJSON struct{ runtime.JSONPb }

var gatewayProtoJSON = protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}

// ContentType implements runtime.Marshaler.
func (gatewayJSON) ContentType(any) string { return "application/json" }

// Marshal implements runtime.Marshaler.
func (m gatewayJSON) Marshal(v any) ([]byte, error) {
	msg, ok := v.(proto.Message)
	if !ok {
		return json.Marshal(v)
	}
	b, err := gatewayProtoJSON.Marshal(msg)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tree, err := decodeOrdered(dec)
	if err != nil {
		return nil, err
	}
	int64sAsNumbers(msg.ProtoReflect().Descriptor(), tree)
	var out bytes.Buffer
	if err := encodeOrdered(&out, tree); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// object is a JSON object that keeps its members in order: protojson
// writes fields in field-number order, which is the documents' order
// (docs/api.md shows it).
type object []member

type member struct {
	key string
	val any
}

// decodeOrdered reads one JSON value: an object, a []any, or a scalar
// (json.Number, string, bool, nil).
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		obj := object{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			obj = append(obj, member{k.(string), v})
		}
		_, err := dec.Token()
		return obj, err
	case json.Delim('['):
		list := []any{}
		for dec.More() {
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		_, err := dec.Token()
		return list, err
	}
	return tok, nil
}

func encodeOrdered(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case object:
		buf.WriteByte('{')
		for i, m := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, _ := json.Marshal(m.key)
			buf.Write(k)
			buf.WriteByte(':')
			if err := encodeOrdered(buf, m.val); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := encodeOrdered(buf, x); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		buf.Write(b)
	}
	return nil
}

// int64sAsNumbers turns the strings protojson wrote for the 64-bit integer
// fields of md, in the decoded JSON object v, into numbers, recursing into
// messages and lists. Our messages have no maps.
func int64sAsNumbers(md protoreflect.MessageDescriptor, v any) {
	obj, ok := v.(object)
	if !ok {
		return
	}
	for i, m := range obj {
		fd := md.Fields().ByName(protoreflect.Name(m.key))
		if fd == nil {
			continue
		}
		if list, ok := m.val.([]any); ok && fd.IsList() {
			for j, x := range list {
				list[j] = fieldValue(fd, x)
			}
			continue
		}
		obj[i].val = fieldValue(fd, m.val)
	}
}

// fieldValue is one value of field fd with its 64-bit integers as numbers.
func fieldValue(fd protoreflect.FieldDescriptor, x any) any {
	switch {
	case fd.Message() != nil:
		int64sAsNumbers(fd.Message(), x)
	case is64(fd.Kind()):
		if s, ok := x.(string); ok {
			return json.Number(s)
		}
	}
	return x
}

func is64(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.Int64Kind, protoreflect.Uint64Kind, protoreflect.Sint64Kind,
		protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		return true
	}
	return false
}
