package qp

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/udiwarp/udiwarp/internal/snapshot"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// AsyncEventType names an asynchronous event (ibv_event_type).
type AsyncEventType uint8

const (
	// AsyncCQOverflow: a CQ was full and refused a completion; it accepts no more.
	AsyncCQOverflow AsyncEventType = iota + 1
	// AsyncSRQLimit: an SRQ fell below the armed low watermark (fires once per arming).
	AsyncSRQLimit
	// AsyncSRQOverdraft: a QP tried to take more SRQ receives than its limit;
	// the message was dropped.
	AsyncSRQOverdraft
	// AsyncRemoteError: a peer sent an error message about a message of ours.
	AsyncRemoteError
	// AsyncQPFatal: a QP entered ERROR.
	AsyncQPFatal
	// AsyncSRQSoftLimit: a QP holds more SRQ receives than its soft limit;
	// its messages are still taken (once per crossing).
	AsyncSRQSoftLimit
	// AsyncSRQPeerLimit: a source address (Source) holds as many of a
	// datagram QP's SRQ receives as its per-peer limit allows; its
	// messages are refused until it is back under (once per crossing).
	AsyncSRQPeerLimit
	// AsyncSRQTotalLimit: an SRQ's QPs hold as many receives as its total
	// limit allows; messages are refused until they are back under.
	AsyncSRQTotalLimit
	// AsyncSRQOutOfOrder: an RD QP dropped the frames a peer (Source)
	// held ahead of a gap, over its out-of-order threshold or hole limit.
	AsyncSRQOutOfOrder
)

// peerDrawn reports whether a peer's traffic raises an event of type t
// for its source, so that a flood of them (forged sources cost nothing)
// shares the remote part of the Events queue, one waiting per (QP,
// source).
func (t AsyncEventType) peerDrawn() bool {
	return t == AsyncRemoteError || t == AsyncSRQPeerLimit || t == AsyncSRQOutOfOrder
}

func (t AsyncEventType) String() string {
	switch t {
	case AsyncCQOverflow:
		return "CQ overflow"
	case AsyncSRQLimit:
		return "SRQ limit reached"
	case AsyncSRQOverdraft:
		return "SRQ per-QP limit exceeded"
	case AsyncSRQSoftLimit:
		return "SRQ per-QP soft limit exceeded"
	case AsyncSRQPeerLimit:
		return "SRQ per-peer limit reached"
	case AsyncSRQTotalLimit:
		return "SRQ total limit reached"
	case AsyncSRQOutOfOrder:
		return "SRQ out-of-order frames dropped"
	case AsyncRemoteError:
		return "remote error message"
	case AsyncQPFatal:
		return "QP fatal"
	}
	return fmt.Sprintf("async event %d", uint8(t))
}

// AsyncEvent is one asynchronous event.
type AsyncEvent struct {
	Type AsyncEventType
	CQ   *CQ
	QP   *QP
	SRQ  *SRQ
	// For AsyncRemoteError: who reported it, the error, and the MSN of the
	// message it concerns (from the echoed header, when there is one).
	// For the SRQ events of a datagram QP, Source names the peer: the
	// address over its limit (AsyncSRQPeerLimit), the peer whose frames
	// were dropped (AsyncSRQOutOfOrder), else the address holding the most
	// of the QP's receives when the QP counts per address (port 0 unless
	// it is the refused message's source), or the refused message's source.
	Source    netip.AddrPort
	SourceQPN uint32
	Code      udiwarp.ErrorCode
	MSN       uint32
}

func (e AsyncEvent) String() string {
	switch {
	case e.Type == AsyncRemoteError:
		return fmt.Sprintf("%v from %v QP %d: %v (MSN %d)", e.Type, e.Source, e.SourceQPN, e.Code, e.MSN)
	case e.QP != nil && e.Source.IsValid():
		return fmt.Sprintf("%v: QP %d, peer %v", e.Type, e.QP.num, e.Source)
	case e.QP != nil:
		return fmt.Sprintf("%v: QP %d", e.Type, e.QP.num)
	}
	return e.Type.String()
}

const (
	eventQueueLen     = 256 // the Events channel
	eventLocalReserve = 64  // of it, room remote events may not take
)

