package catalog

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/core"
)

// Claim is the ground on which a node asks to dispatch a queue: whether it
// hosts one of the queue's consumers or only produces to it. The dispatcher
// belongs at an endpoint of the route, and the consumer's end is the one that
// serves every producer at once, so a consumer's claim is the stronger.
type Claim int

const (
	// ClaimConsumer: this node hosts a consumer of the queue. It claims at
	// once, and takes over from a dispatcher that hosts none of the queue's
	// consumers.
	ClaimConsumer Claim = iota
	// ClaimProducer: this node only produces to the queue. It claims only an
	// unclaimed queue (or a void record).
	ClaimProducer
)

func (c Claim) String() string {
	switch c {
	case ClaimConsumer:
		return "consumer"
	case ClaimProducer:
		return "producer"
	default:
		return fmt.Sprintf("Claim(%d)", int(c))
	}
}

// ErrElectContended is returned by Elect when the dispatch record kept
// changing under it for maxElectRounds compare-and-swap attempts and the
// record it last read is void or absent. The caller may retry, or fall back to routing
// without a dispatcher.
var ErrElectContended = errors.New("catalog: dispatcher election contended")

// maxElectRounds bounds Elect's compare-and-swap attempts. Each failed
// attempt means another node wrote the record in between; after the first,
// Elect judges the winner's record by the same rules and tries again only if
// they say so, so more than a couple of rounds means nodes are churning.
const maxElectRounds = 4

// verdict is what Elect decided about the record it read.
type verdict int

const (
	adopt     verdict = iota // the record stands
	unclaimed                // no record: claim
	void                     // names a node that is not Online, or does not parse: claim
	takeover                 // a consumer's node takes over from a dispatcher hosting none
	reLease                  // names this node but is not on its lease: rewrite it onto the lease
)

func (v verdict) String() string {
	return [...]string{"adopt", "unclaimed", "void", "takeover", "re-lease"}[v]
}

// Elect runs the claim rules for queue on behalf of this node and returns the
// dispatch record in force afterwards (this node's or another's).
//
// The rules, applied to the record read from the store with a linearizable
// read of /q/{queue}:
//
//   - No record: either claim takes it.
//   - A record that does not parse, or names a node that is not Online (its
//     /nodes record missing or in another state), is void: either claim
//     re-elects it.
//   - A record naming another Online node stands against ClaimProducer.
//     Against ClaimConsumer it stands only if that node hosts a consumer of
//     the queue; otherwise this node takes over.
//   - A record naming this node stands; one that is not attached to this
//     node's lease (a legacy record, say) is rewritten onto it.
//
// Node states and consumer records are taken from the watched view; when the
// view says to claim over an existing record, that is confirmed by a
// linearizable read of the named node's record and the queue's consumers
// first, so a view that lags behind a node that just came online or just
// registered a consumer does not take a live record from it.
//
// A claim writes {dispatcher: this node} with the previous record's reply_to
// and zone (the link belongs to the queue, not to its dispatcher), under this
// node's lease so that the record vanishes with the node. The write is one
// transaction that succeeds only if the record is still the one read (or
// still absent), so of several nodes claiming at once exactly one writes;
// a loser judges the winner's record by the same rules, adopting it or (if
// the rules say so) trying again, at most maxElectRounds writes in all.
//
// A consumer's node should publish its consumer record before electing with
// ClaimConsumer, and every node its Online node record, so that others judge
// its claim as it intends. Elect fails with ErrLeaseLost once the lease is
// lost: a fenced node must not claim anything.
func (c *Catalog) Elect(ctx context.Context, queue string, claim Claim) (core.DispatchInfo, error) {
	if !core.ValidName(queue) {
		return core.DispatchInfo{}, fmt.Errorf("elect: queue %q is not 1-128 of [A-Za-z0-9._-]", queue)
	}
	if claim != ClaimConsumer && claim != ClaimProducer {
		return core.DispatchInfo{}, fmt.Errorf("elect %s: unknown claim %v", queue, claim)
	}
	if c.held().isLost() {
		return core.DispatchInfo{}, fmt.Errorf("elect %s: %w", queue, ErrLeaseLost)
	}
	c.cfg.Metrics.elections.Inc()
	key := DispatchKey(queue)
	kv, err := c.getKey(ctx, key)
	if err != nil {
		return core.DispatchInfo{}, fmt.Errorf("elect %s: read dispatch record: %w", queue, err)
	}
	for round := 1; ; round++ {
		cur, v, err := c.judge(ctx, queue, kv, claim)
		if err != nil {
			return core.DispatchInfo{}, fmt.Errorf("elect %s: %w", queue, err)
		}
		if v == adopt {
			return cur, nil
		}
		if round > maxElectRounds {
			if v == takeover || v == reLease {
				// Not where this claim would put it, but a live record
				// naming an Online node: it is the one in force.
				return cur, nil
			}
			return core.DispatchInfo{}, fmt.Errorf("elect %s: record still %s after %d attempts: %w", queue, v, maxElectRounds, ErrElectContended)
		}
		// The previous record's link and zone survive whoever dispatches.
		next := core.DispatchInfo{Dispatcher: c.cfg.Name, ReplyTo: cur.ReplyTo, Zone: cur.Zone}
		rev, winner, err := c.casDispatch(ctx, key, kv, next)
		if err != nil {
			return core.DispatchInfo{}, fmt.Errorf("elect %s: %w", queue, err)
		}
		if rev > 0 {
			// The claim's revision is its epoch. The view learns of it
			// from the watch a moment later; until then Dispatch answers
			// with the claim.
			next.Epoch = uint64(rev)
			c.view.noteClaim(queue, next)
			c.log.Debug("catalog: claimed dispatcher", "queue", queue, "claim", claim, "reason", v,
				"previous", cur.Dispatcher, "reply_to", next.ReplyTo, "zone", next.Zone, "epoch", next.Epoch, "round", round)
			return next, nil
		}
		c.log.Debug("catalog: dispatcher claim lost a race; judging the winner's record", "queue", queue, "claim", claim, "round", round)
		kv = winner
	}
}

