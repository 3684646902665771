package reliability

import (
	"testing"
	"time"
)

// TestSenderCompact: a sender has no ring until its first packet, lets go
// of it when asked with nothing in flight (not before), and numbers on
// from where it was when it makes one again; acks, old and new, find it
// without a ring as with one.
func TestSenderCompact(t *testing.T) {
	s := NewSender[int](Config{FirstSeq: 1<<32 - 2})
	if s.Slots() != 0 {
		t.Fatalf("a new sender has %d slots", s.Slots())
	}
	now := time.Now()
	ack := func(cum uint32) error {
		return s.OnAck(&AckBlock{Cumulative: cum}, 64, false, now, func(uint32, *int) {}, func(uint32, *int) {})
	}
	if err := ack(1<<32 - 2); err != nil || s.Compact() {
		t.Fatalf("an ack with nothing sent: %v; Compact of no ring: true", err)
	}
	for i := range 3 {
		s.Push(i, 1200, now)
	}
	if s.Slots() != initialRing || s.Compact() {
		t.Fatalf("%d slots with 3 in flight, or Compact let them go", s.Slots())
	}
	if err := ack(1); err != nil || s.InFlight() != 0 { // across the wrap
		t.Fatalf("ack: %v, %d in flight", err, s.InFlight())
	}
	if !s.Compact() || s.Slots() != 0 || s.Deadline() != (time.Time{}) {
		t.Fatal("Compact kept the ring, or a timer")
	}
	if err := ack(1); err != nil { // the same ack again, no ring
		t.Fatal(err)
	}
	if seq := s.Push(7, 1200, now); seq != 1 || s.Slots() != initialRing {
		t.Fatalf("after Compact: seq %d, %d slots", seq, s.Slots())
	}
	var got []int
	if err := s.OnAck(&AckBlock{Cumulative: 2}, 64, false, now, func(_ uint32, p *int) { got = append(got, *p) }, nil); err != nil || len(got) != 1 || got[0] != 7 {
		t.Fatalf("ack after Compact: %v %v", err, got)
	}
}

// TestReceiverCompact: a receiver has no ring while packets come in
// order, makes one for a packet ahead of a gap, keeps it while it holds
// anything, lets go of it when asked once nothing is held (a ring grown
// to the window would stay so), and buffers again after.
func TestReceiverCompact(t *testing.T) {
	r := NewReceiver[int](Config{Window: 64}, nil)
	now := time.Now()
	var got []uint32
	deliver := func(seq uint32, _ int) bool { got = append(got, seq); return true }
	r.Receive(0, 0, now, deliver)
	if r.Slots() != 0 || r.Compact() {
		t.Fatalf("%d slots after a packet in order", r.Slots())
	}
	var a AckBlock
	r.Ack(&a, now)
	for seq := uint32(63); seq > 1; seq-- { // ahead of the gap at 1
		r.Receive(seq, int(seq), now, deliver)
	}
	r.Ack(&a, now)
	if r.Slots() != 64 || r.Held() != 62 || r.Compact() || len(a.Ranges) != 1 || a.Ranges[0] != (Range{Start: 2, Len: 62}) {
		t.Fatalf("%d slots, %d held, ranges %v", r.Slots(), r.Held(), a.Ranges)
	}
	r.Receive(1, 1, now, deliver)
	if r.Held() != 0 || len(got) != 64 || !r.Compact() || r.Slots() != 0 {
		t.Fatalf("%d held, %d delivered, %d slots", r.Held(), len(got), r.Slots())
	}
	r.Ack(&a, now)
	r.Receive(66, 66, now, deliver)
	r.Receive(65, 65, now, deliver)
	r.Receive(64, 64, now, deliver)
	if r.Held() != 0 || len(got) != 67 || got[66] != 66 || r.Slots() != initialRing {
		t.Fatalf("after Compact: %d held, delivered %v, %d slots", r.Held(), got[64:], r.Slots())
	}
}
