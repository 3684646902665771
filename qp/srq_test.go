package qp

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// Seed 004 on the verbs: each SRQ behaviour through the public API over
// real sockets, with the event it raises.

// srqNode is a receiving side: a node whose device has an SRQ with
// receives of 256 bytes posted, and a CQ for the QPs on it.
type srqNode struct {
	*node
	srq  *SRQ
	rcq  *CQ
	next int // the next receive slot of the node's buffer
}

func newSRQNode(t *testing.T, addr string, attr SRQAttr) *srqNode {
	t.Helper()
	n := &srqNode{node: newNode(t, DeviceConfig{}, "udp4", addr)}
	if attr.MaxSGE == 0 {
		attr.MaxSGE = 1
	}
	var err error
	if n.srq, err = n.pd.CreateSRQEx(attr); err != nil {
		t.Fatal(err)
	}
	if n.rcq, err = n.dev.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	return n
}

// post posts k receives of size bytes, IDs from the slot numbers.
func (n *srqNode) post(k, size int) {
	n.t.Helper()
	for range k {
		if err := n.srq.PostRecv(&RecvWR{ID: uint64(n.next), SGL: []SGE{n.mr.SGE(n.next*256%len(n.buf), size)}}); err != nil {
			n.t.Fatal(err)
		}
		n.next++
	}
}

// drainEvents returns the events queued now.
func drainEvents(d *Device) []AsyncEvent {
	var out []AsyncEvent
	for {
		select {
		case e := <-d.Events():
			out = append(out, e)
		default:
			return out
		}
	}
}

// eventsOf counts the events of type typ in evs.
func eventsOf(evs []AsyncEvent, typ AsyncEventType) []AsyncEvent {
	var out []AsyncEvent
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// sendUD sends k inline messages from a to q at b and waits until b's
// device has read and handled them.
func sendUD(t *testing.T, a *node, b *srqNode, q *QP, k int, msg string) {
	t.Helper()
	ah := a.ah(b.node, q)
	st := b.dev.Stats()
	want := st.RxDatagrams.Load() + uint64(k)
	for range k {
		if err := a.qp.PostSend(&SendWR{Inline: []byte(msg), AH: ah}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the datagrams read", func() bool { return st.RxDatagrams.Load() >= want })
	rxSettled(b.sock) // and handled
}

// TestSRQSoftHardLimits: a UD QP on an SRQ with a soft and a hard limit.
// Over the soft limit its messages are still taken and one
// AsyncSRQSoftLimit names the QP and the sender; at the hard limit they
// are dropped, counted in RxSRQOverdraft, and one AsyncSRQOverdraft names
// the QP and the sender. Polling brings it back under both, so each event
// fires again at the next crossing; SetSRQLimits changes both at run time.
func TestSRQSoftHardLimits(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 64})
	b.post(64, 256)
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Soft: 2, Hard: 4}})
	st := b.dev.Stats()
	from := a.sock.LocalAddr()

	sendUD(t, a, b, q, 6, "six")
	if got := st.RxDelivered.Load(); got != 4 || st.RxSRQOverdraft.Load() != 2 || b.srq.Held() != 4 {
		t.Fatalf("delivered %d, overdraft %d, held %d", got, st.RxSRQOverdraft.Load(), b.srq.Held())
	}
	evs := drainEvents(b.dev)
	soft, over := eventsOf(evs, AsyncSRQSoftLimit), eventsOf(evs, AsyncSRQOverdraft)
	if len(soft) != 1 || soft[0].QP != q || soft[0].SRQ != b.srq || soft[0].Source != from {
		t.Fatalf("soft-limit events %v", soft)
	}
	if len(over) != 1 || over[0].QP != q || over[0].SRQ != b.srq || over[0].Source != from {
		t.Fatalf("overdraft events %v", over)
	}
	if sc := b.srq.Scoreboard(1); len(sc) != 1 || sc[0].QP != q || sc[0].Held != 4 || sc[0].Taken != 4 || sc[0].Refused != 2 {
		t.Fatalf("scoreboard %+v", sc)
	}

	// Polled: back under both; the next crossings raise them again.
	waitWC(t, b.rcq, 4)
	if b.srq.Held() != 0 {
		t.Fatalf("held %d after polling", b.srq.Held())
	}
	sendUD(t, a, b, q, 5, "five")
	evs = drainEvents(b.dev)
	if len(eventsOf(evs, AsyncSRQSoftLimit)) != 1 || len(eventsOf(evs, AsyncSRQOverdraft)) != 1 || st.RxSRQOverdraft.Load() != 3 {
		t.Fatalf("second crossing: %v, overdraft %d", evs, st.RxSRQOverdraft.Load())
	}

	// At run time: a hard limit of 6 takes two more at once (the QP holds
	// 4), a hard limit of 0 none, and 1 refuses until polled.
	if err := q.SetSRQLimits(SRQLimits{Hard: 6}); err != nil {
		t.Fatal(err)
	}
	if got := q.SRQLimits(); got != (SRQLimits{Hard: 6}) {
		t.Fatalf("SRQLimits() = %+v", got)
	}
	sendUD(t, a, b, q, 3, "raised")
	if b.srq.Held() != 6 || st.RxSRQOverdraft.Load() != 4 {
		t.Fatalf("hard 6: held %d, overdraft %d", b.srq.Held(), st.RxSRQOverdraft.Load())
	}
	q.SetSRQLimits(SRQLimits{})
	sendUD(t, a, b, q, 2, "unlimited")
	if b.srq.Held() != 8 {
		t.Fatalf("no limit: held %d", b.srq.Held())
	}
	q.SetSRQLimits(SRQLimits{Hard: 1})
	waitWC(t, b.rcq, 8)
	drainEvents(b.dev)
	sendUD(t, a, b, q, 2, "lowered")
	if b.srq.Held() != 1 || st.RxSRQOverdraft.Load() != 5 {
		t.Fatalf("hard 1: held %d, overdraft %d", b.srq.Held(), st.RxSRQOverdraft.Load())
	}
	if e := eventsOf(drainEvents(b.dev), AsyncSRQOverdraft); len(e) != 1 || e[0].QP != q {
		t.Fatalf("overdraft events after lowering: %v", e)
	}
}

