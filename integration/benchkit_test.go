package integration_test

import (
	"encoding/json"
	"testing"

	"github.com/switchyard/switchyard/integration/benchkit"
	"github.com/switchyard/switchyard/worker"
)

// The load generator's gRPC modes (switchyard bench --grpc, and
// --grpc-batched) run jobs to their end through the public JobService
// (Submit, SubmitBatched), the HTTP mode through SSE, and
// the nodes' CPU is read from their /metrics.
func TestBenchkitModesAndNodeCPU(t *testing.T) {
	n := MustStartNode(t, nil)
	MustStartWorker(t, n, worker.Config{Name: "w", Concurrency: 8}, worker.Tokens(0))
	body, _ := json.Marshal(map[string]any{"input": benchkit.Input(16, 32), "options": map[string]any{"delay_ms": 0}})
	client := benchkit.NewClient()
	defer client.CloseIdleConnections()
	metrics := []string{baseURL(n) + "/metrics"}

	cpu0, err := benchkit.ProcessCPU(t.Context(), client, metrics)
	if err != nil {
		t.Fatalf("ProcessCPU: %v", err)
	}
	grpcJob, closeConn, err := benchkit.DialGRPCJob(n.GRPCAddr(), "demo", body, false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn() //nolint:errcheck // only read from
	batchedJob, closeBatched, err := benchkit.DialGRPCJob(n.GRPCAddr(), "demo", body, true)
	if err != nil {
		t.Fatal(err)
	}
	defer closeBatched() //nolint:errcheck // only read from
	for name, job := range map[string]benchkit.JobFunc{
		"grpc":         grpcJob,
		"grpc-batched": batchedJob,
		"http":         benchkit.HTTPJob(client, baseURL(n)+"/v1/queues/demo/jobs", body),
	} {
		r := benchkit.RunJobs(t.Context(), job, 20, 4)
		if r.Failed != 0 || len(r.Last) != 20 || len(r.First) != 20 || r.First[0] <= 0 {
			t.Errorf("%s: %d done, %d failed, first %v", name, len(r.Last), r.Failed, r.First)
		}
	}
	cpu1, err := benchkit.ProcessCPU(t.Context(), client, metrics)
	if err != nil {
		t.Fatalf("ProcessCPU: %v", err)
	}
	if cpu1 < cpu0 || cpu0 <= 0 {
		t.Errorf("process CPU %v then %v: want positive and not decreasing", cpu0, cpu1)
	}
}
