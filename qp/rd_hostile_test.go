package qp

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

func rdFrame(f reliability.Fields, payload []byte) []byte {
	b := reliability.Append(nil, &f)
	return udiwarp.SealDatagram(append(b, payload...), 0)
}

func sendTo(t *testing.T, c *net.UDPConn, b []byte, n *node) {
	t.Helper()
	if _, err := c.WriteToUDPAddrPort(b, n.sock.LocalAddr()); err != nil {
		t.Fatal(err)
	}
}

func peersOf(q *QP) int {
	return rdPeerCount(q)
}

// TestRDUnvalidatedSources: frames from a source that never received a
// Challenge create no state, inject nothing, and get back at most a
// Challenge no larger than what they sent.
func TestRDUnvalidatedSources(t *testing.T) {
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, RDConfig{})
	mustPost(t, qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 100)}}))
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: 5, QN: udiwarp.DatagramQN(qb.QPN(), udiwarp.QueueSend), MSN: 1})
	send = append(send, "injected"...)
	// An RDMA Read Request for 1 GiB: the amplification a spoofed source
	// would want.
	read := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpReadRequest), ULP: 5, QN: udiwarp.DatagramQN(qb.QPN(), udiwarp.QueueReadRequest), MSN: 1})
	read = udiwarp.AppendReadRequest(read, &udiwarp.ReadRequestFields{SinkSTag: 1, Size: 1 << 30, SourceSTag: b.mr.STag(), SourceTO: b.mr.Addr()})
	const flood = 2000
	for i := range flood {
		var f []byte
		switch i % 4 {
		case 0: // first contact
			f = rdFrame(reliability.Fields{Type: reliability.Hello, DstQPN: qb.QPN(), SrcQPN: uint32(i + 1), Epoch: 9, Init: true, Issued: 1}, nil)
		case 1: // data with a guessed token
			f = rdFrame(reliability.Fields{Type: reliability.Data, DstQPN: qb.QPN(), SrcQPN: uint32(i + 1), Epoch: 9, Token: uint64(i) * 0x9e3779b97f4a7c15,
				Init: true, Issued: 1}, send)
		case 2: // data without a token: a Send, or a Read Request
			payload := send
			if i%8 == 2 {
				payload = read
			}
			f = rdFrame(reliability.Fields{Type: reliability.Data, DstQPN: qb.QPN(), SrcQPN: uint32(i + 1), Epoch: 9, Seq: 0}, payload)
		case 3: // an ack for things never sent
			f = rdFrame(reliability.Fields{Type: reliability.Ack, DstQPN: qb.QPN(), SrcQPN: uint32(i + 1), Epoch: 9, Token: 1,
				Ack: &reliability.AckBlock{Cumulative: 1000}}, nil)
		}
		sendTo(t, c, f, b)
	}
	// The same first contacts and guessed tokens from 32 more addresses.
	for k := range 32 {
		o, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 1, byte(k+1))})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 16 {
			sendTo(t, o, rdFrame(reliability.Fields{Type: reliability.Hello, DstQPN: qb.QPN(), SrcQPN: uint32(i + 1), Epoch: 3, Init: true, Issued: 1}, nil), b)
			sendTo(t, o, rdFrame(reliability.Fields{Type: reliability.Data, DstQPN: qb.QPN(), SrcQPN: uint32(i + 1), Epoch: 3, Token: uint64(k<<8 | i),
				Init: true, Issued: 1}, send), b)
		}
		o.Close()
	}
	// b has read every frame (its socket buffer holds them all) and
	// handled it: each reply it made is sent (in the handling, as it
	// answers) and, on loopback, in c's queue unless c's buffer was full.
	st := b.dev.Stats()
	total := uint64(flood + 32*16*2)
	eventually(t, "b to read every frame", func() bool { return st.RxDatagrams.Load() >= total })
	rxSettled(b.sock)
	if n := st.RxDatagrams.Load(); n != total {
		t.Fatalf("b read %d datagrams, %d were sent", n, total)
	}
	// Every datagram b sent, to any source, was a Challenge.
	if tx, ch := st.TxDatagrams.Load(), st.RDChallenges.Load(); tx != ch {
		t.Fatalf("b sent %d datagrams, %d of them Challenges", tx, ch)
	}
	// Read what came back: Challenges only, each no larger than its cause.
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	replies := 0
	for {
		n, rerr := 0, error(nil)
		if err := raw.Read(func(fd uintptr) bool { n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT); return true }); err != nil {
			t.Fatal(err)
		}
		if rerr == unix.EAGAIN {
			break // all b sent c has been read (loopback queued it inside b's sendmsg)
		}
		if rerr != nil {
			t.Fatal(rerr)
		}
		replies++
		var h reliability.Header
		if err := h.Parse(buf[:n-udiwarp.CRCSize]); err != nil || h.Type != reliability.Challenge {
			t.Fatalf("reply %d: %v %v", replies, h.Type, err)
		}
		if n > 24+8+4+1+18 { // smaller than the smallest frame that causes one (a Hello is 36 bytes)
			t.Fatalf("a %d-byte reply", n)
		}
	}
	t.Logf("%d frames, %d replies, %d rejected, %d challenges", flood, replies, st.RDRejected.Load(), st.RDChallenges.Load())
	if st.RDReadsServed.Load() != 0 {
		t.Fatal("a Read Request from an unvalidated source was served")
	}
	if peersOf(qb) != 0 || st.RDPeers.Load() != 0 {
		t.Fatalf("%d peers with state after unvalidated frames", peersOf(qb))
	}
	if replies > flood*3/4 || replies == 0 {
		t.Fatalf("%d replies to %d frames", replies, flood)
	}
	// Nothing injected: a validated peer's Send, sent after every frame
	// above, takes receive 1, still posted, and is b's first completion.
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{})
	if err := qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("valid"), AH: a.ah(b, qb)}); err != nil {
		t.Fatal(err)
	}
	if wc := collect(t, cqa, 1, 30*time.Second)[0]; wc.Status != Success {
		t.Fatalf("the validated peer's Send: %+v", wc)
	}
	if wc := collect(t, cqb, 1, 30*time.Second)[0]; wc.ID != 1 || wc.Status != Success || wc.SourceQPN != qa.QPN() || string(b.buf[:5]) != "valid" {
		t.Fatalf("b's first completion: %+v, %q; want the validated peer's Send", wc, b.buf[:5])
	}
}

