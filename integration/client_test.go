package integration_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/openapi/client"
)

// apiClient is the client generated from the node's OpenAPI document: the
// tests drive every JSON endpoint through it, which is what shows that the
// document tells the truth.
func apiClient(tb testing.TB, n *switchyard.Node) *client.ClientWithResponses {
	tb.Helper()
	c, err := client.NewClientWithResponses(baseURL(n))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// apiClientWithKey is apiClient sending key as its bearer.
func apiClientWithKey(tb testing.TB, n *switchyard.Node, key string) *client.ClientWithResponses {
	tb.Helper()
	c, err := client.NewClientWithResponses(baseURL(n), client.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+key)
		return nil
	}))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// mustStatus fails the test unless res has status want; it returns the
// body.
func mustStatus(tb testing.TB, what string, res *http.Response, body []byte, err error, want int) []byte {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	if res.StatusCode != want {
		tb.Fatalf("%s: %d, want %d: %s", what, res.StatusCode, want, body)
	}
	return body
}

// problemOf decodes a problem document, failing the test unless it is one
// with the given status and code.
func problemOf(tb testing.TB, what string, res *http.Response, body []byte, err error, status int, code string) client.Problem {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
		tb.Errorf("%s: Content-Type %q", what, ct)
	}
	var p client.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		tb.Fatalf("%s: %v: %s", what, err, body)
	}
	if res.StatusCode != status || string(p.Code) != code || p.Status != status {
		tb.Fatalf("%s: %d %s, want %d %s: %s", what, res.StatusCode, p.Code, status, code, body)
	}
	return p
}

func readBody(tb testing.TB, res *http.Response) []byte {
	tb.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func ptr[T any](v T) *T { return &v }
