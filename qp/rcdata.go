package qp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/internal/fduse"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// The RC data path: FPDUs out (from registered memory with writev when
// there are no markers; built whole with markers), FPDUs in (MPA
// deframing, then RFC 5040 §7.2's checks), Terminate on any error.

// Internal messages an RC connection sends on its own.
const (
	opRTR       SendOpcode = 0xfd // RFC 6581 ready-to-receive: a zero-length RDMA Write
	opTerminate SendOpcode = 0xfe
)

type rcMsg struct {
	id     uint64
	op     SendOpcode
	flags  SendFlags
	nsge   int
	sge    [maxSGE]SGE
	refs   mrRefs // the regions of its data, until the WR completes
	inline []byte
	// inlineBuf keeps inline's storage when the message is recycled.
	inlineBuf []byte
	length    uint32
	off       uint32 // bytes framed so far
	rstag     uint32
	rto       uint64
	sinkSTag  uint32
	sinkTO    uint64
	invSTag   uint32
	msn       uint32
	internal  bool
	body      []byte // opTerminate: the RDMAP Terminate header and echoes
	end       uint64 // stream offset just after its last byte
	status    Status
	framed    bool // its last FPDU is built
	handed    bool // its last byte went to TCP
	respDone  bool // a Read's last response arrived
	done      bool
	// RFC 7306: the Immediate Data of an OpImmediate, OpSendImm or
	// OpWriteImm; an atomic's operands; an Atomic Response's request and
	// value (in compareAdd).
	imm              uint64
	compareAdd, swap uint64
	reqID            uint32
}

// single reports whether m is one FPDU whatever its length: a request,
// a response header, an Immediate Data message, a Terminate.
func (m *rcMsg) single() bool {
	return m.op.awaitsResponse() || m.op.imm() || m.op == opTerminate || m.op == opAtomicResponse
}

func (m *rcMsg) releaseMRs() { m.refs.release() }

// rcRecv is the Send being received (its segments come in order).
type rcRecv struct {
	w    recvWQE
	got  uint32
	bad  Status
	have bool
}

type rcConn struct {
	q  *QP
	tc *net.TCPConn // nil: the caller's descriptor (manual)
	fd int
	// manual: on the caller's descriptor (ConnectFD, AcceptFD). Nothing
	// reads it but Progress; the poller waits on it only while it holds
	// output back, and the caller closes it.
	manual   bool
	waitRecv bool // RCConfig.WaitForRecv
	inEpoll  bool // manual, in the poller's epoll set: under the poller's mu
	neg      rcNegotiated
	ackMode  bool
	mulpdu   int

	mu         sync.Mutex // the send side, the queues, the Reads
	framer     udiwarp.MPAFramer
	queue      []*rcMsg // to send, in order
	posted     []*rcMsg // application WRs not yet completed, in post order
	reads      []*rcMsg // Reads sent, awaiting responses, in order
	serving    int      // Read Responses queued or being sent (IRD)
	rest       []byte   // the unwritten tail of an FPDU
	restBuf    []byte
	scratch    []byte
	gather     []byte
	hbs        [maxBatch][udiwarp.MPAHeaderSize + udiwarp.DDPUntaggedHeaderSize + udiwarp.ReadRequestSize + 64]byte
	trs        [maxBatch][3 + udiwarp.CRCSize]byte
	iov        [maxBatch * (maxSGE + 2)]unix.Iovec
	wmsg       unix.Msghdr
	pieces     [maxSGE + 1][]byte
	pinned     []*MR
	written    uint64 // stream octets handed to TCP
	wantOut    bool
	outWait    atomic.Bool // wantOut, for the busy poller to read without the lock (rcPoller.pollOnce)
	sendMSN    uint32
	readMSN    uint32
	termMSN    uint32
	atomicMSN  uint32 // Atomic Response MSNs (queue 3)
	rtrPending bool   // responder in revision 2: nothing goes out before the initiator's RTR
	// dead: nothing more is sent — a Terminate went out (fail follows), the
	// QP flushed, or a write failed. A failed write leaves the ending to
	// the receive side: it reads what the socket still holds (what the
	// peer sent before it reset the connection), then finds the end and
	// fails the QP (lost). Nothing on the send side closes the connection
	// or sets closing, which would stop that reader first.
	dead bool
	// revokedTerm: a Read Response's source was invalidated under it; a
	// Terminate is queued and the device's timer fails the QP.
	revokedTerm atomic.Bool

	rxMu        sync.Mutex // the receive side: one reader at a time
	deframer    udiwarp.MPADeframer
	rx          []byte // read from the socket; rx[rxAt:] not handled yet
	rxAt        int
	rxNeed      int // the length of the FPDU at rxAt, when it is not whole
	rxSendMSN   uint32
	rxReadMSN   uint32
	rxTermMSN   uint32
	rxAtomicMSN uint32
	cur         rcRecv
	// stalled: a Send found no receive (WaitForRecv); its ULPDU waits in
	// stallBuf, handled again by the next Progress, and nothing more is
	// read meanwhile.
	stalled   atomic.Bool
	stallBuf  []byte
	eof       atomic.Bool // manual: the peer's FIN came; everything before it was handled
	fduse.Use             // system calls on fd in flight, and closing
}

