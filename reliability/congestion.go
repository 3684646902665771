package reliability

import (
	"math"
	"time"
)

// Congestion control and pacing of a Sender.
//
// The sender measures, per packet, the delivery rate the network gave
// the flight it belonged to (draft-cheng-iccrg-delivery-rate-estimation-02,
// "Delivery Rate Estimation", Cheng, Cardwell, Hassas Yeganeh, Jacobson),
// and hands every ack, loss and timeout to one of two standard
// controllers:
//
//   - BBR, version 1, as draft-cardwell-iccrg-bbr-congestion-control-00
//     ("BBR Congestion Control", Cardwell, Cheng, Hassas Yeganeh,
//     Jacobson) describes it: a model of the path (the bottleneck
//     bandwidth, the windowed maximum of the delivery rate over about ten
//     round trips, and the round-trip propagation time, the windowed
//     minimum RTT over ten seconds) sets the pacing rate (a gain times
//     the bandwidth) and the window (a gain times the bandwidth-delay
//     product, at least four packets); Startup, Drain, ProbeBW's gain
//     cycle and ProbeRTT move the gains. Loss does not enter the model:
//     a lost packet holds the window to packet conservation for a round
//     trip (§4.2.3.4), so random loss, which is not congestion, costs RD
//     little. But a loss at a standing queue (the round's least RTT well
//     above the minimum) is congestion, and is answered with BBR v3's
//     bounds on what is in flight and on the bandwidth
//     (draft-ietf-ccwg-bbr §5.5.10; see "The response to congestive
//     loss" below). It is the default.
//   - NewReno as RFC 9002 §7 gives it for QUIC (slow start, congestion
//     avoidance, one halving per recovery period, persistent congestion),
//     paced at 1.25 times the window per smoothed RTT (§7.7): the floor
//     every transport on a shared path must meet (RFC 8085 §3.1).
//
// Both are byte-based: Push takes each packet's size on the wire.

// Congestion selects a sender's congestion controller (Config.Congestion).
type Congestion uint8

const (
	// CongestionBBR: BBR v1 with pacing (the default).
	CongestionBBR Congestion = iota
	// CongestionNewReno: NewReno per RFC 9002 §7, paced per §7.7.
	CongestionNewReno
	// CongestionNone: no congestion window and no pacing, only the
	// peer's window (Config.Window), as before congestion control.
	CongestionNone
)

func (c Congestion) String() string {
	switch c {
	case CongestionBBR:
		return "bbr"
	case CongestionNewReno:
		return "newreno"
	case CongestionNone:
		return "none"
	}
	return "Congestion(?)"
}

// DefaultMSS is the packet size the controllers assume before the first
// Push: the window floors and the initial window count in packets of the
// largest size pushed since, up to MaxMSS (a jumbo frame; a larger
// datagram is fragmented by IP, and one such must not make the floors
// a multiple of 64 KiB). A packet larger than the window still goes
// when nothing else is in flight.
const (
	DefaultMSS = 1500
	MaxMSS     = 9000
)

// Pacing bounds: a burst (Quantum) lasts at most maxBurstTime at the
// pacing rate, and at most a quarter of the minimum RTT, since a burst
// longer than the path's bandwidth-delay product is itself the queue;
// it is at least two packets and at most maxQuantum bytes (Linux's TSO
// autosizing uses the same 1 ms and 64 KiB).
const (
	maxBurstTime = time.Millisecond
	maxQuantum   = 64 << 10
)

// rateSample is what one ack tells of the delivery rate
// (draft-cheng-iccrg-delivery-rate-estimation §3.3), and of the ack.
type rateSample struct {
	rate           float64 // bytes per second; 0: no valid sample
	delivered      int64   // bytes delivered over interval
	interval       time.Duration
	priorDelivered int64 // the delivered count when the newest acked packet went
	appLimited     bool
	rtt            time.Duration // of the newest packet acked, if sent once; else 0
	acked          int           // bytes newly acknowledged (cumulatively or selectively)
	lost           int           // bytes this ack showed lost
	priorInflight  int           // bytes in flight before the ack
	inflight       int           // after it
	newestSentAt   time.Time     // when the newest packet acked was sent; zero if none
}

// lostPacket is what the sender tells a controller of a packet it
// declares lost: its size, when it was sent, and the flow's bytes in
// flight and lost count then.
type lostPacket struct {
	size       int
	sentAt     time.Time
	txInflight int
	lostBefore int64
	// byTime: declared lost by the time threshold alone (no packet
	// sent PacketThreshold after it was acked).
	byTime bool
}

// flowState is what the sender knows of its flow that the controllers
// read: the packet size, the bytes in flight and the delivery counters.
type flowState struct {
	mss int
	// frame is the largest packet pushed, whatever its size: a burst
	// (quantum) lets two of them go, as pacing's floor of two packets
	// means, even where they are larger than MaxMSS (loopback's 64 KiB
	// datagrams).
	frame     int
	inflight  int
	delivered int64 // bytes delivered (acked) so far
	lost      int64 // bytes declared lost so far
	// appLimited is, while the flow is limited by the application and
	// not by the controller, the delivered count at which that period
	// ends (draft-cheng §3.4); zero otherwise.
	appLimited int64
}

// controller is a congestion controller.
type controller interface {
	onSend(now time.Time, size int)
	onAck(now time.Time, rs *rateSample)
	// onLoss: a packet is declared lost (the flow's lost count already
	// includes it).
	onLoss(now time.Time, p lostPacket)
	// onTimeout: the probe timeout fired, count times in a row.
	onTimeout(now time.Time, count int)
	cwnd() int
	pacingRate() float64 // bytes per second; 0: not paced
	bandwidth() float64
	minRTT() time.Duration
	// burstRTT is the RTT that bounds a pacing burst (see quantum).
	burstRTT() time.Duration
}

func newController(kind Congestion, f *flowState, rtt *RTT, cfg Config) controller {
	switch kind {
	case CongestionNewReno:
		return newNewReno(f, rtt, cfg)
	case CongestionNone:
		return nil
	}
	return newBBR(f, rtt, cfg)
}

// initialWindow: RFC 9002 §7.2 (min(10·MSS, max(14720, 2·MSS))), which
// BBR uses too (draft-cardwell §4.2.3.1 starts from the transport's
// initial window).
func initialWindow(mss int) int { return min(10*mss, max(14720, 2*mss)) }

