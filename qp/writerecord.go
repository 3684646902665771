package qp

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
)

// Source side of RDMA Write-Record.

// wrKey numbers Write-Record messages per (source QP, destination, STag):
// by the destination's address and QP number, not by address handle, so
// two handles for one peer share the numbering (the target keys its
// state, and drops duplicates, by MSN).
type wrKey struct {
	addr netip.AddrPort
	qpn  uint32
	stag uint32
}

// MaxWriteRecordSegment returns the largest Write-Record payload one
// datagram of this socket carries: the UDP limit less the 34-byte header
// and the 4-byte CRC, 65 507 - 38 = 65 469 over IPv4 and 65 527 - 38 =
// 65 489 over IPv6.
func (s *Socket) MaxWriteRecordSegment() int {
	return s.maxDatagram - udiwarp.WriteRecordHeaderSize - udiwarp.CRCSize
}

// postWriteRecordLocked queues a Write-Record WR and, if nothing is queued
// ahead of it, sends as much of it as the socket takes now, in the
// caller's goroutine. It unlocks sqMu.
func (q *QP) postWriteRecordLocked(wr *SendWR, s *Socket) error {
	var length uint64
	for _, g := range wr.SGL {
		length += uint64(g.Length)
	}
	length += uint64(len(wr.Inline))
	if length > 1<<32-1 {
		q.sqMu.Unlock()
		return fmt.Errorf("%w: a Write-Record message of %d bytes (at most 4 GiB - 1)", ErrInvalidWR, length)
	}
	if q.sq.full() {
		n := q.sq.len()
		q.sqMu.Unlock()
		return fmt.Errorf("%w: %d send WRs outstanding", ErrQueueFull, n)
	}
	if q.wrMSN == nil {
		q.wrMSN = map[wrKey]uint32{}
	}
	k := wrKey{wr.AH.addr, wr.AH.qpn, wr.RemoteSTag}
	q.wrMSN[k]++
	w := q.sq.push()
	w.id, w.op, w.flags, w.ah = wr.ID, wr.Opcode, wr.Flags, wr.AH
	w.nsge = copy(w.sge[:], wr.SGL)
	w.isInline = wr.Inline != nil
	w.inlineLen = copy(q.inlineBuf(w, len(wr.Inline)), wr.Inline)
	w.msn = q.wrMSN[k]
	w.rstag, w.rto, w.length, w.off = wr.RemoteSTag, wr.RemoteTO, uint32(length), 0
	if q.inMover {
		q.sqMu.Unlock()
		q.dev.stats.TxQueued.Add(1)
		return nil
	}
	more, _ := q.drainLocked(s, q.sq.len())
	if more {
		q.inMover = true
		q.sqMu.Unlock()
		q.dev.stats.TxQueued.Add(1)
		s.activate(q)
		return nil
	}
	q.sqMu.Unlock()
	q.dev.stats.TxDirect.Add(1)
	return nil
}

// sendWriteRecord sends w's remaining segments. errSocketFull means it
// paused with w.off marking where to resume.
func (q *QP) sendWriteRecord(s *Socket, w *sendWQE) (Status, error) {
	seg := uint32(q.segmentSize(s))
	for {
		if k := q.gsoSegments(s, w, seg); k >= 2 {
			st, err := q.tx.sendGSO(s, w, seg, k)
			switch {
			case st != Success:
				return st, nil
			case err == nil:
				if w.off >= w.length {
					return Success, nil
				}
				continue
			case err != errGSOUnsupported:
				return Success, err
			}
			// The kernel has no UDP GSO, or not for segments over the
			// route's MTU: one datagram per call (gsoSegments says when).
		}
		n := min(seg, w.length-w.off)
		st := q.tx.buildWR(s, w, n)
		if st != Success {
			return st, nil
		}
		err := q.tx.transmit(s)
		q.tx.release()
		if err != nil {
			return Success, err
		}
		w.off += n
		if w.off >= w.length {
			return Success, nil
		}
	}
}

func (q *QP) segmentSize(s *Socket) int {
	if n := q.attr.WriteRecordSegment; n > 0 && n <= s.MaxWriteRecordSegment() {
		return n
	}
	return s.MaxWriteRecordSegment()
}

