// Package coretest is test plumbing for code built on core, as
// net/http/httptest is for HTTP: an in-memory core.Catalog, a job
// history's events appended by a test, a check that a configuration was
// refused for the right setting, and a worker session's send queue filled
// to its bounds.
package coretest

import (
	"context"
	"sync"

	"github.com/switchyard/switchyard/core"
)

// Catalog is a core.Catalog that keeps consumer records in memory, with no
// lease and no watch: what is published is listed at once. The zero value
// is empty and ready.
type Catalog struct {
	mu        sync.Mutex
	consumers map[string]core.ConsumerInfo
	// incarnations are the node records Nodes returns (node →
	// incarnation).
	incarnations map[string]string
	// publish, when set, runs before a record is stored and may fail or
	// block it.
	publish func(ctx context.Context, c core.ConsumerInfo) error
}

var _ core.Catalog = (*Catalog)(nil)

// SetPublish makes fn run before every record is stored, the store's
// answer: its error refuses the write, and it may block (nil: every write
// is stored at once).
func (c *Catalog) SetPublish(fn func(ctx context.Context, ci core.ConsumerInfo) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.publish = fn
}

// SetIncarnation records node's incarnation, as a node record published
// by a (re)started or recovered node would.
func (c *Catalog) SetIncarnation(node, inc string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.incarnations == nil {
		c.incarnations = map[string]string{}
	}
	c.incarnations[node] = inc
}

// Withdraw deletes every consumer record that match selects, as the end of
// a node's lease takes its records with it.
func (c *Catalog) Withdraw(match func(core.ConsumerInfo) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, ci := range c.consumers {
		if match(ci) {
			delete(c.consumers, id)
		}
	}
}

// Consumer returns the record of consumer id, and whether there is one.
func (c *Catalog) Consumer(id string) (core.ConsumerInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ci, ok := c.consumers[id]
	return ci, ok
}

// PublishConsumer stores ci, once the SetPublish hook, if any, lets it.
func (c *Catalog) PublishConsumer(ctx context.Context, ci core.ConsumerInfo) error {
	c.mu.Lock()
	fn := c.publish
	c.mu.Unlock()
	if fn != nil {
		if err := fn(ctx, ci); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.consumers == nil {
		c.consumers = map[string]core.ConsumerInfo{}
	}
	c.consumers[ci.ID] = ci
	return nil
}

// WithdrawConsumer deletes consumer id's record.
func (c *Catalog) WithdrawConsumer(_ context.Context, _, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.consumers, id)
	return nil
}

// Consumers returns the records of queue's consumers, in no order.
func (c *Catalog) Consumers(queue string) []core.ConsumerInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []core.ConsumerInfo
	for _, ci := range c.consumers {
		if ci.Queue == queue {
			out = append(out, ci)
		}
	}
	return out
}

// Nodes returns a record per SetIncarnation, each online.
func (c *Catalog) Nodes() []core.NodeInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []core.NodeInfo
	for id, inc := range c.incarnations {
		out = append(out, core.NodeInfo{ID: id, State: core.StateOnline, Incarnation: inc})
	}
	return out
}
