package protect

import (
	"encoding/binary"
	"fmt"
)

// The envelope (docs/wire.md §12). Its first byte keeps the frame-type
// bits (docs/wire.md §2.1) at 00, which a receiver of today's wire
// rejects as ErrFrameType: an envelope is never misread as a UD or RD
// frame.
//
//	Sealed (kind 1): a UD or RD frame under keys
//	 0      kind<<2 | 00
//	 1      mode: 1 Auth, 2 AEAD
//	 2      flags: 01 INITIAL (the initial block follows the header: the
//	        opener's frames under new keys until the peer answers under
//	        them), 02 PHASE (the key phase, flipped by each key update)
//	 3      reserved, 0
//	 4..7   key ID: names the keys at the receiver
//	 8..15  packet number: per key ID, never reused; the nonce
//	16..17  clear length: how many bytes of the frame travel in clear
//	        (AEAD: its headers; Auth: all of it)
//	18..19  reserved, 0
//	[20..79 initial block, flag INITIAL: what the answering side derives
//	        the keys from again, statelessly: the opener's X25519 share
//	        (32), the Hello's token (8), the keyed token of the Challenge
//	        (8), the opener's QP (4), the answering QP (4), the opener's
//	        epoch (4)]
//	        the frame (UD: a DDP segment; RD: RD header and segment),
//	        its first clear-length bytes in clear, the rest encrypted
//	        (AEAD) or in clear (Auth)
//	        tag, 16 bytes: AES-128-GCM over all of it, the clear bytes as
//	        additional data
//
//	Contact (kind 2): an RD Hello or Challenge and the sender's share
//	 0      kind<<2
//	 1      mode the sender runs
//	 2      flags: 01 SHARE (always)
//	 3..19  reserved, 0
//	20..51  share
//	        the RD Hello or Challenge
//	        CRC32c, 4 bytes (docs/wire.md §2.2): nothing is keyed yet
//
//	Refuse (kind 3): a contact refused, in answer to a Hello or a
//	Contact of another mode (never larger than it)
//	 0      kind<<2
//	 1      mode the refusing side runs
//	 2..3   reserved, 0
//	 4..7   the QP the refused frame came from (its source QP)
//	 8..11  the QP it named (its destination QP)
//	12..19  the refused Hello's token, echoed
//	        CRC32c, 4 bytes

// Kind is an envelope's kind.
type Kind uint8

