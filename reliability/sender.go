package reliability

import (
	"errors"
	"time"
)

// Config tunes one peer's reliability. The zero value is usable.
type Config struct {
	// Window is the most packets in flight to the peer and the most a
	// receiver buffers beyond its cumulative point; a power of two, at
	// most 32768. Default 1024.
	Window int
	// InitialRTT stands in for the RTT before the first sample. Default
	// 5 ms.
	InitialRTT time.Duration
	// MaxAckDelay is how long a receiver may hold an ack (it acks every
	// second packet at once). Default 1 ms.
	MaxAckDelay time.Duration
	// Granularity floors the RTT variation term of the timeout and the
	// time threshold of loss detection. Default 1 ms (RFC 9002's
	// kGranularity).
	Granularity time.Duration
	// MaxRTO caps the retransmission timeout after backoff. Default 1 s.
	MaxRTO time.Duration
	// MaxRetries is how many timeouts one packet may take (each followed
	// by a retransmission, the timeout doubling) before the peer is
	// declared unreachable. Default 10. It also bounds the zero-window
	// probes a peer that keeps its window shut draws (Sender.Probe).
	MaxRetries int
	// RNRDelay is the first wait after a receiver-not-ready answer; it
	// doubles on each one in a row, up to MaxRTO. Default 1 ms.
	RNRDelay time.Duration
	// RNRRetries is how many refusals in a row (receiver-not-ready
	// answers to the packet at the cumulative point, each followed by a
	// wait and a retransmission) are borne before giving up; negative
	// means without limit. Default 7.
	RNRRetries int
	// FirstSeq is the first sequence number of a session, the same on
	// both sides (tests use it to cross the 2^32 wrap). Default 0.
	FirstSeq uint32
	// Congestion selects the sender's congestion controller and pacing:
	// BBR (the zero value), NewReno, or none (only Window limits what is
	// in flight). See congestion.go.
	Congestion Congestion
}

// Defaults.
const (
	DefaultWindow      = 1024
	DefaultInitialRTT  = 5 * time.Millisecond
	DefaultMaxAckDelay = time.Millisecond
	DefaultGranularity = time.Millisecond
	DefaultMaxRTO      = time.Second
	DefaultMaxRetries  = 10
	DefaultRNRDelay    = time.Millisecond
	DefaultRNRRetries  = 7
	// PacketThreshold: a packet this many behind the largest acked is
	// lost (RFC 9002 kPacketThreshold).
	PacketThreshold = 3
)

// Fill returns c with every zero field at its default.
func (c Config) Fill() Config {
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	c.Window = min(c.Window, 1<<15)
	for c.Window&(c.Window-1) != 0 {
		c.Window &= c.Window - 1 // down to a power of two
	}
	if c.InitialRTT <= 0 {
		c.InitialRTT = DefaultInitialRTT
	}
	if c.MaxAckDelay <= 0 {
		c.MaxAckDelay = DefaultMaxAckDelay
	}
	if c.Granularity <= 0 {
		c.Granularity = DefaultGranularity
	}
	if c.MaxRTO <= 0 {
		c.MaxRTO = DefaultMaxRTO
	}
	if c.MaxRetries <= 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.RNRDelay <= 0 {
		c.RNRDelay = DefaultRNRDelay
	}
	if c.RNRRetries == 0 {
		c.RNRRetries = DefaultRNRRetries
	}
	return c
}

// Errors of a sender.
var (
	// ErrRetryExceeded: a packet went unacknowledged through every retry.
	ErrRetryExceeded = errors.New("reliability: retry limit exceeded")
	// ErrRNRRetryExceeded: the receiver stayed not ready through every retry.
	ErrRNRRetryExceeded = errors.New("reliability: receiver-not-ready retry limit exceeded")
	// ErrAckUnsent: an ack names a packet never sent (ignored).
	ErrAckUnsent = errors.New("reliability: ack for a packet not sent")
)