// TestSRQLimitsChecked: limits a QP cannot have are refused, at creation
// and at run time, and leave the QP's limits as they were.
func TestSRQLimitsChecked(t *testing.T) {
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 8})
	for _, tc := range []struct {
		name string
		attr QPAttr
	}{
		{"negative", QPAttr{Type: UD, SRQ: b.srq, SRQLimits: SRQLimits{Soft: -1}}},
		{"soft not under hard", QPAttr{Type: UD, SRQ: b.srq, SRQLimits: SRQLimits{Soft: 4, Hard: 4}}},
		{"no SRQ", QPAttr{Type: UD, SRQLimits: SRQLimits{Hard: 4}}},
		{"peer on RC", QPAttr{Type: RC, SRQ: b.srq, SRQLimits: SRQLimits{Peer: 4}}},
		{"out of order on UD", QPAttr{Type: UD, SRQ: b.srq, SRQLimits: SRQLimits{OutOfOrder: 4}}},
		{"holes on RC", QPAttr{Type: RC, SRQ: b.srq, SRQLimits: SRQLimits{Holes: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.attr.SendCQ, tc.attr.RecvCQ = b.cq, b.rcq
			if _, err := b.pd.CreateQP(tc.attr); !errors.Is(err, ErrInvalidAttr) {
				t.Fatalf("CreateQP: %v", err)
			}
		})
	}
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimit: 3})
	if got := q.SRQLimits(); got != (SRQLimits{Hard: 3}) {
		t.Fatalf("QPAttr.SRQLimit is the hard limit: %+v", got)
	}
	for _, l := range []SRQLimits{{Soft: 5, Hard: 2}, {Peer: 2}, {Holes: 2}} {
		if err := q.SetSRQLimits(l); !errors.Is(err, ErrInvalidAttr) {
			t.Errorf("SetSRQLimits(%+v): %v", l, err)
		}
	}
	if got := q.SRQLimits(); got != (SRQLimits{Hard: 3}) {
		t.Fatalf("a refused SetSRQLimits changed them: %+v", got)
	}
	if err := b.qp.SetSRQLimits(SRQLimits{}); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("SetSRQLimits on a QP without an SRQ: %v", err)
	}
	for _, attr := range []SRQAttr{
		{Depth: 0, MaxSGE: 1},
		{MaxSGE: 1, Classes: []SRQClass{{Size: 100, Depth: 4}, {Size: 100, Depth: 4}}},
		{MaxSGE: 1, Classes: []SRQClass{{Size: 100, Depth: 0}}},
		{Depth: 9, MaxSGE: 1, Classes: []SRQClass{{Size: 100, Depth: 4}, {Size: 200, Depth: 4}}},
		{Depth: 4, MaxSGE: 1, MaxHeld: -1},
	} {
		if _, err := b.pd.CreateSRQEx(attr); !errors.Is(err, ErrInvalidAttr) {
			t.Errorf("CreateSRQEx(%+v): %v", attr, err)
		}
	}
	if err := b.srq.Modify(SRQModify{Mask: SRQModifyWatermark, Watermark: 9}); !errors.Is(err, ErrInvalidAttr) {
		t.Errorf("a watermark over the depth: %v", err)
	}
}