// eventBook keeps, for the Events channel, the sources of the remote
// events waiting in it, so that a flood of error messages (forged ones
// cost nothing to send) can neither crowd out the device's own events nor
// let one source fill the queue. Under mu, every send to the channel
// appends its key; the application takes events from the channel's front,
// so the oldest keys beyond the channel's length are those taken.
type eventBook struct {
	mu      sync.Mutex
	keys    [eventQueueLen + 1]eventKey // a ring: the keys of the events sent, oldest first
	head, n int
	pending map[eventKey]struct{} // remote events waiting, one per key
}

// eventKey is a remote event's source; the zero key marks a local event.
type eventKey struct {
	qp  *QP
	src netip.AddrPort
}

// raise queues an event without waiting (see Events for the rules).
func (d *Device) raise(e AsyncEvent) {
	if int(e.Type) < len(d.stats.Events) {
		d.stats.Events[e.Type].Add(1)
	}
	b := &d.ev
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.n > len(d.events) { // taken by the application
		k := b.keys[b.head]
		b.keys[b.head] = eventKey{}
		b.head = (b.head + 1) % len(b.keys)
		b.n--
		if k != (eventKey{}) {
			delete(b.pending, k)
		}
	}
	var k eventKey
	if e.Type.peerDrawn() {
		k = eventKey{e.QP, e.Source}
		if _, waiting := b.pending[k]; waiting || len(b.pending) >= eventQueueLen-eventLocalReserve {
			d.stats.RemoteEventsDropped.Add(1)
			return
		}
	}
	tail := (b.head + b.n) % len(b.keys)
	b.keys[tail] = k
	b.n++
	select {
	case d.events <- e:
		if k != (eventKey{}) {
			if b.pending == nil {
				b.pending = map[eventKey]struct{}{}
			}
			b.pending[k] = struct{}{}
		}
	default:
		b.keys[tail] = eventKey{}
		b.n--
		if k != (eventKey{}) {
			d.stats.RemoteEventsDropped.Add(1)
		} else {
			d.eventsLost.Add(1)
		}
	}
}