type slot[P any] struct {
	payload P
	sentAt  time.Time
	retries uint16
	pending bool // sent and not yet acked
	// sacked: a selective ack covered it, so it is not sent again, but it
	// is not acknowledged until the cumulative point passes it: the
	// receiver may still refuse it (receiver not ready) and drop it, or
	// fail it (an error is reported only for packets before the
	// cumulative point). Its payload stays until then (RFC 2018 §8).
	sacked bool
	resent bool // retransmitted at least once: no RTT sample
	// byTime, byCount: its latest retransmission was for a loss the
	// time threshold, or the packet threshold, declared.
	byTime, byCount bool
	// after is the first sequence number sent after this packet's latest
	// transmission: the packet threshold counts acks from there, so that
	// a retransmission is not declared lost again by the same acks (QUIC
	// gives retransmissions new numbers instead).
	after uint32
	// size is the packet's bytes on the wire; appLimited, delivered,
	// deliveredAt and firstSentAt are the delivery-rate state when it was
	// last sent (draft-cheng-iccrg-delivery-rate-estimation §3.2): the
	// flow's delivered count, when it last moved and when the packet
	// that moved it was sent (times in nanoseconds since the sender's
	// first packet).
	size        int32
	appLimited  bool
	delivered   int64
	deliveredAt int64
	firstSentAt int64
	// txInflight and lostBefore are the flow's bytes in flight (this
	// packet's included) and bytes declared lost when it was last sent:
	// if it is lost, what the flow lost since, over what it had in
	// flight, is the loss rate of its flight (draft-ietf-ccwg-bbr
	// §5.5.10, tx_in_flight and lost).
	txInflight int
	lostBefore int64
}

// Sender is the sending half of one peer's reliability: it numbers
// packets, keeps each until acknowledged, detects loss by packet and time
// thresholds (RFC 9002 §6.1) and by timeout with exponential backoff, and
// keeps within the peer's window. P is what the caller needs to send a
// packet again (for a QP: where its bytes live in registered memory).
// Not safe for concurrent use.
type Sender[P any] struct {
	rs       rateSample // OnAck's, kept here so that it does not escape
	cfg      Config
	ring     []slot[P]
	mask     uint32
	una      uint32 // oldest not cumulatively acked
	next     uint32 // next to assign
	limit    uint32 // the peer's window ends before this sequence number
	rtt      RTT
	pto      int // timeouts in a row
	largest  uint32
	anyAcked bool
	// truncatedAt is when the last ack with MaxAckRanges ranges came:
	// the receiver may hold packets above its last range that it did
	// not report, so a packet sent before then says nothing of the RTT
	// when it is acked at last.
	truncatedAt time.Time
	lastSent    time.Time
	lossTime    time.Time
	rnrUntil    time.Time
	rnrWait     bool // the packet at una waits for rnrUntil
	rnrCount    int
	// Zero window: when the peer's window is shut with nothing in
	// flight, the next probe (one packet past the window) goes at probeAt;
	// probes counts them until the window opens.
	probeAt time.Time
	probes  int
	lost    int // bytes detectLost found lost, for the ack's rate sample
	// Congestion control: the controller (nil for CongestionNone), the
	// flow's bytes in flight and delivery counters it reads, the
	// delivery-rate clock (deliveredAt, firstSentAt, since base), and
	// the pacing clock: paceAt is when the bytes pushed so far have all
	// left at the pacing rate (unpace restores it for Unpush).
	cc          controller
	flow        flowState
	base        time.Time
	deliveredAt int64
	firstSentAt int64
	paceAt      time.Time
	unpace      time.Time
	// reoMult widens the time threshold after needless retransmissions
	// (lossDelay); reoAge counts the time-threshold losses since it last
	// grew. pktThresh is the packet threshold, raised the same way, and
	// pktAge its count.
	reoMult, reoAge   int
	pktThresh, pktAge uint32
	// Retransmits counts retransmissions: LostByCount of them for
	// packets the packet threshold declared lost, LostByTime the time
	// threshold, the rest probe timeouts (two a timeout). Spurious
	// counts the time-threshold ones that proved needless (the
	// original's ack came); Unsent acks for packets already acked or
	// never sent.
	Retransmits, LostByCount, LostByTime, Spurious, Unsent uint64
}

