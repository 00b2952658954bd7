GO       ?= go
BIN      := bin/switchyard
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X 'main.Version=$(VERSION)'
TOOLBIN  := $(CURDIR)/.bin
PROTOS   := $(shell find proto -name '*.proto' -not -path 'proto/third_party/*')
FUZZTIME ?= 10s
# BenchmarkProcesses (the separate-process table): rounds, and time per setup,
# shape and concurrency level in each round
PROCS_ROUNDS ?= 2
PROCS_DUR ?= 3s
# jobs per setup and concurrency level in `make bench`'s BenchmarkCluster
CLUSTER_JOBS ?= 2000
# BenchmarkCluster's jobs per setup and level for the 16-output jobs (issue 15).
CLUSTER_JOBS_16 ?= 1000
# BenchmarkTracing's jobs per setup and concurrency level
TRACING_JOBS ?= 1000

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: build run test test-short test-election lint fuzz bench bench-tracing bench-idle soak faults scale soak-faults test-restart proto openapi generate tools verify clean image demo-up demo-down test-compose

## build: the one binary, bin/switchyard
build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/switchyard

## run: one node (embedded catalog) plus a demo worker; prints the web page URL and a curl line
run: build
	$(BIN) demo --name node-1 --data-dir data/node-1

## test: vet, then every test with the race detector and leak checks, then short fuzz runs
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=5s

## lint: staticcheck (pinned), the fault suite's, the compose tests' and
## make scale's files (build tags faults, compose and scale) included, so
## the harnesses CI does not run still compile and pass its checks
lint:
	$(GO) run $(STATICCHECK) -tags faults,compose,scale ./...

## test-election: the catalog's embedded 3-member cluster losing its etcd
## leader (three times) and its quorum, under CPU load on every core, alone
## so the load starves no other package's tests (docs/cluster.md, "The
## catalog's own leader election"); about a minute
test-election:
	SWITCHYARD_CPU_LOAD=1 $(GO) test -race -count=1 -v -timeout 5m -run '^TestEmbeddedCluster(SurvivesLeaderLoss|QuorumLossFencesAndRecovers)$$' ./catalog/

## test-short: unit tests only (skips the binary build)
test-short:
	$(GO) test -race -count=1 -short ./...

## fuzz: short runs of every fuzz target (the corpus lives in testdata/fuzz)
# Each run's output is kept in a temp file and printed when the run fails.
# A run whose only failure is a bare "context deadline exceeded" with no
# failing input written is not a finding: it is the race in Go's fuzz
# coordinator at the end of a duration -fuzztime (go.dev/issue/75804; go1.26.8
# has it), so that run is repeated once. Drop the retry once go.mod requires a
# Go whose internal/fuzz has the fix.
fuzz:
	@set -e; log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	for file in $$(git ls-files '*_test.go' | xargs grep -l '^func Fuzz'); do \
	  pkg=./$$(dirname $$file); \
	  for f in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
	    for try in 1 2; do \
	      echo "fuzz $$pkg $$f"; \
	      if $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg >"$$log" 2>&1; then break; fi; \
	      cat "$$log"; \
	      if [ $$try = 1 ] && grep -qx '    context deadline exceeded' "$$log" && ! grep -q 'Failing input written to' "$$log"; then \
	        echo "fuzz $$pkg $$f: fuzz coordinator -fuzztime race (go.dev/issue/75804), not a finding: running it again"; \
	        continue; \
	      fi; \
	      exit 1; \
	    done; \
	  done; \
	done

