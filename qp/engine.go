package qp

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// engine is what differs between the QP types: UD (udEngine), RD (rdQP,
// rd.go) and RC (rcEngine, over the connection in rcdata.go). The QP core
// — verbs entry points, queues, completions, the device timer and the
// datamover — calls its QP's engine and never dispatches on the type
// itself. A received datagram is classified once (udiwarp.Classify, the
// one home of the frame-type rule, in Device.deliver) and handed to the
// engine of the QP it names, as a UD frame (receiveUD) or an RD frame
// (receiveRD); an engine refuses the frames of the other type.
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
	// receiveUD takes a checked UD frame (a Send, a Terminate or a
	// Write-Record) that socket s read for this QP, and receiveRD an RD
	// frame; each returns false when the QP takes no frame of that type,
	// so that a frame reaches only a QP of its own type: an RD QP takes
	// nothing but RD frames from validated peers, or a spoofed UD Send
	// would take its posted receives and a spoofed Write-Record its
	// regions.
	receiveUD(s *Socket, seg udiwarp.Segment, src netip.AddrPort) bool
	receiveRD(s *Socket, h *reliability.Header, frame []byte, src netip.AddrPort) bool
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

// receiveUD: a Write-Record into the QP's regions (writerecord.go), or a
// Send or Terminate (recv.go).
func (e udEngine) receiveUD(s *Socket, seg udiwarp.Segment, src netip.AddrPort) bool {
	if seg.Control.Tagged() { // a Write-Record: ParseUDFrame allows no other tagged segment
		e.q.receiveWriteRecord(s, seg, src)
	} else {
		e.q.receive(seg, src)
	}
	return true
}

func (udEngine) receiveRD(*Socket, *reliability.Header, []byte, netip.AddrPort) bool { return false }

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

func (*rdQP) receiveUD(*Socket, udiwarp.Segment, netip.AddrPort) bool { return false }

func (r *rdQP) receiveRD(s *Socket, h *reliability.Header, frame []byte, src netip.AddrPort) bool {
	if !r.q.canReceive() {
		r.q.dev.stats.RxQPState.Add(1)
		return true
	}
	r.receive(s, h, frame, src)
	return true
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

// An RC QP takes its frames from its TCP connection (rcdata.go), none
// from a UDP socket.
func (rcEngine) receiveUD(*Socket, udiwarp.Segment, netip.AddrPort) bool { return false }

func (rcEngine) receiveRD(*Socket, *reliability.Header, []byte, netip.AddrPort) bool { return false }