// ---- BBR v1 ----

type bbrMode uint8

const (
	bbrStartup bbrMode = iota
	bbrDrain
	bbrProbeBW
	bbrProbeRTT
)

func (m bbrMode) String() string {
	return [...]string{"startup", "drain", "probe-bw", "probe-rtt"}[m]
}

// BBR's constants (draft-cardwell-iccrg-bbr-congestion-control-00 §4).
const (
	bbrHighGain        = 2.885 // 2/ln 2: doubles the sending rate each round in Startup
	bbrCwndGain        = 2.0   // ProbeBW's window: twice the BDP, for delayed and stretched acks
	bbrBtlBwRounds     = 10    // the bandwidth filter's window, in round trips
	bbrRTpropWindow    = 10 * time.Second
	bbrProbeRTTTime    = 200 * time.Millisecond
	bbrMinPipePackets  = 4
	bbrFullBwThreshold = 1.25 // Startup goes on while the bandwidth grows 25 % a round
	bbrFullBwRounds    = 3
	bbrGainCycleLen    = 8
)

var bbrPacingGains = [bbrGainCycleLen]float64{5.0 / 4, 3.0 / 4, 1, 1, 1, 1, 1, 1}

// maxFilter is a windowed maximum over a window of rounds, kept as the
// best, second and third best samples of the window's latest parts
// (Kathleen Nichols' algorithm, which the BBR draft cites for its
// filters): constant space, and a stale maximum ages out.
type maxFilter struct {
	s [3]struct {
		t int64
		v float64
	}
}

func (f *maxFilter) get() float64 { return f.s[0].v }

func (f *maxFilter) update(t int64, v float64, win int64) {
	set := func(i int) { f.s[i].t, f.s[i].v = t, v }
	if v >= f.s[0].v || t-f.s[2].t > win {
		set(0)
		set(1)
		set(2)
		return
	}
	if v >= f.s[1].v {
		set(1)
		set(2)
	} else if v >= f.s[2].v {
		set(2)
	}
	switch {
	case t-f.s[0].t > win:
		// The best has aged out: the second takes its place, and so on.
		f.s[0], f.s[1] = f.s[1], f.s[2]
		set(2)
		if t-f.s[0].t > win {
			f.s[0], f.s[1] = f.s[1], f.s[2]
		}
	case f.s[1].t == f.s[0].t && t-f.s[0].t > win/4:
		// A quarter of the window gone with no second choice: take one.
		set(1)
		set(2)
	case f.s[2].t == f.s[1].t && t-f.s[1].t > win/2:
		set(2)
	}
}

type bbr struct {
	f   *flowState
	rtt *RTT
	cfg Config

	mode       bbrMode
	btlBw      maxFilter
	rtProp     time.Duration
	rtPropAt   time.Time
	rtPropSeen bool
	expired    bool // the min-RTT filter's window ran out on this ack

	rounds             int64
	nextRoundDelivered int64
	roundStart         bool

	pacingGain, cwndGain float64
	pacing               float64
	window               int
	priorCwnd            int

	filledPipe  bool
	fullBw      float64
	fullBwCount int

	cycleIndex int
	cycleStamp time.Time
	rng        uint64

	probeRTTDone      time.Time
	probeRTTRoundDone bool
	idleRestart       bool

	inRecovery    bool
	recoveryStart time.Time
	conservation  bool

	// Ack aggregation (Linux's BBR since 4.19, tcp_bbr.c
	// "extra_acked"; draft-ietf-ccwg-bbr §5.5.9): acks that come in
	// bursts (a receiver that acks once per batch it reads, GRO, a
	// descheduled peer) deliver more than bw over the time they took;
	// the excess, its max over 10 rounds, is added to the window, so the
	// sender has data in flight while the next burst of acks is held.
	extraAcked   maxFilter
	aggStart     time.Time
	aggDelivered int64

	// The long-term bandwidth (Linux's BBR v1, tcp_bbr.c, "lt_bw"): when
	// a flow loses a fifth of what it sends over 4 to 16 rounds, twice in
	// a row at about the same delivery rate, something is dropping what
	// exceeds that rate (a policer, or a queue shared by more flows than
	// it has room for); the flow then paces at that rate, gain 1, for 48
	// rounds, instead of at the peak its max filter remembers.
	lt ltBandwidth

	// The response to congestive loss (BBR v3's bounds,
	// draft-ietf-ccwg-bbr §5.5.10; see congestiveLoss). inflightHi is
	// the most in flight that did not lose more than bbrLossThresh
	// (0: no bound yet); bwLo and inflightLo are the short-term
	// bounds cut by bbrBeta per round that lost at a standing queue
	// and reset when the flow probes (0: none); bwLatest and
	// inflightLatest are the largest delivery rate and delivered volume
	// of the current round, lossInRound whether it lost at a queue;
	// roundMinRTT and prevRoundMinRTT are the least RTT of this round
	// and the last one (0: no sample), which tell a queue that stands
	// from one that comes and goes; upRounds counts the rounds of the
	// current bandwidth probe (inflightHi grows 1, 2, 4 ... packets a
	// round in it), hiGrowth accumulates that growth.
	inflightHi      int
	bwLo            float64
	inflightLo      int
	bwLatest        float64
	inflightLatest  int64
	lossInRound     bool
	roundMinRTT     time.Duration
	prevRoundMinRTT time.Duration
	upRounds        int
	hiGrowth        int64
	hiCutAt         time.Time
	// CongestiveLosses counts the losses read as congestion, and
	// TooHigh the times a flight's loss rate passed bbrLossThresh at a
	// standing queue (tests read them).
	congestiveLosses, tooHigh int

	// Competition with a loss-based flow (see "Sharing a queue with a
	// loss-based flow" below): standRounds counts the rounds in a row
	// whose least RTT showed a standing queue; while compete is set the
	// window is compWindow, grown by one packet per window acked and
	// halved once per round trip that loses (compCutAt the last cut,
	// compAcked the bytes acked toward the next packet of growth);
	// compRounds counts the rounds since the last drain test, and a
	// test is under way while testing is set: testMark is the delivered
	// count when the flight had drained (-1: not yet), testStart the
	// round the test began. competeEntries and competeExits count the
	// switches (tests read them).
	standRounds                  int
	compete                      bool
	compWindow, compAcked        int
	compCutAt                    time.Time
	compRounds                   int
	testing                      bool
	testMark                     int64
	testStart                    int64
	testPrior                    int
	testEvery                    int
	competeEntries, competeExits int
	// ambiguous counts the drain tests in a row whose RTT was under the
	// floor of bbr.queued but not within bbrQueueRTT of the minimum.
	ambiguous int
}

