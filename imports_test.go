package switchyard_test

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/switchyard/switchyard"

// importRule is what one package of this module may import, kept true by
// TestImportRules.
type importRule struct {
	// may lists the module's packages it may import, relative to the
	// module root ("." is the root package). any lifts the rule.
	may []string
	any bool
	// neverDeps lists import paths, or prefixes ending in "/", that the
	// package must not depend on at all, even through another module.
	neverDeps []string
	// neverImports lists import paths it must not import itself, though a
	// library it uses may.
	neverImports []string
}

// Outside libraries named in the rules. Prometheus is the one the engine
// takes; it pulls net/http in deep, which is allowed: what counts is that
// no HTTP type can reach a core signature, so core may not import net/http
// itself.
const (
	grpcLib = "google.golang.org/grpc"
	etcdLib = "go.etcd.io/"
	chiLib  = "github.com/go-chi/"
	sseLib  = "github.com/tmaxmax/go-sse"
	promLib = "github.com/prometheus/"
	// The OpenTelemetry SDK, its exporters and the contrib
	// instrumentations: a package that records or exports spans. The API
	// (go.opentelemetry.io/otel, /trace, /attribute, /codes,
	// /propagation) is a small module of interfaces with no transport in
	// it; the domain and the worker SDK may use it (docs/tracing.md).
	otelSDK       = "go.opentelemetry.io/otel/sdk"
	otelExporters = "go.opentelemetry.io/otel/exporters/"
	otelContrib   = "go.opentelemetry.io/contrib/"
)

var (
	// noTransport is what the domain must not depend on: the transports'
	// libraries and etcd.
	noTransport = []string{grpcLib, etcdLib, chiLib, sseLib, otelSDK, otelExporters, otelContrib}
)

