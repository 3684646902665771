package qp

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
)

// Three rules of docs/wire.md §11.2 and §11.3 that the simulator of the
// RD engine (reliability/simnet_test.go) found qp breaking; each test
// drives a QP from a hand-made RD peer on a real socket, as
// reliability/endpoint_test.go drives the engine.

// rawPeer returns a raw UDP socket on loopback, closed with the test.
func rawPeer(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// onlyPeer returns what q's one peer state holds (ok false: none).
func onlyPeer(q *QP) (last, moved, reclaimAt time.Time, held int, ok bool) {
	r := q.rd
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ep.EachPeer(func(pi *reliability.PeerInfo) {
		last, moved, reclaimAt, held, ok = pi.Last, pi.Moved, pi.ReclaimAt, pi.HeldFrames, true
	})
	return
}

// rawAck sends an Ack frame of r's session (cumulative point cum).
func (r *rawRD) ack(token uint64, cum uint32) {
	sendTo(r.t, r.c, rdFrame(reliability.Fields{Type: reliability.Ack, DstQPN: r.dst, SrcQPN: r.qpn, Epoch: r.epoch, Token: token,
		Ack: &reliability.AckBlock{Cumulative: cum}}, nil), r.to)
}

// TestRDNewGapIsNotStalled: a peer that sent no Data for longer than
// IdleTimeout (acks only: the traffic went the other way) and whose next
// frames arrive out of order holds them ahead of a new gap; it must not be
// reclaimed as one whose gap stalled, with its frames in flight. It
// fails when the gap's clock is the peer's last in-order delivery rather
// than when the gap opened (B reclaims A at once).
func TestRDNewGapIsNotStalled(t *testing.T) {
	const idle = time.Second
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, RDConfig{IdleTimeout: idle})
	for i := range 3 {
		mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*10, 10)}}))
	}
	const qpn = 9
	a := rawContact(t, rawPeer(t), b, qb, qpn)
	a.data(0, rdSendSeg(qb.QPN(), qpn, 1, []byte("one")), false, 0, 0)
	if wc := collect(t, cqb, 1, 10*time.Second)[0]; wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	// A keeps talking to B, acks only, until B's last in-order delivery
	// from A is longer ago than IdleTimeout.
	for {
		sent := time.Now()
		a.ack(a.theirs, 0)
		var last, moved time.Time
		eventually(t, "B taking A's ack", func() bool {
			var ok bool
			if last, moved, _, _, ok = onlyPeer(qb); !ok {
				t.Fatal("B forgot A while A kept talking to it")
			}
			return !last.Before(sent)
		})
		if last.Sub(moved) > idle+idle/2 {
			break
		}
		time.Sleep(idle / 20) // the pace of A's acks; B's state is what the loop waits for
	}
	// A sends two segments; the first is held back, the second arrives.
	buffered := b.dev.Stats().RDBuffered.Load()
	a.data(2, rdSendSeg(qb.QPN(), qpn, 3, []byte("three")), false, 0, 0)
	eventually(t, "B holding A's frame ahead of the gap", func() bool { return b.dev.Stats().RDBuffered.Load() > buffered })
	opened := time.Now()
	_, _, at, held, ok := onlyPeer(qb)
	if !ok {
		t.Fatalf("B reclaimed A as stalled as its gap opened (reclaimed %d)", b.dev.Stats().RDPeersReclaimed.Load())
	}
	if held == 0 {
		t.Fatal("B holds nothing: the test did not reach a gap")
	}
	if at.Sub(opened) < idle/2 {
		t.Fatalf("B reclaims A %v after its gap opened, with IdleTimeout %v", at.Sub(opened), idle)
	}
	a.data(1, rdSendSeg(qb.QPN(), qpn, 2, []byte("two")), false, 0, 0)
	for i, wc := range collect(t, cqb, 2, 10*time.Second) {
		if wc.Status != Success || wc.ID != uint64(i+1) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if got := string(b.buf[10:13]) + string(b.buf[20:25]); got != "twothree" {
		t.Fatalf("delivered %q", got)
	}
	if n := b.dev.Stats().RDPeersReclaimed.Load(); n != 0 {
		t.Fatalf("%d peers reclaimed", n)
	}
}

