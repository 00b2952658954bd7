package catalog

import (
	"maps"
	"slices"
	"sync"

	"github.com/switchyard/switchyard/internal/chans"

	"github.com/switchyard/switchyard/core"
)

// view is the in-memory copy of the registries that reads are served from.
// Records are stored as parsed. Readers get copies of nodes and dispatch
// records; a queue's consumers they get as a shared, immutable snapshot
// (snaps), which they must not modify.
type view struct {
	mu        sync.RWMutex
	nodes     map[string]core.NodeInfo
	dispatch  map[string]core.DispatchInfo
	consumers map[string]map[string]core.ConsumerInfo // queue → id → record
	// snaps holds, per queue, the answer consumersOf last built: the
	// queue's records sorted by id, their capabilities copied from the
	// stored records. It is immutable once built and shared by every
	// reader; any change to the queue's consumers drops it (copy on
	// write), and the next read builds a fresh one. Only queues with
	// consumers have one, so names nobody consumes never fill it.
	snaps map[string][]core.ConsumerInfo
	// left holds the nodes whose record this view saw deleted (and not
	// written again since): their death is proven. A node with no record
	// that is not in left is only not seen yet — another member of the
	// catalog may have written its record a moment before this view
	// applies it — and is not dead.
	left map[string]bool
	// dispatchRev is the revision of the last write or delete of each
	// queue's dispatch record the view applied, and loadRev the revision
	// the view was last loaded at: a record absent from the view was
	// deleted no later than that.
	dispatchRev map[string]int64
	loadRev     int64
	// claims are this node's own won claims the watch has not delivered
	// yet, by queue (Epoch set): until it does, this node knows it
	// dispatches the queue and the view does not say so.
	claims map[string]core.DispatchInfo
}

func newView() *view {
	return &view{
		nodes:       map[string]core.NodeInfo{},
		dispatch:    map[string]core.DispatchInfo{},
		consumers:   map[string]map[string]core.ConsumerInfo{},
		snaps:       map[string][]core.ConsumerInfo{},
		left:        map[string]bool{},
		dispatchRev: map[string]int64{},
		claims:      map[string]core.DispatchInfo{},
	}
}

// replaceWith swaps in the contents of fresh (a view built by a full load).
func (v *view) replaceWith(fresh *view) {
	v.mu.Lock()
	defer v.mu.Unlock()
	// A node the reload no longer has left while the watch was broken.
	for id := range v.nodes {
		if _, ok := fresh.nodes[id]; !ok {
			v.left[id] = true
		}
	}
	for id := range fresh.nodes {
		delete(v.left, id)
	}
	v.nodes, v.dispatch, v.consumers = fresh.nodes, fresh.dispatch, fresh.consumers
	v.snaps = map[string][]core.ConsumerInfo{}
	v.dispatchRev, v.loadRev = fresh.dispatchRev, fresh.loadRev
	for q, cl := range v.claims {
		if int64(cl.Epoch) <= v.loadRev {
			delete(v.claims, q)
		}
	}
}

// The setters below are called with v.mu held for writing (or on a view no
// one else can see yet).

func (v *view) setNode(n core.NodeInfo) {
	v.nodes[n.ID] = n
	delete(v.left, n.ID)
}

func (v *view) deleteNode(id string) {
	if _, ok := v.nodes[id]; ok {
		v.left[id] = true
	}
	delete(v.nodes, id)
}

// setDispatch applies a write of queue's dispatch record (d.Epoch is its
// revision).
func (v *view) setDispatch(queue string, d core.DispatchInfo) {
	v.dispatch[queue] = d
	v.appliedDispatchLocked(queue, int64(d.Epoch))
}

// deleteDispatch applies the deletion of queue's dispatch record at rev.
func (v *view) deleteDispatch(queue string, rev int64) {
	delete(v.dispatch, queue)
	v.appliedDispatchLocked(queue, rev)
}

func (v *view) appliedDispatchLocked(queue string, rev int64) {
	v.dispatchRev[queue] = max(v.dispatchRev[queue], rev)
	if cl, ok := v.claims[queue]; ok && int64(cl.Epoch) <= v.dispatchRev[queue] {
		delete(v.claims, queue)
	}
}

// noteClaim records this node's won claim of queue at d.Epoch, unless the
// view has applied that revision (or a later one) already.
func (v *view) noteClaim(queue string, d core.DispatchInfo) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if int64(d.Epoch) > max(v.dispatchRev[queue], v.loadRev) {
		v.claims[queue] = d
	}
}