// floodUntil has from send bursts of small Sends to q through ah until
// stop closes, never more than 32 ahead of what the receiving device has
// read (rx), so that the kernel's socket buffer never overflows, however
// the goroutines are scheduled: what the test counts is the stack's
// doing.
func floodUntil(from *QP, ah *AH, rx *Stats, stop <-chan struct{}) <-chan int {
	done := make(chan int, 1)
	base := rx.RxDatagrams.Load()
	go func() {
		sent := 0
		for {
			select {
			case <-stop:
				done <- sent
				return
			default:
			}
			if uint64(sent) < rx.RxDatagrams.Load()-base+24 {
				for range 8 {
					if from.PostSend(&SendWR{Inline: []byte("flood"), AH: ah}) == nil {
						sent++
					}
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return done
}

// peerFlood runs a good peer and a flooder (distinct 127.0.0.x addresses)
// against one QP of b's with a per-peer limit of 3, the application
// polling slowly (every 5 ms) and posting back what it polled. The good
// peer sends its next message once the previous one arrived, 20 in all;
// each must arrive while the flooder holds all it may. It returns how
// many messages of each arrived.
func peerFlood(t *testing.T, b *srqNode, q *QP, good, flood *QP, ahGood, ahFlood *AH) (fromGood, fromFlood int) {
	t.Helper()
	stop := make(chan struct{})
	flooded := floodUntil(flood, ahFlood, b.dev.Stats(), stop)
	defer func() {
		close(stop)
		<-flooded
	}()
	wcs := make([]WorkCompletion, 64)
	poll := func() {
		time.Sleep(5 * time.Millisecond)
		for {
			n := b.rcq.Poll(wcs)
			if n == 0 {
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Status != Success {
					t.Fatalf("a receive completed %v", wc.Status)
				}
				switch string(b.buf[wc.ID*256%uint64(len(b.buf)):][:wc.Len]) {
				case "good":
					fromGood++
				case "flood":
					fromFlood++
				}
				b.post(1, 256)
			}
		}
	}
	for i := range 20 {
		if err := good.PostSend(&SendWR{Inline: []byte("good"), AH: ahGood}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); fromGood <= i; {
			if time.Now().After(deadline) {
				t.Fatalf("the good peer's message %d never arrived (flooder's: %d)", i, fromFlood)
			}
			poll()
		}
	}
	return fromGood, fromFlood
}

// TestSRQPeerFloodUD: a flooding peer on a shared UD QP does not starve a
// good peer. Two peers send to one QP on an SRQ with a per-peer limit of
// 3 while the application polls slowly: every one of the good peer's
// messages arrives, the flooder's beyond its limit are dropped and
// counted (RxSRQPeerLimit), AsyncSRQPeerLimit names the QP and the
// flooder, and the scoreboard shows the flooder at its limit. Without the
// per-peer limit (the QP's hard limit alone) the flooder holds all the
// QP may hold and the good peer's messages are dropped.
func TestSRQPeerFloodUD(t *testing.T) {
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 32})
	b.post(32, 256)
	good := newNode(t, DeviceConfig{}, "udp4", "127.0.0.2:0")
	flood := newNode(t, DeviceConfig{}, "udp4", "127.0.0.3:0")
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Hard: 8, Peer: 3}})
	fromGood, fromFlood := peerFlood(t, b, q, good.qp, flood.qp, good.ah(b.node, q), flood.ah(b.node, q))
	st := b.dev.Stats()
	if fromGood != 20 || st.RxSRQPeerLimit.Load() == 0 || st.RxSRQOverdraft.Load() != 0 {
		t.Fatalf("good %d, flooder %d, peer-limited %d, overdraft %d", fromGood, fromFlood, st.RxSRQPeerLimit.Load(), st.RxSRQOverdraft.Load())
	}
	ev := eventsOf(drainEvents(b.dev), AsyncSRQPeerLimit)
	if len(ev) == 0 {
		t.Fatal("no AsyncSRQPeerLimit")
	}
	for _, e := range ev {
		if e.QP != q || e.Source.Addr() != netip.MustParseAddr("127.0.0.3") {
			t.Fatalf("peer-limit event %v", e)
		}
	}
	// The application stops polling: the flooder holds its 3, the first
	// line of the scoreboard.
	sendUD(t, flood, b, q, 5, "flood")
	if sc := b.srq.Scoreboard(2); len(sc) != 1 || len(sc[0].Peers) == 0 || sc[0].Peers[0] != (SRQPeerScore{Addr: netip.MustParseAddr("127.0.0.3"), Held: 3}) {
		t.Fatalf("scoreboard %+v", sc)
	}
}

// TestSRQPeerFloodRD: the same over RD. The flooder's Sends beyond its
// limit are refused as receiver-not-ready (counted in RxSRQPeerLimit);
// its sender backs off and sends them again, so the flood costs the good
// peer nothing.
func TestSRQPeerFloodRD(t *testing.T) {
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 32})
	b.post(32, 256)
	good := newNode(t, DeviceConfig{}, "udp4", "127.0.0.2:0")
	flood := newNode(t, DeviceConfig{}, "udp4", "127.0.0.3:0")
	q := b.newQP(QPAttr{Type: RD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Hard: 8, Peer: 3}})
	rdCfg := RDConfig{Config: reliability.Config{RNRRetries: -1}}
	gq, _ := rdQPOn(t, good, rdCfg)
	fq, _ := rdQPOn(t, flood, rdCfg)
	fromGood, fromFlood := peerFlood(t, b, q, gq, fq, good.ah(b.node, q), flood.ah(b.node, q))
	st := b.dev.Stats()
	if fromGood != 20 || st.RxSRQPeerLimit.Load() == 0 || st.RxSRQOverdraft.Load() != 0 {
		t.Fatalf("good %d, flooder %d, peer-limited %d, overdraft %d", fromGood, fromFlood, st.RxSRQPeerLimit.Load(), st.RxSRQOverdraft.Load())
	}
	ev := eventsOf(drainEvents(b.dev), AsyncSRQPeerLimit)
	if len(ev) == 0 || ev[0].QP != q || ev[0].Source.Addr() != netip.MustParseAddr("127.0.0.3") {
		t.Fatalf("peer-limit events %v", ev)
	}
}

