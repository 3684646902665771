package reliability

import (
	"math/rand/v2"
	"testing"
	"time"
)

// holesByScan counts the gaps the buffered packets span the slow way: runs
// of missing sequence numbers from next up to the highest buffered.
func holesByScan[F any](r *Receiver[F]) int {
	if r.held == 0 {
		return 0
	}
	n, in := 0, false
	for seq := r.next; AtOrBefore(seq, r.top); seq++ {
		switch {
		case !r.has(seq) && !in:
			n, in = n+1, true
		case r.has(seq):
			in = false
		}
	}
	return n
}

// claimsByScan counts the claimed packets buffered the slow way.
func claimsByScan[F any](r *Receiver[F]) int {
	n := 0
	for seq := r.next; r.held > 0 && AtOrBefore(seq, r.top); seq++ {
		if r.has(seq) && r.claimed(seq) {
			n++
		}
	}
	return n
}

// TestHoles: the receiver's count of gaps (kept as packets arrive, fill
// gaps, drain, are refused while draining, or are reneged) is the count a
// scan finds, through random arrivals over a small window that wraps the
// ring and the sequence space; HolesWith foretells it before each packet
// is buffered. The count of claimed packets (Claim) follows them out
// likewise.
func TestHoles(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 3))
		cfg := Config{Window: 64, FirstSeq: 1<<32 - 100}
		r := NewReceiver[int](cfg, nil)
		now := time.Unix(1, 0)
		ready := true
		deliver := func(uint32, int) bool { return ready }
		for step := range 4000 {
			seq := r.Next() + uint32(rng.IntN(70))
			ready = rng.IntN(8) != 0
			want := -1
			if r.Classify(seq) == Buffered {
				want = r.HolesWith(seq)
			}
			v := r.Receive(seq, step, now, deliver)
			if v == Buffered && r.Holes() != want {
				t.Fatalf("seed %d step %d: HolesWith(%d) said %d, Holes is %d", seed, step, seq, want, r.Holes())
			}
			if v == Buffered && step%3 == 0 {
				r.Claim(seq)
				r.Claim(seq) // once is enough
			}
			if rng.IntN(200) == 0 {
				ready = true
				r.Drain(deliver)
			}
			if rng.IntN(300) == 0 {
				if n := r.Renege(); n != 0 && (r.Held() != 0 || r.AckDue(now) != now) {
					t.Fatalf("seed %d step %d: reneged %d, still holds %d, ack due %v", seed, step, n, r.Held(), r.AckDue(now))
				}
			}
			if got, scan := r.Holes(), holesByScan(r); got != scan {
				t.Fatalf("seed %d step %d (seq %d, %v): Holes %d, a scan finds %d", seed, step, seq, v, got, scan)
			}
			if got, scan := r.Claims(), claimsByScan(r); got != scan {
				t.Fatalf("seed %d step %d (seq %d, %v): Claims %d, a scan finds %d", seed, step, seq, v, got, scan)
			}
		}
	}
}

// TestRenegeRecovers: a receiver that reneges on the packets it held
// ahead of a gap loses nothing. Over a lossy, reordering link every packet
// is delivered exactly once and in order although the receiver drops all
// it holds whenever a third would be buffered (as an SRQ's out-of-order
// threshold makes an RD QP do), and the sender completes each packet only
// once it was delivered.
func TestRenegeRecovers(t *testing.T) {
	for seed := range uint64(10) {
		reneged := 0
		l := link{loss: 0.05, delay: time.Millisecond, jitter: 300 * time.Microsecond,
			receive: func(r *Receiver[int], now time.Time, seq uint32, v int, deliver func(uint32, int) bool) {
				if r.Classify(seq) == Buffered && r.Held() >= 2 {
					reneged += r.Renege()
					return
				}
				r.Receive(seq, v, now, deliver)
			}}
		res := simulate(t, seed, 300, Config{Window: 32}, l, nil)
		checkExactlyOnceInOrder(t, res, 300)
		if reneged == 0 {
			t.Fatalf("seed %d: the receiver never reneged", seed)
		}
	}
}
