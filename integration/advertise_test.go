package integration_test

import (
	"errors"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/tcptest"
)

// TestBinaryAdvertise runs the real binary: a node bound to every
// interface (0.0.0.0 and [::], ports picked by the kernel) reports in the
// cluster view addresses that name a specific host and the bound ports,
// and that answer; a node whose peer port is advertised at another address
// (a TCP relay in the test, as NAT or a container's published port would
// be) is reached by its peers there, and a job crosses it; an advertised
// address nobody could dial is refused at startup.
func TestBinaryAdvertise(t *testing.T) {
	t.Parallel()
	bin := buildOrSkip(t, "builds and runs the binary")

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct{ flag, value, want string }{
			{"--advertise-http-addr", "0.0.0.0:8080", "unspecified"},
			{"--advertise-grpc-addr", "[::]:9090", "unspecified"},
			{"--advertise-peer-addr", "node-1", "host:port"},
			{"--advertise-peer-addr", "node-1:0", "port"},
		} {
			out, err := exec.Command(bin, "node", "--name", "bad", "--data-dir", filepath.Join(t.TempDir(), "data"),
				"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", tc.flag, tc.value).CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !strings.Contains(string(out), strings.TrimPrefix(tc.flag, "--")) || !strings.Contains(string(out), tc.want) {
				t.Errorf("%s %s: err %v, output:\n%s\nwant a non-zero exit naming the flag and %q", tc.flag, tc.value, err, out, tc.want)
			}
		}
	})

	// b's peer port: bound on every interface at a port chosen here, and
	// advertised at the relay's address, which forwards to it.
	peerPort := portOf(t, freeAddr(t))
	relay := tcptest.NewRelay(t, "127.0.0.1:"+peerPort)

	etcdAddr := freeAddr(t)
	everywhere := []string{"--http-addr", "0.0.0.0:0", "--grpc-addr", "[::]:0", "--peer-addr", "0.0.0.0:0", "--allow-anonymous"}
	a := startProcNode(t, bin, "aa", append([]string{"--etcd-client-addr", etcdAddr}, everywhere...)...)
	b := startProcNode(t, bin, "ab", append([]string{"--etcd-endpoints", "https://" + etcdAddr}, append(everywhere,
		"--peer-addr", "0.0.0.0:"+peerPort, "--advertise-peer-addr", relay.Addr)...)...)

	var view procView
	waitFor(t, 20*time.Second, "aa and ab online in aa's view", func() bool { return view.allOnline(a, 2) })
	nodes := view.Nodes
	bound := map[string]*procNode{"aa": a, "ab": b}
	for _, n := range nodes {
		t.Logf("%s: http_addr %s, grpc_addr %s, peer_addr %s (bound http %s, grpc %s)", n.ID, n.HTTPAddr, n.GRPCAddr, n.PeerAddr, bound[n.ID].http, bound[n.ID].grpc)
		addrs := []struct{ what, adv, bound string }{{"http_addr", n.HTTPAddr, bound[n.ID].http}, {"grpc_addr", n.GRPCAddr, bound[n.ID].grpc}}
		if n.ID == "aa" {
			addrs = append(addrs, struct{ what, adv, bound string }{"peer_addr", n.PeerAddr, ""})
		}
		for _, ad := range addrs {
			host, port, err := net.SplitHostPort(ad.adv)
			if err != nil || host == "" || net.ParseIP(host) == nil || net.ParseIP(host).IsUnspecified() || port == "0" {
				t.Errorf("%s's %s %q: want a specific host and a port", n.ID, ad.what, ad.adv)
			}
			if ad.bound != "" && port != portOf(t, ad.bound) {
				t.Errorf("%s's %s %q: want the bound port (bound %s)", n.ID, ad.what, ad.adv, ad.bound)
			}
		}
		// Reachable as advertised: the HTTP API answers there, and so does
		// the gRPC port (a TCP connection).
		res, err := http.Get("http://" + n.HTTPAddr + "/readyz")
		if err != nil || res.StatusCode != http.StatusOK {
			t.Errorf("%s's advertised http_addr %s: GET /readyz: %v %v", n.ID, n.HTTPAddr, err, res)
		}
		if res != nil {
			res.Body.Close()
		}
		if c, err := net.DialTimeout("tcp", n.GRPCAddr, 5*time.Second); err != nil {
			t.Errorf("%s's advertised grpc_addr %s: %v", n.ID, n.GRPCAddr, err)
		} else {
			c.Close()
		}
		if n.ID == "ab" && n.PeerAddr != relay.Addr {
			t.Errorf("ab's peer_addr %q, want the advertised %s", n.PeerAddr, relay.Addr)
		}
	}

	// A job posted to aa for a worker on ab: ab dispatches (its consumer's
	// node claims the queue), so aa forwards the job over the peer
	// transport to ab's advertised peer address, the relay.
	before := relay.Conns()
	_, wlog := startDemoWorker(t, bin, b.grpc, "adv", "10ms")
	res := streamOnceServed(t, "http://"+a.http+"/v1/queues/adv/jobs", `{"input":"through the advertised peer address"}`)
	evs := readAll(t, res.Body)
	res.Body.Close()
	if got := types(evs); len(got) == 0 || got[len(got)-1] != "done" || !slices.Contains(got, "output") {
		t.Fatalf("job posted to aa, run on ab's worker: events %v, want outputs and done\nworker log:\n%s", got, wlog.String())
	}
	if relay.Conns() == 0 || relay.Bytes() == 0 {
		t.Fatalf("the relay at ab's advertised peer address carried %d connections, %d bytes: aa did not dial it", relay.Conns(), relay.Bytes())
	}
	t.Logf("relay at ab's advertised peer address %s: %d connections (%d before the job), %d bytes", relay.Addr, relay.Conns(), before, relay.Bytes())
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}
