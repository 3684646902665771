package qp

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// heldBytes is what q's RD receivers hold ahead of gaps, and how many
// peers it has from addr.
func heldOf(q *QP, addr net.IP) (frames, peers int) {
	q.rd.mu.Lock()
	defer q.rd.mu.Unlock()
	q.rd.ep.EachPeer(func(pi *reliability.PeerInfo) {
		frames += pi.HeldFrames
		if net.IP(pi.Key.Addr.Addr().AsSlice()).Equal(addr) {
			peers++
		}
	})
	return frames, peers
}

// TestRDHeldMemoryBounded (item 6): one return-routable source opens
// peers under many source QP numbers and sends each a window of frames
// ahead of a gap that never fills. What the QP holds stays within its
// byte budgets, the source gets no more than its share of peers, a peer
// at another address is still served, and the stalled peers are
// reclaimed.
func TestRDHeldMemoryBounded(t *testing.T) {
	const (
		window   = 64
		frame    = 16 << 10
		perPeer  = 128 << 10
		perQP    = 512 << 10
		perAddr  = 4
		maxPeers = 16
		qpns     = 24
	)
	rd := RDConfig{Config: reliability.Config{Window: window}, MaxPeers: maxPeers, MaxPeersPerAddr: perAddr,
		MaxHeldBytes: perPeer, MaxQPHeldBytes: perQP, IdleTimeout: time.Second}
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, rd)
	evilIP := net.IPv4(127, 0, 0, 2)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: evilIP})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, frame)
	st := b.dev.Stats()
	for i := range qpns {
		qpn := uint32(100 + i)
		r := rawContact(t, c, b, qb, qpn)
		// Sequence 0 never comes: every later frame is held, if at all.
		for seq := uint32(1); seq < window; seq++ {
			r.data(seq, rdSendSeg(qb.QPN(), qpn, seq+1, payload), false, 0, window)
		}
		// b reads each burst (1 MiB, well within its socket buffer)
		// before the next: every frame is counted as held, over budget,
		// refused or rejected.
		eventually(t, "every frame read", func() bool { return st.RxDatagrams.Load() >= uint64((i+1)*window) })
	}
	frames, peers := heldOf(qb, evilIP)
	t.Logf("%d frames held (%d bytes), %d peers from one address; %d over budget", frames, frames*frame, peers, st.RDOverBudget.Load())
	if frames*frame > perQP {
		t.Fatalf("%d bytes held ahead of gaps, budget %d", frames*frame, perQP)
	}
	if peers > perAddr {
		t.Fatalf("%d peers from one address, limit %d", peers, perAddr)
	}
	if st.RDOverBudget.Load() == 0 || st.RDAddrLimited.Load() == 0 {
		t.Fatalf("not counted: %d over budget, %d refused over the address limit", st.RDOverBudget.Load(), st.RDAddrLimited.Load())
	}
	// A peer at another address gets service.
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{Config: reliability.Config{MaxRetries: 4, MaxRTO: 100 * time.Millisecond}})
	mustPost(t, qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 100)}}))
	mustPost(t, qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("legit"), AH: a.ah(b, qb)}))
	if wc := collect(t, cqa, 1, 10*time.Second)[0]; wc.Status != Success {
		t.Fatalf("the peer at another address: %+v", wc)
	}
	if wc := collect(t, cqb, 1, time.Second)[0]; wc.Status != Success || string(b.buf[:5]) != "legit" {
		t.Fatalf("%+v", wc)
	}
	// The stalled peers (frames held, no progress) are reclaimed.
	eventually(t, "the stalled peers reclaimed", func() bool { f, n := heldOf(qb, evilIP); return f == 0 && n == 0 })
	if b.rdHeld(qb) != 0 {
		t.Fatalf("%d bytes still counted as held", b.rdHeld(qb))
	}
}

func (n *node) rdHeld(q *QP) int {
	q.rd.mu.Lock()
	defer q.rd.mu.Unlock()
	return q.rd.ep.Held()
}

// TestRDZeroWindowPin (item 7): a return-routable peer asks for a Read
// and advertises a zero window, so the Read Responses stay queued. The
// owner can deregister the region at once (the queued responses are
// flushed: the requester is told the Read failed), the timer does not
// spin while the window is shut, and the zero-window probes run out and
// fail the peer.
func TestRDZeroWindowPin(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{InitialRTT: 5 * time.Millisecond, MaxRTO: 100 * time.Millisecond, MaxRetries: 8}}
	b, qb, src, r := rawReader(t, rd, 77)
	st := b.dev.Stats()
	timers := st.Timers.Load()
	// The Read Request, with an ack that shuts the window.
	const size, sinkSTag = 1 << 20, 0x4200
	r.data(0, rdReadReq(qb.QPN(), 77, 1, sinkSTag, size, src.STag(), src.Addr()), true, 0, 0)
	eventually(t, "the Read Request served", func() bool { return st.RDReadsServed.Load() == 1 })
	// The owner deregisters: no ErrBusy for a peer's responses.
	if err := src.Deregister(); err != nil {
		t.Fatalf("Deregister with a peer's Read Responses queued behind a zero window: %v", err)
	}
	// The responder tells the requester: a last Read Response that ends
	// short of the Read. The probes carry the responses; the peer
	// acknowledges each (keeping the window shut), in case one went
	// before the Deregister.
	seq := uint32(1)
	for last := false; !last; {
		h, seg := r.read(5 * time.Second)
		if h == nil {
			t.Fatal("no last Read Response")
		}
		if h.Type != reliability.Data {
			continue
		}
		s, err := udiwarp.ParseSegment(seg, udiwarp.ProfileDatagram)
		if err != nil || s.Opcode() != udiwarp.OpReadResponse {
			t.Fatalf("%v %v", s.Opcode(), err)
		}
		if tg := s.Tagged(); s.Control.Last() {
			last = true
			if tg.STag() != sinkSTag || tg.TO()+uint64(len(s.Payload)) >= size {
				t.Fatalf("a last Read Response at %d+%d of a %d-byte Read: as if complete", tg.TO(), len(s.Payload), size)
			}
		} else {
			r.data(seq, nil, true, h.Seq+1, 0)
			seq++
		}
	}
	// Not acknowledged, the last response runs out of retries: the peer
	// is given up on.
	eventually(t, "the peer failed", func() bool { return st.RDPeerFailures.Load() == 1 })
	fires, probes, resent := st.Timers.Load()-timers, st.RDWindowProbes.Load(), st.RDRetransmits.Load()
	t.Logf("%d timer runs, %d zero-window probes, %d retransmissions", fires, probes, resent)
	if probes == 0 || probes > uint64(rd.MaxRetries) {
		t.Fatalf("%d probes", probes)
	}
	if fires > 10*(probes+resent+4) {
		t.Fatalf("the timer ran %d times for %d probes and %d retransmissions", fires, probes, resent)
	}
	if peersOf(qb) != 0 {
		t.Fatal("the peer still has state")
	}
}

