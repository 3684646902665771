package reliability

import "time"

// Verdict is what a Receiver did with a packet.
type Verdict uint8

const (
	// Delivered: the packet was next in order and was delivered, with any
	// buffered packets it released.
	Delivered Verdict = iota
	// Buffered: ahead of a gap; kept until the gap fills.
	Buffered
	// Duplicate: already delivered or buffered; dropped.
	Duplicate
	// Beyond: past the window; dropped without allocating anything.
	Beyond
	// Refused: next in order, but its consumer was not ready (no receive
	// posted); dropped, and the next ack says receiver-not-ready.
	Refused
)

func (v Verdict) String() string {
	switch v {
	case Delivered:
		return "delivered"
	case Buffered:
		return "buffered"
	case Duplicate:
		return "duplicate"
	case Beyond:
		return "beyond the window"
	case Refused:
		return "refused (receiver not ready)"
	}
	return "Verdict(?)"
}

// Receiver is the receiving half of one peer's reliability: it delivers
// packets exactly once and in sequence order, buffers those that arrive
// ahead of a gap (up to the window), and builds acks. F is a buffered
// packet (the caller's copy of the frame). Not safe for concurrent use.
type Receiver[F any] struct {
	cfg    Config
	next   uint32 // the next sequence number to deliver
	ring   []F
	have   []uint64 // bit per ring slot: buffered
	claim  []uint64 // bit per ring slot: a buffered packet the caller marked (Claim)
	claims int
	mask   uint32
	held   int // packets buffered
	holes  int // runs of missing sequence numbers between next and top, while held > 0
	top    uint32
	anyTop bool
	// Renege dropped packets up to renegeTop the sender had selectively
	// acked: until next passes it, every arrival is acked at once, so the
	// sender learns of each dropped packet one round trip after the last.
	reneged   bool
	renegeTop uint32

	// Ack state: packets received since the last ack, when the first of
	// them arrived, and whether the next ack must go at once.
	unacked  int
	since    time.Time
	urgent   bool
	rnr      bool
	released func(F) // called for buffered packets dropped by Reset

	// Duplicates and BeyondWindow count dropped packets.
	Duplicates, BeyondWindow, Refusals uint64
}

// NewReceiver returns a Receiver; release, if not nil, is called for each
// buffered packet the receiver lets go of without delivering (Reset). Its
// ring is made by the first packet it buffers: packets that come in order
// need none.
func NewReceiver[F any](cfg Config, release func(F)) *Receiver[F] {
	cfg = cfg.Fill()
	return &Receiver[F]{cfg: cfg, next: cfg.FirstSeq, released: release}
}

// grow doubles the ring (or makes the first) until seq fits, keeping
// every held packet at its place by sequence.
func (r *Receiver[F]) grow(seq uint32) {
	n := len(r.ring)
	if n == 0 {
		n = min(initialRing, r.cfg.Window)
	}
	for seq-r.next >= uint32(n) {
		n *= 2
	}
	ring, have, claim := make([]F, n), make([]uint64, (n+63)/64), make([]uint64, (n+63)/64)
	mask := uint32(n - 1)
	for k := r.next; r.anyTop && AtOrBefore(k, r.top) && k-r.next < uint32(len(r.ring)); k++ {
		if r.has(k) {
			i := k & mask
			ring[i] = r.ring[k&r.mask]
			have[i/64] |= 1 << (i % 64)
			if r.claimed(k) {
				claim[i/64] |= 1 << (i % 64)
			}
		}
	}
	r.ring, r.have, r.claim, r.mask = ring, have, claim, mask
}

// Compact lets go of the ring when nothing is buffered: a ring grown by
// packets out of order stays grown otherwise, and a receiver that has
// been idle a while needs none; the next packet buffered makes one. It
// reports whether there was one.
func (r *Receiver[F]) Compact() bool {
	if r.held != 0 || r.ring == nil {
		return false
	}
	r.ring, r.have, r.claim, r.mask = nil, nil, nil, 0
	return true
}

// Slots returns the size of the ring (zero until a packet is buffered,
// and after Compact).
func (r *Receiver[F]) Slots() int { return len(r.ring) }

// Next returns the next sequence number to deliver.
func (r *Receiver[F]) Next() uint32 { return r.next }

// Held returns how many packets are buffered ahead of a gap.
func (r *Receiver[F]) Held() int { return r.held }

