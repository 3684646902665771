package udiwarp

import (
	"bytes"
	"testing"
)

// Builders of whole, valid segments used across the tests.

func dgmSend(dstQP, srcQP, msn uint32, op Opcode, payload []byte) []byte {
	b := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DatagramDDPVersion, RDMAP: NewRDMAPControl(op),
		ULP: srcQP, QN: DatagramQN(dstQP, QueueSend), MSN: msn})
	return append(b, payload...)
}

func dgmWriteRecord(f WriteRecordFields, payload []byte) []byte {
	f.RDMAP = NewRDMAPControl(OpWrite)
	return append(AppendWriteRecord(nil, &f), payload...)
}

func stdReadRequest(msn uint32, rr ReadRequestFields) []byte {
	b := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpReadRequest),
		QN: uint32(QueueReadRequest), MSN: msn})
	return AppendReadRequest(b, &rr)
}

func TestKnownBytes(t *testing.T) {
	// The first two bytes of standard iWARP segments: DDP control (T, L,
	// DV 1; RFC 5041 §6) then RDMAP control (RV 1 and the opcode; RFC 5040
	// §4), as urdma's include/proto.h and Linux siw's iwarp.h give them:
	// a one-segment RDMA Write starts C1 40, a Send 41 43, a Read Request
	// 41 41, a last Read Response C1 42, a Terminate 41 47.
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"one-segment RDMA Write", AppendTagged(nil, &TaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpWrite)}), "c1 40"},
		{"one-segment Send", AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpSend)}), "41 43"},
		{"Read Request", stdReadRequest(1, ReadRequestFields{}), "41 41"},
		{"last Read Response", AppendTagged(nil, &TaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpReadResponse)}), "c1 42"},
		{"Terminate", AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpTerminate)}), "41 47"},
		{"datagram Send", dgmSend(1, 2, 1, OpSend, nil), "42 43"},
		{"datagram Write-Record, last", dgmWriteRecord(WriteRecordFields{Last: true}, nil), "e2 40"},
		{"datagram Write-Record, not last", dgmWriteRecord(WriteRecordFields{MessageLength: 1}, nil), "a2 40"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if want := unhex(t, tc.want); !bytes.Equal(tc.b[:2], want) {
				t.Fatalf("first bytes % x, want % x", tc.b[:2], want)
			}
		})
	}
}

func TestTOEndsAtTop(t *testing.T) {
	// The last byte may sit at 2^64-1 (docs/wire.md §4.1).
	b := append(AppendTagged(nil, &TaggedFields{DV: 1, RDMAP: NewRDMAPControl(OpWrite), TO: ^uint64(0) - 1}), 1, 2)
	if _, err := ParseSegment(b, ProfileStream); err != nil {
		t.Fatal(err)
	}
	wr := dgmWriteRecord(WriteRecordFields{Last: true, TO: ^uint64(0) - 4, MO: 0, MessageLength: 5}, make([]byte, 5))
	if _, err := ParseSegment(wr, ProfileDatagram); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTripTagged(t *testing.T) {
	f := TaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpReadResponse), STag: 0xdeadbe01, TO: 0x0102030405060708}
	b := append(AppendTagged(nil, &f), "payload"...)
	s, err := ParseSegment(b, ProfileStream)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Tagged()
	got := TaggedFields{Last: h.Control().Last(), DV: h.Control().Version(), RDMAP: h.RDMAP(), STag: h.STag(), TO: h.TO()}
	if got != f || string(s.Payload) != "payload" || s.Opcode() != OpReadResponse || !s.Control.Tagged() {
		t.Fatalf("round trip: %+v payload %q", got, s.Payload)
	}
	h.SetSTag(7)
	h.SetTO(9)
	if h.STag() != 7 || h.TO() != 9 {
		t.Fatal("setters")
	}
}

