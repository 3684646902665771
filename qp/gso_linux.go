package qp

import (
	"errors"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/udiwarp"
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

const maxGSOSegments = llp.MaxTrain

var errGSOUnsupported = errors.New("UDP GSO not supported")

// gsoCtx holds what one train needs beside txCtx.
type gsoCtx struct {
	hdr  [maxGSOSegments][udiwarp.WriteRecordHeaderSize]byte
	crc  [maxGSOSegments][udiwarp.CRCSize]byte
	bufs [3 * maxGSOSegments][]byte
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
		g.bufs[niov] = g.hdr[i][:]
		niov++
		if n > 0 {
			g.bufs[niov] = p
			niov++
		}
		g.bufs[niov] = g.crc[i][:]
		niov++
		off += n
	}
	err := t.transmitTrain(s, g.bufs[:niov], udiwarp.WriteRecordHeaderSize+int(seg)+udiwarp.CRCSize, w.ah)
	clear(g.bufs[:niov])
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
	switch {
	case errors.Is(err, llp.ErrTrains):
		s.noGSO.Store(true)
		return true
	case errors.Is(err, llp.ErrTrainTooBig):
		for {
			old := s.gsoTooBig.Load()
			if old != 0 && old <= uint32(size) || s.gsoTooBig.CompareAndSwap(old, uint32(size)) {
				return true
			}
		}
	}
	return false
}
