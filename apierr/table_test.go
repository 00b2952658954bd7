package apierr

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/switchyard/switchyard/core"
)

// TestTable pins the wire form of every code: a change to the table must
// be a change to this list too, on purpose.
func TestTable(t *testing.T) {
	want := map[core.Code]struct {
		http int
		grpc codes.Code
	}{
		core.CodeMalformedJSON:         {400, codes.InvalidArgument},
		core.CodeInvalidField:          {400, codes.InvalidArgument},
		core.CodeUnsupportedVersion:    {400, codes.InvalidArgument},
		core.CodeMissingInput:          {400, codes.InvalidArgument},
		core.CodeInvalidQueueName:      {400, codes.InvalidArgument},
		core.CodeInvalidResumeToken:    {400, codes.InvalidArgument},
		core.CodeInvalidWorker:         {400, codes.InvalidArgument},
		core.CodeUnexpectedMessage:     {400, codes.InvalidArgument},
		core.CodeUnsupportedMediaType:  {415, codes.InvalidArgument},
		core.CodeNotFound:              {404, codes.NotFound},
		core.CodeMethodNotAllowed:      {405, codes.Unimplemented},
		core.CodeJobNotFound:           {404, codes.NotFound},
		core.CodeModelNotFound:         {404, codes.NotFound},
		core.CodeIdempotencyReuse:      {409, codes.AlreadyExists},
		core.CodeInvalidIdempotencyKey: {400, codes.InvalidArgument},
		core.CodeSessionNotFound:       {404, codes.NotFound},
		core.CodeJobNotHeld:            {409, codes.FailedPrecondition},
		core.CodeInvalidAffinityKey:    {400, codes.InvalidArgument},
		core.CodePriorityNotAllowed:    {403, codes.PermissionDenied},
		core.CodePriorityOutOfRange:    {422, codes.OutOfRange},
		core.CodeUnauthenticated:       {401, codes.Unauthenticated},
		core.CodePermissionDenied:      {403, codes.PermissionDenied},
		core.CodeRateLimited:           {429, codes.ResourceExhausted},
		core.CodeBodyTooLarge:          {413, codes.OutOfRange},
		core.CodeRequestTimeout:        {408, codes.DeadlineExceeded},
		core.CodeInputTooLarge:         {413, codes.OutOfRange},
		core.CodeTTLOutOfRange:         {422, codes.OutOfRange},
		core.CodeLimitAboveCeiling:     {422, codes.OutOfRange},
		core.CodeQueueFull:             {429, codes.ResourceExhausted},
		core.CodeQueueBytesFull:        {429, codes.ResourceExhausted},
		core.CodeTooManyUpdates:        {429, codes.ResourceExhausted},
		core.CodeReaderBehind:          {429, codes.ResourceExhausted},
		core.CodeNoCapableWorker:       {503, codes.Unavailable},
		core.CodeInvalidMember:         {400, codes.InvalidArgument},
		core.CodeMemberNotFound:        {404, codes.NotFound},
		core.CodeMemberExists:          {409, codes.AlreadyExists},
		core.CodeMemberRunning:         {409, codes.FailedPrecondition},
		core.CodeMemberAddressUnusable: {409, codes.FailedPrecondition},
		core.CodeQuorumAtRisk:          {409, codes.FailedPrecondition},
		core.CodeDraining:              {503, codes.Unavailable},
		core.CodeDispatcherUnavailable: {503, codes.Unavailable},
		core.CodeCatalogUnavailable:    {503, codes.Unavailable},
		core.CodeWriteFailed:           {503, codes.Unavailable},
		core.CodeSessionClosed:         {503, codes.Unavailable},
		core.CodeSetupTimeout:          {408, codes.DeadlineExceeded},
		core.CodeIdleTimeout:           {408, codes.Unavailable},
		core.CodeCancelled:             {409, codes.Canceled},
		core.CodeExpired:               {504, codes.DeadlineExceeded},
		core.CodeRejected:              {422, codes.FailedPrecondition},
		core.CodeWorkerLost:            {502, codes.Unavailable},
		core.CodeNodeShutdown:          {503, codes.Unavailable},
		core.CodeOutputTooLarge:        {502, codes.ResourceExhausted},
		core.CodeCreditExceeded:        {502, codes.ResourceExhausted},
		core.CodeTooLarge:              {413, codes.ResourceExhausted},
		core.CodeBadOutput:             {502, codes.Unknown},
		core.CodeWorkerError:           {502, codes.Unknown},
		core.CodeInternal:              {500, codes.Internal},
	}
	for code, w := range want {
		t.Run(string(code), func(t *testing.T) {
			if got := HTTPStatus(code); got != w.http {
				t.Errorf("HTTPStatus = %d, want %d", got, w.http)
			}
			if http.StatusText(w.http) == "" {
				t.Errorf("%d has no status text: the problem's title would be empty", w.http)
			}
			if got := GRPCCode(code); got != w.grpc {
				t.Errorf("GRPCCode = %s, want %s", got, w.grpc)
			}
		})
	}
	for code := range table {
		if _, ok := want[code]; !ok {
			t.Errorf("%s is in the table but not pinned here", code)
		}
	}
	if got, want := HTTPStatus("something_new"), 500; got != want {
		t.Errorf("HTTPStatus(unknown) = %d, want %d", got, want)
	}
	if got := GRPCCode("something_new"); got != codes.Internal {
		t.Errorf("GRPCCode(unknown) = %s, want Internal", got)
	}
}

