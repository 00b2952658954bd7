package core

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// This file is affinity routing: jobs with the same affinity key go to the
// same capable consumer while it lives and has room, by consistent hashing
// with bounded loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent
// Hashing with Bounded Loads", 2018) in its rendezvous form:
//
//   - A key's order of consumers is rendezvous (highest random weight)
//     hashing over the consumers that can run the job, weighted by their
//     slots: each consumer scores slots / −ln(u), u a uniform number in
//     (0, 1) hashed from (key, consumer id), highest first. It is a pure
//     function of the key and the consumers' ids and slots, so every node
//     computes the same order, whichever dispatches the queue (a queue has
//     one dispatcher at a time, but it can move: docs/cluster.md). A
//     consumer that joins takes only the keys it now scores highest for,
//     and one that leaves gives up only its own: the rest stay.
//   - A job goes to the first consumer in its key's order that has room:
//     whose jobs — running, and waiting for it — would be at most its slots
//     plus ⌈c × (H+1) × slots / S⌉, where H is what all the job's capable
//     consumers hold, S their slots and c the node's
//     --affinity-load-factor. Past its slots a consumer's queue stays
//     within c times the average per slot (Mirrokni's bound), plus one
//     round of its slots so that a key's worker is worth waiting for when
//     the queue is short: a hot key spills to its next consumers instead of
//     piling up on one. Some consumer always has room (were none, their
//     loads would add up to more than H).
//   - That consumer is the job's target while it waits: it waits for a
//     free slot there. A job that has waited --affinity-wait while another
//     capable consumer has a free slot goes to the first such in its key's
//     order (fairqueue.go nextLocked): a free slot idles at most that long
//     while a job it can run waits.
//
// Every binding of a job with a key is counted in
// switchyard_dispatch_affinity_total by result (affinityResultLocked).

// affinityTask is a task's affinity state on the dispatcher.
type affinityTask struct {
	// hash is the key's hash (keyHash); 0 until targeted.
	hash uint64
	// target is the consumer the job waits for, first the first in its
	// key's order when it was targeted.
	target, first string
}

// affinityQueue is a queue's affinity state on its dispatcher.
type affinityQueue struct {
	// targeted counts, by consumer, the waiting jobs whose target it is:
	// part of its load under the bound.
	targeted map[string]int
	// last remembers which consumer each key's latest job went to, for
	// the miss reasons (affinityResultLocked); bounded (keyMemory).
	last keyMemory
	// spill dispatches the queue again at spillAt, when a job that waits
	// for its consumer may go to another (AffinityWait).
	spill   *time.Timer
	spillAt time.Time
}

// keyMemory maps key hashes to consumer ids, at most 2 × keyMemorySize
// of them: two generations, the older dropped whole when the newer fills.
type keyMemory struct {
	cur, old map[uint64]string
}

const keyMemorySize = 8192

func (m *keyMemory) get(h uint64) (string, bool) {
	if id, ok := m.cur[h]; ok {
		return id, true
	}
	id, ok := m.old[h]
	return id, ok
}

func (m *keyMemory) put(h uint64, id string) {
	if m.cur == nil || len(m.cur) >= keyMemorySize {
		m.old, m.cur = m.cur, make(map[uint64]string, 64)
	}
	m.cur[h] = id
}

// Affinity results, the label of switchyard_dispatch_affinity_total.
const (
	// AffinityHit: the job went to the first consumer of its key's order
	// (one that joined and comes first takes the key with a hit).
	AffinityHit = "hit"
	// AffinityFull: the first consumer of the key's order had no room
	// (over the load bound), or no free slot within AffinityWait while
	// another had one.
	AffinityFull = "full"
	// AffinityGone: the consumer the key's jobs went to before has left.
	AffinityGone = "gone"
	// AffinityNoneCapable: the consumer the key's jobs went to before is
	// there but cannot run this job: it lacks a capability, is outside the
	// job's zone, refused the job, or its node takes no new work (not
	// routable, draining).
	AffinityNoneCapable = "none_capable"
)

// keyHash is a key's (or a consumer id's) 64-bit FNV-1a hash: the same
// on every node and version (the order of consumers depends on it). It is
// hash/fnv's New64a written out, which allocates nothing.
func keyHash(key string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := range len(key) {
		h ^= uint64(key[i])
		h *= prime
	}
	return h
}

// affinityScore is consumer id's rendezvous score for a key: slots /
// −ln(u), u in (0, 1) from the key's hash and the id's. Equal slots
// compare as the hashes do; more slots win proportionally more keys.
func affinityScore(key uint64, id string, slots int) float64 {
	u := float64(mix64(key^mix64(keyHash(id)))>>11)/(1<<53) + 0.5/(1<<53)
	return float64(max(slots, 1)) / -math.Log(u)
}

