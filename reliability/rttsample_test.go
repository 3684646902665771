package reliability

import (
	"testing"
	"time"
)

// TestSenderRTTSampleAfterTruncatedAck: a receiver reports only its
// lowest MaxAckRanges ranges, so packets above them can arrive and go
// unreported for as long as holes stay open below. When the holes fill,
// the ack that finally covers them says nothing of the path's RTT: they
// arrived long before. The sender must not take an RTT sample from them
// (it did: 50 ms here on a path of 1 ms, and the loss delay, 9/8 of the
// RTT, grew with it, so that a flow with many losses in a deep queue
// found each next loss later and stalled).
func TestSenderRTTSampleAfterTruncatedAck(t *testing.T) {
	t0 := time.Unix(1, 0)
	s := NewSender[int](Config{Congestion: CongestionNone, Window: 256})
	for i := 0; i < 60; i++ {
		s.Push(i, 1500, t0)
	}
	nop := func(uint32, *int) {}
	// Odd packets 1 to 31 reported, in 16 ranges: the limit. 33 to 59
	// arrived too, unreported.
	a := &AckBlock{Cumulative: 0}
	for i := uint32(0); i < MaxAckRanges; i++ {
		a.Ranges = append(a.Ranges, Range{Start: 2*i + 1, Len: 1})
	}
	if err := s.OnAck(a, 256, false, t0.Add(time.Millisecond), nop, nop); err != nil {
		t.Fatal(err)
	}
	if got := s.RTT().Latest(); got != time.Millisecond {
		t.Fatalf("first RTT sample %v, want 1ms", got)
	}
	// The holes are filled by retransmissions; everything is delivered.
	later := t0.Add(50 * time.Millisecond)
	if err := s.OnAck(&AckBlock{Cumulative: 60}, 256, false, later, nop, nop); err != nil {
		t.Fatal(err)
	}
	if got := s.RTT().Latest(); got != time.Millisecond {
		t.Errorf("RTT sample %v from packets a truncated ack left unreported, want none (latest still 1ms)", got)
	}
	// A packet sent after the truncated ack samples again.
	s.Push(60, 1500, later)
	if err := s.OnAck(&AckBlock{Cumulative: 61}, 256, false, later.Add(2*time.Millisecond), nop, nop); err != nil {
		t.Fatal(err)
	}
	if got := s.RTT().Latest(); got != 2*time.Millisecond {
		t.Errorf("RTT sample %v from a packet sent after the truncated ack, want 2ms", got)
	}
}
