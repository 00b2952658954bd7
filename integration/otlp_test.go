package integration_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/switchyard/switchyard/internal/grpctest"
)

// otlpReceiver is an OTLP trace collector inside the test: the OTLP
// protobuf TraceService on a loopback gRPC server, keeping every span it
// is sent (or, with discard, only counting them).
type otlpReceiver struct {
	coltrace.UnimplementedTraceServiceServer
	addr    string
	discard bool

	mu    sync.Mutex
	spans []span
	// byNode counts the spans of each switchyard.node resource.
	byNode map[string]int
}

// span is one received span, flattened with the attributes of its
// resource that name where it was recorded.
type span struct {
	TraceID, SpanID, Parent string
	Name                    string
	Kind                    tracepb.Span_SpanKind
	Service, Node           string
	Start, End              time.Time
	Attrs                   map[string]string
	Events                  []string
	StatusError             bool
}

func (s span) Duration() time.Duration { return s.End.Sub(s.Start) }

// startOTLPReceiver serves a receiver on 127.0.0.1 until the test ends.
func startOTLPReceiver(tb testing.TB, discard bool) *otlpReceiver {
	tb.Helper()
	r := &otlpReceiver{discard: discard, byNode: map[string]int{}}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, r)
	r.addr = grpctest.Serve(tb, srv)
	return r
}

// endpoint is the receiver as an --otlp-endpoint (protocol grpc).
func (r *otlpReceiver) endpoint() string { return "http://" + r.addr }

// Export implements the OTLP TraceService.
func (r *otlpReceiver) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := attrMap(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			r.byNode[res["switchyard.node"]] += len(ss.GetSpans())
			if r.discard {
				continue
			}
			for _, s := range ss.GetSpans() {
				sp := span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					Parent: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
					Service: res["service.name"], Node: res["switchyard.node"],
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs:       attrMap(s.GetAttributes()),
					StatusError: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				}
				for _, ev := range s.GetEvents() {
					sp.Events = append(sp.Events, ev.GetName())
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// receivedFrom is how many spans the receiver was sent by node.
func (r *otlpReceiver) receivedFrom(node string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byNode[node]
}

// trace returns the spans of one trace, in the order they started.
func (r *otlpReceiver) trace(traceID string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, s := range r.spans {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b span) int { return a.Start.Compare(b.Start) })
	return out
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// traceTree draws spans as a tree by their parent links: name, where it
// was recorded and how long it took; a span whose parent is not among
// them is a root.
func traceTree(spans []span) string {
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	children := map[string][]span{}
	var roots []span
	for _, s := range spans {
		if ids[s.Parent] {
			children[s.Parent] = append(children[s.Parent], s)
		} else {
			roots = append(roots, s)
		}
	}
	var b strings.Builder
	var draw func(s span, depth int)
	draw = func(s span, depth int) {
		where := s.Node
		if where == "" {
			where = s.Service
		}
		extra := ""
		for _, k := range []string{"switchyard.result", "switchyard.outcome", "switchyard.error.code", "switchyard.outputs"} {
			if v, ok := s.Attrs[k]; ok {
				extra += " " + strings.TrimPrefix(k, "switchyard.") + "=" + v
			}
		}
		fmt.Fprintf(&b, "%s%-*s [%s] %9s%s\n", strings.Repeat("  ", depth), 44-2*depth, s.Name, where,
			s.Duration().Round(10*time.Microsecond), extra)
		for _, c := range children[s.SpanID] {
			draw(c, depth+1)
		}
	}
	for _, r := range roots {
		draw(r, 0)
	}
	return b.String()
}