type ltBandwidth struct {
	sampling      bool
	use           bool
	rounds        int
	bw            float64
	lastDelivered int64
	lastLost      int64
	lastStamp     time.Time
}

const (
	ltMinRounds  = 4
	ltMaxRounds  = 16
	ltLossRatio  = 0.2
	ltUseRounds  = 48
	ltBwRatio    = 1.0 / 8 // two intervals agree within this fraction
	ltBwAbsolute = 500     // or within this many bytes a second (4 kbit/s)
)

func newBBR(f *flowState, rtt *RTT, cfg Config) *bbr {
	b := &bbr{f: f, rtt: rtt, cfg: cfg, rtProp: -1, rng: uint64(cfg.FirstSeq)*0x9e3779b97f4a7c15 + 1}
	b.window = initialWindow(f.mss)
	b.enterStartup()
	b.initPacing()
	return b
}

// initPacing: the nominal rate is the initial window per smoothed RTT
// (the configured initial RTT before a sample), times Startup's gain.
func (b *bbr) initPacing() {
	srtt := b.rtt.Smoothed(b.cfg.InitialRTT)
	b.pacing = bbrHighGain * float64(initialWindow(b.f.mss)) / srtt.Seconds()
}

func (b *bbr) enterStartup() {
	b.mode = bbrStartup
	b.pacingGain, b.cwndGain = bbrHighGain, bbrHighGain
}

func (b *bbr) random() uint64 {
	b.rng ^= b.rng << 13
	b.rng ^= b.rng >> 7
	b.rng ^= b.rng << 17
	return b.rng
}

func (b *bbr) enterProbeBW(now time.Time) {
	b.mode = bbrProbeBW
	b.pacingGain, b.cwndGain = 1, bbrCwndGain
	// A random phase to start from, any but the draining 3/4 one (§4.3.4.4),
	// so that flows that start together do not probe together.
	b.cycleIndex = bbrGainCycleLen - 1 - int(b.random()%(bbrGainCycleLen-1))
	b.advanceCycle(now)
}

func (b *bbr) advanceCycle(now time.Time) {
	b.cycleStamp = now
	b.cycleIndex = (b.cycleIndex + 1) % bbrGainCycleLen
	b.pacingGain = bbrPacingGains[b.cycleIndex]
	if b.probingUp() {
		// A bandwidth probe: the short-term bounds are forgotten, so the
		// flow can find out whether the room it lost has come back
		// (draft-ietf-ccwg-bbr, ProbeBW_REFILL resets bw_lo and
		// inflight_lo), and inflightHi may grow from here.
		b.resetLowerBounds()
		b.upRounds, b.hiGrowth = 0, 0
	}
}

// probingUp: ProbeBW's phase of gain 5/4, BBR v3's ProbeBW_UP.
func (b *bbr) probingUp() bool { return b.mode == bbrProbeBW && b.pacingGain > 1 }

func (b *bbr) resetLowerBounds() { b.bwLo, b.inflightLo = 0, 0 }

func (b *bbr) bdp(gain float64) int {
	if b.rtProp < 0 || b.bw() == 0 {
		return initialWindow(b.f.mss)
	}
	return int(gain * b.bw() * b.rtProp.Seconds())
}

// inflightTarget is the window for gain: the BDP times the gain plus
// three bursts, for the acks and sends that come in quanta (§4.2.3.2).
func (b *bbr) inflightTarget(gain float64) int {
	t := b.bdp(gain) + 3*quantum(b.pacing, b.rtProp, b.f.mss, b.f.frame)
	if b.filledPipe {
		t += int(b.extraAcked.get())
	}
	return t
}

// bbrExtraAckedRounds is the ack-aggregation filter's window, and
// bbrExtraAckedMax caps the aggregation allowance at this long at bw.
const (
	bbrExtraAckedRounds = 10
	bbrExtraAckedMax    = 100 * time.Millisecond
)

// updateAckAggregation estimates how much more than bw the acks of an
// aggregation epoch delivered (tcp_bbr.c bbr_update_ack_aggregation).
func (b *bbr) updateAckAggregation(now time.Time, rs *rateSample) {
	bw := b.bw()
	if rs.acked <= 0 || bw == 0 {
		return
	}
	expected := int64(bw * now.Sub(b.aggStart).Seconds())
	if b.aggStart.IsZero() || b.aggDelivered <= expected {
		// The acks caught up with the rate: a new epoch starts.
		b.aggStart, b.aggDelivered, expected = now, 0, 0
	}
	b.aggDelivered += int64(rs.acked)
	extra := min(float64(b.aggDelivered-expected), float64(b.window), bw*bbrExtraAckedMax.Seconds())
	b.extraAcked.update(b.rounds, extra, bbrExtraAckedRounds)
}

func (b *bbr) minPipe() int { return bbrMinPipePackets * b.f.mss }

func (b *bbr) onSend(now time.Time, size int) {
	if b.f.inflight == 0 && b.f.appLimited != 0 {
		// Restarting from idle (§4.3.4.4): in ProbeBW, pace at the
		// estimated bandwidth, not above it, until the first ack.
		b.idleRestart = true
		if b.mode == bbrProbeBW {
			b.setPacing(1)
		}
	}
}

func (b *bbr) onAck(now time.Time, rs *rateSample) {
	// The model (§4.1) and the state machine (§4.3).
	b.updateRound(rs)
	b.updateLowerBounds(rs)
	b.updateCompetition(now, rs)
	b.longTerm(now, rs)
	if rs.rate > 0 && (rs.rate >= b.btlBw.get() || !rs.appLimited) {
		b.btlBw.update(b.rounds, rs.rate, bbrBtlBwRounds)
	}
	b.updateAckAggregation(now, rs)
	b.checkCycle(now, rs)
	b.checkFullPipe(rs)
	b.checkDrain(now)
	b.updateRTprop(now, rs)
	b.checkProbeRTT(now)
	if b.inRecovery && !rs.newestSentAt.IsZero() && !rs.newestSentAt.Before(b.recoveryStart) {
		// A packet sent since the loss (its retransmission, or one after
		// it) was acked: recovery is over, and the window as it was
		// before comes back (§4.2.3.4).
		b.inRecovery, b.conservation = false, false
		b.window = max(b.window, b.priorCwnd)
	}
	if b.conservation && b.roundStart {
		b.conservation = false
	}
	b.idleRestart = false
	// The control parameters (§4.2).
	b.setPacing(b.pacingGain)
	b.setCwnd(rs)
}

