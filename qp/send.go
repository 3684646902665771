package qp

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// SendOpcode is the operation of a send work request, and which QP
// types carry it:
//
//	OpSend            Send into the peer's posted receive         UD, RD, RC
//	OpWriteRecord     RDMA Write-Record: placed and recorded,
//	                  no receive at the peer                      UD, RD
//	OpWrite           RDMA Write into the peer's region           RD, RC
//	OpRead            RDMA Read of the peer's region              RD, RC
//	OpSendInvalidate  Send that invalidates a peer's STag         RC
//	OpAtomicFetchAdd  RFC 7306 FetchAdd on a peer's word          RD, RC
//	OpAtomicCmpSwap   RFC 7306 CmpSwap on a peer's word           RD, RC
//	OpImmediate       RFC 7306 Immediate Data (8 bytes, a recv)   RD, RC
//	OpSendImm         Send, then Immediate Data                   RD, RC
//	OpWriteImm        RDMA Write, then Immediate Data             RD, RC
//
// The one-sided operations (Write-Record, Write, Read, the atomics) need
// nothing of the target's application: no receive posted, and on RD no
// address handle at the target either (its QP answers whoever its
// checks let in); only the region, registered with the remote access
// the operation needs, and its STag sent to the initiator. Each
// constant's comment says the rest.
type SendOpcode uint8

const (
	OpSend SendOpcode = iota // Send (RDMAP Send, or Send with SE with FlagSolicited)
	// OpWriteRecord writes the SGL (or Inline) into the peer's region named
	// by RemoteSTag at RemoteTO, cut into Write-Record segments; the peer
	// places what arrives and records which bytes are valid, with no
	// receive posted. On UD it completes once its last segment is sent.
	OpWriteRecord
	// OpWrite is an RDMA Write of the SGL (or Inline) into the peer's
	// region named by RemoteSTag at RemoteTO (RD QPs). It completes when
	// the peer acknowledged every segment.
	OpWrite
	// OpRead is an RDMA Read of the peer's region named by RemoteSTag at
	// RemoteTO into the one SGE of the SGL, which must lie in a region with
	// remote-write access (the Read Responses are tagged writes into it,
	// RFC 5040). RD and RC QPs; it completes when the last response is placed.
	OpRead
	// OpSendInvalidate is a Send that also invalidates the peer's STag
	// InvalidateSTag for remote access (RC QPs; RFC 5040 Send with
	// Invalidate). FlagSolicited makes it Send with SE and Invalidate.
	OpSendInvalidate
	// OpAtomicFetchAdd adds CompareAdd to the 64-bit word of the peer's
	// region at RemoteSTag/RemoteTO (8-byte aligned, remote atomic
	// access) and returns the word's original value into the one 8-byte
	// SGE of the SGL (RFC 7306 FetchAdd). RD and RC QPs; the word is
	// changed exactly once, and the WR completes when the value arrived.
	OpAtomicFetchAdd
	// OpAtomicCmpSwap writes Swap into that word if it equals CompareAdd,
	// and returns its original value the same way (RFC 7306 CmpSwap).
	OpAtomicCmpSwap
	// OpImmediate sends the 8 bytes of Imm as an RFC 7306 Immediate Data
	// message: it consumes a posted receive at the peer, whose completion
	// carries Imm (WithImm) and no data. FlagSolicited sends Immediate
	// Data with Solicited Event. RD and RC QPs.
	OpImmediate
	// OpSendImm is a Send followed by an Immediate Data message carrying
	// Imm (RFC 7306 has no single message for it): each consumes a posted
	// receive at the peer, in order, the second completing with Imm. One
	// send completion covers both. RD and RC QPs.
	OpSendImm
	// OpWriteImm is an RDMA Write followed by an Immediate Data message
	// carrying Imm (RFC 7306 RDMA Write with Immediate Data): the peer's
	// posted receive completes with Imm once every byte of the Write is
	// placed. RD and RC QPs.
	OpWriteImm
)