// Adapting the loss thresholds (RACK's reordering window, RFC 8985
// §6.2, and the reordering degree Linux TCP learns). A packet is declared
// lost when PacketThreshold packets sent after it were acked, or when it
// is 9/8 of the RTT old. But packets sent from two CPUs into a veth (or
// any multi-queue path) can swap places by microseconds, and on a host
// whose receiver is descheduled now and then the ack, not the packet, is
// late: through the real bottleneck beside TCP, RD retransmitted 1,288
// packets by the packet threshold where the queue dropped 210. A
// retransmission was needless when the packet's ack comes sooner after
// it than a round trip could bring the retransmission's own: the larger
// of the minimum RTT and half the smoothed one (the retransmission waits
// in the same queue). Each such ack for a packet-threshold loss doubles
// the packet threshold, up to maxPktThresh; for a time-threshold loss it
// widens the time threshold by a quarter of the RTT, up to maxReoMult
// quarters. Every reoPersist losses declared the same way without another
// needless one narrow it a step again.
const (
	maxReoMult   = 8
	maxPktThresh = 64
	reoPersist   = 16
)

// thresh is the packet threshold in force.
func (s *Sender[P]) thresh() uint32 { return max(s.pktThresh, PacketThreshold) }

// initialRing is the ring a sender or receiver starts with; it doubles,
// up to the window, when more packets are in flight or held, so a peer
// that exchanges little costs little.
const initialRing = 8

// NewSender returns a Sender. Its ring is made by the first Push (a peer
// we never send to needs none).
func NewSender[P any](cfg Config) *Sender[P] {
	cfg = cfg.Fill()
	s := &Sender[P]{cfg: cfg, una: cfg.FirstSeq, next: cfg.FirstSeq, limit: cfg.FirstSeq + uint32(cfg.Window)}
	s.flow.mss = DefaultMSS
	s.cc = newController(cfg.Congestion, &s.flow, &s.rtt, cfg)
	return s
}

// grow doubles the ring (or makes the first), keeping every packet at its
// place by sequence.
func (s *Sender[P]) grow() {
	n := 2 * len(s.ring)
	if n == 0 {
		n = min(initialRing, s.cfg.Window)
	}
	ring := make([]slot[P], n)
	mask := uint32(len(ring) - 1)
	for seq := s.una; Before(seq, s.next); seq++ {
		ring[seq&mask] = s.ring[seq&s.mask]
	}
	s.ring, s.mask = ring, mask
}

// Compact lets go of the ring when nothing is in flight: a sender that
// has been idle a while keeps its sequence numbers, RTT and window, and
// the next Push makes a ring again. It reports whether there was one.
func (s *Sender[P]) Compact() bool {
	if s.una != s.next || s.ring == nil {
		return false
	}
	s.ring, s.mask = nil, 0
	return true
}

// Slots returns the size of the ring (zero until the first Push, and
// after Compact).
func (s *Sender[P]) Slots() int { return len(s.ring) }

// Config returns the sender's configuration, defaults filled.
func (s *Sender[P]) Config() Config { return s.cfg }

// RTT returns the sender's estimate of the peer's round-trip time.
func (s *Sender[P]) RTT() *RTT { return &s.rtt }

// Next returns the sequence number the next packet will have; the
// packets in flight are those from Next()-InFlight() up to it.
func (s *Sender[P]) Next() uint32 { return s.next }

// Find returns the packet in flight whose sequence number ends in the 16
// bits low (the window is at most 2^15, so there is at most one), and
// whether it went only once (never retransmitted).
func (s *Sender[P]) Find(low uint16) (seq uint32, once, ok bool) {
	seq = s.una + uint32(low-uint16(s.una))
	if !Before(seq, s.next) {
		return 0, false, false
	}
	return seq, !s.ring[seq&s.mask].resent, true
}

// InFlight returns how many packets are sent and not cumulatively acked.
func (s *Sender[P]) InFlight() int { return int(s.next - s.una) }

// CanSend reports whether the windows admit another packet now: the
// peer's (packets) and the congestion window (bytes in flight). Pacing
// is apart: SendAt says when the packet may leave.
func (s *Sender[P]) CanSend(now time.Time) bool {
	return s.next-s.una < uint32(s.cfg.Window) && Before(s.next, s.limit) && !now.Before(s.rnrUntil) &&
		(s.cc == nil || s.flow.inflight < s.cc.cwnd())
}

