package qp

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/memstat"
	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// Issue 18: one RD QP with 1,000 to 100,000 peers. The benchmarks here
// measure what one frame and one first contact cost as the peer table
// grows; scale_mem_test.go measures the memory.

// rdQPFor is rdQPOn for benchmarks too.
func rdQPFor(tb testing.TB, n *node, rd RDConfig) (*QP, *CQ) {
	tb.Helper()
	cq, err := n.dev.CreateCQ(8192)
	if err != nil {
		tb.Fatal(err)
	}
	return n.newQP(QPAttr{Type: RD, SendCQ: cq, RecvCQ: cq, RD: rd, Caps: QPCaps{MaxSendWR: 4096, MaxRecvWR: 4096}}), cq
}

// fillRDPeers gives q n idle peers at addresses no socket has
// (10.x.y.z), whose last traffic was at: what a QP has after serving n
// clients that went quiet (each is quiet, holds nothing, and is
// reclaimable, as such a client is).
func fillRDPeers(tb testing.TB, q *QP, n int, at time.Time) {
	tb.Helper()
	r := q.rd
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range n {
		k := reliability.PeerKey{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 4791), QPN: 7}
		if _, err := r.ep.PeerFor(at, k); err != nil {
			tb.Fatal(err)
		}
	}
	r.arm(at)
}

// rdContactor makes validated first contacts with an RD QP from sockets
// at distinct 127.1.x.y addresses, each contact a new (address, QP
// number): Hello, the Challenge read, then a Data frame with the issued
// token (a zero-length RDMA Write to STag 0, which the QP refuses in its
// ack: the contact needs no receive posted), and the ack read.
type rdContactor struct {
	tb    testing.TB
	socks []*net.UDPConn
	to    netip.AddrPort
	dst   uint32
	n     int
	buf   []byte
}

func newRDContactor(tb testing.TB, to *node, dst *QP, socks int) *rdContactor {
	tb.Helper()
	c := &rdContactor{tb: tb, to: to.sock.LocalAddr(), dst: dst.QPN(), buf: make([]byte, 2048)}
	for i := range socks {
		s, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 1, byte(i>>8), byte(i+1))})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		c.socks = append(c.socks, s)
	}
	return c
}

// contact makes the next first contact; it reports whether the QP took
// the peer (its ack came), false when it answered nothing (refused).
func (c *rdContactor) contact() bool {
	tb := c.tb
	s := c.socks[c.n%len(c.socks)]
	qpn := uint32(1 + c.n/len(c.socks))
	c.n++
	epoch, mine := 0x5ca1e000|qpn, 0x5eed000000000000|uint64(c.n)
	send := func(b []byte) {
		if _, err := s.WriteToUDPAddrPort(b, c.to); err != nil {
			tb.Fatal(err)
		}
	}
	read := func(want reliability.Type) *reliability.Header {
		s.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			n, _, err := s.ReadFromUDPAddrPort(c.buf)
			if err != nil {
				return nil
			}
			h := new(reliability.Header)
			if h.Parse(c.buf[:n-udiwarp.CRCSize]) == nil && h.DstQPN == qpn && (h.Type == want || want == reliability.Ack && h.HasAck) {
				return h
			}
		}
	}
	send(rdFrame(reliability.Fields{Type: reliability.Hello, DstQPN: c.dst, SrcQPN: qpn, Epoch: epoch, Init: true, Issued: mine}, nil))
	h := read(reliability.Challenge)
	if h == nil || h.Token != mine {
		tb.Fatalf("contact %d: no Challenge", c.n)
	}
	w := udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite)})
	send(rdFrame(reliability.Fields{Type: reliability.Data, DstQPN: c.dst, SrcQPN: qpn, Epoch: epoch, Token: h.Issued, Seq: 0,
		Init: true, Issued: mine, AckNow: true}, w))
	return read(reliability.Ack) != nil
}

// BenchmarkRDFirstContact: a validated first contact with a QP whose
// table is full of idle peers, so each one reclaims the longest-idle
// peer. What the QP spends on it must not grow with the table: a flood of
// first contacts from many addresses would otherwise cost the QP a scan
// of every peer each.
func BenchmarkRDFirstContact(b *testing.B) {
	for _, peers := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			srv := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
			q, _ := rdQPFor(b, srv, RDConfig{MaxPeers: peers})
			fillRDPeers(b, q, peers, time.Now().Add(-time.Second))
			c := newRDContactor(b, srv, q, 256)
			b.ReportAllocs()
			for b.Loop() {
				if !c.contact() {
					b.Fatal("a first contact refused")
				}
			}
			b.StopTimer()
			if n := peersOf(q); n != peers {
				b.Fatalf("%d peers, cap %d", n, peers)
			}
		})
	}
}

