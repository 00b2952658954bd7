package httpapi

import (
	"net/http"

	"github.com/switchyard/switchyard/core"
)

// AffinityKeyHeader and PriorityHeader give a chat completion job the
// envelope's affinity_key and priority, which the OpenAI request has no
// fields for. Without the header, the request's user field is the
// affinity key: one end user's conversations go to one worker, whose
// prefix cache holds them (docs/openai.md).
const (
	AffinityKeyHeader = "X-Switchyard-Affinity-Key"
	PriorityHeader    = "X-Switchyard-Priority"
)

// OnWorkerLostHeader opts a chat completion into restarts
// ("restart"): the envelope's on_worker_lost, which the OpenAI request
// has no field for. Without it the job fails worker_lost if its worker is
// lost after it produced output, as an OpenAI client expects.
const OnWorkerLostHeader = "X-Switchyard-On-Worker-Lost"

// chatLostPolicy is the on_worker_lost a chat completion asks for.
func chatLostPolicy(r *http.Request) (core.LostPolicy, error) {
	h := r.Header.Get(OnWorkerLostHeader)
	if h == "" {
		return core.LostFail, nil
	}
	return core.ParseLostPolicy(h, OnWorkerLostHeader)
}

// chatScheduling is the affinity key and priority a chat completion asks
// for: the headers', the key falling back to the request's user.
func chatScheduling(r *http.Request, req *chatRequest) (string, int, error) {
	key, field := r.Header.Get(AffinityKeyHeader), AffinityKeyHeader
	if key == "" && req.user != "" {
		key, field = req.user, "user"
	}
	if key != "" {
		if err := core.CheckAffinityKey(key, field); err != nil {
			return "", 0, err
		}
	}
	priority := 0
	if h := r.Header.Get(PriorityHeader); h != "" {
		p, err := core.ParsePriority(h, PriorityHeader)
		if err != nil {
			return "", 0, err
		}
		priority = p
	}
	return key, priority, nil
}