// buildWR prepares the Write-Record segment of w that carries n bytes from
// offset w.off: header, the pieces of the SGL (or inline data) that hold
// those bytes, CRC.
func (t *txCtx) buildWR(s *Socket, w *sendWQE, n uint32) Status {
	off := w.off
	hdr := udiwarp.WriteRecordHeader(t.hdr[:])
	hdr.Encode(&udiwarp.WriteRecordFields{Last: off+n == w.length, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
		STag: w.rstag, TO: w.rto + uint64(off), MSN: w.msn, MO: off, MessageLength: w.length, DstQPN: w.ah.qpn, SrcQPN: t.q.wireQPN()})
	t.begin(hdr)
	lo, hi := uint64(off), uint64(off)+uint64(n)
	if w.isInline {
		t.add(w.inline[lo:hi])
	} else {
		pos := uint64(0)
		for i := 0; i < w.nsge && pos < hi; i++ {
			g := &w.sge[i]
			end := pos + uint64(g.Length)
			if end > lo {
				b, st := t.pin(g)
				if st != Success {
					return st
				}
				t.add(b[max(lo, pos)-pos : min(hi, end)-pos])
			}
			pos = end
		}
	}
	t.finish(s, w.ah, int(n))
	return Success
}

// Target side of RDMA Write-Record.

// RecordMode says how a QP records the Write-Record messages it
// receives: a set of bits, so RecordCQ|RecordMap is RecordBoth. The zero
// value is RecordCQ.
//
// A QP that records into the validity map alone (RecordMap) completes
// nothing and raises no event when a message arrives: its target learns
// of a record by reading the map (validitymap.Map.Valid for the bytes it
// awaits, Ranges, Bytes), as a receiver of one-sided writes watches its
// memory. RecordBoth adds the CQ entry, which CQ.Wait and the completion
// channel report.
type RecordMode uint8

const (
	RecordCQ   RecordMode = 1 << 0               // a completion entry on the receive CQ (the default)
	RecordMap  RecordMode = 1 << 1               // the target region's validity map (MR.TrackValidity)
	RecordBoth RecordMode = RecordCQ | RecordMap // both
)

func (m RecordMode) cq() bool   { return m == 0 || m&RecordCQ != 0 }
func (m RecordMode) map_() bool { return m&RecordMap != 0 }

// receiveWriteRecord checks, places and records one Write-Record segment
// addressed to q. Every check comes before a byte is written — the QP's
// state, then remote access to the whole message's range through the one
// check, Device.remoteRegion (STag and key, PD, remote-write access not
// revoked, bounds) — and the record comes after. It reports whether the
// segment was placed and, if the target region refused it, why (faultNone
// when it was placed or dropped for another reason: a stale or duplicate
// segment of a message the engine is done with, or the QP's state); an RD
// QP reports both to the source in its acks.
func (q *QP) receiveWriteRecord(s *Socket, seg udiwarp.Segment, src netip.AddrPort) (tagFault, bool) {
	d := q.dev
	st := &d.stats
	if !q.canReceive() {
		st.RxQPState.Add(1)
		return faultNone, false
	}
	h := seg.WriteRecord()
	stag := h.Tagged().STag()
	mto, ml := h.MessageTO(), uint64(h.MessageLength())
	m, f := d.remoteRegion(q.pd, stag, mto, ml, AccessRemoteWrite) // the whole message must fit the region
	if f != faultNone {
		return f, false
	}
	defer m.unpin()
	ws := writerecord.Segment{Source: writerecord.Source{Addr: src, QPN: h.SrcQPN()}, STag: stag, MSN: h.MSN(),
		MessageTO: mto, Length: h.MessageLength(), Offset: h.MO(), N: uint32(len(seg.Payload)), Limits: m.wrLimits.Load()}
	var now time.Time // the engine needs it only to start a multi-segment message
	if ws.Offset != 0 || ws.N != ws.Length {
		now = time.Now()
	}
	q.wrMu.Lock()
	defer q.wrMu.Unlock()
	if q.wr == nil {
		cfg := q.attr.WriteRecord
		// Over RD every segment comes, in order, unless the peer's
		// session ends (which ends its messages, rdEndWriteRecords): no
		// deadline may end a message RD is still delivering.
		cfg.Reliable = q.attr.Type == RD
		q.wr = writerecord.New(cfg)
	}
	v := q.wr.Admit(&ws, now)
	if rec, ok := q.wr.Ended(); ok { // a message of this STag ended early, deliver-partial
		q.recordWriteRecord(m, &rec)
	}
	if v == writerecord.Drop {
		st.RxWRStale.Add(1)
		return faultNone, false
	}
	if v == writerecord.PlaceNew {
		if vm := m.vmap.Load(); vm != nil {
			vm.Invalidate(mto, ml) // its old contents are being overwritten
		}
		if ws.N != ws.Length {
			q.armTimer(q.wr.Deadline(&ws, now))
		}
	}
	copy(m.buf[h.Tagged().TO():], seg.Payload) // zero-based: TO is the offset
	st.RxWRPlaced.Add(1)
	if rec, ok := q.wr.Placed(&ws); ok {
		q.recordWriteRecord(m, &rec)
		if s != nil && s.rx.wrg.q == q {
			s.rx.wrg.q = nil
		}
		return faultNone, true
	}
	if s != nil { // nil: an RD frame, which does not land in place
		s.rx.guessWriteRecord(q, m, &ws)
	}
	return faultNone, true
}