// postRC queues a send WR on an RC QP and sends what TCP takes now.
func (q *QP) postRC(wr *SendWR) error {
	c := q.rc.Load()
	if c == nil {
		return fmt.Errorf("%w: the RC QP is not connected", ErrQPState)
	}
	var length uint64
	for _, g := range wr.SGL {
		length += uint64(g.Length)
	}
	length += uint64(len(wr.Inline))
	if length > 1<<32-1 {
		return fmt.Errorf("%w: a message of %d bytes (at most 4 GiB - 1)", ErrInvalidWR, length)
	}
	m := rcMsgPool.Get().(*rcMsg)
	keep := m.inlineBuf[:0]
	*m = rcMsg{id: wr.ID, op: wr.Opcode, flags: wr.Flags, length: uint32(length), rstag: wr.RemoteSTag, rto: wr.RemoteTO,
		invSTag: wr.InvalidateSTag, inlineBuf: keep, imm: wr.Imm, compareAdd: wr.CompareAdd, swap: wr.Swap}
	var err error
	switch wr.Opcode {
	case OpSend, OpSendInvalidate, OpWrite, OpSendImm, OpWriteImm:
	case OpImmediate:
		err = checkImmWR(wr)
	case OpAtomicFetchAdd, OpAtomicCmpSwap:
		err = checkAtomicWR(wr)
	case OpRead:
		if len(wr.SGL) != 1 || wr.Inline != nil {
			err = fmt.Errorf("%w: an RDMA Read names one sink SGE, not %d", ErrInvalidWR, len(wr.SGL))
		}
	default:
		err = fmt.Errorf("%w: opcode %v is not available on RC QPs", ErrInvalidWR, wr.Opcode)
	}
	if err != nil {
		rcMsgPool.Put(m)
		return err
	}
	if wr.Inline != nil {
		m.inlineBuf = append(m.inlineBuf, wr.Inline...)
		m.inline = m.inlineBuf
	}
	m.nsge = copy(m.sge[:], wr.SGL)
	need := Access(0)
	switch {
	case m.op == OpRead:
		need = AccessLocalWrite | AccessRemoteWrite // Read Responses are tagged writes into the sink
		m.sinkSTag, m.sinkTO = m.sge[0].LKey, m.sge[0].Addr
	case m.op.atomic():
		need = AccessLocalWrite // the original value lands there
	}
	if st := m.refs.take(q.dev, q.pd, m.sge[:m.nsge], need); st != Success {
		q.pushSend(wr.ID, st, m.op.wcOpcode(), 0)
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || q.State() != StateRTS {
		m.releaseMRs()
		return fmt.Errorf("%w: PostSend on a QP in %v", ErrQPState, q.State())
	}
	if len(c.posted) >= q.caps.MaxSendWR {
		m.releaseMRs()
		return fmt.Errorf("%w: %d send WRs outstanding", ErrQueueFull, len(c.posted))
	}
	if m.op == OpSendImm || m.op == OpWriteImm {
		// The Send or Write goes first, as a message of its own that
		// completes nothing; m itself is the Immediate Data after it.
		body := &rcMsg{op: OpSend, internal: true, nsge: m.nsge, sge: m.sge, inline: m.inline, length: m.length,
			rstag: m.rstag, rto: m.rto}
		if m.op == OpWriteImm {
			body.op = OpWrite
		} else {
			body.msn = c.sendMSN
			c.sendMSN++
		}
		c.queue = append(c.queue, body)
	}
	switch {
	case m.op == OpSend, m.op == OpSendInvalidate, m.op.imm():
		m.msn = c.sendMSN
		c.sendMSN++
	case m.op.awaitsResponse():
		m.msn = c.readMSN // Read and Atomic Requests share queue 1
		c.readMSN++
	}
	c.queue = append(c.queue, m)
	c.posted = append(c.posted, m)
	c.pumpLocked()
	c.completeLocked()
	return nil
}

// pumpLocked writes FPDUs while TCP takes them. It stops at a full socket
// (and asks the poller to call back when it has room) or after a bounded
// amount, so one connection cannot hold the poller from the others.
func (c *rcConn) pumpLocked() {
	budget := 1 << 20
	for !c.dead && budget > 0 {
		if len(c.rest) > 0 {
			n, ok := c.write1(c.rest)
			if !ok {
				return
			}
			c.rest = c.rest[n:]
			if len(c.rest) > 0 {
				c.waitOut()
				return
			}
			continue
		}
		if len(c.queue) == 0 {
			break
		}
		m := c.queue[0]
		if m.framed { // its last FPDU's tail just went out
			c.handedLocked(m)
			continue
		}
		if c.rtrPending && m.op != opTerminate {
			break
		}
		if m.op.awaitsResponse() && m.off == 0 && len(c.reads) >= c.neg.ord {
			break // ORD: later WRs wait their turn, in order
		}
		n, full := c.sendFPDU(m)
		budget -= n
		if m.framed && !full {
			c.handedLocked(m)
		}
		if full {
			c.waitOut()
			return
		}
	}
	switch {
	case budget <= 0 && !c.dead:
		c.waitOut() // more to send: the poller comes back, after the other connections
	case c.wantOut && len(c.rest) == 0 && len(c.queue) == 0:
		c.wantOut = false
		c.outWait.Store(false)
		c.q.dev.rc.interest(c, false)
	}
}

func (c *rcConn) waitOut() {
	c.q.dev.stats.RCSocketFull.Add(1)
	if !c.wantOut {
		c.wantOut = true
		c.outWait.Store(true)
		c.q.dev.rc.interest(c, true)
	}
}

// handedLocked notes that m's last byte went to TCP.
func (c *rcConn) handedLocked(m *rcMsg) {
	c.queue[0] = nil
	c.queue = c.queue[1:]
	m.handed = true
	m.end = c.written + uint64(len(c.rest))
	switch {
	case m.op.awaitsResponse():
		c.reads = append(c.reads, m)
	case m.op == opReadResponse, m.op == opAtomicResponse:
		m.releaseMRs()
		c.serving--
	case m.op == opTerminate:
		c.dead = true // nothing follows a Terminate
	case m.internal:
	case !c.onAck(m):
		m.done = true
	}
}

// onAck reports whether m, an application WR, completes only once the
// peer's TCP acknowledged it (RCConfig.CompleteOnAck, FlagCompleteOnAck)
// rather than when TCP took it. Reads and atomics complete on their
// responses.
func (c *rcConn) onAck(m *rcMsg) bool {
	return (c.ackMode || m.flags&FlagCompleteOnAck != 0) && !m.op.awaitsResponse()
}

// completeLocked completes application WRs in post order: Sends and
// Writes once TCP took them (or acknowledged them, CompleteOnAck), Reads
// once their last response is placed. While the oldest waits for its
// acknowledgement, the device's timer looks again (rcAckTimer).
func (c *rcConn) completeLocked() {
	q := c.q
	var acked uint64
	read := false // acked is read once, when a WR needs it
	k := 0
	for ; k < len(c.posted); k++ {
		m := c.posted[k]
		if m.handed && !m.done && c.onAck(m) {
			if !read {
				acked, read = c.ackedLocked(), true
			}
			if m.end <= acked {
				m.done = true
			}
		}
		if !m.done {
			break
		}
		m.releaseMRs()
		if m.status != Success || m.flags&FlagSignaled != 0 {
			n := int(m.length)
			if m.status != Success {
				n = 0
			}
			q.pushSend(m.id, m.status, m.op.wcOpcode(), n)
		}
		c.posted[k] = nil
		rcMsgPool.Put(m) // nothing else refers to it now: it left the queue and the Reads
	}
	c.posted = c.posted[k:]
	if len(c.posted) > 0 && c.posted[0].handed && !c.posted[0].done && c.onAck(c.posted[0]) {
		q.armTimer(time.Now().Add(50 * time.Microsecond))
	}
}

// ackedLocked returns the stream octets the peer's TCP acknowledged: all
// handed over less what is still in the socket's send queue (SIOCOUTQ).
func (c *rcConn) ackedLocked() uint64 {
	var out int
	if c.Acquire() {
		if v, err := unix.IoctlGetInt(c.fd, unix.SIOCOUTQ); err == nil {
			out = v
		}
		c.Release()
	}
	return c.written - uint64(out)
}

// maxBatch bounds the FPDUs of one writev: a large message goes to TCP
// in a few system calls, not one per FPDU.
const maxBatch = 16

// fpduHeader appends to h (which holds the 2-byte ULPDU_Length slot) the
// DDP/RDMAP header of m's next FPDU and returns it with that FPDU's
// payload size.
func (c *rcConn) fpduHeader(m *rcMsg, off uint32, h []byte) ([]byte, uint32) {
	room := c.mulpdu
	var n uint32
	switch m.op {
	case OpSend, OpSendInvalidate:
		n = min(m.length-off, uint32(room-udiwarp.DDPUntaggedHeaderSize))
		se := m.flags&FlagSolicited != 0
		opc := udiwarp.OpSend
		switch {
		case m.op == OpSendInvalidate && se:
			opc = udiwarp.OpSendSEInvalidate
		case m.op == OpSendInvalidate:
			opc = udiwarp.OpSendInvalidate
		case se:
			opc = udiwarp.OpSendSE
		}
		h = udiwarp.AppendUntagged(h, &udiwarp.UntaggedFields{Last: off+n == m.length, DV: udiwarp.DDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(opc), ULP: m.invSTag, QN: uint32(udiwarp.QueueSend), MSN: m.msn, MO: off})
	case OpWrite, opRTR, opReadResponse:
		n = min(m.length-off, uint32(room-udiwarp.DDPTaggedHeaderSize))
		opc, stag, to := udiwarp.OpWrite, m.rstag, m.rto
		if m.op == opReadResponse {
			opc, stag, to = udiwarp.OpReadResponse, m.sinkSTag, m.sinkTO
		}
		h = udiwarp.AppendTagged(h, &udiwarp.TaggedFields{Last: off+n == m.length, DV: udiwarp.DDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(opc), STag: stag, TO: to + uint64(off)})
	case OpImmediate, OpSendImm, OpWriteImm:
		opc := udiwarp.OpImmediateData
		if m.flags&FlagSolicited != 0 {
			opc = udiwarp.OpImmediateDataSE
		}
		h = udiwarp.AppendUntagged(h, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(opc), QN: uint32(udiwarp.QueueSend), MSN: m.msn})
		h = udiwarp.AppendImmediateData(h, m.imm)
	case OpAtomicFetchAdd, OpAtomicCmpSwap:
		h = udiwarp.AppendUntagged(h, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpAtomicRequest), QN: uint32(udiwarp.QueueReadRequest), MSN: m.msn})
		a := atomicRequest(m.op, m.msn, m.rstag, m.rto, m.compareAdd, m.swap)
		h = udiwarp.AppendAtomicRequest(h, &a)
	case opAtomicResponse:
		h = udiwarp.AppendUntagged(h, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpAtomicResponse), QN: uint32(udiwarp.QueueAtomicResponse), MSN: m.msn})
		h = udiwarp.AppendAtomicResponse(h, m.reqID, m.compareAdd)
	case OpRead:
		h = udiwarp.AppendUntagged(h, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpReadRequest), QN: uint32(udiwarp.QueueReadRequest), MSN: m.msn})
		h = udiwarp.AppendReadRequest(h, &udiwarp.ReadRequestFields{SinkSTag: m.sinkSTag, SinkTO: m.sinkTO, Size: m.length,
			SourceSTag: m.rstag, SourceTO: m.rto})
	case opTerminate:
		h = udiwarp.AppendUntagged(h, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpTerminate), QN: uint32(udiwarp.QueueTerminate), MSN: m.msn})
		h = append(h, m.body...)
	}
	return h, n
}

