package qp

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
)

// The RD peer table (issue 18: 100,000 peers on one QP). Nothing a frame,
// a post, a timer run or a first contact does may cost time in proportion
// to the peers a QP holds: one RD QP serving 100,000 clients, and a flood
// of validated first contacts at its cap, must cost per frame what one
// peer costs. So the table keeps, besides the peers by key:
//
//   - per source address, a count and a list of its peers
//     (MaxPeersPerAddr, which bounds a walk of the list);
//   - a min-heap of the peers with timed work (retransmission, ack,
//     probe, Hello, idle reclaim) by when it is due: a timer run takes
//     only the due ones;
//   - the reclaimable candidates, quiet peers (nothing of ours
//     outstanding to them), in two lists in the order they were last
//     touched: those that hold nothing, and those that hold frames
//     ahead of a gap (reclaimable once it has not moved for
//     IdleTimeout); a first contact over the cap takes the head of one;
//   - the peers the operation under way touched: they take their places
//     in the heap and the lists when it arms the timer (settle), so an
//     operation costs the peers it touched, not the table;
//   - the peers waiting for the datamover because their socket was full.

// rdTable is an RD QP's peers, under rdQP.mu.
type rdTable struct {
	peers   map[rdKey]*rdPeer
	perAddr map[netip.Addr]rdAddrPeers
	tm      []*rdPeer // min-heap by tmAt
	base    time.Time // tmAt counts from it
	free    rdList    // quiet, holding nothing
	holding rdList    // quiet, holding frames ahead of a gap
	dirty   []*rdPeer // touched since the last settle
	due     []*rdPeer // a timer run's due peers
	movers  []*rdPeer // waiting for the datamover, from moverAt
	moverAt int
}

// rdAddrPeers is one source address's peers: how many, and a list.
type rdAddrPeers struct {
	n    int
	head *rdPeer
}

type rdList struct{ head, tail *rdPeer }

const (
	rdNoList = iota
	rdFreeList
	rdHoldingList
)

// rdSlots are a peer's places in its QP's table.
type rdSlots struct {
	tmAt               int64 // when its timed work is due, in ns after rdTable.base
	tmIdx              int32 // 1 + its index in the heap; 0: no timed work
	list               uint8 // rdNoList, rdFreeList or rdHoldingList
	listed             bool  // in the table (forget clears it)
	dirty              bool  // in rdTable.dirty
	mover              bool  // in rdTable.movers
	lprev, lnext       *rdPeer
	addrPrev, addrNext *rdPeer
}

func (t *rdTable) init() {
	t.peers, t.perAddr, t.base = map[rdKey]*rdPeer{}, map[netip.Addr]rdAddrPeers{}, time.Now()
}

// reset forgets every peer without burying them (rdFlush).
func (t *rdTable) reset() {
	for _, p := range t.peers {
		p.rdSlots = rdSlots{}
	}
	clear(t.peers)
	clear(t.perAddr)
	clear(t.tm)
	clear(t.dirty)
	clear(t.movers)
	t.tm, t.dirty, t.movers, t.moverAt = t.tm[:0], t.dirty[:0], t.movers[:0], 0
	t.free, t.holding = rdList{}, rdList{}
}

// touch marks p for settle: something about it changed.
func (t *rdTable) touch(p *rdPeer) {
	if !p.dirty && p.listed {
		p.dirty = true
		t.dirty = append(t.dirty, p)
	}
}

// rdPeerFor returns the peer state for ah, making it (and starting
// contact) if there is none. Caller holds r.mu.
func (r *rdQP) peerFor(ah *AH, now time.Time) (*rdPeer, error) {
	k := rdKey{ah.addr, ah.qpn}
	if p := r.peers[k]; p != nil {
		return p, nil
	}
	if !r.room(now) {
		return nil, fmt.Errorf("%w: %d RD peers with work outstanding", ErrTooMany, len(r.peers))
	}
	p := r.newPeer(k, now)
	p.newToken()
	return p, nil
}

