package qp

import (
	"bytes"
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/reliability"
	"golang.org/x/sys/unix"
)

// rdPair is two nodes, each with an RD QP on its own CQ.
type rdPair struct {
	a, b   *node
	qa, qb *QP
	cqa    *CQ
	cqb    *CQ
	ahAB   *AH // a's handle for b's QP
	ahBA   *AH
}

func newRDPair(t *testing.T, cfgA, cfgB DeviceConfig, rd RDConfig) *rdPair {
	t.Helper()
	p := &rdPair{a: newNode(t, cfgA, "udp4", "127.0.0.1:0"), b: newNode(t, cfgB, "udp4", "127.0.0.1:0")}
	p.qa, p.cqa = rdQPOn(t, p.a, rd)
	p.qb, p.cqb = rdQPOn(t, p.b, rd)
	p.ahAB, p.ahBA = p.a.ah(p.b, p.qb), p.b.ah(p.a, p.qa)
	return p
}

func rdQPOn(t *testing.T, n *node, rd RDConfig) (*QP, *CQ) {
	t.Helper()
	cq, err := n.dev.CreateCQ(8192)
	if err != nil {
		t.Fatal(err)
	}
	return n.newQP(QPAttr{Type: RD, SendCQ: cq, RecvCQ: cq, RD: rd, Caps: QPCaps{MaxSendWR: 4096, MaxRecvWR: 4096}}), cq
}

// collect waits for k completions of the given opcode on cq (others are
// kept apart), within limit.
func collect(t *testing.T, cq *CQ, k int, limit time.Duration) []WorkCompletion {
	t.Helper()
	out := make([]WorkCompletion, 0, k)
	wcs := make([]WorkCompletion, 64)
	for end := time.Now().Add(limit); len(out) < k; {
		n := cq.Poll(wcs[:min(len(wcs), k-len(out))])
		out = append(out, wcs[:n]...)
		if n == 0 {
			if time.Now().After(end) {
				t.Fatalf("%d of %d completions in %v", len(out), k, limit)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return out
}

func TestRDSendRecv(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
	const n = 300
	const slot = 3000
	for i := range n {
		mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*slot, slot)}}))
	}
	for i := range n {
		size := (i * 997) % slot
		fill(p.a.buf[i*slot:i*slot+size], i)
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i*slot, size)}, AH: p.ahAB}); err != nil {
			t.Fatal(err)
		}
	}
	sent := collect(t, p.cqa, n, time.Minute)
	for i, wc := range sent {
		if wc.ID != uint64(i) || wc.Status != Success || wc.Opcode != WCSend {
			t.Fatalf("send completion %d: %+v (completions must come in post order)", i, wc)
		}
	}
	got := collect(t, p.cqb, n, time.Minute)
	for i, wc := range got {
		size := (i * 997) % slot
		if wc.ID != uint64(i) || wc.Status != Success || int(wc.Len) != size || wc.SourceQPN != p.qa.QPN() || wc.Source != p.a.sock.LocalAddr() {
			t.Fatalf("receive %d: %+v", i, wc)
		}
		if !bytes.Equal(p.b.buf[i*slot:i*slot+size], p.a.buf[i*slot:i*slot+size]) {
			t.Fatalf("message %d differs", i)
		}
	}
	// A perfect link needs no retransmission, but how many spurious ones a
	// machine causes depends on how long it stops the receiver (beyond the
	// probe timeout; a full socket buffer is a real loss): the test asserts
	// what the QP promises — each message once, in order, complete — and
	// only reports the count. BenchmarkRD* measure the cost.
	t.Logf("%d retransmissions of %d packets", p.a.dev.Stats().RDRetransmits.Load(), n)
}