var sendOpNames = [...]string{OpSend: "send", OpWriteRecord: "write-record", OpWrite: "rdma-write", OpRead: "rdma-read",
	OpSendInvalidate: "send-with-invalidate", OpAtomicFetchAdd: "atomic-fetch-add", OpAtomicCmpSwap: "atomic-cmp-swap",
	OpImmediate: "immediate-data", OpSendImm: "send-with-imm", OpWriteImm: "rdma-write-with-imm"}

func (o SendOpcode) String() string {
	if int(o) < len(sendOpNames) && sendOpNames[o] != "" {
		return sendOpNames[o]
	}
	return "send opcode " + strconv.Itoa(int(o))
}

// atomic reports whether o is an RFC 7306 atomic operation.
func (o SendOpcode) atomic() bool { return o == OpAtomicFetchAdd || o == OpAtomicCmpSwap }

// awaitsResponse reports whether a WR of o completes only when the peer's
// response arrived (RDMA Read, atomics): ORD counts these.
func (o SendOpcode) awaitsResponse() bool { return o == OpRead || o.atomic() }

// wcOpcode is the completion opcode of a send WR of o.
func (o SendOpcode) wcOpcode() WCOpcode {
	switch o {
	case OpWriteRecord:
		return WCWriteRecord
	case OpWrite, OpWriteImm:
		return WCRDMAWrite
	case OpRead:
		return WCRDMARead
	case OpAtomicFetchAdd:
		return WCAtomicFetchAdd
	case OpAtomicCmpSwap:
		return WCAtomicCmpSwap
	}
	return WCSend
}

// imm reports whether o ends with an Immediate Data message.
func (o SendOpcode) imm() bool { return o == OpImmediate || o == OpSendImm || o == OpWriteImm }

// SendFlags modify a send work request (ibv_send_flags).
type SendFlags uint8

const (
	// FlagSignaled asks for a completion on success; errors always complete.
	FlagSignaled SendFlags = 1 << iota
	// FlagSolicited sends a Send with Solicited Event: the receiver's CQ
	// notification armed for solicited completions fires.
	FlagSolicited
	// FlagCompleteOnAck, on an RC QP, completes the WR only once the
	// peer's TCP acknowledged its last byte, as RCConfig.CompleteOnAck
	// does for every WR of a connection, instead of once TCP took it.
	// What the peer acknowledged survives the connection's closing, even
	// a reset (closing a socket with unread input resets it, RFC 2525
	// §2.17, and throws away what TCP still holds): the last message
	// before a close takes it. A Read or atomic completes on its response
	// either way. Other QP types refuse it.
	FlagCompleteOnAck
	// FlagAckLazily, on an RD QP, lets the WR's last segment go without
	// asking the peer for an immediate ack (FlagAckNow, wire.md §11): the
	// WR completes on the ack the peer sends anyway, on its next frame
	// to us or after its ack delay (reliability.Config.MaxAckDelay, 1 ms).
	// For request and response traffic, where the response carries the
	// ack and a standalone one would cost each side a system call more.
	// (A signaled WR's last segment asks for one otherwise; an unsignaled
	// WR's never does.) Other QP types refuse it.
	FlagAckLazily
)

// SendWR is a send work request (ibv_send_wr). The SGL names registered
// memory; Inline instead carries the data itself (at most MaxInline bytes),
// copied before PostSend returns, so it needs no registration.
type SendWR struct {
	ID     uint64
	Opcode SendOpcode
	Flags  SendFlags
	SGL    []SGE
	Inline []byte
	AH     *AH // destination of a UD send
	// RemoteSTag and RemoteTO name where an OpWriteRecord or OpWrite lands.
	RemoteSTag uint32
	RemoteTO   uint64
	// InvalidateSTag is the peer's STag an OpSendInvalidate invalidates.
	InvalidateSTag uint32
	// CompareAdd is the addend of OpAtomicFetchAdd and the value
	// OpAtomicCmpSwap compares with; Swap is what OpAtomicCmpSwap writes
	// (ibv_send_wr's wr.atomic).
	CompareAdd, Swap uint64
	// Imm is the immediate data of OpImmediate, OpSendImm and OpWriteImm.
	Imm uint64
}

