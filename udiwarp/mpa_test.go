package udiwarp

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

func stdSend(msn uint32, payload []byte) []byte {
	b := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpSend), MSN: msn})
	return append(b, payload...)
}

func TestMPAPad(t *testing.T) {
	// ULPDU_Length + ULPDU + pad is a multiple of four (RFC 5044 §4.1).
	for n, want := range map[int]int{0: 2, 1: 1, 2: 0, 3: 3, 14: 0, 18: 0, 42: 0, 100: 2, 482: 0, 1399: 3} {
		if got := MPAPad(n); got != want {
			t.Errorf("MPAPad(%d) = %d, want %d", n, got, want)
		}
		if (MPAHeaderSize+n+MPAPad(n))%4 != 0 || FPDUSize(n)%4 != 0 {
			t.Errorf("FPDU of %d is not 4-aligned", n)
		}
	}
}

// RFC 5044 Figure 5: the first FPDU of a stream with markers, a Send of 24
// zero bytes; the CRC covers the leading marker.
func TestMPARFC5044Figure5(t *testing.T) {
	want := unhex(t, `00 00 00 00  00 2a  41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00`+
		`000000000000000000000000000000000000000000000000  52 23 99 83`)
	f := MPAFramer{Markers: true, CRC: true}
	got, err := f.Append(nil, stdSend(1, nil), make([]byte, 24))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("FPDU\n got % x\nwant % x", got, want)
	}
	d := MPADeframer{Markers: true, CRC: true}
	ulpdu, n, _, err := d.Next(got)
	if err != nil || n != len(want) || !bytes.Equal(ulpdu, append(stdSend(1, nil), make([]byte, 24)...)) {
		t.Fatalf("deframe: n=%d err=%v", n, err)
	}
}

// RFC 5044 Figure 6: the second FPDU of a stream whose first FPDU took 492
// octets; a marker with FPDUPTR 0x14 falls at stream octet 0x200.
func TestMPARFC5044Figure6(t *testing.T) {
	f := MPAFramer{Markers: true, CRC: true}
	first, _ := f.Append(nil, stdSend(1, make([]byte, 482-18)), nil)
	if len(first) != 492 {
		t.Fatalf("first FPDU is %d octets, the RFC's is 492", len(first))
	}
	second, err := f.Append(nil, stdSend(2, nil), make([]byte, 24))
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, `00 2a 41 43 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00`+
		`00 00 00 14`+
		`000000000000000000000000000000000000000000000000  84 92 58 98`)
	if !bytes.Equal(second, want) {
		t.Fatalf("FPDU\n got % x\nwant % x", second, want)
	}
	d := MPADeframer{Markers: true, CRC: true}
	stream := append(first, second...)
	if _, n, _, err := d.Next(stream); err != nil || n != 492 {
		t.Fatalf("first: n=%d err=%v", n, err)
	}
	ulpdu, _, _, err := d.Next(stream[492:])
	if err != nil || !bytes.Equal(ulpdu, append(stdSend(2, nil), make([]byte, 24)...)) {
		t.Fatalf("second: err=%v ulpdu % x", err, ulpdu)
	}
}

