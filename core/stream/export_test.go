package stream

// Add moves the count by d, for tests that stand for other streams being
// written.
func (c *Writers) Add(d int64) { c.n.Add(d) }

// Count is the number of streams counted.
func (c *Writers) Count() int64 { return c.n.Load() }

// Batch counts a batch begun by another stream.
func (c *Writers) Batch() { c.batches.Add(1) }
