package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/switchyard/switchyard/core"
)

// Key prefixes of the registries. Everything this package reads lives under
// one of them; other adapters may keep keys elsewhere in the same etcd.
const (
	nodesPrefix  = "/nodes/"
	queuesPrefix = "/q/"
)

// recordVersion is the "v" every record this package writes carries. Readers
// ignore it (and any field they do not know), so a newer writer that only
// adds fields is read by older nodes as before.
const recordVersion = 1

// NodeKey returns the catalog key of a node record: /nodes/{id}.
func NodeKey(id string) string { return nodesPrefix + id }

// DispatchKey returns the catalog key of a queue's dispatch record: /q/{queue}.
// Dispatcher claims, which other adapters make with etcd transactions, write
// this key with [EncodeDispatch].
func DispatchKey(queue string) string { return queuesPrefix + queue }

// ConsumerKey returns the catalog key of a consumer record:
// /q/{queue}/c/{id}.
func ConsumerKey(queue, id string) string { return queuesPrefix + queue + "/c/" + id }

// keyKind says which registry a key belongs to.
type keyKind int

const (
	kindUnknown keyKind = iota
	kindNode
	kindDispatch
	kindConsumer
)

// parsedKey is a catalog key taken apart.
type parsedKey struct {
	kind  keyKind
	node  string // kindNode
	queue string // kindDispatch, kindConsumer
	id    string // kindConsumer
}

// parseKey separates a key into its registry and names by counting path
// segments, never by prefix matching: "/q/a" is a dispatch record and
// "/q/a/c/b" a consumer record, and nothing a queue could be named can make
// one look like the other because names never contain '/'. Anything else
// (an extra segment, an invalid name) is kindUnknown and ignored by callers.
func parseKey(key string) parsedKey {
	segs := strings.Split(key, "/")
	if len(segs) < 3 || segs[0] != "" {
		return parsedKey{}
	}
	switch segs[1] {
	case "nodes":
		if len(segs) == 3 && core.ValidName(segs[2]) {
			return parsedKey{kind: kindNode, node: segs[2]}
		}
	case "q":
		switch {
		case len(segs) == 3 && core.ValidName(segs[2]):
			return parsedKey{kind: kindDispatch, queue: segs[2]}
		case len(segs) == 5 && segs[3] == "c" && core.ValidName(segs[2]) && core.ValidName(segs[4]):
			return parsedKey{kind: kindConsumer, queue: segs[2], id: segs[4]}
		}
	}
	return parsedKey{}
}

// nodeRecord is the JSON of /nodes/{id}.
type nodeRecord struct {
	V        int    `json:"v"`
	PeerAddr string `json:"peer_addr,omitempty"`
	HTTPAddr string `json:"http_addr,omitempty"`
	GRPCAddr string `json:"grpc_addr,omitempty"`
	// RelayHTTPAddr and RelayGRPCAddr are what other nodes dial to relay
	// to this one (core.NodeInfo). Older writers leave them out.
	RelayHTTPAddr string `json:"relay_http_addr,omitempty"`
	RelayGRPCAddr string `json:"relay_grpc_addr,omitempty"`
	Zone          string `json:"zone,omitempty"`
	State         string `json:"state"`
	// Incarnation is new at every start and every recovery of the node
	// (Catalog.Incarnation). Older writers leave it out.
	Incarnation string `json:"incarnation,omitempty"`
}

// dispatchRecord is the JSON of /q/{queue}.
type dispatchRecord struct {
	V          int    `json:"v"`
	Dispatcher string `json:"dispatcher"`
	ReplyTo    string `json:"reply_to,omitempty"`
	Zone       string `json:"zone,omitempty"`
}

// consumerRecord is the JSON of /q/{queue}/c/{id}.
type consumerRecord struct {
	V            int      `json:"v"`
	Node         string   `json:"node"`
	Name         string   `json:"name,omitempty"`
	Capabilities []string `json:"capabilities"`
	Concurrency  int      `json:"concurrency"`
	Zone         string   `json:"zone,omitempty"`
}

func encodeNode(n core.NodeInfo) ([]byte, error) {
	b, err := json.Marshal(nodeRecord{
		V:             recordVersion,
		PeerAddr:      n.PeerAddr,
		HTTPAddr:      n.HTTPAddr,
		GRPCAddr:      n.GRPCAddr,
		RelayHTTPAddr: n.RelayHTTPAddr,
		RelayGRPCAddr: n.RelayGRPCAddr,
		Zone:          n.Zone,
		State:         string(n.State),
		Incarnation:   n.Incarnation,
	})
	if err != nil {
		return nil, fmt.Errorf("encode node record: %w", err)
	}
	return b, nil
}

