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

// HandOver moves queue's dispatch record from this node to node to, as this
// node leaves (core.Cluster.Resign). The record is rewritten to name to,
// with its reply_to and zone kept, and attached to to's lease (the lease
// to's own node record lives on), so it stands exactly as if to had won
// the election itself: it vanishes with to, and to may release it. That
// leaves no moment with the queue unclaimed, when a node that only
// produces to the queue would claim it (Elect) before a consumer's node.
//
// It moves only a record that is still this node's (on its lease) and a
// target whose record, read in the same transaction, says online and is
// unchanged when the write commits. It returns false, and changes nothing,
// when either does not hold or to's lease is gone by then; the caller
// releases the record instead.
func (c *Catalog) HandOver(ctx context.Context, queue, to string) (bool, error) {
	if !core.ValidName(queue) {
		return false, fmt.Errorf("hand over: queue %q is not 1-128 of [A-Za-z0-9._-]", queue)
	}
	if to == c.cfg.Name {
		return false, fmt.Errorf("hand over %s: to this node itself", queue)
	}
	if c.held().isLost() {
		return false, fmt.Errorf("hand over %s: %w", queue, ErrLeaseLost)
	}
	key, nodeKey := DispatchKey(queue), NodeKey(to)
	// The read judges the record by this node's lease; the write must
	// not see it rotated in between.
	c.rot.RLock()
	defer c.rot.RUnlock()
	rctx, cancel := c.writeCtx(ctx)
	defer cancel()
	read, err := c.client.Txn(rctx).Then(clientv3.OpGet(key), clientv3.OpGet(nodeKey)).Commit()
	if err != nil {
		return false, fmt.Errorf("hand over %s: read records: %w", queue, err)
	}
	cur, target := firstKV(read, 0), firstKV(read, 1)
	if cur == nil || clientv3.LeaseID(cur.Lease) != c.held().leaseID() || target == nil || target.Lease == 0 {
		return false, nil
	}
	if n, err := parseNode(to, target.Value); err != nil || n.State != core.StateOnline {
		return false, nil
	}
	info, err := ParseDispatch(cur.Value)
	if err != nil {
		// Garbage under this node's lease: nothing worth keeping.
		info = core.DispatchInfo{}
	}
	info.Dispatcher = to
	val, err := EncodeDispatch(info)
	if err != nil {
		return false, fmt.Errorf("hand over %s: %w", queue, err)
	}
	wctx, wcancel := c.writeCtx(ctx)
	defer wcancel()
	resp, err := c.client.Txn(wctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision),
			clientv3.Compare(clientv3.ModRevision(nodeKey), "=", target.ModRevision)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(target.Lease)))).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// to's lease expired between the read and the write: it is
			// leaving too.
			return false, nil
		}
		return false, fmt.Errorf("hand over %s to %s: %w", queue, to, err)
	}
	c.log.Debug("catalog: handed dispatcher over", "queue", queue, "to", to, "done", resp.Succeeded)
	return resp.Succeeded, nil
}

// firstKV is the first key-value of the i-th response of a read
// transaction, nil when that read found nothing.
func firstKV(resp *clientv3.TxnResponse, i int) *mvccpb.KeyValue {
	kvs := resp.Responses[i].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}
