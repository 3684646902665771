package qp

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/udiwarp/udiwarp/reliability"
)

// Shared receive queues and seed 004's receive queue provisioning: one
// pool of receives for many QPs, with local limits per QP (soft and
// hard), per source address inside a datagram QP, a total limit, an
// out-of-order threshold and hole limit for RD, reservations recouped
// from idle QPs, size classes, a low watermark, and a scoreboard that
// names the QPs and peers holding the receives. docs/verbs.md ("Shared
// receive queues") maps each of the seed's concepts to this API.

// SRQClass is one size class of a shared receive queue.
type SRQClass struct {
	Size  int // the class's receives hold at least Size bytes
	Depth int // at most Depth of them posted at once
}

// SRQAttr are the creation attributes of a shared receive queue
// (ibv_srq_init_attr).
type SRQAttr struct {
	// Depth is how many receives may be posted at once (one class of any
	// size); with Classes it is their depths' sum, or 0.
	Depth  int
	MaxSGE int
	// Classes, ascending by Size, make a size-classed SRQ: a receive goes
	// into the largest class whose Size its SGL's room reaches (less than
	// the first class's Size is refused), and a message of n bytes takes
	// the smallest receive that holds it, as far as the classes tell: the
	// front of the class below n when its room reaches n, else a receive
	// of the smallest class of at least n bytes that has one. A message
	// of unknown length (an RC Send of several FPDUs) takes one of the
	// largest class that has one. Without Classes a message takes the
	// receive posted first, as a plain SRQ does.
	Classes []SRQClass
	// MaxHeld is the total limit: how many receives the SRQ's QPs may
	// hold together (taken, not yet polled from a CQ); 0 is none. It can
	// be changed with Modify.
	MaxHeld int
	// Recoup is how long a QP with a reservation (SRQLimits.Reserve) may
	// take nothing before its reservation goes back to the pool, the
	// moment another QP needs it (default 1 s).
	Recoup time.Duration
}

const (
	maxSRQDepth     = 1 << 20
	maxSRQClasses   = 16
	defaultSRQIdle  = time.Second
	srqPeerMapStart = 16
)

// SRQ is a shared receive queue: one pool of receives for many QPs
// (ibv_srq), with the limits of seed 004 (see SRQAttr and SRQLimits).
type SRQ struct {
	pd     *PD
	maxSGE int
	sizes  []int // the classes' sizes, ascending; nil: one class of any size

	mu       sync.Mutex
	classes  []ring[recvWQE]
	posted   int // receives posted across the classes
	capacity int
	limit    int   // armed watermark; 0 when disarmed
	reserved int   // receives set aside for QPs under their reservation (their srqAcct.counted)
	resv     []*QP // QPs with a reservation
	recoup   time.Duration

	held      atomic.Int32 // receives its QPs hold: taken, not yet polled
	maxHeld   atomic.Int32
	totalOver atomic.Bool // AsyncSRQTotalLimit raised, until back under

	qpMu sync.Mutex
	qps  []*QP // the QPs it serves, for the scoreboard
}

// CreateSRQ makes a shared receive queue holding depth receives of up to
// maxSGE SGEs each.
func (pd *PD) CreateSRQ(depth, maxSGE int) (*SRQ, error) {
	return pd.CreateSRQEx(SRQAttr{Depth: depth, MaxSGE: maxSGE})
}

