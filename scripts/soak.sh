#!/usr/bin/env bash
# soak: the benchmark load against one demo node for SOAK_DURATION (default
# 10m), printing the node's memory every SOAK_EVERY (default 30s): RSS from
# /proc, the Go heap in use and the retained ended jobs from its /metrics.
# A node whose memory has a ceiling is flat after warm-up, below the bound
# docs/streams.md ("Memory") gives. At the end it resumes a job that ended
# before the load (long evicted by then) and prints the answer: 404
# job_not_found, at once.
#
# Not run by CI: it takes the duration, and figures depend on the machine.
# Extra node flags: SOAK_NODE_FLAGS (e.g. "--retain-bytes 33554432").
set -euo pipefail

BIN=${BIN:-bin/switchyard}
DURATION=${SOAK_DURATION:-10m}
EVERY=${SOAK_EVERY:-30}
CONCURRENCY=${SOAK_CONCURRENCY:-64}
HTTP=127.0.0.1:${SOAK_HTTP_PORT:-18180}
GRPC=127.0.0.1:${SOAK_GRPC_PORT:-19190}
URL=http://$HTTP

dir=$(mktemp -d)
node_pid=
bench_pid=
cleanup() {
	[ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null && wait "$bench_pid" 2>/dev/null
	[ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT

# shellcheck disable=SC2086 # SOAK_NODE_FLAGS is a list of flags
"$BIN" demo --name soak --http-addr "$HTTP" --grpc-addr "$GRPC" --data-dir "$dir/data" \
	--delay 0s --log-level warn ${SOAK_NODE_FLAGS:-} 2>"$dir/node.log" &
node_pid=$!
for _ in $(seq 100); do curl -sf "$URL/readyz" >/dev/null && break; sleep 0.1; done

# The job to resume at the end: streamed to its end now, its id and the
# resume token of its first event kept. The worker registers
# asynchronously, so retry until a stream opens.
for _ in $(seq 100); do
	if curl -sN -D "$dir/early.head" -o "$dir/early.sse" -H 'Content-Type: application/json' \
		-H 'Accept: text/event-stream' -d '{"input":"before the soak"}' "$URL/v1/queues/demo/jobs" &&
		grep -q '^event: done' "$dir/early.sse"; then
		break
	fi
	sleep 0.1
done
early=$(tr -d '\r' <"$dir/early.head" | awk -F': ' 'tolower($1) == "x-job-id" { print $2 }')
token=$(awk '/^id: / { print $2; exit }' "$dir/early.sse")
[ -n "$early" ] && [ -n "$token" ] || { echo "soak: could not stream the early job" >&2; cat "$dir/node.log" >&2; exit 1; }

metric() { curl -s "$URL/metrics" | awk -v m="$1" '$1 == m { printf "%.0f", $2 }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
sample() {
	local rss heap jobs bytes ev
	rss=$(awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$node_pid/status")
	heap=$(metric go_memstats_heap_inuse_bytes)
	jobs=$(metric switchyard_retention_jobs)
	bytes=$(metric switchyard_retention_bytes)
	ev=$(curl -s "$URL/metrics" | awk '/^switchyard_retention_evictions_total/ { n += $2 } END { printf "%.0f", n }')
	printf '%6ss  rss %8s MiB  heap %8s MiB  retained %7s jobs %8s MiB  evicted %9s\n' \
		"$1" "$(mib "$rss")" "$(mib "$heap")" "$jobs" "$(mib "$bytes")" "$ev"
}

echo "soak: $DURATION of switchyard bench (concurrency $CONCURRENCY, 16 outputs of 32 B) against $URL; node pid $node_pid"
"$BIN" bench --url "$URL" --concurrency "$CONCURRENCY" --duration "$DURATION" --outputs 16 --output-bytes 32 >"$dir/bench.out" 2>&1 &
bench_pid=$!
start=$(date +%s)
sample 0
while kill -0 "$bench_pid" 2>/dev/null; do
	for _ in $(seq "$EVERY"); do kill -0 "$bench_pid" 2>/dev/null || break; sleep 1; done
	sample $(($(date +%s) - start))
done
wait "$bench_pid" || { cat "$dir/bench.out"; exit 1; }
bench_pid=
cat "$dir/bench.out"
echo "retention evictions: $(curl -s "$URL/metrics" | awk '/^switchyard_retention_evictions_total/ { printf "%s ", $0 }')"

echo "resume of the job that ended before the load ($early), with its token:"
curl -s -m 10 -w '  -> HTTP %{http_code} in %{time_total}s\n' -H "Last-Event-ID: $token" "$URL/v1/jobs/$early/events"