// newToken draws the random token our Hello carries for a new session.
func (p *rdPeer) newToken() {
	var tok [8]byte
	for p.myToken = 0; p.myToken == 0; {
		rand.Read(tok[:])
		p.myToken = binary.BigEndian.Uint64(tok[:])
	}
}

// rdBury remembers that p's session ended: a Data frame of it, even with
// a valid keyed token, opens nothing (rdReceive). The graveyard keeps the
// last rdGraveyard sessions.
func (r *rdQP) bury(p *rdPeer) {
	r.endRxSend(p, RemoteAbortedError) // a Send of several segments ends with its session
	if !p.established {
		return
	}
	r.graves.Bury(p.key, p.theirEpoch)
}

// rdRoom makes room for one more peer under the cap, reclaiming the
// longest-idle reclaimable peer; false if none can go.
func (r *rdQP) room(now time.Time) bool {
	if len(r.peers) < r.cfg.MaxPeers {
		return true
	}
	r.settle(now)
	// The heads of the two lists are the candidates: the peer that holds
	// nothing and was touched longest ago, and the one holding frames
	// touched longest ago if its gap has stalled for IdleTimeout. (A
	// stalled holder behind a younger head is left to the timer, which
	// reclaims it on time.)
	f, h := r.free.head, r.holding.head
	if h != nil && !r.reclaimable(h, now) {
		h = nil
	}
	switch {
	case f == nil && h == nil:
		return false
	case f == nil || h != nil && h.last.Before(f.last):
		f = h
	}
	r.reclaim(f)
	return true
}

// rdAddrRoom makes room for one more peer from addr under the
// per-address limit, reclaiming that address's longest-idle reclaimable
// peer; false if none can go. It walks the address's peers, at most
// MaxPeersPerAddr.
func (r *rdQP) addrRoom(addr netip.Addr, now time.Time) bool {
	a := r.perAddr[addr]
	if a.n < r.cfg.MaxPeersPerAddr {
		return true
	}
	var idle *rdPeer
	for p := a.head; p != nil; p = p.addrNext {
		if r.reclaimable(p, now) && (idle == nil || p.last.Before(idle.last)) {
			idle = p
		}
	}
	if idle == nil {
		return false
	}
	r.reclaim(idle)
	return true
}

// rdReclaim forgets p to make room, and counts it.
func (r *rdQP) reclaim(p *rdPeer) {
	r.forget(p)
	r.q.dev.stats.RDPeersReclaimed.Add(1)
}

// quiet: nothing of ours is outstanding to p.
func (p *rdPeer) quiet() bool {
	return p.outstanding == 0 && len(p.queue) == 0 && p.snd.InFlight() == 0
}

// rdReclaimable: p can be forgotten at the cap: nothing of ours is
// outstanding to it, and it holds nothing, or holds frames ahead of a gap
// that has not moved for IdleTimeout (its sender gave up on the gap, or
// never meant to fill it: buffered frames must not pin a peer's state).
func (r *rdQP) reclaimable(p *rdPeer, now time.Time) bool {
	return p.quiet() && (p.rcv.Held() == 0 || now.Sub(p.moved) > r.cfg.IdleTimeout)
}

// rdReclaimAt is when the timer forgets p: IdleTimeout after its last
// traffic if it is idle, after its gap opened or last moved if it holds
// frames; zero while work of ours to it is outstanding.
func (r *rdQP) reclaimAt(p *rdPeer) time.Time {
	switch {
	case !p.quiet():
		return time.Time{}
	case p.rcv.Held() > 0:
		return p.moved.Add(r.cfg.IdleTimeout)
	}
	return p.last.Add(r.cfg.IdleTimeout)
}

