package core

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// This file is the order in which a queue's dispatcher hands out its
// slots: fair share between subjects, priorities with aging inside each
// subject's share, and the jobs that came back ahead of both. Which
// consumer a job goes to is affinity.go's and consumers.go's; the rules and
// their bounds are written up in docs/scheduling.md.
//
// The rule, weighted fair queuing of a queue's slots between subjects (the
// API key's subject; the anonymous caller is one subject): a slot goes to
// the subject with a waiting job that can use it and the fewest slots per
// weight counting this one, (bound+1)/weight; ties go to the subject
// served least recently. Its bound: no subject is handed a slot while
// another subject that could have used it holds fewer slots per weight,
// counting the slot in question. So while every subject's jobs can run on
// every consumer and the queue is saturated, a subject below its weighted
// share of the slots in use gets every slot that frees until it is not,
// and from then on each subject's slots stay within one job of
// weight/Σweights of them. Counting slots held rather than jobs
// dispatched is what makes the share hold whatever the jobs' lengths: a
// subject whose jobs run ten times longer gets a tenth of the dispatches,
// not ten times the slots.
//
// Inside a subject, a higher priority goes first, with aging: a job's rank
// is its arrival time minus priority × PriorityAging, lowest first, so a
// job is passed only by a later job of its subject that asked for more
// priority than the time between them makes up. A job of the lowest
// priority is passed by nothing posted more than (MaxPriority −
// MinPriority) × PriorityAging after it: nothing starves.
//
// A job that came back to its queue (its worker refused it or was lost,
// or a dead node's jobs forwarded again: Delivery.Front) goes ahead of
// every subject, least TTL left first, whatever the shares: it had its
// turn already, and jobs posted after it must not push it back. It is not
// charged a second turn, but its slot counts for its subject once bound
// again. Such jobs number at most the slots that were lost, so they hold
// the others back by at most one round of those slots.

// fairQueue is a queue's waiting jobs in the order its dispatcher hands out
// slots. The queue's pending slice holds the same jobs in arrival order
// (the order every other role reads them in); this is the dispatcher's
// index of them.
type fairQueue struct {
	// front holds the jobs that came back, least TTL left first.
	front []*task
	// subjects holds every subject with a job waiting or bound here.
	subjects map[string]*subjectQueue
	// seq numbers arrivals and turns: the tie-breaks of equal ranks and
	// of equal shares.
	seq uint64
	// scratch is order's slice, reused: the dispatch path allocates none.
	scratch []*subjectQueue
}

// subjectQueue is one subject's part of a queue.
type subjectQueue struct {
	subject string
	// weight is the one its newest job carried (its key's, at its
	// ingress), waiting or bound.
	weight int
	// waiting are its jobs that wait, by rank then arrival.
	waiting []*task
	// bound is how many of its jobs this dispatcher bound and that have
	// not been unbound yet: the slots it holds.
	bound int
	// turn is fairQueue.seq when it last got a slot.
	turn uint64
}

// fairTask is a task's place in the fair queue.
type fairTask struct {
	// rank orders a subject's waiting jobs: arrival (ns) minus priority ×
	// aging.
	rank int64
	seq  uint64
	// front: the task is in fairQueue.front.
	front bool
	// counted: the task holds a slot of its subject (bound by this
	// dispatcher and not unbound yet).
	counted bool
}

// push adds a waiting task. A job that came back goes to the front list;
// any other to its subject's queue, by rank.
func (f *fairQueue) push(t *task, now time.Time, aging time.Duration) {
	f.seq++
	t.fair = fairTask{seq: f.seq, rank: now.UnixNano() - int64(t.d.Priority)*int64(aging)}
	if t.d.Front {
		t.fair.front = true
		left := t.budget.Remaining(now)
		i, _ := slices.BinarySearchFunc(f.front, left, func(p *task, left time.Duration) int {
			return cmp.Compare(p.budget.Remaining(now), left+1)
		})
		f.front = slices.Insert(f.front, i, t)
		return
	}
	s := f.subject(t.d.Subject)
	s.weight = max(t.d.Weight, 1)
	i, _ := slices.BinarySearchFunc(s.waiting, t, byRank)
	s.waiting = slices.Insert(s.waiting, i, t)
}

func byRank(a, b *task) int {
	if c := cmp.Compare(a.fair.rank, b.fair.rank); c != 0 {
		return c
	}
	return cmp.Compare(a.fair.seq, b.fair.seq)
}

// subject returns a subject's queue, made on first use.
func (f *fairQueue) subject(name string) *subjectQueue {
	if f.subjects == nil {
		f.subjects = map[string]*subjectQueue{}
	}
	s := f.subjects[name]
	if s == nil {
		s = &subjectQueue{subject: name, weight: 1}
		f.subjects[name] = s
	}
	return s
}

