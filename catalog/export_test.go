package catalog

import "time"

// CrashMember stops c's embedded etcd member abruptly, as a crash would:
// without handing over leadership and without revoking c's lease. The
// listeners stay open until c.Close, which must still be called.
func CrashMember(c *Catalog) { c.etcd.Server.HardStop() }

// FenceIn is how long c's current lease has before its fence deadline.
func FenceIn(c *Catalog) time.Duration { return time.Until(c.held().deadline()) }

// DerivedClientTLS is the TLS a client of members presents, derived from
// secret.
var DerivedClientTLS = derivedClientTLS

// HoldWrites holds c's writes lock for reading, as a write waiting on etcd
// does, until the returned func is called.
func HoldWrites(c *Catalog) (release func()) {
	c.rot.RLock()
	return c.rot.RUnlock
}