// Stats are a device's counters. Every datagram that arrives is counted
// once as delivered or under the reason it was dropped.
type Stats struct {
	RxDatagrams atomic.Uint64 // datagrams read from sockets
	RxDelivered atomic.Uint64 // messages placed and completed
	RxLanded    atomic.Uint64 // of those, received straight into the posted buffers
	RxMulticast atomic.Uint64 // copies delivered to multicast member QPs

	RxTruncated    atomic.Uint64 // shorter than the headers they declare
	RxTooLong      atomic.Uint64 // longer than the frame allows
	RxBadCRC       atomic.Uint64
	RxBadVersion   atomic.Uint64 // DV, RV or frame type
	RxBadHeader    atomic.Uint64 // reserved bits, queue, offsets, L flag
	RxBadOpcode    atomic.Uint64 // unknown or not valid on this QP type
	RxUnknownQP    atomic.Uint64 // no such destination QP
	RxQPState      atomic.Uint64 // destination QP not in RTR or RTS
	RxNoRecv       atomic.Uint64 // no receive posted (RQ or SRQ empty)
	RxSRQOverdraft atomic.Uint64 // a QP at its SRQ hard limit (SRQLimits.Hard)
	RxRecvTooSmall atomic.Uint64 // message longer than the posted receive
	RxRecvProt     atomic.Uint64 // posted receive names bad memory
	RxRemoteErrors atomic.Uint64 // error messages received
	RxRDFrames     atomic.Uint64 // RD frames without an RD layer on this socket
	RxBadSTag      atomic.Uint64 // Write-Record: unknown STag, stale key, or another PD
	RxAccess       atomic.Uint64 // Write-Record: region without remote-write access
	RxBounds       atomic.Uint64 // Write-Record: message outside its region
	RxMisaligned   atomic.Uint64 // atomic on a word not 8-byte aligned
	RxImmediate    atomic.Uint64 // Immediate Data messages delivered (RFC 7306)
	RxAtomics      atomic.Uint64 // atomics carried out (RFC 7306), each once
	RxWRStale      atomic.Uint64 // Write-Record: segment the engine dropped (older, duplicate, too far ahead, ...: WriteRecordStats says which)
	RxWRPlaced     atomic.Uint64 // Write-Record segments placed
	RxWRComplete   atomic.Uint64 // Write-Record messages recorded complete
	RxWRPartial    atomic.Uint64 // Write-Record messages recorded partial (at their deadline or at MaxRanges)

	// Seed 004's other limits of a shared receive queue.
	RxSRQPeerLimit  atomic.Uint64 // a source address at its per-peer limit inside a datagram QP (SRQLimits.Peer)
	RxSRQTotalLimit atomic.Uint64 // an SRQ at its total limit (SRQAttr.MaxHeld)
	// RxSRQOutOfOrder counts RD frames dropped over the out-of-order
	// threshold or the hole limit (SRQLimits.OutOfOrder, Holes): those a
	// peer held ahead of a gap and the one that would have added to them.
	RxSRQOutOfOrder atomic.Uint64

	// RD (reliable datagram) QPs.
	RDPeers          atomic.Uint64 // peer states created
	RDPeersReclaimed atomic.Uint64 // peer states reclaimed idle or at the cap
	RDPeerRestarts   atomic.Uint64 // sessions ended because the peer reopened (a new epoch) or had no state for ours (its Challenge)
	RDPeerFailures   atomic.Uint64 // peers given up on (retry limit)
	RDRejected       atomic.Uint64 // frames without valid state or token (answered with a Challenge at most)
	RDRefused        atomic.Uint64 // validated first contacts refused at the peer cap
	RDChallenges     atomic.Uint64 // Challenges sent
	RDDataSent       atomic.Uint64 // Data frames sent, retransmissions included
	RDRetransmits    atomic.Uint64
	RDAcksSent       atomic.Uint64 // standalone acks (others ride on Data)
	RDControlSent    atomic.Uint64 // frames without payload sent
	RDBadAcks        atomic.Uint64 // acks naming packets never sent
	RDBuffered       atomic.Uint64 // Data frames held ahead of a gap
	RDDuplicates     atomic.Uint64
	RDBeyondWindow   atomic.Uint64
	RDNotReady       atomic.Uint64 // Sends refused for want of a receive (receiver not ready)
	RDWritePlaced    atomic.Uint64 // RDMA Write and Read Response segments placed
	RDReadsServed    atomic.Uint64 // Read Requests answered
	RDReadsRefused   atomic.Uint64 // Read Requests over IRD
	RDOverBudget     atomic.Uint64 // Data frames ahead of a gap dropped over the peer's or the QP's byte budget
	RDAddrLimited    atomic.Uint64 // validated first contacts refused over the per-address peer limit
	RDWindowProbes   atomic.Uint64 // frames sent into a zero window to probe it
	RDReadsFlushed   atomic.Uint64 // Read Responses cut short because their region was deregistered

	// Timers counts the runs of the device timer (Write-Record deadlines,
	// RD and RC timers).
	Timers atomic.Uint64

	// RC (TCP + MPA) QPs.
	RCFPDUsSent          atomic.Uint64
	RCFPDUsReceived      atomic.Uint64
	RCTerminatesSent     atomic.Uint64
	RCTerminatesReceived atomic.Uint64
	RCReadsOverIRD       atomic.Uint64
	RCConnectionsLost    atomic.Uint64
	// RCRecvWaits counts Sends that found no receive on a WaitForRecv
	// connection and waited for one (reading stopped meanwhile).
	RCRecvWaits   atomic.Uint64
	RCBadRequests atomic.Uint64 // MPA Requests that were not
	// RCHandshakesShed counts MPA exchanges in progress an RCListener
	// ended to admit a newer connection (its source's, or all sources',
	// bound of half-open exchanges was reached).
	RCHandshakesShed atomic.Uint64
	// RCSocketFull counts the times an RC send found its socket full and
	// held the rest back; RCPollerSends the times the device's poller,
	// woken by room in a socket, sent what was held back (event polling
	// only: a busy-polled device sends it from CQ.Poll).
	RCSocketFull, RCPollerSends atomic.Uint64

	// Bytes on the wire (UDP payloads and TCP stream octets), both ways.
	RxBytes, TxBytes atomic.Uint64
	// Completions counts the work completions the device's CQs took, by
	// Status.
	Completions [16]atomic.Uint64

	TxDatagrams atomic.Uint64
	TxDirect    atomic.Uint64 // sent in the poster's goroutine
	TxGSO       atomic.Uint64 // sendmsg calls that carried several datagrams (UDP GSO)
	TxQueued    atomic.Uint64 // handed to the datamover
	TxParked    atomic.Uint64 // times a socket was full
	TxErrors    atomic.Uint64 // sendmsg failures other than a full socket
	TxImpaired  atomic.Uint64 // dropped, duplicated, delayed or corrupted by the impairment layer
	RxImpaired  atomic.Uint64 // the same on the way in (DeviceConfig.ImpairRx; RxDatagrams counts what the stack saw after it)
	// TxRepliesWithheld counts error messages and RD Challenges not sent:
	// larger than what the datagram that drew them had left, or that
	// datagram was addressed to a multicast or broadcast address
	// (docs/wire.md §6.2, §11.2).
	TxRepliesWithheld atomic.Uint64
	EventsLost        atomic.Uint64 // the device's own events that found the Events channel full
	// RemoteEventsDropped counts error messages from peers not queued as
	// events: their source already had one waiting, or the remote share
	// of the queue was full (Device.Events).
	RemoteEventsDropped atomic.Uint64
	// Events counts the asynchronous events raised, by AsyncEventType,
	// whether or not they were queued.
	Events [16]atomic.Uint64
	// SRQRecouped counts the reserved receives recouped from idle QPs
	// (SRQLimits.Reserve, SRQAttr.Recoup).
	SRQRecouped atomic.Uint64
	// CQDropped counts the completions CQs refused after overflowing
	// (the sum of CQ.Dropped over the device's CQs).
	CQDropped atomic.Uint64

	// Protected segments (DeviceConfig.Protect, package protect): what
	// was sealed and opened, the keys installed, and every datagram
	// refused before the stack saw it, by reason.
	ProtSealed         atomic.Uint64 // datagrams sealed
	ProtOpened         atomic.Uint64 // datagrams opened (authenticated, replay-checked)
	ProtContacts       atomic.Uint64 // Hellos and Challenges sent with an X25519 share
	ProtSessions       atomic.Uint64 // keys installed from RD contacts
	ProtPSKPeers       atomic.Uint64 // receive keys installed from pre-shared keys
	ProtKeyUpdates     atomic.Uint64 // receive keys moved to their next generation
	ProtAuthFailed     atomic.Uint64 // refused: the tag did not verify (forged, changed, wrong keys)
	ProtReplayed       atomic.Uint64 // refused: packet number seen before or older than the window
	ProtNoKey          atomic.Uint64 // refused: a key ID not held and not derivable
	ProtClear          atomic.Uint64 // refused: an unprotected frame
	ProtBadEnvelope    atomic.Uint64 // refused: malformed envelope
	ProtModeMismatch   atomic.Uint64 // refused: an envelope of another mode
	ProtUnsolicited    atomic.Uint64 // refused: a Challenge for no Hello of ours
	ProtReflected      atomic.Uint64 // refused: our own pre-shared-key datagram sent back
	ProtContactLimited atomic.Uint64 // refused: contact work over ContactRate
	ProtPeersFull      atomic.Uint64 // refused: a new peer's keys over MaxPeers
	ProtWrongSource    atomic.Uint64 // refused: keys used from another address than their peer's
	ProtRefusesSent    atomic.Uint64 // Refuse answers to contacts of another mode
	ProtRefused        atomic.Uint64 // Refuse answers received that ended a contact of ours
	ProtTxNoKey        atomic.Uint64 // datagrams not sent for want of a key

	lastTxErrno atomic.Uint32
}

