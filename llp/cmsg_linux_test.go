package llp

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cmsgBytes builds one control message as the kernel lays it out.
func cmsgBytes(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func groCmsg(size int32) []byte {
	return cmsgBytes(unix.SOL_UDP, unix.UDP_GRO, binary.NativeEndian.AppendUint32(nil, uint32(size)))
}

func pktinfo4(spec, addr string) []byte {
	p := unix.Inet4Pktinfo{Ifindex: 1, Spec_dst: netip.MustParseAddr(spec).As4(), Addr: netip.MustParseAddr(addr).As4()}
	return cmsgBytes(unix.IPPROTO_IP, unix.IP_PKTINFO, unsafe.Slice((*byte)(unsafe.Pointer(&p)), unix.SizeofInet4Pktinfo))
}

func pktinfo6(addr string) []byte {
	p := unix.Inet6Pktinfo{Addr: netip.MustParseAddr(addr).As16(), Ifindex: 1}
	return cmsgBytes(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, unsafe.Slice((*byte)(unsafe.Pointer(&p)), unix.SizeofInet6Pktinfo))
}

func cat(ms ...[]byte) []byte {
	var b []byte
	for _, m := range ms {
		b = append(b, m...)
	}
	return b
}

// withLen returns m with its header's length set to n.
func withLen(m []byte, n uint64) []byte {
	m = bytes.Clone(m)
	(*unix.Cmsghdr)(unsafe.Pointer(&m[0])).Len = n
	return m
}

// TestControlMessages reads GRO segment sizes and PKTINFO destinations
// from control-message buffers laid out as the kernel does: alone,
// several in one buffer, and malformed.
func TestControlMessages(t *testing.T) {
	if all := len(cat(groCmsg(1), pktinfo6("::1"), pktinfo4("127.0.0.1", "127.0.0.1"))); rxCtrlSize < all {
		t.Fatalf("rxCtrlSize %d cannot hold GRO and both PKTINFOs (%d bytes)", rxCtrlSize, all)
	}
	other := cmsgBytes(unix.SOL_SOCKET, unix.SO_TIMESTAMP, make([]byte, 16))
	gro16 := cmsgBytes(unix.SOL_UDP, unix.UDP_GRO, binary.NativeEndian.AppendUint16(nil, 1300))
	for _, tc := range []struct {
		name    string
		ctl     []byte
		gro     int
		dst     string // "": not known
		unicast bool
	}{
		{"empty", nil, 0, "", false},
		{"GRO", groCmsg(1400), 1400, "", false},
		{"GRO as a u16", gro16, 1300, "", false},
		{"GRO with one byte", cmsgBytes(unix.SOL_UDP, unix.UDP_GRO, []byte{7}), 0, "", false},
		{"another message, then GRO", cat(other, groCmsg(1000)), 1000, "", false},
		{"v4 unicast", pktinfo4("127.0.0.1", "127.0.0.1"), 0, "127.0.0.1", true},
		{"v4 multicast", pktinfo4("127.0.0.1", "239.1.2.3"), 0, "239.1.2.3", false},
		{"v4 subnet broadcast", pktinfo4("127.0.0.1", "127.255.255.255"), 0, "127.255.255.255", false},
		{"v4 limited broadcast", pktinfo4("255.255.255.255", "255.255.255.255"), 0, "255.255.255.255", false},
		{"v4 unspecified", pktinfo4("0.0.0.0", "0.0.0.0"), 0, "0.0.0.0", false},
		{"v6 unicast", pktinfo6("::1"), 0, "::1", true},
		{"v6 multicast", pktinfo6("ff15::1235"), 0, "ff15::1235", false},
		{"v6 unspecified", pktinfo6("::"), 0, "::", false},
		{"v4-mapped alone", pktinfo6("::ffff:127.0.0.1"), 0, "127.0.0.1", false},
		{"GRO, v4-mapped, IP_PKTINFO", cat(groCmsg(1200), pktinfo6("::ffff:127.0.0.1"), pktinfo4("127.0.0.1", "127.0.0.1")), 1200, "127.0.0.1", true},
		{"IP_PKTINFO first decides", cat(pktinfo4("127.0.0.1", "239.1.2.3"), pktinfo6("::1"), pktinfo4("127.0.0.1", "127.0.0.1")), 0, "239.1.2.3", false},
		{"the last IPV6_PKTINFO", cat(pktinfo6("ff15::1"), pktinfo6("::1"), groCmsg(900)), 900, "::1", true},
		{"short tail ignored", cat(groCmsg(800), pktinfo6("::1"), make([]byte, unix.SizeofCmsghdr-1)), 800, "::1", true},
		{"length below a header", cat(withLen(groCmsg(1), 4), pktinfo6("::1")), 0, "", false},
		{"length past the end", cat(pktinfo6("::1"), withLen(groCmsg(1), 200)), 0, "", false},
		{"GRO, then a bad message", cat(groCmsg(700), pktinfo6("::1"), withLen(other, 1<<62)), 700, "", false},
		{"length wraps an int", cat(withLen(pktinfo6("::1"), ^uint64(0)), groCmsg(5)), 0, "", false},
	} {
		if got := groSegment(tc.ctl); got != tc.gro {
			t.Errorf("%s: GRO segment %d, want %d", tc.name, got, tc.gro)
		}
		dst, unicast, ok := pktinfoDst(tc.ctl)
		switch {
		case tc.dst == "" && ok:
			t.Errorf("%s: destination %v (unicast %v), want none", tc.name, dst, unicast)
		case tc.dst != "" && (!ok || dst != netip.MustParseAddr(tc.dst) || unicast != tc.unicast):
			t.Errorf("%s: destination %v unicast %v known %v, want %s unicast %v", tc.name, dst, unicast, ok, tc.dst, tc.unicast)
		}
	}
}

// TestControlMessagesGarbage feeds every truncation of a buffer of several
// messages, and random mutations of it, to the readers: none panics, and
// each agrees with the walk the socket did before this file (by hand for
// GRO, with unix.ParseSocketControlMessage for the destination).
func TestControlMessagesGarbage(t *testing.T) {
	full := cat(groCmsg(1400), pktinfo6("::ffff:127.0.0.1"), pktinfo4("127.0.0.1", "127.0.0.1"))
	check := func(ctl []byte) {
		t.Helper()
		if got, want := groSegment(ctl), groSegmentBefore(ctl); got != want {
			t.Fatalf("% x: GRO segment %d, the old walk %d", ctl, got, want)
		}
		d, u, ok := pktinfoDst(ctl)
		wd, wu, wok := pktinfoDstBefore(ctl)
		if d != wd || u != wu || ok != wok {
			t.Fatalf("% x: destination %v %v %v, the old walk %v %v %v", ctl, d, u, ok, wd, wu, wok)
		}
	}
	for n := 0; n <= len(full); n++ {
		check(full[:n])
	}
	rng := rand.New(rand.NewPCG(15, 3))
	buf := make([]byte, rxCtrlSize)
	for range 20000 {
		n := copy(buf, full)
		for range 1 + rng.IntN(4) {
			i := rng.IntN(max(n, 1))
			switch rng.IntN(3) {
			case 0:
				buf[i] = byte(rng.Uint32())
			case 1: // a length field: the first byte of a header
				for _, h := range []int{0, 24, 64} {
					if rng.IntN(2) == 0 {
						buf[h] = byte(rng.IntN(80))
					}
				}
			case 2:
				n = rng.IntN(n + 1)
			}
		}
		check(buf[:n])
	}
}

// groSegmentBefore is the hand walk socket.go did before gso_linux.go.
func groSegmentBefore(ctl []byte) int {
	for len(ctl) >= unix.SizeofCmsghdr {
		c := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		l := int(c.Len)
		if l < unix.SizeofCmsghdr || l > len(ctl) {
			return 0
		}
		if c.Level == unix.SOL_UDP && c.Type == unix.UDP_GRO && l >= unix.CmsgLen(2) {
			data := ctl[unix.CmsgLen(0):l]
			if len(data) >= 4 {
				return int(*(*int32)(unsafe.Pointer(&data[0])))
			}
			return int(*(*uint16)(unsafe.Pointer(&data[0])))
		}
		ctl = ctl[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(ctl)):]
	}
	return 0
}