func TestRDWrite(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
	region, err := p.b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		off, size int
		sges      int
	}{{"empty", 0, 0, 1}, {"small", 10, 100, 1}, {"one datagram", 1000, 60000, 2}, {"700 KiB, 3 SGEs", 200000, 700 << 10, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			fill(p.a.buf[:tc.size], tc.size)
			var sgl []SGE
			per := tc.size / tc.sges
			for i := range tc.sges {
				k := per
				if i == tc.sges-1 {
					k = tc.size - per*(tc.sges-1)
				}
				sgl = append(sgl, p.a.mr.SGE(i*per, k))
			}
			if err := p.qa.PostSend(&SendWR{ID: 7, Opcode: OpWrite, Flags: FlagSignaled, SGL: sgl, AH: p.ahAB,
				RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(tc.off)}); err != nil {
				t.Fatal(err)
			}
			wc := collect(t, p.cqa, 1, 5*time.Second)[0]
			if wc.Status != Success || wc.Opcode != WCRDMAWrite || wc.Len != uint32(tc.size) {
				t.Fatalf("%+v", wc)
			}
			// Completed means acknowledged means placed.
			syncRD(p.qb)
			if !bytes.Equal(region.Bytes()[tc.off:tc.off+tc.size], p.a.buf[:tc.size]) {
				t.Fatal("the region differs from what was written")
			}
		})
	}
	noCompletion(t, p.cqb) // RDMA Write consumes no receive and completes nothing at the target (each acknowledged)
}

// noCompletion checks that cq holds no completion. The caller has waited
// for the state in which what must complete nothing would have completed
// if it did: the answer to it came back (an ack, a response, a Challenge:
// sent after it was handled), or the device's counter of it moved and
// its batch is done (rxSettled), or quietUntil.
func noCompletion(t *testing.T, cq *CQ) {
	t.Helper()
	var wc [1]WorkCompletion
	if cq.Poll(wc[:]) > 0 {
		t.Fatalf("unexpected completion %+v", wc[0])
	}
}

// quietUntil waits for handled, the state in which the datagrams that
// must complete nothing on cq have been read by the device of s, then
// lets the batch in hand finish (rxSettled) and checks that cq holds no
// completion. It polls cq while it waits (a busy-polled device reads in
// CQ.Poll), and any completion it finds fails the test too.
func quietUntil(t *testing.T, cq *CQ, s *Socket, what string, handled func() bool) {
	t.Helper()
	var wc [1]WorkCompletion
	eventually(t, what, func() bool {
		if cq.Poll(wc[:]) > 0 {
			t.Fatalf("unexpected completion %+v", wc[0])
		}
		return handled()
	})
	rxSettled(s)
	noCompletion(t, cq)
}

// markerID is the WR ID of the marker's Send and receive.
const markerID = 0x6d61726b