## bench: first what a user runs (BenchmarkProcesses, docs/perf.md): the
## 3-node cluster, its SDK worker and two bare relay floors (opaque frames,
## the reference kit's shape; the worker protocol), each a process,
## cross-node, co-located and over the gRPC JobService (Submit and
## SubmitBatched), 16 outputs of 32 B
## and of 4 KiB at concurrency 1 and 64, CPU split between nodes and
## workers, ratios to the opaque relay; then a node with a demo worker, driven by
## `switchyard bench` (4 outputs;
## 16 of 32 B over HTTP/SSE and over the gRPC JobService, Submit and
## SubmitBatched); the in-process
## cluster benchmark (co-located vs cross-node vs a bare relay, all in one
## process with the SDK worker: the second table) with jobs
## of 4 outputs, 16 of 32 B and 16 of 4 KiB (issue 15's table); one
## stream's throughput (100,000 outputs through a node, across nodes, and from
## a plain SSE writer); the peer request leg streamed vs unary; tracing off,
## on at 1 % and on at 100 % (bench-tracing); the scheduling tables (affinity
## hit ratio, keys moved and balance; fair share between two subjects and a
## priority's wait: docs/scheduling.md). Prints figures, never fails on a
## time.
bench: build
	$(GO) test -run '^$$' -bench '^BenchmarkProcesses$$' -benchtime 1x ./integration/ -args -procs.rounds $(PROCS_ROUNDS) -procs.dur $(PROCS_DUR)
	@set -e; dir=$$(mktemp -d); \
	$(BIN) demo --name bench --http-addr 127.0.0.1:18080 --grpc-addr 127.0.0.1:19090 --data-dir $$dir --delay 0s --log-level warn 2>/dev/null & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -rf '"$$dir" EXIT; \
	for i in $$(seq 50); do curl -sf http://127.0.0.1:18080/readyz >/dev/null && break; sleep 0.1; done; \
	sleep 0.5; $(BIN) bench --url http://127.0.0.1:18080 --jobs 1000 --concurrency 1,64; \
	echo "16 outputs of 32 B, HTTP/SSE:"; $(BIN) bench --url http://127.0.0.1:18080 --jobs 1000 --concurrency 1,64 --outputs 16 --output-bytes 32; \
	echo "16 outputs of 32 B, gRPC JobService:"; $(BIN) bench --url http://127.0.0.1:18080 --grpc --grpc-addr 127.0.0.1:19090 --jobs 1000 --concurrency 1,64 --outputs 16 --output-bytes 32; \
	echo "16 outputs of 32 B, gRPC JobService, SubmitBatched:"; $(BIN) bench --url http://127.0.0.1:18080 --grpc --grpc-batched --grpc-addr 127.0.0.1:19090 --jobs 1000 --concurrency 1,64 --outputs 16 --output-bytes 32
	$(GO) test -run '^$$' -bench . -benchmem ./core/resume ./httpapi
	$(GO) test -run '^$$' -bench '^BenchmarkCluster$$' -benchtime 1x ./integration/ -args -cluster.jobs $(CLUSTER_JOBS)
	$(GO) test -run '^$$' -bench '^BenchmarkCluster$$' -benchtime 1x ./integration/ -args -cluster.jobs $(CLUSTER_JOBS_16) -cluster.outputs 16 -cluster.output-bytes 32
	$(GO) test -run '^$$' -bench '^BenchmarkCluster$$' -benchtime 1x ./integration/ -args -cluster.jobs $(CLUSTER_JOBS_16) -cluster.outputs 16 -cluster.output-bytes 4096
	$(GO) test -run '^$$' -bench '^BenchmarkStreamThroughput$$' -benchtime 1x ./integration/
	$(GO) test -run '^$$' -bench '^Benchmark(Affinity|FairShare)$$' -benchtime 1x ./core/
	$(MAKE) --no-print-directory bench-tracing
	@set -e; out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	$(GO) test -run '^$$' -bench '^BenchmarkDeliver$$' ./peer/ >"$$out" || { cat "$$out"; exit 1; }; \
	awk '{ print } \
	  /^BenchmarkDeliver\// { split($$1, p, "/"); m = p[3]; sub(/-[0-9]+$$/, "", m); \
	    for (i = 2; i <= NF; i++) if ($$i == "µs/delivery") v[p[2] "/" m] = $$(i-1) } \
	  END { n = split("send forward", k, " "); for (i = 1; i <= n; i++) if (v[k[i] "/unary"] > 0) \
	    printf "request leg, %s: streamed %.1f µs, unary %.1f µs per delivery: streamed/unary %.2fx (target <= 0.6x)\n", \
	      k[i], v[k[i] "/streamed"], v[k[i] "/unary"], v[k[i] "/streamed"] / v[k[i] "/unary"] }' "$$out"

## bench-tracing: what tracing costs a job (docs/tracing.md, "Cost"): three
## 2-node clusters, export off, on at 1 % and on at 100 % (OTLP to a receiver
## in the process), co-located and cross-node jobs interleaved in one run;
## prints latencies, CPU per job, jobs/s, spans per job and the ratios to off
bench-tracing:
	$(GO) test -run '^$$' -bench '^BenchmarkTracing$$' -benchtime 1x ./integration/ -args -tracing.jobs $(TRACING_JOBS)