// importRules has one rule per package of the module: a package without
// one fails the test, so a new package states its place on arrival.
// Internal imports are checked one level deep; since every package is held
// to its own rule, what it reaches through others follows the table too.
var importRules = map[string]importRule{
	// The domain: no transport types, no etcd. The engine and the token
	// rules stand alone; the stream writer shared by the doors builds on
	// both.
	"core":        {may: []string{"core/internal/metric", "tracing/w3c"}, neverDeps: noTransport, neverImports: []string{"net/http"}},
	"core/resume": {neverDeps: noTransport, neverImports: []string{"net/http"}},
	"core/stream": {may: []string{"core", "core/resume", "core/internal/metric"}, neverDeps: noTransport, neverImports: []string{"net/http"}},
	// The engine's and the stream's metric declarations: Prometheus only.
	"core/internal/metric": {neverDeps: noTransport, neverImports: []string{"net/http"}},
	// The etcd catalog serves the engine; it knows no transport.
	"catalog": {may: []string{"core", "internal/netaddr", "internal/chans"}, neverDeps: []string{chiLib, sseLib}},
	// Node-to-node transport: the engine and the wire format; no catalog
	// (the node hands it an address lookup), no public API, no etcd.
	"peer": {may: []string{"core", "proto/switchyard/v1", "internal/pbwire", "internal/pbcodec", "internal/chans", "internal/flowwin"}, neverDeps: []string{etcdLib, chiLib, sseLib, otelSDK, otelExporters}},
	// The public gRPC services.
	"grpcapi": {
		may:       []string{"core", "core/stream", "core/resume", "proto/switchyard/v1", "apierr", "auth", "internal/pbwire", "internal/pbcodec", "internal/chans", "internal/flowwin"},
		neverDeps: []string{etcdLib, chiLib, sseLib},
	},
	// The HTTP/SSE API. Its unary routes are the public gRPC services'
	// rpcs served by grpc-gateway in process, so it builds on grpcapi and
	// the wire format; it never reaches the peer transport or the catalog.
	"httpapi": {
		may:       []string{"core", "core/stream", "core/resume", "apierr", "auth", "grpcapi", "proto/switchyard/v1", "web", "openapi"},
		neverDeps: []string{etcdLib},
	},
	// The OpenAPI document (generated, embedded), its generator and the Go
	// client generated from it: a client knows only the document's shapes.
	"openapi":        {neverDeps: []string{grpcLib, etcdLib, chiLib, sseLib, promLib}},
	"openapi/gen":    {may: []string{"apierr"}},
	"openapi/client": {neverDeps: []string{grpcLib, etcdLib, chiLib, sseLib, promLib}},
	"openapi/ogen":   {neverDeps: []string{grpcLib, etcdLib, chiLib, sseLib, promLib}},
	// The web page: static files embedded in the binary, served by
	// httpapi; it knows nothing of the node.
	"web": {neverDeps: []string{grpcLib, etcdLib, chiLib, sseLib, promLib}},
	// Who may call and what they may do: keys, roles, queue patterns,
	// limits. No transport: httpapi and grpcapi check it.
	"auth": {may: []string{"core", "core/resume"}, neverDeps: []string{grpcLib, etcdLib, chiLib, sseLib}},
	// The one error map: core's codes to HTTP and gRPC statuses.
	"apierr": {may: []string{"core"}, neverDeps: []string{etcdLib, chiLib, sseLib}},
	// The Go worker SDK a user imports: the wire format only. Nothing of
	// the engine, not even its metrics library, comes with it.
	"worker": {may: []string{"proto/switchyard/v1", "tracing/w3c", "internal/pbwire", "internal/pbcodec", "internal/chans", "internal/flowwin"}, neverDeps: []string{etcdLib, chiLib, sseLib, promLib, otelSDK, otelExporters}},
	// The node's traces: the OpenTelemetry SDK and its OTLP exporters,
	// set up from the node's config and the standard OTEL_* variables,
	// and the log handler that puts a trace id on every log line. It knows
	// nothing of the node.
	"tracing": {neverDeps: []string{etcdLib, chiLib, sseLib, promLib}},
	// A W3C trace context read as a span context, on the OpenTelemetry
	// API alone: the engine and the worker SDK share it.
	"tracing/w3c": {neverDeps: []string{grpcLib, etcdLib, chiLib, sseLib, promLib, otelSDK, otelExporters, otelContrib}},
	// The proto3 field helpers of the hand-written encoders and decoders:
	// protowire only.
	"internal/pbwire": {neverDeps: []string{grpcLib, etcdLib, chiLib, sseLib, promLib, otelSDK}},
	// The gRPC codec that runs our messages through their generated
	// vtproto code (the peer connections, the worker sessions), and the
	// UTF-8 check proto's decoder would have made.
	"internal/pbcodec": {may: []string{"proto/switchyard/v1"}, neverDeps: []string{etcdLib, chiLib, sseLib, promLib, otelSDK}},
	// The static HTTP/2 flow-control windows of the gRPC connections
	// nodes and the worker SDK make and serve: gRPC only.
	"internal/flowwin": {neverDeps: []string{etcdLib, chiLib, sseLib, promLib, otelSDK}},
	// What the node, the catalog and the binary decide alike about a
	// host:port address (is it loopback): the standard library only.
	"internal/netaddr": {},
	// What several packages ask of a channel alike (is a done signal
	// closed, a wake-up sent without blocking): the standard library only.
	"internal/chans": {},
	// Test plumbing, imported by tests only: free loopback addresses, a
	// TCP relay that counts what it carries and fails on demand.
	"internal/tcptest": {},
	// Test plumbing, imported by tests only: a series of a Prometheus
	// registry read by its name and labels.
	"internal/promtest": {},
	// Test plumbing, imported by tests only: a buffer and a list that
	// goroutines write and the test reads at once (logs, a process's
	// output, what a fake heard).
	"internal/syncbuf": {},
	// Test plumbing, imported by tests only: a test's periodic work in a
	// goroutine the test owns, and a condition polled until it holds.
	"internal/ticktest": {},
	// Test plumbing, imported by tests only: a gRPC server on loopback
	// for the test's lifetime, and a client connection to one.
	"internal/grpctest": {},
	// Test plumbing, imported by tests only: every message type of ours,
	// one with every field filled, every place a string can sit in one,
	// fields encoded by hand.
	"internal/pbtest": {may: []string{"proto/switchyard/v1"}},
	// Test plumbing's own tests: a helper run against a testing.TB that
	// records what it reports.
	"internal/tbtest": {},
	// Test plumbing, imported by tests only: an in-memory core.Catalog,
	// events appended to a job's history, a configuration refusal checked,
	// a worker send queue filled to its bounds, a worker that never answers.
	"internal/coretest": {may: []string{"core"}},
	// Generated code only.
	"proto/switchyard/v1": {neverDeps: []string{etcdLib, chiLib, sseLib, promLib}},
	// The node: assembles every room.
	".": {may: []string{"core", "core/resume", "core/stream", "catalog", "peer", "grpcapi", "httpapi", "apierr", "auth", "tracing", "internal/netaddr", "internal/chans"}},
	// The binary: a node, the demo worker, and `switchyard bench` (whose
	// load generator is integration/benchkit's).
	"cmd/switchyard": {may: []string{".", "core/resume", "httpapi", "worker", "integration/benchkit", "tracing", "internal/netaddr"}},
	// Tests see everything.
	"integration": {any: true},
	// The benchmarks' load generator, which the binary ships (`switchyard
	// bench`): a client of the public wire format only.
	"integration/benchkit": {may: []string{"proto/switchyard/v1"}},
	// The workers' record of their runs and its at-most-once check.
	"integration/runs": {},
	// The fault suite's and the compose tests' stall measure: arithmetic
	// over what the tests saw, on the workers' record of runs.
	"integration/stall": {may: []string{"integration/runs"}},
	// The closed-loop load the fault suite, the rolling restart and the
	// compose tests share: HTTP and the clock, nothing of the node.
	"integration/loadgen": {},
	// The catalog trust tests' and the compose tests' anonymous tries at
	// a catalog's etcd ports: etcd's client and the catalog's port rules.
	"integration/catalogprobe": {may: []string{"catalog"}},
}

