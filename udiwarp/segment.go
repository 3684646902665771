package udiwarp

import "math"

// Segment is a checked DDP segment: its header (the DDP header plus any
// RDMAP sub-header) and its ULP payload, both views into the caller's bytes.
type Segment struct {
	Profile Profile
	Control DDPControl
	RDMAP   RDMAPControl
	// Header is the DDP header followed by the RDMAP header of Read
	// Request, Terminate, Atomic and Immediate Data messages.
	Header []byte
	// Payload is what DDP places: the data of a Write, Read Response,
	// Send or Write-Record segment; empty for the other messages.
	Payload []byte
	// multi: a Send may span segments (ParseRDSegment).
	multi bool
}

func (s Segment) Opcode() Opcode { return s.RDMAP.Opcode() }

// Tagged returns the tagged DDP header; valid when Control.Tagged().
func (s Segment) Tagged() DDPTagged { return DDPTagged(s.Header) }

// WriteRecord returns the Write-Record header; valid when Control.WriteRecord().
func (s Segment) WriteRecord() WriteRecordHeader { return WriteRecordHeader(s.Header) }

// Untagged returns the untagged DDP header; valid when !Control.Tagged().
func (s Segment) Untagged() DDPUntagged { return DDPUntagged(s.Header) }

func (s Segment) rdmapHeader() []byte { return s.Header[DDPUntaggedHeaderSize:] }

// ReadRequest returns the Read Request header; valid for OpReadRequest.
func (s Segment) ReadRequest() ReadRequest { return ReadRequest(s.rdmapHeader()) }

// Terminate returns the Terminate header; valid for OpTerminate.
func (s Segment) Terminate() Terminate { return Terminate(s.rdmapHeader()) }

// AtomicRequest returns the Atomic Request header; valid for OpAtomicRequest.
func (s Segment) AtomicRequest() AtomicRequest { return AtomicRequest(s.rdmapHeader()) }

// AtomicResponse returns the Atomic Response header; valid for OpAtomicResponse.
func (s Segment) AtomicResponse() AtomicResponse { return AtomicResponse(s.rdmapHeader()) }

// ImmediateData returns the 8 bytes of an Immediate Data message.
func (s Segment) ImmediateData() ImmediateData { return ImmediateData(s.rdmapHeader()) }

// ParseSegment checks a whole DDP segment against profile p and returns it.
// It reads only inside b, and accepts no segment whose headers declare more
// bytes than b holds. Every rejection is a *FieldError naming the field,
// the value and the RFC error code.
func ParseSegment(b []byte, p Profile) (Segment, error) {
	var s Segment
	err := s.parse(b, p)
	return s, err
}

// ParseRDSegment checks the DDP segment of an RD Data frame: the
// datagram profile, except that a Send may span segments, its MO and L as
// RFC 5041 §5.1 has them, where a UD datagram holds a whole untagged
// message. RD carries a peer's segments once and in order, so its
// receiver places a long Send's segments one after the other into the
// receive the first one took (docs/wire.md §11.5).
func ParseRDSegment(b []byte) (Segment, error) {
	s := Segment{multi: true}
	err := s.parse(b, ProfileDatagram)
	return s, err
}

