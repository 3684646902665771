package spoof

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Tap sees the IPv4 UDP datagrams on loopback, as an on-path attacker
// (a tap, a hypervisor, a container on the same bridge) sees a flow: it
// opens an AF_PACKET socket on lo. It needs CAP_NET_RAW (root here).
type Tap struct {
	fd  int
	buf []byte
}

// Datagram is one UDP datagram a Tap saw.
type Datagram struct {
	Src, Dst netip.AddrPort
	Payload  []byte
}

// NewTap opens a Tap on lo for a test, skipping the test with the reason
// when the process may not, and closes it when the test ends. It sees the
// UDP datagrams to port only: the kernel filters the rest (a classic BPF
// program), so the loopback traffic of tests running beside it cannot
// overflow its buffer and drop what the test waits for.
func NewTap(tb testing.TB, port uint16) *Tap {
	tb.Helper()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		tb.Fatal(err)
	}
	proto := htons(unix.ETH_P_IP)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			tb.Skipf("a tap needs CAP_NET_RAW (run as root): %v", err)
		}
		tb.Fatal(err)
	}
	// IPv4, UDP, not a fragment, destination port: accept; else drop.
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 9, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_UDP, SkipTrue: 6},
		bpf.LoadAbsolute{Off: 6, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 4},
		bpf.LoadMemShift{Off: 0},
		bpf.LoadIndirect{Off: 2, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(port), SkipTrue: 1},
		bpf.RetConstant{Val: 1 << 18},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: lo.Index}); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return &Tap{fd: fd, buf: make([]byte, 1<<17)}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Next returns the next datagram to dst's port for which keep is true
// (nil keeps all), waiting up to limit; ok false when none came.
func (t *Tap) Next(dstPort uint16, keep func(Datagram) bool, limit time.Duration) (Datagram, bool) {
	end := time.Now().Add(limit)
	for {
		left := time.Until(end)
		if left <= 0 {
			return Datagram{}, false
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(t.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return Datagram{}, false
		}
		n, from, err := unix.Recvfrom(t.fd, t.buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return Datagram{}, false
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // loopback shows each packet going out and coming in
		}
		d, err := parseUDP4(t.buf[:n])
		if err != nil || d.Dst.Port() != dstPort {
			continue
		}
		if keep == nil || keep(d) {
			return d, true
		}
	}
}

func parseUDP4(b []byte) (Datagram, error) {
	if len(b) < 20 || b[0]>>4 != 4 || b[9] != unix.IPPROTO_UDP {
		return Datagram{}, fmt.Errorf("not UDP/IPv4")
	}
	ihl := int(b[0]&15) * 4
	if len(b) < ihl+8 || binary.BigEndian.Uint16(b[6:])&0x3fff != 0 {
		return Datagram{}, fmt.Errorf("short or fragmented")
	}
	src := netip.AddrFrom4([4]byte(b[12:16]))
	dst := netip.AddrFrom4([4]byte(b[16:20]))
	u := b[ihl:]
	l := int(binary.BigEndian.Uint16(u[4:]))
	if l < 8 || l > len(u) {
		return Datagram{}, fmt.Errorf("bad UDP length")
	}
	return Datagram{Src: netip.AddrPortFrom(src, binary.BigEndian.Uint16(u[0:])), Dst: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(u[2:])),
		Payload: append([]byte(nil), u[8:l]...)}, nil
}