// TestImportRules holds every package of the module to its importRule,
// both ways: a package imports nothing its rule does not allow, and a rule
// allows nothing its package does not import (a rule says what is, not
// what might be). Only what a package ships counts (test files may import
// what they need).
func TestImportRules(t *testing.T) {
	seen := map[string]bool{}
	for _, line := range goList(t, "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}", "./...") {
		path, rest, _ := strings.Cut(line, "|")
		imports, deps, _ := strings.Cut(rest, "|")
		pkg := relative(path)
		seen[pkg] = true
		rule, ok := importRules[pkg]
		if !ok {
			t.Errorf("package %s has no import rule: add one to importRules", pkg)
			continue
		}
		for _, m := range rule.may {
			if !slices.Contains(strings.Fields(imports), absolute(m)) {
				t.Errorf("%s's rule allows %s, which it does not import: remove it from the rule", pkg, m)
			}
		}
		for imp := range strings.FieldsSeq(imports) {
			if inModule(imp) && !rule.any && !slices.Contains(rule.may, relative(imp)) {
				t.Errorf("%s imports %s, which its rule does not allow (may: %v)", pkg, relative(imp), rule.may)
			}
			for _, b := range rule.neverImports {
				if matches(imp, b) {
					t.Errorf("%s imports %s", pkg, imp)
				}
			}
		}
		for _, b := range rule.neverDeps {
			var hits []string
			for dep := range strings.FieldsSeq(deps) {
				if matches(dep, b) {
					hits = append(hits, dep)
				}
			}
			if len(hits) > 0 {
				t.Errorf("%s depends on %s, banned for it (%d packages: %s, ...)", pkg, b, len(hits), hits[0])
			}
		}
	}
	for pkg := range importRules {
		if !seen[pkg] {
			t.Errorf("importRules has a rule for %s, which is not a package of the module: remove it", pkg)
		}
	}
}

// absolute is the import path of a package relative to the module root.
func absolute(rel string) string {
	if rel == "." {
		return module
	}
	return module + "/" + rel
}

func inModule(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }

// relative names a package of the module by its path under the module root.
func relative(path string) string {
	if path == module {
		return "."
	}
	return strings.TrimPrefix(path, module+"/")
}

// matches reports whether path is b or lies under it (a trailing "/" on b
// changes nothing: "go.etcd.io/" bans every etcd module).
func matches(path, b string) bool {
	prefix := strings.TrimSuffix(b, "/")
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// goList runs `go list args...` at the module root (the directory of this
// test) and returns its output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}
