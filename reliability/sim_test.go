package reliability

import (
	"container/heap"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// A simulated link between one Sender and one Receiver on a virtual
// clock: every decision (loss, duplication, delay) comes from a seeded
// generator, so a failure names its seed and repeats.

type event struct {
	at    time.Time
	ack   bool
	seq   uint32
	val   int
	block AckBlock
	rnr   bool
	win   uint16
	order int
}

type events []*event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at.Equal(e[j].at) {
		return e[i].order < e[j].order
	}
	return e[i].at.Before(e[j].at)
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(*event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

type link struct {
	loss, dup, ackLoss float64
	delay, jitter      time.Duration
	gap                time.Duration            // data packets leave at least this far apart (serialization)
	spurious           uint64                   // retransmissions allowed beyond what loss needs
	blackhole          func(now time.Time) bool // drop everything while true
	// receive, if set, hands the receiver each data packet in place of
	// Receive (a receiver that also drops what it holds, say).
	receive func(r *Receiver[int], now time.Time, seq uint32, v int, deliver func(uint32, int) bool)
}

type simResult struct {
	got         []int
	retransmits uint64
	end         time.Time
	err         error
	delivered   map[int]int
}

func simulate(t *testing.T, seed uint64, n int, cfg Config, l link, ready func(now time.Time) bool) simResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed*7+1))
	start := time.Unix(1000, 0)
	now := start
	s := NewSender[int](cfg)
	r := NewReceiver[int](cfg, nil)
	q := &events{}
	order := 0
	var wire time.Time
	res := simResult{delivered: map[int]int{}}
	send := func(ev *event, lossP float64) {
		if l.blackhole != nil && l.blackhole(now) {
			return
		}
		if rng.Float64() < lossP {
			return
		}
		copies := 1
		if rng.Float64() < l.dup {
			copies = 2
		}
		for range copies {
			e := *ev
			if e.ack {
				e.block.Ranges = append([]Range(nil), ev.block.Ranges...)
			}
			e.at = now.Add(l.delay)
			if !e.ack && l.gap > 0 {
				wire = maxTime(wire.Add(l.gap), now)
				e.at = wire.Add(l.delay)
			}
			if l.jitter > 0 {
				e.at = e.at.Add(time.Duration(rng.Int64N(int64(l.jitter))))
			}
			order++
			e.order = order
			heap.Push(q, &e)
		}
	}
	resend := func(seq uint32, p *int) { send(&event{seq: seq, val: *p}, l.loss) }
	deliver := func(seq uint32, v int) bool {
		if ready != nil && !ready(now) {
			return false
		}
		res.got = append(res.got, v)
		res.delivered[v]++
		return true
	}
	sent := 0
	for steps := 0; steps < 10_000_000; steps++ {
		for sent < n && s.CanSend(now) {
			seq := s.Push(sent, 1200, now)
			send(&event{seq: seq, val: sent}, l.loss)
			sent++
		}
		if sent == n && s.InFlight() == 0 {
			res.end = now
			res.retransmits = s.Retransmits
			return res
		}
		// The next thing to happen: an arrival, the sender's timer, or an
		// ack falling due.
		next := time.Time{}
		if q.Len() > 0 {
			next = (*q)[0].at
		}
		if d := s.Deadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next = d
		}
		if d := r.AckDue(now); !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next = d
		}
		if next.IsZero() {
			res.err = errors.New("stalled: nothing in flight, nothing due")
			return res
		}
		if next.After(now) {
			now = next
		}
		for q.Len() > 0 && !(*q)[0].at.After(now) {
			e := heap.Pop(q).(*event)
			if e.ack {
				if err := s.OnAck(&e.block, e.win, e.rnr, now, func(uint32, *int) {}, resend); err != nil {
					if errors.Is(err, ErrAckUnsent) {
						res.err = err
						return res
					}
					res.err = err
					return res
				}
				continue
			}
			if l.receive != nil {
				l.receive(r, now, e.seq, e.val, deliver)
				continue
			}
			r.Receive(e.seq, e.val, now, deliver)
		}
		if d := s.Deadline(); !d.IsZero() && !now.Before(d) {
			if err := s.OnTimer(now, resend); err != nil {
				res.err = err
				res.end = now
				return res
			}
		}
		if d := r.AckDue(now); !d.IsZero() && !now.Before(d) {
			ev := &event{ack: true, win: r.Window()}
			ev.rnr = r.Ack(&ev.block, now)
			send(ev, l.ackLoss)
		}
	}
	res.err = errors.New("did not finish")
	return res
}

