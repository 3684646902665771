package qp

import (
	"encoding/binary"
	"unsafe"

	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// Direct placement of an RC stream's long FPDUs (issue 32). An FPDU is
// read from the socket into rx and its payload then copied to where it
// belongs: a second pass over every byte, which raw TCP does not make.
// When the header of an FPDU whose payload is still mostly to come is
// in rx, the rest is read from the socket straight into its destination
// (siw places from the socket buffer the same way), the CRC computed as
// it comes, and a little of what follows into rx. Once payload and CRC
// are in, the FPDU goes through the same handler as any other, with its
// payload where it already is (the handler's copy sees source and
// destination are one, copyPayload), so every check keeps its one home:
// the eligibility tests here only decide that the destination is known
// before the data, and the destination's region is pinned only for each
// read, never across a wait, so Deregister never waits on a peer.
//
// What a peer can do with it: place bytes into a region its STag lets it
// write (as a Write does), or into the receive a Send in progress holds,
// before the CRC is checked; a bad CRC then ends the stream with a
// Terminate as before, the receive completes in error, and nothing
// reports Success for those bytes. Only streams without markers.

// directMin is the shortest rest of an FPDU read into place: below it
// the extra system call costs more than the copy it saves.
const directMin = 16 << 10

// directLook is how much of what follows an FPDU read into place goes
// into rx with it: the next FPDU's header, and for a short FPDU all of
// it. A connection whose last FPDU was long reads no more than this
// after waking, so a long FPDU is placed directly from its first byte on.
const directLook = 64

// rcDirect is the FPDU being read into place.
type rcDirect struct {
	on    bool
	large bool // the last FPDU handled was long: read a header first
	head  [udiwarp.MPAHeaderSize + udiwarp.DDPUntaggedHeaderSize]byte
	hlen  int // MPA length field and DDP header, in head
	seg   udiwarp.Segment
	// The destination: a tagged region (stag, to) or the receive in
	// progress at off; n payload bytes, got read so far.
	tagged  bool
	stag    uint32
	to      uint64
	off     uint32
	n, got  int
	crc     uint32
	trail   [3 + udiwarp.CRCSize]byte // pad and CRC
	tlen    int
	tgot    int
	dst     []byte // where the payload goes, from its first check
	discard bool   // the destination went away: the rest into scratch
	total   int    // the FPDU's bytes on the stream
	iov     [3]unix.Iovec
	msg     unix.Msghdr
	scratch []byte
}

// directStart begins reading the FPDU at rx[at:] into place when it
// qualifies; false leaves it to the ordinary path.
func (c *rcConn) directStart(at int) bool {
	d := &c.dp
	if c.deframer.Markers || len(c.rx)-at < udiwarp.MPAHeaderSize+2 {
		return false
	}
	b := c.rx[at:]
	l := int(binary.BigEndian.Uint16(b))
	hlen := udiwarp.DDPUntaggedHeaderSize
	if udiwarp.DDPControl(b[udiwarp.MPAHeaderSize]).Tagged() {
		hlen = udiwarp.DDPTaggedHeaderSize
	}
	total := udiwarp.FPDUSize(l)
	n := l - hlen
	if n <= 0 || l > udiwarp.MaxULPDU || len(b) < udiwarp.MPAHeaderSize+hlen || total-len(b) < directMin {
		return false
	}
	seg, err := udiwarp.ParseSegmentHead(b[udiwarp.MPAHeaderSize:udiwarp.MPAHeaderSize+hlen], n, udiwarp.ProfileStream)
	if err != nil {
		return false // the ordinary path reports it, the FPDU whole
	}
	*d = rcDirect{large: true, hlen: udiwarp.MPAHeaderSize + hlen, n: n, total: total, tlen: udiwarp.MPAPad(l) + udiwarp.CRCSize,
		iov: d.iov, msg: d.msg, scratch: d.scratch}
	switch op := seg.Opcode(); {
	case op == udiwarp.OpWrite, op == udiwarp.OpReadResponse:
		t := seg.Tagged()
		d.tagged, d.stag, d.to = true, t.STag(), t.TO()
	case op == udiwarp.OpSend, op == udiwarp.OpSendSE, op == udiwarp.OpSendInvalidate, op == udiwarp.OpSendSEInvalidate:
		// A Send's later FPDUs, into the receive its first one took.
		h := seg.Untagged()
		r := &c.cur
		if !r.have || r.bad != Success || h.MSN() != c.rxSendMSN || h.MO() != r.got {
			return false
		}
		d.off = r.got
	default:
		return false
	}
	dst, mr, ok := c.directDst(0, d.n)
	if !ok {
		return false // the ordinary path: its handler says what is wrong
	}
	mr.unpin()
	d.dst = dst
	copy(d.head[:], b[:d.hlen])
	d.seg = seg
	d.seg.Header = d.head[udiwarp.MPAHeaderSize:d.hlen]
	d.crc = udiwarp.CRC32c(d.head[:d.hlen])
	d.on = true
	// What of it is in rx already.
	rest := b[d.hlen:]
	if k := min(len(rest), d.n); k > 0 {
		c.directPut(rest[:k])
	}
	rest = rest[min(len(rest), d.n):]
	d.tgot = copy(d.trail[:d.tlen], rest)
	c.rx, c.rxAt = c.rx[:0], 0
	c.q.dev.stats.RCDirectFPDUs.Add(1)
	return true
}

// directDst returns the destination of payload bytes [from, from+k) and
// its region, pinned; false when the region is gone or never was.
func (c *rcConn) directDst(from, k int) ([]byte, *MR, bool) {
	d := &c.dp
	if d.tagged {
		m, f := c.q.dev.remoteRegion(c.q.pd, d.stag, d.to+uint64(from), uint64(k), AccessRemoteWrite)
		if f != faultNone {
			return nil, nil, false
		}
		return m.buf[d.to+uint64(from):][:k], m, true
	}
	r := &c.cur
	pd := c.q.pd
	if c.q.srq != nil {
		pd = c.q.srq.pd
	}
	if uint64(d.off)+uint64(d.n) > sglLen(r.w.sge[:r.w.nsge]) {
		return nil, nil, false
	}
	sl := sglSlice{sge: r.w.sge[:r.w.nsge], off: d.off + uint32(from), left: uint32(k)}
	part, ok := sl.next()
	if !ok || int(part.Length) != k { // one contiguous piece, or the ordinary path
		return nil, nil, false
	}
	m, b, st := c.q.dev.resolve(pd, &part, AccessLocalWrite)
	if st != Success {
		return nil, nil, false
	}
	return b, m, true
}

// directPut places p, the next payload bytes, from rx.
func (c *rcConn) directPut(p []byte) {
	d := &c.dp
	into, mr := c.directInto(len(p))
	copy(into, p)
	d.crc = udiwarp.UpdateCRC32c(d.crc, into)
	if mr != nil {
		mr.unpin()
	}
	d.got += len(p)
}

// directInto returns where the next k payload bytes go, with its region
// pinned (nil: the scratch buffer). A destination gone under the FPDU
// (deregistered, invalidated) sends the rest to scratch, with what was
// placed before it: the handler then finds the region gone and answers
// as it would have had the FPDU come whole.
func (c *rcConn) directInto(k int) ([]byte, *MR) {
	d := &c.dp
	if !d.discard {
		if dst, mr, ok := c.directDst(d.got, k); ok {
			return dst, mr
		}
		d.discard = true
		if cap(d.scratch) < d.n {
			d.scratch = make([]byte, d.n)
		}
		d.scratch = d.scratch[:d.n]
		copy(d.scratch, d.dst[:d.got])
	}
	return d.scratch[d.got:][:k], nil
}

// directRead reads the rest of the FPDU into place and, once it is in,
// handles it. It returns false when the connection failed or ended, and
// drained when the socket had nothing more.
func (c *rcConn) directRead() (ok, drained bool) {
	d := &c.dp
	for d.on {
		var dst []byte
		var mr *MR
		niov := 0
		if d.got < d.n {
			dst, mr = c.directInto(d.n - d.got)
			d.iov[0].Base, niov = &dst[0], 1
			d.iov[0].SetLen(len(dst))
		}
		if d.tgot < d.tlen {
			d.iov[niov].Base = &d.trail[d.tgot]
			d.iov[niov].SetLen(d.tlen - d.tgot)
			niov++
		}
		if cap(c.rx) < directLook {
			c.rx = make([]byte, 0, directLook)
		}
		look := c.rx[:directLook]
		d.iov[niov].Base = &look[0]
		d.iov[niov].SetLen(len(look))
		niov++
		d.msg.Iov = &d.iov[0]
		d.msg.SetIovlen(niov)
		if !c.acquire() {
			if mr != nil {
				mr.unpin()
			}
			return false, false
		}
		r, _, errno := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&d.msg)), unix.MSG_DONTWAIT)
		c.release()
		k := int(r)
		if errno != 0 || k == 0 {
			if mr != nil {
				mr.unpin()
			}
			switch {
			case errno == unix.EAGAIN:
				return true, true
			case errno == 0 && c.manual:
				c.eof.Store(true) // the peer's FIN inside an FPDU: the stream is cut
				return false, false
			}
			c.lost()
			return false, false
		}
		c.q.dev.stats.RxBytes.Add(uint64(k))
		if p := min(k, len(dst)); p > 0 {
			d.crc = udiwarp.UpdateCRC32c(d.crc, dst[:p])
			d.got += p
			k -= p
		}
		if mr != nil {
			mr.unpin()
		}
		t := min(k, d.tlen-d.tgot)
		d.tgot += t
		k -= t
		c.rx = c.rx[:k] // what followed, for process
		if d.got == d.n && d.tgot == d.tlen {
			if !c.directDone() {
				return false, false
			}
		}
	}
	return true, false
}

