package udiwarp

import (
	"encoding/binary"
	"fmt"
)

// Terminate is a view of the RDMAP Terminate header (RFC 5040 §4.8), the
// bytes after the untagged DDP header of a Terminate message:
//
//	0       4          6                      6+14|18        +28
//	+-------+----------+----------------------+--------------+
//	| ctrl  | DDP len  | terminated DDP hdr   | terminated   |
//	|       | (if D)   | (if D)               | RDMA hdr (R) |
//	+-------+----------+----------------------+--------------+
//
// The control word is Layer(4) EType(4) ECode(8) M D R Rsvd(13). The
// DDP Segment Length is present whenever D is set (valid only if M is),
// followed by the offending segment's DDP header, 14 bytes if its T bit is
// set and 18 if not (34 for a datagram Write-Record header). R adds the 28-byte header of the RDMA Read Request the
// error concerns. On datagram QPs the same message is the seed's error
// message: it reports without tearing anything down.
type Terminate []byte

const (
	TerminateMinSize = 4
	termFlagM        = 0x8000
	termFlagD        = 0x4000
	termFlagR        = 0x2000
	termRsvdMask     = 0x1FFF
	termSegLenSize   = 2
)

// TerminateFields holds every field of a Terminate header.
type TerminateFields struct {
	Code ErrorCode
	// SegmentLengthValid is the M flag: DDPSegmentLength is meaningful.
	SegmentLengthValid bool
	DDPSegmentLength   uint16
	// DDPHeader is the terminated DDP header (14, 18, or 34 bytes for a
	// datagram Write-Record header); nil leaves D clear.
	DDPHeader []byte
	// RDMAHeader is the terminated Read Request header (28 bytes); nil leaves R clear.
	RDMAHeader []byte
}

func (t Terminate) control() uint32  { return binary.BigEndian.Uint32(t) }
func (t Terminate) Code() ErrorCode  { return ErrorCode(t.control() >> 16) }
func (t Terminate) M() bool          { return t.control()&termFlagM != 0 }
func (t Terminate) D() bool          { return t.control()&termFlagD != 0 }
func (t Terminate) R() bool          { return t.control()&termFlagR != 0 }
func (t Terminate) Reserved() uint16 { return uint16(t.control() & termRsvdMask) }

// DDPSegmentLength returns the echoed segment length; ok is false unless D
// and M are both set.
func (t Terminate) DDPSegmentLength() (n uint16, ok bool) {
	if !t.D() {
		return 0, false
	}
	return binary.BigEndian.Uint16(t[TerminateMinSize:]), t.M()
}

// DDPHeader returns the terminated DDP header, or nil if D is clear.
func (t Terminate) DDPHeader() []byte {
	if !t.D() {
		return nil
	}
	off := TerminateMinSize + termSegLenSize
	return t[off : off+echoedDDPSize(t[off])]
}

// RDMAHeader returns the terminated RDMA Read Request header, or nil.
func (t Terminate) RDMAHeader() ReadRequest {
	if !t.R() {
		return nil
	}
	off := TerminateMinSize
	if t.D() {
		off += termSegLenSize + echoedDDPSize(t[off+termSegLenSize])
	}
	return ReadRequest(t[off : off+ReadRequestSize])
}

// echoedDDPSize is the size of a terminated DDP header, read from its own
// control byte: 18 untagged, 14 tagged, and 34 for a datagram-profile
// Write-Record header, so an error message names the message's MSN and MO.
func echoedDDPSize(ctrl byte) int {
	c := DDPControl(ctrl)
	switch {
	case !c.Tagged():
		return DDPUntaggedHeaderSize
	case c.WriteRecord() && c.Version() == DatagramDDPVersion:
		return WriteRecordHeaderSize
	}
	return DDPTaggedHeaderSize
}

// TerminateSize returns the encoded size of f.
func TerminateSize(f *TerminateFields) int {
	n := TerminateMinSize
	if f.DDPHeader != nil {
		n += termSegLenSize + len(f.DDPHeader)
	}
	return n + len(f.RDMAHeader)
}

// AppendTerminate appends the Terminate header of f to b.
func AppendTerminate(b []byte, f *TerminateFields) ([]byte, error) {
	if f.DDPHeader != nil {
		if len(f.DDPHeader) < 1 || len(f.DDPHeader) != echoedDDPSize(f.DDPHeader[0]) {
			return b, fieldErr("Terminate", "terminated DDP header length", uint64(len(f.DDPHeader)), "14 (tagged), 18 (untagged) or 34 (Write-Record), matching its control byte", ErrOffset, 0)
		}
	}
	if f.RDMAHeader != nil && len(f.RDMAHeader) != ReadRequestSize {
		return b, fieldErr("Terminate", "terminated RDMA header length", uint64(len(f.RDMAHeader)), "28", ErrOffset, 0)
	}
	ctrl := uint32(f.Code) << 16
	if f.SegmentLengthValid && f.DDPHeader != nil {
		ctrl |= termFlagM
	}
	if f.DDPHeader != nil {
		ctrl |= termFlagD
	}
	if f.RDMAHeader != nil {
		ctrl |= termFlagR
	}
	b = binary.BigEndian.AppendUint32(b, ctrl)
	if f.DDPHeader != nil {
		b = binary.BigEndian.AppendUint16(b, f.DDPSegmentLength)
		b = append(b, f.DDPHeader...)
	}
	return append(b, f.RDMAHeader...), nil
}

// ParseTerminate checks that b is exactly one Terminate header: the sizes
// its D and R flags and its echoed T bit declare are all there and nothing
// follows them.
func ParseTerminate(b []byte) (Terminate, error) {
	const frame = "Terminate header"
	if len(b) < TerminateMinSize {
		return nil, truncated(frame, len(b), TerminateMinSize, RDMAPCatastrophicStream)
	}
	t := Terminate(b)
	need := TerminateMinSize
	if t.D() {
		need += termSegLenSize + 1 // the echoed control byte says how long the rest is
		if len(b) < need {
			return nil, truncated(frame, len(b), need, RDMAPCatastrophicStream)
		}
		need += echoedDDPSize(b[TerminateMinSize+termSegLenSize]) - 1
	}
	if t.R() {
		need += ReadRequestSize
	}
	if len(b) < need {
		return nil, truncated(frame, len(b), need, RDMAPCatastrophicStream)
	}
	if len(b) > need {
		return nil, fieldErr(frame, "length", uint64(len(b)), fmt.Sprintf("%d bytes, as its D and R flags declare", need), ErrTooLong, RDMAPCatastrophicStream)
	}
	return t, nil
}
