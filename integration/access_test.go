package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/internal/grpctest"
)

// The keys of the access tests. alice submits to demo, team-a.* and chat
// (the front door's queue) and has a second key that only works; bob
// submits to demo alone; root is an admin and nothing else. "forbidden"
// is a queue none of them may use.
const (
	keyAlice     = "alice-submit-key-00000001"
	keyAliceWork = "alice-work-key-000000002"
	keyBob       = "bob-submit-key-0000000003"
	keyRoot      = "root-admin-key-0000000004"
	keyUnknown   = "nobody-holds-this-key-005"
)

func accessKeys() string {
	return `keys:
  - subject: alice
    key: ` + keyAlice + `
    roles: [submit]
    queues: [demo, "team-a.*", chat]
  - subject: alice
    sha256: ` + auth.HashKey(keyAliceWork) + `
    roles: [work]
    queues: [demo, "team-a.*", chat]
  - subject: bob
    key: ` + keyBob + `
    roles: [submit]
    queues: [demo]
  - subject: root
    key: ` + keyRoot + `
    roles: [admin]
`
}

// writeKeys writes a key file for a node and returns its path.
func writeKeys(tb testing.TB, doc string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// MustStartSecuredNode starts a node that checks the access tests' keys.
func MustStartSecuredNode(tb testing.TB, mutate func(*switchyard.Config)) *switchyard.Node {
	tb.Helper()
	path := writeKeys(tb, accessKeys())
	return MustStartNode(tb, func(c *switchyard.Config) {
		c.Auth.File = path
		if mutate != nil {
			mutate(c)
		}
	})
}

// bearer is an Authorization value ("" for none).
func bearer(key string) string {
	if key == "" {
		return ""
	}
	return "Bearer " + key
}

// keyed sends an HTTP request with key as its bearer ("" for none).
func keyed(tb testing.TB, ctx context.Context, method, url, key, ctype, body string, header ...string) *http.Response {
	tb.Helper()
	if key != "" {
		header = append([]string{"Authorization", bearer(key)}, header...)
	}
	return send(tb, ctx, http.DefaultClient, method, url, ctype, body, header...)
}

// submitAs posts a job for later streaming as key's subject and returns
// its id.
func submitAs(tb testing.TB, n *switchyard.Node, key, queue, env string) string {
	tb.Helper()
	res := keyed(tb, tb.Context(), "POST", baseURL(n)+"/v1/queues/"+queue+"/jobs", key, "application/json", env)
	body := readBody(tb, res)
	if res.StatusCode != 202 {
		tb.Fatalf("submit as %s: %d %s", key, res.StatusCode, body)
	}
	return strings.TrimPrefix(res.Header.Get("Location"), "/v1/jobs/")
}

// withKey is ctx carrying key as gRPC "authorization" metadata.
func withKey(ctx context.Context, key string) context.Context {
	if key == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", bearer(key))
}

// grpcConn is a plaintext connection to n's gRPC port, closed when the
// test ends.
func grpcConn(tb testing.TB, n *switchyard.Node, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	return grpctest.Dial(tb, n.GRPCAddr(), opts...)
}

// problemCode is the code of a problem document or OpenAI error in body.
func problemCode(body []byte) string {
	s := string(body)
	i := strings.Index(s, `"code":"`)
	if i < 0 {
		return ""
	}
	s = s[i+len(`"code":"`):]
	return s[:strings.IndexByte(s, '"')]
}

// drainClose reads a little of a body (a stream's first bytes) and closes
// it.
func drainClose(res *http.Response) {
	_, _ = io.CopyN(io.Discard, res.Body, 1)
	_ = res.Body.Close()
}

func sprintRow(cells ...string) string {
	var b strings.Builder
	for _, c := range cells {
		fmt.Fprintf(&b, "| %s ", c)
	}
	return b.String() + "|"
}