// pktinfoDstBefore is Socket.rxDst before gso_linux.go.
func pktinfoDstBefore(ctl []byte) (dst netip.Addr, unicast, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(ctl)
	if err != nil {
		return netip.Addr{}, false, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			p := (*unix.Inet4Pktinfo)(unsafe.Pointer(&m.Data[0]))
			dst = netip.AddrFrom4(p.Addr)
			return dst, p.Spec_dst == p.Addr && !dst.IsMulticast() && dst != netip.IPv4Unspecified() && p.Addr != [4]byte{255, 255, 255, 255}, true
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			p := (*unix.Inet6Pktinfo)(unsafe.Pointer(&m.Data[0]))
			dst, ok = netip.AddrFrom16(p.Addr).Unmap(), true
		}
	}
	if !ok {
		return netip.Addr{}, false, false
	}
	return dst, !dst.Is4() && !dst.IsMulticast() && !dst.IsUnspecified(), true
}

// TestControlMessagesNoAlloc: building UDP_SEGMENT and reading GRO and
// PKTINFO allocate nothing (they run per datagram).
func TestControlMessagesNoAlloc(t *testing.T) {
	ctl := cat(groCmsg(1400), pktinfo6("::ffff:127.0.0.1"), pktinfo4("127.0.0.1", "127.0.0.1"))
	var g [gsoCtlSize]byte
	sink := 0
	allocs := testing.AllocsPerRun(1000, func() {
		sink += groSegment(ctl) + putUDPSegment(g[:], 1000)
		if _, u, ok := pktinfoDst(ctl); u && ok {
			sink++
		}
	})
	if allocs != 0 || sink == 0 {
		t.Fatalf("%v allocations per datagram", allocs)
	}
}

