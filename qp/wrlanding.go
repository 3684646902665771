package qp

import (
	"net/netip"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// Direct placement of Write-Record segments. A message's segments come
// back to back from one source, each a fixed size but the last, at
// consecutive tagged offsets. Once a segment of a message in progress has
// been placed, the socket predicts where the next ones go and hands the
// kernel iovecs [34-byte header | region bytes at the predicted TO |
// spare buffer]: a segment that is indeed the predicted one is placed
// where it landed and the copy from the socket's buffer is saved, as
// landing.go does for Sends into posted receives.
//
// What the kernel may write is the question. A predicted range lies
// inside the message's own range, which the first segment already
// invalidated (PlaceNew: its old contents are being overwritten), and
// beyond every byte of it placed so far (Engine.Next only predicts while
// the placed bytes are one run from the message's start). A datagram that
// lands there but is something else leaves bytes that no record names;
// the right segment, if it comes, overwrites them. Another message may
// have completed over part of that range meanwhile (messages to one
// region may overlap): the bytes such a stray datagram overwrote leave
// the validity map (strayLanded), which then never calls valid a byte
// that no Write-Record payload put there. The QP's wrMu is held
// from before the system call until every landed datagram is handled, so
// the message cannot be superseded, expire or be recorded meanwhile, and
// the region is pinned, so it cannot be deregistered. Every predicted
// place passes the one remote-access check (Device.checkRemote) before
// the system call, and again before a landed segment counts as placed:
// a region revoked or deregistered since the guess lands nothing, and
// one revoked during the call (MR.Invalidate waits for the pins) records
// nothing.

// wrGuess is the message the socket expects more segments of.
type wrGuess struct {
	q      *QP
	src    writerecord.Source
	m      *MR
	stag   uint32
	msn    uint32
	mto    uint64
	length uint32
	seg    uint32 // the size of its full segments
	next   uint32 // the message offset expected next
}

// guessWriteRecord notes, on the socket that received it, that ws was
// placed and its message is still in progress. The caller is s's receive
// path (under rxMu) and holds q.wrMu.
func (r *rxSide) guessWriteRecord(q *QP, m *MR, ws *writerecord.Segment) {
	g := &r.wrg
	if ws.Offset+ws.N >= ws.Length || ws.N < landBigMin {
		g.q = nil // the message's last segment, or segments too small to pay
		return
	}
	next, ok := q.wr.Next(ws.Source, ws.STag, ws.MSN)
	if !ok {
		g.q = nil
		return
	}
	*g = wrGuess{q: q, src: ws.Source, m: m, stag: ws.STag, msn: ws.MSN, mto: ws.MessageTO,
		length: ws.Length, seg: ws.N, next: next}
	r.landBig.Store(true)
}

// prepareWRLanding points the first slots of the batch at the predicted
// segments' places in the region and returns how many it prepared. On
// success it holds the QP's wrMu and a pin of the region per slot until
// endWRLanding.
func (r *rxSide) prepareWRLanding(vlen int) int {
	g := &r.wrg
	q := g.q
	if q.sock.Load() != r.s {
		g.q = nil
		return 0
	}
	q.wrMu.Lock()
	if q.wr == nil {
		q.wrMu.Unlock()
		g.q = nil
		return 0
	}
	if next, ok := q.wr.Next(g.src, g.stag, g.msn); !ok || next != g.next {
		q.wrMu.Unlock()
		g.q = nil
		return 0
	}
	off := g.next
	k := 0
	for ; k < min(vlen, maxLanding) && off < g.length; k++ {
		n := min(g.seg, g.length-off)
		// Each predicted place passes the one remote-access check, as the
		// segment would on the ordinary path: a region revoked,
		// deregistered or re-registered since the guess lands nothing.
		m, f := r.s.dev.checkRemote(q.pd, g.stag, g.mto+uint64(off), uint64(n), AccessRemoteWrite)
		if f != faultNone {
			break
		}
		if m != g.m {
			m.unpin()
			break
		}
		l := &r.land[k]
		l.q, l.nseg, l.hlen = q, 1, udiwarp.WriteRecordHeaderSize
		l.mrs[0] = m
		l.segs[0] = m.buf[g.mto+uint64(off) : g.mto+uint64(off)+uint64(n)]
		l.room = int(n)
		l.wrTO = g.mto + uint64(off)
		l.tail = r.bufs[k]
		l.bufs[0], l.bufs[1], l.bufs[2] = l.hdr[:l.hlen], l.segs[0], l.tail
		r.msgs[k].Bufs = l.bufs[:3]
		off += n
	}
	if k == 0 {
		q.wrMu.Unlock()
		g.q = nil
		return 0
	}
	r.landWR = true
	return k
}

// endWRLanding runs after the system call: each datagram that landed is
// the predicted segment, checked like any other and then recorded in
// place, until the first that is not; that one and every later one are
// copied out for the ordinary path, which then sees them in arrival
// order. Only then are the QP and the region let go.
func (r *rxSide) endWRLanding(k int) {
	g := &r.wrg
	q := r.land[0].q
	n := max(r.n, 0)
	inPlace := true
	for i := 0; i < k; i++ {
		l := &r.land[i]
		m := &r.msgs[i]
		if i < n {
			merged := m.Segment > 0 && m.N > m.Segment
			if !inPlace || merged || !r.placeLandedLocked(l, m.N, m.Trunc, m.Addr) {
				inPlace = false
				l.flat = l.flatten(m.N)
				l.strayLanded(m.N)
			}
		}
		l.unlockMRs()
		l.reset(m, r.bufs[i:i+1])
		if i >= n {
			l.q = nil
		}
	}
	if !inPlace {
		g.q = nil // guess again from the ordinary path
	}
	r.landWR = false
	q.wrMu.Unlock()
}

// strayLanded handles a datagram of size bytes that the kernel wrote at
// a predicted place but that is not the predicted segment: the region
// bytes it overwrote hold something no record names, so the validity map
// (if the region keeps one) stops calling them valid. They were valid only
// if another message had completed over the predicted message's range
// since its first segment invalidated it; the predicted message's own
// segment would overwrite them too.
func (l *landing) strayLanded(size int) {
	n := min(max(size-l.hlen, 0), l.room)
	if vm := l.mrs[0].vmap.Load(); vm != nil && n > 0 {
		vm.Invalidate(l.wrTO, uint64(n))
	}
}

// placeLandedLocked finishes a datagram that landed at the predicted
// place if it is exactly the predicted segment: same source, QP, STag,
// message and offset, the predicted size, a good CRC. It reports false
// otherwise. The caller holds q.wrMu and a pin of the region.
func (r *rxSide) placeLandedLocked(l *landing, n int, truncated bool, src netip.AddrPort) bool {
	g := &r.wrg
	q := l.q
	payload := n - udiwarp.WriteRecordHeaderSize - udiwarp.CRCSize
	if truncated || payload != l.room || g.q != q || src != g.src.Addr {
		return false
	}
	if t, err := udiwarp.Classify(l.hdr[:l.hlen]); err != nil || t != udiwarp.FrameUD {
		return false
	}
	seg, err := udiwarp.ParseSegment(l.hdr[:l.hlen], udiwarp.ProfileDatagram)
	if err != nil || !seg.Control.Tagged() || !seg.Control.WriteRecord() {
		return false
	}
	h := seg.WriteRecord()
	t := h.Tagged()
	if h.DstQPN() != q.wireQPN() || h.SrcQPN() != g.src.QPN || t.STag() != g.stag || h.MSN() != g.msn ||
		h.MO() != g.next || h.MessageLength() != g.length || t.TO() != g.mto+uint64(g.next) ||
		seg.Control.Last() != (g.next+uint32(payload) == g.length) {
		return false
	}
	if !r.s.dev.cfg.NoCRC && !l.crcOK(payload) {
		return false // the ordinary path counts it
	}
	if !q.canReceive() {
		return false
	}
	// Revoked while the datagram landed (Invalidate waited for this
	// landing's pins before returning): not placed; the ordinary path
	// refuses and counts it.
	m, f := r.s.dev.checkRemote(q.pd, g.stag, g.mto+uint64(g.next), uint64(payload), AccessRemoteWrite)
	if f != faultNone {
		return false
	}
	m.unpin()
	ws := writerecord.Segment{Source: g.src, STag: g.stag, MSN: g.msn, MessageTO: g.mto, Length: g.length,
		Offset: g.next, N: uint32(payload)}
	if q.wr.Admit(&ws, time.Time{}) != writerecord.Place {
		return false // cannot happen under wrMu; the ordinary path decides
	}
	st := &r.s.dev.stats
	st.RxDatagrams.Add(1)
	st.RxBytes.Add(uint64(n))
	st.RxWRPlaced.Add(1)
	st.RxLanded.Add(1)
	g.next += uint32(payload)
	if rec, ok := q.wr.Placed(&ws); ok {
		q.recordWriteRecord(g.m, &rec)
		g.q = nil
	}
	l.done = true
	return true
}