// marker sends one Send from q (ah: its handle for to, RD) to a receive
// posted now on to, and checks that it is the next completion on toCQ:
// a reliable QP delivers in order, so what q sent before has been
// handled, and whatever of it completed would be ahead of the marker. It
// takes the marker's send completion from qCQ.
func marker(t *testing.T, q *QP, qCQ *CQ, ah *AH, to *QP, toCQ *CQ) {
	t.Helper()
	src, err := q.pd.RegisterMemory([]byte("mark"), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := to.pd.RegisterMemory(make([]byte, 4), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := to.PostRecv(&RecvWR{ID: markerID, SGL: []SGE{dst.SGE(0, 4)}}); err != nil {
		t.Fatal(err)
	}
	if err := q.PostSend(&SendWR{ID: markerID, Flags: FlagSignaled, SGL: []SGE{src.SGE(0, 4)}, AH: ah}); err != nil {
		t.Fatal(err)
	}
	if wc := collect(t, qCQ, 1, 30*time.Second)[0]; wc.ID != markerID || wc.Status != Success {
		t.Fatalf("the marker's Send: %+v", wc)
	}
	if wc := collect(t, toCQ, 1, 30*time.Second)[0]; wc.ID != markerID || wc.Status != Success || string(dst.Bytes()) != "mark" {
		t.Fatalf("unexpected completion %+v: the marker's receive (ID %#x) should have been the next", wc, markerID)
	}
}

// quietDrained is quietUntil for what from sent to: it waits until
// nothing from sent is on its way to to (drained).
func quietDrained(t *testing.T, cq *CQ, from, to *node) {
	t.Helper()
	quietUntil(t, cq, to.sock, "nothing on its way to "+to.sock.LocalAddr().String(), func() bool { return drained(t, from, to) })
}

// drained reports whether nothing from's device sent is on its way to
// to's any more: from's send impairment delays none, to's socket holds
// none unread, and to's receive impairment delays none and holds none
// for a read. (Loopback hands a datagram to the receiving socket inside
// sendmsg; one an impairment holds back behind the next, Reorder, stays
// there.) quietUntil then lets the batch in hand finish. It does not
// count datagrams, so other traffic and the socket buffer's drops do not
// matter.
func drained(t *testing.T, from, to *node) bool {
	t.Helper()
	if im := from.dev.cfg.Impair; im != nil && im.Delaying() != 0 {
		return false
	}
	ll := to.sock.ll
	if w, ok := ll.(*llp.Impaired); ok {
		if w.Holding() {
			return false
		}
		ll = w.Inner()
	}
	u, ok := ll.(*llp.UDP)
	if !ok {
		t.Fatalf("drained: %T, not a UDP socket", ll)
	}
	queued, err := 0, error(nil)
	if cerr := u.Control(func(fd uintptr) { queued, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); cerr != nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("drained: SIOCINQ: %v", err)
	}
	return queued == 0
}

func TestRDErrors(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
	readOnly, _ := p.b.pd.RegisterMemory(make([]byte, 4096), AccessLocalWrite)
	writable, _ := p.b.pd.RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	otherPD, _ := p.b.dev.AllocPD().RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{p.b.mr.SGE(0, 10)}}))
	for i, tc := range []struct {
		wr   SendWR
		want Status
	}{
		{SendWR{Opcode: OpWrite, Inline: []byte("x"), RemoteSTag: readOnly.STag(), RemoteTO: readOnly.Addr()}, RemoteAccessError},
		{SendWR{Opcode: OpWrite, Inline: []byte("x"), RemoteSTag: writable.STag() ^ 0xff, RemoteTO: writable.Addr()}, RemoteAccessError},
		{SendWR{Opcode: OpWrite, Inline: []byte("xy"), RemoteSTag: writable.STag(), RemoteTO: writable.Addr() + 4095}, RemoteAccessError},
		{SendWR{Opcode: OpWrite, Inline: []byte("x"), RemoteSTag: otherPD.STag(), RemoteTO: otherPD.Addr()}, RemoteAccessError},
		{SendWR{Inline: make([]byte, 11)}, RemoteInvalidRequestError}, // longer than the receive
		{SendWR{Opcode: OpWrite, Inline: []byte("ok"), RemoteSTag: writable.STag(), RemoteTO: writable.Addr()}, Success},
	} {
		tc.wr.ID, tc.wr.Flags, tc.wr.AH = uint64(i), FlagSignaled, p.ahAB
		if err := p.qa.PostSend(&tc.wr); err != nil {
			t.Fatal(err)
		}
		if wc := collect(t, p.cqa, 1, 5*time.Second)[0]; wc.ID != uint64(i) || wc.Status != tc.want {
			t.Fatalf("case %d: %+v, want %v", i, wc, tc.want)
		}
	}
	if wc := collect(t, p.cqb, 1, time.Second)[0]; wc.Status != LocalLengthError {
		t.Fatalf("receiver: %+v", wc)
	}
	syncRD(p.qb)
	if string(writable.Bytes()[:2]) != "ok" || readOnly.Bytes()[0] != 0 || otherPD.Bytes()[0] != 0 {
		t.Fatal("bytes placed where they must not be, or not where they must")
	}
	// Local faults: longer than a message can be (2^32 - 1); a Read with
	// two sinks.
	if err := p.qa.PostSend(&SendWR{SGL: []SGE{{LKey: p.a.mr.LKey(), Length: 1 << 31}, {LKey: p.a.mr.LKey(), Length: 1 << 31}}, AH: p.ahAB}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("oversized Send: %v", err)
	}
	if err := p.qa.PostSend(&SendWR{Opcode: OpRead, SGL: []SGE{p.a.mr.SGE(0, 1), p.a.mr.SGE(1, 1)}, AH: p.ahAB}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("a Read with two sink SGEs: %v", err)
	}
}