// bw is the bandwidth the controls use: the long-term rate while a
// policer or an overfull queue is suspected, the max filter's otherwise.
func (b *bbr) bw() float64 {
	bw := b.btlBw.get()
	if b.lt.use {
		bw = b.lt.bw
	}
	if b.bwLo > 0 {
		bw = min(bw, b.bwLo)
	}
	return bw
}

func (b *bbr) ltReset(now time.Time) {
	b.lt.lastDelivered, b.lt.lastLost, b.lt.lastStamp = b.f.delivered, b.f.lost, now
	b.lt.rounds = 0
}

func (b *bbr) ltStop(now time.Time) {
	b.lt = ltBandwidth{}
	b.ltReset(now)
}

func (b *bbr) longTerm(now time.Time, rs *rateSample) {
	lt := &b.lt
	if lt.use {
		if b.mode == bbrProbeBW && b.roundStart {
			if lt.rounds++; lt.rounds >= ltUseRounds {
				b.ltStop(now) // time to probe the max filter's bandwidth again
			}
		}
		return
	}
	if !lt.sampling {
		if rs.lost == 0 {
			return // intervals begin at a loss
		}
		b.ltReset(now)
		lt.sampling = true
	}
	if rs.appLimited {
		b.ltStop(now) // an application-limited flow says nothing of the path
		return
	}
	if b.roundStart {
		lt.rounds++
	}
	switch {
	case lt.rounds < ltMinRounds:
		return
	case lt.rounds > ltMaxRounds:
		b.ltStop(now)
		return
	case rs.lost == 0:
		return // intervals end at a loss
	}
	lost, delivered := b.f.lost-lt.lastLost, b.f.delivered-lt.lastDelivered
	elapsed := now.Sub(lt.lastStamp)
	if delivered <= 0 || float64(lost) < ltLossRatio*float64(delivered) || elapsed <= 0 {
		return
	}
	bw := float64(delivered) / elapsed.Seconds()
	if lt.bw > 0 {
		if d := math.Abs(bw - lt.bw); d <= ltBwRatio*lt.bw || d <= ltBwAbsolute {
			lt.bw = (bw + lt.bw) / 2
			lt.use, lt.rounds = true, 0
			return
		}
	}
	lt.bw = bw
	b.ltReset(now)
}

func (b *bbr) updateRound(rs *rateSample) {
	b.roundStart = false
	if rs.acked > 0 && rs.priorDelivered >= b.nextRoundDelivered {
		b.nextRoundDelivered = b.f.delivered
		b.rounds++
		b.roundStart = true
	}
}

func (b *bbr) checkCycle(now time.Time, rs *rateSample) {
	if b.mode != bbrProbeBW {
		return
	}
	elapsed := now.Sub(b.cycleStamp) > b.rtProp
	next := elapsed
	switch {
	case b.pacingGain > 1:
		// Probing: until the probe has put gain·BDP in flight or drew a loss.
		next = elapsed && (rs.lost > 0 || rs.priorInflight >= b.inflightTarget(b.pacingGain))
	case b.pacingGain < 1:
		// Draining: until the queue is gone, or a round trip at most.
		next = elapsed || rs.priorInflight <= b.inflightTarget(1)
	}
	if next {
		b.advanceCycle(now)
	}
}

func (b *bbr) checkFullPipe(rs *rateSample) {
	if b.filledPipe || !b.roundStart || rs.appLimited {
		return
	}
	if bw := b.btlBw.get(); bw >= b.fullBw*bbrFullBwThreshold {
		b.fullBw, b.fullBwCount = bw, 0
		return
	}
	b.fullBwCount++
	if b.fullBwCount >= bbrFullBwRounds {
		b.filledPipe = true
	}
}

func (b *bbr) checkDrain(now time.Time) {
	if b.mode == bbrStartup && b.filledPipe {
		b.mode = bbrDrain
		b.pacingGain, b.cwndGain = 1/bbrHighGain, bbrHighGain
	}
	if b.mode == bbrDrain && b.f.inflight <= b.inflightTarget(1) {
		b.enterProbeBW(now)
	}
}

func (b *bbr) updateRTprop(now time.Time, rs *rateSample) {
	// While competing the queue is someone else's and never empties: a
	// sample that replaced an expired minimum would be the queue (4 ms
	// beside CUBIC on a 50 µs path), every queue test after it would
	// find none, and ProbeRTT would drop the window to four packets
	// beside a flow that does not drain. The minimum does not expire
	// then; the competition's drain tests are its probes, and the one
	// that ends competition found an RTT near it (leaveCompetition).
	b.expired = !b.compete && b.rtPropSeen && now.After(b.rtPropAt.Add(bbrRTpropWindow))
	if rs.rtt > 0 && (b.rtProp < 0 || rs.rtt <= b.rtProp || b.expired) {
		first := b.rtProp < 0
		b.rtProp, b.rtPropAt, b.rtPropSeen = rs.rtt, now, true
		if first && b.btlBw.get() == 0 {
			b.initPacing() // the first RTT: the nominal rate from it
		}
	}
}

func (b *bbr) checkProbeRTT(now time.Time) {
	if b.mode != bbrProbeRTT && b.expired && !b.idleRestart {
		b.leaveCompetition(now)
		b.mode = bbrProbeRTT
		b.pacingGain, b.cwndGain = 1, 1
		b.saveCwnd()
		b.probeRTTDone = time.Time{}
	}
	if b.mode != bbrProbeRTT {
		return
	}
	// While it drains to four packets the flow is not testing the path:
	// its samples are app-limited (§4.3.5).
	b.f.appLimited = max(b.f.delivered+int64(b.f.inflight), 1)
	switch {
	case b.probeRTTDone.IsZero() && b.f.inflight <= b.minPipe():
		b.probeRTTDone = now.Add(bbrProbeRTTTime)
		b.probeRTTRoundDone = false
		b.nextRoundDelivered = b.f.delivered
	case !b.probeRTTDone.IsZero():
		if b.roundStart {
			b.probeRTTRoundDone = true
		}
		if b.probeRTTRoundDone && !now.Before(b.probeRTTDone) {
			b.rtPropAt = now
			b.resetLowerBounds()
			b.window = max(b.window, b.priorCwnd)
			if b.filledPipe {
				b.enterProbeBW(now)
			} else {
				b.enterStartup()
			}
		}
	}
}