type sendWQE struct {
	id        uint64
	op        SendOpcode
	flags     SendFlags
	ah        *AH
	nsge      int
	sge       [maxSGE]SGE
	inline    []byte // the slot's inline buffer
	inlineLen int
	isInline  bool
	msn       uint32
	// Write-Record: the target, the message length, and how much of it
	// has been sent (a WR can span datagrams, and pause between them).
	rstag  uint32
	rto    uint64
	length uint32
	off    uint32
}

// txCtx builds one datagram at a time for its QP: header, buffers over
// the registered memory, CRC trailer, and the lower layer's Write. The
// payload leaves from the registered buffer in the same call as the
// header (over a socket, the same sendmsg(2)).
type txCtx struct {
	q      *QP
	msg    [1]llp.Msg
	bufs   [maxSGE + 2][]byte
	hdr    [udiwarp.WriteRecordHeaderSize]byte
	crc    [udiwarp.CRCSize]byte
	mrs    [maxSGE]*MR
	nmr    int
	length int
	ah     *AH
	gso    *gsoCtx // Write-Record batches, made on first use
	// The datagram being built: iovecs used, and its running CRC.
	niov int
	sum  bool
	sumv uint32
}

func (t *txCtx) init(q *QP) {
	t.q = q
	t.msg[0].Bufs = t.bufs[:0]
}

// build prepares the datagram of a send WR for socket s. On success the
// MRs it names are held shared until release.
func (t *txCtx) build(s *Socket, flags SendFlags, ah *AH, sgl []SGE, inline []byte, msn uint32) Status {
	q := t.q
	opc := udiwarp.OpSend
	if flags&FlagSolicited != 0 {
		opc = udiwarp.OpSendSE
	}
	hdr := udiwarp.DDPUntagged(t.hdr[:udiwarp.DDPUntaggedHeaderSize])
	hdr.Encode(&udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion, RDMAP: udiwarp.NewRDMAPControl(opc),
		ULP: q.wireQPN(), QN: udiwarp.DatagramQN(ah.qpn, udiwarp.QueueSend), MSN: msn})
	t.begin(hdr)
	total := 0
	if inline != nil {
		t.add(inline)
		total = len(inline)
	} else {
		for i := range sgl {
			b, st := t.pin(&sgl[i])
			if st != Success {
				return st
			}
			t.add(b)
			total += len(b)
		}
	}
	if total > s.MaxMessage() {
		t.release()
		return LocalLengthError
	}
	t.finish(s, ah, total)
	return Success
}

// begin starts a datagram with its header: the first iovec, and the CRC.
func (t *txCtx) begin(hdr []byte) {
	t.sum = !t.q.dev.cfg.NoCRC
	t.sumv = 0
	if t.sum {
		t.sumv = udiwarp.CRC32c(hdr)
	}
	t.bufs[0] = hdr
	t.niov = 1
}

// add appends a piece of payload: an iovec over it, and its CRC.
func (t *txCtx) add(b []byte) {
	if len(b) == 0 {
		return
	}
	t.bufs[t.niov] = b
	t.niov++
	if t.sum {
		t.sumv = udiwarp.UpdateCRC32c(t.sumv, b)
	}
}

// pin resolves an SGE for reading and holds its MR until release; on a
// fault it releases what the datagram held so far.
func (t *txCtx) pin(g *SGE) ([]byte, Status) {
	m, b, st := t.q.dev.resolve(t.q.pd, g, 0)
	if st != Success {
		t.release()
		return nil, st
	}
	t.mrs[t.nmr] = m
	t.nmr++
	return b, Success
}

