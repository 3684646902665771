package writerecord

import (
	"net/netip"
	"time"

	"github.com/google/btree"
	"github.com/udiwarp/udiwarp/validitymap"
)

// Source names the sender of a message: its IP:port and QP number.
type Source struct {
	Addr netip.AddrPort
	QPN  uint32
}

// Policy says what happens to a message whose deadline passes before it
// is complete.
type Policy uint8

const (
	// Discard declares the message's bytes invalid: nothing is recorded.
	Discard Policy = iota
	// DeliverPartial records exactly the ranges that arrived.
	DeliverPartial
)

func (p Policy) String() string {
	if p == DeliverPartial {
		return "deliver-partial"
	}
	return "discard"
}

// Config bounds an Engine. The zero value is usable.
type Config struct {
	// Timeout starts at a message's first segment. Default 10 s: long, so
	// that by default only messages that will never complete expire.
	Timeout time.Duration
	Policy  Policy
	// MaxMessages caps the messages in progress (default 4096), and
	// MaxPerSource those of one source (default 64). At a cap the message
	// that began longest ago is evicted and counted, never recorded.
	MaxMessages  int
	MaxPerSource int
	// MSNWindow bounds how far ahead of the message that holds a
	// (source, STag) — in progress, or completed and remembered — a
	// segment's MSN may be and still supersede it (default 1024, at most
	// 2^31-1). A segment further ahead is dropped and counted
	// (Stats.FarAhead), so that one datagram with a far-ahead MSN, forged
	// or not, cannot take a flow's key. See docs/wire.md §4.3.
	MSNWindow int
	// MaxRanges caps the disjoint runs of bytes one message in progress
	// may hold (default 1024). A segment that would add a run beyond it
	// ends the message at once, by its policy: deliver-partial records the
	// runs that arrived, discard records nothing; the segment and the rest
	// of the message are dropped (Stats.Fragmented). With MaxMessages it
	// bounds the engine's memory (MaxMessages × MaxRanges runs of 16
	// bytes) and each segment's work (O(log MaxRanges)).
	MaxRanges int
	// MaxRemembered caps the keys (source, STag) whose newest MSN the
	// engine remembers once nothing of them is in progress (default
	// 4096), so that a segment of a message the key has moved past is
	// dropped however late it comes. Beyond it the key that went quiet
	// longest ago is forgotten and counted (Stats.Forgotten); a straggler
	// of it may then start a message again, as before the key was known.
	MaxRemembered int
	// Reliable says every segment of a message arrives, in order and
	// once, unless its source's session ends: the engine of an RD QP
	// (the QP sets it from its type; docs/wire.md §11.3). A message in
	// progress then has no deadline — Timeout, and a region's
	// Limits.Timeout, only bound how long a completed one is remembered —
	// since a segment that is late is being retransmitted, not lost, and
	// ending its message would drop a record the transport delivers. The
	// owner ends a source's messages, by their policy, with EndSource
	// when its session ends.
	Reliable bool
}

// DefaultTimeout is a message's deadline when Config.Timeout is zero:
// long, so that only a message that will never complete waits it out.
const DefaultTimeout = 10 * time.Second

func (c *Config) fill() {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxMessages <= 0 {
		c.MaxMessages = 4096
	}
	if c.MaxPerSource <= 0 {
		c.MaxPerSource = 64
	}
	if c.MSNWindow <= 0 {
		c.MSNWindow = 1024
	}
	c.MSNWindow = min(c.MSNWindow, 1<<31-1)
	if c.MaxRanges <= 0 {
		c.MaxRanges = 1024
	}
	if c.MaxRemembered <= 0 {
		c.MaxRemembered = 4096
	}
}