// Holes returns how many gaps the buffered packets span: runs of missing
// sequence numbers from Next up to the highest packet buffered.
func (r *Receiver[F]) Holes() int { return r.holes }

// HolesWith returns what Holes would be once packet seq, which Classify
// calls Buffered, is buffered.
func (r *Receiver[F]) HolesWith(seq uint32) int {
	switch {
	case r.held == 0:
		return 1 // [next, seq)
	case Before(r.top, seq):
		if seq == r.top+1 {
			return r.holes
		}
		return r.holes + 1
	}
	// Inside a gap below top: it splits it, fills it or shortens it.
	left := seq-1 != r.next && r.has(seq-1) // next itself is never buffered
	right := r.has(seq + 1)
	switch {
	case left && right:
		return r.holes - 1
	case !left && !right:
		return r.holes + 1
	}
	return r.holes
}

// Window is what the receiver advertises: packets it can take beyond
// Next.
func (r *Receiver[F]) Window() uint16 { return uint16(min(r.cfg.Window, 1<<16-1)) }

func (r *Receiver[F]) has(seq uint32) bool {
	i := seq & r.mask
	return r.have[i/64]&(1<<(i%64)) != 0
}

func (r *Receiver[F]) mark(seq uint32, on bool) {
	i := seq & r.mask
	if on {
		r.have[i/64] |= 1 << (i % 64)
		return
	}
	r.have[i/64] &^= 1 << (i % 64)
	if r.claimed(seq) {
		r.claim[i/64] &^= 1 << (i % 64)
		r.claims--
	}
}

func (r *Receiver[F]) claimed(seq uint32) bool {
	i := seq & r.mask
	return r.claim[i/64]&(1<<(i%64)) != 0
}

// Claim marks buffered packet seq as one the caller counts apart (a
// Send that will take a receive, for an RD QP): Claims counts the marked
// packets the receiver holds, until each is delivered or let go of.
func (r *Receiver[F]) Claim(seq uint32) {
	if Before(seq, r.next) || seq-r.next >= uint32(len(r.ring)) || !r.has(seq) || r.claimed(seq) {
		return
	}
	i := seq & r.mask
	r.claim[i/64] |= 1 << (i % 64)
	r.claims++
}

// Claims returns how many of the packets buffered are marked by Claim.
func (r *Receiver[F]) Claims() int { return r.claims }

// Classify says what Receive would do with seq without doing it, so the
// caller copies a frame only when it will be buffered.
func (r *Receiver[F]) Classify(seq uint32) Verdict {
	switch {
	case Before(seq, r.next):
		return Duplicate
	case seq == r.next:
		return Delivered
	case seq-r.next >= uint32(r.cfg.Window):
		return Beyond
	case seq-r.next >= uint32(len(r.ring)):
		return Buffered // beyond the ring as it is: it grows
	case r.has(seq):
		return Duplicate
	}
	return Buffered
}

// Receive takes packet seq, arrived at now. deliver hands a packet to
// the consumer in order and reports false when the consumer cannot take
// it (receiver not ready), which leaves it undelivered. f is buffered
// only when the verdict is Buffered; otherwise the caller keeps it.
func (r *Receiver[F]) Receive(seq uint32, f F, now time.Time, deliver func(seq uint32, f F) bool) Verdict {
	v := r.Classify(seq)
	switch v {
	case Duplicate:
		r.Duplicates++
		r.urgent = true // the sender has not seen our ack: repeat it
		return v
	case Beyond:
		r.BeyondWindow++
		return v
	case Buffered:
		r.holes = r.HolesWith(seq)
		if seq-r.next >= uint32(len(r.ring)) {
			r.grow(seq)
		}
		r.ring[seq&r.mask] = f
		r.mark(seq, true)
		r.held++
		if !r.anyTop || r.held == 1 || Before(r.top, seq) { // top is stale once nothing is held
			r.top, r.anyTop = seq, true
		}
		r.noteArrival(now, true)
		return v
	}
	if !deliver(seq, f) {
		r.Refusals++
		r.rnr, r.urgent = true, true
		return Refused
	}
	r.next++
	if r.held > 0 && r.has(r.next) {
		r.holes-- // the gap at the front just filled
	}
	r.rnr = false
	recovering := r.reneged && AtOrBefore(r.next, r.renegeTop)
	r.reneged = recovering
	r.noteArrival(now, r.held > 0 || recovering) // a gap just filled: say so at once
	r.drain(deliver)
	return Delivered
}

