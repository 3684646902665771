package udiwarp

import (
	"bytes"
	"math"
	"testing"
)

// seedSegments returns one valid segment of every kind for the corpora.
func seedSegments() (datagram, stream [][]byte) {
	wr := dgmWriteRecord(WriteRecordFields{Last: true, STag: 0x101, TO: 64, MSN: 1, MessageLength: 5, DstQPN: 1, SrcQPN: 2}, []byte("hello"))
	wrMid := dgmWriteRecord(WriteRecordFields{STag: 0x101, TO: 1464, MSN: 9, MO: 1400, MessageLength: 4000, DstQPN: 1, SrcQPN: 2}, make([]byte, 1400))
	rr := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 2, RDMAP: NewRDMAPControl(OpReadRequest), ULP: 2, QN: DatagramQN(1, QueueReadRequest), MSN: 1})
	rr = AppendReadRequest(rr, &ReadRequestFields{SinkSTag: 0x201, SinkTO: 0, Size: 4096, SourceSTag: 0x301, SourceTO: 8})
	dterm := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 2, RDMAP: NewRDMAPControl(OpTerminate), ULP: 2, QN: DatagramQN(1, QueueTerminate), MSN: 1})
	dterm, _ = AppendTerminate(dterm, &TerminateFields{Code: DDPTaggedInvalidSTag, SegmentLengthValid: true, DDPSegmentLength: 39, DDPHeader: wr[:14]})
	rresp := append(AppendTagged(nil, &TaggedFields{Last: true, DV: 2, RDMAP: NewRDMAPControl(OpReadResponse), STag: 0x201}), 1, 2, 3)
	datagram = [][]byte{dgmSend(1, 2, 1, OpSend, []byte("hi")), dgmSend(3, 4, 7, OpSendSE, nil), wr, wrMid, rr, dterm, rresp}

	sterm := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpTerminate), QN: 2, MSN: 1})
	rreq := stdReadRequest(1, ReadRequestFields{SinkSTag: 1, Size: 8, SourceSTag: 2})
	sterm, _ = AppendTerminate(sterm, &TerminateFields{Code: RDMAPInvalidSTag, SegmentLengthValid: true, DDPSegmentLength: 46, DDPHeader: rreq[:18], RDMAHeader: rreq[18:]})
	atom := AppendAtomicRequest(AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpAtomicRequest), QN: 1, MSN: 2}), &AtomicRequestFields{Op: AtomicFetchAdd, STag: 5, TO: 8, SwapAddData: 1})
	imm := AppendImmediateData(AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpImmediateData), MSN: 3}), 42)
	write := append(AppendTagged(nil, &TaggedFields{DV: 1, RDMAP: NewRDMAPControl(OpWrite), STag: 0x100, TO: 4096}), make([]byte, 100)...)
	stream = [][]byte{stdSend(1, []byte("payload")), rreq, sterm, atom, imm, write}
	return datagram, stream
}

