package catalog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// load reads both registries at a single revision, replaces the view with
// them and returns that revision. Watching from revision+1 then misses no
// change and repeats none.
func (c *Catalog) load(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	// One transaction, so both ranges are read at the same revision; two
	// Gets could straddle a write.
	resp, err := c.client.Txn(ctx).Then(
		clientv3.OpGet(nodesPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(queuesPrefix, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("load catalog: %w", err)
	}
	fresh := newView()
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			c.applyPut(fresh, kv)
		}
	}
	fresh.loadRev = resp.Header.Revision
	c.view.replaceWith(fresh)
	c.subs.notify()
	return resp.Header.Revision, nil
}

// applyPut applies one key's value to v (whose lock the caller holds, or
// which nobody else sees yet). A value that does not parse removes what the
// view held for that key: the store no longer holds that record. A
// dispatch record's epoch is the revision that wrote it.
func (c *Catalog) applyPut(v *view, kv *mvccpb.KeyValue) {
	key, value := string(kv.Key), kv.Value
	pk := parseKey(key)
	switch pk.kind {
	case kindNode:
		n, err := parseNode(pk.node, value)
		if err != nil {
			c.log.Debug("catalog: ignoring node record", "key", key, "err", err)
			v.deleteNode(pk.node)
			return
		}
		v.setNode(n)
	case kindDispatch:
		d, err := ParseDispatch(value)
		if err != nil {
			c.log.Debug("catalog: ignoring dispatch record", "key", key, "err", err)
			v.deleteDispatch(pk.queue, kv.ModRevision)
			return
		}
		d.Epoch = uint64(kv.ModRevision)
		v.setDispatch(pk.queue, d)
	case kindConsumer:
		cr, dropped, err := parseConsumer(pk.queue, pk.id, value)
		if err != nil {
			c.log.Debug("catalog: ignoring consumer record", "key", key, "err", err)
			v.deleteConsumer(pk.queue, pk.id)
			return
		}
		if len(dropped) > 0 {
			c.log.Debug("catalog: consumer record has capabilities this version cannot parse", "key", key, "dropped", dropped)
		}
		v.setConsumer(cr)
	default:
		c.log.Debug("catalog: ignoring key", "key", key)
	}
}

// applyDelete applies a key's deletion (kv's revision is the delete's).
func (c *Catalog) applyDelete(v *view, kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	pk := parseKey(key)
	switch pk.kind {
	case kindNode:
		v.deleteNode(pk.node)
	case kindDispatch:
		v.deleteDispatch(pk.queue, kv.ModRevision)
	case kindConsumer:
		v.deleteConsumer(pk.queue, pk.id)
	default:
		c.log.Debug("catalog: ignoring key", "key", key)
	}
}

// applyEvents applies one watch response's events under one lock, so
// readers never see half of a transaction, and wakes subscribers once.
func (c *Catalog) applyEvents(evs []*clientv3.Event) {
	if len(evs) == 0 {
		return
	}
	c.cfg.Metrics.watchEvents.Add(float64(len(evs)))
	c.view.mu.Lock()
	for _, ev := range evs {
		switch ev.Type {
		case mvccpb.PUT:
			c.applyPut(c.view, ev.Kv)
		case mvccpb.DELETE:
			c.applyDelete(c.view, ev.Kv)
		}
	}
	c.view.mu.Unlock()
	c.subs.notify()
}

// watchSet is the pair of watches (one per registry prefix) that keeps the
// view current.
type watchSet struct {
	nodes, queues clientv3.WatchChan
	cancel        context.CancelFunc
}

// startWatch watches both prefixes from rev and waits, bounded by waitCtx,
// until the server has created both watches. The watches live until runCtx
// ends or the returned cancel is called.
func (c *Catalog) startWatch(runCtx, waitCtx context.Context, rev int64) (*watchSet, error) {
	wctx, cancel := context.WithCancel(runCtx)
	ws := &watchSet{
		nodes:  c.client.Watch(wctx, nodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCreatedNotify()),
		queues: c.client.Watch(wctx, queuesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCreatedNotify()),
		cancel: cancel,
	}
	for _, ch := range []clientv3.WatchChan{ws.nodes, ws.queues} {
		if err := c.awaitCreated(waitCtx, ch); err != nil {
			cancel()
			return nil, fmt.Errorf("watch catalog from revision %d: %w", rev, err)
		}
	}
	return ws, nil
}

func (c *Catalog) awaitCreated(ctx context.Context, ch clientv3.WatchChan) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-ch:
			if !ok {
				return errors.New("watch closed before it was created")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			c.applyEvents(wr.Events)
			if wr.Created {
				return nil
			}
		}
	}
}

// watchLoop applies watch events to the view until ctx ends. A watch that
// fails (its revision compacted away, the connection lost for good) is
// replaced by a fresh load and a new watch from the loaded revision, so the
// view never silently stops following the store.
func (c *Catalog) watchLoop(ctx context.Context, ws *watchSet) {
	defer c.wg.Done()
	defer func() { ws.cancel() }()
	for {
		var (
			wr clientv3.WatchResponse
			ok bool
		)
		select {
		case <-ctx.Done():
			return
		case wr, ok = <-ws.nodes:
		case wr, ok = <-ws.queues:
		}
		if ok && wr.Err() == nil {
			c.applyEvents(wr.Events)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		var err error
		if ok {
			err = wr.Err()
		}
		c.log.Warn("catalog watch ended; reloading", "err", err)
		ws.cancel()
		next, rerr := c.rewatch(ctx)
		if rerr != nil {
			return // ctx ended
		}
		ws = next
	}
}

// rewatch reloads the view and restarts the watches, retrying with backoff
// until it succeeds or ctx ends.
func (c *Catalog) rewatch(ctx context.Context) (*watchSet, error) {
	backoff := 50 * time.Millisecond
	for {
		rev, err := c.load(ctx)
		if err == nil {
			wait, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
			var ws *watchSet
			ws, err = c.startWatch(ctx, wait, rev+1)
			cancel()
			if err == nil {
				return ws, nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		c.log.Warn("catalog reload failed; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}
