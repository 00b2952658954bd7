package core_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// The domain stays free of transport types (issue 2: "core ... imports no
// gRPC, HTTP or etcd types"): no package under core depends, even through
// another module, on gRPC, etcd, chi or this module's transports, and none
// imports net/http itself. net/http does sit deep in the dependencies,
// through the Prometheus client, which is allowed: what counts is that no
// HTTP type can reach a core signature.
func TestCoreImportsNoTransport(t *testing.T) {
	const module = "github.com/switchyard/switchyard/"
	banned := []string{
		"google.golang.org/grpc",
		"go.etcd.io/",
		"github.com/go-chi/",
		module + "httpapi",
		module + "peer",
		module + "proto",
		module + "cmd",
	}
	for _, dep := range goList(t, "-deps", "./...") {
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, strings.TrimSuffix(b, "/")+"/") {
				t.Errorf("core depends on %s (%s is the transports' to import)", dep, b)
			}
		}
	}
	for _, line := range goList(t, "-f", "{{.ImportPath}}:{{range .Imports}} {{.}}{{end}}", "./...") {
		pkg, imports, _ := strings.Cut(line, ":")
		for imp := range strings.FieldsSeq(imports) {
			if imp == "net/http" || strings.HasPrefix(imp, "net/http/") {
				t.Errorf("%s imports %s", pkg, imp)
			}
		}
	}
}

// goList runs `go list args...` in this directory (./... is core and the
// packages under it) and returns its output lines.
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
