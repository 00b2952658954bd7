package core

import "slices"

// QueueView is one queue as the cluster views show it (the HTTP queue
// routes through the gateway, the gRPC ClusterService, the live cluster
// stream): its dispatch record, its consumers on every node, and this
// node's figures when it holds the queue.
type QueueView struct {
	Name     string
	Dispatch DispatchInfo
	// Local is this node's part of the queue; nil when it holds none.
	Local *QueueStat
	// Consumers is the view's shared snapshot (ClusterView.Consumers):
	// read it, never modify it.
	Consumers []ConsumerInfo
}

// QueueViews returns every queue view names or this node holds, sorted by
// name. It reads the watched catalog view and the engine's memory, never
// the store.
func (e *Engine) QueueViews(view ClusterView) []QueueView {
	local := e.localQueues()
	names := view.Queues()
	for name := range local {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := make([]QueueView, 0, len(names))
	for _, name := range names {
		out = append(out, e.queueView(view, name, local))
	}
	return out
}

// QueueView returns one queue; false when neither the catalog nor this node
// knows it (queues exist while they have jobs or consumers).
func (e *Engine) QueueView(view ClusterView, name string) (QueueView, bool) {
	local := e.localQueues()
	if _, known := local[name]; !known && !slices.Contains(view.Queues(), name) {
		return QueueView{}, false
	}
	return e.queueView(view, name, local), true
}

func (e *Engine) localQueues() map[string]QueueStat {
	local := map[string]QueueStat{}
	for _, q := range e.QueueStats() {
		local[q.Name] = q
	}
	return local
}

func (e *Engine) queueView(view ClusterView, name string, local map[string]QueueStat) QueueView {
	q := QueueView{Name: name, Consumers: view.Consumers(name)}
	q.Dispatch, _ = view.Dispatch(name)
	if st, ok := local[name]; ok {
		q.Local = &st
		if q.Dispatch.Dispatcher == "" {
			// Without a dispatch record, the node holding the queue is its
			// dispatcher: every queue a single node serves is local.
			q.Dispatch.Dispatcher = e.cfg.Node
		}
	}
	return q
}