// Push numbers a new packet of size bytes on the wire, sent at now, and
// returns its sequence number. The caller checked CanSend (and SendAt).
func (s *Sender[P]) Push(p P, size int, now time.Time) uint32 {
	seq := s.next
	if seq-s.una >= uint32(len(s.ring)) {
		s.grow()
	}
	s.next++
	sl := &s.ring[seq&s.mask]
	*sl = slot[P]{payload: p, sentAt: now, pending: true, after: seq + 1}
	s.unpace = s.paceAt
	s.sent(sl, size, now)
	s.flow.inflight += int(sl.size)
	sl.txInflight = s.flow.inflight
	s.lastSent = now
	return seq
}

// sent accounts for a transmission of sl (new or again) at now: bytes in
// flight, the delivery-rate state (draft-cheng §3.2), the pacing clock.
func (s *Sender[P]) sent(sl *slot[P], size int, now time.Time) {
	size = max(size, 1)
	if s.base.IsZero() {
		s.base = now
	}
	t := int64(now.Sub(s.base))
	if s.flow.inflight == 0 {
		// Nothing in flight: the delivery rate's intervals start now.
		s.firstSentAt, s.deliveredAt = t, t
	}
	sl.size = int32(size)
	sl.delivered, sl.deliveredAt, sl.firstSentAt = s.flow.delivered, s.deliveredAt, s.firstSentAt
	sl.appLimited = s.flow.appLimited != 0
	sl.txInflight, sl.lostBefore = s.flow.inflight, s.flow.lost
	s.flow.mss = max(s.flow.mss, min(size, MaxMSS))
	s.flow.frame = max(s.flow.frame, size)
	if s.cc == nil {
		return
	}
	s.cc.onSend(now, size)
	if rate := s.cc.pacingRate(); rate > 0 {
		s.paceAt = later(s.paceAt, now).Add(time.Duration(float64(size) / rate * 1e9))
	}
}

// SendAt returns when the pacing rate lets the next packet leave: zero
// when it may go now (and always without a controller, CongestionNone).
// Pacing lets a burst of Quantum bytes go at once, so a caller may send
// a train of segments together; it then waits for SendAt before the next.
func (s *Sender[P]) SendAt(now time.Time) time.Time {
	if s.cc == nil || s.paceAt.IsZero() {
		return time.Time{}
	}
	rate := s.cc.pacingRate()
	if rate <= 0 {
		return time.Time{}
	}
	at := s.paceAt.Add(-time.Duration(float64(s.Quantum()) / rate * 1e9))
	if !at.After(now) {
		return time.Time{}
	}
	return at
}

// Quantum returns the burst pacing allows, in bytes: about a millisecond
// at the pacing rate, but no more than a quarter of the minimum RTT's
// worth (a longer burst would be the queue itself on a short path), at
// least two packets and at most 64 KiB. With CongestionNone it is 64 KiB.
func (s *Sender[P]) Quantum() int {
	if s.cc == nil {
		return maxQuantum
	}
	return quantum(s.cc.pacingRate(), s.cc.burstRTT(), s.flow.mss, s.flow.frame)
}

// SetAppLimited tells the sender its application has nothing more to
// send now (the caller's queue to the peer is empty while the windows
// are open): the delivery-rate samples until what is in flight is acked
// say so, and BBR does not read them as the path's limit
// (draft-cheng-iccrg-delivery-rate-estimation §3.4).
func (s *Sender[P]) SetAppLimited() {
	if s.cc != nil && s.flow.inflight < s.cc.cwnd() {
		s.flow.appLimited = max(s.flow.delivered+int64(s.flow.inflight), 1)
	}
}

// CongestionWindow returns the congestion window in bytes (0 with
// CongestionNone).
func (s *Sender[P]) CongestionWindow() int {
	if s.cc == nil {
		return 0
	}
	return s.cc.cwnd()
}

// PacingRate returns the pacing rate in bytes per second (0: not paced).
func (s *Sender[P]) PacingRate() float64 {
	if s.cc == nil {
		return 0
	}
	return s.cc.pacingRate()
}

