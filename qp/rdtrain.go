package qp

import (
	"errors"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// RD segment trains: the segments of one message that go to a peer back
// to back leave in one sendmsg(2) as a UDP GSO train (UDP_SEGMENT), each
// a whole RD Data frame (its own header, sequence number and CRC32c), as
// Write-Record's segments do (gso_linux.go). The kernel cuts the train
// into datagrams; a receiver with UDP_GRO reads it back in one call, and
// answers the whole batch with one ack (rdQP.flushAcks). One system
// call per segment was what held RD at a tenth of Write-Record's goodput
// in 1,400-byte segments (issue 31).
//
// The engine numbers a train's segments (reliability.Trainer) and builds
// their RD headers; a train's frames have one size (the last may be
// shorter), so none carries an ack block: when an ack is owed, the next
// segment goes alone with it, the rest in the train. Retransmissions go
// one at a time: they are few, and each needs its own decision.

// rdTrainHeader is the largest header of a train's frame: the RD header
// of a Data frame with INIT and no ack, then a Write-Record's DDP header
// (the largest a body segment has).
const rdTrainHeader = reliability.HeaderSize + reliability.SeqSize + reliability.TokenSize + udiwarp.WriteRecordHeaderSize

// rdTrainCtx holds what one train needs; a QP makes it on its first train.
type rdTrainCtx struct {
	hdr    [maxGSOSegments][rdTrainHeader]byte
	hlen   [maxGSOSegments]int
	crc    [maxGSOSegments][udiwarp.CRCSize]byte
	bufs   [maxGSOSegments * (maxSGE + 2)][]byte
	pieces [maxSGE][]byte
}

// SendTrain sends the frames of a train the engine numbered, segments
// of one message back to back, in one sendmsg(2): each frame is its RD
// header (fs[i].Header), the DDP header and payload of its segment, and
// its CRC. All go, or none: errSocketFull (the datamover takes over), or
// a socket that refuses the train (Socket.gsoRefused: the segments go
// one at a time).
func (r *rdQP) SendTrain(fs []reliability.Frame[*rdWR, rdPeer]) error {
	q := r.q
	s := r.s
	if r.trains == nil {
		r.trains = new(rdTrainCtx)
	}
	g := r.trains
	k := len(fs)
	p := peerOf(fs[0].Peer)
	w := fs[0].Msg
	first := fs[0].Index
	var size int
	off, _, _, _ := w.part(first)
	end := off
	for i := range fs {
		o, n, last, _ := w.part(first + uint32(i))
		hdr := r.ddpHeader(append(g.hdr[i][:0], fs[i].Header...), p, w, o, last, false)
		if i == 0 {
			size = len(hdr) + int(w.seg) + udiwarp.CRCSize
		}
		g.hlen[i] = len(hdr)
		end = o + n
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
			b, st := w.pin(t, &part)
			if st != Success {
				// The source went (a Read Response whose region was
				// invalidated): the segments go one at a time, and those
				// go empty (Send).
				clear(g.pieces[:np])
				return errNoTrain
			}
			g.pieces[np] = b
			np++
		}
	}
	sum := !q.dev.cfg.NoCRC
	niov := 0
	pi, po := 0, 0 // the piece and the offset in it the next byte comes from
	for i := range k {
		_, n, _, _ := w.part(first + uint32(i))
		hdr := g.hdr[i][:g.hlen[i]]
		var crc uint32
		if sum {
			crc = udiwarp.CRC32c(hdr)
		}
		g.bufs[niov] = hdr
		niov++
		for left := int(n); left > 0; {
			b := g.pieces[pi][po:]
			b = b[:min(len(b), left)]
			if sum {
				crc = udiwarp.UpdateCRC32c(crc, b)
			}
			g.bufs[niov] = b
			niov++
			left -= len(b)
			if po += len(b); po == len(g.pieces[pi]) {
				pi, po = pi+1, 0
			}
		}
		udiwarp.PutCRC(g.crc[i][:], crc)
		g.bufs[niov] = g.crc[i][:]
		niov++
	}
	err := t.transmitTrain(s, g.bufs[:niov], size, &p.ah)
	clear(g.bufs[:niov])
	t.release()
	clear(g.pieces[:np])
	switch {
	case err == nil:
		q.dev.stats.TxDatagrams.Add(uint64(k - 1)) // transmit counted one
		q.dev.stats.TxGSO.Add(1)
		for i := range fs {
			r.sent(p, w, fs[i].Index)
		}
		return nil
	case err == errSocketFull:
		r.full = true
		return reliability.ErrWouldBlock
	}
	s.gsoRefused(err, size) // a refusal: the segments go one at a time (Send)
	return err
}

// errNoTrain: a train's source could not be pinned whole.
var errNoTrain = errors.New("qp: train source not readable")
