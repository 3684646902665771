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

// TestSenderLateAcksWidenTimeThreshold: on a host whose receiver is late
// with its acks now and then, the time threshold (9/8 of the RTT) drew a
// retransmission for each late ack, though nothing was lost. A packet's
// ack that comes sooner after its retransmission than the minimum RTT is
// the first transmission's: the retransmission was needless, and the
// threshold widens (by a quarter of the RTT each time) until the late
// acks no longer draw any. Here every round's first packet is acked at
// 1.5 RTT: the first two rounds retransmit it, the rest do not (without
// the adaptation all ten did).
func TestSenderLateAcksWidenTimeThreshold(t *testing.T) {
	rtt := time.Millisecond
	s, now := senderWithRTT(t, rtt)
	nop := func(uint32, *int) {}
	resent := 0
	resend := func(uint32, *int) { resent++ }
	for round := range 10 {
		a := s.Push(1, 1500, now)
		b := s.Push(2, 1500, now)
		sent := now
		// b's ack on time; a's held back by the receiver.
		if err := s.OnAck(&AckBlock{Cumulative: a, Ranges: []Range{{Start: b, Len: 1}}}, 256, false, sent.Add(rtt), nop, resend); err != nil {
			t.Fatal(err)
		}
		if d := s.Deadline(); !d.IsZero() && !d.After(sent.Add(rtt*3/2)) {
			if err := s.OnTimer(d, resend); err != nil {
				t.Fatal(err)
			}
		}
		now = sent.Add(rtt * 3 / 2)
		if err := s.OnAck(&AckBlock{Cumulative: b + 1}, 256, false, now, nop, resend); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d retransmissions so far, %d shown needless", round, resent, s.Spurious)
	}
	if resent > 2 || s.Spurious != uint64(resent) {
		t.Fatalf("%d retransmissions for 10 late acks (%d shown needless), want at most 2", resent, s.Spurious)
	}
}

// TestSenderReorderingRaisesPacketThreshold: packets sent from two CPUs
// into a veth can swap places by microseconds. Each round here, the
// first of six packets arrives after the other five: with the packet
// threshold of 3 its acked successors declare it lost, and its own ack
// comes right after the retransmission, far sooner than a round trip:
// the retransmission was needless, and the threshold doubles (to 6), so
// that the rounds after it retransmit nothing (without the adaptation,
// all ten rounds did).
func TestSenderReorderingRaisesPacketThreshold(t *testing.T) {
	rtt := time.Millisecond
	s, now := senderWithRTT(t, rtt)
	nop := func(uint32, *int) {}
	resent := 0
	resend := func(uint32, *int) { resent++ }
	for range 10 {
		first := s.Push(0, 1500, now)
		for range 5 {
			s.Push(0, 1500, now)
		}
		now = now.Add(rtt)
		// The five after it arrived first.
		if err := s.OnAck(&AckBlock{Cumulative: first, Ranges: []Range{{Start: first + 1, Len: 5}}}, 256, false, now, nop, resend); err != nil {
			t.Fatal(err)
		}
		now = now.Add(20 * time.Microsecond)
		if err := s.OnAck(&AckBlock{Cumulative: first + 6}, 256, false, now, nop, resend); err != nil {
			t.Fatal(err)
		}
	}
	if resent > 1 || s.Spurious != uint64(resent) || s.thresh() != 6 {
		t.Fatalf("%d retransmissions for 10 reordered packets (%d shown needless), packet threshold %d; want at most 1, and 6",
			resent, s.Spurious, s.thresh())
	}
}

// senderWithRTT returns a sender without congestion control whose RTT
// samples so far were all rtt, and the time after the last of them.
func senderWithRTT(t *testing.T, rtt time.Duration) (*Sender[int], time.Time) {
	t.Helper()
	s := NewSender[int](Config{Congestion: CongestionNone, Window: 256})
	now := time.Unix(1, 0)
	nop := func(uint32, *int) {}
	for range 4 {
		seq := s.Push(0, 1500, now)
		now = now.Add(rtt)
		if err := s.OnAck(&AckBlock{Cumulative: seq + 1}, 256, false, now, nop, nop); err != nil {
			t.Fatal(err)
		}
	}
	return s, now
}