// BottleneckBandwidth returns the controller's estimate of the path's
// bandwidth in bytes per second: BBR's windowed maximum delivery rate;
// for NewReno the latest delivery-rate sample; 0 with CongestionNone.
func (s *Sender[P]) BottleneckBandwidth() float64 {
	if s.cc == nil {
		return 0
	}
	return s.cc.bandwidth()
}

// MinRTT returns the path's round-trip propagation time as the
// controller sees it (BBR's ten-second windowed minimum; otherwise the
// smallest RTT sample).
func (s *Sender[P]) MinRTT() time.Duration {
	if s.cc == nil {
		return s.rtt.Min()
	}
	return s.cc.minRTT()
}

// BytesInFlight returns the bytes sent and neither acked nor selectively
// acked.
func (s *Sender[P]) BytesInFlight() int { return s.flow.inflight }

// CongestionMode names the controller's state ("startup", "drain",
// "probe-bw", "probe-rtt" for BBR, "compete" while BBR competes with a
// loss-based flow; "slow-start", "congestion-avoidance" for NewReno;
// "" otherwise), for metrics and tests.
func (s *Sender[P]) CongestionMode() string {
	switch c := s.cc.(type) {
	case *bbr:
		if c.compete {
			return "compete"
		}
		return c.mode.String()
	case *newReno:
		if c.window < c.ssthresh {
			return "slow-start"
		}
		return "congestion-avoidance"
	}
	return ""
}

// Oldest returns the oldest packet still waiting for its ack.
func (s *Sender[P]) Oldest() (uint32, *P, bool) {
	for seq := s.una; Before(seq, s.next); seq++ {
		if sl := &s.ring[seq&s.mask]; sl.pending {
			return seq, &sl.payload, true
		}
	}
	return 0, nil, false
}

// Each calls f on every packet not yet acknowledged, oldest first.
func (s *Sender[P]) Each(f func(seq uint32, p *P)) {
	for seq := s.una; Before(seq, s.next); seq++ {
		if sl := &s.ring[seq&s.mask]; sl.pending || sl.sacked {
			f(seq, &sl.payload)
		}
	}
}