func TestRoundTripWriteRecord(t *testing.T) {
	f := WriteRecordFields{Last: false, RDMAP: NewRDMAPControl(OpWrite), STag: 0x00123401, TO: 0x10000 + 1400,
		MSN: 0xfffffffe, MO: 1400, MessageLength: 4000, DstQPN: MaxQPN, SrcQPN: 77}
	b := append(AppendWriteRecord(nil, &f), make([]byte, 1400)...)
	s, err := ParseSegment(b, ProfileDatagram)
	if err != nil {
		t.Fatal(err)
	}
	h := s.WriteRecord()
	got := WriteRecordFields{Last: s.Control.Last(), RDMAP: s.RDMAP, STag: h.Tagged().STag(), TO: h.Tagged().TO(),
		MSN: h.MSN(), MO: h.MO(), MessageLength: h.MessageLength(), DstQPN: h.DstQPN(), SrcQPN: h.SrcQPN()}
	if got != f || len(s.Payload) != 1400 || !s.Control.WriteRecord() {
		t.Fatalf("round trip: %+v", got)
	}
	if h.MessageTO() != 0x10000 {
		t.Fatalf("MessageTO = %#x", h.MessageTO())
	}
	// The same bytes under the stream profile: W is a reserved bit there,
	// so they read as a plain tagged write of 20 more payload bytes.
	b[0] = b[0]&^3 | DDPVersion
	s, err = ParseSegment(b, ProfileStream)
	if err != nil || len(s.Payload) != 1400+WriteRecordExtSize {
		t.Fatalf("stream profile: %v, payload %d", err, len(s.Payload))
	}
}

func TestRoundTripUntagged(t *testing.T) {
	for _, p := range []Profile{ProfileStream, ProfileDatagram} {
		for _, op := range []Opcode{OpSend, OpSendSE, OpSendInvalidate, OpSendSEInvalidate} {
			if p == ProfileDatagram && op.Invalidates() {
				continue
			}
			t.Run(p.String()+"/"+op.String(), func(t *testing.T) {
				q, _ := op.Queue()
				f := UntaggedFields{Last: true, DV: p.Version(), RDMAP: NewRDMAPControl(op), ULP: 0xabcdef, QN: uint32(q), MSN: 42}
				if p == ProfileDatagram {
					f.QN = DatagramQN(0x123456, q)
				}
				b := append(AppendUntagged(nil, &f), "hello"...)
				s, err := ParseSegment(b, p)
				if err != nil {
					t.Fatal(err)
				}
				h := s.Untagged()
				got := UntaggedFields{Last: h.Control().Last(), DV: h.Control().Version(), RDMAP: h.RDMAP(), ULP: h.ULP(), QN: h.QN(), MSN: h.MSN(), MO: h.MO()}
				if got != f || string(s.Payload) != "hello" {
					t.Fatalf("round trip: %+v", got)
				}
				if p == ProfileDatagram && (h.DstQPN() != 0x123456 || h.SrcQPN() != 0xabcdef || Queue(h.Queue()) != q) {
					t.Fatalf("datagram addressing: dst %#x src %#x", h.DstQPN(), h.SrcQPN())
				}
				if s.Opcode().Solicited() != (op == OpSendSE || op == OpSendSEInvalidate) {
					t.Fatal("Solicited")
				}
			})
		}
	}
}

func TestRoundTripRDMAPHeaders(t *testing.T) {
	rr := ReadRequestFields{SinkSTag: 1, SinkTO: 2, Size: 3, SourceSTag: 4, SourceTO: 5}
	s, err := ParseSegment(stdReadRequest(1, rr), ProfileStream)
	if err != nil {
		t.Fatal(err)
	}
	r := s.ReadRequest()
	if (ReadRequestFields{r.SinkSTag(), r.SinkTO(), r.Size(), r.SourceSTag(), r.SourceTO()}) != rr || len(s.Payload) != 0 {
		t.Fatalf("read request round trip")
	}

	ar := AtomicRequestFields{Op: AtomicCmpSwap, RequestID: 9, STag: 0x100, TO: 64, SwapAddData: 1, SwapAddMask: ^uint64(0), CompareData: 2, CompareMask: 3}
	b := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpAtomicRequest), QN: 1, MSN: 2})
	s, err = ParseSegment(AppendAtomicRequest(b, &ar), ProfileStream)
	if err != nil {
		t.Fatal(err)
	}
	a := s.AtomicRequest()
	if (AtomicRequestFields{a.Op(), a.RequestID(), a.STag(), a.TO(), a.SwapAddData(), a.SwapAddMask(), a.CompareData(), a.CompareMask()}) != ar || a.Reserved() != 0 {
		t.Fatal("atomic request round trip")
	}
	if len(s.Header) != DDPUntaggedHeaderSize+AtomicRequestSize {
		t.Fatalf("atomic request is %d bytes, RFC 7306 says 70", len(s.Header))
	}

	b = AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpAtomicResponse), QN: 3, MSN: 1})
	s, err = ParseSegment(AppendAtomicResponse(b, 9, 0xfeed), ProfileStream)
	if err != nil || s.AtomicResponse().RequestID() != 9 || s.AtomicResponse().Value() != 0xfeed {
		t.Fatalf("atomic response: %v", err)
	}

	b = AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpImmediateDataSE), QN: 0, MSN: 1})
	s, err = ParseSegment(AppendImmediateData(b, 0x1122334455667788), ProfileStream)
	if err != nil || s.ImmediateData().Value() != 0x1122334455667788 || !s.Opcode().Solicited() {
		t.Fatalf("immediate data: %v", err)
	}
}

