//go:build compose

package compose_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/switchyard/switchyard/integration/loadgen"
)

// The demo as docs/compose.md, "Run the demo cluster", tells it: every node serves
// the web page; its live cluster view (the snapshot the page renders) shows
// three nodes online in zones z1 and z2 and the three workers with their
// capabilities; a job streamed from node-1 that requires model=large runs
// on node-3's worker-3, and one kept in zone z2 that requires model=small
// runs on worker-2, by the workers' own record. All of it with the catalog
// closed: on the cluster's network its ports answer no one without the
// cluster secret (checkCatalogClosed), with nothing copied by hand.
func TestComposeDemo(t *testing.T) {
	t.Parallel()
	c := startCluster(t, "demo")
	for _, line := range checkCatalogClosed(t, c) {
		t.Log(line)
	}
	for _, svc := range nodeServices {
		u, err := c.url(svc)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.http.Get(u + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "<title>Switchyard</title>") {
			t.Errorf("%s: GET /: %s, %.80q", svc, res.Status, body)
		}
	}

	checkAdvertised(t, c)
	checkRelayed(t, c)

	snap := firstSnapshot(t, c, "node-1")
	zones := map[string]string{}
	for _, n := range snap.Nodes {
		if n.State != "online" {
			t.Errorf("live view: %s is %s", n.ID, n.State)
		}
		zones[n.ID] = n.Zone
	}
	if want := map[string]string{"node-1": "z1", "node-2": "z2", "node-3": "z2"}; fmt.Sprint(zones) != fmt.Sprint(want) {
		t.Errorf("live view: zones %v, want %v", zones, want)
	}
	caps := map[string]string{}
	for _, q := range snap.Queues {
		for _, cn := range q.Consumers {
			caps[cn.Name+"@"+cn.Node] = strings.Join(cn.Capabilities, ",")
		}
	}
	if want := map[string]string{"worker-1@node-1": "model=small", "worker-2@node-2": "model=small", "worker-3@node-3": "model=large"}; fmt.Sprint(caps) != fmt.Sprint(want) {
		t.Errorf("live view: consumers %v, want %v", caps, want)
	}

	large := probe(c, "node-1", "large")
	zoned := probeIn(c, "node-1", "small", "z2")
	runs := map[string][]jobRun{}
	for _, w := range workerServices {
		rs, err := parseRuns(c.logs(w))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			runs[r.job] = append(runs[r.job], r)
		}
	}
	for _, tc := range []struct {
		what   string
		j      loadJob
		worker string
	}{
		{"a model=large job from node-1", large, "worker-3"},
		{"a model=small job in zone z2 from node-1", zoned, "worker-2"},
	} {
		outputs := slices.IndexFunc(tc.j.Events, func(e loadgen.Event) bool { return e.Kind == "output" })
		if tc.j.Terminal != "done" || outputs < 0 {
			t.Errorf("%s: %s %s %s%s, want output then done", tc.what, tc.j.Terminal, tc.j.Code, tc.j.Refusal, tc.j.PostErr)
		}
		if rs := runs[tc.j.ID]; len(rs) != 1 || rs[0].worker != tc.worker {
			t.Errorf("%s ran %v, want once on %s", tc.what, rs, tc.worker)
		} else {
			t.Logf("%s: %d events, ran once on %s, %v from POST to done", tc.what, len(tc.j.Events), rs[0].worker,
				tc.j.EndAt.Sub(tc.j.SubmitAt).Round(time.Millisecond))
		}
	}
}

// snapshot is the part of a cluster view snapshot the demo checks.
type snapshot struct {
	Nodes  []struct{ ID, State, Zone string }
	Queues []struct {
		Name      string
		Consumers []struct {
			Name, Node   string
			Capabilities []string
		}
	}
}