// OnAck applies an ack from the peer: acked is called once per packet
// when the cumulative point passes it, in sequence order; a packet only
// selectively acked is not sent again, but is acknowledged only then. window is the peer's advertised window and rnr its
// receiver-not-ready flag, which refuses the packet at the cumulative
// point. Packets the ack shows lost are retransmitted through resend. An
// ack naming a packet never sent changes nothing and returns
// ErrAckUnsent.
func (s *Sender[P]) OnAck(a *AckBlock, window uint16, rnr bool, now time.Time,
	acked func(seq uint32, p *P), resend func(seq uint32, p *P)) error {
	cum := a.Cumulative
	if Before(cum, s.una) || Before(s.next, cum) {
		if Before(cum, s.una) && Before(s.una-cum, 1<<16) {
			return nil // an old ack, reordered: nothing new
		}
		s.Unsent++
		return ErrAckUnsent
	}
	for _, r := range a.Ranges {
		if !Before(cum, r.Start) || Before(s.next, r.Start+r.Len) {
			s.Unsent++
			return ErrAckUnsent
		}
	}
	// The RTT sample comes from the newest packet this ack acknowledges,
	// if it was sent only once (Karn).
	var newest uint32
	var haveNewest, sample bool
	var sampleAt time.Time
	// The sample lives in the sender: handed to the controller (an
	// interface), a local would escape, an allocation per ack.
	rs := &s.rs
	*rs = rateSample{priorInflight: s.flow.inflight}
	var rsSet bool
	var rsPriorAt, rsSendElapsed int64
	t := int64(now.Sub(s.base))
	note := func(seq uint32, cumulative bool) {
		sl := &s.ring[seq&s.mask]
		if sl.pending {
			sl.pending = false
			if (sl.byTime || sl.byCount) && now.Sub(sl.sentAt) < max(s.rtt.Min(), s.rtt.Smoothed(s.cfg.InitialRTT)/2) {
				// Acked sooner after its retransmission than its round
				// trip: the first transmission's ack. Needless.
				s.Spurious++
				if sl.byTime {
					s.reoMult, s.reoAge = min(s.reoMult+1, maxReoMult), 0
				} else {
					s.pktThresh, s.pktAge = min(2*s.thresh(), maxPktThresh), 0
				}
				sl.byTime, sl.byCount = false, false
			}
			if !s.anyAcked || Before(s.largest, seq) {
				s.largest, s.anyAcked = seq, true
			}
			if !haveNewest || Before(newest, seq) {
				newest, haveNewest, sample, sampleAt = seq, true, !sl.resent, sl.sentAt
			}
			// Delivered: the rate sample takes the state of the packet
			// acked that was sent last (draft-cheng §3.3).
			size := int(sl.size)
			s.flow.inflight -= size
			s.flow.delivered += int64(size)
			s.deliveredAt = t
			rs.acked += size
			if !rsSet || sl.delivered > rs.priorDelivered || (sl.delivered == rs.priorDelivered && sl.sentAt.After(rs.newestSentAt)) {
				rsSet = true
				rs.priorDelivered, rsPriorAt, rs.appLimited = sl.delivered, sl.deliveredAt, sl.appLimited
				rsSendElapsed = int64(sl.sentAt.Sub(s.base)) - sl.firstSentAt
				s.firstSentAt = int64(sl.sentAt.Sub(s.base))
				rs.newestSentAt = sl.sentAt
			}
		} else if !sl.sacked {
			return
		}
		if !cumulative {
			sl.sacked = true
			return
		}
		sl.sacked = false
		acked(seq, &sl.payload)
		var zero P
		sl.payload = zero
	}
	progressed := Before(s.una, cum)
	for seq := s.una; Before(seq, cum); seq++ {
		note(seq, true)
	}
	s.una = cum
	if Before(s.una, s.next) && s.ring[s.una&s.mask].sacked {
		sl := &s.ring[s.una&s.mask]
		// Selectively acked before, not delivered now: the receiver
		// dropped it (it refused it once it was in order). It goes again.
		sl.sacked, sl.pending = false, true
		s.flow.inflight += int(sl.size)
	}
	for _, r := range a.Ranges {
		for seq := r.Start; Before(seq, r.Start+r.Len); seq++ {
			note(seq, false)
		}
	}
	if sample && !sampleAt.After(s.truncatedAt) {
		// Sent before a truncated ack: it may have arrived long before
		// this ack reports it (RFC 9002 §5.1 samples only a newly
		// acknowledged largest packet; a receiver here reports its
		// lowest ranges, not its largest, so the sender tells which
		// acks may have left the newest arrivals out).
		sample = false
	}
	if len(a.Ranges) >= MaxAckRanges {
		s.truncatedAt = now
	}
	if sample {
		rs.rtt = max(now.Sub(sampleAt), time.Microsecond)
		s.rtt.Sample(now.Sub(sampleAt), time.Duration(a.Delay)*time.Microsecond)
	}
	if rsSet {
		// The rate: what was delivered since the newest packet acked was
		// sent, over the longer of its send and ack intervals; shorter
		// than the minimum RTT, it would overstate the rate (§3.3).
		if s.flow.appLimited != 0 && s.flow.delivered > s.flow.appLimited {
			s.flow.appLimited = 0
		}
		rs.delivered = s.flow.delivered - rs.priorDelivered
		rs.interval = time.Duration(max(rsSendElapsed, s.deliveredAt-rsPriorAt))
		if rs.interval > 0 && rs.interval >= s.rtt.Min() {
			rs.rate = float64(rs.delivered) / rs.interval.Seconds()
		}
	}
	if progressed || sample {
		s.pto = 0
	}
	s.limit = cum + uint32(window)
	switch {
	case Before(s.next, s.limit): // the window is open
		s.probeAt, s.probes = time.Time{}, 0
	case s.una == s.next && s.probeAt.IsZero():
		// Shut, and nothing in flight that could bring a new window: probe
		// it after a probe timeout, backed off per probe.
		s.probeAt = now.Add(min(s.PTO()<<min(s.probes, 30), s.cfg.MaxRTO))
	}
	if progressed {
		// The receiver took something: its wait starts over.
		s.rnrCount, s.rnrWait, s.rnrUntil = 0, false, time.Time{}
	}
	// A refusal counts once. While the sender waits, the refused packet
	// has not gone again, so a receiver-not-ready ack then answers a copy
	// sent before the wait began (the packets in flight behind a refused
	// one each draw an ack at the same cumulative point): the same
	// refusal, not another. Counting those would spend the whole budget
	// on one refusal before the backoff ever ran.
	if rnr && Before(cum, s.next) && !s.rnrWait {
		if s.cfg.RNRRetries >= 0 && s.rnrCount >= s.cfg.RNRRetries {
			return ErrRNRRetryExceeded
		}
		// The refused packet goes again when the wait is over (OnTimer).
		s.rnrUntil = now.Add(min(s.cfg.RNRDelay<<min(s.rnrCount, 20), s.cfg.MaxRTO))
		s.rnrWait = true
		s.rnrCount++
	}
	s.lost = 0
	err := s.detectLost(now, resend)
	if s.cc != nil {
		rs.lost, rs.inflight = s.lost, s.flow.inflight
		s.cc.onAck(now, rs)
	}
	return err
}