// payload collects bytes [off, off+n) of m into pieces, pinning the
// regions they lie in (appended to c.pinned).
func (c *rcConn) payload(m *rcMsg, off, n uint32, pieces [][]byte) ([][]byte, Status) {
	if n == 0 {
		return pieces, Success
	}
	if m.inline != nil {
		return append(pieces, m.inline[off:off+n]), Success
	}
	sl := sglSlice{sge: m.sge[:m.nsge], off: off, left: n}
	for part, ok := sl.next(); ok; part, ok = sl.next() {
		k := part.Length
		var mr *MR
		var b []byte
		if m.op == opReadResponse {
			// The peer's remote-read access, checked as each FPDU is built:
			// a source invalidated under the Read gives no more bytes.
			var f tagFault
			if mr, f = c.q.dev.checkRemote(c.q.pd, part.LKey, part.Addr, uint64(k), AccessRemoteRead); f != faultNone {
				return pieces, RemoteAccessError
			}
			b = mr.buf[part.Addr : part.Addr+uint64(k)]
		} else {
			var st Status
			if mr, b, st = c.q.dev.resolve(c.q.pd, &part, 0); st != Success {
				return pieces, st
			}
		}
		c.pinned = append(c.pinned, mr)
		pieces = append(pieces, b)
	}
	return pieces, Success
}