// A stream worked out by hand, with every kind of marker placement:
//
//	FPDU 1, ULPDU 100: marker@0 (ptr 0), len@4, ULPDU 6..105, pad 106..107, CRC 108..111
//	FPDU 2, ULPDU 500: len@112, 400 octets, marker@512 (ptr 400), 104 octets, CRC 620..623
//	FPDU 3, ULPDU 398: len@624, body ends at 1024, marker@1024 (ptr 400) before the CRC 1028..1031
//	FPDU 4, ULPDU 498: len@1032, CRC 1532..1535, ends exactly at 1536
//	FPDU 5, ULPDU 10:  marker@1536 (ptr 0, belongs to FPDU 5), len@1540, pad 2, CRC 1552..1555
func TestMPAMarkerPlacementByHand(t *testing.T) {
	sizes := []int{100, 500, 398, 498, 10}
	type mark struct {
		at  int
		ptr uint16
	}
	marks := []mark{{0, 0}, {512, 400}, {1024, 400}, {1536, 0}}
	ends := []int{112, 624, 1032, 1536, 1556}

	f := MPAFramer{Markers: true, CRC: true}
	var stream []byte
	var ulpdus [][]byte
	for i, n := range sizes {
		u := make([]byte, n)
		for j := range u {
			u[j] = byte(0x10*i + j%7 + 1) // never looks like a zero marker
		}
		ulpdus = append(ulpdus, u)
		if w := f.WireSize(n); w != ends[i]-len(stream) {
			t.Fatalf("FPDU %d: WireSize = %d, want %d", i+1, w, ends[i]-len(stream))
		}
		var err error
		if stream, err = f.Append(stream, u[:n/2], u[n/2:]); err != nil {
			t.Fatal(err)
		}
		if len(stream) != ends[i] {
			t.Fatalf("FPDU %d ends at %d, want %d", i+1, len(stream), ends[i])
		}
	}
	for _, m := range marks {
		if got := stream[m.at : m.at+4]; !bytes.Equal(got, []byte{0, 0, byte(m.ptr >> 8), byte(m.ptr)}) {
			t.Errorf("marker at %d = % x, want FPDUPTR %d", m.at, got, m.ptr)
		}
	}
	if got := binary.BigEndian.Uint16(stream[1540:]); got != 10 {
		t.Errorf("FPDU 5 ULPDU_Length at 1540 = %d", got)
	}
	// The marker before FPDU 3's CRC is inside that FPDU's CRC.
	if crc := CRC32c(stream[624:1028]); WireCRC(stream[1028:]) != crc {
		t.Errorf("FPDU 3 CRC does not cover the marker after its pad")
	}
	if crc := CRC32c(stream[1536:1552]); WireCRC(stream[1552:]) != crc {
		t.Errorf("FPDU 5 CRC does not cover its leading marker")
	}

	// Deframe all at once, then again one byte at a time.
	for _, chunk := range []int{len(stream), 1, 3, 64} {
		d := MPADeframer{Markers: true, CRC: true}
		in := append([]byte(nil), stream...)
		var got [][]byte
		buf, fed := []byte(nil), 0
		for fed < len(in) || len(buf) > 0 {
			u, n, need, err := d.Next(buf)
			if err != nil {
				t.Fatalf("chunk %d: %v", chunk, err)
			}
			if n == 0 {
				if fed == len(in) {
					t.Fatalf("chunk %d: stuck needing %d with %d buffered", chunk, need, len(buf))
				}
				k := min(chunk, len(in)-fed)
				buf = append(buf, in[fed:fed+k]...)
				fed += k
				continue
			}
			got = append(got, append([]byte(nil), u...))
			buf = buf[n:]
		}
		if len(got) != len(ulpdus) {
			t.Fatalf("chunk %d: %d ULPDUs, want %d", chunk, len(got), len(ulpdus))
		}
		for i := range got {
			if !bytes.Equal(got[i], ulpdus[i]) {
				t.Fatalf("chunk %d: ULPDU %d differs", chunk, i+1)
			}
		}
		if d.StreamOffset() != uint64(len(stream)) {
			t.Fatalf("deframer at %d", d.StreamOffset())
		}
	}
}

func TestMPARoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, markers := range []bool{false, true} {
		for _, crc := range []bool{false, true} {
			f := MPAFramer{Markers: markers, CRC: crc}
			d := MPADeframer{Markers: markers, CRC: crc}
			var stream []byte
			var want [][]byte
			for range 300 {
				u := make([]byte, r.IntN(3000))
				for j := range u {
					u[j] = byte(r.Uint32())
				}
				want = append(want, u)
				cut := r.IntN(len(u) + 1)
				before := len(stream)
				stream, _ = f.Append(stream, u[:cut], u[cut:])
				if len(stream)-before < FPDUSize(len(u)) {
					t.Fatal("FPDU shorter than its content")
				}
			}
			for i := range want {
				u, n, _, err := d.Next(stream)
				if err != nil || n == 0 || !bytes.Equal(u, want[i]) {
					t.Fatalf("markers=%v crc=%v FPDU %d: n=%d err=%v", markers, crc, i, n, err)
				}
				stream = stream[n:]
			}
			if f.StreamOffset() != d.StreamOffset() {
				t.Fatalf("offsets differ: %d vs %d", f.StreamOffset(), d.StreamOffset())
			}
		}
	}
}

func TestMPABadInput(t *testing.T) {
	build := func(markers bool) []byte {
		f := MPAFramer{Markers: markers, CRC: true}
		b, _ := f.Append(nil, stdSend(1, make([]byte, 600)), nil)
		return b
	}
	flip := func(b []byte, i int) []byte { c := append([]byte(nil), b...); c[i] ^= 0x01; return c }
	plain, marked := build(false), build(true)
	for _, tc := range []struct {
		name    string
		markers bool
		max     int
		b       []byte
		err     error
		code    ErrorCode
	}{
		{"payload bit flip", false, 0, flip(plain, 100), ErrCRC, MPACRCError},
		{"CRC bit flip", false, 0, flip(plain, len(plain)-1), ErrCRC, MPACRCError},
		{"leading marker FPDUPTR", true, 0, flip(marked, 3), ErrMarker, MPAMarkerMismatch},
		{"inner marker FPDUPTR", true, 0, func() []byte { b := append([]byte(nil), marked...); b[515] ^= 4; return fixCRC(b) }(), ErrMarker, MPAMarkerMismatch},
		{"ULPDU over MULPDU", false, 100, plain, ErrTooLong, MPALocalCatastrophic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := MPADeframer{Markers: tc.markers, CRC: true, MaxULPDU: tc.max}
			_, _, _, err := d.Next(tc.b)
			mustCode(t, err, tc.err, tc.code)
		})
	}
	t.Run("truncated FPDU waits", func(t *testing.T) {
		d := MPADeframer{CRC: true}
		for i := range plain {
			if u, n, need, err := d.Next(plain[:i]); err != nil || n != 0 || u != nil || need <= i {
				t.Fatalf("prefix %d: n=%d need=%d err=%v", i, n, need, err)
			}
		}
	})
	t.Run("CRC off ignores the field", func(t *testing.T) {
		d := MPADeframer{}
		if _, n, _, err := d.Next(flip(plain, len(plain)-1)); err != nil || n != len(plain) {
			t.Fatalf("n=%d err=%v", n, err)
		}
	})
	t.Run("oversized ULPDU refused by the framer", func(t *testing.T) {
		var f MPAFramer
		if _, err := f.Append(nil, make([]byte, MaxULPDU), []byte{1}); !isErr(err, ErrTooLong) {
			t.Fatalf("err = %v", err)
		}
	})
}