// judge applies the claim rules to kv, the dispatch record as read (nil if
// absent). It returns the record as parsed (zero if absent or garbage) and
// the verdict.
func (c *Catalog) judge(ctx context.Context, queue string, kv *mvccpb.KeyValue, claim Claim) (core.DispatchInfo, verdict, error) {
	if kv == nil {
		return core.DispatchInfo{}, unclaimed, nil
	}
	cur, err := ParseDispatch(kv.Value)
	if err != nil {
		c.log.Debug("catalog: dispatch record does not parse; void", "queue", queue, "err", err)
		return core.DispatchInfo{}, void, nil
	}
	cur.Epoch = uint64(kv.ModRevision)
	d := cur.Dispatcher
	if d == c.cfg.Name {
		// This node is alive (its lease is not lost, Elect checked), whatever
		// state its own record is in.
		if clientv3.LeaseID(kv.Lease) == c.held().leaseID() {
			return cur, adopt, nil
		}
		return cur, reLease, nil
	}
	// The view first: most elections adopt, and need no more reads.
	online := false
	if n, ok := c.view.node(d); ok && n.State == core.StateOnline && c.reachable(d) {
		online = true
	}
	if online && (claim == ClaimProducer || hostsConsumer(c.view.consumersOf(queue), d)) {
		return cur, adopt, nil
	}
	// The view says to claim over d. Confirm against the store.
	online, hosts, err := c.confirm(ctx, queue, d)
	if err != nil {
		return core.DispatchInfo{}, adopt, err
	}
	online = online && c.reachable(d)
	switch {
	case !online:
		return cur, void, nil
	case claim == ClaimProducer || hosts:
		c.log.Debug("catalog: view lags the store; dispatch record stands", "queue", queue, "dispatcher", d)
		return cur, adopt, nil
	default:
		return cur, takeover, nil
	}
}