// finish appends the CRC trailer and addresses the datagram to ah.
func (t *txCtx) finish(s *Socket, ah *AH, payload int) {
	t.length = payload
	t.ah = ah
	udiwarp.PutCRC(t.crc[:], t.sumv)
	t.bufs[t.niov] = t.crc[:]
	t.msg[0].Bufs = t.bufs[:t.niov+1]
	t.setDest(ah)
}

// setDest points the message at ah's address.
func (t *txCtx) setDest(ah *AH) {
	t.msg[0].Addr = ah.addr
}

func (t *txCtx) release() {
	for i := 0; i < t.nmr; i++ {
		t.mrs[i].unpin()
		t.mrs[i] = nil
	}
	t.nmr = 0
}

// transmit sends the built datagram (or GSO train) without waiting
// through the socket's lower layer. It returns errSocketFull when the
// socket cannot take it now.
func (t *txCtx) transmit(s *Socket) error {
	d := s.dev
	_, err := s.ll.Write(t.msg[:])
	switch err {
	case nil:
		d.stats.TxDatagrams.Add(1)
		d.stats.TxBytes.Add(uint64(t.msg[0].N))
		return nil
	case llp.ErrWouldBlock:
		return errSocketFull
	case llp.ErrClosed:
		return ErrClosed
	}
	d.stats.TxErrors.Add(1)
	if e := unix.Errno(0); errors.As(err, &e) {
		d.stats.lastTxErrno.Store(uint32(e))
	}
	return err
}

// transmitTrain sends bufs as a train of size-byte datagrams to ah; it
// counts the train as one datagram, as transmit does, for its caller to
// add the rest. The single datagram's buffers are the context's again
// when it returns.
func (t *txCtx) transmitTrain(s *Socket, bufs [][]byte, size int, ah *AH) error {
	m := &t.msg[0]
	m.Bufs, m.Segment = bufs, size
	t.setDest(ah)
	err := t.transmit(s)
	m.Bufs, m.Segment = t.bufs[:0], 0
	return err
}

// PostSend posts a send work request. It never blocks: when the QP has no
// queued work and the socket can take the datagram now, it is sent in the
// caller's goroutine; otherwise it is queued for the device's datamover.
// A UD send completes when the socket accepted its datagram; an RD WR when
// its peer acknowledged all of it, in post order per peer, never waiting
// for a WR to another peer (docs/verbs.md, RD). Local faults
// in the WR (a bad lkey, an SGE past its MR, a message longer than a
// datagram) complete with an error status; faults PostSend can see without
// touching memory return an error and post nothing.
func (q *QP) PostSend(wr *SendWR) error {
	if st := q.State(); st != StateRTS {
		return fmt.Errorf("%w: PostSend on a QP in %v", ErrQPState, st)
	}
	switch {
	case len(wr.SGL) > q.caps.MaxSendSGE:
		return fmt.Errorf("%w: %d SGEs, the QP takes %d", ErrInvalidWR, len(wr.SGL), q.caps.MaxSendSGE)
	case wr.Inline != nil && len(wr.SGL) > 0:
		return fmt.Errorf("%w: inline data and an SGL in one WR", ErrInvalidWR)
	case len(wr.Inline) > q.inlineSz:
		return fmt.Errorf("%w: %d bytes of inline data, the QP takes %d", ErrInvalidWR, len(wr.Inline), q.inlineSz)
	case wr.Flags&FlagCompleteOnAck != 0 && q.typ != RC:
		return fmt.Errorf("%w: FlagCompleteOnAck on a %v QP (TCP's acknowledgement is RC's)", ErrInvalidWR, q.typ)
	case wr.Flags&FlagAckLazily != 0 && q.typ != RD:
		return fmt.Errorf("%w: FlagAckLazily on a %v QP (RD's acknowledgements are its own)", ErrInvalidWR, q.typ)
	}
	return q.eng.post(wr)
}

