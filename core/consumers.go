package core

// This file is the consumers a dispatcher may bind a queue's jobs to, as
// one choice of a dispatch pass sees them (a pool), and the choice for a
// job without an affinity key: the least loaded, this node's workers first.
// affinity.go chooses among the same consumers for a job with a key.

// consumerSlot is one consumer of a queue as the dispatcher sees it: a
// worker on this node, or a consumer on another node from the catalog view
// with the credits this dispatcher counts against it.
type consumerSlot struct {
	id string
	// w is set for a worker on this node, rc for a consumer on another.
	w    *Worker
	rc   *remoteConsumer
	caps Capabilities
	// zone is its node's zone as the cluster sees it.
	zone  string
	slots int
}

// load is how many jobs the consumer holds: every binding of a worker on
// this node, or the ones this dispatcher made on a remote consumer.
func (c *consumerSlot) load() int {
	if c.w != nil {
		return len(c.w.bindings)
	}
	return c.rc.bound
}

// free reports whether the consumer has a slot for one more job.
func (c *consumerSlot) free() bool { return c.load() < c.slots }

// consumerPool is every consumer a queue's jobs may be bound to now, whose
// node takes new work: this node's workers unless it drains, and those of
// routable nodes. A queue keeps one and refills it for each choice
// (poolLocked), so the dispatch path allocates none.
type consumerPool struct {
	all   []consumerSlot
	index map[string]int
}

// byID returns the consumer with id, nil if the pool has none.
func (p *consumerPool) byID(id string) *consumerSlot {
	if i, ok := p.index[id]; ok {
		return &p.all[i]
	}
	return nil
}

// poolLocked refills q's pool with its consumers and returns it; the
// consumers it holds are valid until the next call. Remote consumers get
// their credit counter (q.remote) made and their record refreshed.
func (e *Engine) poolLocked(q *queue) *consumerPool {
	p := &q.pool
	p.all = p.all[:0]
	if p.index == nil {
		p.index = map[string]int{}
	}
	clear(p.index)
	// A draining node offers its own workers nothing new (drain.go).
	if !e.draining {
		zone := e.selfZone()
		for _, w := range q.workers {
			if !w.gone {
				p.add(consumerSlot{id: w.ID, w: w, caps: w.Capabilities, zone: zone, slots: w.Concurrency})
			}
		}
	}
	if e.cluster == nil {
		return p
	}
	for _, c := range e.cat.Consumers(q.name) {
		if c.Node == e.cfg.Node || !e.cluster.Routable(c.Node) {
			continue
		}
		rc := q.remote[c.ID]
		if rc == nil {
			rc = &remoteConsumer{}
			q.remote[c.ID] = rc
		}
		rc.info = c
		p.add(consumerSlot{id: c.ID, rc: rc, caps: c.Capabilities, zone: e.cluster.NodeZone(c.Node), slots: max(c.Concurrency, 1)})
	}
	return p
}

func (p *consumerPool) add(c consumerSlot) {
	p.index[c.id] = len(p.all)
	p.all = append(p.all, c)
}

// registeredLocked reports whether a consumer of q is still registered,
// whether or not its node takes new work: a worker on this node, or a
// record in the catalog view.
func (e *Engine) registeredLocked(q *queue, id string) bool {
	for _, w := range q.workers {
		if w.ID == id && !w.gone {
			return true
		}
	}
	if e.cluster == nil {
		return false
	}
	for _, c := range e.cat.Consumers(q.name) {
		if c.ID == id {
			return true
		}
	}
	return false
}

// anyFree reports whether some consumer has a free slot.
func (p *consumerPool) anyFree() bool {
	for i := range p.all {
		if p.all[i].free() {
			return true
		}
	}
	return false
}

// canRun reports whether c may run t, free slot or not: it has the
// capabilities, is in the job's zone, and has not refused the job.
func (p *consumerPool) canRun(t *task, c *consumerSlot) bool {
	return !t.rejected[c.id] && zoneOK(t.d.Zone, c.zone) && c.caps.Satisfies(t.d.Capabilities)
}

// capable returns the consumers that may run t.
func (p *consumerPool) capable(t *task) []*consumerSlot {
	var out []*consumerSlot
	for i := range p.all {
		if c := &p.all[i]; p.canRun(t, c) {
			out = append(out, c)
		}
	}
	return out
}

// pick chooses a consumer for a job without an affinity key: a capable one
// with a free slot that has not refused it. Workers on this node come
// first (nothing touches the network), the least loaded of them; then
// consumers on other nodes, the least outstanding first.
func (p *consumerPool) pick(t *task) *consumerSlot {
	var local, remote *consumerSlot
	for i := range p.all {
		c := &p.all[i]
		if !c.free() || !p.canRun(t, c) {
			continue
		}
		best := &remote
		if c.w != nil {
			best = &local
		}
		if *best == nil || c.load() < (*best).load() {
			*best = c
		}
	}
	if local != nil {
		return local
	}
	return remote
}
