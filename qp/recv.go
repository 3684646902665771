package qp

import (
	"fmt"
	"net/netip"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// RecvWR is a receive work request (ibv_recv_wr): where the next message
// is scattered.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

type recvWQE struct {
	id   uint64
	seq  uint64 // position in the QP's receive order
	nsge int
	sge  [maxSGE]SGE
}

// PostRecv posts a receive. Receives are matched to messages in arrival
// order. A QP in ERROR completes it at once with WRFlushError.
func (q *QP) PostRecv(wr *RecvWR) error {
	if q.srq != nil {
		return fmt.Errorf("%w: the QP receives from its SRQ; post there", ErrInvalidWR)
	}
	if len(wr.SGL) > q.caps.MaxRecvSGE {
		return fmt.Errorf("%w: %d SGEs, the QP takes %d", ErrInvalidWR, len(wr.SGL), q.caps.MaxRecvSGE)
	}
	switch st := q.State(); st {
	case StateReset:
		return fmt.Errorf("%w: PostRecv on a QP in %v", ErrQPState, st)
	case StateError:
		q.recvCQ.push(&WorkCompletion{ID: wr.ID, Status: WRFlushError, Opcode: WCRecv, QPN: q.num})
		return nil
	}
	q.rqMu.Lock()
	if q.State() == StateError { // a flush ran since the check above
		q.rqMu.Unlock()
		q.recvCQ.push(&WorkCompletion{ID: wr.ID, Status: WRFlushError, Opcode: WCRecv, QPN: q.num})
		return nil
	}
	if n := q.rq.len(); q.rq.full() {
		q.rqMu.Unlock()
		return fmt.Errorf("%w: %d receives posted", ErrQueueFull, n)
	}
	w := q.rq.push()
	w.id = wr.ID
	q.rqSeq++
	w.seq = q.rqSeq
	w.nsge = copy(w.sge[:], wr.SGL)
	q.rqMu.Unlock()
	return nil
}

// takeRecv removes into w the receive for a message of n bytes (n < 0:
// not known yet) from src: from q's RQ, or from its SRQ within q's limits
// (SRQ.take, which counts and reports a refusal at a limit). recvNone,
// nothing posted, is the caller's to count.
func (q *QP) takeRecv(w *recvWQE, n int, src netip.AddrPort) recvResult {
	if s := q.srq; s != nil {
		return s.take(q, w, n, src)
	}
	q.rqMu.Lock()
	if q.rq.len() == 0 {
		q.rqMu.Unlock()
		return recvNone
	}
	*w = *q.rq.front()
	q.rq.pop()
	q.rqMu.Unlock()
	return recvTaken
}

// flushRecv completes receive id, taken from q's RQ or SRQ, with
// WRFlushError: the QP went to ERROR before a message filled it.
func (q *QP) flushRecv(id uint64) {
	wc := WorkCompletion{ID: id, Status: WRFlushError, Opcode: WCRecv, QPN: q.num}
	if q.srq != nil {
		wc.srqQP = q
	}
	q.recvCQ.push(&wc)
}

// deliver handles one received datagram. b is the datagram, truncated
// says the kernel cut it.
func (d *Device) deliver(s *Socket, b []byte, truncated bool, src netip.AddrPort) {
	st := &d.stats
	s.rx.arrived(len(b))
	if truncated {
		st.RxTooLong.Add(1)
		return
	}
	t, err := udiwarp.Classify(b) // the one home of the frame-type rule
	if err != nil {
		st.countRx(err)
		return
	}
	switch t {
	case udiwarp.FrameRD:
		st.RxRDFrames.Add(1)
		d.deliverRD(s, b, src)
		return
	case udiwarp.FrameEnvelope:
		d.deliverEnvelope(s, b, src)
		return
	}
	parse := udiwarp.ParseUDFrame
	if d.cfg.NoCRC {
		parse = udiwarp.ParseUDFrameNoCRC
	}
	seg, err := parse(b)
	if err != nil {
		st.countRx(err)
		return
	}
	var dst uint32
	if seg.Control.Tagged() { // a Write-Record: ParseUDFrame allows no other tagged segment
		dst = seg.WriteRecord().DstQPN()
	} else if dst = seg.Untagged().DstQPN(); dst == MulticastQPN {
		s.deliverMulticast(seg, src)
		return
	}
	// A UD frame reaches only a UD QP (the engines' receiveUD).
	if q := s.lookupQP(dst); q == nil || !q.eng.receiveUD(s, seg, src) {
		st.RxUnknownQP.Add(1)
	}
}

// receive handles a checked untagged segment addressed to q.
func (q *QP) receive(seg udiwarp.Segment, src netip.AddrPort) {
	st := &q.dev.stats
	if !q.canReceive() {
		st.RxQPState.Add(1)
		return
	}
	switch op := seg.Opcode(); {
	case isSend(op):
		q.receiveSend(seg, src)
	case op == udiwarp.OpTerminate:
		st.RxRemoteErrors.Add(1)
		term := seg.Terminate()
		ev := AsyncEvent{Type: AsyncRemoteError, QP: q, Source: src, SourceQPN: seg.Untagged().SrcQPN(), Code: term.Code()}
		if h := term.DDPHeader(); len(h) == udiwarp.DDPUntaggedHeaderSize {
			ev.MSN = udiwarp.DDPUntagged(h).MSN()
		} else if len(h) == udiwarp.WriteRecordHeaderSize {
			ev.MSN = udiwarp.WriteRecordHeader(h).MSN()
		}
		q.dev.raise(ev)
	default:
		st.RxBadOpcode.Add(1) // not a UD operation
	}
}

// receiveSend takes a receive for a UD Send (slow path) and delivers it;
// a Send it cannot take is reported to the source (reportError).
func (q *QP) receiveSend(seg udiwarp.Segment, src netip.AddrPort) {
	st := &q.dev.stats
	var w recvWQE
	if r := q.takeRecv(&w, len(seg.Payload), src); r != recvTaken {
		if r == recvNone {
			st.RxNoRecv.Add(1)
		}
		q.reportError(seg, src, udiwarp.DDPUntaggedNoBuffer)
		return
	}
	switch q.deliverSend(&w, seg, src) {
	case Success:
		if q.srq == nil {
			if s := q.sock.Load(); s != nil {
				s.rx.noteSend(q, len(seg.Payload), 0)
			}
		}
	case LocalLengthError:
		q.reportError(seg, src, udiwarp.DDPUntaggedTooLong)
	}
}

// isSend reports whether op is a datagram Send (UD and RD carry no
// Send with Invalidate).
func isSend(op udiwarp.Opcode) bool { return op == udiwarp.OpSend || op == udiwarp.OpSendSE }

// deliverSend is the one home of "a Send arrived" on a datagram QP (UD's
// slow path, RD): w is the receive taken for it; the payload is scattered
// into w's SGL and w completed on the receive CQ (completeRecv). It
// returns the completion's status for the caller's report to the source.
func (q *QP) deliverSend(w *recvWQE, seg udiwarp.Segment, src netip.AddrPort) Status {
	wc := q.sendWC(w.id, seg.Opcode(), seg.Untagged(), src, len(seg.Payload))
	wc.Status = q.scatter(w, seg.Payload)
	q.completeRecv(&wc)
	return wc.Status
}

// sendWC is the completion of receive id by a Send with header h from
// src, n bytes of payload.
func (q *QP) sendWC(id uint64, op udiwarp.Opcode, h udiwarp.DDPUntagged, src netip.AddrPort, n int) WorkCompletion {
	return WorkCompletion{ID: id, Opcode: WCRecv, QPN: q.num, Solicited: op.Solicited(),
		Source: src, SourceQPN: h.SrcQPN(), MSN: h.MSN(), Len: uint32(n)}
}

// completeRecv counts a receive's completion by its status and pushes it
// on the receive CQ: the last step of every datagram Send, the landing
// fast path's included.
func (q *QP) completeRecv(wc *WorkCompletion) {
	st := &q.dev.stats
	switch wc.Status {
	case Success:
		st.RxDelivered.Add(1)
	case LocalLengthError:
		st.RxRecvTooSmall.Add(1)
	default:
		st.RxRecvProt.Add(1)
	}
	if q.srq != nil {
		wc.srqQP = q
	}
	q.recvCQ.push(wc)
}

// scatter copies payload into the receive's SGL, holding each MR shared
// while it writes.
func (q *QP) scatter(w *recvWQE, payload []byte) Status {
	return q.scatterAt(w, 0, payload)
}

// reportError tells the source of a dropped message, if the QP asks for it
// and mayAnswer allows it (the error message is 46 bytes: a Send of fewer
// than 24 bytes of payload is not answered). It never waits: if the socket
// cannot take the message now, it is dropped.
func (q *QP) reportError(seg udiwarp.Segment, src netip.AddrPort, code udiwarp.ErrorCode) {
	if !q.attr.ReportErrors {
		return
	}
	s := q.sock.Load()
	if !s.mayAnswer(src, errorMessageSize) {
		return
	}
	h := seg.Untagged()
	var b [errorMessageSize]byte
	out := udiwarp.AppendUntagged(b[:0], &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpTerminate), ULP: q.wireQPN(),
		QN: udiwarp.DatagramQN(h.SrcQPN(), udiwarp.QueueTerminate), MSN: q.errMSN.Add(1)})
	out, _ = udiwarp.AppendTerminate(out, &udiwarp.TerminateFields{Code: code, SegmentLengthValid: true,
		DDPSegmentLength: uint16(min(len(seg.Header)+len(seg.Payload), 0xFFFF)), DDPHeader: seg.Header[:udiwarp.DDPUntaggedHeaderSize]})
	if q.dev.cfg.NoCRC {
		out = udiwarp.AppendCRC(out, 0)
	} else {
		out = udiwarp.SealDatagram(out, 0)
	}
	s.sendNow(out, src)
}

