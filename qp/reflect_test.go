package qp

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/net/ipv6"
)

// reflectTarget is a device with every kind of datagram QP a forged
// datagram can reach: a UD QP that reports errors, an RD QP and a region.
type reflectTarget struct {
	*node
	ud, rd *QP
}

func newReflectTarget(t *testing.T, n *node) *reflectTarget {
	t.Helper()
	ud := n.newQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq, ReportErrors: true})
	rd, _ := rdQPOn(t, n, RDConfig{})
	return &reflectTarget{node: n, ud: ud, rd: rd}
}

// hostileFrames returns one datagram of every frame type the target can be
// sent, with whether it must draw a reply (a reply no larger than itself):
// -1 it may not, 0 it may, 1 it must.
func (r *reflectTarget) hostileFrames() []hostileFrame {
	seal := func(f []byte) []byte { return udiwarp.SealDatagram(f, 0) }
	untagged := func(dst uint32, op udiwarp.Opcode, q udiwarp.Queue, payload []byte) []byte {
		h := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(op), ULP: 77, QN: udiwarp.DatagramQN(dst, q), MSN: 3})
		return append(h, payload...)
	}
	ud, rd := r.ud.QPN(), r.rd.QPN()
	send := func(n int) []byte { return seal(untagged(ud, udiwarp.OpSend, udiwarp.QueueSend, make([]byte, n))) }
	term := untagged(ud, udiwarp.OpTerminate, udiwarp.QueueTerminate, nil)
	term, _ = udiwarp.AppendTerminate(term, &udiwarp.TerminateFields{Code: udiwarp.DDPUntaggedNoBuffer, SegmentLengthValid: true,
		DDPSegmentLength: 40, DDPHeader: untagged(5, udiwarp.OpSend, udiwarp.QueueSend, nil)})
	readReq := udiwarp.AppendReadRequest(untagged(ud, udiwarp.OpReadRequest, udiwarp.QueueReadRequest, nil),
		&udiwarp.ReadRequestFields{SinkSTag: 1, Size: 1 << 30, SourceSTag: r.mr.STag()})
	wrec := func(stag uint32, n int) []byte {
		h := udiwarp.AppendWriteRecord(nil, &udiwarp.WriteRecordFields{Last: true, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
			STag: stag, MSN: 1, MessageLength: uint32(n), DstQPN: ud, SrcQPN: 77})
		return seal(append(h, make([]byte, n)...))
	}
	badCRC := send(100)
	badCRC[len(badCRC)-1] ^= 0xff
	rdf := func(f reliability.Fields, payload []byte) []byte {
		f.DstQPN, f.SrcQPN = rd, 77
		if f.Epoch == 0 {
			f.Epoch = 9
		}
		return seal(append(reliability.Append(nil, &f), payload...))
	}
	rdSend := untagged(rd, udiwarp.OpSend, udiwarp.QueueSend, []byte("injected"))
	rdSend[2], rdSend[3], rdSend[4], rdSend[5] = 0, 0, 0, 77
	rdRead := udiwarp.AppendReadRequest(untagged(rd, udiwarp.OpReadRequest, udiwarp.QueueReadRequest, nil),
		&udiwarp.ReadRequestFields{SinkSTag: 1, Size: 1 << 30, SourceSTag: r.mr.STag()})
	rdRead[2], rdRead[3], rdRead[4], rdRead[5] = 0, 0, 0, 77
	rdBadCRC := rdf(reliability.Fields{Type: reliability.Hello, Init: true, Issued: 1}, nil)
	rdBadCRC[len(rdBadCRC)-1] ^= 0xff
	return []hostileFrame{
		{"UD Send, empty, no receive", send(0), 0},
		{"UD Send, 23 B, no receive", send(23), 0},
		{"UD Send, 24 B, no receive", send(24), 1},
		{"UD Send, 1000 B, no receive", send(1000), 1},
		{"UD Send with SE, empty, no receive", seal(untagged(ud, udiwarp.OpSendSE, udiwarp.QueueSend, nil)), 0},
		{"UD Send longer than its receive", send(2), 0},
		{"UD Send to an unknown QP", seal(untagged(ud+500, udiwarp.OpSend, udiwarp.QueueSend, nil)), -1},
		{"UD Terminate", seal(term), -1},
		{"UD Read Request", seal(readReq), -1},
		{"Write-Record, unknown STag", wrec(0x00ffff01, 0), -1},
		{"Write-Record, region without remote write", wrec(r.mr.STag(), 1000), -1},
		{"bad CRC", badCRC, -1},
		{"truncated", []byte{0x42, 0x43}, -1},
		{"frame type 0", seal([]byte{0x40, 0x43, 0, 0, 0}), -1},
		{"RD Hello", rdf(reliability.Fields{Type: reliability.Hello, Init: true, Issued: 1}, nil), 1},
		{"RD Hello from QP 0", func() []byte {
			b := reliability.Append(nil, &reliability.Fields{Type: reliability.Hello, DstQPN: rd, Epoch: 9, Init: true, Issued: 1})
			return seal(b)
		}(), -1},
		{"RD Data, no segment, no INIT", rdf(reliability.Fields{Type: reliability.Data, Token: 5, Seq: 1}, nil), 0},
		{"RD Data, no segment, INIT", rdf(reliability.Fields{Type: reliability.Data, Token: 5, Init: true, Issued: 1}, nil), 0},
		{"RD Data, Send, guessed token", rdf(reliability.Fields{Type: reliability.Data, Token: 5, Init: true, Issued: 1}, rdSend), 1},
		{"RD Data, Read Request, guessed token", rdf(reliability.Fields{Type: reliability.Data, Token: 5}, rdRead), 1},
		{"RD Ack without state", rdf(reliability.Fields{Type: reliability.Ack, Token: 5, Ack: &reliability.AckBlock{Cumulative: 3}}, nil), -1},
		{"RD Challenge unsolicited", rdf(reliability.Fields{Type: reliability.Challenge, Token: 5, Init: true, Issued: 1}, nil), -1},
		{"RD bad CRC", rdBadCRC, -1},
	}
}