// BenchmarkRDSendAtPeers: an RD Send and its ack between two QPs, the
// receiver holding peers idle peers besides: one frame's cost must not
// grow with the peers a QP has.
func BenchmarkRDSendAtPeers(b *testing.B) {
	for _, peers := range []int{0, 1000, 10000, 100000} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			x := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
			y := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
			qx, cqx := rdQPFor(b, x, RDConfig{})
			qy, cqy := rdQPFor(b, y, RDConfig{MaxPeers: peers + 1})
			fillRDPeers(b, qy, peers, time.Now())
			const depth = 64
			for i := range depth {
				mustPost(b, qy.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{y.mr.SGE(4096*i, 4096)}}))
			}
			wr := SendWR{Flags: FlagSignaled, SGL: []SGE{x.mr.SGE(0, 64)}, AH: x.ah(y, qy)}
			recv := RecvWR{SGL: make([]SGE, 1)}
			wc := make([]WorkCompletion, 1)
			await := func(cq *CQ) {
				for end := time.Now().Add(5 * time.Second); cq.Poll(wc) == 0; {
					if time.Now().After(end) {
						b.Fatal("no completion")
					}
				}
				if wc[0].Status != Success {
					b.Fatalf("%+v", wc[0])
				}
			}
			for b.Loop() {
				if err := qx.PostSend(&wr); err != nil {
					b.Fatal(err)
				}
				await(cqy)
				recv.ID, recv.SGL[0] = wc[0].ID, y.mr.SGE(4096*int(wc[0].ID), 4096)
				if err := qy.PostRecv(&recv); err != nil {
					b.Fatal(err)
				}
				await(cqx)
			}
		})
	}
}

// rdRawPeer is a validated hand-driven RD peer of a QP (contactFrom): it
// can send more Data frames in its session.
type rdRawPeer struct {
	tb           testing.TB
	s            *net.UDPConn
	to           netip.AddrPort
	dst, qpn     uint32
	epoch        uint32
	mine, theirs uint64
	buf          []byte
}

// contactFrom makes a validated first contact from s as QP qpn: Hello,
// Challenge, and a first Data frame (a zero-length RDMA Write the QP
// refuses in its ack), whose ack it reads; false if none came (refused).
func contactFrom(tb testing.TB, s *net.UDPConn, to *node, dst *QP, qpn, epoch uint32) (*rdRawPeer, bool) {
	tb.Helper()
	p := &rdRawPeer{tb: tb, s: s, to: to.sock.LocalAddr(), dst: dst.QPN(), qpn: qpn, epoch: epoch, mine: 0xfeed0000<<32 | uint64(epoch), buf: make([]byte, 2048)}
	p.send(rdFrame(reliability.Fields{Type: reliability.Hello, Window: 64, DstQPN: p.dst, SrcQPN: qpn, Epoch: epoch, Init: true, Issued: p.mine}, nil))
	h := p.read(reliability.Challenge)
	if h == nil || h.Token != p.mine {
		tb.Fatalf("%v QP %d: no Challenge", s.LocalAddr(), qpn)
	}
	p.theirs = h.Issued
	return p, p.data(0)
}

func (p *rdRawPeer) send(b []byte) {
	if _, err := p.s.WriteToUDPAddrPort(b, p.to); err != nil {
		p.tb.Fatal(err)
	}
}

func (p *rdRawPeer) read(want reliability.Type) *reliability.Header {
	p.s.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, _, err := p.s.ReadFromUDPAddrPort(p.buf)
		if err != nil {
			return nil
		}
		h := new(reliability.Header)
		if h.Parse(p.buf[:n-udiwarp.CRCSize]) == nil && h.DstQPN == p.qpn && (h.Type == want || want == reliability.Ack && h.HasAck) {
			return h
		}
	}
}

// data sends Data frame seq (a zero-length RDMA Write to STag 0) and
// reports whether the QP acknowledged it.
func (p *rdRawPeer) data(seq uint32) bool {
	w := udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite)})
	p.send(rdFrame(reliability.Fields{Type: reliability.Data, Window: 64, DstQPN: p.dst, SrcQPN: p.qpn, Epoch: p.epoch, Token: p.theirs, Seq: seq,
		Init: true, Issued: p.mine, AckNow: true}, w))
	return p.read(reliability.Ack) != nil
}