// TestRDImpaired runs Sends and Writes through loss, duplication,
// reordering, corruption and jitter, both ways: every message arrives
// once, in order, byte-exact, and every WR completes successfully.
func TestRDImpaired(t *testing.T) {
	for _, tc := range []struct {
		name string
		imp  func(seed uint64) *Impairment
	}{
		{"loss 1%", func(s uint64) *Impairment { return &Impairment{Seed: s, Loss: 0.01} }},
		{"loss 5%", func(s uint64) *Impairment { return &Impairment{Seed: s, Loss: 0.05} }},
		{"loss 20%", func(s uint64) *Impairment { return &Impairment{Seed: s, Loss: 0.2} }},
		{"duplicate, reorder, corrupt, jitter", func(s uint64) *Impairment {
			return &Impairment{Seed: s, Loss: 0.02, Duplicate: 0.05, Reorder: 0.1, Corrupt: 0.02, Jitter: 300 * time.Microsecond}
		}},
		{"bursts of 10", func(s uint64) *Impairment { return &Impairment{Seed: s, Burst: 0.02, BurstLen: 10} }},
		{"delay spikes past the timeout", func(s uint64) *Impairment {
			return &Impairment{Seed: s, Spike: 0.02, SpikeDelay: 30 * time.Millisecond}
		}},
	} {
		for _, way := range []string{"out", "in"} {
			t.Run(tc.name+", on the way "+way, func(t *testing.T) {
				testRDImpaired(t, tc.imp, way == "in")
			})
		}
	}
}

// testRDImpaired runs RD Sends and Writes through the impairment imp
// draws for each end, on what the ends send or (rx) what they read.
func testRDImpaired(t *testing.T, imp func(seed uint64) *Impairment, rx bool) {
	ia, ib := imp(1), imp(2)
	ca, cb := DeviceConfig{Impair: ia}, DeviceConfig{Impair: ib}
	if rx {
		ca, cb = DeviceConfig{ImpairRx: ia}, DeviceConfig{ImpairRx: ib}
	}
	p := newRDPair(t, ca, cb, RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond}})
	region, err := p.b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	const slot = 2000
	for i := range n {
		mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*slot, slot)}}))
	}
	for i := range n {
		size := 1 + (i*331)%slot
		fill(p.a.buf[i*slot:i*slot+size], i)
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i*slot, size)}, AH: p.ahAB}); err != nil {
			t.Fatal(err)
		}
		if i%20 == 0 { // and a Write of several segments now and then
			if err := p.qa.PostSend(&SendWR{ID: 1000 + uint64(i), Opcode: OpWrite, Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i*slot, size)},
				AH: p.ahAB, RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(i*slot)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := collect(t, p.cqb, n, 20*time.Second)
	for i, wc := range got {
		size := 1 + (i*331)%slot
		if wc.ID != uint64(i) || wc.Status != Success || int(wc.Len) != size {
			t.Fatalf("receive %d: %+v", i, wc)
		}
		if !bytes.Equal(p.b.buf[i*slot:i*slot+size], p.a.buf[i*slot:i*slot+size]) {
			t.Fatalf("message %d differs", i)
		}
	}
	done := collect(t, p.cqa, n+n/20, 20*time.Second)
	for _, wc := range done {
		if wc.Status != Success {
			t.Fatalf("%+v\na: %+v\nb: %+v", wc, p.a.dev.Stats().Snapshot(), p.b.dev.Stats().Snapshot())
		}
		if wc.ID >= 1000 {
			syncRD(p.qb)
			i := int(wc.ID - 1000)
			size := 1 + (i*331)%slot
			if !bytes.Equal(region.Bytes()[i*slot:i*slot+size], p.a.buf[i*slot:i*slot+size]) {
				t.Fatalf("write %d differs", i)
			}
		}
	}
	quietDrained(t, p.cqb, p.a, p.b) // nothing delivered twice
	st := p.a.dev.Stats()
	t.Logf("a: %d data frames, %d retransmissions; impairment dropped %d/%d (bursts %d/%d), duplicated %d/%d, corrupted %d/%d, spikes %d/%d",
		st.RDDataSent.Load(), st.RDRetransmits.Load(), ia.Dropped.Load(), ib.Dropped.Load(), ia.Bursts.Load(), ib.Bursts.Load(),
		ia.Duplicated.Load(), ib.Duplicated.Load(), ia.Corrupted.Load(), ib.Corrupted.Load(), ia.Spikes.Load(), ib.Spikes.Load())
	if ia.TxImpairedTotal()+ib.TxImpairedTotal() == 0 {
		t.Fatal("the impairment did nothing: the test did not test")
	}
}

