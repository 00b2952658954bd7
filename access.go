package switchyard

import (
	"net/url"

	"github.com/switchyard/switchyard/auth"
	"github.com/switchyard/switchyard/internal/netaddr"
)

// openAuth loads the node's API keys, and says in its log who may call it
// and, for an external etcd reached over http://, who may read its catalog.
func (n *Node) openAuth() (err error) {
	log := n.log.With("system", "auth")
	if n.keys, err = auth.Open(n.cfg.Auth, log); err != nil {
		return err
	}
	switch {
	case n.keys.Enabled():
	case n.cfg.AllowAnonymous && !(netaddr.IsLoopback(n.cfg.HTTPAddr) && netaddr.IsLoopback(n.cfg.GRPCAddr)):
		log.Warn("no API keys and --allow-anonymous: anyone who reaches the HTTP or gRPC port may submit to, and serve, any queue",
			"http", n.cfg.HTTPAddr, "grpc", n.cfg.GRPCAddr)
	default:
		log.Info("no API keys: anonymous calls are accepted, on loopback addresses only (--auth-file to check keys)")
	}
	for _, ep := range n.cfg.EtcdEndpoints {
		if u, err := url.Parse(ep); err == nil && u.Scheme == "http" && !netaddr.IsLoopback(u.Host) {
			n.log.Warn("an external etcd endpoint over http: the catalog (every node's and queue's record) travels in plaintext, and anyone who reaches the endpoint reads and writes it unless etcd checks users; use https:// (--etcd-tls-*)",
				"system", "catalog", "endpoint", ep)
		}
	}
	return nil
}

// ReloadAuth reads the node's key file again (the node's answer to
// SIGHUP). A file that does not read or parse keeps the keys in use; the
// error says why, and is logged.
func (n *Node) ReloadAuth() error {
	if err := n.keys.Reload(); err != nil {
		n.log.Error("api keys not reloaded; the previous keys stay in use", "system", "auth", "err", err)
		return err
	}
	return nil
}
