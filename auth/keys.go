package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/switchyard/switchyard/core"
)

// File is the document --auth-file (or SWITCHYARD_AUTH_KEYS) holds, in YAML
// or JSON (JSON is YAML; one parser reads both). Unknown fields are refused:
// a misspelt "max_in_flight" silently ignored would be a limit that is not
// there.
//
//	keys:
//	  - subject: alice
//	    sha256: 5e8848...            # or key: <the key itself>
//	    roles: [submit]
//	    queues: [demo, "team-a.*"]
//	    rate: 5                      # jobs per second (0: no limit)
//	    burst: 10                    # default: the rate, at least 1
//	    max_in_flight: 20            # jobs not yet ended (0: no limit)
//	    weight: 2                    # fair share in every queue (default 1)
//	    max_priority: 0              # highest priority it may ask (-5 to 5)
type File struct {
	Keys []KeySpec `json:"keys"`
}

// KeySpec is one API key as the file states it.
type KeySpec struct {
	// Subject is who the key belongs to: the owner of the jobs it submits.
	// Several keys may name one subject (rotation, or a key per machine);
	// they then see the same jobs.
	Subject string `json:"subject"`
	// Key is the key itself, at least MinKeyLen bytes; SHA256 is the hex
	// SHA-256 of it instead, so the file need not hold the secret. Exactly
	// one of the two.
	Key    string `json:"key,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Roles are what the key may do: submit, work, admin.
	Roles []string `json:"roles"`
	// Queues are the queues the key may submit to and serve, as patterns:
	// a name ("demo"), a prefix ("team-a.*"), or "*" for every queue
	// (path.Match syntax; queue names hold no '/', so '*' spans any part
	// of a name). Required with the submit or work role.
	Queues []string `json:"queues,omitempty"`
	// Rate is the most jobs a second the key may submit, on each node (see
	// the package doc), and Burst how many it may submit at once; 0 means
	// no limit. MaxInFlight is the most jobs of the key not yet ended on a
	// node; 0 means no limit.
	Rate        float64 `json:"rate,omitempty"`
	Burst       int     `json:"burst,omitempty"`
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	// Weight is the subject's fair share of every queue's slots under
	// contention, against the other subjects' (1 to core.MaxWeight;
	// default 1, so equal). Every key of a subject must give it the same
	// weight (or leave it out): the weight is the subject's, not the
	// key's.
	Weight int `json:"weight,omitempty"`
	// MaxPriority is the highest priority the key's jobs may ask for
	// (core.MinPriority to core.MaxPriority; absent: any). A key for
	// background work may be held to 0 or below, so it can only yield.
	MaxPriority *int `json:"max_priority,omitempty"`
}

// MinKeyLen is the shortest key a file may hold: a key is a bearer secret,
// and a short one can be guessed.
const MinKeyLen = 16

// Role is one thing a key may do.
type Role uint8

// The roles. A key holds any set of them; none implies another.
const (
	// Submit: post jobs to its queues, read, stream and cancel its own jobs.
	Submit Role = 1 << iota
	// Work: attach workers to its queues (gRPC sessions and HTTP ones).
	Work
	// Admin: read and cancel every job; the cluster and queue views;
	// /metrics.
	Admin
)

var roleNames = map[string]Role{"submit": Submit, "work": Work, "admin": Admin}

func (r Role) String() string {
	var names []string
	for _, n := range []string{"submit", "work", "admin"} {
		if r&roleNames[n] != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, "+")
}

// entry is a key ready to be checked: its hash and what it grants.
type entry struct {
	hash    [sha256.Size]byte
	subject string
	roles   Role
	queues  []string
	limits  Limits
	share   core.Share
}

// Limits are a key's admission limits (see KeySpec).
type Limits struct {
	Rate        float64
	Burst       int
	MaxInFlight int
}

// parse reads a key document: YAML or JSON, strict.
func parse(doc []byte, origin string) ([]entry, error) {
	var f File
	if err := yaml.UnmarshalStrict(doc, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", origin, err)
	}
	var out []entry
	for i, k := range f.Keys {
		e, err := k.entry()
		if err != nil {
			return nil, fmt.Errorf("%s: keys[%d] (subject %q): %w", origin, i, k.Subject, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// entry checks a spec and turns it into what Authenticate compares against.
func (k KeySpec) entry() (entry, error) {
	e := entry{subject: k.Subject}
	if !core.ValidName(k.Subject) {
		return e, errors.New("subject must be 1-128 of [A-Za-z0-9._-], not starting with '.'")
	}
	switch {
	case k.Key != "" && k.SHA256 != "":
		return e, errors.New("give key or sha256, not both")
	case k.Key != "":
		if len(k.Key) < MinKeyLen {
			return e, fmt.Errorf("key must be at least %d bytes", MinKeyLen)
		}
		if strings.ContainsAny(k.Key, " \t\r\n") {
			return e, errors.New("key must not contain white space (it travels in an Authorization header)")
		}
		e.hash = sha256.Sum256([]byte(k.Key))
	case k.SHA256 != "":
		b, err := hex.DecodeString(k.SHA256)
		if err != nil || len(b) != sha256.Size {
			return e, errors.New("sha256 must be 64 hex digits: the SHA-256 of the key (sha256sum)")
		}
		copy(e.hash[:], b)
	default:
		return e, errors.New("key or sha256 is required")
	}
	if len(k.Roles) == 0 {
		return e, errors.New("roles must name at least one of submit, work, admin")
	}
	for _, name := range k.Roles {
		r, ok := roleNames[name]
		if !ok {
			return e, fmt.Errorf("role %q is not one of submit, work, admin", name)
		}
		e.roles |= r
	}
	if e.roles&(Submit|Work) != 0 && len(k.Queues) == 0 {
		return e, errors.New(`queues is required with the submit or work role ("*" for every queue)`)
	}
	for _, p := range k.Queues {
		if err := checkPattern(p); err != nil {
			return e, err
		}
	}
	e.queues = slices.Clone(k.Queues)
	if k.Rate < 0 || math.IsNaN(k.Rate) || math.IsInf(k.Rate, 0) {
		return e, errors.New("rate must be a number of jobs a second, 0 for no limit")
	}
	if k.Burst < 0 || k.MaxInFlight < 0 {
		return e, errors.New("burst and max_in_flight must not be negative")
	}
	if k.Burst > 0 && k.Rate == 0 {
		return e, errors.New("burst needs a rate")
	}
	if k.Weight < 0 || k.Weight > core.MaxWeight {
		return e, fmt.Errorf("weight must be from 1 to %d (0 or absent: 1)", core.MaxWeight)
	}
	if p := k.MaxPriority; p != nil && (*p < core.MinPriority || *p > core.MaxPriority) {
		return e, fmt.Errorf("max_priority must be from %d to %d", core.MinPriority, core.MaxPriority)
	}
	e.share = core.Share{Weight: max(k.Weight, 1), MaxPriority: k.MaxPriority}
	e.limits = Limits{Rate: k.Rate, Burst: k.Burst, MaxInFlight: k.MaxInFlight}
	if e.limits.Rate > 0 && e.limits.Burst == 0 {
		e.limits.Burst = max(1, int(math.Ceil(e.limits.Rate)))
	}
	return e, nil
}

// checkPattern accepts a queue pattern: path.Match syntax over the
// characters of queue names.
func checkPattern(p string) error {
	if p == "" {
		return errors.New("an empty queue pattern matches nothing")
	}
	for _, c := range p {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-*?[]^", c)) {
			return fmt.Errorf("queue pattern %q: %q is not a queue name character or one of * ? [ ]", p, c)
		}
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("queue pattern %q: %w", p, err)
	}
	return nil
}

// matchQueue reports whether queue matches one of patterns.
func matchQueue(patterns []string, queue string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, queue); ok {
			return true
		}
	}
	return false
}

// HashKey is the hex SHA-256 of a key: what a file's sha256 field holds.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