func (p *rdRawPeer) key() rdKey { return rdKey{p.s.LocalAddr().(*net.UDPAddr).AddrPort(), p.qpn} }

// rdHas reports which of the peers q has state for.
func rdHas(q *QP, peers ...*rdRawPeer) []bool {
	var has []bool
	for _, p := range peers {
		_, ok := rdInfo(q, p.key())
		has = append(has, ok)
	}
	return has
}

// TestRDReclaimOrder: at the cap a first contact reclaims the peer
// touched longest ago, never one with work of ours outstanding; at the
// per-address limit, the address's own least recent peer; a reclaimed
// peer comes back with a new session.
func TestRDReclaimOrder(t *testing.T) {
	srv := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	// The Send it posts to a peer stays outstanding (the raw peer never
	// acks) for the whole test: the retransmission timeout is floored
	// at 20 s.
	q, _ := rdQPFor(t, srv, RDConfig{MaxPeers: 4, MaxPeersPerAddr: 2, IdleTimeout: time.Hour,
		Config: reliability.Config{Granularity: 20 * time.Second, MaxRTO: 20 * time.Second}})
	socks := make([]*net.UDPConn, 8)
	for i := range socks {
		s, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 2, 0, byte(i+1))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		socks[i] = s
	}
	check := func(what string, peers []*rdRawPeer, want ...bool) {
		t.Helper()
		if got := rdHas(q, peers...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: peers held %v, want %v", what, got, want)
		}
		if err := checkRDAccounting(q); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var c [8]*rdRawPeer
	for i := range 4 {
		var ok bool
		if c[i], ok = contactFrom(t, socks[i], srv, q, 1, uint32(100+i)); !ok {
			t.Fatalf("contact %d refused", i)
		}
	}
	// Touched since: c0 (more traffic), then c2 (a Send of ours to it,
	// outstanding). The longest untouched is c1, then c3.
	if !c[0].data(1) {
		t.Fatal("c0: no ack")
	}
	ah, _ := srv.pd.CreateAH(c[2].key().addr, 1)
	if err := q.PostSend(&SendWR{ID: 7, Inline: []byte("held"), AH: ah}); err != nil {
		t.Fatal(err)
	}
	if c[2].read(reliability.Data) == nil {
		t.Fatal("c2: the Send did not come")
	}
	c[4], _ = contactFrom(t, socks[4], srv, q, 1, 104)
	check("c4 came", c[:5], true, false, true, true, true)
	c[5], _ = contactFrom(t, socks[5], srv, q, 1, 105)
	check("c5 came", c[:6], true, false, true, false, true, true)
	c[6], _ = contactFrom(t, socks[6], srv, q, 1, 106)
	check("c6 came", c[:7], false, false, true, false, true, true, true)
	// c2 has work outstanding: it is never the one reclaimed, whatever
	// comes.
	for i := range 3 {
		contactFrom(t, socks[7], srv, q, uint32(10+i), uint32(200+i))
	}
	if !rdHas(q, c[2])[0] {
		t.Fatal("a peer with work outstanding was reclaimed")
	}
	// The per-address limit (2): a third QP from socks[7]'s address
	// reclaims that address's least recent peer, not the table's: QP 12
	// took QP 10's place, and QP 13 takes QP 11's.
	a := &rdRawPeer{s: socks[7], qpn: 11}
	b := &rdRawPeer{s: socks[7], qpn: 12}
	check("socks[7]'s two", []*rdRawPeer{a, b}, true, true)
	contactFrom(t, socks[7], srv, q, 13, 213)
	check("socks[7]'s third", []*rdRawPeer{a, b, {s: socks[7], qpn: 13}, c[2]}, false, true, true, true)
	if n := srv.dev.Stats().RDAddrLimited.Load(); n != 0 {
		t.Fatalf("%d first contacts refused for their address", n)
	}
	// A reclaimed peer comes back in a new session.
	if _, ok := contactFrom(t, socks[1], srv, q, 1, 301); !ok {
		t.Fatal("c1 could not come back")
	}
	check("c1 back", []*rdRawPeer{{s: socks[1], qpn: 1}, c[2]}, true, true)
	if n := peersOf(q); n != 4 {
		t.Fatalf("%d peers, cap 4", n)
	}
}