## bench-idle: what an open, idle SSE job stream costs a node: RSS, heap,
## stacks and goroutines per stream with IDLE_STREAMS (10,000) open on one node
## (the real binary, its worker in another process), beside a plain net/http
## SSE server in the same run. It needs about 2 x IDLE_STREAMS file
## descriptors per process: see docs/running.md, "Many open streams".
IDLE_STREAMS ?= 10000
bench-idle:
	$(GO) test -run '^$$' -bench '^BenchmarkIdleStreams$$' -benchtime 1x -timeout 20m ./integration/ -args -idle.streams $(IDLE_STREAMS)

## soak: the benchmark load (64 streams, 16 outputs of 32 B) against one demo
## node for SOAK_DURATION (10m), printing its RSS, heap and retained ended
## jobs every 30s, then the answer to a resume of an evicted job. Not in CI.
SOAK_DURATION ?= 10m
soak: build
	SOAK_DURATION=$(SOAK_DURATION) BIN=$(BIN) scripts/soak.sh

## faults: the fault suite, each case once, one after another (docs/faults.md).
## Prints a ledger per case. The partition cases need root (network
## namespaces) and are skipped, with a message, without it.
faults:
	$(GO) vet -tags faults ./integration/
	$(GO) test -tags faults -race -count=1 -v -timeout 15m -run '^TestFaults$$' ./integration/

## scale: the real binary as a growing cluster on this machine (SCALE_SIZES
## nodes: three embed the catalog's etcd members, the rest are their
## clients), a load tool of SDK worker sessions and HTTP/SSE requesters in
## one process; per size, CPU, RSS, goroutines, sockets, peer messages, etcd
## requests and watch events idle, loaded and under churn, routing messages
## per job, a worker's time to be routable everywhere, a new queue's first
## job; then the fault cases at the largest size. Prints one table
## (docs/scale.md). SCALE_BIN measures another build. Not in CI: about 4
## minutes.
SCALE_SIZES ?= 3,6,12,24,48
SCALE_BIN ?= $(CURDIR)/$(BIN)
scale: build
	$(GO) test -tags scale -count=1 -v -timeout 15m -run '^TestScale$$' ./integration/ -args -scale.sizes $(SCALE_SIZES) -scale.bin $(SCALE_BIN)

## test-restart: the rolling restart under load (integration/restart_test.go,
## docs/faults.md): the real binary as three nodes with workers on two, 30
## clients streaming jobs, SIGTERM and a new process for each node in turn;
## then the catalog's membership under the same load
## (integration/membership_test.go, docs/membership.md): a node replacing
## its member after losing its data directory, a node moved to another
## address, the catalog grown from 3 to 5 members and shrunk back with
## `switchyard members`. Prints the member lists and the ledger per window
## and fails on a lost, failed, refused or doubled job. About two minutes;
## no root needed. CI runs it.
test-restart:
	FAULTS_LOOPBACK=1 $(GO) test -tags faults -race -count=1 -v -timeout 10m -run '^(TestRollingRestart|TestMembership)$$' ./integration/

## soak-faults: the partition and etcd-leader cases FAULT_RUNS times each;
## prints how many runs of each passed. Not in CI.
FAULT_RUNS ?= 10
soak-faults:
	FAULT_RUNS=$(FAULT_RUNS) $(GO) test -tags faults -race -count=1 -v -timeout 180m -run '^TestFaultsSoak$$' ./integration/

## image: the container image $(IMAGE): a static binary (CGO disabled) built
## here for the Docker engine's OS and architecture, FROM scratch; pulls nothing
IMAGE ?= switchyard:dev
# The label value that marks this checkout's builds of $(IMAGE): make image
# prunes the dangling images that carry it (the build it replaced), and no
# other checkout's or image's.
IMAGE_BUILD = $(shell printf '%s\n%s' '$(CURDIR)' '$(IMAGE)' | cksum | cut -d' ' -f1)
image:
	@command -v docker >/dev/null 2>&1 || { echo "make image: docker is not installed"; exit 1; }
	@rm -rf bin/image && mkdir -p bin/image/data
	CGO_ENABLED=0 GOOS=linux GOARCH=$$(docker version -f '{{.Server.Arch}}') \
	  $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/image/switchyard ./cmd/switchyard
	docker build -q -t $(IMAGE) --build-arg VERSION=$(VERSION) --label dev.switchyard.build=$(IMAGE_BUILD) -f Dockerfile bin/image
	@# The image this build replaced, now untagged, would pile up build after
	@# build: pruned, and only it (its label is this checkout's and image's).
	@docker image prune -f --filter label=dev.switchyard.build=$(IMAGE_BUILD) >/dev/null
	@docker image ls $(IMAGE) --format '{{.Repository}}:{{.Tag}} {{.Size}}'

