package qp

import (
	"bytes"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// TestRDDirectPlacement checks RD Sends that land straight in posted
// receives (landing.go, rdQP.deliverLanded): every message complete, in
// order and once, whether the link is clean (most land in place), loses,
// reorders, duplicates and corrupts frames (out-of-order frames are
// copied out and buffered, corrupted ones fail their CRC on the ordinary
// path, retransmissions fill the gaps), or carries Sends for another QP
// of the same socket in between (the guess is wrong: landing backs off).
// Receives have two SGEs, so a landed payload spans both.
func TestRDDirectPlacement(t *testing.T) {
	for _, tc := range []struct {
		name   string
		impair *Impairment
		other  bool
	}{
		{name: "clean"},
		{name: "another QP between", other: true},
		{name: "lossy link, seed 7", impair: &Impairment{Seed: 7, Loss: 0.05, Reorder: 0.05, Duplicate: 0.05, Corrupt: 0.02}},
		{name: "lossy link, seed 8", impair: &Impairment{Seed: 8, Loss: 0.05, Reorder: 0.05, Duplicate: 0.05, Corrupt: 0.02}},
		{name: "lossy link, seed 9", impair: &Impairment{Seed: 9, Loss: 0.1, Reorder: 0.1, Duplicate: 0.05}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newRDPair(t, DeviceConfig{Impair: tc.impair}, DeviceConfig{Poll: PollBusy}, RDConfig{})
			var qo *QP
			var cqo *CQ
			if tc.other {
				qo, cqo = rdQPOn(t, p.b, RDConfig{})
				for i := range 64 {
					qo.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(900000+i*100, 100)}})
				}
			}
			const n = 120
			const size = 3000
			for i := range n {
				// 1000 bytes, then 2000 elsewhere.
				p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*1000, 1000), p.b.mr.SGE(300000+i*2000, 2000)}})
			}
			for i := range n {
				fill(p.a.buf[i*size:(i+1)*size], i)
				if err := p.qa.PostSend(&SendWR{ID: uint64(i), SGL: []SGE{p.a.mr.SGE(i*size, size)}, AH: p.ahAB}); err != nil {
					t.Fatal(err)
				}
				if qo != nil && i%20 == 5 {
					ah := p.a.ah(p.b, qo)
					if err := p.qa.PostSend(&SendWR{Inline: []byte{byte(i)}, AH: ah}); err != nil {
						t.Fatal(err)
					}
				}
			}
			got := make([]WorkCompletion, 0, n)
			wcs := make([]WorkCompletion, 16)
			for deadline := time.Now().Add(time.Minute); len(got) < n; {
				got = append(got, wcs[:p.cqb.Poll(wcs[:min(len(wcs), n-len(got))])]...)
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d messages in a minute", len(got), n)
				}
			}
			for i, wc := range got {
				rx := append(append([]byte{}, p.b.buf[i*1000:i*1000+1000]...), p.b.buf[300000+i*2000:300000+i*2000+2000]...)
				if wc.ID != uint64(i) || wc.Status != Success || wc.Len != size || wc.SourceQPN != p.qa.QPN() || !bytes.Equal(rx, p.a.buf[i*size:(i+1)*size]) {
					t.Fatalf("message %d: %+v (content equal: %v)", i, wc, bytes.Equal(rx, p.a.buf[i*size:(i+1)*size]))
				}
			}
			if qo != nil {
				for deadline := time.Now().Add(time.Minute); ; {
					cqo.Poll(wcs[:0]) // drive the busy device
					if k := p.cqb.Poll(wcs[:1]); k > 0 {
						t.Fatalf("a completion more than was posted: %+v", wcs[0])
					}
					if p.b.dev.Stats().RxDelivered.Load() >= n+n/20 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the other QP's Sends: %d delivered in all", p.b.dev.Stats().RxDelivered.Load())
					}
				}
				for k := cqo.Poll(wcs); k > 0; k = cqo.Poll(wcs) {
					for _, wc := range wcs[:k] {
						if wc.Status != Success || p.b.buf[900000+wc.ID*100] != byte(5+20*wc.ID) {
							t.Fatalf("other QP: %+v", wc)
						}
					}
				}
			}
			st := p.b.dev.Stats()
			landed := st.RxLanded.Load()
			t.Logf("landed %d of %d; bad CRC %d, retransmissions %d", landed, n, st.RxBadCRC.Load(), p.a.dev.Stats().RDRetransmits.Load())
			if tc.impair == nil && landed < n/2 {
				t.Fatalf("only %d of %d placed directly", landed, n)
			}
		})
	}
}

// TestRDDirectPlacementFlushed takes the target's QP to ERROR while RD
// Sends are queued on its socket: frames that landed in receives the
// flush completed must not complete again, and no receive completes
// Success after its flush.
func TestRDDirectPlacementFlushed(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{Poll: PollBusy}, RDConfig{})
	const size = 4000
	const n = 64
	for i := range n {
		p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*size, size)}})
	}
	send := func(i int) {
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), SGL: []SGE{p.a.mr.SGE(0, size)}, AH: p.ahAB}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 {
		send(i)
	}
	first := spinWC(t, p.cqb, 8) // the guess is made
	for _, wc := range first {
		if wc.Status != Success {
			t.Fatalf("%+v", wc)
		}
	}
	for i := 8; i < 40; i++ {
		send(i)
	}
	eventually(t, "the sends to leave", func() bool { return p.a.dev.Stats().TxDatagrams.Load() >= 40 })
	if err := p.qb.Modify(ModifyAttr{State: StateError}); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	wcs := make([]WorkCompletion, 64)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		for _, wc := range wcs[:p.cqb.Poll(wcs)] {
			if seen[wc.ID] {
				t.Fatalf("receive %d completed twice: %+v", wc.ID, wc)
			}
			seen[wc.ID] = true
			if wc.Status != WRFlushError {
				t.Fatalf("after the flush: %+v", wc)
			}
		}
	}
	if len(seen) != n-8 {
		t.Fatalf("%d of %d receives flushed", len(seen), n-8)
	}
}