func checkExactlyOnceInOrder(t *testing.T, res simResult, n int) {
	t.Helper()
	if res.err != nil {
		t.Fatal(res.err)
	}
	if len(res.got) != n {
		t.Fatalf("delivered %d of %d", len(res.got), n)
	}
	for i, v := range res.got {
		if v != i {
			t.Fatalf("position %d holds %d: not in order", i, v)
		}
	}
}

func TestSimulatedFaults(t *testing.T) {
	const n = 5000
	for _, tc := range []struct {
		name string
		l    link
	}{
		{"perfect", link{delay: 20 * time.Microsecond}},
		{"loss 1%", link{loss: 0.01, ackLoss: 0.01, delay: 20 * time.Microsecond}},
		{"loss 5%", link{loss: 0.05, ackLoss: 0.05, delay: 20 * time.Microsecond}},
		{"loss 20%", link{loss: 0.2, ackLoss: 0.2, delay: 20 * time.Microsecond}},
		{"reorder depth <= 2", link{delay: 20 * time.Microsecond, gap: time.Microsecond, jitter: 2 * time.Microsecond}},
		{"reorder a whole window", link{delay: 20 * time.Microsecond, jitter: 120 * time.Microsecond, spurious: 5000}},
		{"duplicate 10%", link{dup: 0.1, delay: 20 * time.Microsecond}},
		{"everything", link{loss: 0.05, ackLoss: 0.05, dup: 0.05, delay: 20 * time.Microsecond, gap: time.Microsecond, jitter: 60 * time.Microsecond, spurious: 5000}},
	} {
		for seed := uint64(1); seed <= 3; seed++ {
			res := simulate(t, seed, n, Config{}, tc.l, nil)
			checkExactlyOnceInOrder(t, res, n)
			if tc.name == "perfect" && res.retransmits != 0 {
				t.Fatalf("%s: %d retransmissions on a perfect link", tc.name, res.retransmits)
			}
			// Accounting: retransmissions stay near what the loss needs.
			if bound := uint64(float64(n)*tc.l.loss*3) + 50 + tc.l.spurious; res.retransmits > bound {
				t.Errorf("%s seed %d: %d retransmissions, want at most %d", tc.name, seed, res.retransmits, bound)
			}
			if seed == 1 {
				t.Logf("%-24s %d packets in %v, %d retransmissions", tc.name, n, res.end.Sub(time.Unix(1000, 0)), res.retransmits)
			}
		}
	}
}

func TestSimulatedWrap(t *testing.T) {
	res := simulate(t, 9, 3000, Config{FirstSeq: 1<<32 - 1000, Window: 64}, link{loss: 0.05, ackLoss: 0.05, delay: 10 * time.Microsecond, jitter: 20 * time.Microsecond}, nil)
	checkExactlyOnceInOrder(t, res, 3000)
}