// TestRDRefusedOpeningStaysShut: a session-opening Data frame that B
// refuses with a Challenge (the source opened another session after B's
// stateless Challenge issued the frame's token) tells its sender that it
// found no session, so the sender sends its messages again in a new one:
// another copy of the frame must never open its session later, once B
// has dropped the other. It fails when the refusal leaves that session
// unburied (the copy is delivered).
func TestRDRefusedOpeningStaysShut(t *testing.T) {
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, RDConfig{IdleTimeout: time.Hour})
	for i := range 2 {
		mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*10, 10)}}))
	}
	c := rawPeer(t)
	const qpn = 9
	// A opens: B answers its Hello statelessly. A's opening Data frame
	// is held back.
	first := rawContactIn(t, c, b, qb, qpn, 0x1111, 0xaaa1)
	// Meanwhile A restarted on the same address and opened another
	// session, which B took.
	second := rawContactIn(t, c, b, qb, qpn, 0x2222, 0xaaa2)
	second.data(0, rdSendSeg(qb.QPN(), qpn, 1, []byte("new")), false, 0, 0)
	if wc := collect(t, cqb, 1, 10*time.Second)[0]; wc.Status != Success || string(b.buf[:3]) != "new" {
		t.Fatalf("the second session: %+v", wc)
	}
	// The first opening frame arrives now: refused.
	opening := rdSendSeg(qb.QPN(), qpn, 1, []byte("old"))
	first.data(0, opening, false, 0, 0)
	if !first.await(func(h *reliability.Header) bool { return h.Type == reliability.Challenge && h.Token == first.theirs }) {
		t.Fatal("the first opening frame drew no Challenge")
	}
	var wc [1]WorkCompletion
	if cqb.Poll(wc[:]) > 0 {
		t.Fatalf("a frame of a refused opening was delivered: %+v", wc[0])
	}
	// B forgets the second session (idle), then another copy of the
	// first opening frame arrives.
	setIdleTimeout(qb, time.Millisecond)
	eventually(t, "B forgetting A", func() bool { return peersOf(qb) == 0 })
	setIdleTimeout(qb, time.Hour)
	first.data(0, opening, false, 0, 0)
	var answer reliability.Type
	if !first.await(func(h *reliability.Header) bool {
		answer = h.Type
		return h.Type == reliability.Challenge && h.Token == first.theirs || h.Token == first.mine
	}) {
		t.Fatal("B did not answer the copy")
	}
	if cqb.Poll(wc[:]) > 0 {
		t.Fatalf("a copy of an opening frame B refused opened its session later: delivered %+v, %q", wc[0], b.buf[10:13])
	}
	if answer != reliability.Challenge {
		t.Fatalf("B answered the copy with %v, not a Challenge", answer)
	}
	if n := peersOf(qb); n != 0 {
		t.Fatalf("%d peers: the copy opened one", n)
	}
}

// TestRDStaleOpeningDoesNotEndNewerSession: H, with a message for C, sent
// Hello; C's own opening reached H first and H answered it (a Challenge
// with H's epoch). C then restarted, and the new C answered H's Hello
// without state: H's session is established with the new C. A late Data
// frame of the old C's opening must not end that session as if C had
// opened again — the new C lives in it — or H completes its message
// RemoteAbortedError while C delivers it. It fails when H keeps the
// answered opening valid once established under another epoch.
func TestRDStaleOpeningDoesNotEndNewerSession(t *testing.T) {
	h := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qh, cqh := rdQPOn(t, h, RDConfig{IdleTimeout: time.Hour})
	c := rawPeer(t)
	const qpn = 9
	ah, err := h.pd.CreateAH(c.LocalAddr().(*net.UDPAddr).AddrPort(), qpn)
	if err != nil {
		t.Fatal(err)
	}
	if err := qh.PostSend(&SendWR{ID: 11, Flags: FlagSignaled, Inline: []byte("h's"), AH: ah}); err != nil {
		t.Fatal(err)
	}
	newC := &rawRD{t: t, c: c, to: h, dst: qh.QPN(), qpn: qpn, epoch: 0x2222, mine: 0xbbb2}
	var helloToken uint64
	if !newC.await(func(f *reliability.Header) bool {
		helloToken = f.Issued
		return f.Type == reliability.Hello && f.SrcQPN == qh.QPN()
	}) {
		t.Fatal("no Hello from H")
	}
	// The old C's opening: H answers its Hello; its Data frame is late.
	oldC := rawContactIn(t, c, h, qh, qpn, 0x1111, 0xbbb1)
	// The new C answers H's Hello without state: H's session is
	// established and its message goes.
	sendTo(t, c, rdFrame(reliability.Fields{Type: reliability.Challenge, DstQPN: qh.QPN(), SrcQPN: qpn, Epoch: newC.epoch,
		Token: helloToken, Init: true, Issued: newC.mine}, nil), h)
	if !newC.await(func(f *reliability.Header) bool { return f.Type == reliability.Data && f.Token == newC.mine }) {
		t.Fatal("H sent no Data in its session")
	}
	// The old C's opening Data frame arrives.
	oldC.data(0, rdSendSeg(qh.QPN(), qpn, 1, []byte("stale")), false, 0, 0)
	var answer reliability.Type
	if !oldC.await(func(f *reliability.Header) bool {
		answer = f.Type
		return f.Type == reliability.Challenge && f.Token == oldC.theirs || f.Token == oldC.mine
	}) {
		t.Fatal("H did not answer the late opening frame")
	}
	// The new C acknowledges H's message.
	newC.ack(helloToken, 1)
	wc := collect(t, cqh, 1, 10*time.Second)[0]
	if wc.Status != Success {
		t.Fatalf("H's message completed %v (the late opening answered with %v); want Success", wc.Status, answer)
	}
	if answer != reliability.Challenge {
		t.Fatalf("H answered the late opening frame with %v, not a Challenge", answer)
	}
	if n := h.dev.Stats().RDPeerRestarts.Load(); n != 0 {
		t.Fatalf("%d restarts", n)
	}
}