// TestRDChurnAtCap: 24 client QPs take turns sending to a server whose
// cap is 8, round after round, so each one's state is reclaimed before
// its next turn and its next Send finds none: the table stays at the
// cap, every Send completes Success and is delivered once, in order (the
// client reopens, and what provably never arrived goes again), and two
// peers the server has a Send outstanding to (their receives not posted
// yet) are never reclaimed.
func TestRDChurnAtCap(t *testing.T) {
	const maxPeers, nodes, perNode, rounds = 8, 3, 8, 4
	srv := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qs, cqs := rdQPFor(t, srv, RDConfig{MaxPeers: maxPeers, IdleTimeout: time.Hour,
		Config: reliability.Config{RNRRetries: -1, RNRDelay: time.Millisecond, MaxRTO: 20 * time.Millisecond}})
	for i := range nodes * perNode * rounds {
		mustPost(t, qs.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{srv.mr.SGE(i*8, 8)}}))
	}
	type client struct {
		n  *node
		q  *QP
		cq *CQ
	}
	var cs []client
	for range nodes {
		n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
		for range perNode {
			q, cq := rdQPFor(t, n, RDConfig{})
			cs = append(cs, client{n, q, cq})
		}
	}
	pinned := []int{0, 13}
	for _, i := range pinned {
		ah, _ := srv.pd.CreateAH(cs[i].n.sock.LocalAddr(), cs[i].q.QPN())
		if err := qs.PostSend(&SendWR{ID: uint64(1000 + i), Flags: FlagSignaled, Inline: []byte("pin"), AH: ah}); err != nil {
			t.Fatal(err)
		}
	}
	pinKeys := func() error {
		for _, i := range pinned {
			if _, ok := rdInfo(qs, rdKey{cs[i].n.sock.LocalAddr(), cs[i].q.QPN()}); !ok {
				return fmt.Errorf("client %d, with a Send outstanding, was reclaimed", i)
			}
		}
		if n := rdPeerCount(qs); n > maxPeers {
			return fmt.Errorf("%d peers, cap %d", n, maxPeers)
		}
		return checkRDAccounting(qs)
	}
	eventually(t, "the pinned peers' state", func() bool { return pinKeys() == nil })
	got := map[[2]byte]int{}
	for r := range rounds {
		for i, c := range cs {
			ah := c.n.ah(srv, qs)
			for try := 0; ; try++ {
				retx := c.n.dev.Stats().RDRetransmits.Load()
				if err := c.q.PostSend(&SendWR{ID: uint64(r), Flags: FlagSignaled, Inline: []byte{byte(i), byte(r)}, AH: ah}); err != nil {
					t.Fatal(err)
				}
				wc := collect(t, c.cq, 1, 10*time.Second)[0]
				if wc.Status == Success {
					break
				}
				// A Send that went twice before the server's Challenge
				// came back (a machine slower than the client's timeout)
				// cannot be proved undelivered: RemoteAbortedError, as
				// docs/wire.md §11.2 says. It goes again; the server
				// must still take it exactly once.
				if wc.Status != RemoteAbortedError || c.n.dev.Stats().RDRetransmits.Load() == retx || try == 3 {
					t.Fatalf("round %d client %d (try %d): %+v", r, i, try, wc)
				}
				t.Logf("round %d client %d: sent again after %v (its frame went twice before the Challenge)", r, i, wc.Status)
			}
			for _, wc := range collect(t, cqs, 1, 10*time.Second) {
				if wc.Status != Success || wc.Opcode != WCRecv {
					t.Fatalf("server: %+v", wc)
				}
				m := [2]byte(srv.buf[wc.ID*8 : wc.ID*8+2])
				if got[m]++; got[m] > 1 || int(m[0]) != i || int(m[1]) != r {
					t.Fatalf("round %d client %d: the server received %v (%d times)", r, i, m, got[m])
				}
			}
			if err := pinKeys(); err != nil {
				t.Fatalf("round %d client %d: %v", r, i, err)
			}
		}
	}
	if n := peersOf(qs); n != maxPeers {
		t.Fatalf("%d peers after the churn, cap %d", n, maxPeers)
	}
	st := srv.dev.Stats()
	if rec := st.RDPeersReclaimed.Load(); rec < uint64((len(cs)-len(pinned))*rounds-(maxPeers-len(pinned))) { // every contact but the first to each free place
		t.Fatalf("%d peers reclaimed", rec)
	}
	// The pinned peers take their Sends at last: Success, once.
	for _, i := range pinned {
		mustPost(t, cs[i].q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{cs[i].n.mr.SGE(0, 8)}}))
	}
	for _, wc := range collect(t, cqs, len(pinned), 10*time.Second) {
		if wc.Status != Success || wc.ID < 1000 {
			t.Fatalf("server's pinned Send: %+v", wc)
		}
	}
	for _, i := range pinned {
		if wc := collect(t, cs[i].cq, 1, time.Second)[0]; wc.Status != Success || string(cs[i].n.buf[:3]) != "pin" {
			t.Fatalf("client %d: %+v", i, wc)
		}
	}
	t.Logf("%d reclaimed, %d restarts, %d challenges", st.RDPeersReclaimed.Load(), st.RDPeerRestarts.Load(), st.RDChallenges.Load())
}

