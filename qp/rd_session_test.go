package qp

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestRDReceiverNotReadyRetries: with the default RNR retry limit (7) and
// more than 8 Sends in flight, a receiver that refuses (no receive
// posted) and posts its receives later gets every message: the refusal
// counts once, not once per ack the frames in flight draw, so the
// sender's backoff runs instead of failing the peer at once.
func TestRDReceiverNotReadyRetries(t *testing.T) {
	// The refusals would take RNRDelay·(2^7-1) ≈ 6 s to run out: the
	// receives are posted long before.
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{Config: reliability.Config{RNRDelay: 50 * time.Millisecond, MaxRTO: 5 * time.Second, RNRRetries: 7}})
	const n = 16
	for i := range n {
		p.a.buf[i] = byte(i)
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i, 1)}, AH: p.ahAB}); err != nil {
			t.Fatal(err)
		}
	}
	// The receiver refuses the first and holds the rest behind it, each
	// of which draws an ack.
	eventually(t, "a refusal", func() bool { return p.b.dev.Stats().RDNotReady.Load() > 0 })
	for i := range n {
		mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i, 1)}}))
	}
	for i, wc := range collect(t, p.cqa, n, 20*time.Second) {
		if wc.ID != uint64(i) || wc.Status != Success {
			t.Fatalf("send %d: %+v", i, wc)
		}
	}
	for i, wc := range collect(t, p.cqb, n, 5*time.Second) {
		if wc.ID != uint64(i) || wc.Status != Success || p.b.buf[i] != byte(i) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	t.Logf("%d refusals, %d frames held behind one", p.b.dev.Stats().RDNotReady.Load(), p.b.dev.Stats().RDBuffered.Load())
}

// rdFlow is the messages one RD QP sends another in a session test: each
// is a 4-byte tag, unique in the flow; the receiver posts 8-byte
// receives. It records what every send WR completed with and what the
// receiver got, in order.
type rdFlow struct {
	t        *testing.T
	name     string
	from, to *node
	qf, qt   *QP
	scq, rcq *CQ // the sender's send CQ, the receiver's receive CQ
	ah       *AH
	base     int // where in the nodes' buffers this flow's bytes live
	tags     uint32
	slots    int
	status   map[uint32]Status
	got      []uint32
}

// rdSessionQP is an RD QP with its own send and receive CQs.
func rdSessionQP(t *testing.T, n *node, rd RDConfig) (q *QP, scq, rcq *CQ) {
	t.Helper()
	var err error
	if scq, err = n.dev.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	if rcq, err = n.dev.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	return n.newQP(QPAttr{Type: RD, SendCQ: scq, RecvCQ: rcq, RD: rd, Caps: QPCaps{MaxSendWR: 1024, MaxRecvWR: 1024}}), scq, rcq
}

func newRDFlow(t *testing.T, name string, from, to *node, qf, qt *QP, scq, rcq *CQ, base int) *rdFlow {
	return &rdFlow{t: t, name: name, from: from, to: to, qf: qf, qt: qt, scq: scq, rcq: rcq, ah: from.ah(to, qt),
		base: base, status: map[uint32]Status{}}
}

func (f *rdFlow) recvs(n int) {
	f.t.Helper()
	for range n {
		if err := f.qt.PostRecv(&RecvWR{ID: uint64(f.slots), SGL: []SGE{f.to.mr.SGE(f.base+8*f.slots, 8)}}); err != nil {
			f.t.Fatal(err)
		}
		f.slots++
	}
}

// send posts n messages and returns their tags.
func (f *rdFlow) send(n int) []uint32 {
	f.t.Helper()
	var tags []uint32
	for range n {
		tag := f.tags
		f.tags++
		off := f.base + 4*int(tag)
		binary.BigEndian.PutUint32(f.from.buf[off:], tag|0x5a000000)
		if err := f.qf.PostSend(&SendWR{ID: uint64(tag), Flags: FlagSignaled, SGL: []SGE{f.from.mr.SGE(off, 4)}, AH: f.ah}); err != nil {
			f.t.Fatal(err)
		}
		tags = append(tags, tag)
	}
	return tags
}

// complete waits for n send completions and records them.
func (f *rdFlow) complete(n int) {
	f.t.Helper()
	for _, wc := range collect(f.t, f.scq, n, 20*time.Second) {
		f.status[uint32(wc.ID)] = wc.Status
	}
}