// lossDelay is the time threshold: 9/8 of the larger of the smoothed and
// the latest RTT, floored at the granularity.
func (s *Sender[P]) lossDelay() time.Duration {
	rtt := max(s.rtt.Smoothed(s.cfg.InitialRTT), s.rtt.Latest())
	return max(rtt*9/8+rtt*time.Duration(s.reoMult)/4, s.cfg.Granularity)
}

// detectLost retransmits the packets before the largest acked that are
// PacketThreshold behind it or older than the loss delay, and notes when
// the next one would be.
func (s *Sender[P]) detectLost(now time.Time, resend func(uint32, *P)) error {
	s.lossTime = time.Time{}
	if !s.anyAcked {
		return nil
	}
	delay := s.lossDelay()
	for seq := s.una; Before(seq, s.largest); seq++ {
		sl := &s.ring[seq&s.mask]
		if !sl.pending || (s.rnrWait && seq == s.una) {
			continue
		}
		if byCount := !Before(s.largest, sl.after+s.thresh()-1); byCount || !now.Before(sl.sentAt.Add(delay)) {
			// Lost: the controller hears of it before it goes again.
			s.lost += int(sl.size)
			s.flow.lost += int64(sl.size)
			if s.cc != nil {
				s.cc.onLoss(now, lostPacket{size: int(sl.size), sentAt: sl.sentAt, txInflight: sl.txInflight, lostBefore: sl.lostBefore, byTime: !byCount})
			}
			switch {
			case byCount:
				s.LostByCount++
				if s.pktThresh > PacketThreshold {
					if s.pktAge++; s.pktAge >= reoPersist {
						s.pktThresh, s.pktAge = max(s.pktThresh/2, PacketThreshold), 0
					}
				}
			default:
				s.LostByTime++
				if s.reoMult > 0 {
					if s.reoAge++; s.reoAge >= reoPersist {
						s.reoMult, s.reoAge = s.reoMult-1, 0
					}
				}
			}
			s.retransmit(seq, now, resend, false)
			sl.byTime, sl.byCount = !byCount, byCount
			continue
		}
		if at := sl.sentAt.Add(delay); s.lossTime.IsZero() || at.Before(s.lossTime) {
			s.lossTime = at
		}
	}
	return nil
}

// retransmit sends packet seq again. Only a timeout counts against the
// retry limit: a retransmission an ack prompted means the peer is there
// (acks keep coming), and counting those would let reordering or a slow
// receiver exhaust the budget of a live peer.
func (s *Sender[P]) retransmit(seq uint32, now time.Time, resend func(uint32, *P), timeout bool) error {
	sl := &s.ring[seq&s.mask]
	if timeout {
		if int(sl.retries) >= s.cfg.MaxRetries {
			return ErrRetryExceeded
		}
		sl.retries++
	}
	sl.resent, sl.byTime, sl.byCount = true, false, false // detectLost sets them after
	sl.sentAt = now
	sl.after = s.next
	s.sent(sl, int(sl.size), now)
	s.lastSent = now
	s.Retransmits++
	resend(seq, &sl.payload)
	return nil
}

