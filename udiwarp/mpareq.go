package udiwarp

import "encoding/binary"

// MPA Request/Reply frames (RFC 5044 §7.1, RFC 6581 §6, §9):
//
//	0                 16     17    18         20            20+PD_Length
//	+-----------------+------+-----+----------+---------------+
//	| Key (16 ASCII)  |M|C|R|S|Res | Rev | PD_Length | Private Data  |
//	+-----------------+------+-----+----------+---------------+
//
// With S set (RFC 6581) the private data starts with the IRD/ORD word.
const (
	MPAFrameHeaderSize = 20
	MaxMPAPrivateData  = 512
	MPARevision1       = 1 // RFC 5044
	MPARevision2       = 2 // RFC 6581 enhanced connection setup
	mpaIRDORDSize      = 4

	mpaFlagM = 0x80
	mpaFlagC = 0x40
	mpaFlagR = 0x20
	mpaFlagS = 0x10
)

var (
	mpaKeyRequest = [16]byte{'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R', 'e', 'q', ' ', 'F', 'r', 'a', 'm', 'e'}
	mpaKeyReply   = [16]byte{'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R', 'e', 'p', ' ', 'F', 'r', 'a', 'm', 'e'}
)

// IRDORD is the RFC 6581 word at the start of enhanced private data.
type IRDORD struct {
	PeerToPeer bool   // A: the initiator will send an RTR message
	SendRTR    bool   // B: a zero-length Send may be the RTR
	WriteRTR   bool   // C: a zero-length RDMA Write may be the RTR
	ReadRTR    bool   // D: a zero-length RDMA Read may be the RTR
	IRD        uint16 // 14 bits; 0x3FFF: no automatic negotiation
	ORD        uint16 // 14 bits
}

// MaxIRDORD is the largest IRD or ORD the word can carry.
const MaxIRDORD = 0x3FFF

func (w IRDORD) put(b []byte) {
	ird, ord := w.IRD&MaxIRDORD, w.ORD&MaxIRDORD
	if w.PeerToPeer {
		ird |= 0x8000
	}
	if w.SendRTR {
		ird |= 0x4000
	}
	if w.WriteRTR {
		ord |= 0x8000
	}
	if w.ReadRTR {
		ord |= 0x4000
	}
	binary.BigEndian.PutUint16(b, ird)
	binary.BigEndian.PutUint16(b[2:], ord)
}

func readIRDORD(b []byte) IRDORD {
	ird, ord := binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:])
	return IRDORD{
		PeerToPeer: ird&0x8000 != 0, SendRTR: ird&0x4000 != 0,
		WriteRTR: ord&0x8000 != 0, ReadRTR: ord&0x4000 != 0,
		IRD: ird & MaxIRDORD, ORD: ord & MaxIRDORD,
	}
}

// MPAFrameFields holds every field of a Request or Reply frame.
type MPAFrameFields struct {
	Reply    bool
	Markers  bool // M: the sender wants markers in FPDUs sent to it
	CRC      bool // C: CRC wanted; either side setting it turns CRC on
	Reject   bool // R: Reply only
	Enhanced bool // S: IRDORD precedes PrivateData (needs Revision >= 2)
	Revision uint8
	IRDORD   IRDORD
	// PrivateData is the ULP's private data, after the IRD/ORD word if any.
	PrivateData []byte
}

// AppendMPAFrame appends a Request or Reply frame to b.
func AppendMPAFrame(b []byte, f *MPAFrameFields) ([]byte, error) {
	const frame = "MPA request/reply"
	pd := len(f.PrivateData)
	if f.Enhanced {
		pd += mpaIRDORDSize
		if f.Revision < MPARevision2 {
			return b, fieldErr(frame, "Rev", uint64(f.Revision), ">= 2 with S (RFC 6581)", ErrVersion, MPAInvalidRequestReply)
		}
	}
	if f.Revision < MPARevision1 || f.Revision > MPARevision2 {
		return b, fieldErr(frame, "Rev", uint64(f.Revision), "1 or 2", ErrVersion, MPAInvalidRequestReply)
	}
	if pd > MaxMPAPrivateData {
		return b, fieldErr(frame, "PD_Length", uint64(pd), "<= 512", ErrTooLong, MPAInvalidRequestReply)
	}
	key := &mpaKeyRequest
	if f.Reply {
		key = &mpaKeyReply
	}
	b = append(b, key[:]...)
	var flags byte
	if f.Markers {
		flags |= mpaFlagM
	}
	if f.CRC {
		flags |= mpaFlagC
	}
	if f.Reject && f.Reply {
		flags |= mpaFlagR
	}
	if f.Enhanced {
		flags |= mpaFlagS
	}
	b = append(b, flags, f.Revision)
	b = binary.BigEndian.AppendUint16(b, uint16(pd))
	if f.Enhanced {
		var w [mpaIRDORDSize]byte
		f.IRDORD.put(w[:])
		b = append(b, w[:]...)
	}
	return append(b, f.PrivateData...), nil
}