// receive takes what the receiver got so far.
func (f *rdFlow) receive() {
	f.t.Helper()
	syncRD(f.qt)
	var wcs [64]WorkCompletion
	for {
		n := f.rcq.Poll(wcs[:])
		if n == 0 {
			return
		}
		for _, wc := range wcs[:n] {
			if wc.Status != Success || wc.Len != 4 {
				f.t.Fatalf("%s: a receive completed %+v", f.name, wc)
			}
			v := binary.BigEndian.Uint32(f.to.buf[f.base+8*int(wc.ID):])
			if v>>24 != 0x5a {
				f.t.Fatalf("%s: receive %d holds %#x", f.name, wc.ID, v)
			}
			f.got = append(f.got, v&0xffffff)
		}
	}
}

// check asserts the delivery contract for the tags sent so far: the
// receiver got messages in order and each once; every WR that completed
// Success was delivered; among strict (WRs posted after a session was
// lost), every WR that completed in error was not delivered; and the
// WRs in want completed Success.
func (f *rdFlow) check(strict, want []uint32) {
	f.t.Helper()
	f.receive()
	// Nothing delivered late, after its WR completed: every frame on its
	// way when the last WR completed has reached the receiver.
	quietDrained(f.t, f.rcq, f.from, f.to)
	got := map[uint32]bool{}
	for i, tag := range f.got {
		if i > 0 && tag <= f.got[i-1] {
			f.t.Fatalf("%s: delivered out of order or twice: %v", f.name, f.got)
		}
		got[tag] = true
	}
	for tag, st := range f.status {
		if st == Success && !got[tag] {
			f.t.Fatalf("%s: message %d completed Success and was never delivered (delivered %v)", f.name, tag, f.got)
		}
	}
	for _, tag := range strict {
		if st, ok := f.status[tag]; ok && st != Success && got[tag] {
			f.t.Fatalf("%s: message %d completed %v and was delivered", f.name, tag, st)
		}
	}
	for _, tag := range want {
		if st := f.status[tag]; st != Success {
			f.t.Fatalf("%s: message %d completed %v, want Success (delivered %v)", f.name, tag, st, f.got)
		}
	}
}

// exchange sends n messages and checks that all of them arrive and
// complete Success.
func (f *rdFlow) exchange(n int) {
	f.t.Helper()
	f.recvs(n)
	tags := f.send(n)
	f.complete(n)
	f.check(tags, tags)
}

// resume is the first exchange of a side that kept its session after the
// peer dropped it (the survivor): its first frames draw the peer's
// Challenge and it opens a new session. A WR whose frame it had sent more
// than once by the time the Challenge came back (a retransmission on a
// slow machine) may have been carried out in the old session for all the
// survivor can prove, so it completes RemoteAbortedError — and then it
// must not have been delivered; every other completes Success and was.
// A second exchange must then complete entirely.
func (f *rdFlow) resume(n int) {
	f.t.Helper()
	f.recvs(n)
	tags := f.send(n)
	f.complete(n)
	var want []uint32
	for _, tag := range tags {
		switch f.status[tag] {
		case Success:
			want = append(want, tag)
		case RemoteAbortedError:
		default:
			f.t.Fatalf("%s: message %d completed %v after the session was lost", f.name, tag, f.status[tag])
		}
	}
	f.check(tags, want)
	f.exchange(n)
}

// rdSessionPair is two nodes with an RD QP each and the flows both ways.
type rdSessionPair struct {
	a, b   *node
	qa, qb *QP
	ab, ba *rdFlow
}

func newRDSessionPair(t *testing.T, rdA, rdB RDConfig) *rdSessionPair {
	p := &rdSessionPair{a: newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0"), b: newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")}
	var sa, ra, sb, rb *CQ
	p.qa, sa, ra = rdSessionQP(t, p.a, rdA)
	p.qb, sb, rb = rdSessionQP(t, p.b, rdB)
	p.ab = newRDFlow(t, "a→b", p.a, p.b, p.qa, p.qb, sa, rb, 0)
	p.ba = newRDFlow(t, "b→a", p.b, p.a, p.qb, p.qa, sb, ra, 1<<19)
	return p
}

