// Package netaddr holds what the node, its catalog and the binary decide
// about a host:port address alike.
package netaddr

import "net"

// IsLoopback reports whether hostport ("host:port", a listen address or
// the host of a URL) names loopback only: 127.0.0.0/8, ::1 or localhost.
// An empty host, 0.0.0.0 and :: are every interface, any other name could
// resolve anywhere, and an address that is not host:port is not loopback.
func IsLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
