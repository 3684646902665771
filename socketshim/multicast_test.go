package socketshim

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// TestPacketConnMulticast: two PacketConns bound to a group's port join
// it, a third sends to the group address with WriteTo, and both read the
// datagram with its source; after one leaves, only the other reads the
// next. IPv4 over a namespace's loopback, IPv6 over a veth pair inside
// it (IPv6 multicast does not loop back over lo), as qp's TestMulticast.
func TestPacketConnMulticast(t *testing.T) {
	for _, tc := range []struct {
		network, any, group, ifname string
		setup                       []string
	}{
		{"udp4", "0.0.0.0", "239.12.34.57", "lo", []string{"link set lo up multicast on", "route add 224.0.0.0/4 dev lo"}},
		{"udp6", "[::]", "ff15::4321", "mc0", []string{"link set lo up", "link add mc0 type veth peer name mc1",
			"link set mc0 up", "link set mc1 up", "-6 addr add fd00:75:65::1/64 dev mc0 nodad"}},
	} {
		t.Run(tc.network, func(t *testing.T) {
			ns := netnstest.New(t, tc.setup...)
			var members []*PacketConn
			var src *PacketConn
			var ifi *net.Interface
			port := 48000 + int(netnstest.Seq())
			netnstest.In(t, ns, func() {
				var err error
				if ifi, err = net.InterfaceByName(tc.ifname); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					c, err := ListenPacket(tc.network, fmt.Sprintf("%s:%d", tc.any, port), &Options{ReuseAddr: true})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { c.Close() })
					members = append(members, c)
				}
				if src, err = ListenPacket(tc.network, tc.any+":0", nil); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { src.Close() })
			})
			group := &net.UDPAddr{IP: net.ParseIP(tc.group), Port: port}
			for i, m := range members {
				if err := m.JoinGroup(ifi, group); err != nil {
					t.Fatalf("member %d: %v", i, err)
				}
			}
			if err := src.SetMulticastInterface(ifi); err != nil {
				t.Fatal(err)
			}
			read := func(c *PacketConn, d time.Duration) (string, net.Addr, error) {
				buf := make([]byte, 2048)
				c.SetReadDeadline(time.Now().Add(d))
				n, from, err := c.ReadFrom(buf)
				return string(buf[:n]), from, err
			}
			if _, err := src.WriteTo([]byte("to the group"), group); err != nil {
				t.Fatal(err)
			}
			srcPort := src.LocalAddr().(*net.UDPAddr).Port
			for i, m := range members {
				got, from, err := read(m, 5*time.Second)
				if err != nil || got != "to the group" || from.(*net.UDPAddr).Port != srcPort {
					t.Fatalf("member %d read %q from %v: %v", i, got, from, err)
				}
			}
			if err := members[0].LeaveGroup(ifi, group); err != nil {
				t.Fatal(err)
			}
			// The kernel still hands the member that left the group's
			// datagrams (IP_MULTICAST_ALL: the other socket on the host is
			// a member); its stack drops them, counted, and reads nothing.
			left := members[0].Device().Stats()
			dropped := left.RxUnknownQP.Load()
			if _, err := src.WriteTo([]byte("again"), group); err != nil {
				t.Fatal(err)
			}
			if got, _, err := read(members[1], 5*time.Second); err != nil || got != "again" {
				t.Fatalf("the member still in the group read %q: %v", got, err)
			}
			for end := time.Now().Add(5 * time.Second); left.RxUnknownQP.Load() == dropped; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the member that left never saw the datagram: nothing tested")
				}
			}
			if got, _, err := read(members[0], 0); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the member that left read %q: %v", got, err)
			}
		})
	}
}

// TestPacketConnGroupRefusals: a group address that is not one, and a
// Reliable PacketConn joining or sending to a group, are refused with a
// clear error; the PacketConn keeps working.
func TestPacketConnGroupRefusals(t *testing.T) {
	c, err := ListenPacket("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.JoinGroup(nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err == nil {
		t.Fatal("joining a unicast address")
	}
	r, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	group := &net.UDPAddr{IP: net.IPv4(239, 1, 2, 3), Port: 9}
	if err := r.JoinGroup(nil, group); !errors.Is(err, errReliableGroup) {
		t.Fatalf("a Reliable PacketConn joining: %v", err)
	}
	if _, err := r.WriteTo([]byte("x"), group); !errors.Is(err, errReliableGroup) {
		t.Fatalf("a Reliable PacketConn sending to a group: %v", err)
	}
	if _, err := c.WriteTo([]byte("still"), r.LocalAddr()); err != nil {
		t.Fatal(err)
	}
}

// TestPacketConnBroadcast: with SetBroadcast, WriteTo a subnet's
// broadcast address reaches both PacketConns bound to the port (a veth
// pair in a namespace: 10.9.0.0/24); without it, WriteTo the limited
// broadcast address fails with EACCES, as sendto does.
func TestPacketConnBroadcast(t *testing.T) {
	ns := netnstest.New(t, "link set lo up", "link add bc0 type veth peer name bc1", "link set bc0 up", "link set bc1 up",
		"addr add 10.9.0.1/24 brd 10.9.0.255 dev bc0")
	port := 48500 + int(netnstest.Seq())
	var members []*PacketConn
	var src *PacketConn
	netnstest.In(t, ns, func() {
		for range 2 {
			c, err := ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", port), &Options{ReuseAddr: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			members = append(members, c)
		}
		var err error
		if src, err = ListenPacket("udp4", "10.9.0.1:0", nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
	})
	if _, err := src.WriteTo([]byte("x"), &net.UDPAddr{IP: net.IPv4bcast, Port: port}); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("WriteTo 255.255.255.255 without SetBroadcast: %v, want EACCES", err)
	}
	if err := src.SetBroadcast(true); err != nil {
		t.Fatal(err)
	}
	if _, err := src.WriteTo([]byte("to all"), &net.UDPAddr{IP: net.IPv4(10, 9, 0, 255), Port: port}); err != nil {
		t.Fatal(err)
	}
	for i, m := range members {
		buf := make([]byte, 64)
		m.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := m.ReadFrom(buf)
		if err != nil || string(buf[:n]) != "to all" || from.String() != src.LocalAddr().String() {
			t.Fatalf("member %d read %q from %v: %v", i, buf[:n], from, err)
		}
	}
}
