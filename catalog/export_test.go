package catalog

// CrashMember stops c's embedded etcd member abruptly, as a crash would:
// without handing over leadership and without revoking c's lease. The
// listeners stay open until c.Close, which must still be called.
func CrashMember(c *Catalog) { c.etcd.Server.HardStop() }