func (b *bbr) saveCwnd() {
	if !b.inRecovery && b.mode != bbrProbeRTT {
		b.priorCwnd = b.window
	} else {
		b.priorCwnd = max(b.priorCwnd, b.window)
	}
}

func (b *bbr) setPacing(gain float64) {
	bw := b.bw()
	if b.lt.use {
		gain = 1
	}
	if bw == 0 {
		return
	}
	if b.compete {
		// A competing window is paced as NewReno's (RFC 9002 §7.7):
		// 1.25 windows per smoothed RTT, never below the bandwidth.
		srtt := b.rtt.Smoothed(b.cfg.InitialRTT)
		b.pacing = max(bw, bbrCompetePacing*float64(b.compWindow)/srtt.Seconds())
		return
	}
	if rate := gain * bw; b.filledPipe || rate > b.pacing {
		b.pacing = rate
	}
}

func (b *bbr) setCwnd(rs *rateSample) {
	defer func() {
		if b.testing && b.testMark < 0 {
			// A drain test: the flight falls to one BDP at most.
			b.window = min(b.window, b.testWindow())
		}
	}()
	if b.compete {
		// Never below one BDP of BBR's own model (bandwidth × minimum
		// RTT): beside a loss-based flow's deep queue that is next to
		// nothing, but a lone flow that a loaded host's delays sent into
		// competition on a fast path keeps its rate while AIMD's window
		// grows a packet per round trip (RD Write at 0 % loss on a veth:
		// 7.7 Gb/s competing, 10.7 not). BBR's whole target, two BDPs
		// and the ack-aggregation allowance, took 5 times NewReno's
		// share through a queue of 2 BDPs in the simulation.
		b.window = max(b.compWindow, b.bdp(1), b.minPipe())
		return
	}
	target := b.inflightTarget(b.cwndGain)
	if b.inRecovery && b.conservation {
		b.window = max(b.window, b.f.inflight+rs.acked)
	} else if b.filledPipe {
		b.window = min(b.window+rs.acked, target)
	} else if b.window < target || b.f.delivered < int64(initialWindow(b.f.mss)) {
		b.window += rs.acked
	}
	b.window = min(b.window, b.boundCwnd())
	b.window = max(b.window, b.minPipe())
	if b.mode == bbrProbeRTT {
		b.window = min(b.window, b.minPipe())
	}
}

func (b *bbr) onLoss(now time.Time, p lostPacket) {
	bytes := p.size
	if b.compete {
		// Competing: a multiplicative decrease once per round trip, as
		// NewReno's (RFC 9002 §7.3.2), instead of BBR's recovery — for a
		// loss at a standing queue only, as BBR's own loss response
		// (congestiveLoss): a loss-based flow's queue overflows while it
		// stands, and a loss with no queue is random. A lone flow that a
		// loaded host's delays sent into competition under random loss
		// otherwise cut at every lossy round trip until a drain test let
		// it go (RD Write at 2 % loss: 3.4 Gb/s instead of 6.2).
		if p.sentAt.After(b.compCutAt) && !p.byTime && b.queueStanding() {
			b.compCutAt = now
			b.compWindow = max(int(bbrCompeteBeta*float64(b.compWindow)), b.minPipe())
			b.compAcked = 0
			b.window = b.compWindow
		}
		return
	}
	b.congestiveLoss(now, p)
	if !b.inRecovery {
		// Entering recovery: packet conservation for a round trip, the
		// window as it was kept to come back to (§4.2.3.4).
		b.saveCwnd()
		b.inRecovery, b.conservation = true, true
		b.recoveryStart = now
		b.nextRoundDelivered = b.f.delivered // conservation lasts one round from here
		b.window = b.f.inflight + b.f.mss
	}
	b.window = max(b.window-bytes, b.minPipe())
}

func (b *bbr) onTimeout(now time.Time, count int) {
	if b.compete && count < 2 {
		return // competing as NewReno does: one probe timeout is no congestion (RFC 9002 §7.6)
	}
	b.leaveCompetition(now)
	// A timeout: everything in flight may be lost. The window falls to
	// its floor and grows back with the acks; recovery's end restores it.
	b.saveCwnd()
	b.inRecovery, b.conservation = true, true
	b.recoveryStart = now
	b.nextRoundDelivered = b.f.delivered
	b.window = b.minPipe()
}

// ---- The response to congestive loss ----
//
// BBR v1 leaves loss out of its model, which is what RD wants of random
// loss, but two v1 flows through a queue of two BDPs each keep twice
// their share of the BDP in flight (cwnd_gain 2) and together overflow
// it for good: losing a tenth of what they send, at unfair shares, and
// a hundred flows lose more than half. BBR v3 (draft-ietf-ccwg-bbr
// §5.5.10, Linux's tcp_bbr.c of BBRv3) answers loss with two kinds of
// bound:
//
//   - inflight_hi, an upper bound on what is in flight: the flight whose
//     loss rate passed loss_thresh (2 %) was too much, so less goes in
//     flight from then on, less again a headroom of 15 % outside
//     bandwidth probes (room for other flows to grow into). A probe
//     (ProbeBW's 5/4 phase here) raises it by 1, 2, 4 ... packets a
//     round while it holds the flow and no loss passes the threshold.
//     v3 sets it to max(tx_in_flight, beta·target): no lower than the
//     flight that lost. Here it is beta (0.7) of that flight, once per
//     round trip (losses of packets sent before the cut are the same
//     event, as in NewReno's recovery period): a multiplicative
//     decrease, with the probes' increase, is what makes flows converge
//     to equal shares (Chiu and Jain, 1989). In the simulation
//     (bottleneck_test.go) two flows through a two-BDP queue got Jain's
//     index 0.84 with v3's rule, 0.61 with the cut floored at the
//     target, 0.99 with this one; the late flow's minimum RTT includes
//     the queue the first one built, and only a cut below the flight
//     drains that queue.
//   - bw_lo and inflight_lo, short-term lower bounds: each round trip
//     with loss cuts them to beta of what they were, but not below what
//     that round delivered; a bandwidth probe forgets them.
//
// v3 reads every loss as congestion (inflight_hi only past 2 %, but the
// lower bounds at any loss), which costs it throughput under random
// loss, RD's case. Here a loss counts only if it came while a queue was
// standing at the bottleneck: when the least RTT of this round and the
// last was at least bbrQueueRTT times the minimum RTT. A queue that
// overflows is full when it drops, so every RTT of the round is high;
// a random loss, or one of the bursts ProbeBW's 5/4 phase makes (a
// queue of a quarter BDP, which the next phase drains), comes with
// RTTs at or near the minimum. (Delay as the second witness of loss is
// the idea of TCP-LP, Kuzmanovic and Knightly 2003, and of BBR v2's
// early ECN/delay experiments; here it only gates v3's loss response.)
// A drop-tail queue shallower than a quarter BDP never reads as
// standing: there BBR falls back to v1's conduct and the long-term
// bandwidth.