// TestSRQPeerSpoofedSources: per-peer accounting stays bounded whatever
// the number of sources. 100,000 Sends from as many forged 127.x.y.z
// sources reach a UD QP with a per-peer limit: the QP keeps a count only
// for the addresses that hold receives — never more than the receives it
// holds (its hard limit here) — refuses the rest at its hard limit, and
// forgets every address once the application polled.
func TestSRQPeerSpoofedSources(t *testing.T) {
	sp := spoof.NewT(t)
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 256})
	b.post(256, 256)
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Hard: 64, Peer: 1}})
	st := b.dev.Stats()
	dst := b.sock.LocalAddr()
	frame := udiwarpSend(q.QPN(), 7, []byte("spoofed"))
	sent := st.RxDatagrams.Load()
	shot := func(i int) {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(1 + i/(254*254)), byte(1 + i/254%254), byte(1 + i%254)}), 4791)
		if err := sp.Send(src, dst, frame); err != nil {
			t.Fatal(err)
		}
		sent++
		if sent%128 == 0 { // paced: the socket buffer drops nothing
			eventually(t, "the spoofed datagrams read", func() bool { return st.RxDatagrams.Load() >= sent })
		}
	}
	const sources = 100_000
	maxPeers := 0
	for i := range sources {
		shot(i)
		if i%1000 == 0 {
			q.srqa.peerMu.Lock()
			maxPeers = max(maxPeers, len(q.srqa.peers))
			q.srqa.peerMu.Unlock()
		}
	}
	shot(0) // the first source again: at its per-peer limit
	eventually(t, "the spoofed datagrams read", func() bool { return st.RxDatagrams.Load() >= sent })
	rxSettled(b.sock)
	q.srqa.peerMu.Lock()
	peers := len(q.srqa.peers)
	q.srqa.peerMu.Unlock()
	// An address is counted from when its message asks for a receive
	// until that is refused: one more than the receives held, on the way.
	if peers != 64 || maxPeers > 65 || b.srq.Held() != 64 {
		t.Fatalf("%d addresses counted (at most %d on the way) for %d receives held", peers, maxPeers, b.srq.Held())
	}
	if st.RxSRQOverdraft.Load() != sources-64 || st.RxSRQPeerLimit.Load() != 1 || st.RxDelivered.Load() != 64 {
		t.Fatalf("overdraft %d, peer-limited %d, delivered %d", st.RxSRQOverdraft.Load(), st.RxSRQPeerLimit.Load(), st.RxDelivered.Load())
	}
	waitWC(t, b.rcq, 64)
	q.srqa.peerMu.Lock()
	peers = len(q.srqa.peers)
	q.srqa.peerMu.Unlock()
	if peers != 0 || b.srq.Held() != 0 {
		t.Fatalf("after polling: %d addresses counted, %d receives held", peers, b.srq.Held())
	}
}

// TestSRQTotalLimit: the QPs of an SRQ with a total limit hold no more
// than it together; a message over it is dropped, counted in
// RxSRQTotalLimit, and one AsyncSRQTotalLimit names the SRQ (and the QP
// whose message it was) until they are back under. Modify changes the
// limit at run time.
func TestSRQTotalLimit(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 32, MaxHeld: 5})
	b.post(32, 256)
	q1 := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq})
	q2 := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq})
	st := b.dev.Stats()
	sendUD(t, a, b, q1, 4, "one")
	sendUD(t, a, b, q2, 3, "two")
	if b.srq.Held() != 5 || st.RxSRQTotalLimit.Load() != 2 {
		t.Fatalf("held %d, total-limited %d", b.srq.Held(), st.RxSRQTotalLimit.Load())
	}
	ev := eventsOf(drainEvents(b.dev), AsyncSRQTotalLimit)
	if len(ev) != 1 || ev[0].SRQ != b.srq || ev[0].QP != q2 || ev[0].Source != a.sock.LocalAddr() {
		t.Fatalf("total-limit events %v", ev)
	}
	sc := b.srq.Scoreboard(0)
	if len(sc) != 2 || sc[0].QP != q1 || sc[0].Held != 4 || sc[1].QP != q2 || sc[1].Held != 1 || sc[1].Refused != 2 {
		t.Fatalf("scoreboard %+v", sc)
	}
	if err := b.srq.Modify(SRQModify{Mask: SRQModifyMaxHeld, MaxHeld: 7}); err != nil {
		t.Fatal(err)
	}
	sendUD(t, a, b, q2, 3, "two")
	if b.srq.Held() != 7 || st.RxSRQTotalLimit.Load() != 3 {
		t.Fatalf("limit 7: held %d, total-limited %d", b.srq.Held(), st.RxSRQTotalLimit.Load())
	}
	if ev := eventsOf(drainEvents(b.dev), AsyncSRQTotalLimit); len(ev) != 1 {
		t.Fatalf("raising the limit ends the crossing: %v", ev)
	}
	b.srq.Modify(SRQModify{Mask: SRQModifyMaxHeld})
	sendUD(t, a, b, q1, 3, "one")
	if b.srq.Held() != 10 || st.RxSRQTotalLimit.Load() != 3 {
		t.Fatalf("no limit: held %d, total-limited %d", b.srq.Held(), st.RxSRQTotalLimit.Load())
	}
	waitWC(t, b.rcq, 10)
	if b.srq.Held() != 0 || b.dev.Levels().SRQHeld != 0 {
		t.Fatalf("held %d after polling", b.srq.Held())
	}
}

