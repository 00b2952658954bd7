package auth

import (
	"context"
	"fmt"

	"github.com/switchyard/switchyard/core"
	"github.com/switchyard/switchyard/core/resume"
)

// Identity is who makes a call: a key's subject with its roles and queues,
// the anonymous caller of a node without keys, or the bearer of a read
// token. It is immutable; transports put it in the call's context
// (NewContext) once they authenticated the call, and everything after
// reads it from there (FromContext).
type Identity struct {
	subject   string
	anonymous bool
	roles     Role
	queues    []string
	// caller is the fingerprint resume tokens are bound to (see Caller).
	caller [16]byte
	// scope, for a read token, is the one stream it may read (ReadScope).
	scope string
	// admission is the key's limits and counts; nil: none.
	admission *admission
	// share is the key's fair-share weight and priority cap.
	share core.Share
}

// Anonymous is the identity of every call to a node without keys: every
// role on every queue. credential is what the caller presented anyway
// (an Authorization header, "authorization" metadata; often none): resume
// tokens stay bound to it, as they were before nodes knew keys, so a token
// issued to one credential does not resume under another.
func Anonymous(credential string) *Identity {
	if credential == "" {
		return anonymousNone
	}
	return &Identity{anonymous: true, roles: Submit | Work | Admin, queues: anyQueue, caller: anonymousCaller(credential)}
}

// anonymousNone is Anonymous(""), the identity of nearly every call to a
// node without keys, made once: an Identity is immutable.
var anonymousNone = &Identity{anonymous: true, roles: Submit | Work | Admin, queues: anyQueue, caller: anonymousCaller("")}

// anyQueue is the queues of an anonymous identity, shared: read only.
var anyQueue = []string{"*"}

func anonymousCaller(credential string) [16]byte {
	return resume.Fingerprint("authorization", credential)
}

// ReadToken is the identity of a read token's bearer: it may read the one
// stream scope names (a job's events, or the cluster view), nothing else.
// caller is the fingerprint the token carries, that of the subject it was
// issued to: a resume token from the subject's own streams works on it.
func ReadToken(scope string, caller [16]byte) *Identity {
	return &Identity{scope: scope, caller: caller}
}

// CallerFingerprint is the fingerprint resume tokens of a subject are bound
// to, whatever key or read token it uses.
func CallerFingerprint(subject string) [16]byte { return resume.Fingerprint("subject", subject) }

// Subject is the key's subject; "" for the anonymous caller and for a read
// token.
func (id *Identity) Subject() string { return id.subject }

// IsAnonymous reports whether the node has no keys.
func (id *Identity) IsAnonymous() bool { return id.anonymous }

// Caller is the fingerprint resume tokens issued to this identity are bound
// to: the subject's, so a token issued on one key resumes on another key of
// the same subject (and on a read token issued to it), on any transport and
// node, and never under another subject.
func (id *Identity) Caller() [16]byte { return id.caller }

// ReadScope is the stream a read token may read ("" for any other
// identity).
func (id *Identity) ReadScope() string { return id.scope }

// Has reports whether the identity holds role.
func (id *Identity) Has(role Role) bool { return id.roles&role != 0 }

// Roles is every role the identity holds.
func (id *Identity) Roles() Role { return id.roles }

// Allow refuses, with permission_denied, an identity that lacks role or
// may not use queue ("" checks the role alone). A queue that is not a
// queue name is not refused here: the call's own check answers it with
// invalid_queue_name, as it would for any key.
func (id *Identity) Allow(role Role, queue string) error {
	if !id.Has(role) {
		return id.denied(fmt.Sprintf("this call needs the %s role", role))
	}
	if queue != "" && core.ValidName(queue) && !matchQueue(id.queues, queue) {
		return id.denied(fmt.Sprintf("the key may not use queue %q", queue))
	}
	return nil
}

// AllowAny refuses, with permission_denied, an identity that holds none of
// roles.
func (id *Identity) AllowAny(roles Role) error {
	if id.roles&roles == 0 {
		return id.denied(fmt.Sprintf("this call needs one of the roles %s", roles))
	}
	return nil
}

func (id *Identity) denied(detail string) error {
	if id.scope != "" {
		detail = "a read token only reads the stream it was issued for"
	}
	return &core.Error{Code: core.CodePermissionDenied, Detail: detail}
}

// Sees reports whether the identity may read and cancel a job owned by
// owner: its own, or any with the admin role (the anonymous caller holds
// it). A job it may not see is answered exactly as one that does not
// exist (core.JobNotFound), so ids cannot be probed.
func (id *Identity) Sees(owner string) bool {
	return id.Has(Admin) || (id.subject != "" && id.subject == owner)
}

// SeesJob reports whether the identity may read job (owned by owner):
// Sees(owner), or a read token issued for it. Cancelling takes a role a
// read token does not hold, checked before.
func (id *Identity) SeesJob(job, owner string) bool {
	return id.scope == JobScope(job) || id.Sees(owner)
}

// JobScope is the read scope of a job's stream and document.
func JobScope(job string) string { return "job:" + job }

// ClusterScope is the read scope of the live cluster view.
const ClusterScope = "cluster:read"

// Share is the weight the identity's subject has in every queue's fair
// share and the highest priority its jobs may ask for: the key's (weight
// and max_priority), or weight 1 and no cap for the anonymous caller.
func (id *Identity) Share() core.Share {
	if id.share.Weight == 0 {
		return core.Share{Weight: 1, MaxPriority: id.share.MaxPriority}
	}
	return id.share
}

// Owner is what a job this identity submits records as its owner.
func (id *Identity) Owner() string { return id.subject }

type ctxKey struct{}

// NewContext returns ctx carrying id.
func NewContext(ctx context.Context, id *Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity a transport authenticated for the call.
// A context without one is a call no transport authenticated: a service
// used alone (in a test, or the node's own calls); it is answered as
// anonymous. Every route and rpc of a node goes through the transports'
// checks first: the auth matrix test walks them all.
func FromContext(ctx context.Context) *Identity {
	if id, ok := Lookup(ctx); ok {
		return id
	}
	return Anonymous("")
}

// CallerOf is the fingerprint resume tokens issued in the call ctx are
// bound to: its identity's (Caller); in a call no transport authenticated
// (a service used alone), that of the anonymous caller presenting
// credential, as on a node without keys.
func CallerOf(ctx context.Context, credential string) [16]byte {
	if id, ok := Lookup(ctx); ok {
		return id.caller
	}
	return anonymousCaller(credential)
}

// Lookup returns the identity in ctx, if a transport put one there.
func Lookup(ctx context.Context) (*Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(*Identity)
	return id, ok && id != nil
}
