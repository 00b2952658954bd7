package switchyard

import (
	"net"
	"net/http"
	"sync"
)

// unusedConns tracks the public HTTP server's connections that have not
// yet sent a request. http.Server.Shutdown counts such a connection as
// active until it is 5 seconds old (Go issue 22682): an HTTP client that
// dialed one connection more than it used (its pool raced a request) would
// hold a node's shutdown past its bound. Close closes them first; a client
// whose request was still on the way gets a connection error, as it would
// from a node that is going away.
type unusedConns struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (u *unusedConns) track(c net.Conn, s http.ConnState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if s == http.StateNew {
		if u.conns == nil {
			u.conns = map[net.Conn]struct{}{}
		}
		u.conns[c] = struct{}{}
		return
	}
	delete(u.conns, c)
}

func (u *unusedConns) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		c.Close()
	}
	clear(u.conns)
}
