#!/usr/bin/env bash
# demo: the docker-compose demo cluster (docker-compose.yml), with whichever
# compose is installed: the `docker compose` plugin, else docker-compose.
#
#   scripts/demo.sh up              start it (the image must exist: make
#                                   image), wait until the three nodes are
#                                   healthy and see each other online and
#                                   the three workers are registered, then
#                                   print what to open
#   scripts/demo.sh down [--volumes]
#                                   remove its containers and network (and
#                                   its data volumes), then check that
#                                   nothing of it is left
#
# make demo-up and make demo-down call it. COMPOSE overrides the compose
# command, DEMO_PROJECT the compose project name (default switchyard); the
# SWITCHYARD_DEMO_* variables of docker-compose.yml apply.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT=${DEMO_PROJECT:-switchyard}
WAIT=${DEMO_WAIT:-120}

if [ -z "${COMPOSE:-}" ]; then
	if docker compose version >/dev/null 2>&1; then
		COMPOSE="docker compose"
	elif command -v docker-compose >/dev/null 2>&1; then
		COMPOSE=docker-compose
	else
		echo "demo: neither 'docker compose' nor docker-compose is installed" >&2
		exit 1
	fi
fi
read -ra compose_cmd <<<"$COMPOSE"
compose() { "${compose_cmd[@]}" -p "$PROJECT" -f docker-compose.yml "$@"; }

# published SERVICE PORT: the host address a service's port is published on
# (0.0.0.0 reads as 127.0.0.1).
published() {
	local a
	a=$(compose port "$1" "$2" 2>/dev/null | head -n1)
	echo "${a/0.0.0.0/127.0.0.1}"
}

# online URL: how many nodes the node at URL sees online.
online() { curl -fsS --max-time 2 "$1/v1/cluster/nodes" 2>/dev/null | grep -o '"state":"online"' | wc -l; }
# consumers URL: how many consumers of queue demo the node at URL sees.
consumers() { curl -fsS --max-time 2 "$1/v1/queues/demo" 2>/dev/null | grep -o '"concurrency":' | wc -l; }

# port_taken HOST PORT: something on this host answers on HOST:PORT.
port_taken() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# check_ports: every host port the demo publishes is free, or already the
# demo's own (a second demo-up on a running demo): otherwise say which and
# start nothing.
check_ports() {
	local bind=${SWITCHYARD_DEMO_BIND:-127.0.0.1} taken=() i svc p cport
	[ "$bind" = 0.0.0.0 ] && bind=127.0.0.1
	for i in 1 2 3; do
		svc=node-$i
		for cport in 8080 9090; do
			if [ $cport = 8080 ]; then p=HTTP; else p=GRPC; fi
			p=SWITCHYARD_DEMO_${p}_$i
			p=${!p:-$((cport + i - 1))}
			if port_taken "$bind" "$p" && [ "$(published "$svc" "$cport")" != "$bind:$p" ]; then
				taken+=("$bind:$p ($svc $cport)")
			fi
		done
	done
	if ((${#taken[@]})); then
		echo "demo: host ports in use: ${taken[*]}; nothing started. Free them, or pick others (SWITCHYARD_DEMO_HTTP_1..3, SWITCHYARD_DEMO_GRPC_1..3: docs/compose.md, Settings)" >&2
		exit 1
	fi
}

up() {
	check_ports
	# Workers start once their node is healthy (depends_on), so this returns
	# after the three nodes have passed their health check. A start that
	# fails half way (a port taken meanwhile) is taken down again, data
	# volumes kept: nothing is left half running.
	if ! compose up -d --remove-orphans; then
		echo "demo: compose up failed; removing what it started (the data volumes stay)" >&2
		compose down --remove-orphans >&2 || true
		exit 1
	fi
	local u1 u2 u3 grpc1
	u1=http://$(published node-1 8080)
	u2=http://$(published node-2 8080)
	u3=http://$(published node-3 8080)
	grpc1=$(published node-1 9090)
	local start=$SECONDS ready=
	while ((SECONDS - start < WAIT)); do
		ready=yes
		for u in "$u1" "$u2" "$u3"; do
			[ "$(online "$u")" -eq 3 ] || ready=
		done
		[ "$(consumers "$u1")" -eq 3 ] || ready=
		[ -n "$ready" ] && break
		sleep 1
	done
	if [ -z "$ready" ]; then
		echo "demo: the cluster is not ready after ${WAIT}s; its state and recent logs:" >&2
		compose ps >&2
		compose logs --tail 20 >&2
		exit 1
	fi
	cat <<EOF

Switchyard demo cluster is up ($COMPOSE, project $PROJECT): three nodes, zones
z1 (node-1) and z2 (node-2, node-3), a demo worker on each node.

  The web page of each node (playground, live cluster view):
    node-1 $u1/    node-2 $u2/    node-3 $u3/

  Stream a job from node-1 that runs on node-3 (only worker-3, attached to
  node-3, has model=large):
    curl -N -H 'Content-Type: application/json' -H 'Accept: text/event-stream' \\
      -d '{"capabilities":{"model":"large"},"input":"from node one to node three"}' $u1/v1/queues/demo/jobs

  Kill node-3 and watch the cluster view on node-1 mark it spare:
    $COMPOSE -p $PROJECT kill node-3      then: $COMPOSE -p $PROJECT start node-3

  Attach your own worker to node-1's gRPC port: $grpc1
  Logs: $COMPOSE -p $PROJECT logs -f node-1 worker-3
  Stop: make demo-down   (make demo-down VOLUMES=1 also deletes the data)

EOF
}

down() {
	compose down --remove-orphans "$@"
	local left
	left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")
	left+=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT")
	if [ -n "$left" ]; then
		echo "demo: project $PROJECT still has containers or networks: $left" >&2
		exit 1
	fi
}

case ${1:-} in
up) up ;;
down) shift && down "$@" ;;
*)
	echo "usage: scripts/demo.sh up | down [--volumes]" >&2
	exit 2
	;;
esac