type hostileFrame struct {
	name  string
	b     []byte
	reply int
}

// replies sends b from src (forged) to the target and returns the replies
// the target sent for it, read by victim, the socket that owns src. It
// knows the target has finished with b when a second datagram, sent once
// the target has read b, has been read too (one receive goroutine per
// socket handles datagrams in turn); the device's send count says how many
// replies to wait for.
func (r *reflectTarget) replies(t *testing.T, sp *spoof.Sender, src netip.AddrPort, victim *net.UDPConn, b []byte) [][]byte {
	t.Helper()
	st := r.dev.Stats()
	tx0, rx0 := st.TxDatagrams.Load(), st.RxDatagrams.Load()
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), r.sock.LocalAddr().Port())
	if err := sp.Send(src, dst, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the target to read the datagram", func() bool { return st.RxDatagrams.Load() >= rx0+1 })
	marker := udiwarpSend(4000, 77, nil) // an unknown QP: draws nothing
	if err := sp.Send(src, dst, marker); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the target to read the marker", func() bool { return st.RxDatagrams.Load() >= rx0+2 })
	n := int(st.TxDatagrams.Load() - tx0)
	out := make([][]byte, 0, n)
	buf := make([]byte, 1<<16)
	for range n {
		victim.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, from, err := victim.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("the target sent %d replies; reading them: %v", n, err)
		}
		if from != dst {
			t.Fatalf("a reply from %v, not the target %v", from, dst)
		}
		out = append(out, append([]byte(nil), buf[:k]...))
	}
	return out
}

