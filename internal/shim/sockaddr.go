package shim

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// ParseSockaddr reads a struct sockaddr_in or sockaddr_in6 in b (an
// IPv4-mapped IPv6 address taken as IPv4), as the C side of the preload
// and of the libfabric provider hands one over.
func ParseSockaddr(b []byte) (netip.AddrPort, bool) {
	if len(b) < 2 {
		return netip.AddrPort{}, false
	}
	fam := uint16(b[0]) | uint16(b[1])<<8
	switch {
	case fam == unix.AF_INET && len(b) >= 16:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), uint16(b[2])<<8|uint16(b[3])), true
	case fam == unix.AF_INET6 && len(b) >= 28:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), uint16(b[2])<<8|uint16(b[3])), true
	}
	return netip.AddrPort{}, false
}

// PutSockaddr writes ap into b as a socket of the family v6 says does (an
// IPv4 source as ::ffff:a.b.c.d on an IPv6 socket), cut to len(b), and
// returns the full length (16 or 28).
func PutSockaddr(b []byte, ap netip.AddrPort, v6 bool) int {
	var s [28]byte
	l := 16
	if v6 || ap.Addr().Is6() {
		l = 28
		s[0], s[1] = byte(unix.AF_INET6), 0
		a := ap.Addr().As16()
		copy(s[8:24], a[:])
	} else {
		s[0], s[1] = byte(unix.AF_INET), 0
		a := ap.Addr().As4()
		copy(s[4:8], a[:])
	}
	s[2], s[3] = byte(ap.Port()>>8), byte(ap.Port())
	copy(b, s[:l])
	return l
}