// TestRDDeregisterFlushesReads (item 7): a region a live peer is reading
// can be deregistered; the Read in progress completes with an error at
// the requester, never Success.
func TestRDDeregisterFlushesReads(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{Window: 2}}
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{Impair: &Impairment{Delay: 2 * time.Millisecond}}, rd)
	const n = 256 << 20 // ~4000 responses at two per round trip: far longer than the test takes
	src, _ := p.b.pd.RegisterMemory(make([]byte, n), AccessLocalWrite|AccessRemoteRead)
	sink, _ := p.a.pd.RegisterMemory(make([]byte, n), AccessLocalWrite|AccessRemoteWrite)
	mustPost(t, p.qa.PostSend(&SendWR{ID: 1, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(0, n)}, AH: p.ahAB, RemoteSTag: src.STag(), RemoteTO: src.Addr()}))
	t0 := time.Now()
	eventually(t, "a Read Response placed", func() bool { return p.a.dev.Stats().RDWritePlaced.Load() >= 1 })
	t.Logf("placed after %v", time.Since(t0))
	if err := src.Deregister(); err != nil {
		t.Fatal(err)
	}
	t.Logf("deregistered after %v", time.Since(t0))
	if wc := collect(t, p.cqa, 1, 10*time.Second)[0]; wc.Status == Success || wc.Opcode != WCRDMARead {
		t.Fatalf("a Read of a region deregistered under it: %+v", wc)
	}
	t.Logf("completed after %v", time.Since(t0))
	if !errors.Is(src.Deregister(), ErrNotFound) {
		t.Fatal("deregistered twice")
	}
}

// TestRDZeroWindowProbeLimit (item 7): a peer that acknowledges what it
// gets but keeps its window shut draws one probe per backed-off probe
// timeout, not a timer at 1 kHz, and is given up on after MaxRetries
// probes: it cannot hold the region it reads for longer than that.
func TestRDZeroWindowProbeLimit(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 100 * time.Millisecond, MaxRetries: 6}}
	b, qb, src, r := rawReader(t, rd, 78)
	st := b.dev.Stats()
	timers := st.Timers.Load()
	r.data(0, rdReadReq(qb.QPN(), 78, 1, 0x4200, 1<<20, src.STag(), src.Addr()), true, 0, 0)
	// Acknowledge every probe at once, and keep the window shut.
	seq := uint32(1)
	for end := time.Now().Add(10 * time.Second); st.RDPeerFailures.Load() == 0; {
		if time.Now().After(end) {
			t.Fatalf("the peer kept the window shut through %d probes and was not given up on", st.RDWindowProbes.Load())
		}
		if h, _ := r.read(20 * time.Millisecond); h != nil && h.Type == reliability.Data {
			r.data(seq, nil, true, h.Seq+1, 0) // an empty Data frame: it carries the ack
			seq++
		}
	}
	// MaxRetries probes, or fewer if a slow test let one probe's own
	// retransmissions run out first.
	fires, probes, resent := st.Timers.Load()-timers, st.RDWindowProbes.Load(), st.RDRetransmits.Load()
	t.Logf("%d timer runs, %d zero-window probes, %d retransmissions", fires, probes, resent)
	if probes == 0 || probes > uint64(rd.MaxRetries) {
		t.Fatalf("%d probes, MaxRetries %d", probes, rd.MaxRetries)
	}
	if fires > 10*(probes+resent+4) {
		t.Fatalf("the timer ran %d times for %d probes and %d retransmissions", fires, probes, resent)
	}
	if err := src.Deregister(); err != nil {
		t.Fatal(err)
	}
}

// rawReader is an RD QP on a new node with a 1 MiB region of remote-read
// access, and a raw-socket peer (source QP qpn) that completed contact
// with it, for the tests of what a reading peer can hold.
func rawReader(t *testing.T, rd RDConfig, qpn uint32) (*node, *QP, *MR, *rawRD) {
	t.Helper()
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, _ := rdQPOn(t, b, rd)
	src, err := b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return b, qb, src, rawContact(t, c, b, qb, qpn)
}
