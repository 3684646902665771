package qp

import (
	"fmt"
	"time"
)

// engine is what differs between the QP types: UD (udEngine), RD (rdQP,
// rd.go) and RC (rcEngine, over the connection in rcdata.go). The QP core
// — verbs entry points, queues, completions, the device timer and the
// datamover — calls its QP's engine and never dispatches on the type
// itself. Receiving is routed by frame, not by QP: udiwarp.Classify (the
// one home of the frame-type rule) sends RD frames to an RD QP's
// rdQP.receive and UD frames to a UD QP's receive path (recv.go), and a
// frame of one type never reaches a QP of the other.
type engine interface {
	// post takes a send WR that passed PostSend's common checks.
	post(wr *SendWR) error
	// drain sends what waits on socket s for the datamover, up to max
	// WRs where the engine queues WRs; more says work remains, full that
	// the socket filled up.
	drain(s *Socket, max int) (more, full bool)
	// checkModify refuses what the type cannot do in a Modify to next,
	// before anything changes.
	checkModify(attr *ModifyAttr, next QPState) error
	// flush completes the engine's own outstanding work with
	// WRFlushError (the QP going to ERROR; the caller holds sqMu).
	flush()
	// timer runs the engine's timed work at now and returns when it is
	// next due (zero: not until armed again).
	timer(now time.Time) time.Time
}

// newEngine is the engine of q's type.
func newEngine(q *QP, attr QPAttr) engine {
	switch attr.Type {
	case RD:
		q.rd = newRDQP(q, attr.RD)
		return q.rd
	case RC:
		return rcEngine{q}
	}
	return udEngine{q}
}

// checkDatagramModify is what a UD or RD QP needs to reach RTR or RTS:
// a socket.
func (q *QP) checkDatagramModify(attr *ModifyAttr, next QPState) error {
	if (next == StateRTR || next == StateRTS) && attr.Socket == nil && q.sock.Load() == nil {
		return fmt.Errorf("%w: a %v QP needs its bound socket to reach %v", ErrInvalidAttr, q.typ, next)
	}
	return nil
}

// udEngine is UD's engine: sends in the caller's goroutine or through the
// send queue and the datamover (send.go); receives need no state of its
// own (recv.go, landing.go).
type udEngine struct{ q *QP }

func (e udEngine) checkModify(attr *ModifyAttr, next QPState) error {
	return e.q.checkDatagramModify(attr, next)
}

func (e udEngine) flush() {}

func (e udEngine) timer(time.Time) time.Time { return time.Time{} }

// post is an RD send: queued for its peer, sent as the window allows.
func (r *rdQP) post(wr *SendWR) error {
	if err := r.q.checkDatagramWR(wr); err != nil {
		return err
	}
	return r.postOn(wr, r.q.sock.Load())
}

func (r *rdQP) checkModify(attr *ModifyAttr, next QPState) error {
	return r.q.checkDatagramModify(attr, next)
}

// rcEngine is RC's engine: the QP's connection (q.rc, rcdata.go) does the
// work; the device's rcPoller (rcpoller.go) drives it.
type rcEngine struct{ q *QP }

func (e rcEngine) post(wr *SendWR) error {
	if wr.AH != nil {
		return fmt.Errorf("%w: an RC QP sends to its connected peer: no address handle", ErrInvalidWR)
	}
	return e.q.postRC(wr)
}

// drain: an RC QP is on no socket's datamover list; its connection sends
// what waits when the poller finds room.
func (e rcEngine) drain(*Socket, int) (more, full bool) { return false, false }

func (e rcEngine) checkModify(attr *ModifyAttr, next QPState) error {
	if attr.Socket != nil {
		return fmt.Errorf("%w: an RC QP runs over its TCP connection, not a UDP socket", ErrInvalidAttr)
	}
	if (next == StateRTR || next == StateRTS) && e.q.rc.Load() == nil {
		return fmt.Errorf("%w: an RC QP reaches %v through Connect or RCRequest.Accept", ErrQPState, next)
	}
	return nil
}

func (e rcEngine) flush() {
	if c := e.q.rc.Load(); c != nil {
		c.flush()
	}
}

func (e rcEngine) timer(time.Time) time.Time {
	if e.q.rc.Load() != nil {
		e.q.rcAckTimer()
	}
	return time.Time{}
}
