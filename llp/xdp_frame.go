package llp

// The frames an XDP link reads and writes: Ethernet (with at most one
// 802.1Q tag on receive), IPv4 or IPv6 (no options on send, no extension
// headers), UDP. Pure functions on byte slices: no I/O, so the parser can
// be fuzzed on its own.

import (
	"encoding/binary"
	"net/netip"
)

const (
	ethHdrLen  = 14
	vlanTagLen = 4
	ipv4HdrLen = 20
	ipv6HdrLen = 40
	udpHdrLen  = 8

	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeVLAN = 0x8100

	protoUDP = 17
	// frameTTL is the TTL / hop limit of the datagrams an XDP link sends.
	frameTTL = 64
)

// dropReason says why a received frame was not delivered.
type dropReason uint8

const (
	dropNone        dropReason = iota
	dropEth                    // shorter than an Ethernet header, or neither IPv4 nor IPv6
	dropIP                     // bad version, header or total length, a fragment, or not UDP
	dropIPChecksum             // IPv4 header checksum wrong
	dropUDPLength              // UDP length disagrees with the IP length
	dropUDPChecksum            // UDP checksum wrong (or zero over IPv6)
	dropNotOurs                // destination address or port is not the link's
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{"", "ethernet", "ip", "ip-checksum", "udp-length", "udp-checksum", "not-ours"}

func (r dropReason) String() string {
	if r < numDropReasons {
		return dropReasonNames[r]
	}
	return "unknown"
}

// frameInfo is what parseFrame found in a frame.
type frameInfo struct {
	Src, Dst netip.AddrPort
	// Payload is the UDP payload's offset in the frame, PayloadLen its
	// length.
	Payload, PayloadLen int
}

// parseFrame checks an Ethernet frame carrying one UDP datagram over
// IPv4 or IPv6 and says where its payload is. It checks the IP version,
// header and total lengths (bytes past the IP length, such as Ethernet
// padding, are ignored), the IPv4 header checksum, that the datagram is
// not a fragment, that the UDP length matches the IP length, and the UDP
// checksum (if not zero over IPv4; always over IPv6). Whether the frame
// is for us is the caller's to check.
func parseFrame(b []byte) (frameInfo, dropReason) {
	var f frameInfo
	if len(b) < ethHdrLen {
		return f, dropEth
	}
	l3 := ethHdrLen
	et := binary.BigEndian.Uint16(b[12:14])
	if et == etherTypeVLAN {
		if len(b) < ethHdrLen+vlanTagLen {
			return f, dropEth
		}
		et = binary.BigEndian.Uint16(b[16:18])
		l3 += vlanTagLen
	}
	var udp []byte
	switch et {
	case etherTypeIPv4:
		ip := b[l3:]
		if len(ip) < ipv4HdrLen || ip[0]>>4 != 4 {
			return f, dropIP
		}
		ihl := int(ip[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:4]))
		if ihl < ipv4HdrLen || tot < ihl || tot > len(ip) {
			return f, dropIP
		}
		if csumFold(csumAdd(0, ip[:ihl])) != 0xffff {
			return f, dropIPChecksum
		}
		if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 || ip[9] != protoUDP {
			return f, dropIP // a fragment (MF or an offset), or not UDP
		}
		if tot-ihl < udpHdrLen {
			return f, dropUDPLength
		}
		udp = ip[ihl:tot]
		f.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(udp[0:2]))
		f.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(udp[2:4]))
		if int(binary.BigEndian.Uint16(udp[4:6])) != len(udp) {
			return f, dropUDPLength
		}
		if binary.BigEndian.Uint16(udp[6:8]) != 0 && udpChecksum(ip[12:16], ip[16:20], udp) != 0 {
			return f, dropUDPChecksum
		}
		f.Payload = l3 + ihl + udpHdrLen
	case etherTypeIPv6:
		ip := b[l3:]
		if len(ip) < ipv6HdrLen || ip[0]>>4 != 6 {
			return f, dropIP
		}
		plen := int(binary.BigEndian.Uint16(ip[4:6]))
		if plen > len(ip)-ipv6HdrLen || ip[6] != protoUDP {
			return f, dropIP
		}
		if plen < udpHdrLen {
			return f, dropUDPLength
		}
		udp = ip[ipv6HdrLen : ipv6HdrLen+plen]
		f.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[8:24])), binary.BigEndian.Uint16(udp[0:2]))
		f.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[24:40])), binary.BigEndian.Uint16(udp[2:4]))
		if int(binary.BigEndian.Uint16(udp[4:6])) != len(udp) {
			return f, dropUDPLength
		}
		if binary.BigEndian.Uint16(udp[6:8]) == 0 || udpChecksum(ip[8:24], ip[24:40], udp) != 0 {
			return f, dropUDPChecksum
		}
		f.Payload = l3 + ipv6HdrLen + udpHdrLen
	default:
		return f, dropEth
	}
	f.PayloadLen = len(udp) - udpHdrLen
	return f, dropNone
}

