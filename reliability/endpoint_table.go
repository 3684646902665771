package reliability

import (
	"fmt"
	"net/netip"
	"time"
)

// An Endpoint's peer table. Nothing a frame, a post or a timer run does
// may cost time in proportion to the peers it holds, so besides the
// peers by key it keeps:
//
//   - per source address, a count and a list of its peers
//     (MaxPeersPerAddr bounds a walk of it);
//   - a min-heap of the peers with timed work (retransmission, ack,
//     probe, Hello, pacing, idle reclaim) by when it is due;
//   - the reclaimable candidates, quiet peers (nothing of ours
//     outstanding to them), in two lists in the order they were last
//     touched: those that hold nothing, and those that hold frames
//     ahead of a gap; a first contact over the cap takes a head;
//   - the peers the call under way touched: they take their places in
//     the heap and the lists at the next settle (Deadline, Tick), so a
//     call costs the peers it touched, not the table;
//   - the peers a full socket held up (Writable).

type table[M, P any] struct {
	peers      map[PeerKey]*peer[M, P]
	perAddr    map[netip.Addr]addrPeers[M, P]
	tm         []*peer[M, P] // min-heap by tmAt
	base       time.Time     // tmAt counts from it
	haveBase   bool
	free       plist[M, P] // quiet, holding nothing
	holding    plist[M, P] // quiet, holding frames ahead of a gap
	dirty      []*peer[M, P]
	due        []*peer[M, P]
	writable   []*peer[M, P]
	writableAt int
	ids        uint64
}

type addrPeers[M, P any] struct {
	n    int
	head *peer[M, P]
}

type plist[M, P any] struct{ head, tail *peer[M, P] }

const (
	noList = iota
	freeList
	holdingList
)

// slots are a peer's places in its endpoint's table.
type slots[M, P any] struct {
	id                 uint64 // order of creation
	tmAt               int64  // when its timed work is due, in ns after table.base
	tmIdx              int32  // 1 + its index in the heap; 0: none
	list               uint8
	listed             bool // in the table (forget clears it)
	dirty              bool
	waiting            bool // in table.writable
	lprev, lnext       *peer[M, P]
	addrPrev, addrNext *peer[M, P]
}

func (t *table[M, P]) init() {
	t.peers, t.perAddr = map[PeerKey]*peer[M, P]{}, map[netip.Addr]addrPeers[M, P]{}
}

func (t *table[M, P]) touch(p *peer[M, P]) {
	if !p.dirty && p.listed {
		p.dirty = true
		t.dirty = append(t.dirty, p)
	}
}

func (e *Endpoint[M, P]) newPeer(k PeerKey, now time.Time) *peer[M, P] {
	if !e.haveBase {
		e.base, e.haveBase = now, true
	}
	p := &peer[M, P]{key: k, last: now, moved: now, epoch: newEpochFrom(e.rand)}
	p.pub.Key = k
	e.ids++
	p.id = e.ids
	p.snd = NewSender[pkt[M, P]](e.cfg.Config)
	p.rcv = e.newReceiver(p)
	e.peers[k] = p
	addr := k.Addr.Addr()
	a := e.perAddr[addr]
	if a.head != nil {
		a.head.addrPrev = p
	}
	p.addrNext, a.head = a.head, p
	a.n++
	e.perAddr[addr] = a
	p.listed = true
	e.touch(p)
	e.Stats.Peers++
	return p
}

// forget drops p's state, burying its session: what its receiver holds
// is let go of, and it leaves every place in the table.
func (e *Endpoint[M, P]) forget(p *peer[M, P]) {
	e.bury(p)
	p.rcv.Reset()
	if !p.listed {
		return
	}
	delete(e.peers, p.key)
	e.unschedule(p)
	e.unlist(p)
	addr := p.key.Addr.Addr()
	a := e.perAddr[addr]
	if p.addrPrev != nil {
		p.addrPrev.addrNext = p.addrNext
	} else {
		a.head = p.addrNext
	}
	if p.addrNext != nil {
		p.addrNext.addrPrev = p.addrPrev
	}
	p.addrPrev, p.addrNext = nil, nil
	if a.n--; a.n <= 0 {
		delete(e.perAddr, addr)
	} else {
		e.perAddr[addr] = a
	}
	p.listed = false
	e.host.Event(&p.pub, EventForgotten)
}

// room makes room for one more peer under MaxPeers, reclaiming the
// longest-idle reclaimable peer; false if none can go.
func (e *Endpoint[M, P]) room(now time.Time) bool {
	if len(e.peers) < e.cfg.MaxPeers {
		return true
	}
	e.settle(now)
	f, h := e.free.head, e.holding.head
	if h != nil && !e.reclaimable(h, now) {
		h = nil
	}
	switch {
	case f == nil && h == nil:
		return false
	case f == nil || h != nil && h.last.Before(f.last):
		f = h
	}
	e.forget(f)
	e.Stats.Reclaimed++
	return true
}

