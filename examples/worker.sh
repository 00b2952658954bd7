#!/bin/sh
# A Switchyard worker written with nothing but sh, curl and jq (every JSON
# value it reads or writes goes through jq, so any string — quotes,
# backslashes, unicode, newlines — comes through whole): it serves a queue
# over the node's HTTP worker API. Each job's input is a string of words;
# the worker streams the words back one output at a time, each with a
# space after it, and completes the job, and stops a job at once when the
# node cancels it. A post the node refuses fails the job, loudly: nothing
# is dropped silently.
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
command -v jq >/dev/null 2>&1 || {
	echo "worker.sh: jq is needed to read and write JSON (Debian: apt-get install jq)" >&2
	exit 2
}
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

# field NAME JSON: a field of a JSON object, as raw text.
field() {
	printf '%s\n' "$2" | jq -r --arg k "$1" '.[$k]'
}

# post JOB ACTION BODY: one of the worker's posts; prints the HTTP status,
# and the node's problem on stderr when it is not 204.
post() {
	code=$(curl -s -o "$dir/answer.$1" -w '%{http_code}' -X POST -H @"$dir/headers" \
		-H 'Content-Type: application/json' --data-binary "$3" "$url/v1/workers/$session/jobs/$1/$2")
	if [ "$code" != 204 ] && [ "$code" != 429 ]; then
		echo "worker.sh: $2 for job $1 answered $code: $(cat "$dir/answer.$1" 2>/dev/null)" >&2
	fi
	rm -f "$dir/answer.$1"
	printf '%s' "$code"
}

# give_up JOB GEN CODE MESSAGE: fails the job, so that its requester hears
# why instead of a job that ends completed without its output.
give_up() {
	post "$1" fail "$(jq -nc --argjson g "$2" --arg c "$3" --arg m "$4" '{generation:$g,code:$c,message:$m}')" >/dev/null
	rm -f "$dir/pid.$1"
}

# run JOB GEN DATA: accept, one output per word of the offer's input,
# complete — or fail "cancelled" as soon as the node cancelled the job.
run() {
	id=$1 gen=$2
	if ! input=$(printf '%s\n' "$3" | jq -er '.input | strings'); then
		give_up "$id" "$gen" invalid_input "the input is not a string of words"
		return
	fi
	code=$(post "$id" accept "{\"generation\":$gen}")
	if [ "$code" != 204 ]; then
		rm -f "$dir/pid.$id"
		return
	fi
	set -f
	for word in $input; do
		if [ -e "$dir/cancel.$id" ]; then
			give_up "$id" "$gen" cancelled "cancelled by the node"
			return
		fi
		# Output is paced by the job's reader: past the window the answer
		# waits, then may be 429 reader_behind (nothing taken): post it
		# again after Retry-After (1s). Any other refusal ends the job.
		body=$(jq -nc --argjson g "$gen" --arg d "$word " '{generation:$g,data:$d}')
		while code=$(post "$id" output "$body") && [ "$code" = 429 ]; do
			sleep 1
		done
		if [ "$code" != 204 ]; then
			give_up "$id" "$gen" worker_error "the node refused an output ($code)"
			return
		fi
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
	--data-binary "$(jq -nc --arg n "$name" --arg c "$capability" --argjson k "$concurrency" '{name:$n,capabilities:[$c],concurrency:$k}')" \
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
			run "$id" "$(field generation "$data")" "$data" &
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