func parseNode(id string, value []byte) (core.NodeInfo, error) {
	var r nodeRecord
	if err := json.Unmarshal(value, &r); err != nil {
		return core.NodeInfo{}, fmt.Errorf("parse node record %q: %w", id, err)
	}
	// An unknown or empty state is kept as it is: only StateOnline is routed
	// to, so a state this version does not know is never mistaken for one it
	// may route to.
	return core.NodeInfo{
		ID:            id,
		PeerAddr:      r.PeerAddr,
		HTTPAddr:      r.HTTPAddr,
		GRPCAddr:      r.GRPCAddr,
		RelayHTTPAddr: r.RelayHTTPAddr,
		RelayGRPCAddr: r.RelayGRPCAddr,
		Zone:          r.Zone,
		State:         core.PeerState(r.State),
		Incarnation:   r.Incarnation,
	}, nil
}

// EncodeDispatch returns the value of a dispatch record (/q/{queue}) as this
// version writes it: versioned JSON.
func EncodeDispatch(d core.DispatchInfo) ([]byte, error) {
	if !core.ValidName(d.Dispatcher) {
		return nil, fmt.Errorf("encode dispatch record: dispatcher %q is not a valid node id", d.Dispatcher)
	}
	b, err := json.Marshal(dispatchRecord{V: recordVersion, Dispatcher: d.Dispatcher, ReplyTo: d.ReplyTo, Zone: d.Zone})
	if err != nil {
		return nil, fmt.Errorf("encode dispatch record: %w", err)
	}
	return b, nil
}

// ParseDispatch reads the value of a dispatch record. Besides versioned JSON
// it accepts a bare node id ("node-a", or the JSON string "\"node-a\""), the
// format of earlier nodes, as {Dispatcher: "node-a"}: old and new nodes must
// read each other's claims. Unknown JSON fields are ignored.
func ParseDispatch(value []byte) (core.DispatchInfo, error) {
	v := bytes.TrimSpace(value)
	switch {
	case len(v) == 0:
		return core.DispatchInfo{}, errors.New("parse dispatch record: empty value")
	case v[0] == '{':
		var r dispatchRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return core.DispatchInfo{}, fmt.Errorf("parse dispatch record: %w", err)
		}
		if !core.ValidName(r.Dispatcher) {
			return core.DispatchInfo{}, fmt.Errorf("parse dispatch record: dispatcher %q is not a valid node id", r.Dispatcher)
		}
		return core.DispatchInfo{Dispatcher: r.Dispatcher, ReplyTo: r.ReplyTo, Zone: r.Zone}, nil
	case v[0] == '"':
		var id string
		if err := json.Unmarshal(v, &id); err != nil {
			return core.DispatchInfo{}, fmt.Errorf("parse dispatch record: %w", err)
		}
		v = []byte(id)
	}
	// A bare node id. Validating it keeps arbitrary bytes from becoming a
	// dispatcher name that routing would then try to dial.
	if !core.ValidName(string(v)) {
		return core.DispatchInfo{}, fmt.Errorf("parse dispatch record: %q is neither JSON nor a node id", v)
	}
	return core.DispatchInfo{Dispatcher: string(v)}, nil
}

func encodeConsumer(c core.ConsumerInfo) ([]byte, error) {
	caps := c.Capabilities.Strings()
	if caps == nil {
		caps = []string{} // "capabilities":[] rather than null: simpler for other readers
	}
	b, err := json.Marshal(consumerRecord{
		V:            recordVersion,
		Node:         c.Node,
		Name:         c.Name,
		Capabilities: caps,
		Concurrency:  c.Concurrency,
		Zone:         c.Zone,
	})
	if err != nil {
		return nil, fmt.Errorf("encode consumer record: %w", err)
	}
	return b, nil
}

// parseConsumer reads a consumer record. A capability this version cannot
// parse is dropped rather than failing the whole record: a consumer with
// fewer capabilities only matches fewer jobs, which is the safe direction,
// whereas dropping the record would hide a worker a newer node registered.
func parseConsumer(queue, id string, value []byte) (c core.ConsumerInfo, dropped []string, err error) {
	var r consumerRecord
	if err := json.Unmarshal(value, &r); err != nil {
		return core.ConsumerInfo{}, nil, fmt.Errorf("parse consumer record %s/%s: %w", queue, id, err)
	}
	if !core.ValidName(r.Node) {
		return core.ConsumerInfo{}, nil, fmt.Errorf("parse consumer record %s/%s: node %q is not a valid node id", queue, id, r.Node)
	}
	caps := core.Capabilities{}
	for _, s := range r.Capabilities {
		one, err := core.ParseCapabilities([]string{s})
		if err != nil {
			dropped = append(dropped, s)
			continue
		}
		for k, vs := range one {
			for _, v := range vs {
				if !slices.Contains(caps[k], v) {
					caps[k] = append(caps[k], v)
				}
			}
		}
	}
	return core.ConsumerInfo{
		ID:           id,
		Queue:        queue,
		Node:         r.Node,
		Name:         r.Name,
		Capabilities: caps,
		Concurrency:  r.Concurrency,
		Zone:         r.Zone,
	}, dropped, nil
}