// checkDatagramWR is what a UD or RD send WR needs beyond PostSend's
// checks: an address handle of the QP's PD (each engine checks the opcode).
func (q *QP) checkDatagramWR(wr *SendWR) error {
	switch {
	case wr.AH == nil:
		return fmt.Errorf("%w: a UD send needs an address handle", ErrInvalidWR)
	case wr.AH.pd != q.pd:
		return fmt.Errorf("%w: address handle of another protection domain", ErrInvalidWR)
	}
	return nil
}

// post is a UD send: sent now in the caller's goroutine when nothing is
// queued and the socket takes it, else queued for the datamover.
func (e udEngine) post(wr *SendWR) error {
	q := e.q
	if err := q.checkDatagramWR(wr); err != nil {
		return err
	}
	switch op := wr.Opcode; {
	case op == OpSend, op == OpWriteRecord:
	case op == OpWrite, op.awaitsResponse():
		return fmt.Errorf("%w: %v needs a reliable QP (RD or RC), not %v: UD carries no acknowledgement or response back", ErrInvalidWR, op, q.typ)
	case op.imm():
		// Immediate Data completes a receive only after the Send or Write
		// before it: on UD either datagram may be lost alone.
		return fmt.Errorf("%w: %v needs a reliable QP (RD or RC), not %v: UD may lose its Send or Write and still deliver the Immediate Data", ErrInvalidWR, op, q.typ)
	default:
		return fmt.Errorf("%w: %v is not available on %v QPs", ErrInvalidWR, op, q.typ)
	}
	s := q.sock.Load()
	q.sqMu.Lock()
	if st := q.State(); st != StateRTS { // Modify ran since the check above
		q.sqMu.Unlock()
		return fmt.Errorf("%w: PostSend on a QP in %v", ErrQPState, st)
	}
	if wr.Opcode == OpWriteRecord {
		return q.postWriteRecordLocked(wr, s)
	}
	if q.sq.len() == 0 && !q.inMover {
		msn := wr.AH.msn.Add(1)
		st := q.tx.build(s, wr.Flags, wr.AH, wr.SGL, wr.Inline, msn)
		if st != Success {
			q.sqMu.Unlock()
			q.completeSend(wr.ID, st, 0)
			return nil
		}
		err := q.tx.transmit(s)
		q.tx.release()
		if err != errSocketFull {
			n := q.tx.length
			q.sqMu.Unlock()
			q.dev.stats.TxDirect.Add(1)
			if err != nil {
				q.completeSend(wr.ID, GeneralError, 0)
			} else if wr.Flags&FlagSignaled != 0 {
				q.completeSend(wr.ID, Success, n)
			}
			return nil
		}
		return q.enqueueLocked(wr, msn, s)
	}
	return q.enqueueLocked(wr, wr.AH.msn.Add(1), s)
}

// enqueueLocked queues wr for the datamover; it unlocks sqMu.
func (q *QP) enqueueLocked(wr *SendWR, msn uint32, s *Socket) error {
	if n := q.sq.len(); q.sq.full() {
		q.sqMu.Unlock()
		return fmt.Errorf("%w: %d send WRs outstanding", ErrQueueFull, n)
	}
	w := q.sq.push()
	w.id, w.op, w.flags, w.ah = wr.ID, wr.Opcode, wr.Flags, wr.AH
	w.nsge = copy(w.sge[:], wr.SGL)
	w.isInline = wr.Inline != nil
	w.inlineLen = copy(q.inlineBuf(w, len(wr.Inline)), wr.Inline)
	w.msn = msn
	schedule := !q.inMover
	q.inMover = true
	q.sqMu.Unlock()
	q.dev.stats.TxQueued.Add(1)
	if schedule {
		s.activate(q)
	}
	return nil
}

// inlineBuf is w's inline buffer, made the first time the slot queues
// inline data: a send that goes out directly (most; every one of an
// idle QP) copies nothing there, so a QP's inline buffers cost memory
// only once its sends have had to wait.
func (q *QP) inlineBuf(w *sendWQE, n int) []byte {
	if n > 0 && w.inline == nil {
		w.inline = make([]byte, q.inlineSz)
	}
	return w.inline
}

