package reliability

import "time"

// Segment trains: the segments of one message that go to a peer back to
// back may leave in one system call (a UDP GSO train) when the Host can
// send them so (Trainer). The Endpoint numbers them as the windows and
// pacing admit, builds each frame's RD header, and hands the Host the
// lot; the Host appends each frame's DDP segment and CRC. A train's
// frames carry no ack block (they have one size), so when an ack is due
// the next frame goes alone with it; retransmissions go one at a time.

// MaxTrain is the most frames of one train (the kernel's UDP GSO limit).
const MaxTrain = 64

// trainHeader is the largest RD header of a train's frame: Data with
// INIT and no ack block.
const trainHeader = HeaderSize + SeqSize + TokenSize

type trainCtx[M, P any] struct {
	hb     [MaxTrain][trainHeader]byte
	frames [MaxTrain]Frame[M, P]
	seqs   [MaxTrain]uint32
}

// train sends up to a train of w's next segments to p, as many as the
// Host takes in one and p's windows and pacing admit now. It reports how
// many went (0: none; the caller sends the next the ordinary way) and
// whether the socket was full (then none went).
func (e *Endpoint[M, P]) train(p *peer[M, P], w *Message[M, P], now time.Time) (k int, blocked bool) {
	tr, ok := e.host.(Trainer[M, P])
	if !ok || w.awaits || w.nseg-w.sent < 2 || !p.rcv.AckDue(now).IsZero() {
		return 0, false
	}
	n := min(tr.Train(w.Handle, w.sent, w.nseg-w.sent), MaxTrain, int(w.nseg-w.sent))
	if n < 2 {
		return 0, false
	}
	if e.trains == nil {
		e.trains = new(trainCtx[M, P])
	}
	t := e.trains
	first := w.sent
	for k < n && p.snd.CanSend(now) && (k == 0 || e.paced(p, now)) {
		i := first + uint32(k)
		t.seqs[k] = p.snd.Push(pkt[M, P]{m: w, i: i}, e.host.SegmentSize(w.Handle, i)+frameOverhead, now)
		k++
	}
	unpush := func() {
		for i := k - 1; i >= 0; i-- {
			p.snd.Unpush(t.seqs[i])
		}
	}
	if k < 2 {
		unpush()
		return 0, false
	}
	ackNow := first+uint32(k) == w.nseg && len(p.queue) == 1 && w.flags&PostQuiet == 0
	for i := range k {
		f := Fields{Type: Data, Window: p.rcv.Window(), DstQPN: p.key.QPN, SrcQPN: e.cfg.QPN, Epoch: p.epoch,
			Token: p.theirToken, Seq: t.seqs[i], Init: p.sendInit, Issued: p.myToken, AckNow: ackNow && i == k-1}
		t.frames[i] = Frame[M, P]{Dst: p.key.Addr, Peer: &p.pub, Header: Append(t.hb[i][:0], &f), Type: Data,
			Msg: w.Handle, Index: first + uint32(i), First: true}
	}
	err := tr.SendTrain(t.frames[:k])
	clear(t.frames[:k]) // holds no message past the call
	if err == nil {
		p.last = now
		e.Stats.DataSent += uint64(k)
		e.Stats.Trains++
		w.sent += uint32(k)
		return k, false
	}
	unpush()
	return 0, err == ErrWouldBlock
}

// paced reports whether p's congestion control lets a frame leave now
// (Sender.SendAt, within PaceSlack).
func (e *Endpoint[M, P]) paced(p *peer[M, P], now time.Time) bool {
	at := p.snd.SendAt(now)
	return at.IsZero() || at.Sub(now) <= e.cfg.PaceSlack
}
