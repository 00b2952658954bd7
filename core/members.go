package core

import "context"

// Member is one member of the catalog's etcd cluster, as the membership
// admin API shows it (docs/membership.md).
type Member struct {
	// ID is etcd's member id, in hex as etcdctl prints it.
	ID string
	// Name is the member's name, its node's id; empty for a member that
	// was added and has not started yet.
	Name       string
	PeerURLs   []string
	ClientURLs []string
	// Learner: a member that receives the log but does not vote yet.
	Learner bool
	// Leader: the raft leader of the cluster, as the members that answered
	// said.
	Leader bool
	// Healthy: the member answered a status request just now.
	Healthy bool
}

// MemberAdmin changes the catalog's membership (catalog.Catalog implements
// it). Every refusal is a *Error with one of the member codes.
type MemberAdmin interface {
	// Members lists the members, each checked for health.
	Members(ctx context.Context) ([]Member, error)
	// AddMember adds a learner under name at peerURL (https://host:port):
	// the node started with that name and peer address, and
	// --initial-cluster-state existing, joins as it and promotes itself
	// once it has caught up. It returns the new member and the list after.
	// It refuses while a voting member's peer address is one the new
	// member cannot keep reaching (CodeMemberAddressUnusable).
	AddMember(ctx context.Context, name, peerURL string) (Member, []Member, error)
	// RemoveMember removes the member named target (its name, or its hex
	// id), refusing one that still runs and one whose removal would leave
	// fewer healthy voting members than a quorum of the rest.
	RemoveMember(ctx context.Context, target string) (Member, error)
}

// Codes of the membership admin API (docs/membership.md).
const (
	// CodeInvalidMember refuses a member name that is not a node id, or a
	// peer URL that is not https://host:port.
	CodeInvalidMember Code = "invalid_member"
	// CodeMemberNotFound: no member has that name or id.
	CodeMemberNotFound Code = "member_not_found"
	// CodeMemberExists refuses adding a member whose name or peer URL a
	// member already has, and a second learner while one has not been
	// promoted yet (etcd allows one at a time).
	CodeMemberExists Code = "member_exists"
	// CodeMemberRunning refuses removing a member that still answers: stop
	// its node first (a running member removed from under its node would
	// fence it for good; a leader is always a running member).
	CodeMemberRunning Code = "member_running"
	// CodeQuorumAtRisk refuses a change that would leave fewer healthy
	// voting members than the quorum of the cluster after it.
	CodeQuorumAtRisk Code = "quorum_at_risk"
	// CodeMemberAddressUnusable refuses adding a member while a voting
	// member's peer address is one the new member cannot keep reaching: a
	// port chosen at random when its node started (no --etcd-peer-addr:
	// it changes at every restart), or a loopback host while the new
	// member's is not. Restart that node with explicit addresses first
	// (docs/membership.md, "Growing a node that started alone").
	CodeMemberAddressUnusable Code = "member_address_unusable"
)
