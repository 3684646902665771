package reliability

import (
	"errors"
	"testing"
	"time"
)

// TestRNRCountsRefusals: one refusal with a window of packets in flight
// draws an ack for each of them, all at the same cumulative point; the
// sender counts the refusal once and waits, and the receiver reports it
// once. With RNRRetries 7 and 8 packets in flight, a receiver that
// becomes ready after a few refusals gets every packet, and one that
// never does fails the sender after exactly RNRRetries+1 refusals.
func TestRNRCountsRefusals(t *testing.T) {
	for _, tc := range []struct {
		name       string
		readyAfter int // refusals before the consumer is ready; -1: never
	}{{"ready after 3 refusals", 3}, {"never ready", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{RNRRetries: 7, RNRDelay: time.Millisecond}
			s := NewSender[int](cfg)
			r := NewReceiver[int](cfg, nil)
			now := time.Unix(1000, 0)
			var got []int
			refusals := 0
			deliver := func(_ uint32, v int) bool {
				if tc.readyAfter < 0 || refusals < tc.readyAfter {
					refusals++
					return false
				}
				got = append(got, v)
				return true
			}
			var wire []uint32 // packets on the way to the receiver
			resend := func(seq uint32, _ *int) { wire = append(wire, seq) }
			const n = 8
			for i := range n {
				wire = append(wire, s.Push(i, 1200, now))
			}
			var a AckBlock
			var err error
			rnrAcks := 0
			for round := 0; err == nil && len(got) < n && round < 1000; round++ {
				// Deliver what is on the wire; every arrival draws an ack,
				// and the sender takes them all at once.
				type ack struct {
					a   AckBlock
					rnr bool
				}
				var acks []ack
				for _, seq := range wire {
					r.Receive(seq, int(seq), now, deliver)
					rnr := r.Ack(&a, now)
					acks = append(acks, ack{a, rnr})
				}
				wire = wire[:0]
				for i := range acks {
					if acks[i].rnr {
						rnrAcks++
					}
					acks[i].a.Ranges = append([]Range(nil), acks[i].a.Ranges...)
					if err = s.OnAck(&acks[i].a, r.Window(), acks[i].rnr, now, func(uint32, *int) {}, resend); err != nil {
						break
					}
				}
				if err != nil {
					break
				}
				if d := s.Deadline(); !d.IsZero() {
					now = d
					err = s.OnTimer(now, resend)
				}
			}
			if tc.readyAfter >= 0 {
				if err != nil || len(got) != n {
					t.Fatalf("after %d refusals (%d RNR acks): delivered %d of %d, error %v", refusals, rnrAcks, len(got), n, err)
				}
				for i, v := range got {
					if v != i {
						t.Fatalf("delivered %v", got)
					}
				}
				if rnrAcks != tc.readyAfter {
					t.Fatalf("%d acks said receiver-not-ready for %d refusals", rnrAcks, tc.readyAfter)
				}
				return
			}
			if !errors.Is(err, ErrRNRRetryExceeded) || refusals != cfg.RNRRetries+1 {
				t.Fatalf("a receiver never ready: error %v after %d refusals, want %v after %d", err, refusals, ErrRNRRetryExceeded, cfg.RNRRetries+1)
			}
		})
	}
}
