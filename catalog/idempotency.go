package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/core"
)

// Idempotency keys, cluster-wide (core.IdempotencyStore): /idem/{hash} →
// the job a key made, its ingress node and the submission's hash. Each
// record has a lease of its own, not the node's: it must outlive the job's
// retention whatever happens to the node, so that a retry through another
// node never makes a second job of a submission the cluster took. The view
// does not watch these records: they are read only by a claim.

const idemPrefix = "/idem/"

var _ core.IdempotencyStore = (*Catalog)(nil)

// idemRecord is the JSON of a record.
type idemRecord struct {
	V       int    `json:"v"`
	Job     string `json:"job"`
	Ingress string `json:"ingress"`
	Queue   string `json:"queue"`
	Hash    string `json:"hash"`
}

func encodeIdem(r core.IdempotencyRecord) string {
	b, _ := json.Marshal(idemRecord{V: recordVersion, Job: r.Job, Ingress: r.Ingress, Queue: r.Queue, Hash: r.Hash}) // strings only: never fails
	return string(b)
}

// ClaimKey implements core.IdempotencyStore: it writes rec under key with a
// lease of ttl (rounded up to whole seconds), in one transaction that
// succeeds only if the key has no record, and otherwise reads the record
// that holds it.
func (c *Catalog) ClaimKey(ctx context.Context, key string, rec core.IdempotencyRecord, ttl time.Duration) (core.IdempotencyRecord, bool, error) {
	ctx, cancel := c.writeCtx(ctx)
	defer cancel()
	lease, err := c.client.Grant(ctx, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return core.IdempotencyRecord{}, false, fmt.Errorf("claim idempotency key: grant: %w", err)
	}
	k := idemPrefix + key
	res, err := c.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, encodeIdem(rec), clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err == nil && res.Succeeded {
		return rec, true, nil
	}
	// The lease holds nothing: give it back now rather than at its TTL.
	if _, rerr := c.client.Revoke(ctx, lease.ID); rerr != nil {
		c.log.Debug("catalog: revoke an unused idempotency lease", "err", rerr)
	}
	if err != nil {
		return core.IdempotencyRecord{}, false, fmt.Errorf("claim idempotency key: %w", err)
	}
	kvs := res.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		// Expired between the compare and the read: rare, and the
		// caller's retry claims it.
		return core.IdempotencyRecord{}, false, errors.New("claim idempotency key: the record expired while read")
	}
	var r idemRecord
	if err := json.Unmarshal(kvs[0].Value, &r); err != nil {
		return core.IdempotencyRecord{}, false, fmt.Errorf("claim idempotency key: %s: %w", k, err)
	}
	return core.IdempotencyRecord{Job: r.Job, Ingress: r.Ingress, Queue: r.Queue, Hash: r.Hash}, false, nil
}

// ReleaseKey implements core.IdempotencyStore: the record goes if it is still
// rec (its lease then expires with nothing on it).
func (c *Catalog) ReleaseKey(ctx context.Context, key string, rec core.IdempotencyRecord) error {
	ctx, cancel := c.writeCtx(ctx)
	defer cancel()
	k := idemPrefix + key
	_, err := c.client.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k), "=", encodeIdem(rec))).
		Then(clientv3.OpDelete(k)).
		Commit()
	if err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}
