package integration_test

import (
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// A read token reads its job's events and document and nothing else; a
// position from its stream resumes with the subject's key, and one from
// the key's stream on the token; a resume token is no read token; a
// cluster read token opens the live view only.
func TestReadTokens(t *testing.T) {
	n := MustStartSecuredNode(t, nil)
	MustStartWorker(t, n, worker.Config{Queue: "demo", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, worker.Tokens(0))
	ctx, base := t.Context(), baseURL(n)
	job := submitAs(t, n, keyAlice, "demo", `{"input":"a b c","ttl_ms":30000}`)
	other := submitAs(t, n, keyAlice, "demo", `{"input":"x","ttl_ms":30000}`)
	token := func(path, key string) string {
		res := keyed(t, ctx, "POST", base+path, key, "", "")
		var rt struct {
			Token     string `json:"token"`
			ExpiresAt string `json:"expires_at"`
		}
		if err := json.Unmarshal(readBody(t, res), &rt); err != nil || res.StatusCode != 200 || rt.Token == "" || rt.ExpiresAt == "" {
			t.Fatalf("POST %s: %d %+v", path, res.StatusCode, rt)
		}
		return rt.Token
	}
	tok := token("/v1/jobs/"+job+"/read-token", keyAlice)
	q := "?read_token=" + url.QueryEscape(tok)
	status := func(method, path, query string, header ...string) (int, string) {
		res := keyed(t, ctx, method, base+path+query, "", "", "", header...)
		body := readBody(t, res)
		return res.StatusCode, problemCode(body)
	}
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/jobs/" + job + "/events", 200, ""},
		{"GET", "/v1/jobs/" + job, 200, ""},
		{"DELETE", "/v1/jobs/" + job, 403, "permission_denied"},
		{"GET", "/v1/jobs/" + other + "/events", 403, "permission_denied"},
		{"POST", "/v1/jobs/" + job + "/read-token", 403, "permission_denied"},
		{"GET", "/v1/cluster/events", 403, "permission_denied"},
		{"POST", "/v1/queues/demo/jobs", 403, "permission_denied"},
	} {
		if st, code := status(tc.method, tc.path, q); st != tc.status || code != tc.code {
			t.Errorf("%s %s with the read token: %d %s, want %d %s", tc.method, tc.path, st, code, tc.status, tc.code)
		}
	}
	// Positions cross between the key and the token: they are the subject's.
	res := keyed(t, ctx, "GET", base+"/v1/jobs/"+job+"/events"+q, "", "", "")
	evs := readAll(t, res.Body)
	res.Body.Close()
	res = keyed(t, ctx, "GET", base+"/v1/jobs/"+job+"/events", keyAlice, "", "", "Last-Event-ID", evs[1].LastEventID)
	if rest := readAll(t, res.Body); res.StatusCode != 200 || len(rest) == 0 || field[uint64](t, rest[0], "seq") != 3 {
		t.Errorf("the key resuming from the token's stream: %d %v", res.StatusCode, types(rest))
	}
	res.Body.Close()
	// Not a read token: a resume token, garbage, another node's token.
	for name, bad := range map[string]string{"resume token": evs[1].LastEventID, "garbage": "k0.abc.def"} {
		if st, code := status("GET", "/v1/jobs/"+job+"/events", "?read_token="+url.QueryEscape(bad)); st != 401 || code != "unauthenticated" {
			t.Errorf("%s as a read token: %d %s", name, st, code)
		}
	}
	// The cluster's token: the live view, nothing else; and only an admin
	// gets one.
	ct := "?read_token=" + url.QueryEscape(token("/v1/cluster/read-token", keyRoot))
	res = keyed(t, ctx, "GET", base+"/v1/cluster/events"+ct, "", "", "")
	if res.StatusCode != 200 {
		t.Errorf("the live view on the cluster token: %d", res.StatusCode)
	}
	drainClose(res)
	if st, code := status("GET", "/v1/cluster/nodes", ct); st != 403 || code != "permission_denied" {
		t.Errorf("the nodes view on the cluster token: %d %s", st, code)
	}
	if st, code := status("GET", "/v1/jobs/"+job, ct); st != 403 || code != "permission_denied" {
		t.Errorf("a job on the cluster token: %d %s", st, code)
	}
}

// A reload that removes a key, or changes what a subject's keys grant,
// revokes the read tokens that subject got before it: the job stream and
// the live view they opened answer 401 from then on. A subject whose keys
// the reload left alone keeps its tokens, and so does everyone at a
// reload that changes nothing.
func TestReadTokensRevokedAtReload(t *testing.T) {
	path := writeKeys(t, accessKeys())
	n := MustStartNode(t, func(c *switchyard.Config) { c.Auth.File = path })
	MustStartWorker(t, n, worker.Config{Queue: "demo", DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, worker.Tokens(0))
	ctx, base := t.Context(), baseURL(n)
	token := func(path, key string) string {
		res := keyed(t, ctx, "POST", base+path, key, "", "")
		var rt struct{ Token string }
		if err := json.Unmarshal(readBody(t, res), &rt); err != nil || res.StatusCode != 200 {
			t.Fatalf("POST %s: %d", path, res.StatusCode)
		}
		return rt.Token
	}
	aliceJob := submitAs(t, n, keyAlice, "demo", `{"input":"a","ttl_ms":30000}`)
	bobJob := submitAs(t, n, keyBob, "demo", `{"input":"b","ttl_ms":30000}`)
	read := map[string]string{
		"alice's job": "/v1/jobs/" + aliceJob + "?read_token=" + url.QueryEscape(token("/v1/jobs/"+aliceJob+"/read-token", keyAlice)),
		"bob's job":   "/v1/jobs/" + bobJob + "?read_token=" + url.QueryEscape(token("/v1/jobs/"+bobJob+"/read-token", keyBob)),
		"root's view": "/v1/cluster/events?read_token=" + url.QueryEscape(token("/v1/cluster/read-token", keyRoot)),
	}
	check := func(when string, want map[string]int) {
		t.Helper()
		for name, path := range read {
			res := keyed(t, ctx, "GET", base+path, "", "", "")
			drainClose(res)
			if res.StatusCode != want[name] {
				t.Errorf("%s, %s: %d, want %d", when, name, res.StatusCode, want[name])
			}
		}
	}
	check("before any reload", map[string]int{"alice's job": 200, "bob's job": 200, "root's view": 200})
	if err := n.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	check("after a reload that changed nothing", map[string]int{"alice's job": 200, "bob's job": 200, "root's view": 200})

	// alice's submit key leaves the file (her work key stays); root's key
	// loses admin.
	doc := strings.Replace(accessKeys(), "  - subject: alice\n    key: "+keyAlice+"\n    roles: [submit]\n    queues: [demo, \"team-a.*\", chat]\n", "", 1)
	doc = strings.Replace(doc, "    key: "+keyRoot+"\n    roles: [admin]", "    key: "+keyRoot+"\n    roles: [submit]\n    queues: [demo]", 1)
	if doc == accessKeys() || strings.Contains(doc, keyAlice) {
		t.Fatal("the key file was not edited")
	}
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	check("after alice's key left and root's lost admin", map[string]int{"alice's job": 401, "bob's job": 200, "root's view": 401})
}