// rdForget drops p's state, remembering its session if it had one (rdBury):
// what its receiver holds is let go of (and leaves the byte budgets), a
// Write-Record message of its in progress at the engine ends by its
// policy (the rest of it can no longer come), and it leaves its
// address's count and every place in the table. Caller holds r.mu.
func (r *rdQP) forget(p *rdPeer) {
	r.bury(p)
	p.rcv.Reset()
	r.endWriteRecords(p.key)
	if !p.listed {
		return
	}
	delete(r.peers, p.key)
	r.unschedule(p)
	r.unlist(p)
	addr := p.key.addr.Addr()
	a := r.perAddr[addr]
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
		delete(r.perAddr, addr)
	} else {
		r.perAddr[addr] = a
	}
	p.listed = false
}

// rdNewReceiver returns a receiver for p whose buffered frames are
// counted against the byte budgets until delivered or let go of.
func (r *rdQP) newReceiver(p *rdPeer) *reliability.Receiver[[]byte] {
	return reliability.NewReceiver[[]byte](r.cfg.Config, func(b []byte) { r.unhold(p, b) })
}

// rdUnhold takes a buffered frame off the byte budgets.
func (r *rdQP) unhold(p *rdPeer, b []byte) {
	p.held -= len(b)
	r.held -= len(b)
}

func (r *rdQP) newPeer(k rdKey, now time.Time) *rdPeer {
	q := r.q
	p := &rdPeer{key: k, last: now, moved: now, epoch: reliability.NewEpoch()}
	p.ah.setAddr(k.addr, k.qpn)
	p.snd = reliability.NewSender[rdPkt](r.cfg.Config)
	p.rcv = r.newReceiver(p)
	r.peers[k] = p
	addr := k.addr.Addr()
	a := r.perAddr[addr]
	if a.head != nil {
		a.head.addrPrev = p
	}
	p.addrNext, a.head = a.head, p
	a.n++
	r.perAddr[addr] = a
	p.listed = true
	r.touch(p)
	q.dev.stats.RDPeers.Add(1)
	r.endWriteRecords(k)
	return p
}

// rdPeerDue is when the QP's timer next has work for p; zero for none.
func (r *rdQP) peerDue(p *rdPeer, now time.Time) time.Time {
	var next time.Time
	early := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if !p.established {
		if !p.helloAt.IsZero() {
			early(p.helloAt.Add(r.helloWait(p)))
		}
		return next
	}
	early(p.snd.Deadline())
	if !p.ackHeld { // else the end of the socket's batch sends it (ackAfterBatch)
		early(p.rcv.AckDue(now))
	}
	if len(p.queue) > 0 && p.snd.CanSend(now) {
		early(p.snd.SendAt(now)) // paced: the next frame's time (rdQP.paced)
	}
	if len(p.queue) > 0 && !p.snd.CanSend(now) && p.snd.InFlight() == 0 {
		// Waiting out a receiver-not-ready, or for the next probe of
		// a shut window.
		early(p.snd.Resume())
	}
	if p.quiet() && (p.snd.Slots() > 0 || p.rcv.Slots() > 0 && p.rcv.Held() == 0) {
		early(p.last.Add(rdCompactAfter))
	}
	if at := r.reclaimAt(p); !at.IsZero() {
		early(at.Add(time.Millisecond))
	}
	return next
}

// rdCompactAfter is how long a peer stays quiet before its sender and
// receiver let go of their rings (Sender.Compact, Receiver.Compact): a
// peer that exchanges more often keeps them (no allocation per message),
// an idle one costs its state without them, and a ring a peer grew to
// the window with frames out of order does not stay grown.
const rdCompactAfter = time.Second

// rdCompact lets go of the rings of a peer quiet for rdCompactAfter, and
// of the array of its posted WRs.
func (r *rdQP) compact(p *rdPeer, now time.Time) {
	if p.quiet() && !now.Before(p.last.Add(rdCompactAfter)) {
		p.snd.Compact()
		p.rcv.Compact()
		p.posted = nil // empty when quiet: its array goes with the rings
	}
}

