package qp

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// RD segment trains: the segments of one message that go to a peer back
// to back leave in one sendmsg(2) as a UDP GSO train (UDP_SEGMENT), each
// a whole RD Data frame (its own header, sequence number and CRC32c), as
// Write-Record's segments do (gso_linux.go). The kernel cuts the train
// into datagrams; a receiver with UDP_GRO reads it back in one call, and
// answers the whole batch with one ack (rdQP.ackAfterBatch). One system
// call per segment was what held RD at a tenth of Write-Record's goodput
// in 1,400-byte segments (issue 31).
//
// A train's frames have one size (the last may be shorter), so none
// carries an ack block: when an ack is owed, the first segment goes alone
// with it (rdQP.data), the rest in the train. Retransmissions go one at a
// time: they are few, and each needs its own decision.

// rdTrainHeader is the largest header of a train's frame: the RD header
// of a Data frame with INIT and no ack, then a Write-Record's DDP header
// (the largest a body segment has).
const rdTrainHeader = reliability.HeaderSize + reliability.SeqSize + reliability.TokenSize + udiwarp.WriteRecordHeaderSize

// rdTrainCtx holds what one train needs; a QP makes it on its first train.
type rdTrainCtx struct {
	hdr    [maxGSOSegments][rdTrainHeader]byte
	crc    [maxGSOSegments][udiwarp.CRCSize]byte
	iov    [maxGSOSegments * (maxSGE + 2)]unix.Iovec
	seqs   [maxGSOSegments]uint32
	pieces [maxSGE][]byte
	ctl    [gsoCtlSize]byte
}

// trainable reports whether w's next segments may go as a train: body
// segments (not a request, a response to one, or an Immediate Data
// message) of a message with at least two of them left, from registered
// memory or inline data, to a socket that takes GSO trains of their
// size.
func (r *rdQP) trainable(s *Socket, w *rdWR, body uint32) bool {
	switch w.op {
	case OpWrite, OpWriteImm, OpWriteRecord, opReadResponse, OpSend, OpSendImm:
	default:
		return false
	}
	return !w.cut && body-w.sent >= 2 && s.gsoFits(rdTrainHeader+int(w.seg)+udiwarp.CRCSize)
}

// train sends up to a train of w's body segments to p, as many as the
// peer's window and congestion control admit now. It reports how many
// went (0: none; the caller sends one the ordinary way), and whether the
// socket was full (then none went, and the QP waits for the datamover).
func (r *rdQP) train(s *Socket, p *rdPeer, w *rdWR, body uint32, now time.Time) (k int, full bool) {
	q := r.q
	if r.trains == nil {
		r.trains = new(rdTrainCtx)
	}
	g := r.trains
	// Number the segments the sender admits.
	var hlen int
	{
		f := r.dataFields(p, 0, false)
		pk := rdPkt{w: w}
		hlen = len(r.frameHeader(g.hdr[0][:0], p, &f, &pk))
	}
	size := hlen + int(w.seg) + udiwarp.CRCSize
	max := min(int(body-w.sent), maxGSOSegments, s.maxDatagram/size)
	if max < 2 {
		return 0, false
	}
	first := w.sent
	off := first * w.seg
	end := off
	for k < max && p.snd.CanSend(now) && (k == 0 || r.paced(p, now)) {
		o := (first + uint32(k)) * w.seg
		n := min(w.seg, w.length-o)
		pk := rdPkt{w: w, off: o, n: n, last: first+uint32(k)+1 == body}
		g.seqs[k] = p.snd.Push(pk, hlen+int(n)+udiwarp.CRCSize, now)
		end = o + n
		k++
	}
	if k < 2 {
		for i := k - 1; i >= 0; i-- {
			p.snd.Unpush(g.seqs[i])
		}
		return 0, false
	}
	// The message's bytes [off, end), each piece pinned for the call.
	t := &r.tx
	np := 0
	if w.inline != nil {
		g.pieces[0] = w.inline[off:end]
		np = 1
	} else {
		c := sglSlice{sge: w.sge[:w.nsge], off: off, left: end - off}
		for part, ok := c.next(); ok; part, ok = c.next() {
			var b []byte
			var st Status
			if w.internal {
				b, st = t.pinRemote(&part) // a Read Response: the peer's access, checked as it is sent
			} else {
				b, st = t.pin(&part)
			}
			if st != Success {
				// The source went (a Read Response whose region was
				// invalidated): the segments go one at a time, and those
				// go empty (rdQP.data).
				for i := k - 1; i >= 0; i-- {
					p.snd.Unpush(g.seqs[i])
				}
				return 0, false
			}
			g.pieces[np] = b
			np++
		}
	}
	sum := !q.dev.cfg.NoCRC
	niov := 0
	pi, po := 0, 0 // the piece and the offset in it the next byte comes from
	ackNow := w.flags&FlagSignaled != 0 && len(p.queue) == 1 && first+uint32(k) == w.nseg
	for i := range k {
		o := (first + uint32(i)) * w.seg
		n := min(w.seg, w.length-o)
		pk := rdPkt{w: w, off: o, n: n, last: first+uint32(i)+1 == body}
		f := r.dataFields(p, g.seqs[i], ackNow && i == k-1)
		hdr := r.frameHeader(g.hdr[i][:0], p, &f, &pk)
		var crc uint32
		if sum {
			crc = udiwarp.CRC32c(hdr)
		}
		g.iov[niov].Base = &g.hdr[i][0]
		g.iov[niov].SetLen(len(hdr))
		niov++
		for left := int(n); left > 0; {
			b := g.pieces[pi][po:]
			b = b[:min(len(b), left)]
			if sum {
				crc = udiwarp.UpdateCRC32c(crc, b)
			}
			g.iov[niov].Base = &b[0]
			g.iov[niov].SetLen(len(b))
			niov++
			left -= len(b)
			if po += len(b); po == len(g.pieces[pi]) {
				pi, po = pi+1, 0
			}
		}
		udiwarp.PutCRC(g.crc[i][:], crc)
		g.iov[niov].Base = &g.crc[i][0]
		g.iov[niov].SetLen(udiwarp.CRCSize)
		niov++
	}
	ctl := putUDPSegment(g.ctl[:], uint16(size))
	t.msg.Iov = &g.iov[0]
	t.msg.SetIovlen(niov)
	t.msg.Control = &g.ctl[0]
	t.msg.SetControllen(ctl)
	t.setDest(s, &p.ah)
	err := t.transmit(s)
	t.msg.Iov, t.msg.Control = &t.iov[0], nil
	t.msg.SetControllen(0)
	t.release()
	clear(g.pieces[:np])
	if err == nil {
		q.dev.stats.TxDatagrams.Add(uint64(k - 1)) // transmit counted one
		q.dev.stats.TxGSO.Add(1)
		q.dev.stats.RDDataSent.Add(uint64(k))
		p.last = now
		w.sent += uint32(k)
		return k, false
	}
	for i := k - 1; i >= 0; i-- {
		p.snd.Unpush(g.seqs[i])
	}
	if err == errSocketFull {
		return 0, true
	}
	s.gsoRefused(err, size) // a refusal: the segments go one at a time (rdQP.data)
	return 0, false
}