// addrRoom makes room for one more peer from addr under
// MaxPeersPerAddr; false if none of its peers can go.
func (e *Endpoint[M, P]) addrRoom(addr netip.Addr, now time.Time) bool {
	a := e.perAddr[addr]
	if a.n < e.cfg.MaxPeersPerAddr {
		return true
	}
	var idle *peer[M, P]
	for p := a.head; p != nil; p = p.addrNext {
		if e.reclaimable(p, now) && (idle == nil || p.last.Before(idle.last)) {
			idle = p
		}
	}
	if idle == nil {
		return false
	}
	e.forget(idle)
	e.Stats.Reclaimed++
	return true
}

// quiet: nothing of ours is outstanding to p.
func (p *peer[M, P]) quiet() bool {
	return p.postedAt == len(p.posted) && len(p.queue) == 0 && p.snd.InFlight() == 0
}

func (e *Endpoint[M, P]) reclaimable(p *peer[M, P], now time.Time) bool {
	return p.quiet() && (p.rcv.Held() == 0 || now.Sub(p.moved) > e.cfg.IdleTimeout)
}

func (e *Endpoint[M, P]) reclaimAt(p *peer[M, P]) time.Time {
	switch {
	case !p.quiet():
		return time.Time{}
	case p.rcv.Held() > 0:
		return p.moved.Add(e.cfg.IdleTimeout)
	}
	return p.last.Add(e.cfg.IdleTimeout)
}

// peerDue is when the timer next has work for p; zero for none.
func (e *Endpoint[M, P]) peerDue(p *peer[M, P], now time.Time) time.Time {
	var next time.Time
	early := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if !p.established {
		if !p.helloAt.IsZero() {
			early(p.helloAt.Add(e.helloWait(p)))
		}
		return next
	}
	early(p.snd.Deadline())
	if !p.ackHeld {
		early(p.rcv.AckDue(now))
	}
	if len(p.queue) > 0 && !p.waiting && p.snd.CanSend(now) {
		early(p.snd.SendAt(now))
	}
	if len(p.queue) > 0 && !p.snd.CanSend(now) && p.snd.InFlight() == 0 {
		early(p.snd.Resume())
	}
	if p.quiet() && (p.snd.Slots() > 0 || p.rcv.Slots() > 0 && p.rcv.Held() == 0) {
		early(p.last.Add(e.cfg.CompactAfter))
	}
	if at := e.reclaimAt(p); !at.IsZero() {
		early(at.Add(time.Millisecond))
	}
	return next
}

// settle gives every touched peer its place in the heap and the lists,
// and returns the earliest time any peer needs the timer.
func (e *Endpoint[M, P]) settle(now time.Time) time.Time {
	for i, p := range e.dirty {
		e.dirty[i] = nil
		p.dirty = false
		if !p.listed {
			continue
		}
		e.schedule(p, e.peerDue(p, now))
		switch {
		case !p.quiet():
			e.unlist(p)
		case p.rcv.Held() == 0:
			e.enlist(p, freeList)
		default:
			e.enlist(p, holdingList)
		}
	}
	e.dirty = e.dirty[:0]
	if len(e.tm) == 0 {
		return time.Time{}
	}
	return e.base.Add(time.Duration(e.tm[0].tmAt))
}

// Deadline returns when Tick must next run (zero: nothing timed), given
// the time now.
func (e *Endpoint[M, P]) Deadline(now time.Time) time.Time { return e.settle(now) }

func (e *Endpoint[M, P]) takeDue(now time.Time) []*peer[M, P] {
	e.settle(now)
	at := int64(now.Sub(e.base))
	e.due = e.due[:0]
	for len(e.tm) > 0 && e.tm[0].tmAt <= at {
		p := e.tm[0]
		e.unschedule(p)
		e.due = append(e.due, p)
		e.touch(p)
	}
	return e.due
}

func (t *table[M, P]) schedule(p *peer[M, P], at time.Time) {
	if at.IsZero() {
		t.unschedule(p)
		return
	}
	v := int64(at.Sub(t.base))
	if p.tmIdx == 0 {
		p.tmAt = v
		t.tm = append(t.tm, p)
		p.tmIdx = int32(len(t.tm))
		t.up(len(t.tm) - 1)
		return
	}
	old := p.tmAt
	p.tmAt = v
	switch i := int(p.tmIdx - 1); {
	case v < old:
		t.up(i)
	case v > old:
		t.down(i)
	}
}