// goOnAfterBLost checks that a kept its state for b after b dropped its
// state for a, then exchanges both ways, a (the keeper) first or b first.
func (p *rdSessionPair) goOnAfterBLost(keeperFirst bool) {
	p.ab.t.Helper()
	if !hasPeer(p.qa, p.b, p.qb) {
		p.ab.t.Fatal("a dropped b too")
	}
	if keeperFirst {
		p.ab.resume(8)
		p.ba.exchange(8)
	} else {
		p.ba.exchange(8)
		p.ab.exchange(8)
	}
}

// hasPeer reports whether q holds state for the peer QP o on node n.
func hasPeer(q *QP, n *node, o *QP) bool {
	_, ok := rdInfo(q, rdKey{n.sock.LocalAddr(), o.QPN()})
	return ok
}

// TestRDSessionAfterPeerFailure: a fails its peer b (an RNR failure)
// while b keeps its state for a; new traffic then flows both ways, the
// side that failed first or the side that kept its state first. Every
// message is delivered once and in order, a WR completes Success only
// for a delivered message, and the message whose WR failed is never
// delivered.
func TestRDSessionAfterPeerFailure(t *testing.T) {
	for _, survivorFirst := range []bool{false, true} {
		name := "failed side first"
		if survivorFirst {
			name = "survivor first"
		}
		t.Run(name, func(t *testing.T) {
			rdA := RDConfig{Config: reliability.Config{RNRRetries: 1, RNRDelay: time.Millisecond}}
			p := newRDSessionPair(t, rdA, RDConfig{})
			p.ab.exchange(5)
			p.ba.exchange(3)
			// A Send b has no receive for: a gives up on b, b keeps a.
			failed := p.ab.send(1)
			p.ab.complete(1)
			if st := p.ab.status[failed[0]]; st != RNRRetryExceededError {
				t.Fatalf("the refused Send completed %v", st)
			}
			if hasPeer(p.qa, p.b, p.qb) || !hasPeer(p.qb, p.a, p.qa) {
				t.Fatal("a should have dropped b, and b kept a")
			}
			if survivorFirst {
				p.ba.resume(5)
				p.ab.exchange(10)
			} else {
				p.ab.exchange(10)
				p.ba.exchange(5)
			}
			p.ab.check(failed, nil)
		})
	}
}

// setIdleTimeout changes q's IdleTimeout and rearms its timer: the test
// decides when a peer may be reclaimed (when nothing is on its way), so
// that a machine that stalls the receiver for longer than the timeout
// cannot reclaim it at another moment.
func setIdleTimeout(q *QP, d time.Duration) {
	q.rd.mu.Lock()
	defer q.rd.mu.Unlock()
	q.rd.cfg.IdleTimeout = d
	q.rd.ep.SetIdleTimeout(d) // every peer's reclaim time moved
	q.rd.arm(time.Now())
}

// TestRDSessionAfterIdleReclaim: b reclaims its idle peer a while a,
// with a longer IdleTimeout, keeps b. The side that kept its state
// sends first, or the other: every message is delivered once and in
// order; every WR completes Success but, for the side that kept its
// state, one it had sent again before the Challenge came back, which
// completes RemoteAbortedError undelivered (resume).
func TestRDSessionAfterIdleReclaim(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 20 * time.Millisecond, MaxRetries: 1000}, IdleTimeout: time.Hour}
	for _, keeperFirst := range []bool{true, false} {
		name := "keeper first"
		if !keeperFirst {
			name = "reclaimer first"
		}
		t.Run(name, func(t *testing.T) {
			p := newRDSessionPair(t, rd, rd)
			p.ab.exchange(4)
			p.ba.exchange(6)
			setIdleTimeout(p.qb, time.Millisecond)
			eventually(t, "b reclaiming a", func() bool { return !hasPeer(p.qb, p.a, p.qa) })
			setIdleTimeout(p.qb, time.Hour)
			p.goOnAfterBLost(keeperFirst)
		})
	}
}

