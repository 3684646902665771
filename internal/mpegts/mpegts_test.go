package mpegts

import (
	"bytes"
	"testing"
	"time"
)

// packet makes a TS packet with continuity counter cc, and a PCR if pcr > 0.
func packet(cc byte, pcr uint64) []byte {
	p := make([]byte, PacketSize)
	p[0], p[1], p[2], p[3] = Sync, 0x01, 0x00, 0x10|cc&0x0f
	for i := 4; i < PacketSize; i++ {
		p[i] = byte(i) // a sync byte at 71: the same in every packet
	}
	if pcr > 0 {
		p[3] |= 0x20
		p[4], p[5] = 7, 0x10
		base, ext := pcr/300, pcr%300
		p[6], p[7], p[8], p[9] = byte(base>>25), byte(base>>17), byte(base>>9), byte(base>>1)
		p[10] = byte(base&1)<<7 | 0x7e | byte(ext>>8)
		p[11] = byte(ext)
	}
	return p
}

func TestPCR(t *testing.T) {
	for _, v := range []uint64{1, 27_000_000, 300*(1<<33) - 1, 123456789} {
		got, ok := PCR(packet(0, v))
		if !ok || got != v {
			t.Fatalf("PCR %d: got %d %v", v, got, ok)
		}
	}
	if _, ok := PCR(packet(0, 0)); ok {
		t.Fatal("a packet without an adaptation field has no PCR")
	}
	short := packet(0, 5)[:100]
	if _, ok := PCR(short); ok {
		t.Fatal("a short packet")
	}
	if d := Since(27_000_000, 2*27_000_000); d != time.Second {
		t.Fatalf("one second of PCR: %v", d)
	}
	if d := Since(300*(1<<33)-27_000_000, 27_000_000); d != 2*time.Second {
		t.Fatalf("across the wrap: %v", d)
	}
}

// TestPackets: whole packets are found at their offsets; a range that
// starts or ends mid-packet loses only the packets it cuts; garbage
// between packets is skipped by resynchronising.
func TestPackets(t *testing.T) {
	var s []byte
	for i := range 10 {
		s = append(s, packet(byte(i), 0)...)
	}
	var offs []int
	if n := Packets(s, 0, 0, len(s), func(o int) { offs = append(offs, o) }); n != 10 || offs[9] != 9*PacketSize {
		t.Fatalf("whole stream: %d packets %v", n, offs)
	}
	// A range from the middle of packet 2 to the middle of packet 7:
	// packets 3..6 are whole (the payload's byte 71, a sync byte in every
	// packet, is not taken for a packet start: packets are where the
	// chunk's alignment says).
	offs = nil
	if n := Packets(s, 0, 2*PacketSize+50, 7*PacketSize+10, func(o int) { offs = append(offs, o) }); n != 4 || offs[0] != 3*PacketSize {
		t.Fatalf("cut range: %d %v", n, offs)
	}
	// Five bytes of garbage after packet 4.
	g := append(append(append([]byte(nil), s[:5*PacketSize]...), 1, 2, 3, 4, 5), s[5*PacketSize:]...)
	if n := Packets(g, 0, 0, len(g), func(int) {}); n != 10 {
		t.Fatalf("resync: %d packets", n)
	}
	if !Looks(s) || Looks([]byte("hello, this is not a transport stream at all")) || Looks(nil) {
		t.Fatal("Looks")
	}
}

func TestRTPPayload(t *testing.T) {
	ts := make([]byte, 2*PacketSize)
	ts[0], ts[PacketSize] = Sync, Sync
	hdr := []byte{0x80, 33, 0, 1, 0, 0, 0, 9, 1, 2, 3, 4} // V=2, PT 33 (MP2T)
	for _, tc := range []struct {
		name string
		d    []byte
		want []byte
		ok   bool
	}{
		{"plain", append(append([]byte(nil), hdr...), ts...), ts, true},
		{"CSRCs", append([]byte{0x82, 33, 0, 1, 0, 0, 0, 9, 1, 2, 3, 4, 5, 5, 5, 5, 6, 6, 6, 6}, ts...), ts, true},
		{"extension", append([]byte{0x90, 33, 0, 1, 0, 0, 0, 9, 1, 2, 3, 4, 0xbe, 0xde, 0, 1, 7, 7, 7, 7}, ts...), ts, true},
		{"padding", append(append(append([]byte{0xa0}, hdr[1:]...), ts...), 0, 0, 3), ts, true},
		{"raw TS is not RTP", ts, nil, false},
		{"RTP without TS", append(append([]byte(nil), hdr...), 1, 2, 3), nil, false},
		{"short", hdr[:8], nil, false},
		{"extension past the end", []byte{0x90, 33, 0, 1, 0, 0, 0, 9, 1, 2, 3, 4, 0xbe}, nil, false},
		{"padding past the header", append(append([]byte{0xa0}, hdr[1:]...), 200), nil, false},
	} {
		got, ok := RTPPayload(tc.d)
		if ok != tc.ok || !bytes.Equal(got, tc.want) {
			t.Errorf("%s: %d bytes, %v; want %d, %v", tc.name, len(got), ok, len(tc.want), tc.ok)
		}
	}
}
