package integration_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard/switchyard"
)

// A node started without --debug-addr serves no profiles, on its API port
// or elsewhere.
func TestDebugAddrOffByDefault(t *testing.T) {
	n := MustStartNode(t, nil)
	if a := n.DebugAddr(); a != "" {
		t.Fatalf("DebugAddr = %q without --debug-addr", a)
	}
	res := keyed(t, t.Context(), "GET", baseURL(n)+"/debug/pprof/", "", "", "")
	res.Body.Close()
	if res.StatusCode == http.StatusOK {
		t.Fatalf("API port serves /debug/pprof/: %s", res.Status)
	}
}

// --debug-addr serves net/http/pprof; on a node with keys, to an admin
// only.
func TestDebugAddrServesProfiles(t *testing.T) {
	n := MustStartSecuredNode(t, func(c *switchyard.Config) { c.DebugAddr = "127.0.0.1:0" })
	base := "http://" + n.DebugAddr() + "/debug/pprof/"
	for _, tc := range []struct {
		key  string
		want int
	}{{"", http.StatusUnauthorized}, {keyBob, http.StatusForbidden}, {keyRoot, http.StatusOK}} {
		res := keyed(t, t.Context(), "GET", base+"goroutine?debug=1", tc.key, "", "")
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Fatalf("key %q: %s, want %d", tc.key, res.Status, tc.want)
		}
		if tc.want == http.StatusOK && !strings.Contains(string(body), "goroutine profile:") {
			t.Fatalf("goroutine profile: got %.200q", body)
		}
	}
	res := keyed(t, t.Context(), "GET", base+"profile?seconds=1", keyRoot, "", "")
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || len(body) == 0 {
		t.Fatalf("CPU profile: %s, %d bytes", res.Status, len(body))
	}
}
