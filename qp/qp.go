package qp

import (
	"fmt"

	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/writerecord"
)

// QPType is the transport service of a QP, the new input modifier of
// QP creation that seed 003 calls for.
type QPType uint8

const (
	UD QPType = iota + 1 // unreliable datagram over UDP
	RD                   // reliable datagram over UDP (package reliability)
	RC                   // reliable connection: TCP + MPA
)

func (t QPType) String() string {
	switch t {
	case UD:
		return "UD"
	case RD:
		return "RD"
	case RC:
		return "RC"
	}
	return "QP type " + strconv.Itoa(int(t))
}

// QPState is a verbs QP state.
type QPState uint32

const (
	StateReset QPState = iota
	StateInit
	StateRTR
	StateRTS
	StateError
)

func (s QPState) String() string {
	switch s {
	case StateReset:
		return "RESET"
	case StateInit:
		return "INIT"
	case StateRTR:
		return "RTR"
	case StateRTS:
		return "RTS"
	case StateError:
		return "ERROR"
	}
	return "state " + strconv.Itoa(int(s))
}

// QPCaps are a QP's capacities.
type QPCaps struct {
	MaxSendWR  int // send queue depth; default 256
	MaxRecvWR  int // receive queue depth (ignored with an SRQ); default 256
	MaxSendSGE int // default 4, at most 16
	MaxRecvSGE int // default 4, at most 16
	MaxInline  int // largest inline send; default 256
}

const maxSGE = 16

// QPAttr are the creation attributes of a QP.
type QPAttr struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ // receives come from this SRQ instead of the QP's own queue
	Caps   QPCaps
	// SRQLimit caps how many SRQ receives this QP may hold at once (taken
	// and completed but not yet polled); 0 means no cap. Over it, a message
	// is dropped, counted and reported with AsyncSRQOverdraft (seed 004).
	// It is SRQLimits.Hard when that is 0.
	SRQLimit int
	// SRQLimits are the QP's limits on what it holds of its SRQ: soft and
	// hard, per source address, out of order (RD), a reservation (seed
	// 004; SetSRQLimits changes them at run time).
	SRQLimits SRQLimits
	// WriteRecordSegment is the largest Write-Record payload per datagram
	// this QP sends: about 1400 for a 1500-byte Ethernet path; default and
	// maximum the socket's MaxWriteRecordSegment (65 469 over IPv4, 65 489
	// over IPv6).
	WriteRecordSegment int
	// WriteRecord configures the target side of Write-Record at this QP:
	// per-message timeout, the policy at the deadline, and the caps on
	// messages in progress.
	WriteRecord writerecord.Config
	// Record says how the QP records Write-Record messages that arrive:
	// as CQ entries on its receive CQ (RecordCQ, the default), in the
	// target region's validity map (RecordMap, MR.TrackValidity: the
	// target then reads the map to learn what arrived), or both
	// (RecordCQ|RecordMap, RecordBoth).
	Record RecordMode
	// ReportErrors makes the QP tell the source of a message it had to drop
	// (no receive posted, receive too small) with an error message naming
	// the message's MSN (seed 003). The message is 46 bytes and is sent
	// only when no larger than the datagram that drew it (a Send of at
	// least 24 bytes) and never for one addressed to a multicast or
	// broadcast address (docs/wire.md §6.2).
	ReportErrors bool
	// RD tunes an RD QP's reliability: window, timeouts, retry limits,
	// peer cap (package reliability; zero values are the defaults).
	RD RDConfig
}

// ModifyAttr moves a QP between states (ibv_modify_qp).
type ModifyAttr struct {
	State QPState
	// Socket binds a datagram QP to its lower layer; needed to leave INIT.
	Socket *Socket
}