// srqRC is an RC connection from a's QP to a QP of b's on b's SRQ, with
// limits l.
func srqRC(t *testing.T, l SRQLimits, depth int) (a, b *rcSide, srq *SRQ) {
	t.Helper()
	a, b = newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	srq, err := b.pd.CreateSRQ(depth, 1)
	if err != nil {
		t.Fatal(err)
	}
	q, err := b.pd.CreateQP(QPAttr{Type: RC, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, SRQLimits: l, Caps: QPCaps{MaxSendWR: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(ModifyAttr{State: StateInit}); err != nil {
		t.Fatal(err)
	}
	b.q = q
	rcConnect(t, a, b, RCConfig{}, RCConfig{})
	return a, b, srq
}

// TestSRQEventsRC: the low watermark and the hard limit on an RC QP. The
// watermark fires when a Send takes the SRQ under it; at its hard limit
// the QP refuses the next Send as RC must — no buffer: a Terminate, the
// QP to ERROR — counted in RxSRQOverdraft, with AsyncSRQOverdraft naming
// it.
func TestSRQEventsRC(t *testing.T) {
	a, b, srq := srqRC(t, SRQLimits{Hard: 1}, 8)
	for i := range 4 {
		mustPost(t, srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}))
	}
	if err := srq.Arm(4); err != nil {
		t.Fatal(err)
	}
	if err := a.q.PostSend(&SendWR{ID: 1, Inline: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, b.dev, AsyncSRQLimit); e.SRQ != srq || e.QP != b.q {
		t.Fatalf("watermark event %v", e)
	}
	eventually(t, "the first Send delivered", func() bool { return b.dev.Stats().RxDelivered.Load() == 1 })
	mustPost(t, a.q.PostSend(&SendWR{ID: 2, Inline: []byte("second")}))
	e := nextEvent(t, b.dev, AsyncSRQOverdraft)
	if e.QP != b.q || e.SRQ != srq {
		t.Fatalf("overdraft event %v", e)
	}
	waitState(t, b.q, StateError)
	if got := b.dev.Stats().RxSRQOverdraft.Load(); got != 1 {
		t.Fatalf("RxSRQOverdraft %d", got)
	}
	waitWC(t, b.cq, 1)
	if srq.Held() != 0 {
		t.Fatalf("held %d after polling", srq.Held())
	}
}

// TestSRQEventsRD: the low watermark and the hard limit on an RD QP. At
// its hard limit a Send is not acknowledged (receiver not ready, counted
// in RDNotReady and RxSRQOverdraft, AsyncSRQOverdraft naming the QP and
// the sender); the sender sends it again, and once the application polled
// every Send arrives and completes Success.
func TestSRQEventsRD(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 8})
	b.post(8, 256)
	if err := b.srq.Arm(7); err != nil {
		t.Fatal(err)
	}
	q := b.newQP(QPAttr{Type: RD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Hard: 2}})
	aq, acq := rdQPOn(t, a, RDConfig{Config: reliability.Config{RNRRetries: -1}})
	ah := a.ah(b.node, q)
	for i := range 4 {
		if err := aq.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, Inline: []byte("rd"), AH: ah}); err != nil {
			t.Fatal(err)
		}
	}
	if e := nextEvent(t, b.dev, AsyncSRQLimit); e.SRQ != b.srq || e.QP != q {
		t.Fatalf("watermark event %v", e)
	}
	e := nextEvent(t, b.dev, AsyncSRQOverdraft)
	if e.QP != q || e.Source != a.sock.LocalAddr() {
		t.Fatalf("overdraft event %v", e)
	}
	st := b.dev.Stats()
	eventually(t, "the refusal counted as receiver-not-ready", func() bool { return st.RDNotReady.Load() > 0 })
	got := waitWC(t, b.rcq, 2)
	got = append(got, waitWC(t, b.rcq, 2)...)
	for i, wc := range got {
		if wc.Status != Success || wc.QPN != q.QPN() || wc.MSN != uint32(i+1) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	for i, wc := range collect(t, acq, 4, 10*time.Second) {
		if wc.Status != Success || wc.ID != uint64(i) {
			t.Fatalf("send %d: %+v", i, wc)
		}
	}
}

// TestSRQSizeClasses: an SRQ with classes of 64, 1024 and 8192 bytes.
// A receive goes into the largest class its room reaches; a message takes
// the smallest receive that holds it: of the smallest class of its size,
// a larger class when that one is empty, the front of the class below
// when its room holds it, and the largest when it is longer than every
// class (too long for it: LocalLengthError, as on a plain SRQ).
func TestSRQSizeClasses(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Classes: []SRQClass{{64, 4}, {1024, 4}, {8192, 2}}})
	post := func(id uint64, off, size int) {
		t.Helper()
		if err := b.srq.PostRecv(&RecvWR{ID: id, SGL: []SGE{b.mr.SGE(off, size)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		post(uint64(i), i*64, 64)
		post(uint64(100+i), 1024+i*1024, 1024)
		post(uint64(200+i), 8192+i*8192, 8192)
	}
	post(102, 4096, 2000) // room 2000: the 1024 class
	if err := b.srq.PostRecv(&RecvWR{SGL: []SGE{b.mr.SGE(0, 32)}}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("a receive under the smallest class: %v", err)
	}
	if b.srq.ClassLen(0) != 2 || b.srq.ClassLen(1) != 3 || b.srq.ClassLen(2) != 2 || b.srq.Len() != 7 {
		t.Fatalf("classes hold %d %d %d", b.srq.ClassLen(0), b.srq.ClassLen(1), b.srq.ClassLen(2))
	}
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq})
	ah := a.ah(b.node, q)
	for i, tc := range []struct {
		size int
		want uint64 // the receive it takes
		st   Status
	}{
		{10, 0, Success}, {64, 1, Success}, {500, 100, Success}, {8, 101, Success}, // class 0 empty: the next up
		{5000, 200, Success},               // class 1's front (100 bytes) is too small
		{1025, 102, Success},               // class 1's front (2000 bytes) holds it: smaller than class 2's
		{1500, 201, Success}, {9000, 0, 0}, // every class empty: dropped
	} {
		before := b.dev.Stats().RxNoRecv.Load()
		if err := a.qp.PostSend(&SendWR{SGL: []SGE{a.mr.SGE(0, tc.size)}, AH: ah}); err != nil {
			t.Fatal(err)
		}
		if tc.want == 0 && tc.size == 9000 {
			eventually(t, "the message dropped", func() bool { return b.dev.Stats().RxNoRecv.Load() == before+1 })
			continue
		}
		if wc := waitWC(t, b.rcq, 1)[0]; wc.ID != tc.want || wc.Status != tc.st || wc.Len != uint32(tc.size) {
			t.Fatalf("message %d (%d bytes): %+v, want receive %d", i, tc.size, wc, tc.want)
		}
	}
	// Longer than every class: the largest class, too small for it.
	post(202, 16384, 8192)
	mustPost(t, a.qp.PostSend(&SendWR{SGL: []SGE{a.mr.SGE(0, 9000)}, AH: ah}))
	if wc := waitWC(t, b.rcq, 1)[0]; wc.ID != 202 || wc.Status != LocalLengthError {
		t.Fatalf("a message longer than every class: %+v", wc)
	}
}

