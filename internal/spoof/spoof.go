// Package spoof sends UDP datagrams with a forged IPv4 source address, for
// tests that play an off-path attacker against the stack on loopback.
//
// A UDP port is reachable by anyone and its sources can be forged; the
// stack's defences (return-routability checks, per-source limits, bounds on
// replies) are only tested honestly by datagrams that really arrive from
// addresses no socket of the test owns. Sender writes whole IPv4 packets
// through a raw socket (IPPROTO_RAW implies IP_HDRINCL on Linux), so the
// kernel delivers them to the target's ordinary UDP socket as if they came
// from the forged 127.x.y.z source. It needs CAP_NET_RAW (root here).
package spoof

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// Sender writes forged UDP/IPv4 datagrams. It is safe for use by one
// goroutine at a time.
type Sender struct {
	fd  int
	buf []byte
}

// New opens the raw socket. It fails without CAP_NET_RAW.
func New() (*Sender, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("spoof: raw socket: %w", err)
	}
	return &Sender{fd: fd}, nil
}

// NewT opens a Sender for a test, skipping the test with the reason when
// the process may not open raw sockets, and closes it when the test ends.
func NewT(tb testing.TB) *Sender {
	tb.Helper()
	s, err := New()
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			tb.Skipf("spoofed sources need CAP_NET_RAW (run as root): %v", err)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// Send delivers payload in one UDP datagram from src to dst. Both must be
// IPv4; src may be any address, dst is normally on 127.0.0.0/8.
func (s *Sender) Send(src, dst netip.AddrPort, payload []byte) error {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return fmt.Errorf("spoof: %v -> %v: IPv4 only", src, dst)
	}
	const udpLen = 8
	if len(payload) > 65535-ipv4.HeaderLen-udpLen {
		return fmt.Errorf("spoof: %d-byte payload does not fit an IPv4 datagram", len(payload))
	}
	h := ipv4.Header{
		Version:  ipv4.Version,
		Len:      ipv4.HeaderLen,
		TotalLen: ipv4.HeaderLen + udpLen + len(payload),
		TTL:      64,
		Protocol: unix.IPPROTO_UDP,
		Src:      src.Addr().AsSlice(),
		Dst:      dst.Addr().AsSlice(),
	}
	hb, err := h.Marshal()
	if err != nil {
		return fmt.Errorf("spoof: %w", err)
	}
	b := append(s.buf[:0], hb...)
	u := len(b)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	b = binary.BigEndian.AppendUint16(b, uint16(udpLen+len(payload)))
	b = append(b, 0, 0)
	b = append(b, payload...)
	binary.BigEndian.PutUint16(b[u+6:], udpChecksum(src.Addr().As4(), dst.Addr().As4(), b[u:]))
	s.buf = b
	to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	if err := unix.Sendto(s.fd, b, 0, to); err != nil {
		return fmt.Errorf("spoof: sendto %v: %w", dst, err)
	}
	return nil
}

// Close releases the raw socket.
func (s *Sender) Close() error { return unix.Close(s.fd) }

// udpChecksum is the RFC 768 checksum over the IPv4 pseudo-header and the
// UDP header and payload (with a zero checksum field).
func udpChecksum(src, dst [4]byte, udp []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(binary.BigEndian.Uint16(b))
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	add(src[:])
	add(dst[:])
	sum += unix.IPPROTO_UDP + uint32(len(udp))
	add(udp)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	if c == 0 {
		c = 0xffff
	}
	return c
}