// errorMessageSize is the datagram error message about an untagged
// segment: Terminate with the 18-byte DDP header echoed, and the CRC.
const errorMessageSize = udiwarp.DDPUntaggedHeaderSize + 6 + udiwarp.DDPUntaggedHeaderSize + udiwarp.CRCSize

// mayAnswer reports whether the datagram being delivered on s, from src,
// may draw a reply of size bytes that the stack builds on its own (a
// datagram error message, an RD Challenge) to an address that has proved
// nothing. It is the one home of the rule of docs/wire.md §6.2 and §11.2:
//
//   - no reply to a datagram addressed to a multicast or broadcast
//     address, or whose destination the kernel did not tell: a group
//     would multiply what an off-path sender sends by its size;
//   - no reply to a source that cannot be one (multicast, broadcast,
//     unspecified, port 0);
//   - the replies one datagram draws are together no larger than it.
//
// A reply allowed is charged to the datagram; one refused is counted in
// Stats.TxRepliesWithheld. It runs on the receive path only (it reads the
// datagram's control messages).
func (s *Socket) mayAnswer(src netip.AddrPort, size int) bool {
	a := src.Addr()
	ok := a.IsValid() && !a.IsUnspecified() && !a.IsMulticast() && src.Port() != 0 &&
		a != netip.AddrFrom4([4]byte{255, 255, 255, 255}) && size <= s.rx.left
	if ok {
		_, unicast, known := s.rxDst()
		ok = known && unicast
	}
	if !ok {
		s.dev.stats.TxRepliesWithheld.Add(1)
		return false
	}
	s.rx.left -= size
	return true
}

// sglSlice walks bytes [off, off+n) of an SGL one piece at a time: each
// piece is the part of one SGE those bytes cover. It is the one home of
// slicing an SGL (scatter of a Send, RD's gather, RC's payload).
type sglSlice struct {
	sge       []SGE
	off, left uint32
}

// next returns the next piece, or false when the range is done or the SGL
// ends before it.
func (c *sglSlice) next() (SGE, bool) {
	for len(c.sge) > 0 && c.left > 0 {
		g := c.sge[0]
		c.sge = c.sge[1:]
		if c.off >= g.Length {
			c.off -= g.Length
			continue
		}
		k := min(g.Length-c.off, c.left)
		part := SGE{LKey: g.LKey, Addr: g.Addr + uint64(c.off), Length: k}
		c.off, c.left = 0, c.left-k
		return part, true
	}
	return SGE{}, false
}

// sglLen is the room of an SGL.
func sglLen(sge []SGE) uint64 {
	n := uint64(0)
	for i := range sge {
		n += uint64(sge[i].Length)
	}
	return n
}
