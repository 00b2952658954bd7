package coretest

import "github.com/switchyard/switchyard/core"

// IdleConn is a worker session that takes every offer, cancel and grant
// and never answers: a job offered to it stays open until it is cancelled
// or its TTL runs out. A test that needs a capable worker on a queue, and
// nothing from it, attaches one (core.Engine.AttachWorker).
type IdleConn struct{}

func (IdleConn) SendOffer(core.Offer) error                         { return nil }
func (IdleConn) SendCancel(string, uint64, core.Code) error         { return nil }
func (IdleConn) SendCredit(string, uint64, core.OutputCredit) error { return nil }
func (IdleConn) Close(error)                                        {}