// completeSend completes a Send WR; complete, a queued WR of any kind.
func (q *QP) completeSend(id uint64, st Status, n int) { q.pushSend(id, st, WCSend, n) }

func (q *QP) complete(w *sendWQE, st Status, n int) { q.pushSend(w.id, st, w.op.wcOpcode(), n) }

func (q *QP) pushSend(id uint64, st Status, op WCOpcode, n int) {
	q.sendCQ.push(&WorkCompletion{ID: id, Status: st, Opcode: op, Len: uint32(n), QPN: q.num})
}

func (q *QP) popSQLocked() {
	q.sq.front().ah = nil
	q.sq.pop()
}

// activate hands q to the socket's datamover.
func (s *Socket) activate(q *QP) {
	s.txMu.Lock()
	s.active = append(s.active, q)
	if !s.mover && !s.closed {
		// The first send that waits starts the datamover: a socket whose
		// sends all go out directly (most, and every idle one) costs no
		// goroutine. Close sets closed under txMu before the device waits.
		s.mover = true
		s.dev.wg.Add(1)
		go s.datamover()
	}
	s.txMu.Unlock()
	select {
	case s.txWake <- struct{}{}:
	default:
	}
}

const moverChunk = 16 // WRs sent per QP per turn, so one QP cannot hog the socket

// datamover serves the socket's active QPs round-robin in bounded chunks,
// and parks while the socket is full (seed 000).
func (s *Socket) datamover() {
	d := s.dev
	defer d.wg.Done()
	for {
		select {
		case <-s.txWake:
		case <-s.txDone:
			return
		case <-d.done:
			return
		}
		for {
			s.txMu.Lock()
			if len(s.active) == 0 || s.closed {
				s.txMu.Unlock()
				break
			}
			q := s.active[0]
			copy(s.active, s.active[1:])
			s.active = s.active[:len(s.active)-1]
			s.txMu.Unlock()

			more, full := q.eng.drain(s, moverChunk)
			if full {
				d.stats.TxParked.Add(1)
				if err := s.ll.WaitWritable(); err != nil {
					return // closed
				}
			}
			if more {
				s.txMu.Lock()
				s.active = append(s.active, q)
				s.txMu.Unlock()
			}
		}
	}
}

// drain sends up to max queued WRs. more says WRs remain; full says the
// socket filled up.
func (e udEngine) drain(s *Socket, max int) (more, full bool) {
	e.q.sqMu.Lock()
	defer e.q.sqMu.Unlock()
	return e.q.drainLocked(s, max)
}

func (q *QP) drainLocked(s *Socket, max int) (more, full bool) {
	for k := 0; k < max && q.sq.len() > 0; k++ {
		if q.State() != StateRTS {
			break // the state change flushed or cleared the queue
		}
		w := q.sq.front()
		if w.op == OpWriteRecord {
			switch st, err := q.sendWriteRecord(s, w); {
			case err == errSocketFull:
				return true, true
			case st != Success:
				q.complete(w, st, 0)
			case err != nil:
				q.complete(w, GeneralError, 0)
			case w.flags&FlagSignaled != 0:
				q.complete(w, Success, int(w.length))
			}
			q.popSQLocked()
			continue
		}
		var inline []byte
		if w.isInline {
			inline = w.inline[:w.inlineLen]
		}
		st := q.tx.build(s, w.flags, w.ah, w.sge[:w.nsge], inline, w.msn)
		if st != Success {
			q.completeSend(w.id, st, 0)
			q.popSQLocked()
			continue
		}
		err := q.tx.transmit(s)
		q.tx.release()
		if err == errSocketFull {
			return true, true
		}
		switch {
		case err != nil:
			q.completeSend(w.id, GeneralError, 0)
		case w.flags&FlagSignaled != 0:
			q.completeSend(w.id, Success, q.tx.length)
		}
		q.popSQLocked()
	}
	if q.sq.len() == 0 || q.State() != StateRTS {
		q.inMover = false
		return false, false
	}
	return true, false
}
