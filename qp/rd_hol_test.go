package qp

import (
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
	qc.PostRecv(&RecvWR{ID: 1, SGL: []SGE{c.mr.SGE(0, 16)}})

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
		p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(16*i, 16)}})
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
}

// outstandingTo is how many WRs q has posted to ah's peer and not yet
// completed.
func outstandingTo(q *QP, ah *AH) int {
	r := q.rd
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.peers[rdKey{ah.addr, ah.qpn}]; p != nil {
		return p.outstanding
	}
	return 0
}
