package switchyard

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// The default advertised address of a bind on every interface is the
// host's address a peer would use: the default route's source, else an
// interface's global address, else loopback; never an unspecified or
// link-local one, and IPv4 for a 0.0.0.0 bind.
func TestPickHostAddress(t *testing.T) {
	ip := net.ParseIP
	noRoute := func(string) (net.IP, error) { return nil, errors.New("network is unreachable") }
	routes := func(v4, v6 string) func(string) (net.IP, error) {
		return func(nw string) (net.IP, error) {
			s := v4
			if nw == "udp6" {
				s = v6
			}
			if s == "" {
				return nil, errors.New("network is unreachable")
			}
			return ip(s), nil
		}
	}
	addrs := func(ss ...string) func() ([]net.IP, error) {
		return func() ([]net.IP, error) {
			var ips []net.IP
			for _, s := range ss {
				ips = append(ips, ip(s))
			}
			return ips, nil
		}
	}
	for _, tc := range []struct {
		name   string
		v4only bool
		route  func(string) (net.IP, error)
		addrs  func() ([]net.IP, error)
		want   string
	}{
		{"default route's source", false, routes("10.0.0.7", "2001:db8::7"), addrs("127.0.0.1", "10.0.0.7", "192.168.1.2"), "10.0.0.7"},
		{"IPv6 default route only", false, routes("", "2001:db8::7"), addrs("::1", "2001:db8::7"), "2001:db8::7"},
		{"0.0.0.0 never takes IPv6", true, routes("", "2001:db8::7"), addrs("::1", "2001:db8::7", "fe80::1", "172.17.0.2"), "172.17.0.2"},
		{"no route: first interface address, IPv4 first", false, noRoute, addrs("127.0.0.1", "::1", "fe80::1", "2001:db8::9", "10.1.2.3"), "10.1.2.3"},
		{"no route: link-local is skipped", false, noRoute, addrs("127.0.0.1", "fe80::1", "169.254.1.1", "2001:db8::9"), "2001:db8::9"},
		{"a route through a link-local source is skipped", false, routes("169.254.3.4", ""), addrs("127.0.0.1", "10.9.9.9"), "10.9.9.9"},
		{"loopback only", false, noRoute, addrs("::1", "127.0.0.1"), "127.0.0.1"},
		{"IPv6 loopback only", false, noRoute, addrs("::1"), "::1"},
		{"0.0.0.0, IPv6 loopback only", true, noRoute, addrs("::1"), "127.0.0.1"},
		{"no interfaces at all", false, noRoute, func() ([]net.IP, error) { return nil, errors.New("no") }, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pickHostAddress(tc.v4only, tc.route, tc.addrs)
			if !got.Equal(ip(tc.want)) {
				t.Fatalf("got %v, want %s", got, tc.want)
			}
		})
	}
}

// A listener's advertised address: the configured one, else the bound one
// (port resolved) when its host is specific, else the host's address with
// the bound port. The host address in this test is this machine's own,
// whatever it is: never unspecified.
func TestAdvertiseAddr(t *testing.T) {
	fixed := func(bool) net.IP { return net.ParseIP("10.0.0.7") }
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	for _, tc := range []struct {
		configured string
		bound      net.Addr
		want       string
	}{
		{"", tcp("127.0.0.1:8080"), "127.0.0.1:8080"},
		{"", tcp("[::1]:8080"), "[::1]:8080"},
		{"", tcp("10.1.1.1:7070"), "10.1.1.1:7070"},
		{"", tcp("0.0.0.0:8080"), "10.0.0.7:8080"},
		{"", tcp("[::]:9090"), "10.0.0.7:9090"},
		{"node-1:7070", tcp("[::]:7070"), "node-1:7070"},
		{"127.0.0.1:18080", tcp("0.0.0.0:8080"), "127.0.0.1:18080"},
	} {
		if got := advertiseAddr(tc.configured, tc.bound, fixed); got != tc.want {
			t.Errorf("advertiseAddr(%q, %v) = %q, want %q", tc.configured, tc.bound, got, tc.want)
		}
	}
	// The real listeners and the real host address.
	for _, bind := range []string{"0.0.0.0:0", "[::]:0", ":0"} {
		ln, err := net.Listen("tcp", bind)
		if err != nil {
			t.Logf("%s: %v (no such stack here)", bind, err)
			continue
		}
		got := advertiseAddr("", ln.Addr(), hostAddress)
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		ln.Close()
		host, gotPort, err := net.SplitHostPort(got)
		if err != nil || unspecifiedHost(host) || gotPort != port || gotPort == "0" {
			t.Errorf("bound %s: advertised %q, want a specific host with port %s", bind, got, port)
		}
		t.Logf("bound %s: advertised %s", bind, got)
	}
}

// An advertised address that others could not dial is refused, naming why.
func TestValidateAdvertise(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"", ""},
		{"node-1:7070", ""},
		{"127.0.0.1:18080", ""},
		{"[2001:db8::1]:443", ""},
		{"0.0.0.0:8080", "unspecified"},
		{"[::]:8080", "unspecified"},
		{":8080", "unspecified"},
		{"node-1", "host:port"},
		{"node-1:0", "port"},
		{"node-1:http", "port"},
	} {
		err := validateAdvertise("advertise-http-addr", tc.addr)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.addr, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "advertise-http-addr")):
			t.Errorf("%q: got %v, want an error on advertise-http-addr saying %q", tc.addr, err, tc.want)
		}
	}
}

// A listener's relay address, what other nodes dial to relay to it: the
// bound address when its host is specific (it listens nowhere else), else
// the bound port on the advertised peer host, whatever the advertised
// client address says.
func TestRelayAddr(t *testing.T) {
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	for _, tc := range []struct {
		bound      net.Addr
		peer, want string
	}{
		{tcp("127.0.0.1:8080"), "127.0.0.1:7070", "127.0.0.1:8080"},
		{tcp("10.1.1.1:8080"), "node-1:7070", "10.1.1.1:8080"},
		{tcp("0.0.0.0:8080"), "node-1:7070", "node-1:8080"},
		{tcp("[::]:9090"), "node-1:17070", "node-1:9090"},
		{tcp("[::]:9090"), "[fd00::5]:7070", "[fd00::5]:9090"},
		{tcp("0.0.0.0:8080"), "10.0.0.7:7070", "10.0.0.7:8080"},
	} {
		if got := relayAddr(tc.bound, tc.peer); got != tc.want {
			t.Errorf("relayAddr(%v, %q) = %q, want %q", tc.bound, tc.peer, got, tc.want)
		}
	}
}