// Segment is what the engine needs of one arriving Write-Record segment
// (see docs/wire.md §4.2): its message's identity and extent, and the
// bytes this segment carries.
type Segment struct {
	Source Source
	STag   uint32
	MSN    uint32
	// MessageTO and Length are the message's first byte and length
	// (TO - MO and MsgLen on the wire).
	MessageTO uint64
	Length    uint32
	// Offset and N are this segment's place in the message (MO) and size.
	Offset uint32
	N      uint32
	// Limits, when not nil, overrides the engine's Timeout and Policy for
	// the message this segment starts (a per-region setting: the target
	// region's, seed 003's "per MR" deadline).
	Limits *Limits
}

// Limits is a deadline and a policy that one region's messages follow
// instead of the engine's.
type Limits struct {
	Timeout time.Duration // at least 1 ns; <= 0 means the engine's
	Policy  Policy
}

// Record is what the target learns of one message.
type Record struct {
	Source    Source
	STag      uint32
	MSN       uint32
	MessageTO uint64
	Length    uint32
	// Complete says every byte arrived. Otherwise Valid lists, in tagged
	// offsets, exactly the ranges that did (deliver-partial).
	Complete bool
	Valid    []validitymap.Range
}

// Stats counts what the engine did.
type Stats struct {
	Completed  uint64 // messages recorded complete
	Partial    uint64 // messages recorded partial, at their deadline or at MaxRanges
	Expired    uint64 // messages discarded at their deadline
	Superseded uint64 // messages ended early by a newer MSN (deliver-partial: recorded partial, and counted in Partial too)
	Stale      uint64 // segments dropped: older MSN than the message in progress
	Evicted    uint64 // messages discarded at a cap
	Duplicate  uint64 // segments dropped: their message, or a newer one, is remembered (completed or past its deadline)
	FarAhead   uint64 // segments dropped: MSN more than MSNWindow ahead of their key's message
	Mismatch   uint64 // segments dropped: the MSN of the message in progress, another extent
	Displaced  uint64 // messages (or remembered ones) ended by two messages they blocked (§4.3)
	Fragmented uint64 // messages ended at MaxRanges (recorded partial or discarded by policy)
	Forgotten  uint64 // keys whose newest MSN was forgotten at MaxRemembered
}

type key struct {
	src  Source
	stag uint32
}

// message is one message in progress: created by its first segment to
// arrive, and ended when it completes, expires or is evicted, then kept as
// a tombstone until its deadline; or the newest MSN of a key with nothing
// in progress (past), kept until a newer message of the key starts or
// MaxRemembered forgets it. Supersession and displacement remove it.
type message struct {
	key      key
	msn      uint32
	to       uint64
	length   uint32
	got      ranges // bytes placed, relative to the message start
	placed   uint64
	deadline time.Time
	timeout  time.Duration
	policy   Policy
	// done marks a completed message kept as a tombstone until deadline,
	// so that a late duplicate of one of its segments is dropped instead
	// of starting the message again (and invalidating what it made valid).
	done bool
	// past marks a done message whose deadline passed (or a whole
	// one-segment message): only its MSN is kept, in Engine.past, so that
	// a late segment of it, or of an older message, is still dropped.
	past bool
	// strikes counts the messages this one blocked that sent their last
	// segment since it last made progress (at most 2: then it ends), and
	// strikeMSN is the last of them, so that a duplicate counts once.
	strikes   uint8
	strikeMSN uint32
	// Intrusive links, so that a message costs one allocation: all
	// messages by first arrival (Engine.order; Engine.past for a past
	// one, by when it went there), and its source's (not a past one).
	prev, next   *message
	sprev, snext *message
}

// chain is a doubly linked list of messages, oldest first.
type chain struct {
	head, tail *message
	n          int
}

func (c *chain) push(m *message, src bool) {
	if src {
		m.sprev, m.snext = c.tail, nil
		if c.tail != nil {
			c.tail.snext = m
		} else {
			c.head = m
		}
	} else {
		m.prev, m.next = c.tail, nil
		if c.tail != nil {
			c.tail.next = m
		} else {
			c.head = m
		}
	}
	c.tail = m
	c.n++
}

