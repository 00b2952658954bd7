package coretest

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/switchyard/switchyard/core"
)

// Published records are listed by queue and by id until withdrawn; a
// publish hook's error refuses the write; Nodes lists the incarnations.
func TestCatalog(t *testing.T) {
	ctx := context.Background()
	var c Catalog
	for _, ci := range []core.ConsumerInfo{{ID: "a", Queue: "q", Node: "n1"}, {ID: "b", Queue: "q", Node: "n2"}, {ID: "c", Queue: "r", Node: "n1"}} {
		if err := c.PublishConsumer(ctx, ci); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(queue string) []string {
		var out []string
		for _, ci := range c.Consumers(queue) {
			out = append(out, ci.ID)
		}
		slices.Sort(out)
		return out
	}
	if got := ids("q"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Consumers(q) = %v, want a, b", got)
	}
	c.Withdraw(func(ci core.ConsumerInfo) bool { return ci.Node == "n1" })
	if got := ids("q"); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after n1's withdrawal, Consumers(q) = %v, want b", got)
	}
	if _, ok := c.Consumer("c"); ok {
		t.Errorf("c of n1 still listed")
	}
	_ = c.WithdrawConsumer(ctx, "q", "b")
	if got := ids("q"); got != nil {
		t.Errorf("after b's withdrawal, Consumers(q) = %v", got)
	}

	refused := errors.New("etcd unreachable")
	c.SetPublish(func(context.Context, core.ConsumerInfo) error { return refused })
	if err := c.PublishConsumer(ctx, core.ConsumerInfo{ID: "d", Queue: "q"}); !errors.Is(err, refused) {
		t.Errorf("hooked publish = %v, want the hook's error", err)
	}
	if _, ok := c.Consumer("d"); ok {
		t.Errorf("a refused record was stored")
	}

	c.SetIncarnation("n1", "7")
	if got := c.Nodes(); len(got) != 1 || got[0].ID != "n1" || got[0].Incarnation != "7" || got[0].State != core.StateOnline {
		t.Errorf("Nodes = %+v, want n1 online at incarnation 7", got)
	}
}