// recordWriteRecord records a message whose bytes are all placed (or, for
// a partial record, whose valid ranges are). The caller holds wrMu.
func (q *QP) recordWriteRecord(m *MR, rec *writerecord.Record) {
	d := q.dev
	mode := q.attr.Record
	if mode.map_() && m != nil {
		if vm := m.vmap.Load(); vm != nil {
			if rec.Complete {
				vm.Insert(rec.MessageTO, uint64(rec.Length))
			}
			for _, r := range rec.Valid {
				vm.Insert(r.Start, r.Len())
			}
		}
	}
	if rec.Complete {
		d.stats.RxWRComplete.Add(1)
	} else {
		d.stats.RxWRPartial.Add(1)
	}
	if mode.cq() {
		q.recvCQ.push(&WorkCompletion{Status: Success, Opcode: WCWriteRecord, QPN: q.num, Len: rec.Length,
			Source: rec.Source.Addr, SourceQPN: rec.Source.QPN, MSN: rec.MSN, STag: rec.STag, TO: rec.MessageTO,
			Partial: !rec.Complete, Valid: rec.Valid})
	}
}

// wrExpire applies the deadline of q's Write-Record messages in progress
// at now, as the device timer runs it, and returns the next deadline
// (zero: none in progress).
func (q *QP) wrExpire(now time.Time) time.Time {
	q.wrMu.Lock()
	defer q.wrMu.Unlock()
	if q.wr == nil || q.wr.InProgress() == 0 {
		return time.Time{}
	}
	return q.wr.Expire(now, func(rec writerecord.Record) {
		if m := q.dev.mrs.lookup(rec.STag); m != nil {
			q.recordWriteRecord(m, &rec)
		} // else the region was deregistered: nothing of it is valid
	})
}

// EndWriteRecord ends now, as its deadline would, the Write-Record
// message in progress at q from the source (src, srcQPN) to the region
// stag, if there is one, and reports whether that recorded it: with
// deliver-partial and bytes of it placed, its completion (or validity map
// entry) is made now, with the ranges that arrived; with discard nothing
// is. Its late segments are dropped. It is for a target that knows the
// source has sent all of the message it will — a writer that stopped to
// wait for the target (for credits, say) — so that the message is not
// held until its deadline, or given up for lost while the QP still holds
// it.
func (q *QP) EndWriteRecord(src netip.AddrPort, srcQPN, stag uint32) bool {
	q.wrMu.Lock()
	defer q.wrMu.Unlock()
	if q.wr == nil {
		return false
	}
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	rec, ok := q.wr.End(writerecord.Source{Addr: src, QPN: srcQPN}, stag, time.Now())
	if !ok {
		return false
	}
	m := q.dev.mrs.lookup(stag)
	if m == nil {
		return false // the region was deregistered: nothing of it is valid
	}
	q.recordWriteRecord(m, &rec)
	return true
}

// AggregateWriteRecords folds the Write-Record completions for stag among
// wcs into m, in region offsets relative to base (the region's Addr()):
// seed 003's third recording design, CQ entries seen as a validity map.
// It returns how many completions it used.
func AggregateWriteRecords(wcs []WorkCompletion, stag uint32, base uint64, m *validitymap.Map) (int, error) {
	used := 0
	for i := range wcs {
		wc := &wcs[i]
		if wc.Opcode != WCWriteRecord || wc.STag != stag || wc.Status != Success || wc.TO < base {
			continue
		}
		used++
		if !wc.Partial {
			if err := m.Insert(wc.TO-base, uint64(wc.Len)); err != nil {
				return used, err
			}
			continue
		}
		for _, r := range wc.Valid {
			if err := m.Insert(r.Start-base, r.Len()); err != nil {
				return used, err
			}
		}
	}
	return used, nil
}
