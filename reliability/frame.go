package reliability

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The RD header (docs/wire.md §11). It precedes the DDP segment of an RD
// datagram, and the datagram's CRC32c trailer covers both:
//
//	 0      type<<2 | 0b11 (the frame-type rule: low bits 3 = RD)
//	 1      flags: ACK, INIT, RNR, ACKNOW
//	 2..3   window: packets the frame's sender can still take from its peer
//	        (CHALLENGE answering Data: the low 16 bits of its sequence
//	        number, which names the frame that found no session)
//	 4..7   destination QP number
//	 8..11  source QP number
//	12..15  source epoch: the sender's epoch in its session with the
//	        receiver, new for every session, never 0
//	16..23  token: what the receiver issued to authenticate the sender
//	        (CHALLENGE: the token of the frame it answers, echoed)
//	[24..27 sequence number]            Data
//	[       issued token, 8 bytes]      flag INIT (Hello, Challenge, and
//	                                    Data/Ack until the peer has state)
//	[       ack block]                  flag ACK: cumulative (4), ack
//	                                    delay in µs (2), range count (1),
//	                                    error count (1), ranges × (start,
//	                                    length) as 16-bit offsets from
//	                                    cumulative, errors × (seq 4, code
//	                                    1, reserved 3)
//	then, in Data frames, the DDP segment.

// Type is an RD frame's type.
type Type uint8

const (
	// Data carries a sequence number and a DDP segment.
	Data Type = 1
	// Ack acknowledges and carries no data.
	Ack Type = 2
	// Hello opens contact: the sender's epoch and the token it issues.
	Hello Type = 3
	// Challenge answers a frame from a peer the receiver has no state for,
	// statelessly: the token it echoes and the token the receiver issues
	// (and, answering Data, the low 16 bits of its sequence number in the
	// window field).
	Challenge Type = 4
)

