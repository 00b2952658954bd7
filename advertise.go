package switchyard

import (
	"errors"
	"net"
	"strconv"

	"github.com/switchyard/switchyard/core"
)

// Advertised addresses: what a node tells others to dial, which is not
// always what it binds. A node bound to every interface (0.0.0.0, [::], or
// an empty host) listens on addresses nobody can dial as written; one
// behind NAT, in a container or in a pod is reached at an address it never
// binds. The node's catalog record carries the advertised addresses, so
// the cluster views, the web page's links and the peer transport (which
// dials a node at its record's peer address) all use them; relays use the
// relay addresses below.
//
// Default, per listener: the bound address when its host is specific (a
// port 0 bind resolves to the port the kernel picked); for a bind on every
// interface, the bound port on the address this host would use to reach
// others (hostAddress), never an unspecified one.

// Relay addresses: a node relays a keyed retry that reached it to the
// job's node over HTTP or gRPC (core/relay.go), and the advertised HTTP
// and gRPC addresses are for clients, which may reach a node where other
// nodes cannot (a port published on the client's loopback). So the record
// carries a second pair, the relay addresses, for nodes only, derived
// without a flag of their own: nodes already reach each other at the
// advertised peer address, so a listener bound on every interface is
// relayed to at the advertised peer host with its bound port; one bound to
// a specific host listens nowhere else, so it is relayed to as bound.
// That holds when nodes see each other's ports unmapped (one network, a
// container network, a pod network); where the port between nodes is
// mapped as well (the peer port is advertised as another one, behind NAT),
// the HTTP and gRPC ports must be reachable at the same number on the
// advertised peer host for relays to work.

// advertisedAddrs are the addresses in a node's catalog record.
type advertisedAddrs struct {
	http, grpc, peer     string
	relayHTTP, relayGRPC string
}

// relayAddr is the address other nodes relay to a listener bound at bound
// (port resolved) of a node advertising peer: bound when its host is
// specific, else the bound port on peer's host.
func relayAddr(bound net.Addr, peer string) string {
	tcp, ok := bound.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return bound.String()
	}
	host, _, err := net.SplitHostPort(peer)
	if err != nil {
		return bound.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(tcp.Port))
}

// validateAdvertise refuses an advertised address others could not dial:
// one without a port (or port 0: nothing listens there), or with an
// unspecified or empty host. Empty means "derive it" (advertiseAddr).
func validateAdvertise(flag, addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return &core.ConfigError{Field: flag, Value: addr, Err: errors.New("must be host:port, the address other nodes and clients dial")}
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return &core.ConfigError{Field: flag, Value: addr, Err: errors.New("needs the port others dial (1-65535): an advertised address names where the node is reached, so port 0 cannot be one")}
	}
	if unspecifiedHost(host) {
		return &core.ConfigError{Field: flag, Value: addr, Err: errors.New("must name a host others can dial, not an unspecified one (0.0.0.0, ::, or none): that is what the default replaces")}
	}
	return nil
}

// unspecifiedHost reports whether a listen host binds every interface.
func unspecifiedHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// advertiseAddr is the address to advertise for a listener bound at bound
// (its real address, port resolved): configured when set, else bound when
// its host is specific, else bound's port on the host's address (host).
func advertiseAddr(configured string, bound net.Addr, host func(v4only bool) net.IP) string {
	if configured != "" {
		return configured
	}
	tcp, ok := bound.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return bound.String()
	}
	// A listener on 0.0.0.0 takes IPv4 only; one on [::] (Go's dual-stack
	// default) both.
	ip := host(tcp.IP.To4() != nil)
	return net.JoinHostPort(ip.String(), strconv.Itoa(tcp.Port))
}

// hostAddress is the address this host would use to reach others: the
// source address of its default route, else the first global unicast
// address of an interface that is up, else loopback (a host with no
// network serves only itself). v4only restricts it to IPv4.
func hostAddress(v4only bool) net.IP {
	return pickHostAddress(v4only, routeSource, interfaceAddrs)
}

// pickHostAddress is hostAddress with its two sources given: route returns
// the source address of the default route for "udp4" or "udp6", addrs
// the interface addresses of interfaces that are up.
func pickHostAddress(v4only bool, route func(network string) (net.IP, error), addrs func() ([]net.IP, error)) net.IP {
	networks := []string{"udp4", "udp6"}
	if v4only {
		networks = networks[:1]
	}
	for _, nw := range networks {
		if ip, err := route(nw); err == nil && usableHost(ip, v4only) {
			return ip
		}
	}
	ips, _ := addrs()
	for _, want4 := range []bool{true, false} {
		if v4only && !want4 {
			break
		}
		for _, ip := range ips {
			if (ip.To4() != nil) == want4 && usableHost(ip, v4only) {
				return ip
			}
		}
	}
	if v4only {
		return net.IPv4(127, 0, 0, 1)
	}
	for _, ip := range ips {
		if ip.IsLoopback() && ip.To4() != nil {
			return ip
		}
	}
	for _, ip := range ips {
		if ip.IsLoopback() {
			return ip
		}
	}
	return net.IPv4(127, 0, 0, 1)
}

// usableHost: an address others can dial, of the right family. Link-local
// addresses need a zone to dial and are not routed: skipped.
func usableHost(ip net.IP, v4only bool) bool {
	return ip != nil && ip.IsGlobalUnicast() && (!v4only || ip.To4() != nil)
}

// routeSource returns the source address the kernel picks for the default
// route of network ("udp4" or "udp6"): a UDP "connect" to a documentation
// address sends nothing, it only looks the route up.
func routeSource(network string) (net.IP, error) {
	target := "192.0.2.1:9" // TEST-NET-1 (RFC 5737)
	if network == "udp6" {
		target = "[2001:db8::1]:9" // documentation prefix (RFC 3849)
	}
	c, err := net.Dial(network, target)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}

// interfaceAddrs returns the addresses of the interfaces that are up.
func interfaceAddrs() ([]net.IP, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 {
			continue
		}
		as, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				ips = append(ips, n.IP)
			}
		}
	}
	return ips, nil
}