// PTO returns the probe timeout before backoff: smoothed RTT plus the
// larger of four variations and the granularity, plus the peer's ack
// delay (RFC 9002 §6.2.1).
func (s *Sender[P]) PTO() time.Duration {
	return s.rtt.Smoothed(s.cfg.InitialRTT) + max(4*s.rtt.Variation(s.cfg.InitialRTT), s.cfg.Granularity) + s.cfg.MaxAckDelay
}

// Deadline returns when OnTimer should next run, or zero when nothing is
// in flight.
func (s *Sender[P]) Deadline() time.Time {
	if s.una == s.next {
		return time.Time{}
	}
	if s.rnrWait {
		return s.rnrUntil
	}
	if !s.lossTime.IsZero() {
		return s.lossTime
	}
	return s.lastSent.Add(min(s.PTO()<<min(s.pto, 30), s.cfg.MaxRTO))
}

// OnTimer runs the sender's timers at now: packets lost by the time
// threshold are retransmitted; when the probe timeout has passed, the
// oldest packet in flight is sent again and the timeout doubles. It
// returns ErrRetryExceeded when a packet has used every retry.
func (s *Sender[P]) OnTimer(now time.Time, resend func(seq uint32, p *P)) error {
	if s.una == s.next {
		return nil
	}
	if s.rnrWait {
		if now.Before(s.rnrUntil) {
			return nil
		}
		s.rnrWait = false
		if sl := &s.ring[s.una&s.mask]; sl.pending {
			sl.resent, sl.byTime, sl.byCount = true, false, false
			sl.sentAt = now
			sl.after = s.next
			s.sent(sl, int(sl.size), now)
			s.lastSent = now
			s.Retransmits++
			resend(s.una, &sl.payload)
		}
		return nil
	}
	if !s.lossTime.IsZero() && !now.Before(s.lossTime) {
		return s.detectLost(now, resend)
	}
	if d := s.Deadline(); d.IsZero() || now.Before(d) {
		return nil
	}
	seq, _, ok := s.Oldest()
	if !ok {
		return nil
	}
	s.pto++
	if err := s.retransmit(seq, now, resend, true); err != nil {
		return err
	}
	if s.cc != nil {
		s.cc.onTimeout(now, s.pto)
	}
	// A second probe, as QUIC sends: the next packet waiting for its ack,
	// so that a lost tail takes one timeout, not one per packet.
	for next := seq + 1; Before(next, s.next); next++ {
		if sl := &s.ring[next&s.mask]; sl.pending {
			s.retransmit(next, now, resend, false)
			break
		}
	}
	return nil
}

// Probe reports whether a zero-window probe is due at now: the peer's
// window is shut, nothing is in flight, and the probe wait has passed.
// The caller then sends one packet past the window (Push); it is
// retransmitted and counted against MaxRetries like any other, and its
// ack brings the peer's window. A peer that keeps the window shut
// through MaxRetries probes is holding the sender's data for good:
// Probe returns ErrRetryExceeded.
func (s *Sender[P]) Probe(now time.Time) (bool, error) {
	if s.una != s.next || Before(s.next, s.limit) || s.probeAt.IsZero() || now.Before(s.probeAt) {
		return false, nil
	}
	if s.probes >= s.cfg.MaxRetries {
		return false, ErrRetryExceeded
	}
	s.probes++
	s.probeAt = time.Time{}
	return true, nil
}

// Resume returns when a sender with nothing in flight that cannot send
// now may send again: the next zero-window probe if the peer's window is
// shut, else the end of a receiver-not-ready wait.
func (s *Sender[P]) Resume() time.Time {
	if !Before(s.next, s.limit) {
		return s.probeAt
	}
	return s.rnrUntil
}

// Unpush takes back the packet Push numbered seq, which must be the last
// one, when it could not leave after all (the socket was full): it is
// numbered again when it can.
func (s *Sender[P]) Unpush(seq uint32) bool {
	if seq+1 != s.next {
		return false
	}
	s.next--
	s.flow.inflight -= int(s.ring[seq&s.mask].size)
	s.paceAt = s.unpace
	s.ring[seq&s.mask] = slot[P]{}
	return true
}

// Reset forgets every packet in flight (the peer restarted or is gone);
// the caller fails what they carried.
func (s *Sender[P]) Reset() {
	clear(s.ring)
	s.una = s.next
	s.flow.inflight = 0
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