// MPAFrame is a view of a checked Request or Reply frame.
type MPAFrame []byte

func (m MPAFrame) Reply() bool    { return m[9] == 'p' } // "MPA ID Rep Frame"
func (m MPAFrame) Markers() bool  { return m[16]&mpaFlagM != 0 }
func (m MPAFrame) CRC() bool      { return m[16]&mpaFlagC != 0 }
func (m MPAFrame) Reject() bool   { return m.Reply() && m[16]&mpaFlagR != 0 }
func (m MPAFrame) Enhanced() bool { return m[16]&mpaFlagS != 0 }
func (m MPAFrame) Revision() uint8 {
	return m[17]
}
func (m MPAFrame) PDLength() int { return int(binary.BigEndian.Uint16(m[18:])) }

// IRDORD returns the RFC 6581 word; ok is false unless S is set.
func (m MPAFrame) IRDORD() (w IRDORD, ok bool) {
	if !m.Enhanced() {
		return IRDORD{}, false
	}
	return readIRDORD(m[MPAFrameHeaderSize:]), true
}

// PrivateData returns the ULP's private data (after the IRD/ORD word).
func (m MPAFrame) PrivateData() []byte {
	off := MPAFrameHeaderSize
	if m.Enhanced() {
		off += mpaIRDORDSize
	}
	return m[off : MPAFrameHeaderSize+m.PDLength()]
}

// ParseMPAFrame checks the Request or Reply frame at the front of b and
// returns it; n is its size, so b[n:] is the first FPDU's octets if the
// peer sent them early. When b is too short it returns n = 0 and need, the
// octets to wait for, with no error.
func ParseMPAFrame(b []byte) (m MPAFrame, n, need int, err error) {
	const frame = "MPA request/reply"
	// The key is checked as far as it has come: a peer that is not MPA (a
	// plain TCP client that speaks first) is told at its first wrong
	// byte, not left waiting for 20 bytes it will never send.
	k := min(len(b), len(mpaKeyRequest))
	if string(b[:k]) != string(mpaKeyRequest[:k]) && string(b[:k]) != string(mpaKeyReply[:k]) {
		i := 0
		for i < k-1 && (b[i] == mpaKeyRequest[i] || b[i] == mpaKeyReply[i]) {
			i++
		}
		return nil, 0, 0, fieldErr(frame, "key byte "+itoa(uint64(i)), uint64(b[i]), `"MPA ID Req Frame" or "MPA ID Rep Frame"`, ErrMPAFrame, MPAInvalidRequestReply)
	}
	if len(b) < MPAFrameHeaderSize {
		return nil, 0, MPAFrameHeaderSize, nil
	}
	rev := b[17]
	if rev < MPARevision1 || rev > MPARevision2 {
		return nil, 0, 0, fieldErr(frame, "Rev", uint64(rev), "1 or 2", ErrVersion, MPAInvalidRequestReply)
	}
	pd := int(binary.BigEndian.Uint16(b[18:]))
	if pd > MaxMPAPrivateData {
		return nil, 0, 0, fieldErr(frame, "PD_Length", uint64(pd), "<= 512", ErrTooLong, MPAInvalidRequestReply)
	}
	if b[16]&mpaFlagS != 0 {
		if rev < MPARevision2 {
			return nil, 0, 0, fieldErr(frame, "Rev", uint64(rev), ">= 2 with S (RFC 6581)", ErrVersion, MPAInvalidRequestReply)
		}
		if pd < mpaIRDORDSize {
			return nil, 0, 0, fieldErr(frame, "PD_Length", uint64(pd), ">= 4 with S (the IRD/ORD word)", ErrTruncated, MPAInvalidRequestReply)
		}
	}
	n = MPAFrameHeaderSize + pd
	if len(b) < n {
		return nil, 0, n, nil
	}
	return MPAFrame(b[:n]), n, 0, nil
}
