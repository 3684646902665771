package qp

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
)

// TestRDNoHeadOfLineAcrossPeers: completion order is per peer (issue 31
// §5). A posts a Send to b, which has no receive posted (it answers
// receiver-not-ready, and the sender keeps trying), then a Send and an
// RDMA Write to c, then a second Send to b. c's WRs complete, in their
// order, while b's are still outstanding; once b posts its receives,
// b's complete, in theirs.
func TestRDNoHeadOfLineAcrossPeers(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{RNRDelay: time.Millisecond, RNRRetries: -1}}
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, rd)
	c := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qc, cqc := rdQPOn(t, c, rd)
	ahAC := p.a.ah(c, qc)
	region, err := c.pd.RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	mustPost(t, qc.PostRecv(&RecvWR{ID: 1, SGL: []SGE{c.mr.SGE(0, 16)}}))

	post := func(wr SendWR) {
		t.Helper()
		wr.Flags = FlagSignaled
		if err := p.qa.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	post(SendWR{ID: 1, Inline: []byte("to b, first"), AH: p.ahAB})
	notReady := p.b.dev.Stats()
	eventually(t, "b refusing the Send (no receive posted)", func() bool { return notReady.RDNotReady.Load() > 0 })
	post(SendWR{ID: 2, Inline: []byte("to c"), AH: ahAC})
	post(SendWR{ID: 3, Opcode: OpWrite, Inline: []byte("written"), AH: ahAC, RemoteSTag: region.STag(), RemoteTO: region.Addr()})
	post(SendWR{ID: 4, Inline: []byte("to b, next"), AH: p.ahAB})

	if wc := collect(t, cqc, 1, 5*time.Second)[0]; wc.Status != Success || string(c.buf[:4]) != "to c" {
		t.Fatalf("c received %+v %q", wc, c.buf[:4])
	}
	for i, wc := range collect(t, p.cqa, 2, 10*time.Second) {
		if want := uint64(2 + i); wc.ID != want || wc.Status != Success {
			t.Fatalf("completion %d: %+v, want WR %d (c's, in post order) with Success: b's outstanding WRs must not hold back c's", i, wc, want)
		}
	}
	// b's WRs are still outstanding: b refused them and keeps refusing.
	before := notReady.RDNotReady.Load()
	eventually(t, "b refusing again", func() bool { return notReady.RDNotReady.Load() > before })
	var wc [1]WorkCompletion
	if n := p.cqa.Poll(wc[:]); n != 0 {
		t.Fatalf("a completion while b has no receive posted: %+v", wc[0])
	}
	if !p.qa.SendQueued() {
		t.Fatal("SendQueued false with b's WRs outstanding")
	}
	if out := outstandingTo(p.qa, p.ahAB); out != 2 {
		t.Fatalf("%d WRs outstanding to b, want 2", out)
	}

	for i := range 2 {
		mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(16*i, 16)}}))
	}
	for i, wc := range collect(t, p.cqa, 2, 10*time.Second) {
		if want := []uint64{1, 4}[i]; wc.ID != want || wc.Status != Success {
			t.Fatalf("b's completion %d: %+v, want WR %d with Success (b's in post order)", i, wc, want)
		}
	}
	if got := collect(t, p.cqb, 2, 5*time.Second); string(p.b.buf[:11]) != "to b, first" || string(p.b.buf[16:26]) != "to b, next" {
		t.Fatalf("b received %+v: %q %q", got, p.b.buf[:11], p.b.buf[16:26])
	}
	syncRD(qc)
	if string(region.Bytes()[:7]) != "written" {
		t.Fatalf("c's region holds %q", region.Bytes()[:7])
	}
	if p.qa.SendQueued() {
		t.Fatal("SendQueued true with every WR complete")
	}
	if err := checkRDAccounting(p.qa); err != nil {
		t.Fatal(err)
	}
}

// outstandingTo is how many WRs q has posted to ah's peer and not yet
// completed.
func outstandingTo(q *QP, ah *AH) int {
	pi, _ := rdInfo(q, rdKey{ah.addr, ah.qpn})
	return pi.Outstanding
}