func (v *view) setConsumer(c core.ConsumerInfo) {
	q := v.consumers[c.Queue]
	if q == nil {
		q = map[string]core.ConsumerInfo{}
		v.consumers[c.Queue] = q
	}
	q[c.ID] = c
	delete(v.snaps, c.Queue)
}

func (v *view) deleteConsumer(queue, id string) {
	q := v.consumers[queue]
	delete(q, id)
	delete(v.snaps, queue)
	// Drop the empty map so Queues no longer lists a queue whose last
	// consumer left (unless it still has a dispatch record).
	if len(q) == 0 {
		delete(v.consumers, queue)
	}
}

func cloneConsumer(c core.ConsumerInfo) core.ConsumerInfo {
	caps := make(core.Capabilities, len(c.Capabilities))
	for k, vs := range c.Capabilities {
		caps[k] = slices.Clone(vs)
	}
	c.Capabilities = caps
	return c
}

// consumersOf returns queue's snapshot (see snaps), building it when a
// change dropped it. The slice and the records' capabilities are shared by
// every caller and must not be modified.
func (v *view) consumersOf(queue string) []core.ConsumerInfo {
	v.mu.RLock()
	out, ok := v.snaps[queue]
	empty := len(v.consumers[queue]) == 0
	v.mu.RUnlock()
	if ok || empty {
		return out
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if out, ok := v.snaps[queue]; ok {
		return out
	}
	q := v.consumers[queue]
	if len(q) == 0 {
		return nil
	}
	out = make([]core.ConsumerInfo, 0, len(q))
	for _, id := range slices.Sorted(maps.Keys(q)) {
		out = append(out, cloneConsumer(q[id]))
	}
	// Full: an append by a caller that ignored the contract reallocates
	// instead of writing into this array.
	out = slices.Clip(out)
	v.snaps[queue] = out
	return out
}

func (v *view) allNodes() []core.NodeInfo {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if len(v.nodes) == 0 {
		return nil
	}
	out := make([]core.NodeInfo, 0, len(v.nodes))
	for _, id := range slices.Sorted(maps.Keys(v.nodes)) {
		out = append(out, v.nodes[id])
	}
	return out
}

func (v *view) node(id string) (core.NodeInfo, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n, ok := v.nodes[id]
	return n, ok
}

// hasLeft reports whether the node's record was seen deleted.
func (v *view) hasLeft(id string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.left[id]
}

// dispatchOf is queue's dispatch record: this node's own claim while the
// view has not applied it, the view's record otherwise.
func (v *view) dispatchOf(queue string) (core.DispatchInfo, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if cl, ok := v.claims[queue]; ok {
		return cl, true
	}
	d, ok := v.dispatch[queue]
	return d, ok
}

func (v *view) queues() []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	set := make(map[string]struct{}, len(v.dispatch)+len(v.consumers))
	for q := range v.dispatch {
		set[q] = struct{}{}
	}
	for q := range v.consumers {
		set[q] = struct{}{}
	}
	return slices.Sorted(maps.Keys(set))
}

// subscribers are the channels Catalog.Watch hands out.
type subscribers struct {
	mu   sync.Mutex
	next int
	m    map[int]chan struct{}
}

func (s *subscribers) add() (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[int]chan struct{}{}
	}
	id := s.next
	s.next++
	ch := make(chan struct{}, 1)
	s.m[id] = ch
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.m, id)
	}
}

// notify wakes every subscriber without blocking: a subscriber that has not
// consumed the previous wake-up still has one pending, which is all it needs
// to re-read the view.
func (s *subscribers) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.m {
		chans.Notify(ch)
	}
}

// related returns the nodes the view ties to node: the dispatchers of the
// queues node hosts a consumer of, and the nodes hosting consumers of the
// queues node dispatches (its own claims not yet watched included).
func (v *view) related(node string) map[string]bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := map[string]bool{}
	for queue, cs := range v.consumers {
		d, ok := v.claims[queue]
		if !ok {
			d, ok = v.dispatch[queue]
		}
		if !ok {
			continue
		}
		for _, c := range cs {
			switch {
			case d.Dispatcher == node:
				out[c.Node] = true
			case c.Node == node:
				out[d.Dispatcher] = true
			}
		}
	}
	delete(out, node)
	return out
}