// LastSendError returns the errno of the latest failed sendmsg, or nil.
func (s *Stats) LastSendError() error {
	if e := syscall.Errno(s.lastTxErrno.Load()); e != 0 {
		return e
	}
	return nil
}

// Closed reports whether Close has been called: the counters of a closed
// device no longer change.
func (d *Device) Closed() bool { return d.closed.Load() }

// Stats returns the device's counters.
//go:generate go run ../internal/genstats -in events.go -type Stats -out stats_snapshot.go

// Snapshot reads every counter once into plain integers, which print as
// numbers (fmt.Println(dev.Stats().Snapshot().RxNoRecv)); the counters
// are atomics, and a Stats field printed as it is shows its insides.
func (s *Stats) Snapshot() StatsSnapshot {
	var out StatsSnapshot
	snapshot.Fill(&out, s)
	return out
}

func (d *Device) Stats() *Stats {
	d.stats.EventsLost.Store(d.eventsLost.Load())
	return &d.stats
}

// countRx files a parse failure under its reason.
func (s *Stats) countRx(err error) {
	fe, _ := err.(*udiwarp.FieldError)
	var sentinel error
	if fe != nil {
		sentinel = fe.Err
	}
	switch sentinel {
	case udiwarp.ErrTruncated:
		s.RxTruncated.Add(1)
	case udiwarp.ErrTooLong:
		s.RxTooLong.Add(1)
	case udiwarp.ErrCRC:
		s.RxBadCRC.Add(1)
	case udiwarp.ErrVersion, udiwarp.ErrFrameType:
		s.RxBadVersion.Add(1)
	case udiwarp.ErrOpcode:
		s.RxBadOpcode.Add(1)
	default:
		s.RxBadHeader.Add(1)
	}
}

