package core

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"time"
)

// Idempotency keys. A requester may send Idempotency-Key to make a retried
// submission return the job the first one made. A key is its owner's (the
// subject's: the same key from another subject is another key) and binds
// one submission: the same key with a different envelope, or on another
// queue, is refused (idempotency_key_reused), never answered with the
// first job.
//
// In a cluster the key holds across nodes: a retry behind a load balancer
// usually reaches another node. Before it creates a keyed job, the ingress
// node claims the key in the cluster (IdempotencyStore: a catalog record
// naming the job, its ingress node and the submission's hash, under a
// lease that outlives the job's retention). A retry that reaches another
// node finds the record and gets JobElsewhere: the job lives on its
// ingress node, and the transport relays the request there, so the client
// gets the same job and its stream whichever node it reached. On one node
// the claim is made once per key: concurrent submissions with one key wait
// for the first to settle (idempotency.pending).

// MaxIdempotencyKeyBytes is the longest Idempotency-Key a node takes (a
// UUID is 36 bytes; Stripe's limit is 255): a key is held in memory for
// its job's life, and a longer one buys nothing. Longer is refused
// invalid_idempotency_key before anything is made.
const MaxIdempotencyKeyBytes = 255

// checkIdempotencyKey refuses a key longer than MaxIdempotencyKeyBytes.
func checkIdempotencyKey(key string) error {
	if len(key) > MaxIdempotencyKeyBytes {
		return errorf(CodeInvalidIdempotencyKey, "Idempotency-Key", "the Idempotency-Key is %d bytes long: at most %d", len(key), MaxIdempotencyKeyBytes)
	}
	return nil
}

// IdempotencyRecord is what the cluster remembers of a key.
type IdempotencyRecord struct {
	// Job is the id of the job the key made, and Ingress the node that
	// took it: the job lives there.
	Job     string
	Ingress string
	Queue   string
	// Hash is the submission's (submissionHash): a retry must match it.
	Hash string
}

// IdempotencyStore keeps idempotency keys cluster-wide (the catalog).
type IdempotencyStore interface {
	// ClaimKey records rec under key, to expire after ttl, unless a record is
	// there already; it returns the record that holds the key and whether
	// it is rec.
	ClaimKey(ctx context.Context, key string, rec IdempotencyRecord, ttl time.Duration) (held IdempotencyRecord, claimed bool, err error)
	// ReleaseKey removes key's record if it is still rec: the submission that
	// claimed it was refused, and a retry must be free to make the job.
	ReleaseKey(ctx context.Context, key string, rec IdempotencyRecord) error
}

// JobElsewhere is Submit's answer when an idempotency key matched a job
// another node took: the job, its history and its stream are there. The
// transport relays the request to Node, where the key matches locally.
type JobElsewhere struct {
	Node string
	Job  string
}

func (e *JobElsewhere) Error() string {
	return fmt.Sprintf("switchyard: the idempotency key's job %s lives on node %s", e.Job, e.Node)
}

// idempotencyRetention is how long a key's record outlives its job's
// retention, so a retry never outlives the record that answers it.
const idempotencyRetention = time.Minute

// idempotency is the engine's state of keyed submissions in progress.
// Guarded by Engine.mu.
type idempotency struct {
	// pending holds, for each key being claimed on this node, a channel
	// closed when that submission has settled (made its job, or not).
	pending map[string]chan struct{}
}

// submissionHash is what a retry must match: the queue and every field of
// the envelope as parsed, in a canonical form (compact JSON of each field,
// capabilities sorted, in Envelope's declaration order), so that white
// space or field order in the body does not make a retry a different
// submission, and a field added to Envelope counts without being listed
// here.
//
// The fields up to Grace (hashAlways) are always written; every later
// field is left out at its zero value, so a submission that does not use
// a field hashes the same on a node that does not know it (a retry across
// a rolling upgrade).
func submissionHash(queue string, env *Envelope) string {
	var b bytes.Buffer
	b.WriteString(`{"Queue":`)
	b.Write(hashJSON(queue))
	v := reflect.ValueOf(env).Elem()
	for i, f := range reflect.VisibleFields(v.Type()) {
		fv := v.FieldByIndex(f.Index)
		if i >= hashAlways && fv.IsZero() {
			continue
		}
		b.WriteString(`,"` + f.Name + `":`)
		b.Write(hashJSON(fv.Interface()))
	}
	b.WriteByte('}')
	sum := sha256.Sum256(b.Bytes())
	return hex.EncodeToString(sum[:])
}