// TestRDSpoofedContactFlood: first contacts from 100,000 forged
// addresses, a Hello or a first Data frame with a guessed token from
// each, while a real peer sends Sends: no spoofed source gets state (it
// cannot answer the Challenge), so the table holds the real peer alone,
// the heap and the resident set grow by less than the documented cap's
// worth of peers, every Send arrives once and in order, and the counters
// show the refusals.
func TestRDSpoofedContactFlood(t *testing.T) {
	sp := spoof.NewT(t)
	srv := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qs, cqs := rdQPFor(t, srv, RDConfig{})
	cl := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qc, cqc := rdQPFor(t, cl, RDConfig{})
	const sends, flood = 2000, 100000
	for i := range sends {
		mustPost(t, qs.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{srv.mr.SGE(i*8, 8)}}))
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rss0, err := memstat.RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	st := srv.dev.Stats()
	rx0 := st.RxDatagrams.Load()

	// The real peer sends throughout, a window of 64 Sends at a time.
	done := make(chan error, 1)
	go func() {
		ah := cl.ah(srv, qs)
		wcs := make([]WorkCompletion, 64)
		posted, completed := 0, 0
		for end := time.Now().Add(time.Minute); completed < sends; {
			for ; posted < sends && posted-completed < 64; posted++ {
				b := []byte{byte(posted >> 8), byte(posted)}
				if err := qc.PostSend(&SendWR{ID: uint64(posted), Flags: FlagSignaled, Inline: b, AH: ah}); err != nil {
					done <- err
					return
				}
			}
			k := cqc.Poll(wcs)
			for _, wc := range wcs[:k] {
				if wc.Status != Success {
					done <- fmt.Errorf("the real peer's Send %d: %v", wc.ID, wc.Status)
					return
				}
			}
			completed += k
			if k == 0 {
				if time.Now().After(end) {
					done <- fmt.Errorf("%d of %d Sends completed", completed, sends)
					return
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
		done <- nil
	}()

	dst := srv.sock.LocalAddr()
	write := udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite)})
	var frame []byte
	for i := range flood {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(200 + i>>16), byte(i >> 8), byte(i)}), 4791)
		f := reliability.Fields{Type: reliability.Hello, Window: 64, DstQPN: qs.QPN(), SrcQPN: 1, Epoch: uint32(i) + 1, Init: true, Issued: uint64(i) + 1}
		if i%2 == 0 {
			frame = udiwarp.SealDatagram(reliability.Append(frame[:0], &f), 0)
		} else { // the first Data frame, with a guess at the Challenge's token
			f.Type, f.Token = reliability.Data, uint64(i)*0x9e3779b97f4a7c15
			frame = udiwarp.SealDatagram(append(reliability.Append(frame[:0], &f), write...), 0)
		}
		if err := sp.Send(src, dst, frame); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 {
			// Paced to what the QP reads, so that the forgeries reach it
			// rather than a full socket's floor.
			sent := uint64(i + 1)
			eventually(t, "the QP reading the flood", func() bool { return st.RxDatagrams.Load()-rx0+2000 >= sent })
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := collect(t, cqs, sends, 30*time.Second)
	for i, wc := range got {
		if wc.Status != Success || wc.ID != uint64(i) || srv.buf[i*8] != byte(i>>8) || srv.buf[i*8+1] != byte(i) {
			t.Fatalf("the server's receive %d: %+v", i, wc)
		}
	}
	// The forgeries the kernel delivered are all read (some may have
	// been dropped at a full socket: they count in neither).
	rxSettled(srv.sock)
	cst := cl.dev.Stats()
	forged := st.RxDatagrams.Load() - rx0 - (cst.RDDataSent.Load() + cst.RDControlSent.Load())

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	rss, err := memstat.RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// The cap's worth: MaxPeers (1024) peers at 4 KiB, more than an
	// active peer costs (BenchmarkPeerMemory). The resident set grows by
	// the receive path's buffers and the runtime's share besides (the race
	// detector's too: 27 MiB under -race, 9 MiB without), so it is held
	// to 64 MiB: state for the flood's 100,000 sources would be 200 MiB.
	const capBytes, rssBound = defaultMaxPeers * 4096, 64 << 20
	heapGrew, rssGrew := int64(after.HeapAlloc)-int64(before.HeapAlloc), rss-rss0
	rejected, challenges, withheld := st.RDRejected.Load(), st.RDChallenges.Load(), st.TxRepliesWithheld.Load()
	t.Logf("%d forged frames read of %d; %d rejected, %d challenges, %d replies withheld; heap +%d B, RSS +%d B",
		forged, flood, rejected, challenges, withheld, heapGrew, rssGrew)
	if n := peersOf(qs); n != 1 || st.RDPeers.Load() != 1 {
		t.Fatalf("%d peers (%d made) after the flood, want the real peer alone", n, st.RDPeers.Load())
	}
	if heapGrew > capBytes || rssGrew > rssBound {
		t.Fatalf("the heap grew %d bytes (bound %d), the resident set %d (bound %d)", heapGrew, capBytes, rssGrew, rssBound)
	}
	// Every forged frame read was refused: the Hellos drew a Challenge
	// (or, over the reply budget, none), the Data frames were rejected
	// (and drew one too). Most of the flood must have been read for that
	// to mean anything; a loaded machine's full socket may drop some
	// (the issue 31 campaign saw 90 % read with a second suite beside).
	if forged < flood/2 || rejected < forged-flood/2 || challenges+withheld < forged {
		t.Fatalf("%d forged frames read: %d rejected, %d challenges, %d withheld", forged, rejected, challenges, withheld)
	}
}

