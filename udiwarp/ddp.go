package udiwarp

import "encoding/binary"

// Profile selects the rules a DDP segment is checked against.
type Profile uint8

const (
	// ProfileStream is standard iWARP (RFC 5040/5041) as carried by MPA over
	// TCP on RC queue pairs: DV=1, reserved bits ignored, QN is the queue.
	ProfileStream Profile = iota + 1
	// ProfileDatagram is datagram-iWARP over UDP: DV=2, the Write-Record
	// flag, QP numbers in the QN and RsvdULP words, one segment per untagged
	// message. See docs/wire.md, "The datagram profile".
	ProfileDatagram
)

func (p Profile) String() string {
	switch p {
	case ProfileStream:
		return "stream"
	case ProfileDatagram:
		return "datagram"
	}
	return "invalid profile"
}

// DDPVersion is the DV of RFC 5041 segments; DatagramDDPVersion marks the
// datagram profile, so that a standard DDP receiver rejects our segments
// (RFC 5041 §7.2: invalid DDP version) instead of misreading them.
const (
	DDPVersion         = 1
	DatagramDDPVersion = 2
)

// Version returns the DV a segment of this profile carries.
func (p Profile) Version() uint8 {
	if p == ProfileDatagram {
		return DatagramDDPVersion
	}
	return DDPVersion
}

// Header sizes in bytes.
const (
	DDPTaggedHeaderSize   = 14 // RFC 5041 §6.2
	DDPUntaggedHeaderSize = 18 // RFC 5041 §6.3
	// WriteRecordExtSize is the datagram profile's Write-Record extension
	// that follows the TO of a tagged header whose W flag is set.
	WriteRecordExtSize    = 20
	WriteRecordHeaderSize = DDPTaggedHeaderSize + WriteRecordExtSize
)

// DDPControl is the first byte of every DDP segment: T, L, four reserved
// bits (the datagram profile uses the first as W) and the 2-bit DV.
type DDPControl uint8

const (
	ddpT        DDPControl = 0x80
	ddpL        DDPControl = 0x40
	ddpW        DDPControl = 0x20 // datagram profile: Write-Record extension follows the TO
	ddpRsvdDgm  DDPControl = 0x1C // reserved in the datagram profile (after W)
	ddpRsvdStd  DDPControl = 0x3C // reserved in RFC 5041
	ddpDVMask   DDPControl = 0x03
	maxQPNumber            = 1<<24 - 1
)

// MaxQPN is the largest QP number the datagram profile can address.
const MaxQPN = maxQPNumber

// NewDDPControl builds a control byte.
func NewDDPControl(tagged, last, writeRecord bool, dv uint8) DDPControl {
	c := DDPControl(dv) & ddpDVMask
	if tagged {
		c |= ddpT
	}
	if last {
		c |= ddpL
	}
	if writeRecord {
		c |= ddpW
	}
	return c
}

func (c DDPControl) Tagged() bool { return c&ddpT != 0 }
func (c DDPControl) Last() bool   { return c&ddpL != 0 }

// WriteRecord reports the W flag (RFC 5041's first reserved bit), which in
// the datagram profile says a Write-Record extension follows the TO.
func (c DDPControl) WriteRecord() bool { return c&ddpW != 0 }
func (c DDPControl) Version() uint8    { return uint8(c & ddpDVMask) }

// Reserved returns the reserved bits under the given profile.
func (c DDPControl) Reserved(p Profile) uint8 {
	if p == ProfileDatagram {
		return uint8(c & ddpRsvdDgm)
	}
	return uint8(c & ddpRsvdStd)
}

// DDPTagged is a view of the 14-byte tagged DDP header (RFC 5041 §6.2).
//
//	0      1      2            6                        14
//	+------+------+------------+------------------------+
//	| ctrl | RDMAP| STag       | TO                     |
//	+------+------+------------+------------------------+
type DDPTagged []byte