func (c *chain) unlink(m *message, src bool) {
	prev, next := m.prev, m.next
	if src {
		prev, next = m.sprev, m.snext
	}
	if prev != nil {
		if src {
			prev.snext = next
		} else {
			prev.next = next
		}
	} else {
		c.head = next
	}
	if next != nil {
		if src {
			next.sprev = prev
		} else {
			next.prev = prev
		}
	} else {
		c.tail = prev
	}
	c.n--
}

// Engine tracks the Write-Record messages in progress at one target. It is
// not safe for concurrent use; its owner serializes calls (the QP's
// receive path, and its timer).
type Engine struct {
	cfg       Config
	msgs      map[key]*message
	perSource map[Source]*chain // each source's messages by first arrival
	order     chain             // all messages by first arrival (not the past ones)
	past      chain             // the past messages, the one remembered longest first
	stats     Stats
	fl        *btree.FreeListG[validitymap.Range] // nodes of split messages' runs
	// ended is the record of a message the last Admit ended at MaxRanges
	// with deliver-partial, until Ended takes it.
	ended    Record
	hasEnded bool
}

// New returns an Engine.
func New(cfg Config) *Engine {
	cfg.fill()
	e := &Engine{cfg: cfg, msgs: map[key]*message{}, perSource: map[Source]*chain{},
		fl: btree.NewFreeListG[validitymap.Range](btree.DefaultFreeListSize)}
	return e
}

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats { return e.stats }

// InProgress returns the number of messages in progress (including
// completed ones kept until their deadline to drop their late duplicates;
// not the keys of which only the newest MSN is remembered).
func (e *Engine) InProgress() int { return e.order.n }

// Remembered returns the number of keys of which only the newest MSN is
// remembered (at most Config.MaxRemembered).
func (e *Engine) Remembered() int { return e.past.n }

// Verdict is Admit's answer.
type Verdict uint8

const (
	// Place the segment, then call Placed.
	Place Verdict = iota
	// PlaceNew is Place for the first segment to arrive of a new message:
	// before placing, invalidate [MessageTO, MessageTO+Length) in the
	// region's validity map, since its old contents are being overwritten.
	PlaceNew
	// Drop the segment: an older message's straggler, a duplicate, a
	// segment too far ahead or of another extent than its MSN's message,
	// or one that ended its message at MaxRanges (then Ended has a record
	// for the caller to make).
	Drop
)

