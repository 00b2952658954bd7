//go:build faults

package integration_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// The fault suite's network.
//
// With root and iproute2 ("netns" mode) each node runs in a network
// namespace of its own with three links:
//
//	cl0  the cluster network: node-to-node peer traffic, and the etcd client
//	     port (the test reads etcd's member status there)
//	et0  the etcd network: etcd peer (raft) traffic alone
//	h0   the host link: point to point to the test process, which carries
//	     the node's HTTP and worker gRPC ports, its requesters and workers
//
// The cluster and etcd networks are bridges in a "switch" namespace, not in
// the root namespace: there a host firewall (Docker's FORWARD DROP with
// br_netfilter, found on these machines) filters bridged traffic. The test
// process has a port on the cluster bridge (10.R.0.254).
//
// A partition sets a node's switch ports down: from then on its packets to
// the other nodes go nowhere, with no RST and no FIN, as with a pulled
// cable, while its own workers and requesters (on the host link) still
// reach it. Cutting only the etcd port loses the node's etcd member while
// its peer traffic flows.
//
// Names carry a unique prefix, sy-<pid base 36>-<run>: a run that died
// without cleaning up leaves namespaces whose owner is gone, and the next
// run removes them (sweepStaleNetns) without touching another live run's.
//
// Without root or iproute2 ("loopback" mode), or with FAULTS_LOOPBACK=1,
// every node listens on 127.0.0.1 and the cases that need a partition are
// skipped with a message.
type faultNet struct {
	netns  bool
	tag    string // prefix of every namespace and root-side link
	subnet int    // R in 10.R.0.0/16
	nodes  []string
	addrs  map[string]nodeAddrs
}

// nodeAddrs is where one node listens, and how it is run.
type nodeAddrs struct {
	http, grpc, peer, etcdClient, etcdPeer string
	wrap                                   []string
}

// netLink is one of a node's links to the other nodes.
type netLink string

const (
	linkCluster netLink = "c"
	linkEtcd    netLink = "e"
)

var netRuns atomic.Int64