// rdContact completes RD contact with q on node n from c under source QP
// qpn, as any host can: Hello, the Challenge back, then a Data frame with
// the issued token (carrying a segment that is not valid DDP, consumed
// with an error). q then holds state for (c's address, qpn).
func rdContact(t *testing.T, c *net.UDPConn, n *node, q *QP, qpn uint32) {
	t.Helper()
	sendTo(t, c, rdFrame(reliability.Fields{Type: reliability.Hello, DstQPN: q.QPN(), SrcQPN: qpn, Epoch: 77, Init: true, Issued: 1}, nil), n)
	buf := make([]byte, 2048)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		k, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("waiting for a Challenge: %v", err)
		}
		var h reliability.Header
		if h.Parse(buf[:k-udiwarp.CRCSize]) != nil || h.Type != reliability.Challenge || h.DstQPN != qpn {
			continue // an ack for an earlier contact
		}
		sendTo(t, c, rdFrame(reliability.Fields{Type: reliability.Data, DstQPN: q.QPN(), SrcQPN: qpn, Epoch: 77, Token: h.Issued,
			Init: true, Issued: 1, AckNow: true}, []byte("junk, not DDP")), n)
		return
	}
}

// TestRDSessionAfterEviction: another host completes contact with b
// under many (address, QP) pairs and so evicts b's idle state for a,
// which keeps its state for b. The pair goes on working both ways, the
// evicted side first or the side that kept its state first: every
// message is delivered once and in order, and every WR completes Success
// but the kept side's first ones the protocol cannot prove undelivered
// (resume).
func TestRDSessionAfterEviction(t *testing.T) {
	const maxPeers = 4
	rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 20 * time.Millisecond, MaxRetries: 1000}}
	rdB := rd
	rdB.MaxPeers = maxPeers
	for _, keeperFirst := range []bool{false, true} {
		name := "evicted side first"
		if keeperFirst {
			name = "keeper first"
		}
		t.Run(name, func(t *testing.T) {
			p := newRDSessionPair(t, rd, rdB)
			p.ab.exchange(3)
			p.ba.exchange(5)
			// Contact from other (address, QP) pairs until b evicted a
			// (the longest idle: at most maxPeers contacts, more if b
			// took some late).
			for k := 0; hasPeer(p.qb, p.a, p.qa); k++ {
				if k == 16*maxPeers {
					t.Fatalf("%d contacts did not evict a", k)
				}
				c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 3, byte(k+1))})
				if err != nil {
					t.Fatal(err)
				}
				rdContact(t, c, p.b, p.qb, uint32(100+k))
				c.Close()
			}
			p.goOnAfterBLost(keeperFirst)
		})
	}
}

// TestRDLateFrameOfEndedSession: a Data frame that opened a session
// (INIT, its keyed token, a Send) arrives again after the receiver
// dropped the session (idle reclaim): a late duplicate, or the peer
// sending it again. Its token is still the one the receiver issued, but
// the session is over: the frame opens nothing and is not delivered a
// second time; the receiver answers with a Challenge.
func TestRDLateFrameOfEndedSession(t *testing.T) {
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, RDConfig{IdleTimeout: 20 * time.Millisecond})
	for i := range 2 {
		mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*10, 10)}}))
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const qpn = 9
	read := func() reliability.Header {
		t.Helper()
		buf := make([]byte, 2048)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		var h reliability.Header
		if err := h.Parse(buf[:k-udiwarp.CRCSize]); err != nil {
			t.Fatal(err)
		}
		return h
	}
	sendTo(t, c, rdFrame(reliability.Fields{Type: reliability.Hello, DstQPN: qb.QPN(), SrcQPN: qpn, Epoch: 77, Init: true, Issued: 1}, nil), b)
	ch := read()
	if ch.Type != reliability.Challenge {
		t.Fatalf("answer to Hello: %v", ch.Type)
	}
	send := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: qpn, QN: udiwarp.DatagramQN(qb.QPN(), udiwarp.QueueSend), MSN: 1})
	data := rdFrame(reliability.Fields{Type: reliability.Data, DstQPN: qb.QPN(), SrcQPN: qpn, Epoch: 77, Token: ch.Issued,
		Init: true, Issued: 1, AckNow: true}, append(send, "once"...))
	sendTo(t, c, data, b)
	if wc := collect(t, cqb, 1, 5*time.Second)[0]; wc.Status != Success || string(b.buf[:4]) != "once" {
		t.Fatalf("%+v", wc)
	}
	if h := read(); h.Type != reliability.Ack || h.Ack.Cumulative != 1 {
		t.Fatalf("answer to Data: %v, cumulative %d", h.Type, h.Ack.Cumulative)
	}
	eventually(t, "b reclaiming the idle peer", func() bool { return peersOf(qb) == 0 })
	// Take what b sent before it reclaimed the peer (acks), then send the
	// frame again.
	for {
		c.SetReadDeadline(time.Now())
		if _, _, err := c.ReadFromUDPAddrPort(make([]byte, 2048)); err != nil {
			break
		}
	}
	sendTo(t, c, data, b)
	if h := read(); h.Type != reliability.Challenge {
		t.Fatalf("the late frame drew %v (cumulative %d), not a Challenge", h.Type, h.Ack.Cumulative)
	}
	if n := peersOf(qb); n != 0 {
		t.Fatalf("the late frame opened a session (%d peers)", n)
	}
	noCompletion(t, cqb) // not delivered twice: b answered the late frame
}