// directDone checks the CRC of the FPDU read into place and handles it.
func (c *rcConn) directDone() bool {
	d := &c.dp
	d.on = false
	c.deframer.Skip(d.total)
	pad := d.tlen - udiwarp.CRCSize
	if c.deframer.CRC {
		crc := udiwarp.UpdateCRC32c(d.crc, zeros[:pad])
		if err := udiwarp.CheckFPDUCRC(crc, d.trail[pad:d.tlen]); err != nil {
			code, _ := udiwarp.CodeOf(err)
			c.terminate(code, nil, nil, 0)
			return false
		}
	}
	seg := d.seg
	seg.Payload = d.dst // the handler checks and pins its region again
	if d.discard {
		seg.Payload = d.scratch
	}
	if !c.handleSegment(seg, d.hlen-udiwarp.MPAHeaderSize+d.n) {
		return false
	}
	c.q.dev.stats.RCFPDUsReceived.Add(1)
	return true
}

// copyPayload copies src into dst unless they are the same bytes: an
// FPDU read into place (rcDirect) is handed to its handler with its
// payload where the handler would copy it.
func copyPayload(dst, src []byte) int {
	if len(src) > 0 && len(dst) > 0 && &dst[0] == &src[0] {
		return min(len(dst), len(src))
	}
	return copy(dst, src)
}
