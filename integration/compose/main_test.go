//go:build compose

// Package compose_test runs fault tests against the demo cluster of
// docker-compose.yml: three nodes, each in its own container with its own
// address, each an embedded etcd member; a demo worker in a container of
// its own attached to each node. The tests drive Docker and compose with
// os/exec and the nodes over their published HTTP ports, as a user would:
// nothing here is in-process.
//
// Each case brings up a fresh cluster under a compose project of its own
// (sy-compose-<pid>-<case>), on a free /24 subnet and ephemeral host ports,
// so a demo cluster already running (make demo-up) is left alone, and tears
// it down at the end, volumes included. `make test-compose` builds the image
// and runs them; docs/compose.md says what each case does and what it
// expects.
//
// Environment: SWITCHYARD_DEMO_IMAGE (the image, default switchyard:dev),
// COMPOSE (the compose command; default the docker compose plugin if present,
// else docker-compose), SWITCHYARD_COMPOSE_KEEP=1 (leave the cluster of a
// failed case running, to look at it).
package compose_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
