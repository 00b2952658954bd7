package catalog

import (
	"testing"

	"github.com/switchyard/switchyard/core"
)

// A node record keeps its relay addresses; a record written without them
// (an older node) relays to its client-facing addresses.
func TestNodeRecordRelayAddrs(t *testing.T) {
	in := core.NodeInfo{ID: "n1", PeerAddr: "node-1:7070", HTTPAddr: "127.0.0.1:18080", GRPCAddr: "127.0.0.1:19090",
		RelayHTTPAddr: "node-1:8080", RelayGRPCAddr: "node-1:9090", State: core.StateOnline}
	b, err := encodeNode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := parseNode("n1", b)
	if err != nil {
		t.Fatal(err)
	}
	if out.RelayHTTP() != "node-1:8080" || out.RelayGRPC() != "node-1:9090" || out.HTTPAddr != in.HTTPAddr || out.GRPCAddr != in.GRPCAddr {
		t.Errorf("round trip of %s: %+v", b, out)
	}
	old, err := parseNode("n0", []byte(`{"v":1,"peer_addr":"10.0.0.1:7070","http_addr":"10.0.0.1:8080","grpc_addr":"10.0.0.1:9090","state":"online"}`))
	if err != nil {
		t.Fatal(err)
	}
	if old.RelayHTTP() != "10.0.0.1:8080" || old.RelayGRPC() != "10.0.0.1:9090" {
		t.Errorf("a record without relay addresses relays to %s and %s, want its http_addr and grpc_addr", old.RelayHTTP(), old.RelayGRPC())
	}
}