// CreateSRQEx makes a shared receive queue with size classes, a total
// limit or a recoup time (ibv_create_srq_ex).
func (pd *PD) CreateSRQEx(attr SRQAttr) (*SRQ, error) {
	if attr.MaxSGE <= 0 || attr.MaxSGE > maxSGE || attr.MaxHeld < 0 || attr.MaxHeld > maxSRQDepth || attr.Recoup < 0 {
		return nil, fmt.Errorf("%w: SRQ with %d SGEs, total limit %d, recoup %v", ErrInvalidAttr, attr.MaxSGE, attr.MaxHeld, attr.Recoup)
	}
	s := &SRQ{pd: pd, maxSGE: attr.MaxSGE, recoup: attr.Recoup}
	if s.recoup == 0 {
		s.recoup = defaultSRQIdle
	}
	if len(attr.Classes) == 0 {
		if attr.Depth <= 0 || attr.Depth > maxSRQDepth {
			return nil, fmt.Errorf("%w: SRQ of %d receives, want 1..%d", ErrInvalidAttr, attr.Depth, maxSRQDepth)
		}
		s.classes = []ring[recvWQE]{newRing[recvWQE](attr.Depth)}
		s.capacity = attr.Depth
	} else {
		if len(attr.Classes) > maxSRQClasses {
			return nil, fmt.Errorf("%w: %d SRQ size classes, at most %d", ErrInvalidAttr, len(attr.Classes), maxSRQClasses)
		}
		for i, c := range attr.Classes {
			if c.Size <= 0 || c.Depth <= 0 || (i > 0 && c.Size <= attr.Classes[i-1].Size) {
				return nil, fmt.Errorf("%w: SRQ class %d (%d bytes, %d deep): sizes must ascend, depths be positive", ErrInvalidAttr, i, c.Size, c.Depth)
			}
			s.capacity += c.Depth
		}
		if s.capacity > maxSRQDepth || (attr.Depth != 0 && attr.Depth != s.capacity) {
			return nil, fmt.Errorf("%w: SRQ of %d receives in classes of %d in all", ErrInvalidAttr, attr.Depth, s.capacity)
		}
		for _, c := range attr.Classes {
			s.sizes = append(s.sizes, c.Size)
			s.classes = append(s.classes, newRing[recvWQE](c.Depth))
		}
	}
	s.maxHeld.Store(int32(attr.MaxHeld))
	d := pd.dev
	d.srqMu.Lock()
	d.srqs = append(d.srqs, weak.Make(s))
	d.srqMu.Unlock()
	return s, nil
}

