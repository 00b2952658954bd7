#!/bin/sh
# A Switchyard worker written with nothing but sh and curl (and sed): it
# serves a queue over the node's HTTP worker API. Each job's input is a
# string of words; the worker streams the words back one output at a time
# and completes the job, and stops a job at once when the node cancels it.
#
#   SWITCHYARD_URL=http://127.0.0.1:8080 QUEUE=demo sh examples/worker.sh
#
# Settings (environment): SWITCHYARD_URL, QUEUE (demo), CAPABILITY
# (model=demo: one key=value), CONCURRENCY (1), DELAY (seconds between
# words, 0.05), NAME (sh-worker), SWITCHYARD_API_KEY (a key with the work
# role, for a node that checks keys: sent on the session and every post).
#
# The protocol (the OpenAPI document at /openapi.json describes it): POST
# /v1/queues/{queue}/workers opens a session and streams it as server-sent
# events — registered (the session id), then job and cancel events; the
# worker answers with JSON posts to /v1/workers/{session}/jobs/{job}/accept,
# output, complete or fail, every one naming the offer's generation, and
# posts /v1/workers/{session}/heartbeat when it has nothing else to say.
# When this script's stream ends, so does its session: the node gives its
# unfinished jobs back to the queue (or ends them worker_lost).
set -u
url=${SWITCHYARD_URL:-http://127.0.0.1:8080}
queue=${QUEUE:-demo}
capability=${CAPABILITY:-model=demo}
concurrency=${CONCURRENCY:-1}
delay=${DELAY:-0.05}
name=${NAME:-sh-worker}

dir=$(mktemp -d)
cleanup() {
	# Stop the heartbeat loop and any job still running, then forget them.
	for f in "$dir"/pid.*; do
		[ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null
	done
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
# The key goes to curl in a header file, not on its command line, where
# any user of the machine could read it.
: >"$dir/headers"
if [ -n "${SWITCHYARD_API_KEY:-}" ]; then
	printf 'Authorization: Bearer %s\n' "$SWITCHYARD_API_KEY" >"$dir/headers"
fi

# field NAME JSON: a string or number field of a one-line JSON object.
field() {
	printf '%s\n' "$2" | sed -n -e 's/.*"'"$1"'":"\([^"]*\)".*/\1/p' -e 't' -e 's/.*"'"$1"'":\([0-9][0-9]*\).*/\1/p'
}

# post JOB ACTION BODY: one of the worker's posts; prints the HTTP status.
post() {
	curl -s -o /dev/null -w '%{http_code}' -X POST -H @"$dir/headers" -H 'Content-Type: application/json' \
		-d "$3" "$url/v1/workers/$session/jobs/$1/$2"
}

# run JOB GEN INPUT: accept, one output per word, complete — or fail
# "cancelled" as soon as the node cancelled the job.
run() {
	id=$1 gen=$2
	post "$id" accept "{\"generation\":$gen}" >/dev/null
	set -f
	for word in $3; do
		if [ -e "$dir/cancel.$id" ]; then
			post "$id" fail "{\"generation\":$gen,\"code\":\"cancelled\",\"message\":\"cancelled by the node\"}" >/dev/null
			rm -f "$dir/pid.$id"
			return
		fi
		# Output is paced by the job's reader: past the window the answer
		# waits, then may be 429 reader_behind (nothing taken): post it
		# again after Retry-After (1s).
		while [ "$(post "$id" output "{\"generation\":$gen,\"data\":\"$word \"}")" = 429 ]; do
			sleep 1
		done
		sleep "$delay"
	done
	post "$id" complete "{\"generation\":$gen}" >/dev/null
	rm -f "$dir/pid.$id"
}

# heartbeat SECONDS: keeps the session alive while no job posts anything.
heartbeat() {
	while sleep "$1"; do
		curl -s -o /dev/null -X POST -H @"$dir/headers" "$url/v1/workers/$session/heartbeat" || return
	done
}

event=
curl -sN -H @"$dir/headers" -H 'Content-Type: application/json' -H 'Accept: text/event-stream' \
	-d "{\"name\":\"$name\",\"capabilities\":[\"$capability\"],\"concurrency\":$concurrency}" \
	"$url/v1/queues/$queue/workers" |
while IFS= read -r line; do
	case $line in
	"event: "*) event=${line#event: } ;;
	"data: "*) data=${line#data: } ;;
	"")
		case $event in
		registered)
			session=$(field session "$data")
			ms=$(field heartbeat_ms "$data")
			heartbeat "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))" &
			echo $! >"$dir/pid.heartbeat"
			echo "registered on $queue: session $session" >&2
			;;
		job)
			id=$(field job_id "$data")
			input=$(printf '%s\n' "$data" | sed -n 's/.*"input":"\([^"]*\)".*/\1/p')
			run "$id" "$(field generation "$data")" "$input" &
			echo $! >"$dir/pid.$id"
			;;
		cancel)
			touch "$dir/cancel.$(field job_id "$data")"
			;;
		closed)
			echo "the node ended the session: $data" >&2
			;;
		esac
		event= data=
		;;
	esac
done
echo "session ended" >&2
exit 1