const (
	KindSealed  Kind = 1
	KindContact Kind = 2
	KindRefuse  Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindSealed:
		return "Sealed"
	case KindContact:
		return "Contact"
	case KindRefuse:
		return "Refuse"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Envelope flags.
const (
	FlagShare   byte = 0x01 // Contact: the share; Sealed: the initial block
	FlagInitial      = FlagShare
	FlagPhase   byte = 0x02
)

// Sizes.
const (
	HeaderSize = 20
	ShareSize  = 32
	// InitialSize is the initial block of a Sealed envelope.
	InitialSize = ShareSize + 8 + 8 + 4 + 4 + 4
	TagSize     = 16
	CRCSize     = 4
	RefuseSize  = 20 + CRCSize
	// Overhead is what a sealed datagram carries beyond the plain
	// frame's CRC trailer: the header, and a tag four times the CRC's
	// size.
	Overhead = HeaderSize + TagSize - CRCSize
	// MaxOverhead is the most a sealed datagram adds: with the initial
	// block, as the opener's first frames under new keys carry it.
	MaxOverhead = Overhead + InitialSize
)

// IsEnvelope reports whether a datagram's frame-type bits say envelope.
func IsEnvelope(b []byte) bool { return len(b) > 0 && b[0]&3 == 0 && b[0] != 0 }

// Header is a parsed Sealed or Contact envelope header.
type Header struct {
	Kind     Kind
	Mode     Mode
	Flags    byte
	KeyID    uint32
	PN       uint64
	ClearLen int
	Share    []byte // FlagShare: Contact's share, Sealed's initial block, aliasing the datagram
	Size     int    // header and share
}

// Parse reads the envelope header of a Sealed or Contact datagram b and
// checks what it can without keys: kind, mode, flags, reserved bytes,
// lengths. The frame is b[h.Size:len(b)-TagSize] (Sealed) or
// b[h.Size:len(b)-CRCSize] (Contact).
func (h *Header) Parse(b []byte) error {
	if len(b) < HeaderSize+CRCSize || b[0]&3 != 0 {
		return ErrEnvelope
	}
	h.Kind, h.Mode, h.Flags = Kind(b[0]>>2), Mode(b[1]), b[2]
	if b[3] != 0 || b[18] != 0 || b[19] != 0 || h.Mode == None || h.Mode > AEAD {
		return ErrEnvelope
	}
	h.KeyID = binary.BigEndian.Uint32(b[4:])
	h.PN = binary.BigEndian.Uint64(b[8:])
	h.ClearLen = int(binary.BigEndian.Uint16(b[16:]))
	h.Size, h.Share = HeaderSize, nil
	if h.Flags&FlagShare != 0 {
		n := ShareSize
		if h.Kind == KindSealed {
			n = InitialSize
		}
		if len(b) < HeaderSize+n {
			return ErrEnvelope
		}
		h.Share = b[HeaderSize : HeaderSize+n]
		h.Size += n
	}
	switch h.Kind {
	case KindSealed:
		if h.Flags&^(FlagShare|FlagPhase) != 0 || h.KeyID == 0 || len(b) < h.Size+TagSize || h.ClearLen > len(b)-h.Size-TagSize ||
			h.Mode == Auth && h.ClearLen != len(b)-h.Size-TagSize {
			return ErrEnvelope
		}
	case KindContact:
		if h.Flags != FlagShare || h.KeyID != 0 || h.PN != 0 || len(b) < h.Size+CRCSize || h.ClearLen != len(b)-h.Size-CRCSize {
			return ErrEnvelope
		}
	default:
		return ErrEnvelope
	}
	return nil
}

// putHeader writes a Sealed or Contact header (and share) at the start of
// b, which has room, and returns its size.
func putHeader(b []byte, k Kind, m Mode, flags byte, keyID uint32, pn uint64, clear int, share []byte) int {
	b[0], b[1], b[2], b[3] = byte(k)<<2, byte(m), flags, 0
	binary.BigEndian.PutUint32(b[4:], keyID)
	binary.BigEndian.PutUint64(b[8:], pn)
	binary.BigEndian.PutUint16(b[16:], uint16(clear))
	b[18], b[19] = 0, 0
	if flags&FlagShare != 0 {
		return HeaderSize + copy(b[HeaderSize:], share)
	}
	return HeaderSize
}

// Refusal is a parsed Refuse.
type Refusal struct {
	Mode           Mode
	FromQP, NameQP uint32
	Token          uint64
}

// ParseRefuse reads a Refuse datagram (its CRC checked by the caller).
func (r *Refusal) Parse(b []byte) error {
	if len(b) != RefuseSize || b[0] != byte(KindRefuse)<<2 || b[1] > byte(AEAD) || b[2] != 0 || b[3] != 0 {
		return ErrEnvelope
	}
	r.Mode = Mode(b[1])
	r.FromQP = binary.BigEndian.Uint32(b[4:])
	r.NameQP = binary.BigEndian.Uint32(b[8:])
	r.Token = binary.BigEndian.Uint64(b[12:])
	return nil
}

// AppendRefuse appends a Refuse without its CRC.
func AppendRefuse(b []byte, r *Refusal) []byte {
	b = append(b, byte(KindRefuse)<<2, byte(r.Mode), 0, 0)
	b = binary.BigEndian.AppendUint32(b, r.FromQP)
	b = binary.BigEndian.AppendUint32(b, r.NameQP)
	return binary.BigEndian.AppendUint64(b, r.Token)
}