// srqRCServer listens on b for one raw MPA initiator and accepts it onto
// a QP on srq with limits l.
func srqRCServer(t *testing.T, b *rcSide, srq *SRQ, l SRQLimits) (*rawMPA, *QP) {
	t.Helper()
	ln, err := b.dev.ListenRC("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan *QP, 1)
	go func() {
		r, err := ln.Next(t.Context())
		if err != nil {
			accepted <- nil
			return
		}
		q, err := b.pd.CreateQP(QPAttr{Type: RC, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, SRQLimits: l})
		if err != nil {
			accepted <- nil
			return
		}
		q.Modify(ModifyAttr{State: StateInit})
		if r.Accept(q, RCConfig{}) != nil {
			q = nil
		}
		accepted <- q
	}()
	raw := dialRawMPA(t, ln.Addr().String(), 2)
	q := <-accepted
	if q == nil {
		t.Fatal("not accepted")
	}
	return raw, q
}

// sendFPDU sends one untagged Send FPDU of a message: msn, mo, last.
func (r *rawMPA) sendFPDU(msn, mo uint32, last bool, payload []byte) {
	r.send(udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: last, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend),
		QN: 0, MSN: msn, MO: mo}), payload)
}

// TestSRQSizeClassesRC: an RC Send of one FPDU knows its length and takes
// the smallest class that holds it; one of several FPDUs does not know it
// when its first FPDU takes a receive, so it takes the largest class.
func TestSRQSizeClassesRC(t *testing.T) {
	b := newRCSide(t, DeviceConfig{})
	srq, err := b.pd.CreateSRQEx(SRQAttr{MaxSGE: 1, Classes: []SRQClass{{64, 2}, {4096, 2}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		mustPost(t, srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}))
		mustPost(t, srq.PostRecv(&RecvWR{ID: uint64(100 + i), SGL: []SGE{b.mr.SGE(4096+i*4096, 4096)}}))
	}
	raw, _ := srqRCServer(t, b, srq, SRQLimits{})
	raw.sendFPDU(1, 0, true, []byte("small"))
	if wc := waitWC(t, b.cq, 1)[0]; wc.ID != 0 || wc.Status != Success || wc.Len != 5 {
		t.Fatalf("one small FPDU: %+v", wc)
	}
	raw.sendFPDU(2, 0, false, []byte("two "))
	raw.sendFPDU(2, 4, true, []byte("FPDUs"))
	if wc := waitWC(t, b.cq, 1)[0]; wc.ID != 100 || wc.Status != Success || wc.Len != 9 {
		t.Fatalf("a Send of two FPDUs: %+v", wc)
	}
}

// TestRCFlushesSendInProgress: an RC QP whose connection ends between
// the FPDUs of a Send completes the receive that Send took with
// WRFlushError, so the application gets its buffer back and the SRQ its
// count. Before, the receive was lost: no completion, and the SRQ counted
// it held for good (a QP at its hard limit stayed there).
func TestRCFlushesSendInProgress(t *testing.T) {
	for _, how := range []string{"connection lost", "bad MO", "QP destroyed"} {
		t.Run(how, func(t *testing.T) {
			b := newRCSide(t, DeviceConfig{})
			srq, err := b.pd.CreateSRQ(4, 1)
			if err != nil {
				t.Fatal(err)
			}
			mustPost(t, srq.PostRecv(&RecvWR{ID: 7, SGL: []SGE{b.mr.SGE(0, 4096)}}))
			raw, q := srqRCServer(t, b, srq, SRQLimits{Hard: 1})
			raw.sendFPDU(1, 0, false, []byte("the first half"))
			eventually(t, "the receive taken", func() bool { return srq.Held() == 1 })
			switch how {
			case "connection lost":
				raw.c.Close()
			case "bad MO":
				raw.sendFPDU(1, 99, true, []byte("out of place"))
			case "QP destroyed":
				q.Destroy()
			}
			wc := waitWC(t, b.cq, 1)[0]
			if wc.ID != 7 || wc.Status != WRFlushError {
				t.Fatalf("%+v", wc)
			}
			if srq.Held() != 0 || q.srqHeld.Load() != 0 {
				t.Fatalf("held %d after polling", srq.Held())
			}
		})
	}
}