// sendFPDU frames the next FPDUs of m — up to maxBatch of them in one
// writev from registered memory, or one built whole when markers
// interleave — and writes them. It returns the octets written and
// whether the socket filled up.
func (c *rcConn) sendFPDU(m *rcMsg) (int, bool) {
	defer func() {
		for _, mr := range c.pinned {
			mr.unpin()
		}
		clear(c.pinned)
		c.pinned = c.pinned[:0]
	}()
	if c.framer.Markers {
		return c.sendMarked(m)
	}
	niov, total := 0, 0
	add := func(b []byte) {
		if len(b) > 0 {
			c.iov[niov].Base = &b[0]
			c.iov[niov].SetLen(len(b))
			niov++
			total += len(b)
		}
	}
	var framed uint32
	off := m.off
	for k := 0; k < maxBatch && niov+maxSGE+2 <= len(c.iov); k++ {
		h, n := c.fpduHeader(m, off, c.hbs[k][:udiwarp.MPAHeaderSize])
		pieces, st := c.payload(m, off, n, c.pieces[:0])
		if st != Success && m.op == opReadResponse {
			c.sourceRevokedLocked()
			return 0, false
		}
		if st != Success { // cannot happen: the MRs are referenced
			m.status, m.off, m.framed = st, m.length, true
			return 0, false
		}
		ulpdu := len(h) - udiwarp.MPAHeaderSize + int(n)
		binary.BigEndian.PutUint16(h, uint16(ulpdu))
		pad := udiwarp.MPAPad(ulpdu)
		var crc uint32
		if c.framer.CRC {
			crc = udiwarp.CRC32c(h)
			for _, p := range pieces {
				crc = udiwarp.UpdateCRC32c(crc, p)
			}
			crc = udiwarp.UpdateCRC32c(crc, zeros[:pad])
		}
		t := c.trs[k][:pad+udiwarp.CRCSize]
		clear(t[:pad])
		udiwarp.PutCRC(t[pad:], crc)
		add(h)
		for _, p := range pieces {
			add(p)
		}
		add(t)
		off += n
		framed++
		c.q.dev.stats.RCFPDUsSent.Add(1)
		if off >= m.length || m.single() {
			break
		}
	}
	w, ok := c.writev(niov)
	if !ok { // the connection is gone; the reader fails the QP
		m.off, m.framed = m.length, true
		return 0, true
	}
	full := false
	if w < total {
		// Keep the unwritten tail: headers and trailers live in buffers
		// the next batch reuses.
		c.rest = c.restBuf[:0]
		skip := w
		for i := range niov {
			b := unsafe.Slice(c.iov[i].Base, c.iov[i].Len)
			if skip >= len(b) {
				skip -= len(b)
				continue
			}
			c.rest = append(c.rest, b[skip:]...)
			skip = 0
		}
		c.restBuf = c.rest[:0]
		full = true
	}
	m.off = off
	if m.off >= m.length || m.single() {
		m.off, m.framed = m.length, true
	}
	return w, full
}

// sendMarked builds m's next FPDU whole, markers in place, and writes it.
func (c *rcConn) sendMarked(m *rcMsg) (int, bool) {
	h, n := c.fpduHeader(m, m.off, c.hbs[0][:udiwarp.MPAHeaderSize])
	pieces, st := c.payload(m, m.off, n, c.pieces[:0])
	if st != Success && m.op == opReadResponse {
		c.sourceRevokedLocked()
		return 0, false
	}
	if st != Success {
		m.status, m.off, m.framed = st, m.length, true
		return 0, false
	}
	var payload []byte
	switch len(pieces) {
	case 0:
	case 1:
		payload = pieces[0]
	default:
		c.gather = c.gather[:0]
		for _, p := range pieces {
			c.gather = append(c.gather, p...)
		}
		payload = c.gather
	}
	var err error
	c.scratch, err = c.framer.Append(c.scratch[:0], h[udiwarp.MPAHeaderSize:], payload)
	if err != nil {
		m.status, m.off, m.framed = LocalQPOperationError, m.length, true
		return 0, false
	}
	c.q.dev.stats.RCFPDUsSent.Add(1)
	w, ok := c.write1(c.scratch)
	if !ok {
		m.off, m.framed = m.length, true
		return 0, true
	}
	full := false
	if w < len(c.scratch) {
		c.rest = append(c.restBuf[:0], c.scratch[w:]...)
		c.restBuf = c.rest[:0]
		full = true
	}
	m.off += n
	if m.off >= m.length || m.single() {
		m.off, m.framed = m.length, true
	}
	return w, full
}

var zeros [4]byte

// rcMsgPool recycles application WRs: a small message's path allocates
// nothing.
var rcMsgPool = sync.Pool{New: func() any { return new(rcMsg) }}

// write1 writes b without waiting; ok is false when the connection is
// gone (the QP then goes to ERROR through the reader).
func (c *rcConn) write1(b []byte) (int, bool) {
	c.iov[0].Base = &b[0]
	c.iov[0].SetLen(len(b))
	return c.writev(1)
}

func (c *rcConn) writev(niov int) (int, bool) {
	if !c.Acquire() {
		return 0, false
	}
	// sendmsg with MSG_DONTWAIT, not writev: a manual connection's
	// descriptor is the caller's, in whatever blocking mode it set, and
	// MSG_NOSIGNAL: a peer gone is an error here, never the caller's
	// SIGPIPE.
	c.wmsg.Iov = &c.iov[0]
	c.wmsg.SetIovlen(niov)
	r, _, errno := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&c.wmsg)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	c.Release()
	n := int(r)
	switch {
	case errno == unix.EAGAIN:
		return 0, true
	case errno != 0:
		c.dead = true // the reader finds the end and fails the QP (see dead)
		return 0, false
	}
	c.written += uint64(n)
	c.q.dev.stats.TxBytes.Add(uint64(n))
	return n, true
}

// onWritable runs when a socket that was full has room. It never
// closes the connection, not even a dead one: a failed socket reports
// room at once, and closing it here (setting closing) stopped the reader
// before it read what had arrived or failed the QP, which then stayed in
// RTS with its receives posted for good. A Terminate's sender fails the
// QP itself; a failed write's reader does (see dead).
func (c *rcConn) onWritable() {
	c.mu.Lock()
	if c.wantOut {
		c.q.dev.stats.RCPollerSends.Add(1)
	}
	c.pumpLocked()
	c.completeLocked()
	c.mu.Unlock()
}