// hashAlways is how many of Envelope's first fields (Version to Grace)
// submissionHash writes even at their zero value: the fields the first
// keyed nodes hashed that way.
const hashAlways = 8

// hashJSON is v's JSON for submissionHash. The envelope's raw members
// were checked valid JSON when it was parsed; one that is not writes null.
func hashJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte("null")
	}
	return b
}

// idempotencyKey is the store's key of an owner's key: a hash, so the
// catalog holds neither the key nor who sent it.
func idempotencyKey(scope string) string {
	sum := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(sum[:])
}

// errKeyReused refuses a key that made a job of another submission.
func errKeyReused(queue string) *Error {
	return errorf(CodeIdempotencyReuse, "Idempotency-Key",
		"the key was used for another submission (queue %q): a key names one submission; send a new key for a new job", queue)
}

// matchKeyed is the answer to a keyed submission whose key made j: j
// itself, or the refusal of a different submission.
func matchKeyed(j *Job, hash string) (*Job, bool, error) {
	if j.idemHash != hash {
		return nil, false, errKeyReused(j.Queue)
	}
	return j, true, nil
}

// submitKeyed is Submit for a keyed submission on a node with an
// IdempotencyStore: the key is matched here, claimed in the cluster, or
// found elsewhere (see the file's comment).
func (e *Engine) submitKeyed(ctx context.Context, queue string, env *Envelope, opts SubmitOptions) (*Job, bool, error) {
	if err := CheckQueueName(queue); err != nil {
		return nil, false, err
	}
	eff, err := e.cfg.Limits.Apply(env)
	if err != nil {
		return nil, false, err
	}
	scope, hash := idemScope(opts.Owner, opts.IdempotencyKey), submissionHash(queue, env)
	done, j, err := e.awaitKey(ctx, scope, hash)
	if j != nil || err != nil {
		return j, j != nil, err
	}
	defer e.settleKey(scope, done)

	store, key := e.cfg.Idempotency, idempotencyKey(scope)
	rec := IdempotencyRecord{Job: newID("j_"), Ingress: e.cfg.Node, Queue: queue, Hash: hash}
	held, claimed, err := store.ClaimKey(ctx, key, rec, eff.TTL+e.cfg.Retention+idempotencyRetention)
	if err != nil {
		e.log.Warn("claim an idempotency key", "err", err)
		return nil, false, &Error{Code: CodeCatalogUnavailable, Detail: "the node could not record the Idempotency-Key in the catalog; retry", RetryAfter: time.Second}
	}
	if !claimed {
		return e.heldKey(held, hash)
	}
	j, existing, err := e.submit(ctx, queue, env, opts, rec.Job)
	if err != nil {
		// Refused: the key made no job, and a retry must be free to.
		// Cleanup of the refusal, not request work: it runs though the
		// caller's context may be done.
		if rerr := store.ReleaseKey(context.WithoutCancel(ctx), key, rec); rerr != nil {
			e.log.Warn("release an idempotency key", "err", rerr)
		}
	}
	return j, existing, err
}

// awaitKey matches a key against this node's jobs, waiting while another
// submission with the key is being claimed here. It returns the job the key
// made, a refusal, or (neither) the channel this submission now holds the
// key with, to be settled with settleKey.
func (e *Engine) awaitKey(ctx context.Context, scope, hash string) (chan struct{}, *Job, error) {
	for {
		e.mu.Lock()
		if id, ok := e.idem[scope]; ok && e.jobs[id] != nil {
			j := e.jobs[id]
			e.mu.Unlock()
			j, _, err := matchKeyed(j, hash)
			return nil, j, err
		}
		wait, busy := e.idemp.pending[scope]
		if !busy {
			done := make(chan struct{})
			e.idemp.pending[scope] = done
			e.mu.Unlock()
			return done, nil, nil
		}
		e.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

func (e *Engine) settleKey(scope string, done chan struct{}) {
	e.mu.Lock()
	delete(e.idemp.pending, scope)
	e.mu.Unlock()
	close(done)
}

// heldKey answers a key the cluster holds for another submission or
// another node.
func (e *Engine) heldKey(held IdempotencyRecord, hash string) (*Job, bool, error) {
	if held.Hash != hash {
		return nil, false, errKeyReused(held.Queue)
	}
	if held.Ingress != e.cfg.Node {
		return nil, false, &JobElsewhere{Node: held.Ingress, Job: held.Job}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if j := e.jobs[held.Job]; j != nil {
		return j, true, nil
	}
	return nil, false, &Error{Code: CodeJobNotFound, Detail: "the job this Idempotency-Key made has ended and is no longer retained on this node"}
}