func (t *table[M, P]) unschedule(p *peer[M, P]) {
	if p.tmIdx == 0 {
		return
	}
	i, last := int(p.tmIdx-1), len(t.tm)-1
	if i != last {
		t.swap(i, last)
	}
	t.tm[last] = nil
	t.tm = t.tm[:last]
	p.tmIdx = 0
	if i != last {
		t.down(i)
		t.up(i)
	}
}

func (t *table[M, P]) swap(i, j int) {
	t.tm[i], t.tm[j] = t.tm[j], t.tm[i]
	t.tm[i].tmIdx, t.tm[j].tmIdx = int32(i+1), int32(j+1)
}

// less orders the heap by due time, then by age, so that peers due at
// the same instant run in one order every time (a simulation replays).
func (t *table[M, P]) less(i, j int) bool {
	a, b := t.tm[i], t.tm[j]
	return a.tmAt < b.tmAt || a.tmAt == b.tmAt && a.id < b.id
}

func (t *table[M, P]) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !t.less(i, parent) {
			return
		}
		t.swap(i, parent)
		i = parent
	}
}

func (t *table[M, P]) down(i int) {
	for n := len(t.tm); ; {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && t.less(c+1, c) {
			c++
		}
		if !t.less(c, i) {
			return
		}
		t.swap(i, c)
		i = c
	}
}

func (t *table[M, P]) listOf(which uint8) *plist[M, P] {
	switch which {
	case freeList:
		return &t.free
	case holdingList:
		return &t.holding
	}
	return nil
}

func (t *table[M, P]) enlist(p *peer[M, P], which uint8) {
	l := t.listOf(which)
	if p.list == which && l.tail == p {
		return
	}
	t.unlist(p)
	p.lprev, p.list = l.tail, which
	if l.tail != nil {
		l.tail.lnext = p
	} else {
		l.head = p
	}
	l.tail = p
}

func (t *table[M, P]) unlist(p *peer[M, P]) {
	l := t.listOf(p.list)
	if l == nil {
		return
	}
	if p.lprev != nil {
		p.lprev.lnext = p.lnext
	} else {
		l.head = p.lnext
	}
	if p.lnext != nil {
		p.lnext.lprev = p.lprev
	} else {
		l.tail = p.lprev
	}
	p.lprev, p.lnext, p.list = nil, nil, noList
}

// PeerInfo is what EachPeer and Info show of a peer.
type PeerInfo struct {
	Key         PeerKey
	Established bool
	// Epoch is ours in the session, TheirEpoch the peer's (0 until
	// established).
	Epoch, TheirEpoch uint32
	// Token is what the peer's frames carry: the token of our Hello, or
	// the one our Challenge issued.
	Token uint64
	// HeldBytes and HeldFrames are what its receiver buffers ahead of a
	// gap, Claims how many of those frames are claims (Host.Hold).
	HeldBytes, HeldFrames, Claims int
	// Outstanding is the messages posted to it not yet complete, Queued
	// those with segments not yet numbered, InFlight its frames sent and
	// not acknowledged, NextSeq the sequence number its next frame takes.
	Outstanding, Queued, InFlight int
	NextSeq                       uint32
	// The sender's congestion control (Sender.CongestionMode and the
	// rest): its state, window and pacing rate (bytes, bytes per
	// second), the smoothed and minimum RTT, the bottleneck bandwidth it
	// estimates (bytes per second), its retransmissions, and those of
	// them shown needless (Sender.Spurious).
	Congestion          string
	CongestionWindow    int
	PacingRate          float64
	SRTT, MinRTT        time.Duration
	BottleneckBandwidth float64
	Retransmits         uint64
	LostByCount         uint64
	LostByTime          uint64
	Spurious            uint64
	// SendSlots and RecvSlots are the sizes of its sender's and
	// receiver's rings (0 once let go of: Config.CompactAfter).
	SendSlots, RecvSlots int
	// Last is its last traffic, Moved when its receiver last delivered
	// or its gap opened; ReclaimAt when the endpoint forgets it
	// if nothing happens (zero: not while work to it is outstanding).
	Last, Moved, ReclaimAt time.Time
}

func (e *Endpoint[M, P]) info(p *peer[M, P]) PeerInfo {
	return PeerInfo{Key: p.key, Established: p.established, Epoch: p.epoch, TheirEpoch: p.theirEpoch, Token: p.myToken,
		HeldBytes: p.held, HeldFrames: p.rcv.Held(), Claims: p.rcv.Claims(),
		Outstanding: len(p.posted) - p.postedAt, Queued: len(p.queue), InFlight: p.snd.InFlight(), NextSeq: p.snd.Next(),
		SendSlots: p.snd.Slots(), RecvSlots: p.rcv.Slots(), Last: p.last, Moved: p.moved, ReclaimAt: e.reclaimAt(p),
		Congestion: p.snd.CongestionMode(), CongestionWindow: p.snd.CongestionWindow(), PacingRate: p.snd.PacingRate(),
		SRTT: p.snd.RTT().Smoothed(0), MinRTT: p.snd.MinRTT(), BottleneckBandwidth: p.snd.BottleneckBandwidth(),
		Retransmits: p.snd.Retransmits, LostByCount: p.snd.LostByCount, LostByTime: p.snd.LostByTime, Spurious: p.snd.Spurious}
}