// parse fills s in place; on error s is left partly filled and must not be used.
func (s *Segment) parse(b []byte, p Profile) error {
	if len(b) < 2 {
		return truncated("DDP segment", len(b), 2, DDPLocalCatastrophic)
	}
	s.Profile, s.Control, s.RDMAP = p, DDPControl(b[0]), RDMAPControl(b[1])
	c := s.Control
	if c.Tagged() {
		if v := c.Version(); v != p.Version() {
			return fieldErr("DDP tagged header", "DV", uint64(v), versionWant(p), ErrVersion, DDPTaggedInvalidVersion)
		}
	} else if v := c.Version(); v != p.Version() {
		return fieldErr("DDP untagged header", "DV", uint64(v), versionWant(p), ErrVersion, DDPUntaggedInvalidVersion)
	}
	// RFC 5041 §4.1 and RFC 5040 §4.2: reserved bits are not checked on
	// receive. The datagram profile is ours and rejects them, so that a
	// future flag is never silently misread.
	if p == ProfileDatagram {
		if r := c.Reserved(p); r != 0 {
			return fieldErr("DDP control", "reserved bits", uint64(r), "0", ErrReserved, ddpVersionCode(c))
		}
		if c.WriteRecord() && !c.Tagged() {
			return fieldErr("DDP control", "W", 1, "0 on an untagged segment", ErrReserved, DDPUntaggedInvalidVersion)
		}
		if r := s.RDMAP.Reserved(); r != 0 {
			return fieldErr("RDMAP control", "reserved bits", uint64(r), "0", ErrReserved, RDMAPInvalidVersion)
		}
	}
	if v := s.RDMAP.Version(); v != RDMAPVersion {
		return fieldErr("RDMAP control", "RV", uint64(v), "1", ErrVersion, RDMAPInvalidVersion)
	}
	op := s.RDMAP.Opcode()
	if !op.Known() {
		return fieldErr("RDMAP control", "opcode", uint64(op), "0..11 (RFC 5040, RFC 7306)", ErrOpcode, RDMAPUnexpectedOpcode)
	}
	if op.Tagged() != c.Tagged() {
		return fieldErr("RDMAP control", "opcode", uint64(op), modelWant(c), ErrOpcode, RDMAPUnexpectedOpcode)
	}
	if c.Tagged() {
		return s.parseTagged(b)
	}
	return s.parseUntagged(b)
}

func versionWant(p Profile) string {
	if p == ProfileDatagram {
		return "2 (datagram profile)"
	}
	return "1 (RFC 5041)"
}

func ddpVersionCode(c DDPControl) ErrorCode {
	if c.Tagged() {
		return DDPTaggedInvalidVersion
	}
	return DDPUntaggedInvalidVersion
}

func modelWant(c DDPControl) string {
	if c.Tagged() {
		return "RDMA Write or Read Response on a tagged segment"
	}
	return "an untagged message type on an untagged segment"
}

func (s *Segment) parseTagged(b []byte) error {
	wr := s.Control.WriteRecord() && s.Profile == ProfileDatagram
	if wr && s.RDMAP.Opcode() != OpWrite {
		return fieldErr("Write-Record header", "opcode", uint64(s.RDMAP.Opcode()), "0 (RDMA Write)", ErrOpcode, RDMAPUnexpectedOpcode)
	}
	hlen := DDPTaggedHeaderSize
	frame := "DDP tagged header"
	if wr {
		hlen, frame = WriteRecordHeaderSize, "Write-Record header"
	}
	if len(b) < hlen {
		return truncated(frame, len(b), hlen, DDPTaggedBaseBounds)
	}
	s.Header, s.Payload = b[:hlen], b[hlen:]
	to := DDPTagged(b).TO()
	n := uint64(len(s.Payload))
	if !fits(to, n) {
		return fieldErr(frame, "TO", to, "TO + payload length <= 2^64", ErrOffset, DDPTaggedTOWrap)
	}
	if !wr {
		return nil
	}
	h := WriteRecordHeader(b)
	mo, ml := uint64(h.MO()), uint64(h.MessageLength())
	switch {
	case mo+n > ml:
		return fieldErr(frame, "MO + payload length", mo+n, "<= message length "+itoa(ml), ErrOffset, DDPTaggedBaseBounds)
	case s.Control.Last() != (mo+n == ml):
		return fieldErr(frame, "L", b2u(s.Control.Last()), "1 exactly on the segment that ends the message", ErrLastFlag, DDPTaggedBaseBounds)
	case mo > to:
		return fieldErr(frame, "MO", mo, "<= TO "+itoa(to), ErrOffset, DDPTaggedTOWrap)
	case !fits(to-mo, ml):
		return fieldErr(frame, "message length", ml, "TO - MO + message length <= 2^64", ErrOffset, DDPTaggedTOWrap)
	}
	if q := h.DstQPN(); q > MaxQPN {
		return fieldErr(frame, "destination QPN", uint64(q), "<= 2^24-1", ErrQueue, DDPTaggedSTagNotAssociated)
	}
	if q := h.SrcQPN(); q > MaxQPN {
		return fieldErr(frame, "source QPN", uint64(q), "<= 2^24-1", ErrQueue, DDPTaggedSTagNotAssociated)
	}
	return nil
}

