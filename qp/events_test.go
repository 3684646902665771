package qp

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// spoofedTerminate is a datagram error message about a Send, addressed to
// QP dst.
func spoofedTerminate(dst, msn uint32) []byte {
	echo := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: dst, QN: udiwarp.DatagramQN(7, udiwarp.QueueSend), MSN: msn})
	b := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpTerminate), ULP: 7, QN: udiwarp.DatagramQN(dst, udiwarp.QueueTerminate), MSN: msn})
	b, _ = udiwarp.AppendTerminate(b, &udiwarp.TerminateFields{Code: udiwarp.DDPUntaggedNoBuffer, SegmentLengthValid: true,
		DDPSegmentLength: 40, DDPHeader: echo})
	return udiwarp.SealDatagram(b, 0)
}

// TestLocalEventsSurviveRemoteFlood floods a device with forged error
// messages from more sources than its event queue holds, and many from one
// source, nobody reading the events; then a CQ of the device overflows.
// The overflow's event is delivered: remote events never take the room
// local ones need, and what was not queued is counted.
func TestLocalEventsSurviveRemoteFlood(t *testing.T) {
	sp := spoof.NewT(t)
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	const sources, repeats = 300, 50 // more than the queue holds; fewer than the loopback backlog (1000)
	dst := b.sock.LocalAddr()
	for i := range sources {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 88, byte(i >> 8), byte(i)}), 4000)
		if err := sp.Send(src, dst, spoofedTerminate(b.qp.QPN(), uint32(i))); err != nil {
			t.Fatal(err)
		}
	}
	one := netip.MustParseAddrPort("127.88.200.1:4000")
	for i := range repeats {
		if err := sp.Send(one, dst, spoofedTerminate(b.qp.QPN(), uint32(i))); err != nil {
			t.Fatal(err)
		}
	}
	st := b.dev.Stats()
	// Forged datagrams on loopback are not lost (the socket's buffer holds
	// them all), so every one is handled.
	eventually(t, "the error messages to be handled", func() bool { return st.RxRemoteErrors.Load() >= sources+repeats })

	// A real local event: a CQ of one entry overflows.
	small, err := b.dev.CreateCQ(1)
	if err != nil {
		t.Fatal(err)
	}
	q := b.newQP(QPAttr{Type: UD, SendCQ: small, RecvCQ: b.cq})
	ah := b.ah(a, a.qp)
	for i := range 2 {
		if err := q.PostSend(&SendWR{ID: uint64(i), Inline: []byte("x"), AH: ah, Flags: FlagSignaled}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the CQ to overflow", small.Overflowed)

	remote, fromOne := 0, 0
	overflow := false
	for done := false; !done; {
		select {
		case e := <-b.dev.Events():
			switch {
			case e.Type == AsyncCQOverflow && e.CQ == small:
				overflow = true
			case e.Type == AsyncRemoteError:
				remote++
				if e.Source == one {
					fromOne++
				}
			}
		default:
			done = true
		}
	}
	st = b.dev.Stats()
	if !overflow {
		t.Fatalf("the CQ overflow event was lost behind %d remote error events (events lost %d)", remote, st.EventsLost.Load())
	}
	if got := uint64(remote) + st.RemoteEventsDropped.Load(); got != sources+repeats {
		t.Errorf("%d remote events delivered and %d dropped, want %d in all", remote, st.RemoteEventsDropped.Load(), sources+repeats)
	}
	if st.RemoteEventsDropped.Load() == 0 || st.EventsLost.Load() != 0 {
		t.Errorf("dropped remote events %d, lost local events %d", st.RemoteEventsDropped.Load(), st.EventsLost.Load())
	}
	if remote > eventQueueLen-eventLocalReserve {
		t.Errorf("%d remote events queued, more than their share %d", remote, eventQueueLen-eventLocalReserve)
	}
	if fromOne > 1 {
		t.Errorf("%d events queued at once for one source", fromOne)
	}
	// Its event taken, a source's next error message is an event again.
	if err := sp.Send(one, dst, spoofedTerminate(b.qp.QPN(), 1000)); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, b.dev, AsyncRemoteError); e.Source != one || e.MSN != 1000 {
		t.Fatalf("%v", e)
	}
}

// TestLevels: a device's gauges — RD peer states, live RC connections,
// receives posted to its SRQs and their capacity — follow what it holds,
// and an SRQ the application dropped stops counting.
func TestLevels(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
	mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{p.b.mr.SGE(0, 64)}}))
	mustPost(t, p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("hi"), AH: p.ahAB}))
	collect(t, p.cqa, 1, 5*time.Second)
	if l := p.a.dev.Levels(); l.RDPeers != 1 || l.RCConnections != 0 {
		t.Fatalf("RD: %+v", l)
	}
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	rcConnect(t, a, b, RCConfig{}, RCConfig{})
	if la, lb := a.dev.Levels(), b.dev.Levels(); la.RCConnections != 1 || lb.RCConnections != 1 {
		t.Fatalf("RC: %+v, %+v", la, lb)
	}
	func() { // the SRQ lives in here only
		srq, err := a.pd.CreateSRQ(8, 1)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			mustPost(t, srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{a.mr.SGE(i*64, 64)}}))
		}
		if l := a.dev.Levels(); l.SRQReceives != 3 || l.SRQCapacity != 8 {
			t.Fatalf("SRQ: %+v", l)
		}
	}()
	a.q.Modify(ModifyAttr{State: StateError})
	if l := a.dev.Levels(); l.RCConnections != 0 {
		t.Fatalf("a QP in ERROR still counts its connection: %+v", l)
	}
	runtime.GC()
	if l := a.dev.Levels(); l.SRQReceives != 0 || l.SRQCapacity != 0 {
		t.Fatalf("a dropped SRQ still counts: %+v", l)
	}
}