const (
	bbrLossThresh = 0.02 // draft-ietf-ccwg-bbr BBRLossThresh
	bbrBeta       = 0.7  // BBRBeta: the multiplicative decrease per lossy round
	bbrHeadroom   = 0.15 // BBRHeadroom: inflight_hi's margin outside probes
	bbrQueueRTT   = 1.25 // a round's least RTT this far above min RTT: a standing queue
)

// queueStanding reports whether the bottleneck's queue has stood for the
// last round or two: the least RTT sampled since the previous round
// began is bbrQueueRTT times the minimum RTT or more.
func (b *bbr) queueStanding() bool {
	if b.rtProp <= 0 {
		return false // no minimum yet: nothing to compare with
	}
	r := b.roundMinRTT
	if b.prevRoundMinRTT > 0 && (r == 0 || b.prevRoundMinRTT < r) {
		r = b.prevRoundMinRTT
	}
	if r == 0 {
		r = b.rtt.Latest()
	}
	return b.queued(r)
}

// queued reports whether an RTT of r says a queue stands at the
// bottleneck: bbrQueueRTT times the minimum RTT, and above it by at least
// the timer granularity. Both: on a path of tens of microseconds a host's
// own scheduling stretches RTTs far past a quarter (a descheduled
// receiver acks 0.1-1 ms late), and read as a queue it made every random
// loss congestive and sent a lone flow into competition (RD Write at 5 %
// random loss on a veth: 1 Gb/s, against 5.7 without a controller).
// Below the granularity (Config.Granularity, RFC 9002's kGranularity) a
// delay is the host's, not a queue's.
func (b *bbr) queued(r time.Duration) bool {
	return float64(r) >= bbrQueueRTT*float64(b.rtProp) && r-b.rtProp >= b.cfg.Granularity
}

// congestiveLoss reads a lost packet: a loss at a standing queue marks
// the round for the lower bounds, and one that brings its flight's loss
// rate over bbrLossThresh sets inflightHi (BBRHandleInflightTooHigh).
func (b *bbr) congestiveLoss(now time.Time, p lostPacket) {
	if !b.queueStanding() {
		return // random: the model, not the loss, sets the rate
	}
	b.congestiveLosses++
	b.lossInRound = true
	lost := b.f.lost - p.lostBefore
	if p.txInflight <= 0 || float64(lost) <= bbrLossThresh*float64(p.txInflight) {
		return
	}
	b.tooHigh++
	if !p.sentAt.After(b.hiCutAt) {
		return // sent before the last cut: the same congestion event
	}
	b.hiCutAt = now
	b.inflightHi = max(int(bbrBeta*float64(p.txInflight)), b.minPipe())
	b.upRounds, b.hiGrowth = 0, 0
	switch {
	case b.mode == bbrStartup:
		// Startup overflowed the queue: the pipe is full (BBR v3
		// leaves Startup on loss above the threshold as well).
		b.filledPipe = true
	case b.probingUp():
		b.advanceCycle(now) // the probe found the limit: drain
	}
}

// updateLowerBounds keeps the round's delivery signals and, when a
// round that lost at a standing queue ends, cuts bwLo and inflightLo
// (BBRAdaptLowerBoundsFromCongestion); it also grows inflightHi in a
// probe that the bound holds (BBRProbeInflightHiUpward).
func (b *bbr) updateLowerBounds(rs *rateSample) {
	if b.roundStart {
		if b.lossInRound && b.filledPipe && !b.probingUp() {
			if b.bwLo == 0 {
				b.bwLo = b.btlBw.get()
			}
			if b.inflightLo == 0 {
				b.inflightLo = b.window
			}
			b.bwLo = max(b.bwLatest, bbrBeta*b.bwLo)
			b.inflightLo = max(int(b.inflightLatest), int(bbrBeta*float64(b.inflightLo)), b.minPipe())
		}
		b.lossInRound = false
		b.bwLatest, b.inflightLatest = 0, 0
		b.prevRoundMinRTT, b.roundMinRTT = b.roundMinRTT, 0
		if b.probingUp() {
			b.upRounds++
		}
	}
	b.bwLatest = max(b.bwLatest, rs.rate)
	b.inflightLatest = max(b.inflightLatest, rs.delivered)
	if rs.rtt > 0 && (b.roundMinRTT == 0 || rs.rtt < b.roundMinRTT) {
		b.roundMinRTT = rs.rtt
	}
	if b.probingUp() && b.inflightHi > 0 && rs.priorInflight+b.f.mss >= b.inflightHi {
		// Held by inflightHi while probing: it grows by 2^upRounds
		// packets per window acked.
		b.hiGrowth += int64(rs.acked) << min(b.upRounds, 20)
		if w := int64(max(b.window, 1)); b.hiGrowth >= w {
			n := b.hiGrowth / w
			b.inflightHi += int(n) * b.f.mss
			b.hiGrowth -= n * w
		}
	}
}

// boundCwnd is the most the window may be under the loss bounds
// (BBRBoundCwndForModel): inflightHi, less the headroom outside probes,
// and inflightLo.
func (b *bbr) boundCwnd() int {
	bound := math.MaxInt
	if b.inflightHi > 0 {
		bound = b.inflightHi
		if !b.probingUp() && b.mode != bbrStartup {
			bound -= max(int(bbrHeadroom*float64(b.inflightHi)), b.f.mss)
		}
	}
	if b.inflightLo > 0 {
		bound = min(bound, b.inflightLo)
	}
	return max(bound, b.minPipe())
}