// A link that goes dark for good: the sender retries with exponential
// backoff up to the cap and gives up after MaxRetries, within the time
// the schedule predicts.
func TestBlackholeRetryLimit(t *testing.T) {
	cfg := Config{MaxRetries: 6, MaxRTO: 100 * time.Millisecond, InitialRTT: time.Millisecond}
	start := time.Unix(1000, 0)
	res := simulate(t, 1, 100, cfg, link{delay: 50 * time.Microsecond, blackhole: func(time.Time) bool { return true }}, nil)
	if !errors.Is(res.err, ErrRetryExceeded) {
		t.Fatalf("error %v, want %v", res.err, ErrRetryExceeded)
	}
	// Bound: the PTO before backoff is at most InitialRTT + 4·(InitialRTT/2)
	// + MaxAckDelay + granularity; the retries double it, capped.
	var bound time.Duration
	pto := 5 * time.Millisecond
	for i := range cfg.MaxRetries + 1 {
		bound += min(pto<<i, cfg.MaxRTO)
	}
	if took := res.end.Sub(start); took > bound+10*time.Millisecond {
		t.Fatalf("gave up after %v, bound %v", took, bound)
	}
	t.Logf("gave up after %v (bound %v)", res.end.Sub(start), bound)
}

// A partition shorter than the retry budget heals without loss.
func TestPartitionHeals(t *testing.T) {
	start := time.Unix(1000, 0)
	dark := func(now time.Time) bool {
		d := now.Sub(start)
		return d > time.Millisecond && d < 40*time.Millisecond
	}
	res := simulate(t, 2, 2000, Config{}, link{delay: 20 * time.Microsecond, blackhole: dark}, nil)
	checkExactlyOnceInOrder(t, res, 2000)
}

// A consumer with no receives posted for a while: the receiver refuses,
// the sender waits and tries again; nothing is lost or duplicated.
func TestReceiverNotReady(t *testing.T) {
	start := time.Unix(1000, 0)
	ready := func(now time.Time) bool {
		d := now.Sub(start)
		return d < 500*time.Microsecond || d > 20*time.Millisecond
	}
	res := simulate(t, 3, 500, Config{RNRDelay: 2 * time.Millisecond}, link{delay: 20 * time.Microsecond}, ready)
	checkExactlyOnceInOrder(t, res, 500)

	never := func(time.Time) bool { return false }
	res = simulate(t, 3, 10, Config{RNRDelay: time.Millisecond, RNRRetries: 3}, link{delay: 20 * time.Microsecond}, never)
	if !errors.Is(res.err, ErrRNRRetryExceeded) {
		t.Fatalf("error %v, want %v", res.err, ErrRNRRetryExceeded)
	}
}

func TestReceiverWindow(t *testing.T) {
	r := NewReceiver[int](Config{Window: 64}, nil)
	now := time.Unix(1, 0)
	none := func(uint32, int) bool { t.Fatal("delivered"); return false }
	if v := r.Receive(1<<30, 0, now, none); v != Beyond {
		t.Fatalf("far ahead: %v", v)
	}
	if v := r.Receive(64, 0, now, none); v != Beyond {
		t.Fatalf("one past the window: %v", v)
	}
	if v := r.Receive(63, 0, now, none); v != Buffered {
		t.Fatalf("last in the window: %v", v)
	}
	if v := r.Receive(63, 0, now, none); v != Duplicate {
		t.Fatalf("again: %v", v)
	}
	var a AckBlock
	r.Ack(&a, now)
	if a.Cumulative != 0 || len(a.Ranges) != 1 || a.Ranges[0] != (Range{63, 1}) {
		t.Fatalf("ack %+v", a)
	}
	allocs := testing.AllocsPerRun(100, func() { r.Receive(1<<30, 0, now, none) })
	if allocs != 0 {
		t.Fatalf("%v allocations for a packet beyond the window", allocs)
	}
}

