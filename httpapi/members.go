package httpapi

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/switchyard/switchyard/core"
)

// The catalog's membership over the admin API (docs/membership.md): the
// members of the embedded etcd cluster, adding one as a learner, removing
// a stopped one. `switchyard members` is its command line.

// MemberResponse is one member of the catalog's etcd cluster.
type MemberResponse struct {
	// ID is etcd's member id, in hex.
	ID string `json:"id"`
	// Name is its node's id; empty for a member added and not started yet.
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peer_urls"`
	ClientURLs []string `json:"client_urls"`
	// Learner: it receives the log but does not vote yet; its node
	// promotes it once it has caught up.
	Learner bool `json:"learner"`
	// Leader: the raft leader.
	Leader bool `json:"leader"`
	// Healthy: it answered a status request just now.
	Healthy bool `json:"healthy"`
} // @name Member

// MemberList is GET /v1/cluster/members.
type MemberList struct {
	Members []MemberResponse `json:"members"`
} // @name MemberList

// MemberAddRequest is POST /v1/cluster/members.
type MemberAddRequest struct {
	// Name is the new node's id (--name).
	Name string `json:"name"`
	// PeerURL is https://host:port, the address the new node's member
	// will listen on for the others (its --etcd-peer-addr).
	PeerURL string `json:"peer_url"`
} // @name MemberAddRequest

// MemberAdded is the answer of POST /v1/cluster/members: the learner, the
// members after, and how to start the new node.
type MemberAdded struct {
	Member  MemberResponse   `json:"member"`
	Members []MemberResponse `json:"members"`
	// InitialCluster is the new node's --initial-cluster: the members
	// after the change.
	InitialCluster string `json:"initial_cluster"`
	// Flags are the flags to start the new node with, beside the ones
	// every node of the cluster has (the cluster secret, its client
	// address, its other addresses).
	Flags []string `json:"flags"`
} // @name MemberAdded

// MemberRemoved is the answer of DELETE /v1/cluster/members/{member}.
type MemberRemoved struct {
	Member MemberResponse `json:"member"`
} // @name MemberRemoved

func memberResponse(m core.Member) MemberResponse {
	return MemberResponse{ID: m.ID, Name: m.Name, PeerURLs: nonNil(m.PeerURLs), ClientURLs: nonNil(m.ClientURLs), Learner: m.Learner, Leader: m.Leader, Healthy: m.Healthy}
}

// members is the membership admin, or a not_found refusal on a node
// without one.
func (s *Server) members() (core.MemberAdmin, error) {
	if s.cfg.Members == nil {
		return nil, &core.Error{Code: core.CodeNotFound, Detail: "this node has no catalog membership to manage"}
	}
	return s.cfg.Members, nil
}

// handleListMembers is GET /v1/cluster/members.
//
//	@Summary		List the catalog's members
//	@Description	The members of the catalog's etcd cluster, with the leader, the learners and whether each answers just now. See docs/membership.md.
//	@Tags			cluster
//	@ID				listMembers
//	@Produce		json
//	@Success		200	{object}	MemberList		"the members"
//	@Failure		401	{object}	apierr.Problem	"unauthenticated"
//	@Failure		403	{object}	apierr.Problem	"permission_denied"
//	@Failure		503	{object}	apierr.Problem	"catalog_unavailable"
//	@Security		BearerKey
//	@Router			/v1/cluster/members [get]
func (s *Server) handleListMembers(w http.ResponseWriter, r *http.Request) {
	admin, err := s.members()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ms, err := admin.Members(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := MemberList{Members: make([]MemberResponse, len(ms))}
	for i, m := range ms {
		out.Members[i] = memberResponse(m)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleAddMember is POST /v1/cluster/members.
//
//	@Summary		Add a catalog member
//	@Description	Adds a learner to the catalog's etcd cluster, one at a time: a node started with the answer's flags joins it. See docs/membership.md#growing-the-catalog-3--5.
//	@Tags			cluster
//	@ID				addMember
//	@Accept			json
//	@Produce		json
//	@Param			member	body		MemberAddRequest	true	"the new member"
//	@Success		201		{object}	MemberAdded			"the learner, and how to start its node"
//	@Failure		400		{object}	apierr.Problem		"malformed_json, invalid_member"
//	@Failure		401		{object}	apierr.Problem		"unauthenticated"
//	@Failure		403		{object}	apierr.Problem		"permission_denied"
//	@Failure		409		{object}	apierr.Problem		"member_exists, quorum_at_risk, member_address_unusable"
//	@Failure		415		{object}	apierr.Problem		"unsupported_media_type"
//	@Failure		503		{object}	apierr.Problem		"catalog_unavailable"
//	@Security		BearerKey
//	@Router			/v1/cluster/members [post]
func (s *Server) handleAddMember(w http.ResponseWriter, r *http.Request) {
	var req MemberAddRequest
	if err := s.readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	admin, err := s.members()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	added, after, err := admin.AddMember(r.Context(), req.Name, req.PeerURL)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := MemberAdded{Member: memberResponse(added), Members: make([]MemberResponse, len(after))}
	var ic []string
	for i, m := range after {
		out.Members[i] = memberResponse(m)
		for _, u := range m.PeerURLs {
			ic = append(ic, m.Name+"="+u)
		}
	}
	out.InitialCluster = strings.Join(ic, ",")
	peer := req.PeerURL
	if u, err := url.Parse(req.PeerURL); err == nil {
		peer = u.Host
	}
	out.Flags = []string{"--name", req.Name, "--etcd-peer-addr", peer, "--initial-cluster", out.InitialCluster, "--initial-cluster-state", "existing"}
	writeJSON(w, http.StatusCreated, out)
}

// handleRemoveMember is DELETE /v1/cluster/members/{member}.
//
//	@Summary		Remove a catalog member
//	@Description	Removes a stopped member of the catalog's etcd cluster, unless the quorum would be at risk. See docs/membership.md#shrinking-the-catalog-5--3.
//	@Tags			cluster
//	@ID				removeMember
//	@Produce		json
//	@Param			member	path		string			true	"member name (its node's id) or hex id"
//	@Success		200		{object}	MemberRemoved	"the member removed"
//	@Failure		401		{object}	apierr.Problem	"unauthenticated"
//	@Failure		403		{object}	apierr.Problem	"permission_denied"
//	@Failure		404		{object}	apierr.Problem	"member_not_found"
//	@Failure		409		{object}	apierr.Problem	"member_running, quorum_at_risk"
//	@Failure		503		{object}	apierr.Problem	"catalog_unavailable"
//	@Security		BearerKey
//	@Router			/v1/cluster/members/{member} [delete]
func (s *Server) handleRemoveMember(w http.ResponseWriter, r *http.Request) {
	admin, err := s.members()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	m, err := admin.RemoveMember(r.Context(), chi.URLParam(r, "member"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, MemberRemoved{Member: memberResponse(m)})
}