// ---- Sharing a queue with a loss-based flow ----
//
// BBR's window, twice the bandwidth times the minimum RTT, cannot hold a
// share of a queue that a loss-based flow (Reno, CUBIC) keeps standing:
// the deeper the queue, the longer the RTT, and the smaller the share a
// flight of 2·bw·minRTT delivers per RTT, the smaller bw, and so on down
// (in the simulation, against NewReno: 0.40 of its goodput at a queue of
// 4 BDPs, 0.14 at 8; on a real 1 Gbit/s link with a 25-BDP queue 0.22 of
// CUBIC's). Copa (Arun and Balakrishnan, "Copa: Practical Delay-Based
// Congestion Control for the Internet", NSDI 2018, §2.2) answers with a
// mode switch: a delay-based flow empties the queue now and then, so a
// queue that never empties over several RTTs is held by someone else, a
// buffer-filler; Copa then competes as AIMD does, and comes back when
// the queue empties. Here:
//
//   - The witness: each round's least RTT (the one the loss response
//     reads). bbrCompeteRounds rounds in a row with the queue standing
//     (the least RTT at least bbrQueueRTT times the minimum) call for a
//     drain test, since BBR alone keeps a queue of its own too (a
//     window of two BDPs, ack aggregation): the flow lets its flight
//     fall to one BDP of its own (bw times the minimum RTT) and reads
//     the RTT of the packets it sends once it has. One below bbrQueueRTT
//     times the minimum: the queue was the flow's own. A flight's worth
//     of them all above it: someone else holds the queue, and the flow
//     competes.
//   - Competing: the window starts from the one before the test and
//     follows an AIMD of Reno's increase and CUBIC's decrease: one packet
//     more per window acked (RFC 5681), 0.7 of itself once per round trip that
//     loses a packet by the packet threshold (an overflowing queue
//     leaves holes that later packets' acks show; a packet lost by the
//     time threshold alone is, on a loaded host, mostly a late ack:
//     alone through the real bottleneck RD retransmitted 160 to 250
//     packets where the queue dropped 4 to 7); pacing is 1.25 windows
//     per smoothed RTT (RFC 9002 §7.7), a burst a quarter of the
//     smoothed RTT (burstRTT). BBR's loss bounds stand aside. CUBIC's
//     Reno-friendly increase, 0.53 packet per window (RFC 9438 §4.3: as
//     fair to Reno as Reno is, at equal loss), took only 0.36 to 0.40 of
//     CUBIC's goodput through the real tail-drop bottleneck: a paced flow
//     meets the full queue with single packets spread over the round
//     trip, each a loss event, where TCP's bursts lose several in one;
//     one packet gives 0.56 to 0.67 there (and 1.5 to 1.9 times
//     NewReno's share in the simulation, which has no such asymmetry).
//     The minimum RTT does not expire while competing (updateRTprop).
//   - Coming back: AIMD alone keeps its own queue standing, so the
//     witness cannot say whether the other flow left: a drain test
//     after bbrCompeteTestRounds rounds, then after twice as many each
//     time the queue still stands, up to bbrCompeteTestMax, does. The
//     first packet sent once the flight has drained that finds the RTT
//     below bbrQueueRTT times the minimum (the ratio alone: a loss-based
//     flow that has just cut leaves a queue under the host-delay floor
//     of bbr.queued) sends the flow back to ProbeBW. A test costs about one RTT of the flow's sending; the
//     window comes back as it was as soon as the flight has drained.
//   - Two probe timeouts in a row end competition too.
const (
	bbrCompeteRounds     = 10
	bbrCompeteTestRounds = 10
	bbrCompeteTestMax    = 80
	bbrCompeteBeta       = 0.7 // CUBIC's (RFC 9438 §4.6), and BBR v3's
	// The increase, in hundredths of a packet per window acked: Reno's
	// one (see above for why not CUBIC's Reno-friendly 0.53).
	bbrCompeteAlpha100 = 100

	bbrCompetePacing = 1.25 // RFC 9002 §7.7's N

	// bbrCompeteAmbiguous drain tests in a row that find a queue under
	// the floor of bbr.queued end competition (updateCompetition).
	bbrCompeteAmbiguous = 2
)

// updateCompetition counts the rounds a queue stands, runs the drain
// tests, switches to competing and back on their verdicts, and grows the
// competing window.
func (b *bbr) updateCompetition(now time.Time, rs *rateSample) {
	if b.roundStart {
		switch r := b.prevRoundMinRTT; {
		case r == 0: // no sample in the round: no news
		case b.rtProp > 0 && b.queued(r):
			b.standRounds++
		default:
			b.standRounds = 0
		}
		if b.compete {
			b.compRounds++
		}
	}
	switch {
	case b.testing && b.testMark < 0:
		if b.f.inflight <= b.testWindow() {
			b.testMark = b.f.delivered // what goes from here sees the queue without the flow
		} else if b.rounds-b.testStart > 4 {
			b.testing, b.compRounds, b.standRounds = false, 0, 0 // it would not drain: give up
		}
	case b.testing && rs.rtt > 0 && rs.priorDelivered >= b.testMark:
		// The packets sent since the flight drained: one that finds the
		// queue empty ends the test at once; else a flight's worth of
		// them, all behind a queue, does. A queue is judged as the loss
		// response judges it (bbr.queued, with its host-delay floor).
		empty := !b.queued(rs.rtt)
		if !empty && b.f.delivered < b.testMark+int64(b.testWindow()) {
			break
		}
		b.testing, b.compRounds = false, 0
		// Leaving is judged twice as hard. An RTT within bbrQueueRTT of
		// the minimum: the queue is gone. One above that but under the
		// floor is ambiguous: a loaded host's delay on an empty path, or
		// a loss-based flow's queue just after it cut its window; it
		// takes bbrCompeteAmbiguous such tests in a row to leave. (Either
		// rule alone lost: the floor alone sent RD back to BBR's window
		// beside CUBIC after each of its cuts, RD/TCP 0.36 to 0.43; the
		// ratio alone kept a lone flow that a loaded host's delays had
		// sent into competition there for good, RD Write at 2 % random
		// loss 3.6 Gb/s instead of 6.2.)
		gone := float64(rs.rtt) < bbrQueueRTT*float64(b.rtProp)
		switch {
		case b.compete && empty && !gone && b.ambiguous+1 < bbrCompeteAmbiguous:
			b.ambiguous++ // the next test at the same interval
		case b.compete && empty:
			// The test saw the queue empty: the minimum holds from here.
			b.rtPropAt = now
			b.leaveCompetition(now)
		case b.compete:
			// Still shared: the next test comes later (each costs the
			// flow about a round trip's sending).
			b.ambiguous = 0
			b.testEvery = min(2*b.testEvery, bbrCompeteTestMax)
		case !b.compete && !empty:
			b.enterCompetition(now)
		case !b.compete:
			b.standRounds = 0 // the queue was the flow's own
		}
	case b.testing:
	case b.compete && b.compRounds >= b.testEvery,
		!b.compete && b.roundStart && b.mode == bbrProbeBW && b.filledPipe && b.standRounds >= bbrCompeteRounds:
		b.testing, b.testMark, b.testStart, b.testPrior = true, -1, b.rounds, b.window
	}
	if !b.compete || b.testing || rs.acked <= 0 || rs.newestSentAt.IsZero() || !rs.newestSentAt.After(b.compCutAt) {
		return // no growth in a test, nor in a recovery period
	}
	// α packets more per window acked: compAcked counts acked bytes
	// times 100·α.
	b.compAcked += rs.acked * bbrCompeteAlpha100
	for w := 100 * b.compWindow; b.compAcked >= w; w = 100 * b.compWindow {
		b.compAcked -= w
		b.compWindow += b.f.mss
	}
}

