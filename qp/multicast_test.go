package qp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// TestMulticast sends one datagram to a group with two member QPs on two
// devices (and a non-member QP beside one of them); both members receive
// it, the non-member does not. It runs in a namespace of its own whose
// loopback carries multicast, so no datagram leaves the test.
func TestMulticast(t *testing.T) {
	// IPv6 multicast does not loop back over lo, so IPv6 uses a veth pair
	// with both ends inside the namespace.
	for _, tc := range []struct {
		network, any, group, ifname string
		setup                       []string
	}{
		{"udp4", "0.0.0.0", "239.12.34.56", "lo", []string{"link set lo up multicast on", "route add 224.0.0.0/4 dev lo"}},
		{"udp6", "[::]", "ff15::1234", "mc0", []string{"link set lo up", "link add mc0 type veth peer name mc1",
			"link set mc0 up", "link set mc1 up", "-6 addr add fd00:75:64::1/64 dev mc0 nodad"}},
	} {
		t.Run(tc.network, func(t *testing.T) {
			ns := newNetns(t, tc.setup...)
			inNetns(t, ns, func() {
				lo, err := net.InterfaceByName(tc.ifname)
				if err != nil {
					t.Fatal(err)
				}
				port := 47000 + int(netnstest.Seq())
				group := netip.MustParseAddr(tc.group)
				var members []*node
				var outsider *QP
				for i := range 2 {
					dev, err := Open(DeviceConfig{})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { dev.Close() })
					sock, err := dev.Bind(tc.network, fmt.Sprintf("%s:%d", tc.any, port), ReuseAddr())
					if err != nil {
						t.Fatal(err)
					}
					n := &node{t: t, dev: dev, sock: sock, pd: dev.AllocPD(), buf: make([]byte, 4096)}
					n.cq, _ = dev.CreateCQ(16)
					n.mr, _ = n.pd.RegisterMemory(n.buf, AccessLocalWrite)
					n.qp = n.newQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq})
					if err := n.qp.JoinMulticast(group, lo); err != nil {
						t.Fatal(err)
					}
					mustPost(t, n.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{n.mr.SGE(0, 4096)}}))
					if i == 1 {
						outsider = n.newQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq})
						mustPost(t, outsider.PostRecv(&RecvWR{ID: 99, SGL: []SGE{n.mr.SGE(0, 4096)}}))
					}
					members = append(members, n)
				}
				src := newNode(t, DeviceConfig{}, tc.network, tc.any+":0")
				if err := src.sock.SetMulticastInterface(lo); err != nil {
					t.Fatal(err)
				}
				ah, err := src.pd.CreateAH(netip.AddrPortFrom(group, uint16(port)), MulticastQPN)
				if err != nil {
					t.Fatal(err)
				}
				if err := src.qp.PostSend(&SendWR{Inline: []byte("to the group"), AH: ah}); err != nil {
					t.Fatal(err)
				}
				for i, m := range members {
					wc := waitWC(t, m.cq, 1)[0]
					if wc.Status != Success || wc.ID != uint64(i) || string(m.buf[:wc.Len]) != "to the group" || wc.SourceQPN != src.qp.QPN() {
						t.Fatalf("member %d: %+v", i, wc)
					}
					// The outsider's receive stays posted: m's device has read
					// and handled the datagram (and any copy of it).
					quietDrained(t, m.cq, src, m)
				}
				// After leaving, a member hears nothing more.
				if err := members[0].qp.LeaveMulticast(group); err != nil {
					t.Fatal(err)
				}
				mustPost(t, members[0].qp.PostRecv(&RecvWR{ID: 50, SGL: []SGE{members[0].mr.SGE(0, 4096)}}))
				mustPost(t, members[1].qp.PostRecv(&RecvWR{ID: 51, SGL: []SGE{members[1].mr.SGE(0, 4096)}}))
				mustPost(t, src.qp.PostSend(&SendWR{Inline: []byte("again"), AH: ah}))
				if wc := waitWC(t, members[1].cq, 1)[0]; wc.ID != 51 {
					t.Fatalf("%+v", wc)
				}
				// members[0] hears nothing: the datagram reached every socket
				// that takes it when it reached members[1]'s (one sendmsg,
				// one loopback delivery), and members[0]'s has none left
				// unread, handled.
				quietDrained(t, members[0].cq, src, members[0])
			})
		})
	}
}

// TestMulticastUDOnly: only a UD QP joins a group; an RD QP is refused,
// so a datagram to a group (which anyone may send) never reaches a
// reliable QP's receives.
func TestMulticastUDOnly(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	rd, _ := rdQPOn(t, n, RDConfig{})
	if err := rd.JoinMulticast(netip.MustParseAddr("239.1.2.3"), nil); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("an RD QP joining a group: %v, want ErrInvalidAttr", err)
	}
}