// TestControlMessagesKernel sends three datagrams in one sendmsg with the
// UDP_SEGMENT message putUDPSegment builds to a socket with the options
// enableRxControl sets: the kernel's control messages say the segment
// size, and the destination, on IPv4, IPv6 and a dual-stack socket.
func TestControlMessagesKernel(t *testing.T) {
	for _, tc := range []struct{ network, bind, to string }{
		{"udp4", "127.0.0.1:0", "127.0.0.1"},
		{"udp6", "[::1]:0", "::1"},
		{"udp", "[::]:0", "127.0.0.1"},
	} {
		t.Run(tc.network+" "+tc.bind, func(t *testing.T) {
			rx, err := net.ListenUDP(tc.network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.bind)))
			if err != nil {
				t.Skip(err)
			}
			defer rx.Close()
			raw, err := rx.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			v6 := tc.network != "udp4"
			var gro, info bool
			if err := raw.Control(func(fd uintptr) { gro, info = enableRxControl(int(fd), v6, true) }); err != nil {
				t.Fatal(err)
			}
			if !info {
				t.Fatal("the kernel refused PKTINFO")
			}
			to := netip.AddrPortFrom(netip.MustParseAddr(tc.to), rx.LocalAddr().(*net.UDPAddr).AddrPort().Port())
			tx, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Close()
			const seg = 500
			var g [gsoCtlSize]byte
			ctl := g[:putUDPSegment(g[:], seg)]
			payload := make([]byte, 3*seg)
			for i := range payload {
				payload[i] = byte(i / seg)
			}
			gso := true
			if _, _, err := tx.WriteMsgUDP(payload, ctl, nil); err != nil {
				t.Logf("no UDP GSO here (%v): one datagram", err)
				gso = false
				if _, err := tx.Write(payload[:seg]); err != nil {
					t.Fatal(err)
				}
			}
			buf := make([]byte, 1<<16)
			oob := make([]byte, rxCtrlSize)
			if err := rx.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			n, oobn, _, _, err := rx.ReadMsgUDP(buf, oob)
			if err != nil {
				t.Fatal(err)
			}
			got := groSegment(oob[:oobn])
			switch {
			case gso && gro && n == 3*seg:
				if got != seg || !bytes.Equal(buf[:n], payload) {
					t.Fatalf("a merged read of %d bytes says segment %d, want %d", n, got, seg)
				}
			case n == seg && got != 0:
				t.Fatalf("one datagram of %d bytes says GRO segment %d", n, got)
			case n != seg && n != 3*seg:
				t.Fatalf("read %d bytes", n)
			}
			dst, unicast, ok := pktinfoDst(oob[:oobn])
			if !ok || dst != netip.MustParseAddr(tc.to) || !unicast {
				t.Fatalf("destination %v unicast %v known %v, want %s unicast", dst, unicast, ok, tc.to)
			}
		})
	}
}