// checkSegment holds the invariants every accepted segment must satisfy:
// header and payload are exactly the input, the header is as long as the
// opcode says, and every view reads inside it.
func checkSegment(t *testing.T, b []byte, s Segment) {
	t.Helper()
	if len(s.Header)+len(s.Payload) != len(b) || !bytes.Equal(append(append([]byte(nil), s.Header...), s.Payload...), b) {
		t.Fatalf("header %d + payload %d != input %d", len(s.Header), len(s.Payload), len(b))
	}
	switch op := s.Opcode(); {
	case s.Control.Tagged():
		want := DDPTaggedHeaderSize
		if s.Profile == ProfileDatagram && s.Control.WriteRecord() {
			want = WriteRecordHeaderSize
			h := s.WriteRecord()
			if uint64(h.MO())+uint64(len(s.Payload)) > uint64(h.MessageLength()) {
				t.Fatal("accepted a Write-Record segment that ends past its message")
			}
			if ml := uint64(h.MessageLength()); ml > 0 && h.MessageTO() > math.MaxUint64-(ml-1) {
				t.Fatal("accepted a Write-Record message that wraps TO")
			}
		}
		if len(s.Header) != want {
			t.Fatalf("tagged header %d bytes, want %d", len(s.Header), want)
		}
		if n := uint64(len(s.Payload)); n > 0 && s.Tagged().TO() > math.MaxUint64-(n-1) {
			t.Fatal("accepted a TO that wraps")
		}
	case op == OpTerminate:
		term := s.Terminate()
		_, _ = term.DDPSegmentLength()
		_ = term.DDPHeader()
		_ = term.RDMAHeader()
		_ = term.Code().String()
		if len(s.Payload) != 0 {
			t.Fatal("Terminate with payload")
		}
	default:
		size, payload := untaggedRDMAPSize(op)
		if !payload && len(s.Header) != DDPUntaggedHeaderSize+size {
			t.Fatalf("%v header %d bytes", op, len(s.Header))
		}
	}
	_ = s.String()
}

func FuzzDDP(f *testing.F) {
	dgm, std := seedSegments()
	for _, b := range dgm {
		f.Add(b, true)
	}
	for _, b := range std {
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, b []byte, datagram bool) {
		p := ProfileStream
		if datagram {
			p = ProfileDatagram
		}
		s, err := ParseSegment(b, p)
		if err != nil {
			if _, ok := CodeOf(err); !ok {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		checkSegment(t, b, s)
	})
}

// FuzzRDMAP fuzzes the RDMAP control byte and everything after a valid
// untagged header, where the RDMAP sub-headers live.
func FuzzRDMAP(f *testing.F) {
	_, std := seedSegments()
	for _, b := range std {
		if !DDPControl(b[0]).Tagged() {
			f.Add(b[1], b[DDPUntaggedHeaderSize:])
		}
	}
	f.Fuzz(func(t *testing.T, rdmap byte, rest []byte) {
		op := RDMAPControl(rdmap).Opcode()
		q, _ := op.Queue()
		b := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: RDMAPControl(rdmap), QN: uint32(q), MSN: 1})
		b = append(b, rest...)
		s, err := ParseSegment(b, ProfileStream)
		if err != nil {
			return
		}
		checkSegment(t, b, s)
	})
}