func TestRoundTripTerminate(t *testing.T) {
	tagged := AppendTagged(nil, &TaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpWrite), STag: 0x55, TO: 0x66})
	rreq := stdReadRequest(3, ReadRequestFields{SinkSTag: 1, Size: 8, SourceSTag: 0x99})
	for _, tc := range []struct {
		name string
		f    TerminateFields
		size int
	}{
		{"bare", TerminateFields{Code: RDMAPCatastrophicStream}, 4},
		{"DDP tagged header", TerminateFields{Code: DDPTaggedBaseBounds, SegmentLengthValid: true, DDPSegmentLength: 1400, DDPHeader: tagged}, 4 + 2 + 14},
		{"DDP and RDMA headers", TerminateFields{Code: RDMAPInvalidSTag, SegmentLengthValid: true, DDPSegmentLength: 46, DDPHeader: rreq[:18], RDMAHeader: rreq[18:]}, 4 + 2 + 18 + 28},
		{"D without M", TerminateFields{Code: DDPUntaggedInvalidQN, DDPHeader: rreq[:18]}, 4 + 2 + 18},
		{"datagram Write-Record header", TerminateFields{Code: DDPTaggedInvalidSTag, SegmentLengthValid: true, DDPSegmentLength: 39,
			DDPHeader: dgmWriteRecord(WriteRecordFields{Last: true, MSN: 7}, nil)}, 4 + 2 + 34},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n := TerminateSize(&tc.f); n != tc.size {
				t.Fatalf("TerminateSize = %d, want %d", n, tc.size)
			}
			b := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpTerminate), QN: 2, MSN: 1})
			b, err := AppendTerminate(b, &tc.f)
			if err != nil {
				t.Fatal(err)
			}
			s, err := ParseSegment(b, ProfileStream)
			if err != nil {
				t.Fatal(err)
			}
			term := s.Terminate()
			if term.Code() != tc.f.Code || term.D() != (tc.f.DDPHeader != nil) || term.R() != (tc.f.RDMAHeader != nil) {
				t.Fatalf("flags/code: %v D=%v R=%v", term.Code(), term.D(), term.R())
			}
			if !bytes.Equal(term.DDPHeader(), tc.f.DDPHeader) || !bytes.Equal(term.RDMAHeader(), tc.f.RDMAHeader) {
				t.Fatal("echoed headers differ")
			}
			n, ok := term.DDPSegmentLength()
			if ok != tc.f.SegmentLengthValid || (ok && n != tc.f.DDPSegmentLength) {
				t.Fatalf("segment length %d valid=%v", n, ok)
			}
		})
	}
	if _, err := AppendTerminate(nil, &TerminateFields{DDPHeader: tagged[:13]}); !isErr(err, ErrOffset) {
		t.Fatalf("short echoed header accepted: %v", err)
	}
}

func TestErrorCodeStrings(t *testing.T) {
	for code, want := range map[ErrorCode]string{
		DDPTaggedInvalidSTag:     "DDP tagged buffer: invalid STag",
		RDMAPUnexpectedOpcode:    "RDMAP remote operation: unexpected OpCode",
		MPACRCError:              "MPA: CRC error",
		MPANoMatchingRTR:         "MPA: no matching RTR option",
		NewErrorCode(0, 0, 0x33): "RDMAP local catastrophic error",
		NewErrorCode(1, 3, 0x01): "DDP etype 3 ecode 0x1",
	} {
		if code.String() != want {
			t.Errorf("%#04x.String() = %q, want %q", uint16(code), code.String(), want)
		}
	}
	if c := NewErrorCode(LayerDDP, 2, 5); c != DDPUntaggedTooLong || c.Layer() != LayerDDP || c.EType() != 2 || c.ECode() != 5 {
		t.Fatalf("NewErrorCode fields: %#x", uint16(c))
	}
	if OpAtomicResponse.String() != "Atomic Response" || Opcode(13).String() != "opcode 13" || AtomicCmpSwap.String() != "CmpSwap" {
		t.Fatal("opcode names")
	}
}