// Admit decides a segment's fate before its bytes are placed (the rules
// are docs/wire.md §4.3). One message holds each (source, STag) — in
// progress, or ended and remembered by its MSN — : a segment of a newer
// message, up to MSNWindow ahead, discards it; a segment of an older one,
// or further ahead, is dropped; and when two messages it so blocked have
// sent their last segment while it made no progress, the holder ends and
// the segment is admitted as if the key were free.
func (e *Engine) Admit(s *Segment, now time.Time) Verdict {
	if e.hasEnded { // the caller did not take it
		e.ended, e.hasEnded = Record{}, false
	}
	k := key{s.Source, s.STag}
	whole := s.Offset == 0 && s.N == s.Length
	m := e.msgs[k]
	if m != nil {
		d := int32(s.MSN - m.msn) // serial-number arithmetic
		switch {
		case d == 0 && m.done:
			e.stats.Duplicate++
			return Drop
		case d == 0 && (s.MessageTO != m.to || s.Length != m.length):
			// Another message claims this MSN (one of the two is not the
			// source's): its bytes must never count towards m's record.
			e.stats.Mismatch++
			if !e.strike(m, s) {
				return Drop
			}
		case d == 0:
			if m.got.len() >= e.cfg.MaxRanges && m.got.adds(uint64(s.Offset), uint64(s.Offset)+uint64(s.N)) {
				e.fragment(m, now)
				return Drop
			}
			return Place
		case d > 0 && int(d) <= e.cfg.MSNWindow:
			if !m.done {
				// The source moved on: nothing more of m will come but
				// stragglers. Deliver-partial records the runs that
				// arrived now (Ended), as at its deadline; discard
				// records nothing.
				e.stats.Superseded++
				if m.policy == DeliverPartial && m.placed > 0 {
					e.stats.Partial++
					e.ended, e.hasEnded = m.partial(), true
				}
			} // else a newer message: the tombstone has served
			if whole && m.past {
				// A one-segment message after a remembered one: only the
				// remembered number moves.
				m.msn, m.strikes = s.MSN, 0
				e.past.unlink(m, false)
				e.past.push(m, false)
				return PlaceNew
			}
			e.remove(m)
		default:
			switch {
			case d > 0:
				e.stats.FarAhead++
			case m.done:
				e.stats.Duplicate++
			default:
				e.stats.Stale++
			}
			if !e.strike(m, s) {
				return Drop
			}
		}
	}
	if whole {
		// Recorded at once: only its number is kept, so that a late copy
		// of it (UD may duplicate it), or of an older message, is dropped.
		// m, if not nil, was removed above: its memory serves again.
		e.remember(k, s.MSN, m)
		return PlaceNew
	}
	// At a cap, the oldest message goes: the source's own when it is the
	// one over its share, else the oldest of all. Both are O(1).
	if l := e.perSource[s.Source]; l != nil && l.n >= e.cfg.MaxPerSource {
		e.evict(l.head)
	}
	for e.order.n >= e.cfg.MaxMessages {
		e.evict(e.order.head)
	}
	timeout, policy := e.cfg.Timeout, e.cfg.Policy
	if l := s.Limits; l != nil {
		policy = l.Policy
		if l.Timeout > 0 {
			timeout = l.Timeout
		}
	}
	m = &message{key: k, msn: s.MSN, to: s.MessageTO, length: s.Length, deadline: now.Add(timeout), timeout: timeout, policy: policy}
	e.order.push(m, false)
	l := e.perSource[s.Source]
	if l == nil {
		l = new(chain)
		e.perSource[s.Source] = l
	}
	l.push(m, true)
	e.msgs[k] = m
	return PlaceNew
}

// strike notes that s, a segment m blocks, may be the last of its message,
// and reports whether that ended m: the second such message (another MSN
// than the first) since m last made progress is evidence that m is not
// the source's current message — a forgery, or a source that restarted
// its numbering — and not a reordered straggler, which comes alone.
func (e *Engine) strike(m *message, s *Segment) bool {
	if s.Offset+s.N != s.Length || (m.strikes > 0 && m.strikeMSN == s.MSN) {
		return false
	}
	m.strikes++
	m.strikeMSN = s.MSN
	if m.strikes < 2 {
		return false
	}
	e.stats.Displaced++
	e.remove(m)
	return true
}

// fragment ends m, which reached MaxRanges, by its policy, and keeps it
// as a tombstone so that the rest of its segments are dropped.
func (e *Engine) fragment(m *message, now time.Time) {
	e.stats.Fragmented++
	if m.policy == DeliverPartial && m.placed > 0 {
		e.stats.Partial++
		e.ended, e.hasEnded = m.partial(), true
	}
	m.done = true
	m.got.reset()
	m.deadline = now.Add(m.timeout)
}

// Ended returns the record of the message that the last Admit ended
// early — at MaxRanges, or superseded by a newer message of its source to
// the same STag — when its policy is deliver-partial: exactly its runs
// that arrived. The caller records it as it records Placed's and
// Expire's, whatever Admit returned.
func (e *Engine) Ended() (Record, bool) {
	r, ok := e.ended, e.hasEnded
	e.ended, e.hasEnded = Record{}, false
	return r, ok
}

// partial is m's record of the runs that arrived.
func (m *message) partial() Record {
	rec := Record{Source: m.key.src, STag: m.key.stag, MSN: m.msn, MessageTO: m.to, Length: m.length}
	rec.Valid = make([]validitymap.Range, 0, m.got.len())
	m.got.each(func(r validitymap.Range) {
		rec.Valid = append(rec.Valid, validitymap.Range{Start: m.to + r.Start, End: m.to + r.End})
	})
	return rec
}