func TestSenderRejectsBadAcks(t *testing.T) {
	s := NewSender[int](Config{})
	now := time.Unix(1, 0)
	for i := range 10 {
		s.Push(i, 1200, now)
	}
	nop := func(uint32, *int) {}
	for _, a := range []AckBlock{
		{Cumulative: 11}, // beyond what was sent
		{Cumulative: 2, Ranges: []Range{{20, 1}}},      // a range of unsent packets
		{Cumulative: 1 << 31, Ranges: []Range{{1, 1}}}, // far away
	} {
		if err := s.OnAck(&a, 256, false, now, func(uint32, *int) { t.Fatal("acked") }, nop); !errors.Is(err, ErrAckUnsent) {
			t.Fatalf("ack %+v: %v", a, err)
		}
	}
	if s.InFlight() != 10 {
		t.Fatalf("in flight %d after bad acks", s.InFlight())
	}
	acked := 0
	if err := s.OnAck(&AckBlock{Cumulative: 5, Ranges: []Range{{7, 2}}}, 256, false, now.Add(time.Millisecond), func(uint32, *int) { acked++ }, nop); err != nil {
		t.Fatal(err)
	}
	// 7 and 8 are only selectively acked: acknowledged when the
	// cumulative point passes them.
	if acked != 5 || s.InFlight() != 5 {
		t.Fatalf("acked %d, in flight %d", acked, s.InFlight())
	}
	if err := s.OnAck(&AckBlock{Cumulative: 9}, 256, false, now.Add(2*time.Millisecond), func(uint32, *int) { acked++ }, nop); err != nil {
		t.Fatal(err)
	}
	if acked != 9 || s.InFlight() != 1 {
		t.Fatalf("acked %d, in flight %d", acked, s.InFlight())
	}
}

// A receiver that refuses a packet it had selectively acked (it buffered
// it behind a gap, then had no receive for it) drops it: the sender sends
// it again after the receiver-not-ready wait, and acknowledges it only
// when the cumulative point passes it, so nothing is lost or reported
// done early.
func TestSenderSackReneged(t *testing.T) {
	s := NewSender[int](Config{})
	now := time.Unix(1, 0)
	for i := range 4 {
		s.Push(i, 1200, now)
	}
	var acked, resent []uint32
	ack := func(seq uint32, _ *int) { acked = append(acked, seq) }
	resend := func(seq uint32, _ *int) { resent = append(resent, seq) }
	// 0 delivered, 1 refused (not buffered), 2 and 3 buffered and SACKed.
	if err := s.OnAck(&AckBlock{Cumulative: 1, Ranges: []Range{{2, 2}}}, 256, true, now, ack, resend); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(acked, []uint32{0}) {
		t.Fatalf("acked %v", acked)
	}
	// The wait over, 1 goes again; it is delivered, 2 too, 3 is refused
	// and dropped: the ack's cumulative point is 3, with RNR.
	now = now.Add(time.Second)
	if err := s.OnTimer(now, resend); err != nil {
		t.Fatal(err)
	}
	if err := s.OnAck(&AckBlock{Cumulative: 3}, 256, true, now, ack, resend); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(acked, []uint32{0, 1, 2}) || s.InFlight() != 1 {
		t.Fatalf("acked %v, in flight %d", acked, s.InFlight())
	}
	now = now.Add(time.Second)
	if err := s.OnTimer(now, resend); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resent, []uint32{1, 3}) {
		t.Fatalf("resent %v: the dropped packet 3 was not sent again", resent)
	}
	if err := s.OnAck(&AckBlock{Cumulative: 4}, 256, false, now, ack, resend); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(acked, []uint32{0, 1, 2, 3}) || s.InFlight() != 0 || !s.Deadline().IsZero() {
		t.Fatalf("acked %v, in flight %d", acked, s.InFlight())
	}
}

func TestSerial(t *testing.T) {
	for _, c := range []struct {
		a, b uint32
		want bool
	}{{1, 2, true}, {2, 1, false}, {1<<32 - 1, 0, true}, {0, 1<<32 - 1, false}, {5, 5, false}, {0, 1<<31 - 1, true}} {
		if got := Before(c.a, c.b); got != c.want {
			t.Errorf("Before(%d, %d) = %v", c.a, c.b, got)
		}
		if c.a != c.b && Before(c.a, c.b) == Before(c.b, c.a) {
			t.Errorf("Before not antisymmetric for %d, %d", c.a, c.b)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
