package peer

import (
	"errors"

	"github.com/switchyard/switchyard/core"
)

// Errors of the transport's configuration and of messages it cannot send.
var (
	// ErrStreamIdleTooShort: Config.StreamIdle must be at least
	// minIdleFactor × AckTimeoutCeiling, so a stalled stream is diagnosed
	// (its ack deadline passes) long before an idle close could hide it.
	ErrStreamIdleTooShort = errors.New("peer router: stream idle interval must be well above the ack timeout ceiling")
	// ErrHeartbeatTooLong: three Config.Heartbeat intervals (the
	// silence that drops a stream) must be shorter than the gRPC keepalive
	// interval (ClientKeepaliveTime), or a silent peer would be noticed by
	// keepalive first, and only by closing the whole connection.
	ErrHeartbeatTooLong = errors.New("peer router: stream heartbeat interval must be far shorter than the gRPC keepalive")
	// ErrUndeliverable is wrapped by a Forward whose job is larger than the
	// peer message limit or has no valid wire form: no transport could
	// carry it, so it is not tried.
	ErrUndeliverable = errors.New("peer: message cannot be sent to any peer")
	// ErrUnknownNode is wrapped by a Forward to a node the catalog view has
	// no record of.
	ErrUnknownNode = errors.New("node not in the catalog")
)

// Reasons core.Receiver.Undeliverable is given, and the reason label of
// switchyard_peer_messages_undeliverable_total.
const (
	// ReasonTooLarge: the message is larger than MaxMessageBytes allows.
	ReasonTooLarge = "too_large"
	// ReasonEncoding: the message has no valid wire form (an unknown kind,
	// or a string that is not UTF-8).
	ReasonEncoding = "encoding"
	// ReasonZone: a zone-scoped delivery to a node that is not (or no
	// longer, or not known to be) in the job's zone. Not a failure of the
	// job: the engine routes it again.
	ReasonZone = core.ReasonZone
)