// fixCRC recomputes the CRC of the single FPDU b (leading marker
// included), so a test can corrupt a marker alone.
func fixCRC(b []byte) []byte {
	n := len(b) - CRCSize
	PutCRC(b[n:], CRC32c(b[:n]))
	return b
}

func TestMPAFrames(t *testing.T) {
	pd := []byte("hello, peer")
	for _, tc := range []MPAFrameFields{
		{Revision: 1, CRC: true, PrivateData: pd},
		{Reply: true, Revision: 1, Markers: true},
		{Reply: true, Reject: true, Revision: 1, PrivateData: []byte("no")},
		{Revision: 2, Enhanced: true, CRC: true, Markers: true, IRDORD: IRDORD{PeerToPeer: true, WriteRTR: true, ReadRTR: true, IRD: 128, ORD: 16}, PrivateData: pd},
		{Reply: true, Revision: 2, Enhanced: true, IRDORD: IRDORD{SendRTR: true, IRD: MaxIRDORD, ORD: 1}},
	} {
		b, err := AppendMPAFrame(nil, &tc)
		if err != nil {
			t.Fatal(err)
		}
		m, n, _, err := ParseMPAFrame(append(b, 0xAA)) // early FPDU byte after the frame
		if err != nil || n != len(b) {
			t.Fatalf("%+v: n=%d err=%v", tc, n, err)
		}
		w, ok := m.IRDORD()
		if m.Reply() != tc.Reply || m.Markers() != tc.Markers || m.CRC() != tc.CRC || m.Reject() != tc.Reject ||
			m.Enhanced() != tc.Enhanced || m.Revision() != tc.Revision || ok != tc.Enhanced || w != tc.IRDORD ||
			!bytes.Equal(m.PrivateData(), tc.PrivateData) {
			t.Fatalf("round trip of %+v differs", tc)
		}
	}
	// The key bytes of RFC 5044 §7.1.1 and the IRD/ORD word of RFC 6581 §9.
	b, _ := AppendMPAFrame(nil, &MPAFrameFields{Revision: 2, Enhanced: true, CRC: true,
		IRDORD: IRDORD{PeerToPeer: true, IRD: 128, WriteRTR: true, ORD: 16}})
	want := unhex(t, "4d504120494420526571204672616d65 50 02 0004 8080 8010")
	if !bytes.Equal(b, want) {
		t.Fatalf("enhanced request\n got % x\nwant % x", b, want)
	}

	for _, tc := range []struct {
		name string
		b    []byte
		err  error
	}{
		{"bad key", append([]byte("MPA ID Bad Frame"), 0, 1, 0, 0), ErrMPAFrame},
		{"rev 0", append([]byte("MPA ID Req Frame"), 0, 0, 0, 0), ErrVersion},
		{"rev 3", append([]byte("MPA ID Req Frame"), 0, 3, 0, 0), ErrVersion},
		{"PD_Length 513", append([]byte("MPA ID Req Frame"), 0, 1, 0x02, 0x01), ErrTooLong},
		{"S with rev 1", append([]byte("MPA ID Req Frame"), 0x10, 1, 0, 4, 0, 0, 0, 0), ErrVersion},
		{"S without IRD/ORD", append([]byte("MPA ID Rep Frame"), 0x10, 2, 0, 2, 0, 0), ErrTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := ParseMPAFrame(tc.b)
			mustCode(t, err, tc.err, MPAInvalidRequestReply)
		})
	}
	if _, n, need, err := ParseMPAFrame(b[:19]); n != 0 || need != 20 || err != nil {
		t.Fatalf("short header: n=%d need=%d err=%v", n, need, err)
	}
	if _, n, need, err := ParseMPAFrame(b[:22]); n != 0 || need != 24 || err != nil {
		t.Fatalf("short private data: n=%d need=%d err=%v", n, need, err)
	}
	for _, f := range []MPAFrameFields{{Revision: 1, Enhanced: true}, {Revision: 3}, {Revision: 1, PrivateData: make([]byte, 513)}, {Revision: 2, Enhanced: true, PrivateData: make([]byte, 509)}} {
		if _, err := AppendMPAFrame(nil, &f); err == nil {
			t.Errorf("AppendMPAFrame(%+v) accepted", f.Revision)
		}
	}
}