func (t Type) String() string {
	switch t {
	case Data:
		return "Data"
	case Ack:
		return "Ack"
	case Hello:
		return "Hello"
	case Challenge:
		return "Challenge"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Flags of an RD header.
type Flags uint8

const (
	FlagAck    Flags = 1 << 0 // an ack block follows
	FlagInit   Flags = 1 << 1 // the sender's issued token follows
	FlagRNR    Flags = 1 << 2 // receiver not ready: the acked range ends at a Send with no receive
	FlagAckNow Flags = 1 << 3 // acknowledge at once (a probe, or the last packet the sender has)
	flagsKnown       = FlagAck | FlagInit | FlagRNR | FlagAckNow
)

const (
	// HeaderSize is the fixed part of every RD header.
	HeaderSize = 24
	// SeqSize is the Data frame's sequence number.
	SeqSize = 4
	// TokenSize is the size of a token.
	TokenSize = 8
	// AckFixedSize is an ack block without ranges.
	AckFixedSize = 8
	// MaxAckRanges bounds the selective ranges of one ack block; a
	// receiver reports the lowest ones.
	MaxAckRanges = 16
	// MaxAckErrors bounds the error reports of one ack block.
	MaxAckErrors = 8
	// AckErrorSize is one error report: sequence number, code, reserved.
	AckErrorSize = 8
	// MaxHeaderSize is the largest RD header: Data with INIT and a full
	// ack block.
	MaxHeaderSize = HeaderSize + SeqSize + TokenSize + AckFixedSize + 4*MaxAckRanges + AckErrorSize*MaxAckErrors
)

// Code says why a receiver consumed a packet without carrying it out; an
// ack that covers the packet reports it, and the sender completes the
// work request with the matching error.
type Code uint8

const (
	// CodeRemoteAccess: the STag, its PD, its access rights or the bounds
	// refused a tagged segment.
	CodeRemoteAccess Code = 1
	// CodeInvalidRequest: the message did not fit the posted receive, or
	// the operation is not valid on the QP.
	CodeInvalidRequest Code = 2
	// CodeRemoteOperation: the receiver failed for another reason.
	CodeRemoteOperation Code = 3
)

// AckError reports that packet Seq was consumed with an error.
type AckError struct {
	Seq  uint32
	Code Code
}

// Errors a parse returns.
var (
	ErrShort    = errors.New("reliability: frame shorter than its header")
	ErrType     = errors.New("reliability: not an RD frame or unknown type")
	ErrFlags    = errors.New("reliability: reserved flags set or flags invalid for the type")
	ErrAckBlock = errors.New("reliability: malformed ack block")
	ErrEpoch    = errors.New("reliability: epoch 0")
)

// Range is a run of sequence numbers [Start, Start+Len).
type Range struct {
	Start uint32
	Len   uint32
}

// AckBlock is what an ack says.
type AckBlock struct {
	// Cumulative is the next sequence number the receiver expects: every
	// one before it has arrived.
	Cumulative uint32
	// Delay is how long the receiver held the ack, in microseconds.
	Delay uint16
	// Ranges received beyond Cumulative, ascending, disjoint, not
	// touching it; at most MaxAckRanges.
	Ranges []Range
	// Errors reports packets before Cumulative that were consumed with an
	// error; at most MaxAckErrors.
	Errors []AckError
	// store and estore back Ranges and Errors, so that parsing allocates
	// nothing.
	store  [MaxAckRanges]Range
	estore [MaxAckErrors]AckError
}

// Error returns the error reported for seq, if any.
func (a *AckBlock) Error(seq uint32) (Code, bool) {
	for _, e := range a.Errors {
		if e.Seq == seq {
			return e.Code, true
		}
	}
	return 0, false
}

// Header is a parsed RD header.
type Header struct {
	Type     Type
	Flags    Flags
	Window   uint16
	DstQPN   uint32
	SrcQPN   uint32
	Epoch    uint32
	Token    uint64
	Seq      uint32 // Data
	Issued   uint64 // FlagInit
	Ack      AckBlock
	Size     int // bytes of header parsed
	HasAck   bool
	HasInit  bool
	HasRNR   bool
	WantsAck bool
}

// Parse reads the RD header at the start of frame (a datagram without its
// CRC trailer). The bytes after h.Size are the DDP segment of a Data
// frame; other types carry nothing after the header.
func (h *Header) Parse(frame []byte) error {
	if len(frame) < HeaderSize {
		return ErrShort
	}
	b0 := frame[0]
	if b0&3 != 3 {
		return ErrType
	}
	h.Type = Type(b0 >> 2)
	h.Flags = Flags(frame[1])
	if h.Flags&^flagsKnown != 0 {
		return ErrFlags
	}
	h.Window = binary.BigEndian.Uint16(frame[2:])
	h.DstQPN = binary.BigEndian.Uint32(frame[4:])
	h.SrcQPN = binary.BigEndian.Uint32(frame[8:])
	h.Epoch = binary.BigEndian.Uint32(frame[12:])
	h.Token = binary.BigEndian.Uint64(frame[16:])
	h.HasAck, h.HasInit = h.Flags&FlagAck != 0, h.Flags&FlagInit != 0
	h.HasRNR, h.WantsAck = h.Flags&FlagRNR != 0, h.Flags&FlagAckNow != 0
	if h.Epoch == 0 {
		return ErrEpoch
	}
	switch h.Type {
	case Data:
	case Ack:
		if !h.HasAck {
			return ErrFlags
		}
	case Hello, Challenge:
		if !h.HasInit || h.HasAck || h.HasRNR {
			return ErrFlags
		}
	default:
		return ErrType
	}
	if h.HasRNR && !h.HasAck {
		return ErrFlags
	}
	off := HeaderSize
	if h.Type == Data {
		if len(frame) < off+SeqSize {
			return ErrShort
		}
		h.Seq = binary.BigEndian.Uint32(frame[off:])
		off += SeqSize
	}
	if h.HasInit {
		if len(frame) < off+TokenSize {
			return ErrShort
		}
		h.Issued = binary.BigEndian.Uint64(frame[off:])
		off += TokenSize
	}
	h.Ack.Ranges = h.Ack.store[:0]
	h.Ack.Errors = h.Ack.estore[:0]
	if h.HasAck {
		if len(frame) < off+AckFixedSize {
			return ErrShort
		}
		a := &h.Ack
		a.Cumulative = binary.BigEndian.Uint32(frame[off:])
		a.Delay = binary.BigEndian.Uint16(frame[off+4:])
		n, ne := int(frame[off+6]), int(frame[off+7])
		if n > MaxAckRanges || ne > MaxAckErrors {
			return ErrAckBlock
		}
		off += AckFixedSize
		if len(frame) < off+4*n {
			return ErrShort
		}
		end := uint32(0) // ranges are offsets from Cumulative: ascending, disjoint, not touching
		for range n {
			s := uint32(binary.BigEndian.Uint16(frame[off:]))
			l := uint32(binary.BigEndian.Uint16(frame[off+2:]))
			off += 4
			if l == 0 || s <= end || s+l > 1<<16 {
				return ErrAckBlock
			}
			a.Ranges = append(a.Ranges, Range{Start: a.Cumulative + s, Len: l})
			end = s + l
		}
		if len(frame) < off+AckErrorSize*ne {
			return ErrShort
		}
		for range ne {
			e := AckError{Seq: binary.BigEndian.Uint32(frame[off:]), Code: Code(frame[off+4])}
			if frame[off+5] != 0 || frame[off+6] != 0 || frame[off+7] != 0 || e.Code == 0 || !Before(e.Seq, a.Cumulative) {
				return ErrAckBlock
			}
			a.Errors = append(a.Errors, e)
			off += AckErrorSize
		}
	}
	if h.Type != Data && off != len(frame) {
		return fmt.Errorf("%w: %d bytes after a %v header", ErrShort, len(frame)-off, h.Type)
	}
	h.Size = off
	return nil
}

// Fields are what Append writes.
type Fields struct {
	Type   Type
	Window uint16
	DstQPN uint32
	SrcQPN uint32
	Epoch  uint32
	Token  uint64
	Seq    uint32
	// Issued, when Init, is the sender's issued token.
	Init   bool
	Issued uint64
	RNR    bool
	AckNow bool
	// Ack, when not nil, is appended as the ack block.
	Ack *AckBlock
}

// Append appends the RD header f describes to b.
func Append(b []byte, f *Fields) []byte {
	var fl Flags
	if f.Ack != nil {
		fl |= FlagAck
	}
	if f.Init {
		fl |= FlagInit
	}
	if f.RNR {
		fl |= FlagRNR
	}
	if f.AckNow {
		fl |= FlagAckNow
	}
	b = append(b, byte(f.Type)<<2|3, byte(fl))
	b = binary.BigEndian.AppendUint16(b, f.Window)
	b = binary.BigEndian.AppendUint32(b, f.DstQPN)
	b = binary.BigEndian.AppendUint32(b, f.SrcQPN)
	b = binary.BigEndian.AppendUint32(b, f.Epoch)
	b = binary.BigEndian.AppendUint64(b, f.Token)
	if f.Type == Data {
		b = binary.BigEndian.AppendUint32(b, f.Seq)
	}
	if f.Init {
		b = binary.BigEndian.AppendUint64(b, f.Issued)
	}
	if a := f.Ack; a != nil {
		n, ne := min(len(a.Ranges), MaxAckRanges), min(len(a.Errors), MaxAckErrors)
		b = binary.BigEndian.AppendUint32(b, a.Cumulative)
		b = binary.BigEndian.AppendUint16(b, a.Delay)
		b = append(b, byte(n), byte(ne))
		for _, r := range a.Ranges[:n] {
			b = binary.BigEndian.AppendUint16(b, uint16(r.Start-a.Cumulative))
			b = binary.BigEndian.AppendUint16(b, uint16(r.Len))
		}
		for _, e := range a.Errors[:ne] {
			b = binary.BigEndian.AppendUint32(b, e.Seq)
			b = append(b, byte(e.Code), 0, 0, 0)
		}
	}
	return b
}