// untaggedHeaderSize is the RDMAP header that follows an untagged DDP
// header for each opcode, and whether the message carries a payload.
func untaggedRDMAPSize(op Opcode) (size int, payload bool) {
	switch op {
	case OpReadRequest:
		return ReadRequestSize, false
	case OpAtomicRequest:
		return AtomicRequestSize, false
	case OpAtomicResponse:
		return AtomicResponseSize, false
	case OpImmediateData, OpImmediateDataSE:
		return ImmediateDataSize, false
	case OpTerminate:
		return -1, false // variable: ParseTerminate
	}
	return 0, true
}

func (s *Segment) parseUntagged(b []byte) error {
	const frame = "DDP untagged header"
	if len(b) < DDPUntaggedHeaderSize {
		return truncated(frame, len(b), DDPUntaggedHeaderSize, DDPUntaggedInvalidMO)
	}
	h := DDPUntagged(b)
	op := s.RDMAP.Opcode()
	want, _ := op.Queue()
	if s.Profile == ProfileDatagram {
		if op.Invalidates() {
			return fieldErr(frame, "opcode", uint64(op), "no Send with Invalidate on datagram QPs (RsvdULP carries the source QPN)", ErrOpcode, RDMAPUnexpectedOpcode)
		}
		if q := Queue(h.Queue()); q != want {
			return fieldErr(frame, "QN queue bits", uint64(q), itoa(uint64(want))+" for "+op.String(), ErrQueue, DDPUntaggedInvalidQN)
		}
		if q := h.QN() >> 2; q > MaxQPN {
			return fieldErr(frame, "destination QPN", uint64(q), "<= 2^24-1", ErrQueue, DDPUntaggedInvalidQN)
		}
		if q := h.SrcQPN(); q > MaxQPN {
			return fieldErr(frame, "source QPN", uint64(q), "<= 2^24-1", ErrQueue, DDPUntaggedInvalidQN)
		}
		// One datagram holds a whole untagged message; over RD, a Send
		// may take several (ParseRDSegment).
		if _, payload := untaggedRDMAPSize(op); !s.multi || !payload {
			if mo := h.MO(); mo != 0 {
				return fieldErr(frame, "MO", uint64(mo), "0 (one segment per untagged message)", ErrOffset, DDPUntaggedInvalidMO)
			}
			if !s.Control.Last() {
				return fieldErr(frame, "L", 0, "1 (one segment per untagged message)", ErrLastFlag, DDPUntaggedInvalidMO)
			}
		}
	} else if qn := h.QN(); qn != uint32(want) {
		return fieldErr(frame, "QN", uint64(qn), itoa(uint64(want))+" for "+op.String(), ErrQueue, DDPUntaggedInvalidQN)
	}
	size, payload := untaggedRDMAPSize(op)
	rest := b[DDPUntaggedHeaderSize:]
	switch {
	case payload:
		s.Header, s.Payload = b[:DDPUntaggedHeaderSize], rest
		return nil
	case size < 0:
		if _, err := ParseTerminate(rest); err != nil {
			return err
		}
	case len(rest) < size:
		return truncated(op.String()+" header", len(rest), size, DDPUntaggedInvalidMO)
	case len(rest) > size:
		return fieldErr(op.String()+" header", "length", uint64(len(rest)), itoa(uint64(size))+" bytes and no payload", ErrTooLong, DDPUntaggedTooLong)
	}
	// Messages with a fixed RDMAP header are a single segment starting at MO 0.
	if mo := h.MO(); mo != 0 || !s.Control.Last() {
		return fieldErr(frame, "MO", uint64(mo), "0 with L set: "+op.String()+" is one segment", ErrOffset, DDPUntaggedInvalidMO)
	}
	s.Header, s.Payload = b, b[len(b):]
	return nil
}

// fits reports whether n bytes starting at base stay within the 64-bit
// tagged offset space: the last one is at most 2^64 - 1.
func fits(base, n uint64) bool { return n == 0 || base <= math.MaxUint64-(n-1) }

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var buf [20]byte
	i := len(buf)
	for v > 0 {
		i--
		buf[i] = byte('0' + v%10)
		v /= 10
	}
	return string(buf[i:])
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