func FuzzReadRequest(f *testing.F) {
	f.Add(uint32(1), uint64(0), uint32(4096), uint32(2), uint64(8), 0)
	f.Add(uint32(0xffffffff), uint64(math.MaxUint64), uint32(0), uint32(0), uint64(0), -1)
	f.Fuzz(func(t *testing.T, sink uint32, sinkTO uint64, size, src uint32, srcTO uint64, extra int) {
		rr := ReadRequestFields{sink, sinkTO, size, src, srcTO}
		b := stdReadRequest(1, rr)
		switch {
		case extra < 0:
			b = b[:len(b)+max(extra%len(b), -len(b))]
		case extra > 0:
			b = append(b, make([]byte, extra%100)...)
		}
		s, err := ParseSegment(b, ProfileStream)
		if len(b) != DDPUntaggedHeaderSize+ReadRequestSize {
			if err == nil {
				t.Fatalf("accepted a %d-byte Read Request", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		r := s.ReadRequest()
		if (ReadRequestFields{r.SinkSTag(), r.SinkTO(), r.Size(), r.SourceSTag(), r.SourceTO()}) != rr {
			t.Fatal("round trip")
		}
	})
}

func FuzzTerminate(f *testing.F) {
	_, std := seedSegments()
	f.Add(std[2][DDPUntaggedHeaderSize:])
	f.Add([]byte{0x11, 0x01, 0xC0, 0x00, 0x00, 0x0e, 0xc1, 0x40, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x02, 0x07, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		term, err := ParseTerminate(b)
		if err != nil {
			return
		}
		n, mValid := term.DDPSegmentLength()
		fields := TerminateFields{Code: term.Code(), SegmentLengthValid: mValid, DDPSegmentLength: n, DDPHeader: term.DDPHeader(), RDMAHeader: term.RDMAHeader()}
		if TerminateSize(&fields) != len(b) {
			t.Fatalf("declared size %d, parsed %d", TerminateSize(&fields), len(b))
		}
		out, err := AppendTerminate(nil, &fields)
		if err != nil {
			t.Fatal(err)
		}
		// Identical but for the 13 reserved bits and an M flag without D.
		in := append([]byte(nil), b...)
		in[2] &^= 0x9F
		in[3] = 0
		if term.D() && term.M() {
			in[2] |= 0x80
		}
		out[2] &^= 0x1F
		if !bytes.Equal(in, out) {
			t.Fatalf("re-encoded % x, parsed % x", out, b)
		}
	})
}

func FuzzWriteRecord(f *testing.F) {
	f.Add(uint64(64), uint32(0), uint32(5), 5, true, uint32(1), uint32(2))
	f.Add(uint64(2800), uint32(1400), uint32(4000), 1400, false, uint32(1), uint32(2))
	f.Add(uint64(math.MaxUint64), uint32(0), uint32(1), 1, true, uint32(MaxQPN+1), uint32(0))
	f.Fuzz(func(t *testing.T, to uint64, mo, msgLen uint32, n int, last bool, dst, src uint32) {
		n = int(uint(n) % 2048)
		b := dgmWriteRecord(WriteRecordFields{Last: last, STag: 0x100, TO: to, MSN: 1, MO: mo, MessageLength: msgLen, DstQPN: dst, SrcQPN: src}, make([]byte, n))
		// The extension's rules, written independently of the parser.
		end := uint64(mo) + uint64(n)
		within := func(base, k uint64) bool { return k == 0 || base <= math.MaxUint64-(k-1) } // last byte <= 2^64-1
		valid := end <= uint64(msgLen) && last == (end == uint64(msgLen)) && uint64(mo) <= to &&
			within(to, uint64(n)) && within(to-uint64(mo), uint64(msgLen)) && dst <= MaxQPN && src <= MaxQPN
		s, err := ParseSegment(b, ProfileDatagram)
		if (err == nil) != valid {
			t.Fatalf("TO=%d MO=%d len=%d n=%d L=%v dst=%d src=%d: valid=%v, err=%v", to, mo, msgLen, n, last, dst, src, valid, err)
		}
		if err == nil {
			checkSegment(t, b, s)
		}
	})
}

func FuzzParseUDFrame(f *testing.F) {
	dgm, _ := seedSegments()
	for _, b := range dgm {
		f.Add(SealDatagram(append([]byte(nil), b...), 0))
	}
	f.Add([]byte{0x03, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, cerr := Classify(b)
		s, err := ParseUDFrame(b)
		if err != nil {
			if _, ok := CodeOf(err); !ok {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if cerr != nil || typ != FrameUD {
			t.Fatal("accepted a frame Classify rejects")
		}
		if WireCRC(b[len(b)-CRCSize:]) != CRC32c(b[:len(b)-CRCSize]) {
			t.Fatal("accepted a bad CRC")
		}
		checkSegment(t, b[:len(b)-CRCSize], s)
		if s.Control.Tagged() && !s.Control.WriteRecord() {
			t.Fatal("accepted a tagged UD segment that names no QP")
		}
	})
}

func FuzzMPADeframe(f *testing.F) {
	fr := MPAFramer{Markers: true, CRC: true}
	s, _ := fr.Append(nil, stdSend(1, make([]byte, 600)), nil)
	s, _ = fr.Append(s, stdSend(2, nil), nil)
	f.Add(s, true, true, uint16(0))
	plain := MPAFramer{CRC: true}
	p, _ := plain.Append(nil, stdSend(1, []byte("abc")), nil)
	f.Add(p, false, true, uint16(0))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff}, true, false, uint16(508))
	f.Fuzz(func(t *testing.T, b []byte, markers, crc bool, start uint16) {
		d := MPADeframer{Markers: markers, CRC: crc, pos: uint64(start) &^ 3}
		orig := append([]byte(nil), b...)
		for len(b) > 0 {
			u, n, need, err := d.Next(b)
			if err != nil {
				return
			}
			if n == 0 {
				if need <= len(b) {
					t.Fatalf("asked for %d octets with %d buffered", need, len(b))
				}
				if !bytes.Equal(b, orig[len(orig)-len(b):]) {
					t.Fatal("an incomplete FPDU was modified")
				}
				return
			}
			if n > len(b) || len(u) > n || n%4 != 0 {
				t.Fatalf("n=%d of %d, ULPDU %d", n, len(b), len(u))
			}
			b = b[n:]
			orig = orig[n:]
		}
	})
}

// FuzzMPARoundTrip frames random ULPDUs from a random stream offset and
// deframes them delivered in random chunks.
func FuzzMPARoundTrip(f *testing.F) {
	f.Add([]byte{10, 200, 3, 0, 255}, uint16(0), true, uint8(7))
	f.Add([]byte{1}, uint16(508), true, uint8(1))
	f.Fuzz(func(t *testing.T, sizes []byte, start uint16, markers bool, chunk uint8) {
		if len(sizes) > 64 {
			sizes = sizes[:64] // enough FPDUs to cross many markers; keeps each run fast
		}
		pos := uint64(start) &^ 3
		fr := MPAFramer{Markers: markers, CRC: true, pos: pos}
		d := MPADeframer{Markers: markers, CRC: true, pos: pos}
		var stream []byte
		var want [][]byte
		for i, sz := range sizes {
			u := bytes.Repeat([]byte{byte(i + 1)}, int(sz)*13)
			want = append(want, u)
			stream, _ = fr.Append(stream, u[:len(u)/3], u[len(u)/3:])
		}
		step := int(chunk)*16 + 1
		var buf []byte
		got := 0
		for fed := 0; got < len(want); {
			u, n, _, err := d.Next(buf)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				if fed == len(stream) {
					t.Fatal("stuck")
				}
				k := min(step, len(stream)-fed)
				buf = append(buf, stream[fed:fed+k]...)
				fed += k
				continue
			}
			if !bytes.Equal(u, want[got]) {
				t.Fatalf("ULPDU %d differs", got)
			}
			got++
			buf = buf[n:]
		}
	})
}

func FuzzMPAFrame(f *testing.F) {
	for _, fl := range []MPAFrameFields{
		{Revision: 1, CRC: true, PrivateData: []byte("pd")},
		{Reply: true, Revision: 2, Enhanced: true, IRDORD: IRDORD{IRD: 16, ORD: 16, ReadRTR: true}},
	} {
		b, _ := AppendMPAFrame(nil, &fl)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, need, err := ParseMPAFrame(b)
		if err != nil {
			return
		}
		if n == 0 {
			if need <= len(b) {
				t.Fatalf("need %d with %d", need, len(b))
			}
			return
		}
		w, _ := m.IRDORD()
		fields := MPAFrameFields{Reply: m.Reply(), Markers: m.Markers(), CRC: m.CRC(), Reject: m.Reject(),
			Enhanced: m.Enhanced(), Revision: m.Revision(), IRDORD: w, PrivateData: m.PrivateData()}
		out, err := AppendMPAFrame(nil, &fields)
		if err != nil {
			t.Fatal(err)
		}
		in := append([]byte(nil), b[:n]...)
		in[16] &^= 0x0F // Res: not checked on receive
		if !m.Reply() {
			in[16] &^= mpaFlagR // R: not checked in a Request
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("re-encoded % x, parsed % x", out, in)
		}
	})
}