// EndSource ends every message of src at once, as its deadline would
// (deliver-partial emits the record of what arrived; discard records
// nothing), and forgets it with src's remembered messages, so that src
// may number its messages from anywhere again. Its owner calls it when
// src's numbering provably starts over: an RD peer's new session, whose
// messages start at MSN 1 while the old session's can no longer arrive
// (docs/wire.md §11.2). Sources that are not authenticated must not be
// able to cause it.
func (e *Engine) EndSource(src Source, emit func(Record)) {
	if l := e.perSource[src]; l != nil {
		for m := l.head; m != nil; {
			next := m.snext
			if !m.done {
				if rec, ok := e.end(m, time.Time{}); ok {
					emit(rec)
				}
			}
			e.remove(m)
			m = next
		}
	}
	// The keys of which only the MSN is remembered: at most
	// MaxRemembered to look at, and a new session is rare.
	for m := e.past.head; m != nil; {
		next := m.next
		if m.key.src == src {
			e.remove(m)
		}
		m = next
	}
}

// remove forgets m, and with it its key's MSN: the caller has a newer
// message for the key, or means the key to be free.
func (e *Engine) remove(m *message) {
	m.got.reset()
	delete(e.msgs, m.key)
	if m.past {
		e.past.unlink(m, false)
		return
	}
	e.unlinkLive(m)
}

// unlinkLive takes m, not a past message, off the lists of messages with
// a deadline.
func (e *Engine) unlinkLive(m *message) {
	e.order.unlink(m, false)
	l := e.perSource[m.key.src]
	l.unlink(m, true)
	if l.n == 0 {
		delete(e.perSource, m.key.src)
	}
}

// retire keeps only m's MSN, with no deadline: its late segments, and
// older messages' of its key, are dropped until a newer message of the
// key starts (or MaxRemembered forgets it).
func (e *Engine) retire(m *message) {
	e.unlinkLive(m)
	m.got.reset()
	m.done, m.past, m.strikes = true, true, 0
	e.past.push(m, false)
	e.trimPast()
}

// remember keeps msn as the newest MSN of k, which has no message;
// reuse, if not nil, is a message just removed, whose memory serves.
func (e *Engine) remember(k key, msn uint32, reuse *message) {
	m := reuse
	if m == nil {
		m = new(message)
	} else {
		*m = message{}
	}
	m.key, m.msn, m.done, m.past = k, msn, true, true
	e.msgs[k] = m
	e.past.push(m, false)
	e.trimPast()
}

// trimPast forgets the keys remembered longest ago beyond MaxRemembered.
func (e *Engine) trimPast() {
	for e.past.n > e.cfg.MaxRemembered {
		e.stats.Forgotten++
		e.remove(e.past.head)
	}
}

// evict ends m at a cap, unrecorded (a message in progress counts as
// evicted), and keeps its MSN so that its later segments are dropped.
func (e *Engine) evict(m *message) {
	e.stats.Evicted++
	e.retire(m)
}

// Placed notes that s's bytes are in memory. When that completes the
// message it returns its record; the caller records it (CQ entry or
// validity map) — placement happened first, so no record ever names a
// byte not yet written.
func (e *Engine) Placed(s *Segment) (Record, bool) {
	rec := Record{Source: s.Source, STag: s.STag, MSN: s.MSN, MessageTO: s.MessageTO, Length: s.Length, Complete: true}
	k := key{s.Source, s.STag}
	m := e.msgs[k]
	if m == nil || m.msn != s.MSN || m.done {
		// A whole message in one segment, or a segment of a message that
		// was discarded meanwhile (which must not be recorded).
		if s.Offset == 0 && s.N == s.Length {
			e.stats.Completed++
			return rec, true
		}
		return Record{}, false
	}
	if n := m.got.add(uint64(s.Offset), uint64(s.Offset)+uint64(s.N), e.fl); n > 0 {
		m.placed += n
		m.strikes = 0 // it makes progress: what it blocked were stragglers
	}
	if m.placed < uint64(m.length) {
		return Record{}, false
	}
	// Keep a tombstone until the message's deadline so that late
	// duplicates are recognised; its ranges are no longer needed.
	m.done = true
	m.got.reset()
	e.stats.Completed++
	return rec, true
}

