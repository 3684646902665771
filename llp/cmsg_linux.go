package llp

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A UDP socket's control messages.
//
// Send (GSO): the datagrams of a train are the same size (but the last)
// and go to one destination, so the kernel can cut them from one
// sendmsg(2) that carries a UDP_SEGMENT control message: one system call
// for up to 64 datagrams instead of one each. The receiver sees ordinary
// datagrams.
//
// Receive: with UDP_GRO on, one read may hold several datagrams that a
// peer sent with GSO, each the size its UDP_GRO control message gives but
// the last (Msg.Segment). IP_PKTINFO / IPV6_PKTINFO give each datagram's
// destination (Msg.Dst), parsed only when asked for.
//
// Control messages are walked with unix.ParseOneSocketControlMessage,
// which allocates nothing (ParseSocketControlMessage allocates a slice
// per call).

const (
	// MaxTrain is the most datagrams a UDP link sends in one train
	// (UDP_MAX_SEGMENTS on older kernels).
	MaxTrain = 64
	// gsoSizeLen is the size of UDP_SEGMENT's value (a u16).
	gsoSizeLen = 2
	// gsoCtlSize holds one UDP_SEGMENT control message
	// (unix.CmsgSpace(gsoSizeLen), 24 bytes on 64-bit).
	gsoCtlSize = 32
	// rxCtrlSize holds a datagram's control messages: UDP_GRO (24 bytes),
	// IP_PKTINFO (32) and, on an IPv6 socket, IPV6_PKTINFO (40).
	rxCtrlSize = 128
)

// enableRxControl asks the kernel for GRO and for each datagram's
// destination on fd, and reports which it granted.
func enableRxControl(fd int, v6, withGRO bool) (gro, pktinfo bool) {
	// GRO: datagrams a peer sent with UDP GSO arrive in one read, cut by
	// dispatch; one system call for up to 64 datagrams.
	gro = withGRO && unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
	// Each datagram's destination. IP_PKTINFO also on an IPv6 socket: for
	// IPv4 datagrams it tells a broadcast destination apart.
	pktinfo = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, 1) == nil
	if v6 {
		pktinfo = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1) == nil
	}
	return gro, pktinfo
}

// cmsgReader walks a control-message buffer one message at a time.
type cmsgReader struct {
	rest []byte
	bad  bool // a message's length was shorter than its header or past the end
}

// next returns the next message; false at the end of the buffer or at a
// malformed message (then bad is set). Bytes too few for a header at the
// end are ignored, as the kernel's CMSG_NXTHDR does.
func (r *cmsgReader) next() (unix.Cmsghdr, []byte, bool) {
	if len(r.rest) < unix.SizeofCmsghdr {
		return unix.Cmsghdr{}, nil, false
	}
	h, data, rest, err := unix.ParseOneSocketControlMessage(r.rest)
	if err != nil {
		r.rest, r.bad = nil, true
		return unix.Cmsghdr{}, nil, false
	}
	r.rest = rest
	return h, data, true
}

// groSegment returns the segment size a UDP_GRO control message in ctl
// gives (the kernel's int; a u16 also read), or 0: the read is one
// datagram. A malformed buffer gives what was found before the fault.
func groSegment(ctl []byte) int {
	r := cmsgReader{rest: ctl}
	for h, data, ok := r.next(); ok; h, data, ok = r.next() {
		if h.Level != unix.SOL_UDP || h.Type != unix.UDP_GRO {
			continue
		}
		switch {
		case len(data) >= 4:
			return int(int32(binary.NativeEndian.Uint32(data)))
		case len(data) >= gsoSizeLen:
			return int(binary.NativeEndian.Uint16(data))
		}
	}
	return 0
}

// pktinfoDst returns a datagram's destination address from the
// IP_PKTINFO / IPV6_PKTINFO control message in ctl, and whether it is a
// unicast address: not multicast and, for IPv4, not a broadcast address
// (the kernel's local address for the reply, ipi_spec_dst, is the
// destination itself only for a datagram addressed to this host alone).
// On an IPv6 socket an IPv4 datagram can carry both; the first IP_PKTINFO
// then decides. ok is false if ctl holds neither or is malformed anywhere.
func pktinfoDst(ctl []byte) (dst netip.Addr, unicast, ok bool) {
	r := cmsgReader{rest: ctl}
	var v4, v6 bool
	for h, data, more := r.next(); more; h, data, more = r.next() {
		switch {
		case v4: // decided; the rest is only checked for form
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			var p unix.Inet4Pktinfo
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&p)), unix.SizeofInet4Pktinfo), data)
			dst, v4 = netip.AddrFrom4(p.Addr), true
			unicast = p.Spec_dst == p.Addr && !dst.IsMulticast() && dst != netip.IPv4Unspecified() && p.Addr != [4]byte{255, 255, 255, 255}
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			var p unix.Inet6Pktinfo
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&p)), unix.SizeofInet6Pktinfo), data)
			dst, v6 = netip.AddrFrom16(p.Addr).Unmap(), true
		}
	}
	switch {
	case r.bad || !v4 && !v6:
		return netip.Addr{}, false, false
	case v4:
		return dst, unicast, true
	}
	return dst, !dst.Is4() && !dst.IsMulticast() && !dst.IsUnspecified(), true
}

// putUDPSegment writes a UDP_SEGMENT control message for datagrams of
// size bytes at the start of ctl and returns its length
// (unix.CmsgSpace(gsoSizeLen)). ctl must be aligned for a unix.Cmsghdr.
func putUDPSegment(ctl []byte, size uint16) int {
	n := unix.CmsgSpace(gsoSizeLen)
	_ = ctl[n-1]
	h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(gsoSizeLen))
	binary.NativeEndian.PutUint16(ctl[unix.CmsgLen(0):], size)
	return n
}