// mix64 is splitmix64's finalizer: every bit of x moves every bit of the
// result.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// affinityOrder returns cands in the key's order, best first (ties, as
// good as impossible, by id).
func affinityOrder(key uint64, cands []*consumerSlot) []*consumerSlot {
	type scored struct {
		c *consumerSlot
		s float64
	}
	sc := make([]scored, len(cands))
	for i, c := range cands {
		sc[i] = scored{c, affinityScore(key, c.id, c.slots)}
	}
	slices.SortFunc(sc, func(a, b scored) int {
		if c := cmp.Compare(b.s, a.s); c != 0 {
			return c
		}
		return cmp.Compare(a.c.id, b.c.id)
	})
	out := make([]*consumerSlot, len(sc))
	for i, s := range sc {
		out[i] = s.c
	}
	return out
}

// AffinityOrder is the order of consumers (ids, with their slots) for
// jobs with key, the one they go to while it has room first: the pure
// function every dispatcher computes, whichever node it is on.
func AffinityOrder(key string, slots map[string]int) []string {
	cands := make([]*consumerSlot, 0, len(slots))
	for id, n := range slots {
		cands = append(cands, &consumerSlot{id: id, slots: n})
	}
	out := make([]string, 0, len(cands))
	for _, c := range affinityOrder(keyHash(key), cands) {
		out = append(out, c.id)
	}
	return out
}

// affinityPlaceLocked is where a job with an affinity key goes now: its
// target if that has a free slot; with spill, else the first consumer in
// its key's order that has one. nil: nowhere now. It (re)targets the job
// when it has no target that can run it.
func (e *Engine) affinityPlaceLocked(q *queue, p *consumerPool, t *task, spill bool) *consumerSlot {
	c := p.byID(t.aff.target)
	if c == nil || !p.canRun(t, c) {
		cands := p.capable(t)
		if len(cands) == 0 {
			return nil
		}
		c = e.targetLocked(q, t, affinityOrder(t.aff.hash, cands))
	}
	if c.free() {
		return c
	}
	if !spill {
		return nil
	}
	for _, o := range affinityOrder(t.aff.hash, p.capable(t)) {
		if o.free() {
			return o
		}
	}
	return nil
}

// targetLocked makes the first consumer of order (the job's capable
// consumers in its key's order) with room under the load bound the job's
// target, and returns it.
func (e *Engine) targetLocked(q *queue, t *task, order []*consumerSlot) *consumerSlot {
	e.untargetLocked(q, t)
	if q.aff.targeted == nil {
		q.aff.targeted = map[string]int{}
	}
	held, slots := 0, 0
	for _, c := range order {
		held += c.load() + q.aff.targeted[c.id]
		slots += c.slots
	}
	factor := e.cfg.Scheduling.AffinityLoadFactor
	target := order[0]
	for _, c := range order {
		bound := c.slots + int(math.Ceil(factor*float64(held+1)*float64(c.slots)/float64(slots)))
		if c.load()+q.aff.targeted[c.id]+1 <= bound {
			target = c
			break
		}
	}
	t.aff.first, t.aff.target = order[0].id, target.id
	q.aff.targeted[target.id]++
	return target
}

// spillLaterLocked dispatches q again at at, when a job waiting for its
// consumer may go to a free one (nextLocked).
func (e *Engine) spillLaterLocked(q *queue, at time.Time) {
	if q.aff.spill != nil && !at.Before(q.aff.spillAt) {
		return
	}
	stopTimer(q.aff.spill)
	q.aff.spillAt = at
	q.aff.spill = time.AfterFunc(time.Until(at), func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if q.aff.spillAt.Equal(at) {
			q.aff.spill = nil
		}
		if !e.closed && e.queues[q.name] == q {
			e.dispatchLocked(q)
		}
	})
}

// untargetLocked takes t's wait off its target's load.
func (e *Engine) untargetLocked(q *queue, t *task) {
	if t.aff.target == "" {
		return
	}
	if n := q.aff.targeted[t.aff.target] - 1; n > 0 {
		q.aff.targeted[t.aff.target] = n
	} else {
		delete(q.aff.targeted, t.aff.target)
	}
	t.aff.target = ""
}

// affinityBoundLocked counts the binding of a job with a key to c and
// remembers c as the key's consumer.
func (e *Engine) affinityBoundLocked(q *queue, p *consumerPool, t *task, c *consumerSlot) {
	if t.d.AffinityKey == "" {
		return
	}
	e.m.Affinity.WithLabelValues(e.affinityResultLocked(q, p, t, c)).Inc()
	q.aff.last.put(t.aff.hash, c.id)
}

// affinityResult is why a job with a key went to c. When the key's latest
// job went to another consumer that has since left, or that cannot run
// this job, the miss is that one's: gone, none_capable. Otherwise it is a
// hit when c is the first in the key's order, full when it is not (the
// first had no room). A consumer that joins and comes first for a key
// takes it with a hit: the key is that consumer's now.
func (e *Engine) affinityResultLocked(q *queue, p *consumerPool, t *task, c *consumerSlot) string {
	last, known := q.aff.last.get(t.aff.hash)
	switch {
	case known && last != c.id && !e.registeredLocked(q, last):
		return AffinityGone
	case known && last != c.id && (p.byID(last) == nil || !p.canRun(t, p.byID(last))):
		return AffinityNoneCapable
	case c.id == t.aff.first:
		return AffinityHit
	}
	return AffinityFull
}