// TestSRQReserveRecoup: a QP's reservation keeps receives for it while
// another QP takes all it can; once the reserving QP has been idle for
// the SRQ's recoup time, the next QP that needs a receive recoups them
// (Stats.SRQRecouped), and the reserving QP's next message takes its
// reservation up again.
func TestSRQReserveRecoup(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 8, Recoup: time.Hour})
	b.post(8, 256)
	quiet := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Reserve: 3}})
	busy := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq})
	st := b.dev.Stats()
	line := func(q *QP) SRQScore {
		for _, sc := range b.srq.Scoreboard(0) {
			if sc.QP == q {
				return sc
			}
		}
		t.Fatalf("no scoreboard line for QP %d", q.QPN())
		return SRQScore{}
	}
	sendUD(t, a, b, busy, 7, "busy") // 5 taken; 3 of 8 are kept for quiet
	if line(busy).Held != 5 || st.RxNoRecv.Load() != 2 || line(quiet).Reserved != 3 {
		t.Fatalf("busy holds %d, dropped %d, quiet's reservation %d", line(busy).Held, st.RxNoRecv.Load(), line(quiet).Reserved)
	}
	sendUD(t, a, b, quiet, 1, "quiet") // from its reservation
	if sc := line(quiet); sc.Held != 1 || sc.Reserved != 2 || b.srq.Len() != 2 {
		t.Fatalf("quiet %+v, %d posted", sc, b.srq.Len())
	}
	// Idle past the recoup time: busy's next messages recoup quiet's two.
	if err := b.srq.Modify(SRQModify{Mask: SRQModifyRecoup, Recoup: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	sendUD(t, a, b, busy, 2, "busy")
	if line(busy).Held != 7 || line(quiet).Reserved != 0 || st.SRQRecouped.Load() != 2 || st.RxNoRecv.Load() != 2 {
		t.Fatalf("busy holds %d, quiet's reservation %d, recouped %d", line(busy).Held, line(quiet).Reserved, st.SRQRecouped.Load())
	}
	// Polled and posted back: quiet's reservation stays recouped until its
	// next message takes it up again (3 less the 1 it holds).
	b.srq.Modify(SRQModify{Mask: SRQModifyRecoup, Recoup: time.Hour})
	for range len(waitWC(t, b.rcq, 8)) {
		b.post(1, 256)
	}
	if sc := line(quiet); sc.Held != 0 || sc.Reserved != 0 {
		t.Fatalf("quiet recouped, polled: %+v", sc)
	}
	sendUD(t, a, b, quiet, 1, "quiet")
	if sc := line(quiet); sc.Held != 1 || sc.Reserved != 2 {
		t.Fatalf("quiet after its next message: %+v", sc)
	}
}

// TestSRQRecoupDestroyed: what a destroyed QP or one in ERROR held of
// its SRQ goes back: its reservation at once, the receives its messages
// took when the application polls their completions, and a destroyed QP
// leaves the scoreboard.
func TestSRQRecoupDestroyed(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 8, Recoup: time.Hour})
	b.post(8, 256)
	gone := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Reserve: 4, Peer: 8}})
	failed := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Reserve: 2}})
	other := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq})
	sendUD(t, a, b, gone, 3, "gone")
	sendUD(t, a, b, failed, 1, "failed")
	sendUD(t, a, b, other, 3, "other") // 8 - 4 posted, 1 + 1 reserved: 2 taken
	if b.srq.Held() != 6 || b.dev.Stats().RxNoRecv.Load() != 1 {
		t.Fatalf("held %d, dropped %d", b.srq.Held(), b.dev.Stats().RxNoRecv.Load())
	}
	if err := gone.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := failed.Modify(ModifyAttr{State: StateError}); err != nil {
		t.Fatal(err)
	}
	sendUD(t, a, b, other, 2, "other") // their reservations are back
	if b.srq.Held() != 8 {
		t.Fatalf("held %d: the reservations were not given back", b.srq.Held())
	}
	for _, sc := range b.srq.Scoreboard(0) {
		if sc.QP == gone {
			t.Fatal("a destroyed QP on the scoreboard")
		}
	}
	waitWC(t, b.rcq, 8)
	if b.srq.Held() != 0 || gone.srqHeld.Load() != 0 || len(gone.srqa.peers) != 0 {
		t.Fatalf("after polling: SRQ holds %d, the destroyed QP %d (%d addresses)", b.srq.Held(), gone.srqHeld.Load(), len(gone.srqa.peers))
	}
}

// TestSRQOutOfOrderRD: an RD QP on an SRQ with an out-of-order threshold
// (or a hole limit) under 10 % loss. Frames held ahead of a gap past the
// threshold, or spanning more gaps than the limit, are dropped (counted
// in RxSRQOutOfOrder, AsyncSRQOutOfOrder naming the QP and the peer), and
// reliability holds: every Send arrives once and in order, and every WR
// at the sender completes Success only because it was delivered.
func TestSRQOutOfOrderRD(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    SRQLimits
	}{
		{"threshold", SRQLimits{OutOfOrder: 2}},
		{"holes", SRQLimits{Holes: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t, DeviceConfig{Impair: &Impairment{Seed: 4, Loss: 0.1}}, "udp4", "127.0.0.1:0")
			b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 512})
			b.post(512, 256)
			q := b.newQP(QPAttr{Type: RD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: tc.l})
			aq, acq := rdQPOn(t, a, RDConfig{})
			ah := a.ah(b.node, q)
			const n = 300
			for i := range n {
				fill(a.buf[i*8:i*8+8], i)
				if err := aq.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(i*8, 8)}, AH: ah}); err != nil {
					t.Fatal(err)
				}
			}
			for i, wc := range collect(t, b.rcq, n, time.Minute) {
				want := make([]byte, 8)
				fill(want, i)
				if wc.Status != Success || wc.MSN != uint32(i+1) || string(b.buf[wc.ID*256:][:8]) != string(want) {
					t.Fatalf("receive %d: %+v", i, wc)
				}
			}
			for i, wc := range collect(t, acq, n, time.Minute) {
				if wc.Status != Success || wc.ID != uint64(i) {
					t.Fatalf("send %d: %+v", i, wc)
				}
			}
			quietDrained(t, b.rcq, a, b.node) // nothing delivered twice
			st := b.dev.Stats()
			ev := eventsOf(drainEvents(b.dev), AsyncSRQOutOfOrder)
			if st.RxSRQOutOfOrder.Load() == 0 || len(ev) == 0 || ev[0].QP != q || ev[0].Source != a.sock.LocalAddr() {
				t.Fatalf("%d out-of-order drops, events %v", st.RxSRQOutOfOrder.Load(), ev)
			}
			if sc := b.srq.Scoreboard(1); len(sc) != 1 || sc[0].OutOfOrderDropped != st.RxSRQOutOfOrder.Load() || sc[0].OutOfOrder != 0 {
				t.Fatalf("scoreboard %+v", sc)
			}
			t.Logf("%d frames dropped out of order, %d retransmissions", st.RxSRQOutOfOrder.Load(), a.dev.Stats().RDRetransmits.Load())
		})
	}
}