// testWindow is the flight a drain test lets out until it has drained:
// one BDP of the flow's own.
func (b *bbr) testWindow() int { return max(b.bdp(1), b.minPipe()) }

func (b *bbr) enterCompetition(now time.Time) {
	b.compete = true
	b.competeEntries++
	b.compWindow = max(b.testPrior, b.minPipe())
	b.compAcked, b.compRounds, b.testEvery = 0, 0, bbrCompeteTestRounds
	b.compCutAt = now
	b.resetLowerBounds()
}

// leaveCompetition goes back to BBR's own window (setCwnd's target).
func (b *bbr) leaveCompetition(now time.Time) {
	if !b.compete {
		return
	}
	b.compete, b.testing, b.standRounds, b.ambiguous = false, false, 0, 0
	b.competeExits++
	b.window = min(b.window, max(b.inflightTarget(b.cwndGain), b.minPipe()))
	b.resetLowerBounds()
}

func (b *bbr) cwnd() int             { return b.window }
func (b *bbr) pacingRate() float64   { return b.pacing }
func (b *bbr) bandwidth() float64    { return b.bw() }
func (b *bbr) minRTT() time.Duration { return max(b.rtProp, 0) }

// burstRTT: a burst longer than a quarter of the minimum RTT would be
// the queue itself on a short path; but while competing a queue stands
// anyway, and bursts of a quarter of the smoothed RTT keep the flow at
// its window when the caller's timer wakes late (on a loaded host, a
// path of 50 µs gave bursts of two packets, and RD ran at the rate of
// its wakeups, a fifth of its window).
func (b *bbr) burstRTT() time.Duration {
	if b.compete {
		return b.rtt.Smoothed(b.cfg.InitialRTT)
	}
	return max(b.rtProp, 0)
}

// ---- NewReno (RFC 9002 §7) ----

type newReno struct {
	f             *flowState
	rtt           *RTT
	cfg           Config
	window        int
	ssthresh      int
	recoveryStart time.Time
	ackedInCA     int
	lastRate      float64
}

func newNewReno(f *flowState, rtt *RTT, cfg Config) *newReno {
	return &newReno{f: f, rtt: rtt, cfg: cfg, window: initialWindow(f.mss), ssthresh: math.MaxInt}
}

func (r *newReno) minWindow() int { return 2 * r.f.mss } // kMinimumWindow

func (r *newReno) onSend(time.Time, int) {}

func (r *newReno) onAck(now time.Time, rs *rateSample) {
	if rs.rate > 0 {
		r.lastRate = rs.rate
	}
	if rs.acked == 0 || rs.newestSentAt.IsZero() || !rs.newestSentAt.After(r.recoveryStart) {
		return // no growth in a recovery period (§7.3.2)
	}
	if r.window < r.ssthresh {
		r.window += rs.acked // slow start
		return
	}
	r.ackedInCA += rs.acked // congestion avoidance: one packet per window
	for r.ackedInCA >= r.window {
		r.ackedInCA -= r.window
		r.window += r.f.mss
	}
}

func (r *newReno) onLoss(now time.Time, p lostPacket) {
	if !p.sentAt.After(r.recoveryStart) {
		return // the same recovery period: one reduction per round trip
	}
	r.recoveryStart = now
	r.ssthresh = max(r.window/2, r.minWindow()) // kLossReductionFactor 0.5
	r.window = r.ssthresh
	r.ackedInCA = 0
}

func (r *newReno) onTimeout(now time.Time, count int) {
	if count >= 2 {
		// Two probe timeouts in a row: persistent congestion (§7.6).
		r.recoveryStart = now
		r.ssthresh = max(r.window/2, r.minWindow())
		r.window = r.minWindow()
	}
}

func (r *newReno) cwnd() int { return r.window }

// pacingRate: N · cwnd / smoothed RTT with N = 1.25 (§7.7).
func (r *newReno) pacingRate() float64 {
	return 1.25 * float64(r.window) / r.rtt.Smoothed(r.cfg.InitialRTT).Seconds()
}
func (r *newReno) bandwidth() float64      { return r.lastRate }
func (r *newReno) minRTT() time.Duration   { return r.rtt.Min() }
func (r *newReno) burstRTT() time.Duration { return r.rtt.Min() }

// quantum is the burst pacing allows at rate (see maxBurstTime), and at
// least two of the largest packets pushed (frame): a burst smaller than
// one packet would pace each of them out alone, a timer wait apiece.
func quantum(rate float64, minRTT time.Duration, mss, frame int) int {
	burst := maxBurstTime
	if minRTT > 0 {
		burst = min(burst, minRTT/4)
	}
	q := int(rate * burst.Seconds())
	return max(min(max(q, 2*mss), maxQuantum), 2*frame)
}