// TestRDSessionChurn: sessions end again and again under traffic both
// ways — a's Sends outrun b's receives until a fails b (RNR), while b
// keeps sending to a — over a clean link and over one that loses,
// duplicates and reorders. Whatever completes in error, nothing
// completes Success undelivered and nothing is delivered twice or out of
// order; and afterwards the pair works.
func TestRDSessionChurn(t *testing.T) {
	for _, tc := range []struct {
		name string
		imp  func(seed uint64) *Impairment
	}{
		{"clean", func(uint64) *Impairment { return nil }},
		{"loss, duplication, reordering", func(s uint64) *Impairment {
			return &Impairment{Seed: s, Loss: 0.03, Duplicate: 0.02, Reorder: 0.05, Jitter: 100 * time.Microsecond}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 20 * time.Millisecond, MaxRetries: 8}
			rdA := RDConfig{Config: base}
			rdA.RNRRetries, rdA.RNRDelay = 1, time.Millisecond
			p := &rdSessionPair{a: newNode(t, DeviceConfig{Impair: tc.imp(1)}, "udp4", "127.0.0.1:0"),
				b: newNode(t, DeviceConfig{Impair: tc.imp(2)}, "udp4", "127.0.0.1:0")}
			var sa, ra, sb, rb *CQ
			p.qa, sa, ra = rdSessionQP(t, p.a, rdA)
			p.qb, sb, rb = rdSessionQP(t, p.b, RDConfig{Config: base})
			p.ab = newRDFlow(t, "a→b", p.a, p.b, p.qa, p.qb, sa, rb, 0)
			p.ba = newRDFlow(t, "b→a", p.b, p.a, p.qb, p.qa, sb, ra, 1<<19)
			failures := uint64(0)
			for round := range 6 {
				p.ab.recvs(4)
				p.ba.recvs(6)
				p.ab.send(6) // two more than b can take
				p.ba.send(6)
				p.ab.complete(6)
				p.ba.complete(6)
				p.ab.check(nil, nil)
				p.ba.check(nil, nil)
				failures = p.a.dev.Stats().RDPeerFailures.Load()
				t.Logf("round %d: a failed b %d times, restarts a %d b %d", round, failures,
					p.a.dev.Stats().RDPeerRestarts.Load(), p.b.dev.Stats().RDPeerRestarts.Load())
			}
			if failures == 0 {
				t.Fatal("a never failed b: the test did not test")
			}
			// Each end of a session is seen once or so on each side, not
			// answered by a storm of sessions each side ends in turn.
			if n := p.a.dev.Stats().RDPeerRestarts.Load() + p.b.dev.Stats().RDPeerRestarts.Load(); n > 4*failures {
				t.Fatalf("%d session restarts for %d failures", n, failures)
			}
			// The pair works: a round of traffic with nothing in error
			// (over a lossy link, a WR in flight when a session ends may
			// fail; a few rounds at most).
			for try := 0; ; try++ {
				p.ab.recvs(5)
				p.ba.recvs(5)
				p.ab.send(5)
				p.ba.send(5)
				p.ab.complete(5)
				p.ba.complete(5)
				p.ab.check(nil, nil)
				p.ba.check(nil, nil)
				ok := true
				for _, f := range []*rdFlow{p.ab, p.ba} {
					for tag := f.tags - 5; tag < f.tags; tag++ {
						ok = ok && f.status[tag] == Success
					}
				}
				if ok {
					break
				}
				if try == 3 {
					t.Fatal("no clean round after the churn")
				}
			}
		})
	}
}