// QP is a queue pair.
type QP struct {
	dev    *Device
	pd     *PD
	typ    QPType
	num    uint32
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ
	caps   QPCaps
	attr   QPAttr

	state atomic.Uint32
	sock  atomic.Pointer[Socket]

	// Send queue: WRs the datamover still has to send.
	sqMu     sync.Mutex
	sq       ring[sendWQE]
	inMover  bool
	tx       txCtx
	inlineSz int

	// Receive queue (unused with an SRQ).
	rqMu  sync.Mutex
	rqSeq uint64
	rq    ring[recvWQE]

	errMSN       atomic.Uint32    // numbers the error messages this QP sends
	wrMSN        map[wrKey]uint32 // Write-Record MSNs, under sqMu
	wrMu         sync.Mutex       // guards wr: the receive path and the device's timer
	wr           *writerecord.Engine
	eng          engine                 // what differs between the types (engine.go)
	rd           *rdQP                  // RD QPs: peers, reliability, WRs until acknowledged
	rc           atomic.Pointer[rcConn] // RC QPs: the connection, once Connect or Accept made it
	srqHeld      atomic.Int32           // SRQ receives held (seed 004 limit)
	wire         atomic.Uint32          // wireQPN
	srqOverdrawn atomic.Bool            // AsyncSRQOverdraft raised, until back under the hard limit
	srqa         *srqAcct               // the rest of its SRQ use, on an SRQ (srq.go)

	// The device timer's entry for the QP, under Device.timer.mu.
	tmAt   time.Time // when the QP is due
	tmIdx  int       // its index in the timer's heap, plus one; 0: not armed
	tmGone bool      // destroyed: never armed again
}

// CreateQP creates a QP in RESET.
func (pd *PD) CreateQP(attr QPAttr) (*QP, error) {
	d := pd.dev
	if d.closed.Load() {
		return nil, ErrClosed
	}
	c := attr.Caps
	def := func(v *int, dv int) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&c.MaxSendWR, 256)
	def(&c.MaxRecvWR, 256)
	def(&c.MaxSendSGE, 4)
	def(&c.MaxRecvSGE, 4)
	if c.MaxInline < 0 {
		c.MaxInline = 0
	} else if c.MaxInline == 0 {
		c.MaxInline = 256
	}
	switch {
	case attr.Type != UD && attr.Type != RD && attr.Type != RC:
		return nil, fmt.Errorf("%w: QP type %v", ErrInvalidAttr, attr.Type)
	case attr.SendCQ == nil || attr.RecvCQ == nil:
		return nil, fmt.Errorf("%w: a QP needs a send CQ and a receive CQ", ErrInvalidAttr)
	case attr.SendCQ.dev != d || attr.RecvCQ.dev != d || (attr.SRQ != nil && attr.SRQ.pd.dev != d):
		return nil, fmt.Errorf("%w: CQ or SRQ of another device", ErrInvalidAttr)
	case attr.SRQ != nil && attr.SRQ.pd != pd:
		return nil, fmt.Errorf("%w: SRQ of another protection domain", ErrInvalidAttr)
	case attr.Record&^RecordBoth != 0:
		return nil, fmt.Errorf("%w: Record %#x: RecordCQ, RecordMap or both", ErrInvalidAttr, uint8(attr.Record))
	case c.MaxSendSGE > maxSGE || c.MaxRecvSGE > maxSGE:
		return nil, fmt.Errorf("%w: %d send / %d receive SGEs, at most %d", ErrInvalidAttr, c.MaxSendSGE, c.MaxRecvSGE, maxSGE)
	case c.MaxSendWR > 1<<20 || c.MaxRecvWR > 1<<20 || c.MaxInline > 1<<16:
		return nil, fmt.Errorf("%w: capacities %+v too large", ErrInvalidAttr, c)
	case attr.SRQLimit < 0:
		return nil, fmt.Errorf("%w: SRQ limit %d", ErrInvalidAttr, attr.SRQLimit)
	}
	if attr.SRQLimits.Hard == 0 {
		attr.SRQLimits.Hard = attr.SRQLimit
	}
	if err := checkSRQLimits(attr.Type, attr.SRQ, attr.SRQLimits); err != nil {
		return nil, err
	}
	attr.Caps = c
	q := &QP{dev: d, pd: pd, typ: attr.Type, sendCQ: attr.SendCQ, recvCQ: attr.RecvCQ, srq: attr.SRQ, caps: c, attr: attr}
	if attr.Type == UD { // RD and RC keep their WRs their own way (rdQP.out, rcMsg)
		q.sq = newRing[sendWQE](c.MaxSendWR)
	}
	q.inlineSz = c.MaxInline // each slot's buffer is made when first queued (inlineBuf)
	if attr.SRQ == nil {
		q.rq = newRing[recvWQE](c.MaxRecvWR)
	}
	q.tx.init(q)
	q.eng = newEngine(q, attr)
	if attr.SRQ != nil {
		attr.SRQ.join(q, attr.SRQLimits)
	}
	if err := d.addQP(q); err != nil {
		if attr.SRQ != nil {
			attr.SRQ.leave(q)
		}
		return nil, err
	}
	return q, nil
}