// remove takes a waiting task out (it was bound, expired, cancelled or
// handed back).
func (f *fairQueue) remove(t *task) {
	if t.fair.front {
		if i := slices.Index(f.front, t); i >= 0 {
			f.front = slices.Delete(f.front, i, i+1)
		}
		t.fair.front = false
		return
	}
	s := f.subjects[t.d.Subject]
	if s == nil {
		return
	}
	if i, ok := slices.BinarySearchFunc(s.waiting, t, byRank); ok {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
	f.forget(s)
}

// bind counts a slot for t's subject: it was bound by this dispatcher.
func (f *fairQueue) bind(t *task) {
	s := f.subject(t.d.Subject)
	s.weight = max(t.d.Weight, 1)
	s.bound++
	f.seq++
	s.turn = f.seq
	t.fair.counted = true
}

// unbind gives t's slot back to its subject.
func (f *fairQueue) unbind(t *task) {
	if !t.fair.counted {
		return
	}
	t.fair.counted = false
	if s := f.subjects[t.d.Subject]; s != nil {
		s.bound--
		f.forget(s)
	}
}

// forget drops a subject that has nothing waiting and nothing bound: the
// map holds only the subjects a queue serves now.
func (f *fairQueue) forget(s *subjectQueue) {
	if len(s.waiting) == 0 && s.bound <= 0 {
		delete(f.subjects, s.subject)
	}
}

// order returns the subjects with a job waiting, the one the next slot
// goes to first: the fewest slots per weight counting the next, then the
// one served least recently, then by name.
func (f *fairQueue) order() []*subjectQueue {
	out := f.scratch[:0]
	for _, s := range f.subjects {
		if len(s.waiting) > 0 {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *subjectQueue) int {
		// (a.bound+1)/a.weight vs (b.bound+1)/b.weight, in integers.
		if c := cmp.Compare((a.bound+1)*b.weight, (b.bound+1)*a.weight); c != 0 {
			return c
		}
		if c := cmp.Compare(a.turn, b.turn); c != 0 {
			return c
		}
		return strings.Compare(a.subject, b.subject)
	})
	f.scratch = out
	return out
}

// nextLocked is the next job of q to bind and the consumer to bind it to
// (from p, the pool it returns), in the fair queue's order: the jobs that
// came back first, then the subjects in order (order), and in each subject
// its jobs by rank. A job with an affinity key goes to its target when
// that has a free slot; in a subject none of whose jobs can go where it
// belongs, its first job that has waited AffinityWait and that some free
// consumer can run goes there, so a free slot idles at most that long
// while a job it can run waits. A nil task: no job can be bound now.
func (e *Engine) nextLocked(q *queue) (*task, *consumerPool, *consumerSlot) {
	if len(q.pending) == 0 {
		return nil, nil, nil
	}
	p := e.poolLocked(q)
	if !p.anyFree() {
		return nil, p, nil
	}
	for _, t := range q.fair.front {
		if c := e.placeLocked(q, p, t, true); c != nil {
			return t, p, c
		}
	}
	now, wait := time.Now(), e.cfg.Scheduling.AffinityWait
	var spillAt time.Time
	for _, s := range q.fair.order() {
		for _, t := range s.waiting {
			if c := e.placeLocked(q, p, t, false); c != nil {
				return t, p, c
			}
		}
		for _, t := range s.waiting {
			if t.d.AffinityKey == "" {
				continue // placeLocked found no free consumer for it above
			}
			if at := t.budget.At.Add(wait); now.Before(at) {
				if spillAt.IsZero() || at.Before(spillAt) {
					spillAt = at
				}
				continue
			}
			if c := e.placeLocked(q, p, t, true); c != nil {
				return t, p, c
			}
		}
	}
	if !spillAt.IsZero() {
		e.spillLaterLocked(q, spillAt)
	}
	return nil, p, nil
}

// placeLocked is where t goes now, if anywhere: a job without an affinity
// key to the pool's pick; one with a key to its target if that has a free
// slot, and otherwise, with spill, to the next consumer in its key's order
// that has one (affinity.go).
func (e *Engine) placeLocked(q *queue, p *consumerPool, t *task, spill bool) *consumerSlot {
	if t.d.AffinityKey == "" {
		return p.pick(t)
	}
	return e.affinityPlaceLocked(q, p, t, spill)
}

// SubjectStat is one subject's part of a queue on its dispatcher.
type SubjectStat struct {
	// Subject is the API key's subject; "" is the anonymous caller.
	Subject string
	Weight  int
	// Depth is how many of its jobs wait, Bound how many of the queue's
	// slots it holds.
	Depth int
	Bound int
	// Share is its part of the queue's bound jobs (0 to 1), and FairShare
	// what its weight entitles it to among the subjects served now.
	Share     float64
	FairShare float64
}

// stats returns the subjects' figures, by subject. Jobs that came back
// (the front list) count towards their subject's depth.
func (f *fairQueue) stats() []SubjectStat {
	bound, weights := 0, 0
	for _, s := range f.subjects {
		bound += max(s.bound, 0)
		weights += s.weight
	}
	front := map[string]int{}
	for _, t := range f.front {
		front[t.d.Subject]++
	}
	out := make([]SubjectStat, 0, len(f.subjects)+len(front))
	for _, s := range f.subjects {
		st := SubjectStat{Subject: s.subject, Weight: s.weight, Depth: len(s.waiting) + front[s.subject], Bound: max(s.bound, 0)}
		delete(front, s.subject)
		if bound > 0 {
			st.Share = float64(st.Bound) / float64(bound)
		}
		if weights > 0 {
			st.FairShare = float64(s.weight) / float64(weights)
		}
		out = append(out, st)
	}
	for subject, n := range front {
		// Only returned jobs: no share of its own yet.
		out = append(out, SubjectStat{Subject: subject, Weight: 1, Depth: n})
	}
	slices.SortFunc(out, func(a, b SubjectStat) int { return strings.Compare(a.Subject, b.Subject) })
	return out
}