// onReadable reads what the socket holds and handles every whole FPDU.
func (c *rcConn) onReadable() {
	if !c.rxMu.TryLock() {
		return
	}
	defer c.rxUnlock()
	if c.stalled.Load() {
		c.stalled.Store(false)
		if !c.handle(c.stallBuf) || c.stalled.Load() {
			return // failed, or still no receive
		}
		c.q.dev.stats.RCFPDUsReceived.Add(1)
		if !c.process() || c.stalled.Load() {
			return
		}
	}
	for !c.Closing() && !c.eof.Load() {
		c.rxRoom()
		if !c.Acquire() {
			return
		}
		buf := c.rx[len(c.rx):cap(c.rx)]
		r, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(c.fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), unix.MSG_DONTWAIT, 0, 0)
		c.Release()
		n := int(r)
		if errno == unix.EAGAIN {
			return
		}
		if errno == 0 && n == 0 && c.manual {
			// The peer's FIN: its sending side is done. Ours goes on (TCP's
			// half-close) until the caller closes or shuts it down.
			c.eof.Store(true)
			return
		}
		if errno != 0 || n == 0 {
			c.lost()
			return
		}
		room := cap(c.rx) - len(c.rx)
		c.q.dev.stats.RxBytes.Add(uint64(n))
		c.rx = c.rx[:len(c.rx)+n]
		if !c.process() || c.stalled.Load() {
			return
		}
		if n < room {
			return // the socket is drained: no second read to learn it
		}
	}
}

// rxRoom makes room at the end of rx for the next read. The bytes not
// handled yet are rx[rxAt:]; they move to the front only when less than
// a quarter of the buffer is left, or the FPDU they begin would not fit,
// so a read that ends inside an FPDU (most of them, FPDUs being as large
// as a TCP segment) does not cost a copy of its tail every time (issue
// 32). The buffer doubles when a read filled it, and grows to hold the
// whole FPDU at its front.
func (c *rcConn) rxRoom() {
	if c.rxAt > 0 && (cap(c.rx)-len(c.rx) < cap(c.rx)/4 || c.rxAt+c.rxNeed > cap(c.rx)) {
		c.rx = c.rx[:copy(c.rx, c.rx[c.rxAt:])]
		c.rxAt = 0
	}
	switch {
	case c.rxNeed > cap(c.rx):
		grown := make([]byte, len(c.rx), c.rxNeed+64<<10)
		copy(grown, c.rx)
		c.rx = grown
	case len(c.rx) == cap(c.rx):
		grown := make([]byte, len(c.rx), 2*cap(c.rx))
		copy(grown, c.rx)
		c.rx = grown
	}
}

// process handles the whole FPDUs in rx[rxAt:]; false means the
// connection failed.
func (c *rcConn) process() bool {
	start := c.rxAt
	c.rxNeed = 0
	for start < len(c.rx) {
		ulpdu, n, need, err := c.deframer.Next(c.rx[start:])
		if err != nil {
			code, _ := udiwarp.CodeOf(err)
			c.terminate(code, nil, nil, 0)
			return false
		}
		if n == 0 {
			c.rxNeed = need
			break
		}
		if !c.handle(ulpdu) {
			return false
		}
		start += n
		if c.stalled.Load() { // kept for the next Progress; nothing after it yet
			c.stallBuf = append(c.stallBuf[:0], ulpdu...)
			break
		}
		c.q.dev.stats.RCFPDUsReceived.Add(1)
	}
	c.rxAt = start
	if start == len(c.rx) {
		c.rx, c.rxAt = c.rx[:0], 0
	}
	return true
}

// handle carries out one ULPDU after the checks of RFC 5040 §7.2 and RFC
// 5041 §7; the first error terminates the stream.
func (c *rcConn) handle(b []byte) bool {
	q := c.q
	st := &q.dev.stats
	seg, err := udiwarp.ParseSegment(b, udiwarp.ProfileStream)
	if err != nil {
		hdr := b[:min(len(b), udiwarp.DDPUntaggedHeaderSize)]
		if len(b) >= 1 && udiwarp.DDPControl(b[0]).Tagged() {
			hdr = b[:min(len(b), udiwarp.DDPTaggedHeaderSize)]
		}
		code, _ := udiwarp.CodeOf(err)
		c.terminate(code, hdr, nil, len(b))
		return false
	}
	if c.rtrPending {
		c.mu.Lock()
		c.rtrPending = false // the initiator's first FPDU is its RTR
		c.pumpLocked()
		c.mu.Unlock()
	}
	op := seg.Opcode()
	switch {
	case op == udiwarp.OpWrite:
		if code, ok := c.place(seg, AccessRemoteWrite); !ok {
			c.terminate(code, ddpHdr(seg), nil, len(b))
			return false
		}
		return true
	case op == udiwarp.OpReadResponse:
		return c.readResponse(seg, len(b))
	}
	h := seg.Untagged()
	switch udiwarp.Queue(h.Queue()) {
	case udiwarp.QueueSend:
		switch op {
		case udiwarp.OpSend, udiwarp.OpSendSE, udiwarp.OpSendInvalidate, udiwarp.OpSendSEInvalidate:
			return c.receiveSend(seg, len(b))
		case udiwarp.OpImmediateData, udiwarp.OpImmediateDataSE:
			return c.receiveImmediate(seg, len(b))
		}
		c.terminate(udiwarp.RDMAPUnexpectedOpcode, ddpHdr(seg), nil, len(b))
		return false
	case udiwarp.QueueReadRequest:
		switch op {
		case udiwarp.OpReadRequest:
			return c.serveRead(seg, len(b))
		case udiwarp.OpAtomicRequest:
			return c.serveAtomic(seg, len(b))
		}
		c.terminate(udiwarp.RDMAPUnexpectedOpcode, ddpHdr(seg), nil, len(b))
		return false
	case udiwarp.QueueAtomicResponse:
		if op != udiwarp.OpAtomicResponse {
			c.terminate(udiwarp.RDMAPUnexpectedOpcode, ddpHdr(seg), nil, len(b))
			return false
		}
		return c.atomicResponse(seg, len(b))
	case udiwarp.QueueTerminate:
		if op != udiwarp.OpTerminate {
			c.terminate(udiwarp.RDMAPUnexpectedOpcode, ddpHdr(seg), nil, len(b))
			return false
		}
		st.RCTerminatesReceived.Add(1)
		t := seg.Terminate()
		ev := AsyncEvent{Type: AsyncRemoteError, QP: q, Source: c.peer(), Code: t.Code()}
		if dh := t.DDPHeader(); len(dh) == udiwarp.DDPUntaggedHeaderSize {
			ev.MSN = udiwarp.DDPUntagged(dh).MSN()
			c.refused(udiwarp.DDPUntagged(dh), t.Code())
		}
		q.dev.raise(ev)
		c.fail()
		return false
	}
	c.terminate(udiwarp.DDPUntaggedInvalidQN, ddpHdr(seg), nil, len(b))
	return false
}