// TestNoAmplification sends every frame type, from a forged source that
// has proved nothing, to a device with a UD QP that reports errors and an
// RD QP. Every reply is no larger than the datagram that drew it
// (docs/wire.md §6.2 and §11.2), and the frames that must draw one (a
// Challenge for a Hello, an error message for a Send large enough to
// carry it) still do.
//
// The target's socket is bound to 127.0.0.1, to the IPv4 wildcard and to
// the dual-stack IPv6 wildcard: the destination check must let unicast
// replies through on each.
func TestNoAmplification(t *testing.T) {
	for _, bind := range []struct{ network, addr string }{{"udp4", "127.0.0.1:0"}, {"udp4", "0.0.0.0:0"}, {"udp", "[::]:0"}} {
		t.Run(bind.network+" "+bind.addr, func(t *testing.T) { testNoAmplification(t, bind.network, bind.addr) })
	}
}

func testNoAmplification(t *testing.T, network, addr string) {
	sp := spoof.NewT(t)
	r := newReflectTarget(t, newNode(t, DeviceConfig{}, network, addr))
	victim, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 77, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	src := victim.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, f := range r.hostileFrames() {
		t.Run(f.name, func(t *testing.T) {
			if f.name == "UD Send longer than its receive" {
				if err := r.ud.PostRecv(&RecvWR{SGL: []SGE{r.mr.SGE(0, 1)}}); err != nil {
					t.Fatal(err)
				}
			}
			got := r.replies(t, sp, src, victim, f.b)
			sent := 0
			for _, b := range got {
				sent += len(b)
			}
			if sent > len(f.b) {
				t.Errorf("a %d-byte datagram drew %d bytes back (%d replies): %.2fx", len(f.b), sent, len(got), float64(sent)/float64(len(f.b)))
			}
			switch {
			case f.reply < 0 && len(got) > 0:
				t.Errorf("%d replies to a datagram that draws none", len(got))
			case f.reply > 0 && len(got) != 1:
				t.Errorf("%d replies, want one", len(got))
			}
		})
	}
	r.cq.Poll(make([]WorkCompletion, 16))
}

// TestNoReplyToMulticast sends datagrams that draw replies when sent to one
// host (a Send with no receive posted, at the group's QP number and at a
// member QP's own number; an RD Hello) to a multicast group that two
// devices joined. No member answers: a reply to a group-addressed datagram
// would multiply by the group's size what an off-path sender sends. IPv4
// sends from a forged source, IPv6 (which the raw sender does not forge)
// from the victim's own socket.
func TestNoReplyToMulticast(t *testing.T) {
	for _, tc := range []struct {
		network, any, group, ifname, victim string
		setup                               []string
	}{
		{"udp4", "0.0.0.0", "239.12.34.57", "lo", "127.77.0.2:0", []string{"link set lo up multicast on", "route add 224.0.0.0/4 dev lo"}},
		{"udp6", "[::]", "ff15::1235", "mc0", "[fd00:75:64::1]:0", []string{"link set lo up", "link add mc0 type veth peer name mc1",
			"link set mc0 up", "link set mc1 up", "-6 addr add fd00:75:64::1/64 dev mc0 nodad"}},
	} {
		t.Run(tc.network, func(t *testing.T) {
			ns := newNetns(t, tc.setup...)
			inNetns(t, ns, func() { testNoReplyToMulticast(t, tc.network, tc.any, tc.group, tc.ifname, tc.victim, false) })
		})
		// Delayed by the receive impairment, a datagram is delivered later,
		// from a timer: the destination the socket read for it goes with it.
		t.Run(tc.network+" delayed on the way in", func(t *testing.T) {
			ns := newNetns(t, tc.setup...)
			inNetns(t, ns, func() { testNoReplyToMulticast(t, tc.network, tc.any, tc.group, tc.ifname, tc.victim, true) })
		})
	}
}