// TestRDAcksPerBatch: a sender that posts one signaled Send at a time asks
// for an ack on each frame (the last it has); a receiver that reads them
// in batches answers a batch with one ack (rdQP.ackAfterBatch), not one
// per frame: two system calls saved per message. Every Send still
// completes, so nothing waited on an ack that never came.
func TestRDAcksPerBatch(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{Poll: PollBusy}, RDConfig{})
	const n = 64
	for i := range n + 1 {
		p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*1000, 1000)}})
	}
	// The session first: the busy receiver answers the Hello when polled.
	if err := p.qa.PostSend(&SendWR{ID: 100, Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(0, 1000)}, AH: p.ahAB}); err != nil {
		t.Fatal(err)
	}
	spinWC(t, p.cqb, 1)
	collect(t, p.cqa, 1, 10*time.Second)
	base := p.a.dev.Stats().TxDatagrams.Load()
	acks0 := p.b.dev.Stats().RDAcksSent.Load()
	for i := range n {
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(0, 1000)}, AH: p.ahAB}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the frames to leave", func() bool { return p.a.dev.Stats().TxDatagrams.Load() >= base+n })
	spinWC(t, p.cqb, n) // the receiver reads what is queued, in batches once they come back to back
	sent := collect(t, p.cqa, n, 10*time.Second)
	for i, wc := range sent {
		if wc.Status != Success || wc.ID != uint64(i) {
			t.Fatalf("send %d: %+v", i, wc)
		}
	}
	acks := p.b.dev.Stats().RDAcksSent.Load() - acks0
	t.Logf("%d standalone acks for %d frames", acks, n)
	if acks > n/4 {
		t.Fatalf("%d standalone acks for %d frames read in batches", acks, n)
	}
}

// TestRDDirectPlacementSpoofed interleaves, in a busy RD target's socket,
// a peer's RD Sends with forged Data frames from the peer's own address
// and port (SO_REUSEADDR), built to be landed in place: the live epoch,
// the next sequence numbers, guessed tokens, an untagged Send of the
// same size for the same QP, a valid CRC. Each lands in a posted receive
// as a genuine frame would; none may complete one: the RD engine rejects
// them, and every real message arrives whole and in order, each once.
func TestRDDirectPlacementSpoofed(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0", ReuseAddr())
	b := newNode(t, DeviceConfig{Poll: PollBusy}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{})
	qb, cqb := rdQPOn(t, b, RDConfig{})
	ah := a.ah(b, qb)
	const n, size = 60, 3000
	for i := range n + 1 {
		qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*size, size)}})
	}
	// The session, and the socket's guess: large Sends for qb.
	qa.PostSend(&SendWR{ID: 100, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, size)}, AH: ah})
	spinWC(t, cqb, 1)
	collect(t, cqa, 1, 5*time.Second)

	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
		return serr
	}}
	pc, err := lc.ListenPacket(t.Context(), "udp4", a.sock.LocalAddr().String())
	if err != nil {
		t.Skipf("cannot share the peer's port: %v", err)
	}
	evil := pc.(*net.UDPConn)
	qa.rd.mu.Lock()
	pa := qa.rd.peers[rdKey{b.sock.LocalAddr(), qb.QPN()}]
	epoch, seq := pa.epoch, pa.snd.Next()
	qa.rd.mu.Unlock()
	forged := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: qa.QPN(), QN: udiwarp.DatagramQN(qb.QPN(), udiwarp.QueueSend), MSN: 2})
	forged = append(forged, bytes.Repeat([]byte{0xEE}, size)...)
	base := a.dev.Stats().TxDatagrams.Load()
	for i := range n {
		fill(a.buf[(i+1)*size:(i+2)*size], i)
		if err := qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{a.mr.SGE((i+1)*size, size)}, AH: ah}); err != nil {
			t.Fatal(err)
		}
		for k := range 2 {
			f := reliability.Fields{Type: reliability.Data, DstQPN: qb.QPN(), SrcQPN: qa.QPN(), Epoch: epoch, Token: uint64(i*2+k) << 17, Seq: seq + uint32(i+k)}
			if _, err := evil.WriteToUDPAddrPort(rdFrame(f, forged), b.sock.LocalAddr()); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, "the real frames to leave", func() bool { return a.dev.Stats().TxDatagrams.Load() >= base+n })
	evil.Close() // the acks go to a again
	got := spinWC(t, cqb, n)
	for i, wc := range got {
		if wc.ID != uint64(i+1) || wc.Status != Success || wc.Len != size || wc.SourceQPN != qa.QPN() ||
			!bytes.Equal(b.buf[(i+1)*size:(i+2)*size], a.buf[(i+1)*size:(i+2)*size]) {
			t.Fatalf("message %d: %+v", i, wc)
		}
	}
	for _, wc := range collect(t, cqa, n, 10*time.Second) {
		if wc.Status != Success {
			t.Fatalf("%+v", wc)
		}
	}
	quietPoll(t, cqb) // nothing forged completed
	st := b.dev.Stats()
	t.Logf("landed %d, rejected %d", st.RxLanded.Load(), st.RDRejected.Load())
	if st.RDRejected.Load() < 2*n {
		t.Fatalf("rejected %d of %d forged frames", st.RDRejected.Load(), 2*n)
	}
}