// firstSnapshot reads the first snapshot of GET /v1/cluster/events, the
// stream the web page's live view is drawn from.
func firstSnapshot(t *testing.T, c *cluster, svc string) snapshot {
	t.Helper()
	u, err := c.url(svc)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u+"/v1/cluster/events", nil)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	for ev, err := range sse.Read(res.Body, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == "snapshot" {
			var s snapshot
			if err := json.Unmarshal([]byte(ev.Data), &s); err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	t.Fatal("the cluster events stream ended without a snapshot")
	return snapshot{}
}

// checkAdvertised: every node's view gives each node the addresses it
// advertises (docs/compose.md, "Addresses"): HTTP and gRPC at the host
// ports compose published, which answer from the host (the page's links
// work), and the peer port at the service name, never an address bound on
// every interface.
func checkAdvertised(t *testing.T, c *cluster) {
	t.Helper()
	for _, svc := range nodeServices {
		var v struct {
			Nodes []struct {
				ID       string `json:"id"`
				HTTPAddr string `json:"http_addr"`
				GRPCAddr string `json:"grpc_addr"`
				PeerAddr string `json:"peer_addr"`
			} `json:"nodes"`
		}
		if err := c.getJSON(svc, "/v1/cluster/nodes", &v); err != nil {
			t.Fatalf("%s: %v", svc, err)
		}
		for _, n := range v.Nodes {
			u, err := c.url(n.ID)
			if err != nil {
				t.Fatal(err)
			}
			if "http://"+n.HTTPAddr != u || n.PeerAddr != n.ID+":7070" || !strings.HasPrefix(n.GRPCAddr, "127.0.0.1:") {
				t.Errorf("%s's view of %s: http_addr %s, grpc_addr %s, peer_addr %s; want http %s, grpc on 127.0.0.1, peer %s:7070",
					svc, n.ID, n.HTTPAddr, n.GRPCAddr, n.PeerAddr, u, n.ID)
			}
			res, err := c.http.Get("http://" + n.HTTPAddr + "/readyz")
			if err != nil {
				t.Errorf("%s's view of %s: its http_addr %s does not answer from the host: %v", svc, n.ID, n.HTTPAddr, err)
				continue
			}
			res.Body.Close()
			if svc == "node-1" {
				t.Logf("%s: http_addr %s (GET /readyz from the host: %s), grpc_addr %s, peer_addr %s", n.ID, n.HTTPAddr, res.Status, n.GRPCAddr, n.PeerAddr)
			}
		}
	}
}

// checkRelayed: a keyed retry sent to node-2 for a job made on node-1 is
// relayed to node-1 and answered with the same job, although node-1's
// advertised HTTP address is the host's loopback: relays dial the relay
// address, node-1:8080 on the cluster network (docs/cluster.md,
// "Advertised addresses").
func checkRelayed(t *testing.T, c *cluster) {
	t.Helper()
	words := make([]string, jobWords)
	for i := range words {
		words[i] = "r" + strconv.Itoa(i)
	}
	env, _ := json.Marshal(map[string]any{
		"ttl_ms": jobTTL.Milliseconds(), "input": strings.Join(words, " "),
		"capabilities": map[string]string{"model": "small"}, "options": map[string]any{"delay_ms": jobDelay.Milliseconds()},
	})
	submit := func(svc string) (int, string) {
		u, err := c.url(svc)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, u+"/v1/queues/demo/jobs", bytes.NewReader(env))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "compose-relay")
		res, err := c.http.Do(req)
		if err != nil {
			t.Fatalf("POST to %s: %v", svc, err)
		}
		defer res.Body.Close()
		var j struct {
			JobID string `json:"job_id"`
			Code  string `json:"code"`
		}
		b, _ := io.ReadAll(res.Body)
		_ = json.Unmarshal(b, &j)
		if j.JobID == "" {
			return res.StatusCode, "(none: " + j.Code + ")"
		}
		return res.StatusCode, j.JobID
	}
	st1, id1 := submit("node-1")
	if st1 != http.StatusAccepted && st1 != http.StatusOK {
		t.Fatalf("a keyed job posted to node-1: %d %s", st1, id1)
	}
	st2, id2 := submit("node-2")
	if st2 != http.StatusOK || id2 != id1 {
		t.Errorf("its retry through node-2: %d, job %s; want 200 and job %s, relayed to node-1", st2, id2, id1)
	} else {
		t.Logf("a keyed job made on node-1 (%d, %s), retried through node-2: %d, the same job (relayed)", st1, id1, st2)
	}
}