func testNoReplyToMulticast(t *testing.T, network, any, groupName, ifname, victimAddr string, delayed bool) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	port := 47500 + int(netnstest.Seq())
	group := netip.MustParseAddr(groupName)
	to := netip.AddrPortFrom(group, uint16(port))
	var members []*reflectTarget
	for range 2 {
		var cfg DeviceConfig
		if delayed {
			cfg.ImpairRx = &Impairment{Seed: 1, Delay: 20 * time.Millisecond}
		}
		n := newNode(t, cfg, network, fmt.Sprintf("%s:%d", any, port), ReuseAddr())
		r := newReflectTarget(t, n)
		if err := r.ud.JoinMulticast(group, ifi); err != nil {
			t.Fatal(err)
		}
		members = append(members, r)
	}
	// The QP numbers are the same on both devices (created in the same order).
	ud, rd := members[0].ud.QPN(), members[0].rd.QPN()
	victim, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(victimAddr)))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	src := victim.LocalAddr().(*net.UDPAddr).AddrPort()
	var send, unicast func(b []byte) error // to the group; to one member
	if group.Is4() {
		sp := spoof.NewT(t) // in the namespace: its packets go to its loopback
		send = func(b []byte) error { return sp.Send(src, to, b) }
		one := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
		unicast = func(b []byte) error { return sp.Send(src, one, b) }
	} else {
		if err := ipv6.NewPacketConn(victim).SetMulticastInterface(ifi); err != nil {
			t.Fatal(err)
		}
		send = func(b []byte) error { _, err := victim.WriteToUDPAddrPort(b, to); return err }
		one := netip.AddrPortFrom(src.Addr(), uint16(port))
		unicast = func(b []byte) error { _, err := victim.WriteToUDPAddrPort(b, one); return err }
	}
	sendTo := func(qpn uint32) []byte { return udiwarpSend(qpn, 77, make([]byte, 1000)) }
	hello := udiwarp.SealDatagram(reliability.Append(nil, &reliability.Fields{Type: reliability.Hello, DstQPN: rd, SrcQPN: 77, Epoch: 9, Init: true, Issued: 1}), 0)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"UD Send to the group's QP number", sendTo(MulticastQPN)},
		{"UD Send to a member's QP number", sendTo(ud)},
		{"RD Hello", hello},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tx0, rx0 []uint64
			for _, m := range members {
				tx0 = append(tx0, m.dev.Stats().TxDatagrams.Load())
				rx0 = append(rx0, m.dev.Stats().RxDatagrams.Load())
			}
			var garbage uint64 // unicast datagrams sent besides
			total := func() (n uint64) {
				for _, m := range members {
					n += m.dev.Stats().RxDatagrams.Load()
				}
				return n
			}
			total0 := total()
			read := func(k uint64) {
				for i, m := range members {
					eventually(t, "the members to read the datagram", func() bool { return m.dev.Stats().RxDatagrams.Load() >= rx0[i]+k })
				}
				eventually(t, "every datagram read", func() bool { return total() >= total0+k*uint64(len(members))+garbage })
			}
			if err := send(tc.b); err != nil {
				t.Fatal(err)
			}
			if delayed {
				// A unicast datagram read while the group's waits in the
				// link: the socket's last control message is now a unicast
				// one, and the group's datagram must keep its own.
				if err := unicast([]byte("not a frame: drawn no reply")); err != nil {
					t.Fatal(err)
				}
				garbage++
			}
			read(1)
			if err := send(udiwarpSend(4000, 77, nil)); err != nil { // the marker
				t.Fatal(err)
			}
			read(2)
			for i, m := range members {
				if n := m.dev.Stats().TxDatagrams.Load() - tx0[i]; n != 0 {
					t.Errorf("member %d sent %d replies to a datagram addressed to the group", i, n)
				}
				if m.dev.Stats().TxRepliesWithheld.Load() == 0 {
					t.Errorf("member %d withheld no reply", i)
				}
			}
		})
	}
	for _, m := range members {
		m.cq.Poll(make([]WorkCompletion, 16))
	}
}
