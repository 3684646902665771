package qp

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"unsafe"

	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// UDP segmentation offload and the socket's control messages.
//
// Send (GSO): the segments of one Write-Record message are the same size
// (but the last) and go to one destination, so the kernel can cut them
// from one sendmsg(2) that carries a UDP_SEGMENT control message: one
// system call for up to 64 datagrams instead of one each. The receiver
// sees ordinary datagrams.
//
// Receive: with UDP_GRO on, one read may hold several datagrams that a
// peer sent with GSO, each the size its UDP_GRO control message gives but
// the last; deliverSplit cuts them apart. IP_PKTINFO / IPV6_PKTINFO give
// each datagram's destination, for multicast delivery and for the rule
// that a datagram to a group or a broadcast address draws no reply
// (mayAnswer).
//
// Control messages are walked with unix.ParseOneSocketControlMessage,
// which allocates nothing (ParseSocketControlMessage allocates a slice
// per call).

const (
	maxGSOSegments = 64 // UDP_MAX_SEGMENTS on older kernels
	// gsoSizeLen is the size of UDP_SEGMENT's value (a u16).
	gsoSizeLen = 2
	// gsoCtlSize holds one UDP_SEGMENT control message
	// (unix.CmsgSpace(gsoSizeLen), 24 bytes on 64-bit).
	gsoCtlSize = 32
	// rxCtrlSize holds a datagram's control messages: UDP_GRO (24 bytes),
	// IP_PKTINFO (32) and, on an IPv6 socket, IPV6_PKTINFO (40).
	rxCtrlSize = 128
)

var errGSOUnsupported = errors.New("UDP GSO not supported")

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

// gsoCtx holds what one GSO send needs beside txCtx.
type gsoCtx struct {
	hdr [maxGSOSegments][udiwarp.WriteRecordHeaderSize]byte
	crc [maxGSOSegments][udiwarp.CRCSize]byte
	iov [3 * maxGSOSegments]unix.Iovec
	ctl [gsoCtlSize]byte
}

// gsoSegments says how many of w's remaining segments one GSO send can
// carry (0 or 1: send one at a time).
func (q *QP) gsoSegments(s *Socket, w *sendWQE, seg uint32) int {
	size := udiwarp.WriteRecordHeaderSize + int(seg) + udiwarp.CRCSize
	if (!w.isInline && w.nsge != 1) || !s.gsoFits(size) {
		return 0
	}
	// In 64 bits: near 4 GiB, length-off+seg-1 wraps 32.
	left := (uint64(w.length-w.off) + uint64(seg) - 1) / uint64(seg)
	return min(int(min(left, maxGSOSegments)), s.maxDatagram/size)
}

// sendGSO sends k segments of w from w.off in one system call and
// advances w.off past them.
func (t *txCtx) sendGSO(s *Socket, w *sendWQE, seg uint32, k int) (Status, error) {
	q := t.q
	if t.gso == nil {
		t.gso = new(gsoCtx)
	}
	g := t.gso
	var data []byte
	if w.isInline {
		data = w.inline[:w.inlineLen]
	} else {
		m, b, st := q.dev.resolve(q.pd, &w.sge[0], 0)
		if st != Success {
			return st, nil
		}
		defer m.unpin()
		data = b
	}
	sum := !q.dev.cfg.NoCRC
	niov := 0
	off := w.off
	for i := 0; i < k; i++ {
		n := min(seg, w.length-off)
		hdr := udiwarp.WriteRecordHeader(g.hdr[i][:])
		hdr.Encode(&udiwarp.WriteRecordFields{Last: off+n == w.length, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
			STag: w.rstag, TO: w.rto + uint64(off), MSN: w.msn, MO: off, MessageLength: w.length, DstQPN: w.ah.qpn, SrcQPN: q.wireQPN()})
		p := data[off : off+n]
		var crc uint32
		if sum {
			crc = udiwarp.UpdateCRC32c(udiwarp.CRC32c(hdr), p)
		}
		udiwarp.PutCRC(g.crc[i][:], crc)
		g.iov[niov].Base = &g.hdr[i][0]
		g.iov[niov].SetLen(udiwarp.WriteRecordHeaderSize)
		niov++
		if n > 0 {
			g.iov[niov].Base = &p[0]
			g.iov[niov].SetLen(int(n))
			niov++
		}
		g.iov[niov].Base = &g.crc[i][0]
		g.iov[niov].SetLen(udiwarp.CRCSize)
		niov++
		off += n
	}
	ctl := putUDPSegment(g.ctl[:], uint16(udiwarp.WriteRecordHeaderSize+int(seg)+udiwarp.CRCSize))
	t.msg.Iov = &g.iov[0]
	t.msg.SetIovlen(niov)
	t.msg.Control = &g.ctl[0]
	t.msg.SetControllen(ctl)
	t.setDest(s, w.ah)
	err := t.transmit(s)
	t.msg.Iov, t.msg.Control = &t.iov[0], nil
	t.msg.SetControllen(0)
	switch {
	case err == nil:
		s.dev.stats.TxDatagrams.Add(uint64(k - 1)) // transmit counted one
		s.dev.stats.TxGSO.Add(1)
		w.off = off
		return Success, nil
	case s.gsoRefused(err, udiwarp.WriteRecordHeaderSize+int(seg)+udiwarp.CRCSize):
		return Success, errGSOUnsupported
	}
	return Success, err
}

// gsoFits reports whether a GSO send of size-byte segments may be tried
// on s: the kernel has not refused UDP_SEGMENT, and no send of segments
// this large failed with EMSGSIZE.
func (s *Socket) gsoFits(size int) bool {
	if s.noGSO.Load() {
		return false
	}
	lim := s.gsoTooBig.Load()
	return lim == 0 || uint32(size) < lim
}

// gsoRefused notes what a failed GSO send of size-byte segments says of
// the socket, and reports whether err was such a refusal (the segments
// then go one per call): the kernel does not take UDP_SEGMENT at all,
// or the segments are larger than the route's MTU (EMSGSIZE: UDP GSO
// does not fragment them, where a datagram sent alone is fragmented), so
// segments this large go one per call from now on.
func (s *Socket) gsoRefused(err error, size int) bool {
	switch err {
	case unix.EINVAL, unix.EIO, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		s.noGSO.Store(true)
		return true
	case unix.EMSGSIZE:
		for {
			old := s.gsoTooBig.Load()
			if old != 0 && old <= uint32(size) || s.gsoTooBig.CompareAndSwap(old, uint32(size)) {
				return true
			}
		}
	}
	return false
}