// TestBadSegments sends every malformation the parser knows and checks the
// typed error, the field and the Terminate code.
func TestBadSegments(t *testing.T) {
	send := dgmSend(5, 6, 1, OpSend, []byte("x"))
	wr := func(f WriteRecordFields, n int) []byte { return dgmWriteRecord(f, make([]byte, n)) }
	mod := func(b []byte, f func([]byte)) []byte { c := append([]byte(nil), b...); f(c); return c }
	term := func(ctl []byte) []byte {
		b := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpTerminate), QN: 2, MSN: 1})
		return append(b, ctl...)
	}
	for _, tc := range []struct {
		name string
		p    Profile
		b    []byte
		err  error
		code ErrorCode
	}{
		{"empty", ProfileDatagram, nil, ErrTruncated, 0},
		{"one byte", ProfileDatagram, []byte{0x42}, ErrTruncated, 0},
		{"DV 1 on datagram", ProfileDatagram, mod(send, func(b []byte) { b[0] = 0x41 }), ErrVersion, DDPUntaggedInvalidVersion},
		{"DV 2 on stream", ProfileStream, send, ErrVersion, DDPUntaggedInvalidVersion},
		{"tagged DV 3", ProfileDatagram, mod(wr(WriteRecordFields{Last: true}, 0), func(b []byte) { b[0] |= 3 }), ErrVersion, DDPTaggedInvalidVersion},
		{"reserved DDP bit", ProfileDatagram, mod(send, func(b []byte) { b[0] |= 0x08 }), ErrReserved, DDPUntaggedInvalidVersion},
		{"W on untagged", ProfileDatagram, mod(send, func(b []byte) { b[0] |= 0x20 }), ErrReserved, 0},
		{"reserved RDMAP bits", ProfileDatagram, mod(send, func(b []byte) { b[1] |= 0x10 }), ErrReserved, RDMAPInvalidVersion},
		{"RV 0", ProfileStream, mod(stdReadRequest(1, ReadRequestFields{}), func(b []byte) { b[1] &^= 0xC0 }), ErrVersion, RDMAPInvalidVersion},
		{"opcode 0xC", ProfileDatagram, mod(send, func(b []byte) { b[1] = 0x4C }), ErrOpcode, RDMAPUnexpectedOpcode},
		{"Send on tagged", ProfileDatagram, mod(wr(WriteRecordFields{Last: true}, 0), func(b []byte) { b[1] = 0x43 }), ErrOpcode, RDMAPUnexpectedOpcode},
		{"Write on untagged", ProfileDatagram, mod(send, func(b []byte) { b[1] = 0x40 }), ErrOpcode, RDMAPUnexpectedOpcode},
		{"Read Response with W", ProfileDatagram, mod(wr(WriteRecordFields{Last: true}, 0), func(b []byte) { b[1] = 0x42 }), ErrOpcode, RDMAPUnexpectedOpcode},
		{"Send with Invalidate on datagram", ProfileDatagram, dgmSend(1, 1, 1, OpSendInvalidate, nil), ErrOpcode, RDMAPUnexpectedOpcode},
		{"truncated tagged", ProfileStream, AppendTagged(nil, &TaggedFields{DV: 1, RDMAP: NewRDMAPControl(OpWrite)})[:13], ErrTruncated, DDPTaggedBaseBounds},
		{"truncated Write-Record", ProfileDatagram, wr(WriteRecordFields{Last: true}, 0)[:33], ErrTruncated, DDPTaggedBaseBounds},
		{"TO wrap", ProfileStream, append(AppendTagged(nil, &TaggedFields{DV: 1, RDMAP: NewRDMAPControl(OpWrite), TO: ^uint64(0)}), 1, 2), ErrOffset, DDPTaggedTOWrap},
		{"TO wrap by one byte", ProfileStream, append(AppendTagged(nil, &TaggedFields{DV: 1, RDMAP: NewRDMAPControl(OpWrite), TO: ^uint64(0) - 1}), 1, 2, 3), ErrOffset, DDPTaggedTOWrap},
		{"WR payload past message", ProfileDatagram, wr(WriteRecordFields{Last: true, MessageLength: 10, MO: 8, TO: 8}, 3), ErrOffset, DDPTaggedBaseBounds},
		{"WR L clear on last segment", ProfileDatagram, wr(WriteRecordFields{MessageLength: 10, MO: 7, TO: 7}, 3), ErrLastFlag, 0},
		{"WR L set mid-message", ProfileDatagram, wr(WriteRecordFields{Last: true, MessageLength: 10, MO: 0}, 3), ErrLastFlag, 0},
		{"WR MO beyond TO", ProfileDatagram, wr(WriteRecordFields{Last: true, MessageLength: 10, MO: 7, TO: 6}, 3), ErrOffset, DDPTaggedTOWrap},
		{"WR message wraps TO", ProfileDatagram, wr(WriteRecordFields{MessageLength: 100, TO: ^uint64(0) - 10}, 3), ErrOffset, DDPTaggedTOWrap},
		{"WR dst QPN > 24 bits", ProfileDatagram, wr(WriteRecordFields{Last: true, DstQPN: 1 << 24}, 0), ErrQueue, 0},
		{"WR src QPN > 24 bits", ProfileDatagram, wr(WriteRecordFields{Last: true, SrcQPN: 1 << 30}, 0), ErrQueue, 0},
		{"truncated untagged", ProfileDatagram, send[:17], ErrTruncated, 0},
		{"Send on queue 1", ProfileDatagram, mod(send, func(b []byte) { b[9] |= 1 }), ErrQueue, DDPUntaggedInvalidQN},
		{"stream Send on QN 4", ProfileStream, append(AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpSend), QN: 4}), 1), ErrQueue, DDPUntaggedInvalidQN},
		{"dst QPN > 24 bits", ProfileDatagram, mod(send, func(b []byte) { b[6] = 0x80 }), ErrQueue, DDPUntaggedInvalidQN},
		{"src QPN > 24 bits", ProfileDatagram, mod(send, func(b []byte) { b[2] = 0x01 }), ErrQueue, DDPUntaggedInvalidQN},
		{"datagram MO != 0", ProfileDatagram, mod(send, func(b []byte) { b[17] = 4 }), ErrOffset, DDPUntaggedInvalidMO},
		{"datagram L clear", ProfileDatagram, mod(send, func(b []byte) { b[0] &^= 0x40 }), ErrLastFlag, 0},
		{"short Read Request", ProfileStream, stdReadRequest(1, ReadRequestFields{})[:45], ErrTruncated, 0},
		{"Read Request with payload", ProfileStream, append(stdReadRequest(1, ReadRequestFields{}), 0), ErrTooLong, DDPUntaggedTooLong},
		{"Read Request at MO 4", ProfileStream, mod(stdReadRequest(1, ReadRequestFields{}), func(b []byte) { b[17] = 4 }), ErrOffset, DDPUntaggedInvalidMO},
		{"Terminate too short", ProfileStream, term([]byte{0, 0, 0}), ErrTruncated, 0},
		{"Terminate D without header", ProfileStream, term([]byte{0x11, 0x00, 0x40, 0x00, 0, 14}), ErrTruncated, 0},
		{"Terminate D with half a header", ProfileStream, term([]byte{0x11, 0x00, 0x40, 0x00, 0, 14, 0xc1, 0x40, 0, 0}), ErrTruncated, 0},
		{"Terminate R without header", ProfileStream, term([]byte{0x01, 0x00, 0x20, 0x00}), ErrTruncated, 0},
		{"Terminate trailing bytes", ProfileStream, term([]byte{0x02, 0x07, 0x00, 0x00, 0xff}), ErrTooLong, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSegment(tc.b, tc.p)
			mustCode(t, err, tc.err, tc.code)
		})
	}
}