// EachPeer calls f for every peer with state. Its order is not defined.
func (e *Endpoint[M, P]) EachPeer(f func(*PeerInfo)) {
	var pi PeerInfo
	for _, p := range e.peers {
		pi = e.info(p)
		f(&pi)
	}
}

// Info returns what the endpoint holds of peer k, if it has state.
func (e *Endpoint[M, P]) Info(k PeerKey) (PeerInfo, bool) {
	p := e.peers[k]
	if p == nil {
		return PeerInfo{}, false
	}
	return e.info(p), true
}

// Peer returns peer k as the Host sees it, nil if the endpoint has no
// state for it.
func (e *Endpoint[M, P]) Peer(k PeerKey) *Peer[P] {
	if p := e.peers[k]; p != nil {
		return &p.pub
	}
	return nil
}

// PeerFor returns peer k's state, making it (with a token for our
// Hello) if there is none and the table has room: Post does the same.
// A caller that keeps state of its own per peer (Peer.State) sets it up
// here before its first Post.
func (e *Endpoint[M, P]) PeerFor(now time.Time, k PeerKey) (*Peer[P], error) {
	p, err := e.peerFor(now, k)
	if err != nil {
		return nil, err
	}
	return &p.pub, nil
}

func (e *Endpoint[M, P]) peerFor(now time.Time, k PeerKey) (*peer[M, P], error) {
	if p := e.peers[k]; p != nil {
		return p, nil
	}
	if !e.room(now) {
		return nil, fmt.Errorf("%w: %d", ErrTooManyPeers, len(e.peers))
	}
	p := e.newPeer(k, now)
	p.myToken = e.newToken()
	return p, nil
}

// QPN returns the QP number the endpoint answers to.
func (e *Endpoint[M, P]) QPN() uint32 { return e.cfg.QPN }

// SetQPN changes the QP number the endpoint answers to and puts in its
// frames (a QP that moved to another number of its socket).
func (e *Endpoint[M, P]) SetQPN(n uint32) { e.cfg.QPN = n }

// SetIdleTimeout changes EndpointConfig.IdleTimeout; every peer's
// reclaim time moves with it.
func (e *Endpoint[M, P]) SetIdleTimeout(d time.Duration) {
	e.cfg.IdleTimeout = d
	for _, p := range e.peers {
		e.touch(p)
	}
}

// AcksPending reports whether acks made due by the frames received
// wait for EndBatch.
func (e *Endpoint[M, P]) AcksPending() bool { return len(e.acks) > 0 }

// Tokens returns the endpoint's token issuer (tests build frames a
// validated peer would send with it).
func (e *Endpoint[M, P]) Tokens() *Tokens { return e.tokens }

// Check reports the first broken invariant of the peer table, if any:
// every peer in its address's list and counted there, the heap ordered
// and each peer in it at most once, and each quiet peer in the list its
// holdings say (after settling what was touched). For tests.
func (e *Endpoint[M, P]) Check(now time.Time) error {
	e.settle(now)
	n := 0
	for addr, a := range e.perAddr {
		c := 0
		for p := a.head; p != nil; p = p.addrNext {
			if p.key.Addr.Addr() != addr || e.peers[p.key] != p {
				return fmt.Errorf("peer %v in the list of %v", p.key, addr)
			}
			c++
		}
		if c != a.n {
			return fmt.Errorf("address %v: %d peers listed, %d counted", addr, c, a.n)
		}
		n += c
	}
	if n != len(e.peers) {
		return fmt.Errorf("%d peers by address, %d by key", n, len(e.peers))
	}
	for i, p := range e.tm {
		if int(p.tmIdx) != i+1 {
			return fmt.Errorf("peer %v at heap index %d thinks %d", p.key, i, p.tmIdx-1)
		}
		if i > 0 && e.less(i, (i-1)/2) {
			return fmt.Errorf("heap out of order at %d", i)
		}
		if e.peers[p.key] != p {
			return fmt.Errorf("heap holds forgotten peer %v", p.key)
		}
	}
	for _, p := range e.peers {
		want := uint8(noList)
		switch {
		case !p.quiet():
		case p.rcv.Held() == 0:
			want = freeList
		default:
			want = holdingList
		}
		if p.list != want {
			return fmt.Errorf("peer %v in list %d, should be in %d", p.key, p.list, want)
		}
	}
	return nil
}
