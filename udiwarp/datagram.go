package udiwarp

// A udiwarp UDP datagram is one frame followed by a CRC32c trailer over
// every byte before it. The low two bits of the first byte say which frame
// it is (the DV position of a DDP control byte):
//
//	0b10  a datagram-profile DDP segment (UD): DV = 2
//	0b11  a reliable-datagram (RD) frame: the reliability header, then a
//	      datagram-profile DDP segment (defined by package reliability)
//	0b01  a standard DDP segment (DV = 1): belongs on MPA/TCP, rejected
//	0b00  a protection envelope (package protect, docs/wire.md §12): a
//	      sealed frame (first byte 0x04), a contact with a key share
//	      (0x08), or a refusal (0x0c); any other first byte is rejected
//
// So one socket carries UD, RD and protected traffic, and nothing else
// is accepted.

// FrameType is the kind of a udiwarp datagram.
type FrameType uint8

const (
	FrameUD FrameType = 2 // a bare datagram-profile DDP segment
	FrameRD FrameType = 3 // a reliability header, then a DDP segment
	// FrameEnvelope: a protection envelope (package protect).
	FrameEnvelope FrameType = 0
)

func (t FrameType) String() string {
	switch t {
	case FrameUD:
		return "UD"
	case FrameRD:
		return "RD"
	case FrameEnvelope:
		return "envelope"
	}
	return "invalid frame type"
}

const (
	// MaxDatagramSize is the largest UDP payload, over IPv6 without
	// jumbograms (65535 - 8); IPv4 carries at most 65507 (65535 - 20 - 8).
	MaxDatagramSize = 65527
	// MinDatagramSize is a frame-type byte plus the CRC trailer.
	MinDatagramSize = 1 + CRCSize
)

// Classify returns the frame type of a datagram, by its first byte alone.
func Classify(b []byte) (FrameType, error) {
	if len(b) < MinDatagramSize {
		return 0, truncated("datagram", len(b), MinDatagramSize, DDPLocalCatastrophic)
	}
	if len(b) > MaxDatagramSize {
		return 0, fieldErr("datagram", "length", uint64(len(b)), "<= 65527 bytes", ErrTooLong, DDPLocalCatastrophic)
	}
	switch t := FrameType(b[0] & 3); t {
	case FrameUD, FrameRD:
		return t, nil
	case FrameEnvelope:
		if k := b[0] >> 2; k >= 1 && k <= 3 { // Sealed, Contact, Refuse (package protect)
			return t, nil
		}
		return 0, fieldErr("datagram", "frame type", uint64(b[0]), "2 (UD), 3 (RD) or an envelope (first byte 04, 08 or 0c)", ErrFrameType, DDPUntaggedInvalidVersion)
	case DDPVersion:
		return 0, fieldErr("datagram", "frame type (DV)", DDPVersion, "2 (UD) or 3 (RD); DV=1 segments travel only on MPA/TCP", ErrFrameType, DDPUntaggedInvalidVersion)
	default:
		return 0, fieldErr("datagram", "frame type (DV)", uint64(t), "2 (UD) or 3 (RD)", ErrFrameType, DDPUntaggedInvalidVersion)
	}
}

// SealDatagram appends the CRC32c trailer over b[start:] to b: build a frame
// at b[start:], then seal it.
func SealDatagram(b []byte, start int) []byte {
	return AppendCRC(b, CRC32c(b[start:]))
}

// OpenDatagram checks the trailer of a whole datagram and returns the frame
// without it.
func OpenDatagram(b []byte) ([]byte, error) {
	if len(b) < MinDatagramSize {
		return nil, truncated("datagram", len(b), MinDatagramSize, DDPLocalCatastrophic)
	}
	n := len(b) - CRCSize
	if got, want := WireCRC(b[n:]), CRC32c(b[:n]); got != want {
		return nil, &FieldError{Frame: "datagram", Field: "CRC32c", Value: uint64(got), Want: crcWant(want), Err: ErrCRC, Code: MPACRCError}
	}
	return b[:n], nil
}

func crcWant(c uint32) string {
	const hex = "0123456789abcdef"
	var s [10]byte
	s[0], s[1] = '0', 'x'
	for i := 0; i < 8; i++ {
		s[2+i] = hex[c>>(28-4*uint(i))&0xF]
	}
	return string(s[:])
}

// ParseUDFrame checks a whole UD datagram, trailer included, and returns its
// segment. Beyond ParseSegment's datagram-profile rules it requires that a
// tagged segment be a Write-Record, because only the Write-Record extension
// names the destination QP when no reliability header does.
func ParseUDFrame(b []byte) (Segment, error) { return parseUDFrame(b, true) }

// ParseUDFrameNoCRC is ParseUDFrame for peers whose ULPs agreed to run
// without CRC (docs/wire.md §2.2): the trailer is present but not checked.
func ParseUDFrameNoCRC(b []byte) (Segment, error) { return parseUDFrame(b, false) }

func parseUDFrame(b []byte, crc bool) (Segment, error) {
	t, err := Classify(b)
	if err != nil {
		return Segment{}, err
	}
	if t != FrameUD {
		return Segment{}, fieldErr("UD frame", "frame type", uint64(t), "2 (UD)", ErrFrameType, DDPUntaggedInvalidVersion)
	}
	f := b[:len(b)-CRCSize]
	if crc {
		if f, err = OpenDatagram(b); err != nil {
			return Segment{}, err
		}
	}
	var s Segment
	if err := s.parse(f, ProfileDatagram); err != nil {
		return Segment{}, err
	}
	if s.Control.Tagged() && !s.Control.WriteRecord() {
		return Segment{}, fieldErr("UD frame", "W", 0, "1 (a tagged segment without a reliability header must be a Write-Record)", ErrOpcode, DDPTaggedSTagNotAssociated)
	}
	return s, nil
}