// TestParseRDSegment: over RD a Send may span segments (MO, L); UD keeps
// one segment per untagged message, and over RD every untagged message
// but a Send does too.
func TestParseRDSegment(t *testing.T) {
	send := func(op Opcode, mo uint32, last bool, rest []byte) []byte {
		b := AppendUntagged(nil, &UntaggedFields{Last: last, DV: DatagramDDPVersion, RDMAP: NewRDMAPControl(op),
			ULP: 6, QN: DatagramQN(5, QueueSend), MSN: 1, MO: mo})
		return append(b, rest...)
	}
	for _, tc := range []struct {
		b      []byte
		ud, rd bool // accepted
	}{
		{send(OpSend, 0, true, []byte("x")), true, true},
		{send(OpSend, 0, false, []byte("x")), false, true},
		{send(OpSendSE, 1400, true, []byte("x")), false, true},
		{send(OpImmediateData, 8, true, make([]byte, ImmediateDataSize)), false, false},
		{send(OpImmediateData, 0, false, make([]byte, ImmediateDataSize)), false, false},
	} {
		_, errUD := ParseSegment(tc.b, ProfileDatagram)
		seg, errRD := ParseRDSegment(tc.b)
		if (errUD == nil) != tc.ud || (errRD == nil) != tc.rd {
			t.Errorf("%x: UD %v, RD %v; want accepted %v, %v", tc.b, errUD, errRD, tc.ud, tc.rd)
		}
		if errRD == nil && seg.Untagged().MO() != DDPUntagged(tc.b).MO() {
			t.Errorf("%x: MO %d", tc.b, seg.Untagged().MO())
		}
	}
}
