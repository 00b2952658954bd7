package catalog

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Metrics count what this node asks of etcd, on the client side, so that
// the load a node puts on the catalog is visible whether its etcd is an
// embedded member (whose in-process client bypasses etcd's own gRPC
// metrics) or external (docs/scale.md reads them).
type Metrics struct {
	requests    *prometheus.CounterVec
	watchEvents prometheus.Counter
	elections   prometheus.Counter
	rotations   prometheus.Counter
}

// Request kinds of switchyard_catalog_requests_total.
const (
	opGet       = "get"
	opPut       = "put"
	opDelete    = "delete"
	opTxn       = "txn"
	opGrant     = "lease_grant"
	opKeepAlive = "lease_keepalive"
	opRevoke    = "lease_revoke"
	opTTL       = "lease_timetolive"
)

// NewMetrics registers the catalog's metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_catalog_requests_total",
			Help: "Requests this node sent to etcd, by op: get, put, delete, txn (reads, claims and conditional writes), lease_grant, lease_keepalive, lease_revoke, lease_timetolive; each attempt counts.",
		}, []string{"op"}),
		watchEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_catalog_watch_events_total",
			Help: "Catalog changes (etcd watch events on /nodes/ and /q/) this node received and applied to its view.",
		}),
		elections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_catalog_elections_total",
			Help: "Dispatcher elections this node ran for a queue (each a read and, unless the record stands, a compare-and-swap).",
		}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_catalog_lease_rotations_total",
			Help: "Times this node moved its records to a new etcd lease after etcd elected a leader, so that a deposed leader cannot revoke them (docs/cluster.md).",
		}),
	}
	for _, op := range []string{opGet, opPut, opDelete, opTxn, opGrant, opKeepAlive, opRevoke, opTTL} {
		m.requests.WithLabelValues(op)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.watchEvents, m.elections, m.rotations)
	}
	return m
}

// instrument makes cli's key-value and lease calls count in m.
func (m *Metrics) instrument(cli *clientv3.Client) {
	cli.KV = countingKV{KV: cli.KV, m: m}
	cli.Lease = countingLease{Lease: cli.Lease, m: m}
}

func (m *Metrics) count(op string) { m.requests.WithLabelValues(op).Inc() }

type countingKV struct {
	clientv3.KV
	m *Metrics
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.m.count(opGet)
	return k.KV.Get(ctx, key, opts...)
}

func (k countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.m.count(opPut)
	return k.KV.Put(ctx, key, val, opts...)
}

func (k countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.m.count(opDelete)
	return k.KV.Delete(ctx, key, opts...)
}

// Txn counts when the transaction is built: every one the catalog builds
// is committed.
func (k countingKV) Txn(ctx context.Context) clientv3.Txn {
	k.m.count(opTxn)
	return k.KV.Txn(ctx)
}

type countingLease struct {
	clientv3.Lease
	m *Metrics
}

func (l countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	l.m.count(opGrant)
	return l.Lease.Grant(ctx, ttl)
}

func (l countingLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	l.m.count(opRevoke)
	return l.Lease.Revoke(ctx, id)
}

func (l countingLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	l.m.count(opKeepAlive)
	return l.Lease.KeepAliveOnce(ctx, id)
}

func (l countingLease) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	l.m.count(opTTL)
	return l.Lease.TimeToLive(ctx, id, opts...)
}