// Deadline returns when a message that s starts would expire (for a
// Reliable engine: stop being remembered once it completed).
func (e *Engine) Deadline(s *Segment, now time.Time) time.Time {
	if l := s.Limits; l != nil && l.Timeout > 0 {
		return now.Add(l.Timeout)
	}
	return now.Add(e.cfg.Timeout)
}

// Next reports where the next segment of the message (src, stag, msn)
// is expected, for a receiver that lands segments in place before
// checking them: the end of the bytes placed so far, when the message is
// in progress and those bytes are one run from its start (so nothing
// beyond is placed yet). ok is false for any other message.
func (e *Engine) Next(src Source, stag, msn uint32) (off uint32, ok bool) {
	m := e.msgs[key{src, stag}]
	if m == nil || m.done || m.msn != msn || m.got.len() != 1 {
		return 0, false
	}
	r, _ := m.got.first()
	if r.Start != 0 {
		return 0, false
	}
	return uint32(r.End), true
}

// end ends m, in progress, by its policy, as at its deadline: the record
// of the runs that arrived with deliver-partial (ok true if any did), none
// with discard. It keeps m as a tombstone for one more timeout: a
// straggler or a duplicate of this MSN must be dropped, not start the
// message again (which would invalidate what its record made valid).
func (e *Engine) end(m *message, now time.Time) (rec Record, ok bool) {
	if m.policy == DeliverPartial && m.placed > 0 {
		e.stats.Partial++
		rec, ok = m.partial(), true
	} else {
		e.stats.Expired++
	}
	m.done = true
	m.got.reset()
	m.deadline = now.Add(m.timeout)
	return rec, ok
}

// End ends the message in progress from src to stag now, as its deadline
// would: with deliver-partial it returns the record of the runs that
// arrived (ok true if any did); with discard, nothing. Its later segments
// are dropped. Its owner calls it when it knows that the source has sent
// every segment of the message it will (a source that waits for the
// target before it sends more), so that waiting out the deadline would
// only delay the record. With no message in progress it does nothing.
func (e *Engine) End(src Source, stag uint32, now time.Time) (Record, bool) {
	m := e.msgs[key{src, stag}]
	if m == nil || m.done {
		return Record{}, false
	}
	return e.end(m, now)
}

// Expire handles every message whose deadline has passed: with
// deliver-partial it emits a record of the ranges that arrived; with
// discard it drops the message unrecorded (a Reliable engine's messages
// in progress have no deadline: only the completed ones it remembers
// go, at theirs). It returns the earliest
// deadline still pending (zero if none), for the caller's timer.
func (e *Engine) Expire(now time.Time, emit func(Record)) time.Time {
	for m := e.order.head; m != nil; {
		next := m.next
		if now.Before(m.deadline) || (e.cfg.Reliable && !m.done) {
			m = next
			continue
		}
		if m.done {
			// A tombstone's time is up: only its MSN is kept, so that a
			// segment of it or of an older message — a duplicate, or a
			// source that stalled mid-message longer than two deadlines —
			// is still dropped rather than placed over whatever its
			// region holds now.
			e.retire(m)
			m = next
			continue
		}
		if rec, ok := e.end(m, now); ok {
			emit(rec)
		}
		m = next
	}
	var first time.Time
	for m := e.order.head; m != nil; m = m.next {
		if e.cfg.Reliable && !m.done {
			continue // no deadline
		}
		if d := m.deadline; first.IsZero() || d.Before(first) {
			first = d
		}
	}
	return first
}