const (
	ddpCtrlOff  = 0
	rdmapOff    = 1
	taggedSTag  = 2
	taggedTO    = 6
	wrMSNOff    = 14
	wrMOOff     = 18
	wrLenOff    = 22
	wrDstQPOff  = 26
	wrSrcQPOff  = 30
	untagRsvd   = 2
	untagQN     = 6
	untagMSN    = 10
	untagMO     = 14
	qpnRsvdMask = 0xFF000000
)

// TaggedFields holds every field of a tagged header.
type TaggedFields struct {
	Last  bool
	DV    uint8
	RDMAP RDMAPControl
	STag  uint32
	TO    uint64
}

func (h DDPTagged) Control() DDPControl { return DDPControl(h[ddpCtrlOff]) }
func (h DDPTagged) RDMAP() RDMAPControl { return RDMAPControl(h[rdmapOff]) }
func (h DDPTagged) STag() uint32        { return binary.BigEndian.Uint32(h[taggedSTag:]) }
func (h DDPTagged) TO() uint64          { return binary.BigEndian.Uint64(h[taggedTO:]) }
func (h DDPTagged) SetControl(c DDPControl) {
	h[ddpCtrlOff] = byte(c)
}
func (h DDPTagged) SetSTag(s uint32) { binary.BigEndian.PutUint32(h[taggedSTag:], s) }
func (h DDPTagged) SetTO(to uint64)  { binary.BigEndian.PutUint64(h[taggedTO:], to) }

// Encode writes every field; h must be at least DDPTaggedHeaderSize long.
// The W flag is left clear: use WriteRecordHeader.Encode for Write-Record.
func (h DDPTagged) Encode(f *TaggedFields) {
	_ = h[DDPTaggedHeaderSize-1]
	h[ddpCtrlOff] = byte(NewDDPControl(true, f.Last, false, f.DV))
	h[rdmapOff] = byte(f.RDMAP)
	binary.BigEndian.PutUint32(h[taggedSTag:], f.STag)
	binary.BigEndian.PutUint64(h[taggedTO:], f.TO)
}

// WriteRecordHeader is a view of a datagram-profile tagged header with the
// W flag set: the 14-byte tagged header followed by the 20-byte extension.
//
//	14     18     22        26        30        34
//	+------+------+---------+---------+---------+
//	| MSN  | MO   | MsgLen  | DstQPN  | SrcQPN  |
//	+------+------+---------+---------+---------+
//
// MSN numbers messages per (source QP, destination QP, STag); MO is this
// segment's offset in its message and MsgLen the message's length, so the
// target knows the message's extent from any one segment (docs/wire.md).
type WriteRecordHeader []byte

// WriteRecordFields holds every field of a Write-Record header.
type WriteRecordFields struct {
	Last          bool
	RDMAP         RDMAPControl
	STag          uint32
	TO            uint64
	MSN           uint32
	MO            uint32
	MessageLength uint32
	DstQPN        uint32
	SrcQPN        uint32
}

func (h WriteRecordHeader) Tagged() DDPTagged     { return DDPTagged(h[:DDPTaggedHeaderSize]) }
func (h WriteRecordHeader) MSN() uint32           { return binary.BigEndian.Uint32(h[wrMSNOff:]) }
func (h WriteRecordHeader) MO() uint32            { return binary.BigEndian.Uint32(h[wrMOOff:]) }
func (h WriteRecordHeader) MessageLength() uint32 { return binary.BigEndian.Uint32(h[wrLenOff:]) }
func (h WriteRecordHeader) DstQPN() uint32        { return binary.BigEndian.Uint32(h[wrDstQPOff:]) }
func (h WriteRecordHeader) SrcQPN() uint32        { return binary.BigEndian.Uint32(h[wrSrcQPOff:]) }

// MessageTO is the tagged offset of the message's first byte (TO - MO).
func (h WriteRecordHeader) MessageTO() uint64 { return h.Tagged().TO() - uint64(h.MO()) }