// Drain delivers buffered packets that are now in order, as after a
// receive is posted following a refusal. It reports whether any went.
func (r *Receiver[F]) Drain(deliver func(seq uint32, f F) bool) bool {
	before := r.next
	r.drain(deliver)
	return r.next != before
}

func (r *Receiver[F]) drain(deliver func(seq uint32, f F) bool) {
	var zero F
	for r.held > 0 && r.has(r.next) {
		i := r.next & r.mask
		if !deliver(r.next, r.ring[i]) {
			// Dropped like a refused packet: the sender sends it again
			// after its receiver-not-ready wait.
			if r.released != nil {
				r.released(r.ring[i])
			}
			r.ring[i] = zero
			r.mark(r.next, false)
			r.held--
			if r.held == 0 {
				r.holes = 0
			} else if r.has(r.next + 1) {
				r.holes++ // next is a gap of its own again
			}
			r.Refusals++
			r.rnr, r.urgent = true, true
			return
		}
		r.ring[i] = zero
		r.mark(r.next, false)
		r.held--
		r.next++
	}
}

func (r *Receiver[F]) noteArrival(now time.Time, urgent bool) {
	if r.unacked == 0 {
		r.since = now
	}
	r.unacked++
	if urgent || r.unacked >= 2 {
		r.urgent = true
	}
}

// Urge makes the next ack go at once (the sender asked: FlagAckNow).
func (r *Receiver[F]) Urge() { r.urgent = true }

// AckDue returns when an ack must go: now when one is urgent (a gap, a
// duplicate, a refusal, every second packet), the first unacked arrival
// plus MaxAckDelay otherwise, zero when nothing needs acking.
func (r *Receiver[F]) AckDue(now time.Time) time.Time {
	switch {
	case r.urgent:
		return now
	case r.unacked > 0:
		return r.since.Add(r.cfg.MaxAckDelay)
	}
	return time.Time{}
}

// Ack fills a with the receiver's state and resets the ack timer: the
// cumulative point, up to MaxAckRanges ranges buffered beyond it, and the
// delay since the oldest unacked arrival. It reports whether the
// receiver refused the packet at the cumulative point since the previous
// ack: each refusal is reported once, so that the acks the packets
// behind it draw (they are buffered, not refused) do not each count as
// one more refusal at the sender.
func (r *Receiver[F]) Ack(a *AckBlock, now time.Time) (rnr bool) {
	a.Cumulative = r.next
	a.Ranges = a.store[:0]
	a.Errors = a.estore[:0]
	if r.unacked > 0 {
		a.Delay = uint16(min(now.Sub(r.since)/time.Microsecond, 1<<16-1))
	} else {
		a.Delay = 0
	}
	if r.held > 0 {
		var cur Range
		in := false
		for seq := r.next + 1; AtOrBefore(seq, r.top); seq++ {
			if r.has(seq) {
				if !in {
					cur, in = Range{Start: seq}, true
				}
				cur.Len++
				continue
			}
			if in {
				a.Ranges = append(a.Ranges, cur)
				in = false
				if len(a.Ranges) == MaxAckRanges {
					break
				}
			}
		}
		if in && len(a.Ranges) < MaxAckRanges {
			a.Ranges = append(a.Ranges, cur)
		}
	}
	r.unacked, r.urgent = 0, false
	rnr = r.rnr
	r.rnr = false // reported: the acks that follow report the next refusal, if any
	return rnr
}

// Reset drops everything buffered (the peer restarted or went away).
func (r *Receiver[F]) Reset() { r.dropHeld() }

// Renege drops every packet buffered ahead of a gap and returns how many
// it dropped. The sender keeps a packet it saw selectively acked until
// the cumulative point passes it, and sends it again when an ack at that
// point shows it missing, so nothing is lost (RFC 2018 §8); until Next
// passes the packets dropped, each arrival is acked at once.
func (r *Receiver[F]) Renege() int {
	n := r.dropHeld()
	if n > 0 {
		r.reneged, r.renegeTop, r.urgent = true, r.top, true
	}
	return n
}

// dropHeld lets go of every packet buffered and returns how many.
func (r *Receiver[F]) dropHeld() int {
	var zero F
	n := r.held
	for seq := r.next; r.held > 0; seq++ {
		if r.has(seq) {
			if r.released != nil {
				r.released(r.ring[seq&r.mask])
			}
			r.ring[seq&r.mask] = zero
			r.mark(seq, false)
			r.held--
		}
	}
	r.holes = 0
	return n
}
