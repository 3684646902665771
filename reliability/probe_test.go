package reliability

import (
	"errors"
	"testing"
	"time"
)

// TestSenderZeroWindowProbe: a peer that shuts its window with nothing in
// flight gets one probe per backed-off probe timeout, MaxRetries of them;
// opening the window ends the probing and starts the count over.
func TestSenderZeroWindowProbe(t *testing.T) {
	cfg := Config{InitialRTT: time.Millisecond, MaxRTO: 8 * time.Millisecond, MaxRetries: 3}
	s := NewSender[int](cfg)
	now := time.Unix(0, 0)
	ack := func(cum uint32, win uint16) {
		t.Helper()
		if err := s.OnAck(&AckBlock{Cumulative: cum}, win, false, now, func(uint32, *int) {}, func(uint32, *int) {}); err != nil {
			t.Fatal(err)
		}
	}
	s.Push(0, 1200, now)
	ack(1, 0) // acknowledged, window shut
	if s.CanSend(now) {
		t.Fatal("can send into a shut window")
	}
	var waits []time.Duration
	start := now
	for {
		at := s.Resume()
		if at.IsZero() || !at.After(now) {
			t.Fatalf("probe %d: resume at %v, now %v", len(waits), at, now)
		}
		if due, err := s.Probe(at.Add(-time.Nanosecond)); due || err != nil {
			t.Fatal("a probe before its time")
		}
		waits = append(waits, at.Sub(start))
		now, start = at, at
		due, err := s.Probe(now)
		if errors.Is(err, ErrRetryExceeded) {
			break
		}
		if !due || err != nil {
			t.Fatalf("probe %d: %v %v", len(waits), due, err)
		}
		seq := s.Push(0, 1200, now)
		ack(seq+1, 0) // the probe acknowledged, the window still shut
	}
	t.Logf("waits %v", waits)
	if len(waits) != cfg.MaxRetries+1 {
		t.Fatalf("%d probes, MaxRetries %d", len(waits)-1, cfg.MaxRetries)
	}
	for i := 1; i < len(waits); i++ {
		if waits[i] < waits[i-1] || waits[i] > cfg.MaxRTO {
			t.Fatalf("waits %v: not backed off up to MaxRTO", waits)
		}
	}
	// A fresh sender whose peer opens the window after one probe: the count
	// starts over.
	s = NewSender[int](cfg)
	s.Push(0, 1200, now)
	ack(1, 0)
	now = s.Resume()
	if due, _ := s.Probe(now); !due {
		t.Fatal("no probe")
	}
	ack(s.Push(0, 1200, now)+1, 4)
	if !s.CanSend(now) || !s.Resume().IsZero() {
		t.Fatal("the window opened and the sender still waits")
	}
	if due, err := s.Probe(now.Add(time.Hour)); due || err != nil {
		t.Fatal("probing an open window")
	}
}