func (c *rcConn) peer() (a netip.AddrPort) {
	_, a = c.addrs()
	return a
}

// addrs returns the connection's local and remote addresses.
func (c *rcConn) addrs() (local, remote netip.AddrPort) {
	if c.tc != nil {
		if a, ok := c.tc.LocalAddr().(*net.TCPAddr); ok {
			local = a.AddrPort()
		}
		if a, ok := c.tc.RemoteAddr().(*net.TCPAddr); ok {
			remote = a.AddrPort()
		}
		return
	}
	if c.Acquire() {
		if sa, err := unix.Getsockname(c.fd); err == nil {
			local = addrPortOf(sa)
		}
		if sa, err := unix.Getpeername(c.fd); err == nil {
			remote = addrPortOf(sa)
		}
		c.Release()
	}
	return
}

func addrPortOf(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// place places a tagged segment (Device.placeTagged) and returns the
// Terminate code of the first check that fails.
func (c *rcConn) place(seg udiwarp.Segment, need Access) (udiwarp.ErrorCode, bool) {
	t := seg.Tagged()
	return c.q.dev.placeTagged(c.q.pd, t.STag(), t.TO(), seg.Payload, need)
}

// receiveSend places a Send segment into the receive at the head of the
// queue: MSN and MO must follow on, the first segment takes a receive.
func (c *rcConn) receiveSend(seg udiwarp.Segment, size int) bool {
	q := c.q
	st := &q.dev.stats
	h := seg.Untagged()
	r := &c.cur
	if h.MSN() != c.rxSendMSN {
		c.terminate(udiwarp.DDPUntaggedMSNRange, ddpHdr(seg), nil, size)
		return false
	}
	if !r.have {
		if h.MO() != 0 {
			c.terminate(udiwarp.DDPUntaggedInvalidMO, ddpHdr(seg), nil, size)
			return false
		}
		n := -1 // a message of several FPDUs: its length is not known yet
		if seg.Control.Last() {
			n = len(seg.Payload)
		}
		if res := q.takeRecv(&r.w, n, netip.AddrPort{}); res != recvTaken {
			if res == recvNone && c.waitRecv {
				c.stalled.Store(true) // before any state changed: handled again whole
				st.RCRecvWaits.Add(1)
				return true
			}
			if res == recvNone {
				st.RxNoRecv.Add(1)
			}
			c.terminate(udiwarp.DDPUntaggedNoBuffer, ddpHdr(seg), nil, size)
			return false
		}
		r.have, r.got, r.bad = true, 0, Success
	} else if h.MO() != r.got {
		c.terminate(udiwarp.DDPUntaggedInvalidMO, ddpHdr(seg), nil, size)
		return false
	}
	if r.bad == Success {
		r.bad = q.scatterAt(&r.w, r.got, seg.Payload)
	}
	r.got += uint32(len(seg.Payload))
	if r.bad == LocalLengthError {
		wc := WorkCompletion{ID: r.w.id, Status: LocalLengthError, Opcode: WCRecv, QPN: q.num}
		q.completeRecv(&wc)
		r.have = false
		c.terminate(udiwarp.DDPUntaggedTooLong, ddpHdr(seg), nil, size)
		return false
	}
	if !seg.Control.Last() {
		return true
	}
	op := seg.Opcode()
	wc := WorkCompletion{ID: r.w.id, Status: r.bad, Opcode: WCRecv, QPN: q.num, Solicited: op.Solicited(), Len: r.got, MSN: h.MSN()}
	if op.Invalidates() && r.bad == Success {
		// Only an STag of this PD registered with AccessRemoteInvalidate:
		// otherwise a remote protection error (as siw reports it), and the
		// STag keeps working; an unknown STag is a remote operation error.
		stag := h.ULP()
		m := q.dev.mrs.lookup(stag)
		if m == nil || m.pd != q.pd || m.access&AccessRemoteInvalidate == 0 {
			code := udiwarp.RDMAPProtCannotInvalidate
			if m == nil {
				code = udiwarp.RDMAPOpCannotInvalidate
			}
			c.terminate(code, ddpHdr(seg), nil, size) // the receive flushes (rxUnlock)
			return false
		}
		m.Invalidate()
		wc.Invalidated = stag
	}
	r.have = false
	c.rxSendMSN++
	q.completeRecv(&wc)
	return true
}

// takeRequest numbers a Read or Atomic Request (they share queue 1's
// MSNs) and holds it to IRD; a request out of order or over IRD ends
// the stream with a Terminate echoing rdma (the Read Request header, or
// nothing).
func (c *rcConn) takeRequest(seg udiwarp.Segment, size int, rdma []byte) bool {
	if seg.Untagged().MSN() != c.rxReadMSN {
		c.terminate(udiwarp.DDPUntaggedMSNRange, ddpHdr(seg), nil, size)
		return false
	}
	c.rxReadMSN++
	c.mu.Lock()
	over := c.serving >= c.neg.ird
	c.mu.Unlock()
	if over {
		c.q.dev.stats.RCReadsOverIRD.Add(1)
		c.terminate(udiwarp.RDMAPCatastrophicStream, ddpHdr(seg), rdma, size)
		return false
	}
	return true
}

// serveRead checks a Read Request and queues its Read Responses.
func (c *rcConn) serveRead(seg udiwarp.Segment, size int) bool {
	q := c.q
	rr := seg.ReadRequest()
	if !c.takeRequest(seg, size, []byte(rr)) {
		return false
	}
	m := &rcMsg{op: opReadResponse, internal: true, length: rr.Size(), sinkSTag: rr.SinkSTag(), sinkTO: rr.SinkTO()}
	if m.length > 0 {
		m.sge[0] = SGE{LKey: rr.SourceSTag(), Addr: rr.SourceTO(), Length: m.length}
		mr, f := q.dev.remoteRegion(q.pd, rr.SourceSTag(), rr.SourceTO(), uint64(m.length), AccessRemoteRead)
		if f != faultNone {
			c.terminate(f.rdmapCode(), ddpHdr(seg), []byte(seg.ReadRequest()), size)
			return false
		}
		m.refs.add(mr)
		mr.unpin()
		m.nsge = 1
	}
	m.rstag = 0
	c.mu.Lock()
	c.serving++
	c.queue = append(c.queue, m)
	c.pumpLocked()
	c.mu.Unlock()
	return true
}

// readResponse places a Read Response segment into the sink of the oldest
// outstanding Read; its last segment completes it.
func (c *rcConn) readResponse(seg udiwarp.Segment, size int) bool {
	c.mu.Lock()
	var m *rcMsg
	if len(c.reads) > 0 {
		m = c.reads[0]
	}
	c.mu.Unlock()
	t := seg.Tagged()
	if m == nil || m.op != OpRead || t.STag() != m.sinkSTag || t.TO() < m.sinkTO || t.TO()-m.sinkTO+uint64(len(seg.Payload)) > uint64(m.length) {
		c.terminate(udiwarp.DDPTaggedBaseBounds, ddpHdr(seg), nil, size)
		return false
	}
	if code, ok := c.place(seg, AccessRemoteWrite); !ok {
		c.terminate(code, ddpHdr(seg), nil, size)
		return false
	}
	if seg.Control.Last() {
		c.mu.Lock()
		c.reads = c.reads[1:]
		m.respDone, m.done = true, true
		c.pumpLocked() // a Read held back by ORD may go now
		c.completeLocked()
		c.mu.Unlock()
	}
	return true
}

// serveAtomic carries out an Atomic Request (Device.executeAtomic: the
// one remote-access check, then the operation — once, as TCP delivers
// each request once) and queues its Atomic Response. Atomics share the
// Read Requests' queue, MSNs and IRD (RFC 7306).
func (c *rcConn) serveAtomic(seg udiwarp.Segment, size int) bool {
	q := c.q
	if !c.takeRequest(seg, size, nil) {
		return false
	}
	a := seg.AtomicRequest()
	v, af, f := q.dev.executeAtomic(q.pd, a)
	switch af {
	case atomicInvalid:
		c.terminate(udiwarp.RDMAPOpUnspecified, ddpHdr(seg), nil, size)
		return false
	case atomicAccess:
		c.terminate(f.rdmapCode(), ddpHdr(seg), nil, size)
		return false
	}
	c.mu.Lock()
	m := &rcMsg{op: opAtomicResponse, internal: true, msn: c.atomicMSN, reqID: a.RequestID(), compareAdd: v}
	c.atomicMSN++
	c.serving++
	c.queue = append(c.queue, m)
	c.pumpLocked()
	c.mu.Unlock()
	return true
}

// atomicResponse places the original value an Atomic Response brought
// into the SGE of the oldest outstanding request, which must be the
// atomic it names (responses come in request order), and completes it.
func (c *rcConn) atomicResponse(seg udiwarp.Segment, size int) bool {
	h := seg.Untagged()
	a := seg.AtomicResponse()
	if h.MSN() != c.rxAtomicMSN {
		c.terminate(udiwarp.DDPUntaggedMSNRange, ddpHdr(seg), nil, size)
		return false
	}
	c.rxAtomicMSN++
	c.mu.Lock()
	var m *rcMsg
	if len(c.reads) > 0 {
		m = c.reads[0]
	}
	c.mu.Unlock()
	if m == nil || !m.op.atomic() || m.msn != a.RequestID() {
		c.terminate(udiwarp.RDMAPUnexpectedOpcode, ddpHdr(seg), nil, size)
		return false
	}
	st := c.q.placeAtomicResult(m.sge[0], a.Value())
	c.mu.Lock()
	c.reads = c.reads[1:]
	if m.status == Success {
		m.status = st
	}
	m.respDone, m.done = true, true
	c.pumpLocked() // a request held back by ORD may go now
	c.completeLocked()
	c.mu.Unlock()
	return true
}

// receiveImmediate completes the receive at the head of the queue with
// an Immediate Data message: the next message of the Send queue.
func (c *rcConn) receiveImmediate(seg udiwarp.Segment, size int) bool {
	q := c.q
	if h := seg.Untagged(); h.MSN() != c.rxSendMSN || c.cur.have {
		c.terminate(udiwarp.DDPUntaggedMSNRange, ddpHdr(seg), nil, size)
		return false
	}
	var w recvWQE
	if res := q.takeRecv(&w, 0, netip.AddrPort{}); res != recvTaken {
		if res == recvNone {
			q.dev.stats.RxNoRecv.Add(1)
		}
		c.terminate(udiwarp.DDPUntaggedNoBuffer, ddpHdr(seg), nil, size)
		return false
	}
	c.rxSendMSN++
	q.deliverImmediate(&w, seg, c.peer(), Success)
	return true
}

// refused completes the request a peer's Terminate names (its echoed
// header: the oldest outstanding Read or atomic, by queue and MSN) with
// the status the code maps to, before the QP fails and flushes the rest:
// the requester learns why, not only that its WR was flushed.
func (c *rcConn) refused(h udiwarp.DDPUntagged, code udiwarp.ErrorCode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.reads) == 0 || udiwarp.Queue(h.QN()) != udiwarp.QueueReadRequest || h.MSN() != c.reads[0].msn {
		return
	}
	m := c.reads[0]
	c.reads = c.reads[1:]
	m.status, m.done = terminateStatus(code), true
}