// WriteRecordStats sums the Write-Record target engines of the device's
// QPs (every counter of writerecord.Stats) and the messages in progress
// now.
func (d *Device) WriteRecordStats() (st writerecord.Stats, inProgress int) {
	for i := range d.qps {
		q := d.qps[i].Load()
		if q == nil {
			continue
		}
		q.wrMu.Lock()
		if q.wr != nil {
			s := q.wr.Stats()
			st.Completed += s.Completed
			st.Partial += s.Partial
			st.Expired += s.Expired
			st.Superseded += s.Superseded
			st.Stale += s.Stale
			st.Evicted += s.Evicted
			st.Duplicate += s.Duplicate
			st.FarAhead += s.FarAhead
			st.Mismatch += s.Mismatch
			st.Displaced += s.Displaced
			st.Fragmented += s.Fragmented
			st.Forgotten += s.Forgotten
			inProgress += q.wr.InProgress()
		}
		q.wrMu.Unlock()
	}
	return st, inProgress
}

// Levels is what a device holds now, where Stats counts what happened:
// the gauges beside the counters.
type Levels struct {
	RDPeers       int // peer states of its RD QPs
	RCConnections int // its RC QPs with a live connection
	SRQReceives   int // receives posted to its SRQs and not yet taken
	SRQCapacity   int // what its SRQs hold when full
	SRQHeld       int // receives its SRQs' QPs hold: taken, not yet polled
}

// Levels reads the device's gauges.
func (d *Device) Levels() Levels {
	var l Levels
	for i := range d.qps {
		q := d.qps[i].Load()
		if q == nil {
			continue
		}
		if r := q.rd; r != nil {
			r.mu.Lock()
			l.RDPeers += r.ep.Peers()
			r.mu.Unlock()
		}
		if c := q.rc.Load(); c != nil {
			c.mu.Lock()
			if !c.dead {
				l.RCConnections++
			}
			c.mu.Unlock()
		}
	}
	d.srqMu.Lock()
	keep := d.srqs[:0]
	for _, w := range d.srqs {
		if s := w.Value(); s != nil {
			keep = append(keep, w)
			posted, capacity, held := s.level()
			l.SRQReceives += posted
			l.SRQCapacity += capacity
			l.SRQHeld += held
		}
	}
	clear(d.srqs[len(keep):])
	d.srqs = keep
	d.srqMu.Unlock()
	return l
}

// ValidityRanges returns the disjoint valid ranges held by every validity
// map of the device's regions.
func (d *Device) ValidityRanges() int {
	n := 0
	for i := range d.mrs.slots {
		if m := d.mrs.slots[i].Load(); m != nil {
			if vm := m.vmap.Load(); vm != nil {
				n += vm.Ranges()
			}
		}
	}
	return n
}