// netnsUnavailable says why namespaces cannot be used here ("" if they can).
func netnsUnavailable() string {
	if os.Getenv("FAULTS_LOOPBACK") == "1" {
		return "FAULTS_LOOPBACK=1"
	}
	if os.Geteuid() != 0 {
		return "not root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no ip command (iproute2)"
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns list: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return ""
}

// newFaultNet lays out the network of nodes: namespaces when available,
// loopback addresses otherwise. Everything it creates is removed when the
// test ends.
func newFaultNet(t *testing.T, nodes []string) *faultNet {
	t.Helper()
	n := &faultNet{nodes: nodes, addrs: map[string]nodeAddrs{}}
	if why := netnsUnavailable(); why != "" {
		for _, name := range nodes {
			n.addrs[name] = nodeAddrs{http: freeAddr(t), grpc: freeAddr(t), peer: freeAddr(t), etcdClient: freeAddr(t), etcdPeer: freeAddr(t)}
		}
		return n
	}
	sweepStaleNetns(t)
	n.netns = true
	n.tag = fmt.Sprintf("sy-%s-%s", strconv.FormatInt(int64(os.Getpid()), 36), strconv.FormatInt(netRuns.Add(1), 36))
	n.subnet = freeSubnet(t)
	t.Cleanup(n.teardown) // before anything exists, so a half-made network goes too
	n.setup(t)
	return n
}

// mode names the network for the ledger.
func (n *faultNet) mode() string {
	if n.netns {
		return fmt.Sprintf("network namespaces %s-*, 10.%d.0.0/16", n.tag, n.subnet)
	}
	return "loopback (no namespaces: " + netnsUnavailable() + ")"
}

func (n *faultNet) ns(node string) string { return n.tag + "-" + node }
func (n *faultNet) sw() string            { return n.tag + "-sw" }

func (n *faultNet) setup(t *testing.T) {
	t.Helper()
	ip := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	r, sw := n.subnet, n.sw()
	ip("netns", "add", sw)
	ip("-n", sw, "link", "set", "lo", "up")
	for _, br := range []string{"clu", "etc"} {
		ip("-n", sw, "link", "add", br, "type", "bridge")
		ip("-n", sw, "link", "set", br, "up")
	}
	root := n.tag + "r"
	ip("link", "add", root, "type", "veth", "peer", "name", "root", "netns", sw)
	ip("-n", sw, "link", "set", "root", "master", "clu", "up")
	ip("addr", "add", fmt.Sprintf("10.%d.0.254/24", r), "dev", root)
	ip("link", "set", root, "up")
	for i, name := range n.nodes {
		ns := n.ns(name)
		ip("netns", "add", ns)
		ip("-n", ns, "link", "set", "lo", "up")
		for _, l := range []struct {
			dev, port, bridge string
			net               int
		}{{"cl0", string(linkCluster) + name, "clu", 0}, {"et0", string(linkEtcd) + name, "etc", 1}} {
			ip("-n", ns, "link", "add", l.dev, "type", "veth", "peer", "name", l.port, "netns", sw)
			ip("-n", sw, "link", "set", l.port, "master", l.bridge, "up")
			ip("-n", ns, "addr", "add", fmt.Sprintf("10.%d.%d.%d/24", r, l.net, i+1), "dev", l.dev)
			ip("-n", ns, "link", "set", l.dev, "up")
		}
		host := n.tag + "h" + strconv.Itoa(i)
		ip("link", "add", host, "type", "veth", "peer", "name", "h0", "netns", ns)
		ip("addr", "add", fmt.Sprintf("10.%d.2.%d/30", r, 4*i+1), "dev", host)
		ip("link", "set", host, "up")
		ip("-n", ns, "addr", "add", fmt.Sprintf("10.%d.2.%d/30", r, 4*i+2), "dev", "h0")
		ip("-n", ns, "link", "set", "h0", "up")
		hostIP := fmt.Sprintf("10.%d.2.%d", r, 4*i+2)
		// Every node has its namespace's ports to itself: the same ones.
		n.addrs[name] = nodeAddrs{
			http: hostIP + ":8080", grpc: hostIP + ":9090",
			peer:       fmt.Sprintf("10.%d.0.%d:7070", r, i+1),
			etcdClient: fmt.Sprintf("10.%d.0.%d:2379", r, i+1),
			etcdPeer:   fmt.Sprintf("10.%d.1.%d:2380", r, i+1),
			wrap:       []string{"ip", "netns", "exec", ns},
		}
	}
}

// teardown removes the namespaces (their links go with them) once the nodes
// in them are gone, and the root-side links in case one lingers.
func (n *faultNet) teardown() {
	for _, name := range append(append([]string{}, n.nodes...), "sw") {
		_ = exec.Command("ip", "netns", "del", n.tag+"-"+name).Run()
	}
	for i := range n.nodes {
		_ = exec.Command("ip", "link", "del", n.tag+"h"+strconv.Itoa(i)).Run()
	}
	_ = exec.Command("ip", "link", "del", n.tag+"r").Run()
}

// cut sets node's switch ports for links down; heal sets them up.
func (n *faultNet) cut(node string, links ...netLink) error  { return n.setLinks(node, "down", links) }
func (n *faultNet) heal(node string, links ...netLink) error { return n.setLinks(node, "up", links) }

func (n *faultNet) setLinks(node, state string, links []netLink) error {
	if !n.netns {
		return errors.New("no namespaces: cannot partition in loopback mode")
	}
	var errs []error
	for _, l := range links {
		if out, err := exec.Command("ip", "-n", n.sw(), "link", "set", string(l)+node, state).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("link %s of %s %s: %v: %s", l, node, state, err, out))
		}
	}
	return errors.Join(errs...)
}

// freeSubnet picks R so that nothing on this machine routes 10.R.0.0/16.
func freeSubnet(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("sh", "-c", "ip -4 -o addr show; ip -4 route show table all").CombinedOutput()
	if err != nil {
		t.Fatalf("list addresses and routes: %v\n%s", err, out)
	}
	used := string(out)
	start := os.Getpid() % 50
	for k := range 50 {
		r := 200 + (start+k)%50
		if !strings.Contains(used, fmt.Sprintf("10.%d.", r)) {
			return r
		}
	}
	t.Fatal("no free 10.R.0.0/16 for R in 200..249")
	return 0
}

// sweepStaleNetns removes namespaces and root-side links of the suite whose
// owning process is gone.
func sweepStaleNetns(t *testing.T) {
	t.Helper()
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && staleName(f[0]) {
			t.Logf("removing stale namespace %s", f[0])
			_ = exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(out), "\n") {
		// "12: name@if4: <...": the name ends at '@' or ':'.
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if staleName(name) {
			t.Logf("removing stale link %s", name)
			_ = exec.Command("ip", "link", "del", name).Run()
		}
	}
}

// staleName reports whether name is one of the suite's (sy-<pid36>-...)
// and its process is gone.
func staleName(name string) bool {
	parts := strings.Split(name, "-")
	if len(parts) < 3 || parts[0] != "sy" {
		return false
	}
	pid, err := strconv.ParseInt(parts[1], 36, 64)
	if err != nil || pid <= 0 || pid > 1<<22 {
		return false
	}
	return errors.Is(syscall.Kill(int(pid), 0), syscall.ESRCH)
}