// TestSRQTakeAllocs: taking a receive of a size-classed SRQ for a QP with
// every limit set, per-address counts and a reservation, and giving it
// back as CQ.Poll does, allocates nothing once the QP's map has seen its
// addresses.
func TestSRQTakeAllocs(t *testing.T) {
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Classes: []SRQClass{{64, 8}, {1024, 8}}, MaxHeld: 100})
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq,
		SRQLimits: SRQLimits{Soft: 10, Hard: 20, Peer: 5, Reserve: 2}})
	for i := range 8 {
		mustPost(t, b.srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}))
		mustPost(t, b.srq.PostRecv(&RecvWR{ID: uint64(100 + i), SGL: []SGE{b.mr.SGE(4096+i*1024, 1024)}}))
	}
	srcs := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.2:1"), netip.MustParseAddrPort("127.0.0.3:1")}
	var w recvWQE
	cycle := func() {
		for i, src := range srcs {
			if q.takeRecv(&w, 10+i*500, src) != recvTaken {
				t.Fatal("no receive taken")
			}
			wc := WorkCompletion{ID: w.id, Source: src}
			q.releaseRecv(&wc)
			if err := b.srq.PostRecv(&RecvWR{ID: w.id, SGL: w.sge[:w.nsge]}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cycle()
	if n := testing.AllocsPerRun(1000, cycle); n != 0 {
		t.Fatalf("%v allocations per take and give back", n)
	}
}

// TestSRQPeerEventsShareRemoteRoom: the SRQ events a peer's traffic draws
// for its address (AsyncSRQPeerLimit, AsyncSRQOutOfOrder) are coalesced
// per (QP, address) and take no more of the Events queue than error
// messages from peers may, so sources without number cannot crowd out
// the device's own events.
func TestSRQPeerEventsShareRemoteRoom(t *testing.T) {
	b := newSRQNode(t, "127.0.0.1:0", SRQAttr{Depth: 8})
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.rcq, SRQ: b.srq, SRQLimits: SRQLimits{Peer: 1}})
	for i := range eventQueueLen {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)}), 9)
		typ := AsyncSRQPeerLimit
		if i%2 == 1 {
			typ = AsyncSRQOutOfOrder
		}
		b.dev.raise(AsyncEvent{Type: typ, QP: q, SRQ: b.srq, Source: src})
		b.dev.raise(AsyncEvent{Type: typ, QP: q, SRQ: b.srq, Source: src}) // coalesced
	}
	b.dev.raise(AsyncEvent{Type: AsyncSRQOverdraft, QP: q, SRQ: b.srq})
	evs := drainEvents(b.dev)
	peer := len(evs) - len(eventsOf(evs, AsyncSRQOverdraft))
	if peer != eventQueueLen-eventLocalReserve || len(eventsOf(evs, AsyncSRQOverdraft)) != 1 {
		t.Fatalf("%d peer-drawn events queued, %d overdraft", peer, len(eventsOf(evs, AsyncSRQOverdraft)))
	}
	if got := b.dev.Stats().RemoteEventsDropped.Load(); got != uint64(2*eventQueueLen-peer) {
		t.Fatalf("%d dropped", got)
	}
}

// TestRDSendTakesClassByLength: an RD Send of several segments takes a
// receive of a size-classed SRQ's largest class (its length is not known
// until its last segment), not one its first segment alone would fit,
// which left it a LocalLengthError (found by the libfabric provider,
// whose 1 MiB messages took a 64 KiB receive); a one-segment Send still
// takes the smallest that holds it.
func TestRDSendTakesClassByLength(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{})
	// The small class holds one datagram's segment: a receive the first
	// segment of a larger Send would fit.
	small := b.sock.rdMaxSend() + 100
	srq, err := b.pd.CreateSRQEx(SRQAttr{MaxSGE: 1, Classes: []SRQClass{{Size: small, Depth: 2}, {Size: 256 << 10, Depth: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	cqb, err := b.dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	qb := b.newQP(QPAttr{Type: RD, SendCQ: cqb, RecvCQ: cqb, SRQ: srq})
	rx, err := b.pd.RegisterMemory(make([]byte, 2*small+2*(256<<10)), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		mustPost(t, srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{rx.SGE(i*small, small)}}))
		mustPost(t, srq.PostRecv(&RecvWR{ID: uint64(100 + i), SGL: []SGE{rx.SGE(2*small+i*(256<<10), 256<<10)}}))
	}
	const big = 200000 // several datagrams
	msg := make([]byte, big)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	ah := a.ah(b, qb)
	tx, err := a.pd.RegisterMemory(msg, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustPost(t, qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, SGL: []SGE{tx.SGE(0, 1000)}, AH: ah}))
	mustPost(t, qa.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, SGL: []SGE{tx.SGE(0, big)}, AH: ah}))
	for _, wc := range collect(t, cqa, 2, 10*time.Second) {
		if wc.Status != Success {
			t.Fatalf("send %+v", wc)
		}
	}
	wcs := collect(t, cqb, 2, 10*time.Second)
	if wcs[0].Status != Success || wcs[0].ID != 0 || wcs[0].Len != 1000 {
		t.Errorf("the one-segment Send: %+v (want a small receive, ID 0)", wcs[0])
	}
	if wcs[1].Status != Success || wcs[1].ID != 100 || wcs[1].Len != big {
		t.Fatalf("the %d-byte Send: %+v (want the 256 KiB receive 100)", big, wcs[1])
	}
	if got := rx.Bytes()[2*small : 2*small+big]; !bytes.Equal(got, msg) {
		t.Error("the large Send's bytes differ")
	}
}