// terminateStatus is the completion status of a request a peer's
// Terminate refused with code.
func terminateStatus(code udiwarp.ErrorCode) Status {
	switch {
	case code == udiwarp.RDMAPOpUnspecified, code == udiwarp.RDMAPUnexpectedOpcode:
		return RemoteInvalidRequestError
	case code>>8 == udiwarp.RDMAPInvalidSTag>>8, code>>8 == udiwarp.DDPTaggedInvalidSTag>>8:
		return RemoteAccessError // RDMAP remote protection, DDP tagged buffer errors
	}
	return RemoteOperationError
}

// terminate sends a Terminate for the failed segment (RFC 5040 §7.1),
// then fails the QP: outstanding WRs flush, the connection closes.
func (c *rcConn) terminate(code udiwarp.ErrorCode, ddpHeader, rdmaHeader []byte, segLen int) {
	q := c.q
	q.dev.stats.RCTerminatesSent.Add(1)
	f := udiwarp.TerminateFields{Code: code}
	if len(ddpHeader) == udiwarp.DDPTaggedHeaderSize || len(ddpHeader) == udiwarp.DDPUntaggedHeaderSize {
		f.DDPHeader = ddpHeader
		f.SegmentLengthValid = segLen > 0
		f.DDPSegmentLength = uint16(min(segLen, 0xFFFF))
	}
	if len(rdmaHeader) == udiwarp.ReadRequestSize {
		f.RDMAHeader = rdmaHeader
	}
	body, err := udiwarp.AppendTerminate(nil, &f)
	c.mu.Lock()
	if err == nil && !c.dead {
		// The Terminate goes next; nothing else after it.
		for _, m := range c.queue {
			if m.internal && m.op == opReadResponse {
				m.releaseMRs()
			}
		}
		c.queue = append(c.queue[:0], &rcMsg{op: opTerminate, internal: true, body: body, msn: c.termMSN})
		c.termMSN++
		c.rtrPending = false
		c.pumpLocked()
	}
	c.mu.Unlock()
	q.dev.raise(AsyncEvent{Type: AsyncQPFatal, QP: q, Code: code})
	c.fail()
}