// TestRDSpoofedPeer: frames that claim a live peer's address and QP — a
// new epoch, a guessed token — neither reset nor feed that peer.
func TestRDSpoofedPeer(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0", ReuseAddr())
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{})
	qb, cqb := rdQPOn(t, b, RDConfig{})
	ah := a.ah(b, qb)
	for i := range 4 {
		mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*10, 10)}}))
	}
	mustPost(t, qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("one"), AH: ah}))
	if wc := collect(t, cqa, 1, 5*time.Second)[0]; wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	collect(t, cqb, 1, time.Second)

	// The attacker shares a's address and port (SO_REUSEADDR), so its
	// datagrams carry a's source exactly.
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
		return serr
	}}
	pc, err := lc.ListenPacket(t.Context(), "udp4", a.sock.LocalAddr().String())
	if err != nil {
		t.Skipf("cannot share the peer's port: %v", err)
	}
	defer pc.Close()
	evil := pc.(*net.UDPConn)
	send := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: qa.QPN(), QN: udiwarp.DatagramQN(qb.QPN(), udiwarp.QueueSend), MSN: 2})
	send = append(send, "spoofed"...)
	pi, _ := rdInfo(qa, rdKey{b.sock.LocalAddr(), qb.QPN()})
	epoch := pi.Epoch // a's epoch in its session with b
	bst := b.dev.Stats()
	toB := bst.RxDatagrams.Load()
	for i := range 200 {
		for _, f := range []reliability.Fields{
			// a "restart": a new epoch with a guessed token
			{Type: reliability.Data, DstQPN: qb.QPN(), SrcQPN: qa.QPN(), Epoch: epoch + 1 + uint32(i), Token: uint64(i), Seq: 1, Init: true, Issued: 5},
			// the live epoch, a guessed token, the next sequence number
			{Type: reliability.Data, DstQPN: qb.QPN(), SrcQPN: qa.QPN(), Epoch: epoch, Token: uint64(i) << 20, Seq: 1},
			// a Challenge to a pretending b restarted
			{Type: reliability.Challenge, DstQPN: qa.QPN(), SrcQPN: qb.QPN(), Epoch: 77, Token: uint64(i), Init: true, Issued: 3},
		} {
			dst := b.sock.LocalAddr()
			if f.Type == reliability.Challenge {
				dst = a.sock.LocalAddr()
			}
			if _, err := evil.WriteToUDPAddrPort(rdFrame(f, send), dst); err != nil {
				t.Fatal(err)
			}
			if dst == b.sock.LocalAddr() {
				toB++
			}
		}
		if i%16 == 15 || i == 199 {
			// Paced by what b has read, so that b's socket buffer drops
			// none of them however slowly b runs, and every one is seen.
			eventually(t, "b reading the spoofed frames", func() bool { return bst.RxDatagrams.Load() >= toB })
		}
	}
	// Unicast to a port two sockets share goes to one of them: let a have
	// its port back.
	evil.Close()
	rxSettled(b.sock)
	if r := b.dev.Stats().RDRejected.Load(); r < 400 {
		t.Fatalf("b rejected %d of the 400 spoofed Data frames", r)
	}
	if n := b.dev.Stats().RDPeerRestarts.Load() + a.dev.Stats().RDPeerRestarts.Load(); n != 0 {
		t.Fatalf("%d restarts from spoofed frames", n)
	}
	noCompletion(t, cqb) // nothing injected: b read every spoofed frame (rxSettled above)
	// The real exchange goes on, in order, undisturbed.
	for i := 2; i <= 4; i++ {
		mustPost(t, qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, Inline: []byte{byte('0' + i)}, AH: ah}))
	}
	for _, wc := range collect(t, cqa, 3, 5*time.Second) {
		if wc.Status != Success {
			t.Fatalf("%+v", wc)
		}
	}
	for i, wc := range collect(t, cqb, 3, time.Second) {
		if wc.Status != Success || b.buf[(i+1)*10] != byte('2'+i) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
}

// TestRDPeerCap: more peers than the cap take turns; idle ones are
// reclaimed, and the table never exceeds the cap.
func TestRDPeerCap(t *testing.T) {
	const maxPeers = 4
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, RDConfig{MaxPeers: maxPeers})
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	const senders = 12
	for i := range senders {
		mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*10, 10)}}))
	}
	for i := range senders {
		q, cq := rdQPOn(t, a, RDConfig{})
		if err := q.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, Inline: []byte{byte(i)}, AH: a.ah(b, qb)}); err != nil {
			t.Fatal(err)
		}
		if wc := collect(t, cq, 1, 5*time.Second)[0]; wc.Status != Success {
			t.Fatalf("sender %d: %+v", i, wc)
		}
		if n := peersOf(qb); n > maxPeers {
			t.Fatalf("%d peers, cap %d", n, maxPeers)
		}
	}
	collect(t, cqb, senders, time.Second)
	if r := b.dev.Stats().RDPeersReclaimed.Load(); r < senders-maxPeers {
		t.Fatalf("%d reclaimed", r)
	}
}
