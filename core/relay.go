package core

import (
	"fmt"
	"time"
)

// Relays: a retried submission whose idempotency key made a job on another
// node (JobElsewhere) is handed to that node, which matches the key itself
// and answers with the same job. Both transports relay (httpapi as a
// reverse proxy, grpcapi as a client stream) and share these rules: a
// relayed request is never relayed again (no loops), the node is found in
// the cluster view, and the refusals are the same.

// RelayTarget is the address a submission answered jw goes to: addr picks
// it (NodeInfo.RelayHTTP or RelayGRPC, what other nodes dial, not what
// clients do) from the node's record in view.
// relayedBy is the node that relayed the request here, "" if none: a
// relayed request that would be relayed again is a fault, and a node that
// has left the cluster took the job with it (job_not_found).
func RelayTarget(view ClusterView, jw *JobElsewhere, relayedBy string, addr func(NodeInfo) string) (string, error) {
	if relayedBy != "" {
		return "", fmt.Errorf("a request relayed by %s for job %s on %s would be relayed again", relayedBy, jw.Job, jw.Node)
	}
	for _, n := range view.Nodes() {
		if n.ID == jw.Node {
			if a := addr(n); a != "" {
				return a, nil
			}
		}
	}
	return "", &Error{Code: CodeJobNotFound, Detail: fmt.Sprintf(
		"the job this Idempotency-Key made lived on node %s, which has left the cluster; its job ended with it", jw.Node)}
}

// RelayUnreachable is the refusal of a relay whose node could not be
// reached: the client retries.
func RelayUnreachable(jw *JobElsewhere) *Error {
	return &Error{Code: CodeDispatcherUnavailable, RetryAfter: time.Second, Detail: fmt.Sprintf(
		"the job this Idempotency-Key made lives on node %s, which could not be reached; retry", jw.Node)}
}