// TestRDReceiverNotReady posts the receives only after the messages were
// sent: the receiver refuses, the sender waits and resends; nothing is
// lost or duplicated.
func TestRDReceiverNotReady(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{Config: reliability.Config{RNRDelay: time.Millisecond, RNRRetries: -1}})
	const n = 50
	for i := range n {
		p.a.buf[i] = byte(i)
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i, 1)}, AH: p.ahAB}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "a refusal for want of a receive", func() bool { return p.b.dev.Stats().RDNotReady.Load() > 0 })
	for i := range n {
		mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i, 1)}}))
		if i%10 == 9 {
			time.Sleep(2 * time.Millisecond) // slowly
		}
	}
	got := collect(t, p.cqb, n, 10*time.Second)
	for i, wc := range got {
		if wc.ID != uint64(i) || wc.Status != Success || p.b.buf[i] != byte(i) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	for _, wc := range collect(t, p.cqa, n, 10*time.Second) {
		if wc.Status != Success {
			t.Fatalf("%+v", wc)
		}
	}
	if p.b.dev.Stats().RDNotReady.Load() == 0 {
		t.Fatal("the receiver was never not ready: the test did not test")
	}
}

// TestRDPeerGone: a peer that disappears fails the WRs to it with
// RetryExceededError within the retry budget; the QP goes on serving its
// other peers.
func TestRDPeerGone(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 20 * time.Millisecond, MaxRetries: 5}}
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, rd)
	c := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qc, cqc := rdQPOn(t, c, rd)
	ahAC := p.a.ah(c, qc)
	// Contact with both first.
	mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{p.b.mr.SGE(0, 10)}}))
	mustPost(t, qc.PostRecv(&RecvWR{ID: 1, SGL: []SGE{c.mr.SGE(0, 10)}}))
	mustPost(t, p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("hi"), AH: p.ahAB}))
	mustPost(t, p.qa.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, Inline: []byte("hi"), AH: ahAC}))
	collect(t, p.cqa, 2, 5*time.Second)
	collect(t, cqc, 1, time.Second)

	p.b.dev.Close() // b is gone
	start := time.Now()
	for i := range 5 {
		mustPost(t, p.qa.PostSend(&SendWR{ID: 10 + uint64(i), Flags: FlagSignaled, Inline: []byte("lost"), AH: p.ahAB}))
	}
	for _, wc := range collect(t, p.cqa, 5, 5*time.Second) {
		if wc.Status != RetryExceededError {
			t.Fatalf("%+v", wc)
		}
	}
	t.Logf("gave up after %v", time.Since(start).Round(time.Millisecond))
	// c is still served.
	mustPost(t, qc.PostRecv(&RecvWR{ID: 2, SGL: []SGE{c.mr.SGE(0, 10)}}))
	mustPost(t, p.qa.PostSend(&SendWR{ID: 20, Flags: FlagSignaled, Inline: []byte("still"), AH: ahAC}))
	if wc := collect(t, p.cqa, 1, 5*time.Second)[0]; wc.ID != 20 || wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	if wc := collect(t, cqc, 1, time.Second)[0]; wc.Status != Success || string(c.buf[:5]) != "still" {
		t.Fatalf("%+v", wc)
	}
}

