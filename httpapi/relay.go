package httpapi

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"

	"github.com/switchyard/switchyard/core"
)

// Relays (core/relay.go): a retried submission whose Idempotency-Key made
// a job on another node is handed to that node, which answers with the
// same job — its 200 document, or its stream for a client that asked for
// one. This node only copies the exchange, as a reverse proxy
// (net/http/httputil).

// RelayHeader marks a relayed request with the relaying node: a node
// never relays a request that was relayed to it (no loops).
const RelayHeader = "X-Switchyard-Relayed-By"

// newRelayTransport is the HTTP client side of relays: TLS with tc when
// the nodes serve it. No connection is kept: relays are rare (retries
// that changed node), and an idle connection is a goroutine with no owner.
func newRelayTransport(tc *tls.Config) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	tr.DisableKeepAlives = true
	return tr
}

// relaySubmit hands r, a submission whose body was read into body, to the
// node where the key's job lives.
func (s *Server) relaySubmit(w http.ResponseWriter, r *http.Request, jw *core.JobElsewhere, body []byte) {
	addr, err := core.RelayTarget(s.cfg.Cluster, jw, r.Header.Get(RelayHeader), core.NodeInfo.RelayHTTP)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	scheme := "http"
	if s.cfg.RelayTLS != nil {
		scheme = "https"
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = scheme, addr, addr
			pr.Out.Body = io.NopCloser(bytes.NewReader(body))
			pr.Out.ContentLength = int64(len(body))
			pr.Out.Header.Set("Content-Length", strconv.Itoa(len(body)))
			pr.Out.Header.Set(RelayHeader, s.e.Config().Node)
			// The CORS headers of the answer are this node's, set already:
			// the other node must add none.
			pr.Out.Header.Del("Origin")
		},
		Transport: s.relay,
		// A stream is copied event by event.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.Warn("relay a keyed submission", "node", jw.Node, "job", jw.Job, "err", err)
			s.writeError(w, r, core.RelayUnreachable(jw))
		},
	}
	proxy.ServeHTTP(w, r)
}