// TestEveryCoreCodeIsMapped reads core's source, so that a code added there
// without a mapping here fails this test rather than falling through to
// 500 on the wire.
func TestEveryCoreCodeIsMapped(t *testing.T) {
	declared := coreCodes(t)
	if len(declared) < len(table) {
		t.Fatalf("found %d Code constants in core, fewer than the %d mapped: the parse is missing some", len(declared), len(table))
	}
	for name, code := range declared {
		if _, ok := table[code]; !ok {
			t.Errorf("core.%s (%q) has no HTTP status or gRPC code in apierr's table", name, code)
		}
	}
	for code := range table {
		if !slices.Contains(slices.Collect(maps.Values(declared)), code) {
			t.Errorf("the table maps %q, which core does not declare", code)
		}
	}
}

// coreCodes returns every constant of type core.Code declared in core's
// non-test files, by name.
func coreCodes(t *testing.T) map[string]core.Code {
	t.Helper()
	fset := token.NewFileSet()
	files, err := os.ReadDir("../core")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]core.Code{}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".go") || strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, "../core/"+f.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range af.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			// A spec without values repeats the previous spec's type and
			// expressions (iota): only a Code must have its own string.
			var prev *ast.ValueSpec
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if len(vs.Values) == 0 && vs.Type == nil && prev != nil {
					if _, typed := codeLiteral(prev.Type, prev.Values[0]); typed {
						t.Fatalf("%s: const %s has no value of its own: give every Code its string", fset.Position(vs.Pos()), vs.Names[0].Name)
					}
					continue
				}
				prev = vs
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						t.Fatalf("%s: const %s has no value of its own: give every Code its string", fset.Position(name.Pos()), name.Name)
					}
					lit, typed := codeLiteral(vs.Type, vs.Values[i])
					if !typed {
						continue
					}
					if lit == nil {
						t.Fatalf("%s: const %s is a Code that is not a string literal", fset.Position(name.Pos()), name.Name)
					}
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					out[name.Name] = core.Code(s)
				}
			}
		}
	}
	return out
}

// codeLiteral reports whether a constant is a Code (`X Code = "x"` or
// `X = Code("x")`) and returns its string literal.
func codeLiteral(typ, value ast.Expr) (*ast.BasicLit, bool) {
	if id, ok := typ.(*ast.Ident); ok && id.Name == "Code" {
		lit, _ := value.(*ast.BasicLit)
		return lit, true
	}
	if call, ok := value.(*ast.CallExpr); ok {
		if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "Code" && len(call.Args) == 1 {
			lit, _ := call.Args[0].(*ast.BasicLit)
			return lit, true
		}
	}
	return nil, false
}

// docRow is a row of the code table in docs/errors.md:
// | `code` | 400 | `InvalidArgument` | when |
var docRow = regexp.MustCompile("^\\| `([a-z_]+)` \\| ([0-9]{3}) \\| `([A-Za-z]+)` \\|")

// TestDocsListEveryCode keeps docs/errors.md's table the table: every code,
// once, with the same HTTP status and gRPC code.
func TestDocsListEveryCode(t *testing.T) {
	b, err := os.ReadFile("../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[core.Code]bool{}
	for line := range strings.Lines(string(b)) {
		m := docRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		code := core.Code(m[1])
		if documented[code] {
			t.Errorf("docs/errors.md lists %s twice", code)
		}
		documented[code] = true
		w, ok := table[code]
		if !ok {
			t.Errorf("docs/errors.md lists %s, which the table does not map", code)
			continue
		}
		if m[2] != strconv.Itoa(w.http) || m[3] != w.grpc.String() {
			t.Errorf("docs/errors.md: %s is %s %s, the table says %d %s", code, m[2], m[3], w.http, w.grpc)
		}
	}
	for code := range table {
		if !documented[code] {
			t.Errorf("docs/errors.md does not list %s", code)
		}
	}
}