// TestRDIdlePeerLetsGoOfItsRing: a peer quiet for rdCompactAfter keeps
// its state but not its sender's ring (an idle peer's largest part), and
// sends again as before, in the same session; a receiver's ring grown by
// frames out of order goes the same way.
func TestRDIdlePeerLetsGoOfItsRing(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{IdleTimeout: time.Hour})
	slots := func() int {
		n := -1
		p.qa.rd.mu.Lock()
		defer p.qa.rd.mu.Unlock()
		p.qa.rd.ep.EachPeer(func(pi *reliability.PeerInfo) { n = pi.SendSlots })
		return n
	}
	for i := range 2 {
		mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*8, 8)}}))
	}
	mustPost(t, p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("one"), AH: p.ahAB}))
	if wc := collect(t, p.cqa, 1, 10*time.Second)[0]; wc.Status != Success || slots() <= 0 {
		t.Fatalf("%+v, %d slots", wc, slots())
	}
	eventually(t, "the idle peer's ring let go of", func() bool { return slots() == 0 })
	restarts := p.b.dev.Stats().RDPeerRestarts.Load() + p.a.dev.Stats().RDPeerRestarts.Load()
	mustPost(t, p.qa.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, Inline: []byte("two"), AH: p.ahAB}))
	if wc := collect(t, p.cqa, 1, 10*time.Second)[0]; wc.Status != Success || slots() <= 0 {
		t.Fatalf("%+v, %d slots", wc, slots())
	}
	for i, wc := range collect(t, p.cqb, 2, 10*time.Second) {
		if wc.Status != Success || string(p.b.buf[i*8:i*8+3]) != []string{"one", "two"}[i] {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	if n := p.b.dev.Stats().RDPeerRestarts.Load() + p.a.dev.Stats().RDPeerRestarts.Load(); n != restarts || peersOf(p.qa) != 1 {
		t.Fatalf("%d restarts, %d peers: the session did not go on", n-restarts, peersOf(p.qa))
	}

	// A receiver's ring, grown by a frame ahead of a gap, goes too once
	// the gap is filled and the peer is quiet.
	s, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	raw, ok := contactFrom(t, s, p.b, p.qb, 9, 77)
	if !ok {
		t.Fatal("raw contact refused")
	}
	rcvSlots := func() int {
		if pi, ok := rdInfo(p.qb, raw.key()); ok {
			return pi.RecvSlots
		}
		return -1
	}
	raw.data(40) // held ahead of the gap at 1
	if n := rcvSlots(); n < 64 {
		t.Fatalf("%d receive slots holding frame 40", n)
	}
	for seq := uint32(1); seq < 40; seq++ {
		raw.data(seq)
	}
	eventually(t, "the receiver's ring let go of", func() bool { return rcvSlots() == 0 })
}