// SetReachable installs this node's own verdict on its peers (the peer
// tracker's: a node that misses its pings is spare here). Elect treats a
// record naming a node this node cannot reach like one naming a node that
// is not online: void. It is a local verdict, so two nodes that disagree
// about a third may each claim over it; the transaction still leaves one
// record, and the cost of a wrong claim is an extra hop, never a lost job.
func (c *Catalog) SetReachable(f func(node string) bool) { c.reach.Store(&f) }

func (c *Catalog) reachable(node string) bool {
	if f := c.reach.Load(); f != nil {
		return (*f)(node)
	}
	return true
}

func hostsConsumer(cs []core.ConsumerInfo, node string) bool {
	for _, ci := range cs {
		if ci.Node == node {
			return true
		}
	}
	return false
}

// confirm reads node's record and queue's consumer records from the store, in
// one linearizable read, and reports whether node is Online and whether it
// hosts a consumer of queue.
func (c *Catalog) confirm(ctx context.Context, queue, node string) (online, hosts bool, err error) {
	rctx, cancel := c.writeCtx(ctx)
	defer cancel()
	resp, err := c.client.Txn(rctx).Then(
		clientv3.OpGet(NodeKey(node)),
		clientv3.OpGet(ConsumerKey(queue, ""), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return false, false, fmt.Errorf("read node %s and consumers: %w", node, err)
	}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		n, err := parseNode(node, kv.Value)
		online = err == nil && n.State == core.StateOnline
	}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		pk := parseKey(string(kv.Key))
		if pk.kind != kindConsumer || pk.queue != queue {
			continue
		}
		if ci, _, err := parseConsumer(pk.queue, pk.id, kv.Value); err == nil && ci.Node == node {
			hosts = true
			break
		}
	}
	return online, hosts, nil
}

// getKey reads one key linearizably; nil if it is absent.
func (c *Catalog) getKey(ctx context.Context, key string) (*mvccpb.KeyValue, error) {
	rctx, cancel := c.writeCtx(ctx)
	defer cancel()
	resp, err := c.client.Get(rctx, key)
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0], nil
}

// casDispatch writes next to key under this node's lease if key is still
// prev (the same modification revision, or still absent when prev is nil),
// and returns the write's revision. Otherwise it returns 0 and the record
// that is there now (nil if absent).
func (c *Catalog) casDispatch(ctx context.Context, key string, prev *mvccpb.KeyValue, next core.DispatchInfo) (rev int64, now *mvccpb.KeyValue, err error) {
	c.rot.RLock()
	defer c.rot.RUnlock()
	l := c.held()
	if l.isLost() {
		return 0, nil, fmt.Errorf("claim %s: %w", key, ErrLeaseLost)
	}
	val, err := EncodeDispatch(next)
	if err != nil {
		return 0, nil, err
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	if prev != nil {
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", prev.ModRevision)
	}
	wctx, cancel := c.writeCtx(ctx)
	defer cancel()
	resp, err := c.client.Txn(wctx).
		If(cmp).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(l.leaseID()))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.fenceLease(l, "lease not found on write")
			return 0, nil, fmt.Errorf("claim %s: %w: %w", key, ErrLeaseLost, err)
		}
		return 0, nil, fmt.Errorf("claim %s: %w", key, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		return 0, kvs[0], nil
	}
	return 0, nil, nil
}

// Release deletes queue's dispatch record if it is still this node's: still
// attached to this node's lease. A record that is gone, or that another node
// has since claimed, is left alone and is not an error. It is for queue
// teardown and relocation; a node that stops need not call it, since its
// records go with its lease.
func (c *Catalog) Release(ctx context.Context, queue string) error {
	if !core.ValidName(queue) {
		return fmt.Errorf("release: queue %q is not 1-128 of [A-Za-z0-9._-]", queue)
	}
	key := DispatchKey(queue)
	c.rot.RLock()
	defer c.rot.RUnlock()
	wctx, cancel := c.writeCtx(ctx)
	defer cancel()
	resp, err := c.client.Txn(wctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", c.held().leaseID())).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return fmt.Errorf("release %s: %w", queue, err)
	}
	c.log.Debug("catalog: release dispatcher", "queue", queue, "deleted", resp.Succeeded)
	return nil
}