// PostRecv posts a receive to the SRQ; on a size-classed SRQ it goes into
// the largest class its room reaches.
func (s *SRQ) PostRecv(wr *RecvWR) error {
	if len(wr.SGL) > s.maxSGE {
		return fmt.Errorf("%w: %d SGEs, the SRQ takes %d", ErrInvalidWR, len(wr.SGL), s.maxSGE)
	}
	c := 0
	if s.sizes != nil {
		room := sglLen(wr.SGL)
		c = -1
		for i, size := range s.sizes {
			if room >= uint64(size) {
				c = i
			}
		}
		if c < 0 {
			return fmt.Errorf("%w: a receive of %d bytes, the SRQ's smallest class is %d", ErrInvalidWR, room, s.sizes[0])
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &s.classes[c]
	if r.full() {
		return fmt.Errorf("%w: %d receives posted to the SRQ's class %d", ErrQueueFull, r.len(), c)
	}
	w := r.push()
	w.id = wr.ID
	w.nsge = copy(w.sge[:], wr.SGL)
	s.posted++
	return nil
}

// Arm sets the low watermark: when fewer than limit receives remain, one
// AsyncSRQLimit event fires and the watermark disarms (ibv_modify_srq's
// srq_limit).
func (s *SRQ) Arm(limit int) error {
	if limit <= 0 || limit > s.capacity {
		return fmt.Errorf("%w: SRQ limit %d, want 1..%d", ErrInvalidAttr, limit, s.capacity)
	}
	return s.Modify(SRQModify{Mask: SRQModifyWatermark, Watermark: limit})
}

// SRQModifyMask says which fields of SRQModify to apply.
type SRQModifyMask uint8

const (
	SRQModifyWatermark SRQModifyMask = 1 << iota // arm the low watermark (0 disarms)
	SRQModifyMaxHeld                             // change the total limit (0: none)
	SRQModifyRecoup                              // change the recoup time (0: the default)
)

// SRQModify changes an SRQ at run time (ibv_modify_srq).
type SRQModify struct {
	Mask      SRQModifyMask
	Watermark int
	MaxHeld   int
	Recoup    time.Duration
}

// Modify applies the fields m.Mask names: all of them, or none when one
// is out of range.
func (s *SRQ) Modify(m SRQModify) error {
	if m.Mask&SRQModifyWatermark != 0 && (m.Watermark < 0 || m.Watermark > s.capacity) {
		return fmt.Errorf("%w: SRQ watermark %d, want 0..%d", ErrInvalidAttr, m.Watermark, s.capacity)
	}
	if m.Mask&SRQModifyMaxHeld != 0 && (m.MaxHeld < 0 || m.MaxHeld > maxSRQDepth) {
		return fmt.Errorf("%w: SRQ total limit %d", ErrInvalidAttr, m.MaxHeld)
	}
	if m.Mask&SRQModifyRecoup != 0 && m.Recoup < 0 {
		return fmt.Errorf("%w: SRQ recoup time %v", ErrInvalidAttr, m.Recoup)
	}
	if m.Mask&^(SRQModifyWatermark|SRQModifyMaxHeld|SRQModifyRecoup) != 0 {
		return fmt.Errorf("%w: SRQ modify mask %#x", ErrInvalidAttr, m.Mask)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.Mask&SRQModifyWatermark != 0 {
		s.limit = m.Watermark
	}
	if m.Mask&SRQModifyRecoup != 0 {
		s.recoup = cmp.Or(m.Recoup, defaultSRQIdle)
	}
	if m.Mask&SRQModifyMaxHeld != 0 {
		s.maxHeld.Store(int32(m.MaxHeld))
		if under(s.held.Load(), int32(m.MaxHeld)) {
			s.totalOver.Store(false)
		}
	}
	return nil
}

// Len returns the number of receives posted and not yet taken.
func (s *SRQ) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.posted
}

// ClassLen returns the receives posted to size class i and not yet taken.
func (s *SRQ) ClassLen(i int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i < 0 || i >= len(s.classes) {
		return 0
	}
	return s.classes[i].len()
}

// Held returns how many receives the SRQ's QPs hold: taken by a message
// and not yet polled from a CQ.
func (s *SRQ) Held() int { return int(s.held.Load()) }

// level returns what the SRQ holds posted and could hold (Device.Levels).
func (s *SRQ) level() (posted, capacity, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.posted, s.capacity, int(s.held.Load())
}

// classFor returns the class a message of n bytes takes from, or -1
// when none has a receive for it. Classes go by their sizes: the smallest
// class of at least n bytes that has a receive — unless the receive at
// the front of the class below holds n bytes (its room is between the
// classes' sizes), which is then the smallest that holds it. A message
// longer than every class takes the largest class's, too small or not,
// as on a plain SRQ; one of unknown length (n < 0) the largest class that
// has one. Caller holds mu.
func (s *SRQ) classFor(n int) int {
	if s.sizes == nil {
		if s.classes[0].len() == 0 {
			return -1
		}
		return 0
	}
	last := len(s.sizes) - 1
	if n < 0 {
		for i := last; i >= 0; i-- {
			if s.classes[i].len() > 0 {
				return i
			}
		}
		return -1
	}
	i, _ := slices.BinarySearch(s.sizes, n)
	if i > 0 {
		if r := &s.classes[i-1]; r.len() > 0 && sglLen(r.front().sge[:r.front().nsge]) >= uint64(n) {
			return i - 1
		}
	}
	for ; i <= last; i++ {
		if s.classes[i].len() > 0 {
			return i
		}
	}
	if n > s.sizes[last] && s.classes[last].len() > 0 {
		return last
	}
	return -1
}

// SRQLimits are a QP's limits on what it holds of its SRQ (seed 004's
// local limits), set at creation (QPAttr.SRQLimits) and at run time
// (QP.SetSRQLimits). A receive is held from the message that takes it
// until its completion is polled from the CQ (or the CQ refuses it). 0
// is no limit throughout.
type SRQLimits struct {
	// Soft: once the QP holds more than Soft receives, messages are still
	// taken and one AsyncSRQSoftLimit names the QP, until it is back at
	// Soft or under.
	Soft int
	// Hard: at Hard receives held, a message for the QP is refused —
	// dropped (UD), not acknowledged as receiver-not-ready (RD: the
	// sender sends it again), or the connection terminated ("no buffer":
	// RC has no receiver-not-ready) — counted in Stats.RxSRQOverdraft,
	// and one AsyncSRQOverdraft names the QP until it is back under.
	// QPAttr.SRQLimit when 0 at creation.
	Hard int
	// Peer (UD and RD): the receives one source address may hold of the
	// QP; a message from an address at it is refused as at Hard, counted
	// in Stats.RxSRQPeerLimit, and one AsyncSRQPeerLimit names the QP and
	// the address until it is back under. The QP counts receives per
	// address only when created with a Peer limit; SetSRQLimits can then
	// change it, 0 keeping the count without a limit.
	Peer int
	// OutOfOrder (RD): the Sends (and Immediate Data) one peer — the
	// seed's connection — may hold ahead of a gap, each a claim on a
	// receive once the gap fills; Holes (RD): the gaps one peer's held
	// frames may span. The frame that would pass either makes its peer
	// drop everything it holds ahead of its gap, and goes with it: counted
	// in Stats.RxSRQOutOfOrder, with AsyncSRQOutOfOrder naming the QP and
	// the peer. None was acknowledged, so the peer's sender sends them
	// again, and nothing completes at the sender that was not delivered.
	OutOfOrder, Holes int
	// Reserve: receives kept for the QP — other QPs leave that many posted
	// while it holds fewer — until the QP takes nothing for
	// SRQAttr.Recoup: then its reservation is recouped for the others the
	// moment one needs it (Stats.SRQRecouped), and comes back with its
	// next message. Destroy and ERROR give it back at once.
	Reserve int
}

// srqAcct is what a QP keeps of its SRQ: limits, counts, the per-address
// counts of a datagram QP, its reservation.
type srqAcct struct {
	soft, hard, peer, ooo, holes, reserve atomic.Int32
	softOver                              atomic.Bool // AsyncSRQSoftLimit raised, until back at Soft
	taken, refused, oooDropped            atomic.Uint64

	perPeer bool // counts receives per source address (fixed at creation)
	peerMu  sync.Mutex
	peers   map[netip.Addr]srqPeerHeld // addresses holding receives, none at 0

	// Under the SRQ's mu: the QP's share of SRQ.reserved, whether its
	// reservation counts (not recouped, not in ERROR), its latest take.
	counted  int
	active   bool
	lastTake int64

	// qpIdx is the QP's place in SRQ.qps, under SRQ.qpMu; -1 once it left.
	qpIdx int
}

type srqPeerHeld struct {
	held int32
	over bool // AsyncSRQPeerLimit raised, until back under
}

// checkSRQLimits is the one home of what limits a QP may have.
func checkSRQLimits(typ QPType, srq *SRQ, l SRQLimits) error {
	switch {
	case l.Soft < 0 || l.Hard < 0 || l.Peer < 0 || l.OutOfOrder < 0 || l.Holes < 0 || l.Reserve < 0:
		return fmt.Errorf("%w: negative SRQ limits %+v", ErrInvalidAttr, l)
	case max(l.Soft, l.Hard, l.Peer, l.OutOfOrder, l.Holes, l.Reserve) > maxSRQDepth:
		return fmt.Errorf("%w: SRQ limits %+v over %d", ErrInvalidAttr, l, maxSRQDepth)
	case srq == nil && l != SRQLimits{}:
		return fmt.Errorf("%w: SRQ limits %+v on a QP without an SRQ", ErrInvalidAttr, l)
	case l.Soft > 0 && l.Hard > 0 && l.Soft >= l.Hard:
		return fmt.Errorf("%w: SRQ soft limit %d not under the hard limit %d", ErrInvalidAttr, l.Soft, l.Hard)
	case l.Peer > 0 && typ == RC:
		return fmt.Errorf("%w: a per-peer SRQ limit on an RC QP (its connection is its one peer)", ErrInvalidAttr)
	case (l.OutOfOrder > 0 || l.Holes > 0) && typ != RD:
		return fmt.Errorf("%w: out-of-order SRQ limits on a %v QP (only RD holds frames out of order)", ErrInvalidAttr, typ)
	}
	return nil
}

// SetSRQLimits changes the QP's SRQ limits at run time
// (ibv_modify_qp-style). A QP already past a lowered limit is refused
// messages until its polls bring it under.
func (q *QP) SetSRQLimits(l SRQLimits) error {
	if q.srq == nil {
		return fmt.Errorf("%w: SRQ limits on a QP without an SRQ", ErrInvalidAttr)
	}
	if err := checkSRQLimits(q.typ, q.srq, l); err != nil {
		return err
	}
	a := q.srqa
	if l.Peer > 0 && !a.perPeer {
		return fmt.Errorf("%w: the QP was created without a per-peer SRQ limit, so it does not count receives per address", ErrInvalidAttr)
	}
	a.soft.Store(int32(l.Soft))
	a.hard.Store(int32(l.Hard))
	a.peer.Store(int32(l.Peer))
	a.ooo.Store(int32(l.OutOfOrder))
	a.holes.Store(int32(l.Holes))
	q.srqBackUnder(q.srqHeld.Load())
	s := q.srq
	s.mu.Lock()
	had := a.reserve.Swap(int32(l.Reserve)) > 0
	switch {
	case l.Reserve > 0 && !had:
		a.active, a.lastTake = q.State() != StateError, nanotime()
		s.resv = append(s.resv, q)
	case l.Reserve == 0 && had:
		a.active = false
		s.resv = slices.DeleteFunc(s.resv, func(p *QP) bool { return p == q })
	}
	s.reconcileLocked(q)
	s.mu.Unlock()
	return nil
}

// SRQLimits returns the QP's SRQ limits.
func (q *QP) SRQLimits() SRQLimits {
	a := q.srqa
	return SRQLimits{Soft: int(a.soft.Load()), Hard: int(a.hard.Load()), Peer: int(a.peer.Load()),
		OutOfOrder: int(a.ooo.Load()), Holes: int(a.holes.Load()), Reserve: int(a.reserve.Load())}
}

// join makes q one of the SRQ's QPs, with its initial limits.
func (s *SRQ) join(q *QP, l SRQLimits) {
	a := &srqAcct{perPeer: l.Peer > 0}
	q.srqa = a
	if a.perPeer {
		a.peers = make(map[netip.Addr]srqPeerHeld, srqPeerMapStart)
	}
	s.qpMu.Lock()
	a.qpIdx = len(s.qps)
	s.qps = append(s.qps, q)
	s.qpMu.Unlock()
	q.SetSRQLimits(l) // checked by CreateQP
}

// leave takes a destroyed QP off the SRQ; its reservation goes back.
func (s *SRQ) leave(q *QP) {
	s.mu.Lock()
	q.srqa.active = false
	q.srqa.reserve.Store(0)
	s.reconcileLocked(q)
	s.resv = slices.DeleteFunc(s.resv, func(p *QP) bool { return p == q })
	s.mu.Unlock()
	// Its place is known: a QP leaves in constant time, however many the
	// SRQ serves (the LD_PRELOAD engine's has a QP per socket, and a SIPp
	// UAC closes thousands of sockets a second).
	s.qpMu.Lock()
	if i := q.srqa.qpIdx; i >= 0 && i < len(s.qps) && s.qps[i] == q {
		last := len(s.qps) - 1
		s.qps[i] = s.qps[last]
		s.qps[i].srqa.qpIdx = i
		s.qps[last] = nil
		s.qps = s.qps[:last]
		q.srqa.qpIdx = -1
	}
	s.qpMu.Unlock()
}

// standDown gives back the reservation of a QP that went to ERROR; its
// next message (after RESET and back to RTR) takes it up again.
func (s *SRQ) standDown(q *QP) {
	s.mu.Lock()
	q.srqa.active = false
	s.reconcileLocked(q)
	s.mu.Unlock()
}

// reconcileLocked sets q's share of the reserved receives to what it is
// owed now: Reserve less what it holds, while its reservation counts.
// Caller holds mu.
func (s *SRQ) reconcileLocked(q *QP) {
	a := q.srqa
	want := 0
	if a.active {
		want = max(0, int(a.reserve.Load())-int(q.srqHeld.Load()))
	}
	s.reserved += want - a.counted
	a.counted = want
}

// mayTakeLocked reports whether q may take one of the posted receives
// without taking one set aside for another QP; when none is free it
// first recoups the reservations of QPs idle for Recoup. Caller holds mu.
func (s *SRQ) mayTakeLocked(q *QP) bool {
	if q.srqa.counted > 0 || s.posted > s.reserved {
		return true
	}
	now := nanotime()
	recouped := 0
	for _, p := range s.resv {
		if a := p.srqa; p != q && a.active && a.counted > 0 && now-a.lastTake >= int64(s.recoup) {
			a.active = false
			recouped += a.counted
			s.reconcileLocked(p)
		}
	}
	if recouped > 0 {
		q.dev.stats.SRQRecouped.Add(uint64(recouped))
	}
	return s.posted > s.reserved
}

// recvResult says whether a message found a receive, and if not why.
type recvResult uint8

const (
	recvTaken recvResult = iota
	recvNone             // nothing posted this QP may take (or the RQ is empty)
	recvHard             // the QP at its hard limit
	recvPeer             // the source address at its per-peer limit
	recvTotal            // the SRQ at its total limit
)

// take is the one home of the SRQ's admission: it takes a receive for a
// message of n bytes (n < 0: unknown) from src for q into w, or refuses
// it by the first limit it meets — the address's, the QP's hard limit,
// the SRQ's total — counting the refusal and raising its event. An empty
// SRQ (recvNone) is the caller's to count, as an empty RQ is.
func (s *SRQ) take(q *QP, w *recvWQE, n int, src netip.AddrPort) recvResult {
	a := q.srqa
	if a.perPeer {
		if r := q.takePeer(src); r != recvTaken {
			return r
		}
	}
	r := s.takeLocked(q, w, n)
	if r != recvTaken {
		if a.perPeer {
			q.releasePeer(src.Addr())
		}
		switch r {
		case recvHard:
			q.dev.stats.RxSRQOverdraft.Add(1)
			a.refused.Add(1)
			if !q.srqOverdrawn.Load() && !q.srqOverdrawn.Swap(true) {
				q.dev.raise(AsyncEvent{Type: AsyncSRQOverdraft, QP: q, SRQ: s, Source: q.offender(src)})
			}
		case recvTotal:
			q.dev.stats.RxSRQTotalLimit.Add(1)
			a.refused.Add(1)
			if !s.totalOver.Load() && !s.totalOver.Swap(true) {
				q.dev.raise(AsyncEvent{Type: AsyncSRQTotalLimit, QP: q, SRQ: s, Source: q.offender(src)})
			}
		}
		return r
	}
	a.taken.Add(1)
	if soft := a.soft.Load(); soft > 0 && q.srqHeld.Load() > soft && !a.softOver.Load() && !a.softOver.Swap(true) {
		q.dev.raise(AsyncEvent{Type: AsyncSRQSoftLimit, QP: q, SRQ: s, Source: q.offender(src)})
	}
	return recvTaken
}

// takeLocked checks the QP's hard limit, the total limit and the
// reservations, and takes the receive.
func (s *SRQ) takeLocked(q *QP, w *recvWQE, n int) recvResult {
	a := q.srqa
	s.mu.Lock()
	if hard := a.hard.Load(); hard > 0 && q.srqHeld.Load() >= hard {
		s.mu.Unlock()
		return recvHard
	}
	if mh := s.maxHeld.Load(); mh > 0 && s.held.Load() >= mh {
		s.mu.Unlock()
		return recvTotal
	}
	if s.reserved > 0 && !s.mayTakeLocked(q) {
		s.mu.Unlock()
		return recvNone
	}
	c := s.classFor(n)
	if c < 0 {
		s.mu.Unlock()
		return recvNone
	}
	r := &s.classes[c]
	*w = *r.front()
	r.pop()
	s.posted--
	q.srqHeld.Add(1)
	s.held.Add(1)
	if a.reserve.Load() > 0 {
		a.active, a.lastTake = true, nanotime()
		s.reconcileLocked(q)
	}
	fire := s.limit > 0 && s.posted < s.limit
	if fire {
		s.limit = 0
	}
	s.mu.Unlock()
	if fire {
		q.dev.raise(AsyncEvent{Type: AsyncSRQLimit, QP: q, SRQ: s})
	}
	return recvTaken
}

// takePeer counts one more receive for src's address, or refuses it at
// the per-peer limit (counted, and its event raised once per crossing).
func (q *QP) takePeer(src netip.AddrPort) recvResult {
	a := q.srqa
	addr := src.Addr()
	lim := a.peer.Load()
	a.peerMu.Lock()
	e := a.peers[addr]
	if lim > 0 && e.held >= lim {
		first := !e.over
		if first {
			e.over = true
			a.peers[addr] = e
		}
		a.peerMu.Unlock()
		q.dev.stats.RxSRQPeerLimit.Add(1)
		a.refused.Add(1)
		if first {
			q.dev.raise(AsyncEvent{Type: AsyncSRQPeerLimit, QP: q, SRQ: q.srq, Source: src})
		}
		return recvPeer
	}
	e.held++
	e.over = false // under the limit (it may have been raised)
	a.peers[addr] = e
	a.peerMu.Unlock()
	return recvTaken
}

// releasePeer counts one receive less for addr; an address holding none
// leaves the map, so it holds only addresses that hold receives (at most
// as many as the QP holds receives, whatever the number of sources).
func (q *QP) releasePeer(addr netip.Addr) {
	a := q.srqa
	lim := a.peer.Load()
	a.peerMu.Lock()
	if e, ok := a.peers[addr]; ok {
		if e.held--; e.held <= 0 {
			delete(a.peers, addr)
		} else {
			if e.over && (lim == 0 || e.held < lim) {
				e.over = false
			}
			a.peers[addr] = e
		}
	}
	a.peerMu.Unlock()
}

// releaseRecv gives back the SRQ receive a completion of q held: its
// completion was polled, or its CQ refused it. It is the one home of that
// step (CQ.Poll, CQ.push).
func (q *QP) releaseRecv(wc *WorkCompletion) {
	a := q.srqa
	s := q.srq
	var h int32
	if a.reserve.Load() > 0 {
		s.mu.Lock()
		h = q.srqHeld.Add(-1)
		s.reconcileLocked(q)
		s.mu.Unlock()
	} else {
		h = q.srqHeld.Add(-1)
	}
	if t := s.held.Add(-1); s.totalOver.Load() && under(t, s.maxHeld.Load()) {
		s.totalOver.Store(false)
	}
	if a.perPeer {
		q.releasePeer(wc.Source.Addr())
	}
	q.srqBackUnder(h)
}

// srqBackUnder ends the crossings q is no longer in, holding h receives,
// so that the next raises its event again.
func (q *QP) srqBackUnder(h int32) {
	a := q.srqa
	if q.srqOverdrawn.Load() && under(h, a.hard.Load()) {
		q.srqOverdrawn.Store(false)
	}
	if a.softOver.Load() && under(h-1, a.soft.Load()) {
		a.softOver.Store(false)
	}
}

// under reports whether n is under limit lim (0: no limit).
func under(n, lim int32) bool { return lim == 0 || n < lim }

// offender names the peer an event about q's SRQ use should: the address
// holding the most of q's receives when q counts per address (src itself
// when that is src's), else src.
func (q *QP) offender(src netip.AddrPort) netip.AddrPort {
	a := q.srqa
	if !a.perPeer {
		return src
	}
	a.peerMu.Lock()
	top, most := src.Addr(), a.peers[src.Addr()].held
	for addr, e := range a.peers {
		if e.held > most {
			top, most = addr, e.held
		}
	}
	a.peerMu.Unlock()
	if top == src.Addr() {
		return src
	}
	return netip.AddrPortFrom(top, 0)
}

// SRQScore is one QP's line of its SRQ's scoreboard.
type SRQScore struct {
	QP *QP
	// Held: receives taken and not yet polled. Reserved: of the SRQ's
	// posted receives, those set aside for the QP now.
	Held, Reserved int
	// OutOfOrder (RD): Sends its peers hold ahead of their gaps, each a
	// claim on a receive once its gap fills.
	OutOfOrder int
	// Taken counts the receives the QP ever took, Refused the messages
	// refused at its limits (hard, per-peer, total), OutOfOrderDropped
	// the frames dropped at its out-of-order limits: the difference
	// between two scoreboards is the QP's recent activity (the seed's
	// scoreboarding with aging).
	Taken, Refused, OutOfOrderDropped uint64
	// Idle: how long since its latest take, for a QP with a reservation.
	Idle time.Duration
	// Peers: the addresses holding the most of its receives (or held
	// frames), most first, for a QP that counts per address (UD and RD
	// with SRQLimits.Peer) or holds frames out of order (RD).
	Peers []SRQPeerScore
}

// SRQPeerScore is one source address's line inside a datagram QP.
type SRQPeerScore struct {
	Addr       netip.Addr
	Held       int // receives its messages took, not yet polled
	OutOfOrder int // RD: its Sends held ahead of a gap
}

// Scoreboard returns a line for each of the SRQ's QPs, the QPs holding
// the most receives first, each with up to topPeers of its addresses: for
// the handler of an SRQ event to find the offending QP and peer (seed
// 004). It locks what it reads one QP at a time, so its lines are each
// consistent but not all of one instant.
func (s *SRQ) Scoreboard(topPeers int) []SRQScore {
	s.qpMu.Lock()
	qps := slices.Clone(s.qps)
	s.qpMu.Unlock()
	out := make([]SRQScore, 0, len(qps))
	now := nanotime()
	for _, q := range qps {
		a := q.srqa
		sc := SRQScore{QP: q, Held: int(q.srqHeld.Load()), Taken: a.taken.Load(), Refused: a.refused.Load(),
			OutOfOrderDropped: a.oooDropped.Load()}
		s.mu.Lock()
		sc.Reserved = a.counted
		if a.reserve.Load() > 0 {
			sc.Idle = time.Duration(now - a.lastTake)
		}
		s.mu.Unlock()
		peers := map[netip.Addr]*SRQPeerScore{}
		line := func(addr netip.Addr) *SRQPeerScore {
			p := peers[addr]
			if p == nil {
				p = &SRQPeerScore{Addr: addr}
				peers[addr] = p
			}
			return p
		}
		if a.perPeer {
			a.peerMu.Lock()
			for addr, e := range a.peers {
				line(addr).Held = int(e.held)
			}
			a.peerMu.Unlock()
		}
		if r := q.rd; r != nil {
			r.mu.Lock()
			r.ep.EachPeer(func(pi *reliability.PeerInfo) {
				if k := pi.Claims; k > 0 {
					sc.OutOfOrder += k
					line(pi.Key.Addr.Addr()).OutOfOrder += k
				}
			})
			r.mu.Unlock()
		}
		for _, p := range peers {
			sc.Peers = append(sc.Peers, *p)
		}
		slices.SortFunc(sc.Peers, func(x, y SRQPeerScore) int {
			return cmp.Or(cmp.Compare(y.Held+y.OutOfOrder, x.Held+x.OutOfOrder), x.Addr.Compare(y.Addr))
		})
		sc.Peers = sc.Peers[:min(len(sc.Peers), max(topPeers, 0))]
		out = append(out, sc)
	}
	slices.SortStableFunc(out, func(x, y SRQScore) int {
		return cmp.Or(cmp.Compare(y.Held, x.Held), cmp.Compare(y.OutOfOrder, x.OutOfOrder))
	})
	return out
}