// TestRDPeerInfo: a QP shows what it holds of its peer through the
// public API: an established session, nothing outstanding once its Send
// completed, a congestion controller with an RTT measured; and nothing
// for a peer it never talked to.
func TestRDPeerInfo(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
	mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{p.b.mr.SGE(0, 64)}}))
	if err := p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("hello"), AH: p.ahAB}); err != nil {
		t.Fatal(err)
	}
	if wc := collect(t, p.cqa, 1, 10*time.Second)[0]; wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	pi, ok := p.qa.RDPeer(p.ahAB)
	if !ok || !pi.Established || pi.Outstanding != 0 || pi.Key.QPN != p.qb.QPN() || pi.Congestion == "" || pi.SRTT <= 0 || pi.MinRTT <= 0 || pi.CongestionWindow <= 0 {
		t.Fatalf("%v %+v", ok, pi)
	}
	if all := p.qa.RDPeers(); len(all) != 1 || all[0].Key != pi.Key {
		t.Fatalf("%+v", all)
	}
	other, err := p.a.pd.CreateAH(p.b.sock.LocalAddr(), p.qb.QPN()+99)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.qa.RDPeer(other); ok {
		t.Fatal("state for a peer never talked to")
	}
}

// TestRDAckLazily: a signaled RD Send with FlagAckLazily does not ask
// its peer for an immediate ack: the peer's response carries it, and the
// peer sends no standalone ack for it (without the flag, the request's
// FlagAckNow draws one at once). The ack delay is a minute here, a bound
// only a hung test reaches, so that only the response can have carried
// the ack before the request completed. Other QP types refuse the flag.
func TestRDAckLazily(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprint("lazy=", lazy), func(t *testing.T) {
			p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{Config: reliability.Config{MaxAckDelay: time.Minute}})
			// The session first, and its acks settled.
			mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{p.b.mr.SGE(0, 64)}}))
			mustPost(t, p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("open"), AH: p.ahAB}))
			collect(t, p.cqa, 1, 10*time.Second)
			collect(t, p.cqb, 1, 10*time.Second)
			// a's Send completed on b's standalone ack, which b's engine
			// counts into the device's stats as it lets go of the QP,
			// maybe after a completed: wait for it to be counted, or the
			// count below would take it for an ack of the request.
			eventually(t, "b's ack of the opening Send to be counted", func() bool { return p.b.dev.Stats().RDAcksSent.Load() >= 1 })
			acks := p.b.dev.Stats().RDAcksSent.Load()
			flags := FlagSignaled
			if lazy {
				flags |= FlagAckLazily
			}
			mustPost(t, p.qb.PostRecv(&RecvWR{ID: 2, SGL: []SGE{p.b.mr.SGE(64, 64)}}))
			mustPost(t, p.qa.PostRecv(&RecvWR{ID: 2, SGL: []SGE{p.a.mr.SGE(0, 64)}}))
			if err := p.qa.PostSend(&SendWR{ID: 2, Flags: flags, Inline: []byte("request"), AH: p.ahAB}); err != nil {
				t.Fatal(err)
			}
			collect(t, p.cqb, 1, 10*time.Second) // the request arrived
			if err := p.qb.PostSend(&SendWR{ID: 3, Flags: FlagSignaled, Inline: []byte("response"), AH: p.ahBA}); err != nil {
				t.Fatal(err)
			}
			var sendDone bool
			for _, wc := range collect(t, p.cqa, 2, 10*time.Second) {
				if wc.Status != Success {
					t.Fatalf("%+v", wc)
				}
				sendDone = sendDone || wc.ID == 2 && wc.Opcode == WCSend
			}
			standalone := p.b.dev.Stats().RDAcksSent.Load() - acks
			t.Logf("lazy %v: the request completed %v; b sent %d standalone acks", lazy, sendDone, standalone)
			switch {
			case !sendDone:
				t.Fatal("the request did not complete")
			case lazy && standalone != 0:
				t.Fatalf("b sent %d standalone acks for a request its response acknowledged", standalone)
			case !lazy && standalone == 0:
				t.Fatal("without FlagAckLazily b sent no standalone ack: the test does not tell the two apart")
			}
		})
	}
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	cq, _ := n.dev.CreateCQ(4)
	ud := n.newQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq})
	if err := ud.PostSend(&SendWR{Flags: FlagAckLazily, Inline: []byte("x"), AH: n.ah(n, ud)}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("FlagAckLazily on a UD QP: %v", err)
	}
}