// frameHdr is what buildFrame writes.
type frameHdr struct {
	DstMAC, SrcMAC [6]byte
	// Src and Dst are both IPv4 or both IPv6.
	Src, Dst netip.AddrPort
	// ID is the IPv4 identification.
	ID uint16
}

// frameHdrLen is the length of the headers buildFrame writes: where the
// payload starts.
func frameHdrLen(v6 bool) int {
	if v6 {
		return ethHdrLen + ipv6HdrLen + udpHdrLen
	}
	return ethHdrLen + ipv4HdrLen + udpHdrLen
}

// buildFrame writes the Ethernet, IP and UDP headers of a datagram whose
// n-byte payload is already at b[frameHdrLen:], with both checksums, and
// returns the frame's length. b must hold the headers and the payload,
// and n must fit the IP length field.
func buildFrame(b []byte, h *frameHdr, n int) int {
	v6 := h.Dst.Addr().Is6()
	hl := frameHdrLen(v6)
	b = b[:hl+n]
	copy(b[0:6], h.DstMAC[:])
	copy(b[6:12], h.SrcMAC[:])
	ip := b[ethHdrLen:]
	var udp, src, dst []byte
	if v6 {
		binary.BigEndian.PutUint16(b[12:14], etherTypeIPv6)
		binary.BigEndian.PutUint32(ip[0:4], 6<<28)
		binary.BigEndian.PutUint16(ip[4:6], uint16(udpHdrLen+n))
		ip[6], ip[7] = protoUDP, frameTTL
		s, d := h.Src.Addr().As16(), h.Dst.Addr().As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], d[:])
		src, dst, udp = ip[8:24], ip[24:40], ip[ipv6HdrLen:]
	} else {
		binary.BigEndian.PutUint16(b[12:14], etherTypeIPv4)
		ip[0], ip[1] = 0x45, 0
		binary.BigEndian.PutUint16(ip[2:4], uint16(ipv4HdrLen+udpHdrLen+n))
		binary.BigEndian.PutUint16(ip[4:6], h.ID)
		binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF: the link never fragments
		ip[8], ip[9] = frameTTL, protoUDP
		ip[10], ip[11] = 0, 0
		s, d := h.Src.Addr().As4(), h.Dst.Addr().As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		binary.BigEndian.PutUint16(ip[10:12], ^csumFold(csumAdd(0, ip[:ipv4HdrLen])))
		src, dst, udp = ip[12:16], ip[16:20], ip[ipv4HdrLen:]
	}
	binary.BigEndian.PutUint16(udp[0:2], h.Src.Port())
	binary.BigEndian.PutUint16(udp[2:4], h.Dst.Port())
	binary.BigEndian.PutUint16(udp[4:6], uint16(udpHdrLen+n))
	udp[6], udp[7] = 0, 0
	c := ^csumFold(udpSum(src, dst, udp))
	if c == 0 {
		c = 0xffff // zero means "no checksum"
	}
	binary.BigEndian.PutUint16(udp[6:8], c)
	return hl + n
}

// udpSum is the one's-complement sum of the UDP pseudo-header and
// datagram, not yet folded.
func udpSum(src, dst, udp []byte) uint64 {
	s := csumAdd(0, src)
	s = csumAdd(s, dst)
	s += protoUDP + uint64(len(udp))
	return csumAdd(s, udp)
}

// udpChecksum is 0 when a received datagram's checksum is right.
func udpChecksum(src, dst, udp []byte) uint16 {
	return ^csumFold(udpSum(src, dst, udp))
}

// csumAdd adds b, as big-endian 16-bit words (an odd last byte padded
// with zero), to the one's-complement sum s. It takes 32-bit words at a
// time: s cannot overflow for any frame.
func csumAdd(s uint64, b []byte) uint64 {
	for len(b) >= 32 {
		s += uint64(binary.BigEndian.Uint32(b[0:4])) + uint64(binary.BigEndian.Uint32(b[4:8])) +
			uint64(binary.BigEndian.Uint32(b[8:12])) + uint64(binary.BigEndian.Uint32(b[12:16])) +
			uint64(binary.BigEndian.Uint32(b[16:20])) + uint64(binary.BigEndian.Uint32(b[20:24])) +
			uint64(binary.BigEndian.Uint32(b[24:28])) + uint64(binary.BigEndian.Uint32(b[28:32]))
		b = b[32:]
	}
	for len(b) >= 4 {
		s += uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	return s
}

// csumFold folds a sum to 16 bits (not complemented): 0xffff over a
// header whose checksum field is right; a checksum field is its
// complement.
func csumFold(s uint64) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