// lost handles the end of the TCP stream.
func (c *rcConn) lost() {
	if !c.Closing() {
		c.q.dev.stats.RCConnectionsLost.Add(1)
		c.q.dev.raise(AsyncEvent{Type: AsyncQPFatal, QP: c.q, Code: udiwarp.MPAConnectionLost})
	}
	c.fail()
}

// fail moves the QP to ERROR (flushing every WR) and closes the connection.
func (c *rcConn) fail() {
	c.Refuse()
	c.q.toError()
}

// flush completes every outstanding WR with WRFlushError and closes the
// connection (QP to ERROR or destroyed). The caller holds q.sqMu.
func (c *rcConn) flush() {
	c.mu.Lock()
	for _, m := range c.queue {
		if m.internal {
			m.releaseMRs()
		}
	}
	c.queue = nil
	for _, m := range c.posted {
		if !m.done {
			m.status, m.done = WRFlushError, true
		}
	}
	c.reads = nil
	c.completeLocked()
	c.dead = true
	c.mu.Unlock()
	c.shutdown() // sets closing
	if c.rxMu.TryLock() {
		c.flushCur()
		c.rxMu.Unlock()
	} // else the reader flushes it (rxUnlock)
}

// rxUnlock ends a turn of the receive side. A connection that ended
// meanwhile flushes the receive a Send in progress holds: flush cannot
// take rxMu while a reader holds it (the reader itself may be failing the
// QP), so the reader does it, here; and flush, having set closing first,
// does it when it gets rxMu, so one of them always does.
func (c *rcConn) rxUnlock() {
	if c.Closing() {
		c.flushCur()
	}
	c.rxMu.Unlock()
	if c.Closing() && c.rxMu.TryLock() {
		c.flushCur()
		c.rxMu.Unlock()
	}
}

// flushCur completes with WRFlushError the receive a Send whose last
// segment never came holds, so that the application gets its buffer
// back (and an SRQ its count). Caller holds rxMu.
func (c *rcConn) flushCur() {
	if c.cur.have {
		c.cur.have = false
		c.q.flushRecv(c.cur.w.id)
	}
}

// shutdown takes the connection off the poller and closes it.
func (c *rcConn) shutdown() {
	c.Refuse()
	c.q.dev.rc.unregister(c)
	c.Retire()
	if c.tc != nil {
		c.tc.Close()
	} // a manual connection's descriptor is the caller's to close
}

// scatterAt copies payload into w's SGL at byte offset off.
func (q *QP) scatterAt(w *recvWQE, off uint32, payload []byte) Status {
	if uint64(off)+uint64(len(payload)) > sglLen(w.sge[:w.nsge]) {
		return LocalLengthError
	}
	pd := q.pd
	if q.srq != nil {
		pd = q.srq.pd
	}
	c := sglSlice{sge: w.sge[:w.nsge], off: off, left: uint32(len(payload))}
	for part, ok := c.next(); ok; part, ok = c.next() {
		m, b, st := q.dev.resolve(pd, &part, AccessLocalWrite)
		if st != Success {
			return st
		}
		k := copy(b, payload)
		m.unpin()
		payload = payload[k:]
	}
	return Success
}

// sourceRevokedLocked ends the stream when the source of the Read
// Response being sent was invalidated (MR.Invalidate) after the Read was
// served: a Terminate (RDMAP remote protection, access rights) goes next
// instead of the rest, so the peer's Read fails, and the device's timer
// fails this QP as terminate does, outside the locks the pump holds.
func (c *rcConn) sourceRevokedLocked() {
	body, _ := udiwarp.AppendTerminate(nil, &udiwarp.TerminateFields{Code: udiwarp.RDMAPAccessRights})
	for _, m := range c.queue {
		if m.internal && m.op == opReadResponse {
			m.releaseMRs()
		}
	}
	c.queue = append(c.queue[:0], &rcMsg{op: opTerminate, internal: true, body: body, msn: c.termMSN})
	c.termMSN++
	c.rtrPending = false
	c.q.dev.stats.RCTerminatesSent.Add(1)
	c.revokedTerm.Store(true)
	c.q.armTimer(time.Now())
}

// rcAckTimer completes the WRs whose bytes the peer acknowledged
// (CompleteOnAck, FlagCompleteOnAck), and fails a QP whose Read Response
// source was invalidated.
func (q *QP) rcAckTimer() {
	if c := q.rc.Load(); c != nil && c.revokedTerm.Swap(false) {
		q.dev.raise(AsyncEvent{Type: AsyncQPFatal, QP: q, Code: udiwarp.RDMAPAccessRights})
		c.fail()
		return
	}
	if c := q.rc.Load(); c != nil {
		c.mu.Lock()
		c.completeLocked()
		c.mu.Unlock()
	}
}

// ddpHdr is the DDP header of seg, as a Terminate echoes it.
func ddpHdr(seg udiwarp.Segment) []byte {
	if seg.Control.Tagged() {
		return seg.Header[:udiwarp.DDPTaggedHeaderSize]
	}
	return seg.Header[:udiwarp.DDPUntaggedHeaderSize]
}