// QPN returns the QP number peers address it by.
func (q *QP) QPN() uint32 { return q.num }

// wireQPN is the number q's frames carry as their source, and the one
// frames for it carry: its own, or the alias its socket gives it
// (Socket.Alias).
func (q *QP) wireQPN() uint32 { return q.wire.Load() }

// Type returns the QP's transport service.
func (q *QP) Type() QPType { return q.typ }

// State returns the QP's current state.
func (q *QP) State() QPState { return QPState(q.state.Load()) }

// canReceive reports whether q takes what arrives for it: a Send, a
// Write-Record, an RD frame. It is the one home of that rule — RTR or RTS
// — for every receive path, the landing fast paths included.
func (q *QP) canReceive() bool {
	s := q.State()
	return s == StateRTR || s == StateRTS
}

// Caps returns the QP's capacities, defaults filled in.
func (q *QP) Caps() QPCaps { return q.caps }

// Socket returns the socket the QP is bound to, or nil.
func (q *QP) Socket() *Socket { return q.sock.Load() }

// Modify moves the QP to attr.State along the verbs transitions:
// RESET→INIT→RTR→RTS, any state to RESET or ERROR, and INIT→INIT or
// RTS→RTS to change attributes. A datagram QP needs a socket before it
// leaves INIT: it cannot receive without one.
func (q *QP) Modify(attr ModifyAttr) error {
	if q.dev.closed.Load() {
		return ErrClosed
	}
	if attr.Socket != nil && attr.Socket.dev != q.dev {
		return fmt.Errorf("%w: socket of another device", ErrInvalidAttr)
	}
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	cur, next := q.State(), attr.State
	ok := false
	switch next {
	case StateReset, StateError:
		ok = true
	case StateInit:
		ok = cur == StateReset || cur == StateInit
	case StateRTR:
		ok = cur == StateInit
	case StateRTS:
		ok = cur == StateRTR || cur == StateRTS
	}
	if !ok {
		return fmt.Errorf("%w: %v to %v is not a verbs transition", ErrQPState, cur, next)
	}
	// Every check before any change: a refused Modify leaves the QP as it
	// was (it kept a refused socket on an RC QP).
	if attr.Socket != nil && cur != StateReset && cur != StateInit {
		return fmt.Errorf("%w: the socket is set in RESET or INIT, not %v", ErrQPState, cur)
	}
	if err := q.eng.checkModify(&attr, next); err != nil {
		return err
	}
	if attr.Socket != nil {
		q.sock.Store(attr.Socket)
	}
	switch next {
	case StateError:
		q.state.Store(uint32(StateError))
		q.flushLocked()
		return nil
	case StateReset:
		q.state.Store(uint32(StateReset))
		q.resetLocked()
		return nil
	}
	q.state.Store(uint32(next))
	return nil
}

// Destroy removes the QP; its outstanding WRs are flushed.
func (q *QP) Destroy() error {
	q.sqMu.Lock()
	q.state.Store(uint32(StateError))
	q.flushLocked()
	q.sqMu.Unlock()
	q.leaveAllGroups()
	q.dev.removeQP(q)
	if q.srq != nil {
		q.srq.leave(q)
	}
	return nil
}

// toError moves the QP to ERROR and flushes its queues.
func (q *QP) toError() {
	q.sqMu.Lock()
	q.state.Store(uint32(StateError))
	q.flushLocked()
	q.sqMu.Unlock()
}

// flushLocked completes every queued WR with WRFlushError. Caller holds sqMu.
func (q *QP) flushLocked() {
	for q.sq.len() > 0 {
		w := q.sq.front()
		q.complete(w, WRFlushError, 0)
		q.popSQLocked()
	}
	q.eng.flush()
	if q.srq != nil {
		q.srq.standDown(q)
	}
	q.rqMu.Lock()
	for q.rq.len() > 0 {
		w := q.rq.front()
		q.recvCQ.push(&WorkCompletion{ID: w.id, Status: WRFlushError, Opcode: WCRecv, QPN: q.num})
		q.rq.pop()
	}
	q.rqMu.Unlock()
}

// resetLocked empties the queues without completions, as RESET does.
func (q *QP) resetLocked() {
	q.sq.reset()
	q.rqMu.Lock()
	q.rq.reset()
	q.rqMu.Unlock()
}