// TestRDPeerRestart: the target restarts (a new device on the same
// address, the same QP number, a new epoch). The WRs in flight to its old
// incarnation fail with RemoteAbortedError; later ones reach the new one.
//
// The retry budget is far longer than bringing up the new incarnation
// takes on a loaded machine (MaxRetries at the default 10 with a 20 ms
// MaxRTO gave out in ~170 ms, and the WR failed RetryExceeded first).
// The WR in flight draws the new incarnation's Challenge on a frame sent
// more than once, with nothing left to send: the path that dropped the
// peer without leaving its address's count (checkRDAccounting).
func TestRDPeerRestart(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 20 * time.Millisecond, MaxRetries: 100000}}
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, rd)
	addr := p.b.sock.LocalAddr()
	mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{p.b.mr.SGE(0, 10)}}))
	mustPost(t, p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("one"), AH: p.ahAB}))
	if wc := collect(t, p.cqa, 1, 5*time.Second)[0]; wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	// Messages the old incarnation will never acknowledge: no receive
	// posted (it is not ready), then it goes away.
	mustPost(t, p.qa.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, Inline: []byte("two"), AH: p.ahAB}))
	notReady := p.b.dev.Stats()
	eventually(t, "the old incarnation refusing the Send", func() bool { return notReady.RDNotReady.Load() > 0 })
	p.b.dev.Close()

	b2 := newNode(t, DeviceConfig{}, "udp4", addr.String())
	qb2, cqb2 := rdQPOn(t, b2, rd)
	if qb2.QPN() != p.qb.QPN() {
		t.Skipf("the new QP got number %d, not %d", qb2.QPN(), p.qb.QPN())
	}
	mustPost(t, qb2.PostRecv(&RecvWR{ID: 9, SGL: []SGE{b2.mr.SGE(0, 10)}}))
	if wc := collect(t, p.cqa, 1, time.Minute)[0]; wc.ID != 2 || wc.Status != RemoteAbortedError {
		t.Fatalf("in flight across the restart: %+v", wc)
	}
	if err := checkRDAccounting(p.qa); err != nil {
		t.Fatal(err)
	}
	mustPost(t, p.qa.PostSend(&SendWR{ID: 3, Flags: FlagSignaled, Inline: []byte("three"), AH: p.ahAB}))
	if wc := collect(t, p.cqa, 1, time.Minute)[0]; wc.ID != 3 || wc.Status != Success {
		t.Fatalf("after the restart: %+v", wc)
	}
	if wc := collect(t, cqb2, 1, time.Second)[0]; wc.Status != Success || string(b2.buf[:5]) != "three" {
		t.Fatalf("new incarnation received %+v %q", wc, b2.buf[:5])
	}
	if n := p.a.dev.Stats().RDPeerRestarts.Load(); n != 1 {
		t.Fatalf("%d restarts seen", n)
	}
}

// TestRDDeregisterInFlight: a region an unacknowledged WR sends from
// cannot be deregistered; once the WR completes, it can.
func TestRDDeregisterInFlight(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 5 * time.Millisecond, MaxRetries: 3}}
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, rd)
	src, _ := a.pd.RegisterMemory(make([]byte, 100), AccessLocalWrite)
	nobody, _ := a.pd.CreateAH(a.sock.LocalAddr(), 999) // no such QP: never answered
	mustPost(t, qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, SGL: []SGE{src.SGE(0, 100)}, AH: nobody}))
	if err := src.Deregister(); !errors.Is(err, ErrBusy) {
		t.Fatalf("deregistering a region an unacknowledged WR uses: %v", err)
	}
	if wc := collect(t, cqa, 1, 5*time.Second)[0]; wc.Status != RetryExceededError {
		t.Fatalf("%+v", wc)
	}
	if err := src.Deregister(); err != nil {
		t.Fatal(err)
	}
}

// syncRD orders the test after every placement q has made: placement
// happens under q's RD lock, and the peer's completion, which the test
// saw, was caused by an ack sent after it. The race detector cannot see
// that causality through the kernel; taking the lock shows it.
func syncRD(q *QP) {
	q.rd.mu.Lock()
	//lint:ignore SA2001 an empty critical section on purpose: it orders the test after the placements
	q.rd.mu.Unlock()
}

// BenchmarkRDPeerMemory reports the heap one idle peer's state costs at
// a QP (after contact, nothing in flight). What a busy peer costs, its
// rings at their largest, is BenchmarkEndpointPeerMemory's (reliability).
func BenchmarkRDPeerMemory(b *testing.B) {
	n := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
	cq, _ := n.dev.CreateCQ(16)
	q, err := n.pd.CreateQP(QPAttr{Type: RD, SendCQ: cq, RecvCQ: cq, RD: RDConfig{MaxPeers: 20000}})
	if err != nil {
		b.Fatal(err)
	}
	const peers = 10000
	var before, after runtime.MemStats
	for b.Loop() {
		q.rd.mu.Lock()
		q.rd.ep.Flush()
		q.rd.mu.Unlock()
		runtime.GC()
		runtime.ReadMemStats(&before)
		q.rd.mu.Lock()
		now := time.Now()
		for i := range peers {
			k := reliability.PeerKey{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 4791), QPN: uint32(i%1000 + 1)}
			if _, err := q.rd.ep.PeerFor(now, k); err != nil {
				b.Fatal(err)
			}
		}
		q.rd.mu.Unlock()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/peers, "bytes/idle-peer")
	}
}

