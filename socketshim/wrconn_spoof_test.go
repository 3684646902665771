package socketshim

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/qp"
)

// Off-path attacks on the Write-Record socket: datagrams from forged
// sources (internal/spoof), and a validated peer that ignores its credits.

// udSendFrame returns the datagram a UD QP numbered ShimQPN sends for a
// solicited Send of payload (headers, payload and CRC), as a plain UDP
// socket captures it: what a Write-Record socket's control messages look
// like on the wire, ready to be replayed from a forged source.
func udSendFrame(t *testing.T, payload []byte) []byte {
	t.Helper()
	dev, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	sock, err := dev.Bind("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pd := dev.AllocPD()
	cq, err := dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(qp.QPAttr{Type: qp.UD, SendCQ: cq, RecvCQ: cq,
		Caps: qp.QPCaps{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 512}})
	if err != nil {
		t.Fatal(err)
	}
	if q.QPN() != ShimQPN {
		t.Fatalf("QP number %d", q.QPN())
	}
	for _, st := range []qp.ModifyAttr{{State: qp.StateInit, Socket: sock}, {State: qp.StateRTR}, {State: qp.StateRTS}} {
		if err := q.Modify(st); err != nil {
			t.Fatal(err)
		}
	}
	capture, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer capture.Close()
	ah, err := pd.CreateAH(capture.LocalAddr().(*net.UDPAddr).AddrPort(), ShimQPN)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.PostSend(&qp.SendWR{ID: 1, Flags: qp.FlagSolicited, Inline: payload, AH: ah}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	capture.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := capture.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// forgedHello is a well-formed HELLO (as docs and wrconn.go describe it)
// from an attacker who knows everything but the cookie: the ring it names
// is real if given, its epoch new, its cookies random.
func forgedHello(stag uint32, base uint64, slots, size int) []byte {
	m := make([]byte, 64)
	rand.Read(m)
	binary.BigEndian.PutUint32(m, wrMagic)
	m[4], m[5], m[6], m[7] = wrHello, wrAnswer, 0, 0
	binary.BigEndian.PutUint32(m[24:], stag)
	binary.BigEndian.PutUint32(m[28:], uint32(slots))
	binary.BigEndian.PutUint32(m[32:], uint32(size))
	binary.BigEndian.PutUint32(m[36:], 0)
	binary.BigEndian.PutUint64(m[40:], base)
	return m
}

func addrPort(a net.Addr) netip.AddrPort { return a.(*net.UDPAddr).AddrPort() }

// waitFor polls cond until it holds; the bound only fails a hung test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// exchange has from write records [first, first+n) to to, and to read
// them all, whole and in order, from from.
func exchange(t *testing.T, from, to *WRConn, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		from.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := from.WriteTo(record(i, 100), to.LocalAddr()); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	buf := make([]byte, 200)
	for i := first; i < first+n; {
		to.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, src, err := to.ReadFrom(buf)
		if err != nil {
			t.Fatalf("record %d of %d..%d from %v never arrived: %v", i, first, first+n-1, from.LocalAddr(), err)
		}
		if src.String() != from.LocalAddr().String() {
			continue // another writer's
		}
		if j, ok := checkRecord(buf[:k]); !ok || j != i {
			t.Fatalf("record %d: got #%d, intact %v", i, j, ok)
		}
		i++
	}
}

// TestWRConnSpoofedHello: a HELLO forged from an established peer's
// address, naming its real ring, with a new epoch and no valid cookie,
// changes nothing: both directions of the flow keep delivering every
// record. (Before the cookie, the victim took it for a restart, numbered
// its records from 0 again, and the real peer discarded them all.)
func TestWRConnSpoofedHello(t *testing.T) {
	s := spoof.NewT(t)
	a, b := wrPair(t, nil, nil)
	exchange(t, a, b, 0, 5)
	exchange(t, b, a, 0, 5)
	aAP, bAP := addrPort(a.LocalAddr()), addrPort(b.LocalAddr())

	b.mu.Lock()
	p := b.peers[aAP]
	tx := p.tx
	b.mu.Unlock()
	before := b.Stats().Handshakes.Load()
	if err := s.Send(aAP, bAP, udSendFrame(t, forgedHello(tx.stag, tx.base, tx.slots, tx.size))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the forged HELLO to be taken", func() bool { return b.Stats().Handshakes.Load() > before })

	exchange(t, b, a, 5, 20)
	exchange(t, a, b, 5, 20)

	// Every other kind, forged from a's address with the real session
	// epochs and rings (all an attacker might guess) but no valid cookie,
	// changes nothing either: no BYE forgets, no CREDIT or PROBE moves the
	// numbering or re-keys, no CHALLENGE is taken.
	b.mu.Lock()
	p = b.peers[aAP]
	epoch, view, rxTag, txTag := p.epoch, p.myEpoch, p.rx.mr.STag(), p.tx.stag
	b.mu.Unlock()
	for _, k := range []struct {
		kind byte
		n    int
		stag uint32
	}{{wrBye, wrShortLen, 0}, {wrCredit, wrNoteLen, txTag}, {wrProbe, wrNoteLen, rxTag}, {wrChallenge, wrShortLen, 0}} {
		m := make([]byte, k.n)
		rand.Read(m)
		binary.BigEndian.PutUint32(m, wrMagic)
		m[4], m[5], m[6], m[7] = k.kind, 0, 0, 0
		binary.BigEndian.PutUint64(m[8:], epoch)
		binary.BigEndian.PutUint64(m[16:], view)
		if k.n == wrNoteLen {
			binary.BigEndian.PutUint32(m[24:], k.stag)
			binary.BigEndian.PutUint32(m[28:], 0)
			binary.BigEndian.PutUint64(m[32:], 1000) // far ahead
		}
		ch, disc := b.Stats().Challenges.Load(), b.Stats().Discarded.Load()
		if err := s.Send(aAP, bAP, udSendFrame(t, m)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the forged message to be taken", func() bool {
			return b.Stats().Challenges.Load() > ch || b.Stats().Discarded.Load() > disc
		})
		b.mu.Lock()
		q := b.peers[aAP]
		same := q == p && q.epoch == epoch && q.rx != nil && q.rx.mr.STag() == rxTag && q.tx.stag == txTag
		b.mu.Unlock()
		if !same {
			t.Fatalf("a forged message of kind %d changed the peer's state", k.kind)
		}
	}
	if b.Stats().Rekeys.Load() != 0 {
		t.Fatalf("%d re-keys", b.Stats().Rekeys.Load())
	}
	exchange(t, b, a, 25, 20)
	exchange(t, a, b, 25, 20)
}

// TestWRConnSpoofedHelloFlood: HELLOs from 100 forged sources create no
// peer and register no ring (each draws one CHALLENGE, no larger than the
// HELLO); a real peer still connects.
func TestWRConnSpoofedHelloFlood(t *testing.T) {
	s := spoof.NewT(t)
	v, err := ListenWriteRecord("udp4", "127.0.0.1:0", nil) // MaxPeers 64
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	vAP := addrPort(v.LocalAddr())
	frame := udSendFrame(t, forgedHello(0x1234, 0, 32, 65536))
	const n = 100
	txBefore := v.Device().Stats().TxBytes.Load()
	for i := range n {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 3, byte(i / 200), byte(1 + i%200)}), uint16(20000+i))
		if err := s.Send(src, vAP, frame); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the forged HELLOs to be taken", func() bool { return v.Stats().Handshakes.Load() >= n })
	v.mu.Lock()
	peers, rings := len(v.peers), len(v.byTag)
	v.mu.Unlock()
	if peers != 0 || rings != 0 || v.Stats().Challenges.Load() != n {
		t.Fatalf("%d forged HELLOs made %d peers and %d rings, drew %d challenges", n, peers, rings, v.Stats().Challenges.Load())
	}
	if sent := v.Device().Stats().TxBytes.Load() - txBefore; sent > uint64(n*len(frame)) {
		t.Fatalf("%d forged HELLOs of %d bytes drew %d bytes", n, len(frame), sent)
	}

	r, err := ListenWriteRecord("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	exchange(t, r, v, 0, 3)
	exchange(t, v, r, 0, 3)
}

// lastID is the WR ID of a flood's last record, the one signaled.
const lastID = 0x6c617374

// TestWRConnCreditOverrun: a validated peer that writes far more records
// than its credits allow (its stack posts them straight, thousands in a
// burst, while the reader reads nothing) neither overflows the receiver's
// CQ nor stops another peer's records.
func TestWRConnCreditOverrun(t *testing.T) {
	v, m := wrPair(t, nil, nil)
	o, err := ListenWriteRecord("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	exchange(t, m, v, 0, 2)
	exchange(t, o, v, 0, 2)
	vAP := addrPort(v.LocalAddr())

	m.mu.Lock()
	p := m.peers[vAP]
	tx, ah := p.tx, p.ah
	m.mu.Unlock()
	// Each record lands 8 bytes into a slot: the receiver discards it
	// without reading the slot (a writer breaking the credits rewrites
	// slots as they are read, which the receiver survives by checking a
	// record's header again after the copy, but which the race detector
	// would rightly report), and counts it against the writer all the
	// same.
	const n = 30000
	var hdr [24]byte
	start := time.Now()
	for i := 0; i < n; i++ {
		seq := tx.next + uint64(i)
		binary.BigEndian.PutUint64(hdr[:], seq)
		wr := qp.SendWR{ID: inlineID, Opcode: qp.OpWriteRecord, AH: ah, RemoteSTag: tx.stag,
			RemoteTO: tx.base + seq%uint64(tx.slots)*uint64(tx.size) + 8, Inline: hdr[:]}
		if i == n-1 {
			wr.ID, wr.Flags = lastID, qp.FlagSignaled // completes after every earlier send
		}
		for {
			err := m.pc.q.PostSend(&wr)
			if err == nil {
				break
			}
			if !errors.Is(err, qp.ErrQueueFull) || time.Since(start) > 20*time.Second {
				t.Fatalf("flood record %d: %v", i, err)
			}
			m.reapNow()
			time.Sleep(50 * time.Microsecond)
		}
	}
	// The flood has landed (what the kernel kept of it): the last
	// record's send completed, after every earlier one's (loopback queued
	// each at v as it was sent, or dropped it), and v has read and handled
	// all its socket holds.
	wcs := make([]qp.WorkCompletion, 16)
	for sent := false; !sent; {
		k := m.pc.scq.Poll(wcs)
		for _, wc := range wcs[:k] {
			sent = sent || wc.ID == lastID
			if wc.ID < uint64(m.o.SendSlots) {
				m.pc.free.Put(int(wc.ID)) // as reapNow does
			}
		}
		if k == 0 {
			if time.Since(start) > time.Minute {
				t.Fatal("the flood's last record never completed")
			}
			time.Sleep(time.Millisecond)
		}
	}
	for v.pc.sock.Progress(256) > 0 {
	}
	rx := v.Device().Stats().RxDatagrams.Load()
	if v.pc.rcq.Overflowed() {
		t.Fatalf("the receive CQ overflowed (%d completions refused)", v.pc.rcq.Dropped())
	}
	exchange(t, o, v, 2, 25)
	exchange(t, v, o, 0, 10)
	t.Logf("flood: %d records, %d datagrams received, %d records complete, %d overruns, %d discarded, CQ depth %d",
		n, rx, v.Device().Stats().RxWRComplete.Load(), v.Stats().Overruns.Load(), v.Stats().Discarded.Load(), v.pc.rcq.Depth())
	v.mu.Lock()
	forgotten := v.peers[addrPort(m.LocalAddr())] == nil
	v.mu.Unlock()
	if v.Stats().Overruns.Load() == 0 || !forgotten {
		t.Fatalf("the overrun was not counted (%d), or its writer not forgotten (%v)", v.Stats().Overruns.Load(), forgotten)
	}
}

// TestWRConnQuietPeersExpire: peers that stay quiet for IdleTimeout are
// forgotten on both sides (their rings deregistered: the first side to
// expire the other tells it with a BYE), and a later write finds the peer
// again.
func TestWRConnQuietPeersExpire(t *testing.T) {
	o := &WROptions{IdleTimeout: 200 * time.Millisecond}
	a, b := wrPair(t, o, o)
	exchange(t, a, b, 0, 3)
	exchange(t, b, a, 0, 3)
	for _, c := range []*WRConn{a, b} {
		waitFor(t, "the quiet peer to expire", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.peers) == 0 && len(c.byTag) == 0
		})
	}
	if a.Stats().Expired.Load()+b.Stats().Expired.Load() == 0 { // the first to expire tells the other (BYE)
		t.Fatalf("expired: %d, %d", a.Stats().Expired.Load(), b.Stats().Expired.Load())
	}
	exchange(t, a, b, 3, 3)
	exchange(t, b, a, 3, 3)
}