// Encode writes every field; h must be at least WriteRecordHeaderSize long.
func (h WriteRecordHeader) Encode(f *WriteRecordFields) {
	_ = h[WriteRecordHeaderSize-1]
	h[ddpCtrlOff] = byte(NewDDPControl(true, f.Last, true, DatagramDDPVersion))
	h[rdmapOff] = byte(f.RDMAP)
	binary.BigEndian.PutUint32(h[taggedSTag:], f.STag)
	binary.BigEndian.PutUint64(h[taggedTO:], f.TO)
	binary.BigEndian.PutUint32(h[wrMSNOff:], f.MSN)
	binary.BigEndian.PutUint32(h[wrMOOff:], f.MO)
	binary.BigEndian.PutUint32(h[wrLenOff:], f.MessageLength)
	binary.BigEndian.PutUint32(h[wrDstQPOff:], f.DstQPN)
	binary.BigEndian.PutUint32(h[wrSrcQPOff:], f.SrcQPN)
}

// DDPUntagged is a view of the 18-byte untagged DDP header (RFC 5041 §6.3).
//
//	0      1      2            6       10      14      18
//	+------+------+------------+-------+-------+-------+
//	| ctrl | RDMAP| RsvdULP    | QN    | MSN   | MO    |
//	+------+------+------------+-------+-------+-------+
//
// RsvdULP[8:39] is the Invalidate STag of Send with Invalidate (RFC 5040)
// or, in the datagram profile, the source QP number. In the datagram
// profile the QN holds the destination QP number above the two queue bits.
type DDPUntagged []byte

// UntaggedFields holds every field of an untagged header.
type UntaggedFields struct {
	Last  bool
	DV    uint8
	RDMAP RDMAPControl
	// ULP is RsvdULP[8:39]: Invalidate STag, or the source QPN (datagram profile).
	ULP uint32
	QN  uint32
	MSN uint32
	MO  uint32
}

func (h DDPUntagged) Control() DDPControl { return DDPControl(h[ddpCtrlOff]) }
func (h DDPUntagged) RDMAP() RDMAPControl { return RDMAPControl(h[rdmapOff]) }

// ULP returns RsvdULP[8:39]: the Invalidate STag of Send with Invalidate, or
// the source QP number in the datagram profile.
func (h DDPUntagged) ULP() uint32 { return binary.BigEndian.Uint32(h[untagRsvd:]) }
func (h DDPUntagged) QN() uint32  { return binary.BigEndian.Uint32(h[untagQN:]) }
func (h DDPUntagged) MSN() uint32 { return binary.BigEndian.Uint32(h[untagMSN:]) }
func (h DDPUntagged) MO() uint32  { return binary.BigEndian.Uint32(h[untagMO:]) }

// Queue returns the RDMAP queue: the whole QN in the stream profile, the
// two low bits in the datagram profile.
func (h DDPUntagged) Queue() uint32 { return h.QN() & 3 }

// DstQPN returns the destination QP number of a datagram-profile segment.
func (h DDPUntagged) DstQPN() uint32 { return h.QN() >> 2 }

// SrcQPN returns the source QP number of a datagram-profile segment.
func (h DDPUntagged) SrcQPN() uint32 { return h.ULP() }

func (h DDPUntagged) SetControl(c DDPControl) { h[ddpCtrlOff] = byte(c) }
func (h DDPUntagged) SetMSN(m uint32)         { binary.BigEndian.PutUint32(h[untagMSN:], m) }
func (h DDPUntagged) SetMO(m uint32)          { binary.BigEndian.PutUint32(h[untagMO:], m) }

// Encode writes every field; h must be at least DDPUntaggedHeaderSize long.
func (h DDPUntagged) Encode(f *UntaggedFields) {
	_ = h[DDPUntaggedHeaderSize-1]
	h[ddpCtrlOff] = byte(NewDDPControl(false, f.Last, false, f.DV))
	h[rdmapOff] = byte(f.RDMAP)
	binary.BigEndian.PutUint32(h[untagRsvd:], f.ULP)
	binary.BigEndian.PutUint32(h[untagQN:], f.QN)
	binary.BigEndian.PutUint32(h[untagMSN:], f.MSN)
	binary.BigEndian.PutUint32(h[untagMO:], f.MO)
}

// DatagramQN builds the QN of a datagram-profile untagged segment.
func DatagramQN(dstQPN uint32, q Queue) uint32 { return dstQPN<<2 | uint32(q) }