// TestRDAndUDShareASocket: the frame-type rule lets one socket carry UD
// and RD traffic at once, to different QPs; over IPv6 too.
func TestRDAndUDShareASocket(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6", "[::1]:0"}} {
		t.Run(tc.network, func(t *testing.T) {
			a := newNode(t, DeviceConfig{}, tc.network, tc.addr)
			b := newNode(t, DeviceConfig{}, tc.network, tc.addr)
			rda, cqa := rdQPOn(t, a, RDConfig{})
			rdb, cqb := rdQPOn(t, b, RDConfig{})
			const n = 100
			for i := range n {
				mustPost(t, b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*100, 100)}}))
				mustPost(t, rdb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(500000+i*100, 100)}}))
			}
			udAH, rdAH := a.ah(b, b.qp), a.ah(b, rdb)
			for i := range n {
				mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte{'u', byte(i)}, AH: udAH}))
				mustPost(t, rda.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, Inline: []byte{'r', byte(i)}, AH: rdAH}))
			}
			for i, wc := range collect(t, cqb, n, 5*time.Second) {
				if wc.ID != uint64(i) || wc.QPN != rdb.QPN() || string(b.buf[500000+i*100:500000+i*100+2]) != string([]byte{'r', byte(i)}) {
					t.Fatalf("RD receive %d: %+v", i, wc)
				}
			}
			collect(t, cqa, n, 5*time.Second)
			got := waitWC(t, b.cq, 1) // UD: loss-free on loopback here, but not promised; one is enough to show the path
			if got[0].QPN != b.qp.QPN() || b.buf[0] != 'u' {
				t.Fatalf("UD receive: %+v", got[0])
			}
		})
	}
}

// TestRDIdleReclaim: a peer with nothing outstanding is forgotten after
// IdleTimeout, and contact is made again when traffic resumes.
func TestRDIdleReclaim(t *testing.T) {
	// The test decides when peers may be reclaimed (setIdleTimeout): with
	// a 30 ms timeout throughout, a loaded machine reclaimed them before
	// the test had looked.
	rd := RDConfig{IdleTimeout: time.Hour}
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, rd)
	for i := range 2 {
		mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*10, 10)}}))
	}
	mustPost(t, p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("one"), AH: p.ahAB}))
	collect(t, p.cqa, 1, time.Minute)
	collect(t, p.cqb, 1, time.Minute)
	if peersOf(p.qa) != 1 || peersOf(p.qb) != 1 {
		t.Fatalf("peers %d / %d", peersOf(p.qa), peersOf(p.qb))
	}
	setIdleTimeout(p.qa, time.Millisecond)
	setIdleTimeout(p.qb, time.Millisecond)
	eventually(t, "both peers reclaimed", func() bool { return peersOf(p.qa) == 0 && peersOf(p.qb) == 0 })
	setIdleTimeout(p.qa, time.Hour)
	setIdleTimeout(p.qb, time.Hour)
	if p.a.dev.Stats().RDPeersReclaimed.Load() == 0 || p.b.dev.Stats().RDPeersReclaimed.Load() == 0 {
		t.Fatal("not counted")
	}
	mustPost(t, p.qa.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, Inline: []byte("two"), AH: p.ahAB}))
	if wc := collect(t, p.cqa, 1, 5*time.Second)[0]; wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	if wc := collect(t, p.cqb, 1, time.Second)[0]; wc.Status != Success || string(p.b.buf[10:13]) != "two" {
		t.Fatalf("%+v", wc)
	}
}

// TestRDFaultsReleaseMemory runs the RD fault cases, closes everything,
// and checks that the heap is back near where it started: no peer state,
// buffered frame or WR outlives its devices (goroutines are checked by
// goleak in TestMain).
func TestRDFaultsReleaseMemory(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t.Run("faults", TestRDImpaired)
	t.Run("restart", TestRDPeerRestart)
	t.Run("gone", TestRDPeerGone)
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap %d → %d bytes (%+d)", before.HeapAlloc, after.HeapAlloc, grown)
	if grown > 8<<20 { // each of the dozen devices the cases open holds far more than this while open
		t.Fatalf("the heap grew by %d bytes after every device closed", grown)
	}
}