// rdSettle gives every touched peer its place in the heap and the lists,
// and returns the earliest time any peer needs the timer (zero: none).
func (r *rdQP) settle(now time.Time) time.Time {
	for i, p := range r.dirty {
		r.dirty[i] = nil
		p.dirty = false
		if !p.listed {
			continue
		}
		r.schedule(p, r.peerDue(p, now))
		switch {
		case !p.quiet():
			r.unlist(p)
		case p.rcv.Held() == 0:
			r.enlist(p, rdFreeList)
		default:
			r.enlist(p, rdHoldingList)
		}
	}
	r.dirty = r.dirty[:0]
	if len(r.tm) == 0 {
		return time.Time{}
	}
	return r.base.Add(time.Duration(r.tm[0].tmAt))
}

// rdArm makes sure the device timer runs by the QP's next deadline.
func (r *rdQP) arm(now time.Time) {
	q := r.q
	next := r.settle(now)
	if next.IsZero() || (!r.next.IsZero() && !next.Before(r.next)) {
		return
	}
	r.next = next
	q.armTimer(next)
}

// rdTakeDue takes the peers whose timed work is due at now off the heap
// and marks them touched (they take their places again at the next
// settle). The slice is the table's: valid until the next call.
func (r *rdQP) takeDue(now time.Time) []*rdPeer {
	r.settle(now)
	at := int64(now.Sub(r.base))
	r.due = r.due[:0]
	for len(r.tm) > 0 && r.tm[0].tmAt <= at {
		p := r.tm[0]
		r.unschedule(p)
		r.due = append(r.due, p)
		r.touch(p)
	}
	return r.due
}

// rdWaitMover queues p for the datamover: its socket filled up with work
// for p left.
func (r *rdQP) waitMover(p *rdPeer) {
	if !p.mover {
		p.mover = true
		r.movers = append(r.movers, p)
	}
}

// rdDrain is the datamover's turn for an RD QP: pump the peers the full
// socket held up, in the order it did.
func (r *rdQP) drain(s *Socket, _ int) (more, full bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for ; r.moverAt < len(r.movers); r.moverAt++ {
		p := r.movers[r.moverAt]
		if p.listed && p.established && len(p.queue) > 0 {
			r.touch(p)
			if r.pump(s, p, now) {
				return true, true
			}
		}
		p.mover = false
		r.movers[r.moverAt] = nil
	}
	r.movers, r.moverAt = r.movers[:0], 0
	r.inMover = false
	r.arm(now)
	return false, false
}

// The heap of timed work.

// schedule sets when p's timed work is due; zero takes it off the heap.
func (t *rdTable) schedule(p *rdPeer, at time.Time) {
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

func (t *rdTable) unschedule(p *rdPeer) {
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

func (t *rdTable) swap(i, j int) {
	t.tm[i], t.tm[j] = t.tm[j], t.tm[i]
	t.tm[i].tmIdx, t.tm[j].tmIdx = int32(i+1), int32(j+1)
}

func (t *rdTable) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if t.tm[parent].tmAt <= t.tm[i].tmAt {
			return
		}
		t.swap(i, parent)
		i = parent
	}
}

func (t *rdTable) down(i int) {
	for n := len(t.tm); ; {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && t.tm[c+1].tmAt < t.tm[c].tmAt {
			c++
		}
		if t.tm[i].tmAt <= t.tm[c].tmAt {
			return
		}
		t.swap(i, c)
		i = c
	}
}

// The reclaim lists.

func (t *rdTable) listOf(which uint8) *rdList {
	switch which {
	case rdFreeList:
		return &t.free
	case rdHoldingList:
		return &t.holding
	}
	return nil
}

// enlist puts p at the tail of list which (the most recently touched).
func (t *rdTable) enlist(p *rdPeer, which uint8) {
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

func (t *rdTable) unlist(p *rdPeer) {
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
	p.lprev, p.lnext, p.list = nil, nil, rdNoList
}