// BenchmarkRDCompletionsStalledPeer: issue 31 §5's target. Two sender
// QPs, each on its own device, send one 64-byte Send to each of the same
// 1,000 peers (RD QPs on one device, receives posted) per round, and
// take the completions; one of the senders also has a Send outstanding
// to a stalled peer, which never posts a receive (it answers
// receiver-not-ready for as long as the run lasts). The rounds
// alternate between the two. A WR's completion latency is from its post
// to its completion polled; the benchmark reports the p50 and p99 of
// both senders' and the ratio of the p99s, which per-peer completion
// order keeps near 1 (with completions in post order over the whole QP,
// the stalled peer's Send holds back every later one, and the first
// round fails).
func BenchmarkRDCompletionsStalledPeer(b *testing.B) {
	const peers = 1000
	rnr := RDConfig{Config: reliability.Config{RNRRetries: -1}, MaxPeers: 2 * peers, MaxPeersPerAddr: 2 * peers}
	y := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
	ycq, err := y.dev.CreateCQ(4 * peers)
	if err != nil {
		b.Fatal(err)
	}
	const slot, depth = 64, 4
	rx := map[uint32]*QP{}
	var targets []*QP
	for range peers {
		q := y.newQP(QPAttr{Type: RD, SendCQ: ycq, RecvCQ: ycq, RD: rnr, Caps: QPCaps{MaxSendWR: 16, MaxRecvWR: 16}})
		targets = append(targets, q)
		rx[q.QPN()] = q
		for range depth {
			if err := q.PostRecv(&RecvWR{SGL: []SGE{y.mr.SGE(0, slot)}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	stalled, _ := rdQPFor(b, y, rnr) // never posts a receive

	type sender struct {
		name   string
		n      *node
		q      *QP
		cq     *CQ
		ahs    []*AH
		postAt []time.Time
		lat    []time.Duration
	}
	var senders [2]*sender
	for i, name := range []string{"clean", "stalled"} {
		x := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
		cq, err := x.dev.CreateCQ(4 * peers)
		if err != nil {
			b.Fatal(err)
		}
		q := x.newQP(QPAttr{Type: RD, SendCQ: cq, RecvCQ: cq, RD: rnr, Caps: QPCaps{MaxSendWR: 2 * peers, MaxRecvWR: 16}})
		s := &sender{name: name, n: x, q: q, cq: cq, postAt: make([]time.Time, peers)}
		for _, t := range targets {
			s.ahs = append(s.ahs, x.ah(y, t))
		}
		senders[i] = s
	}
	wcs := make([]WorkCompletion, 256)
	// repost gives the targets back the receives a round's Sends took.
	repost := func(k int) {
		recv := RecvWR{SGL: []SGE{y.mr.SGE(0, slot)}}
		for end := time.Now().Add(30 * time.Second); k > 0; {
			n := ycq.Poll(wcs[:min(len(wcs), k)])
			if n == 0 && time.Now().After(end) {
				b.Fatalf("the targets received %d fewer Sends than were sent", k)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != Success || wc.Opcode != WCRecv {
					b.Fatalf("target: %+v", wc)
				}
				if err := rx[wc.QPN].PostRecv(&recv); err != nil {
					b.Fatal(err)
				}
			}
			k -= n
		}
	}
	round := func(s *sender, measure bool) {
		wr := SendWR{Flags: FlagSignaled, Inline: make([]byte, slot)}
		for i, ah := range s.ahs {
			wr.ID, wr.AH = uint64(i), ah
			s.postAt[i] = time.Now()
			if err := s.q.PostSend(&wr); err != nil {
				b.Fatal(err)
			}
		}
		for k, end := 0, time.Now().Add(30*time.Second); k < peers; {
			n := s.cq.Poll(wcs)
			now := time.Now()
			if n == 0 && now.After(end) {
				b.Fatalf("%s: %d of %d completions in 30 s", s.name, k, peers)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != Success || wc.ID >= peers {
					b.Fatalf("%s: %+v", s.name, wc)
				}
				if measure {
					s.lat = append(s.lat, now.Sub(s.postAt[wc.ID]))
				}
			}
			k += n
		}
		repost(peers)
	}
	// The stalled peer: a Send to it, refused, outstanding from now on.
	st := senders[1]
	if err := st.q.PostSend(&SendWR{ID: peers, Flags: FlagSignaled, Inline: []byte("stalled"), AH: st.n.ah(y, stalled)}); err != nil {
		b.Fatal(err)
	}
	eventually(b, "the stalled peer refusing the Send", func() bool { return y.dev.Stats().RDNotReady.Load() > 0 })
	for _, s := range senders { // first contact with every peer
		round(s, false)
	}
	i := 0
	for b.Loop() {
		round(senders[i%2], true)
		round(senders[(i+1)%2], true)
		i++
	}
	b.StopTimer()
	if out := outstandingTo(st.q, st.n.ah(y, stalled)); out != 1 {
		b.Fatalf("%d WRs outstanding to the stalled peer, want 1: it did not stall the run", out)
	}
	p99 := [2]float64{}
	for k, s := range senders {
		// Retransmissions per round: a loss on the way (a full socket
		// buffer) costs a timeout, which is what the p99 then shows.
		b.ReportMetric(float64(s.n.dev.Stats().RDRetransmits.Load())/float64(i+1), fmt.Sprintf("retx/round/%s", s.name))
		slices.Sort(s.lat)
		p50, p := s.lat[len(s.lat)/2], s.lat[len(s.lat)*99/100]
		p99[k] = float64(p.Microseconds())
		b.ReportMetric(float64(p50.Microseconds()), fmt.Sprintf("p50-us/%s", s.name))
		b.ReportMetric(p99[k], fmt.Sprintf("p99-us/%s", s.name))
	}
	b.ReportMetric(p99[1]/p99[0], "p99-stalled/clean")
}