# The compose command: the docker compose plugin if present, else docker-compose.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo 'docker compose' || echo docker-compose)
DEMO_PROJECT ?= switchyard
# test-compose: a -run pattern for the cases (default all)
COMPOSE_RUN ?= .
# test-compose: how many cases (each a cluster of its own) run at once
COMPOSE_PARALLEL ?= 2

## demo-up: build the image and start the demo cluster (docker-compose.yml):
## three nodes in two zones, a worker on each; waits until ready, prints what to open
demo-up: image
	COMPOSE="$(COMPOSE)" DEMO_PROJECT=$(DEMO_PROJECT) SWITCHYARD_DEMO_IMAGE=$(IMAGE) scripts/demo.sh up

## demo-down: remove the demo cluster's containers and network (VOLUMES=1: its data too)
demo-down:
	COMPOSE="$(COMPOSE)" DEMO_PROJECT=$(DEMO_PROJECT) scripts/demo.sh down $(if $(VOLUMES),--volumes)

## test-compose: fault tests against a compose cluster of its own (other ports,
## another subnet, so a running demo is left alone); skipped without Docker
test-compose:
	@if ! docker info >/dev/null 2>&1; then echo "test-compose: skipped: no Docker engine here (docker info fails)"; exit 0; fi; \
	if ! $(COMPOSE) version >/dev/null 2>&1; then echo "test-compose: skipped: neither the docker compose plugin nor docker-compose is installed"; exit 0; fi; \
	$(MAKE) --no-print-directory image IMAGE=switchyard:compose-test && \
	COMPOSE="$(COMPOSE)" SWITCHYARD_DEMO_IMAGE=switchyard:compose-test \
	  $(GO) test -race -tags compose -count=1 -v -timeout 30m -parallel $(COMPOSE_PARALLEL) -run '$(COMPOSE_RUN)' ./integration/compose/

tools:
	GOBIN=$(TOOLBIN) $(GO) install tool

## proto: regenerate the gRPC code and the grpc-gateway handlers (needs protoc:
## apt-get install protobuf-compiler; google/api's protos are vendored in
## proto/third_party)
proto: tools
	PATH=$(TOOLBIN):$$PATH protoc -I proto -I proto/third_party \
	  --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	  --grpc-gateway_out=proto --grpc-gateway_opt=paths=source_relative \
	  --go-vtproto_out=proto --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size \
	  $(PROTOS)

## openapi: regenerate the OpenAPI document (openapi/openapi.json and .yaml)
## from the HTTP handlers' swag annotations, and the two Go clients generated
## from it, by oapi-codegen (openapi/client) and by ogen (openapi/ogen); all
## generators are pinned as Go tool dependencies
openapi: tools
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(TOOLBIN)/swag init --quiet --requiredByDefault --dir httpapi,apierr --generalInfo openapi.go --outputTypes json --output "$$tmp"; \
	$(GO) run ./openapi/gen "$$tmp/swagger.json" openapi; \
	$(TOOLBIN)/oapi-codegen -config openapi/client/oapi-codegen.yaml openapi/openapi.json; \
	$(TOOLBIN)/ogen -config openapi/ogen/ogen.yml -target openapi/ogen -package ogen -clean openapi/openapi.json 2>"$$tmp/ogen.log" || \
	  { cat "$$tmp/ogen.log"; exit 1; }

## generate: everything generated (protobuf, gateway, OpenAPI, both clients)
generate: proto openapi

## verify: fail when generated code is stale (protobuf, gateway, the OpenAPI
## document, both clients), the tree is not gofmt-clean, or staticcheck finds
## something
verify: generate lint
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	@git diff --exit-code -- proto openapi && test -z "$$(git status --porcelain -- proto openapi)" || \
	  { git status --short -- proto openapi; echo "generated code is stale: run make generate and commit"; exit 1; }

clean:
	rm -rf bin .bin
