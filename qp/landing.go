package qp

import (
	"net/netip"
	"unsafe"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// Direct placement. A batch receive normally lands each datagram in a
// buffer of the socket's and then copies the payload into the posted
// receive: two copies of every byte (the kernel's and ours). When the
// socket can guess the QP the next datagrams are for (the one the last
// Send was for), it instead hands the kernel that QP's posted receive
// buffers: iovecs [18-byte header | the receive's SGEs | spare buffer].
// A datagram that is indeed a Send for that QP and fits is then complete
// where it landed; anything else is made contiguous again and takes the
// ordinary path. Posted receive buffers are the stack's until completed,
// so scribbling on one that was not used is allowed, as on any RNIC; the
// bytes just past a message (its 4-byte CRC) may be overwritten.

// maxLanding bounds the slots of a batch that land directly: enough to
// keep large datagrams zero-copy, few enough to keep preparing cheap.
const maxLanding = 16

// landBackoff is how many reads go without landing after a wrong guess.
const landBackoff = 64

// landHeaderMax is the largest header a landing slot reads apart from the
// payload: an RD header and the untagged DDP header after it.
const landHeaderMax = reliability.MaxHeaderSize + udiwarp.DDPUntaggedHeaderSize

// landBigMin is the message size from which landing a single-datagram
// read in place pays for preparing it.
const landBigMin = 2048

func (r *rxSide) noteSize(n int) {
	if big := n >= landBigMin; r.landBig.Load() != big {
		r.landBig.Store(big)
	}
}

// landing is one batch slot's direct placement.
type landing struct {
	q    *QP
	seq  uint64 // the receive it landed in
	id   uint64
	hdr  [landHeaderMax]byte
	hlen int                // the header's size: untagged (Send), Write-Record, or RD's and untagged
	n    int                // the datagram's bytes, once read
	bufs [maxSGE + 2][]byte // what the read fills: header slot, SGEs, spare
	segs [maxSGE][]byte
	mrs  [maxSGE]*MR
	nseg int
	room int
	wrTO uint64 // Write-Record landing: the region offset segs[0] starts at
	tail []byte // the spare buffer after the SGEs
	// After the system call: done (completed where it landed), kept (an
	// RD Send whose payload stays in its receive until the RD engine has
	// taken it in order: see rdLanded), or the datagram copied out to
	// flat for the ordinary path.
	done bool
	keep bool
	idx  int // the slot's index in its batch
	flat []byte
	own  []byte // flat's storage, kept across batches
}

// prepareLanding points the first slots of the batch at the predicted
// QP's posted receives and returns how many it prepared. It holds the
// QP's receive queue and the MRs until endLanding, so that no receive is
// flushed and no memory deregistered while the kernel may write.
func (r *rxSide) prepareLanding(vlen int) int {
	q := r.landQP.Load()
	if q == nil || q.srq != nil || q.sock.Load() != r.s {
		return 0
	}
	hlen := udiwarp.DDPUntaggedHeaderSize
	if q.typ == RD {
		// An RD Send lands behind the RD header of the last one placed
		// (its size depends on what the frame piggybacks).
		h := int(r.rdHdr.Load())
		if h == 0 {
			return 0
		}
		hlen += h
	}
	q.rqMu.Lock()
	k := 0
	for ; k < min(vlen, maxLanding) && k < q.rq.len(); k++ {
		w := q.rq.at(k)
		l := &r.land[k]
		if !l.bind(q, w, hlen, r.bufs[k]) {
			break
		}
		// Receives may share memory; two datagrams of one batch must not
		// land on the same bytes before the first is checked.
		if overlapsEarlier(r.land[:k], l) {
			l.unlockMRs()
			l.q = nil
			break
		}
		r.msgs[k].Bufs = l.bufs[:l.nseg+2]
	}
	if k == 0 {
		q.rqMu.Unlock()
	}
	return k
}

// endLanding runs after the system call, still holding the QP's receive
// queue and the MRs: each datagram that landed is completed where it is,
// if it is a valid Send for that QP, fits, and its receive is next in
// order; any other is copied out for the ordinary path. Only then are the
// receives and memory let go, so a flush or a deregistration can never
// meet a datagram half handled. An RD Send cannot complete here (the RD
// engine decides, in sequence order, under its own lock): one that
// passed its checks is kept, its payload where it landed and its MRs
// pinned, until dispatch has run it through the engine (rdLanded).
func (r *rxSide) endLanding(k int) {
	q := r.land[0].q
	n := max(r.n, 0)
	for i := 0; i < k; i++ {
		l := &r.land[i]
		m := &r.msgs[i]
		l.n = m.N
		if i < n {
			merged := m.Segment > 0 && m.N > m.Segment // several datagrams: never complete in place
			switch {
			case merged:
				l.flat = l.flatten(m.N)
			case q.typ == RD:
				l.keep = r.keepRDLanding(l, m.N, m.Trunc)
				if !l.keep {
					l.flat = l.flatten(m.N)
				}
			case !r.completeLandingLocked(l, m.N, m.Trunc, m.Addr):
				l.flat = l.flatten(m.N)
			}
		}
		if l.keep {
			r.kept++
			continue // dispatch lets it go
		}
		l.release(m, r.bufs[i:i+1])
		if i >= n {
			l.q = nil // nothing arrived in this slot
		}
	}
	q.rqMu.Unlock()
}

// release unpins the slot's MRs and points it back at its own buffer.
func (l *landing) release(m *llp.Msg, own [][]byte) {
	l.unlockMRs()
	l.reset(m, own)
	l.keep = false
}

// bind sets the slot's iovecs to w's SGEs, holding their MRs shared, after
// a header slot of hlen bytes.
func (l *landing) bind(q *QP, w *recvWQE, hlen int, spare []byte) bool {
	l.q, l.seq, l.id, l.nseg, l.room = q, w.seq, w.id, 0, 0
	l.hlen = hlen
	l.bufs[0] = l.hdr[:l.hlen]
	for i := 0; i < w.nsge; i++ {
		m, buf, st := q.dev.resolve(q.pd, &w.sge[i], AccessLocalWrite)
		if st != Success {
			l.unlockMRs()
			l.q = nil
			return false
		}
		l.mrs[l.nseg], l.segs[l.nseg] = m, buf
		l.bufs[1+l.nseg] = buf
		l.nseg++
		l.room += len(buf)
	}
	l.tail = spare
	l.bufs[1+l.nseg] = spare
	return true
}

func span(b []byte) (lo, hi uintptr) {
	if len(b) == 0 {
		return 0, 0
	}
	lo = uintptr(unsafe.Pointer(&b[0]))
	return lo, lo + uintptr(len(b))
}

func overlapsEarlier(prev []landing, l *landing) bool {
	for i := 0; i < l.nseg; i++ {
		lo, hi := span(l.segs[i])
		if lo == hi {
			continue
		}
		for j := range prev {
			for _, seg := range prev[j].segs[:prev[j].nseg] {
				plo, phi := span(seg)
				if lo < phi && plo < hi {
					return true
				}
			}
		}
	}
	return false
}

func (l *landing) unlockMRs() {
	for i := 0; i < l.nseg; i++ {
		if m := l.mrs[i]; m != nil {
			m.unpin()
			l.mrs[i] = nil
		}
	}
}

// reset points the slot back at its own buffer.
func (l *landing) reset(m *llp.Msg, own [][]byte) {
	clear(l.segs[:l.nseg])
	clear(l.bufs[:l.nseg+2])
	l.nseg = 0
	m.Bufs = own
}

// data calls f on the bytes after the header, in order, n in all.
func (l *landing) data(n int, f func([]byte)) {
	for i := 0; i < l.nseg && n > 0; i++ {
		k := min(n, len(l.segs[i]))
		f(l.segs[i][:k])
		n -= k
	}
	if n > 0 {
		f(l.tail[:min(n, len(l.tail))])
	}
}

// flatten copies the landed datagram of n bytes into the slot's own buffer.
func (l *landing) flatten(n int) []byte {
	if l.own == nil {
		l.own = make([]byte, 0, 1<<16+64)
	}
	n = min(n, cap(l.own))
	out := append(l.own[:0], l.hdr[:min(n, l.hlen)]...)
	l.data(n-len(out), func(b []byte) { out = append(out, b...) })
	return out
}

// completeLandingLocked finishes a datagram that landed in a posted
// receive, if it is a valid Send for that QP that fits and that receive is
// the next in order; it reports false otherwise. The caller holds the QP's
// receive queue, so the receive is taken and completed in one step.
func (r *rxSide) completeLandingLocked(l *landing, n int, truncated bool, src netip.AddrPort) bool {
	payload := n - udiwarp.DDPUntaggedHeaderSize - udiwarp.CRCSize
	if truncated || payload < 0 || payload > l.room {
		return false
	}
	seg, err := udiwarp.ParseSegment(l.hdr[:l.hlen], udiwarp.ProfileDatagram)
	if err != nil || seg.Control.Tagged() {
		return false
	}
	op := seg.Opcode()
	h := seg.Untagged()
	q := l.q
	if !isSend(op) || h.DstQPN() != q.wireQPN() {
		r.landOff = landBackoff // the guess was wrong: copy for a while
		return false
	}
	if !r.s.dev.cfg.NoCRC && !l.crcOK(payload) {
		return false // the ordinary path counts it
	}
	if !q.canReceive() {
		return false
	}
	if q.rq.len() == 0 || q.rq.front().seq != l.seq {
		return false // an earlier datagram took another path: copy, in order
	}
	q.rq.pop()
	r.arrived(n)
	r.s.dev.stats.RxLanded.Add(1)
	r.noteSize(payload)
	wc := q.sendWC(l.id, op, h, src, payload) // landed whole: Success
	q.completeRecv(&wc)
	l.done = true
	return true
}

// keepRDLanding reports whether the datagram that landed in slot l (an RD
// QP's) is a Data frame with the RD header size guessed, carrying an
// untagged Send for the slot's QP that fits the receive, with a good CRC:
// its payload may stay where it landed for the RD engine to take in
// order (rdQP.deliverLanded). Anything else takes the ordinary path; a
// datagram that is not for this QP at all turns landing off for a while.
// The full checks of the frame stay the engine's: this only finds the
// frames whose payload is where the engine will want it.
func (r *rxSide) keepRDLanding(l *landing, n int, truncated bool) bool {
	payload := n - l.hlen - udiwarp.CRCSize
	if truncated || payload < 0 || payload > l.room {
		return false
	}
	hdr := l.hdr[:l.hlen]
	h := &r.rdh
	if t, err := udiwarp.Classify(hdr); err != nil || t != udiwarp.FrameRD || h.Parse(hdr) != nil || h.DstQPN != l.q.wireQPN() {
		r.landOff = landBackoff // the guess was wrong: copy for a while
		return false
	}
	if h.Type != reliability.Data || h.Size+udiwarp.DDPUntaggedHeaderSize != l.hlen {
		return false // an ack, or a header of another size
	}
	if seg, err := udiwarp.ParseSegment(hdr[h.Size:], udiwarp.ProfileDatagram); err != nil || !rdIsSend(seg) {
		return false
	}
	return r.s.dev.cfg.NoCRC || l.crcOK(payload)
}

// rdLanded hands the RD engine the frame of slot l, kept by endLanding:
// its headers in l.hdr, its payload in the receive it landed in. The
// engine finds it in landRD while it runs (rdQP.onData).
func (r *rxSide) rdLanded(l *landing, src netip.AddrPort) {
	r.arrived(l.n)
	r.s.dev.stats.RxRDFrames.Add(1)
	r.landRD = l
	r.s.dev.deliverRDFrame(r.s, l.hdr[:l.hlen], src)
	r.landRD = nil
	if l.keep {
		r.letGo(l)
	}
}

// letGo unpins kept slot l's receive and points the slot back at its
// own buffer.
func (r *rxSide) letGo(l *landing) {
	l.release(&r.msgs[l.idx], r.bufs[l.idx:l.idx+1])
	r.kept--
}

// payload is the length of a kept RD Send's payload.
func (l *landing) payload() int { return l.n - l.hlen - udiwarp.CRCSize }

// unkeep copies kept slot l's datagram out of the receive it landed in,
// to l.flat, and lets the receive and its memory go.
func (r *rxSide) unkeep(l *landing) {
	l.flat = l.flatten(l.n)
	r.letGo(l)
}

// copyOut unkeeps l for the RD engine's ordinary path and returns its
// frame without the CRC (checked already), if the receive it landed in is
// still posted: receives leave their queue only from its front, so it is
// unless the front is past it (or the queue is empty). One that left — a
// flush, a RESET that gave the memory back to its owner, who may have
// written it since — holds nothing to trust: the frame is let go and
// copyOut reports false (the engine drops it as not received; the peer
// sends it again). The receive queue is held across the copy, so no
// flush can hand the memory back in the middle of it.
func (r *rxSide) copyOut(l *landing) ([]byte, bool) {
	q := l.q
	q.rqMu.Lock()
	posted := q.rq.len() > 0 && q.rq.front().seq <= l.seq
	if posted {
		r.unkeep(l)
	}
	q.rqMu.Unlock()
	if !posted {
		r.letGo(l)
		r.s.dev.stats.RxQPState.Add(1)
		return nil, false
	}
	return l.flat[:len(l.flat)-udiwarp.CRCSize], true
}

// evict is called by the RD engine before it fills receive seq of q with
// a message by the ordinary path: a datagram of this batch that landed in
// that receive and waits for its turn is copied out first, or the message
// would overwrite it. The engine has just taken that receive, so its
// memory is still the stack's.
func (r *rxSide) evict(q *QP, seq uint64) {
	if r.kept == 0 {
		return
	}
	for i := range r.land {
		if l := &r.land[i]; l.keep && l.q == q && l.seq == seq {
			r.unkeep(l)
			return
		}
	}
}

// noteSend notes on the socket that a Send (of payload bytes, behind an
// RD header of rdHdr bytes; 0 for UD) was placed in a receive of q's: the
// next reads land in q's receives.
func (r *rxSide) noteSend(q *QP, payload, rdHdr int) {
	if r.landQP.Load() != q {
		r.landQP.Store(q)
	}
	r.noteSize(payload)
	if rdHdr > 0 && r.rdHdr.Load() != int32(rdHdr) {
		r.rdHdr.Store(int32(rdHdr))
	}
}

// crcOK checks the trailer of a landed datagram with this payload length.
func (l *landing) crcOK(payload int) bool {
	crc := udiwarp.CRC32c(l.hdr[:l.hlen])
	rem := payload
	var wire [udiwarp.CRCSize]byte
	wn := 0
	l.data(payload+udiwarp.CRCSize, func(b []byte) {
		k := min(rem, len(b))
		crc = udiwarp.UpdateCRC32c(crc, b[:k])
		rem -= k
		wn += copy(wire[wn:], b[k:])
	})
	return udiwarp.WireCRC(wire[:]) == crc
}
