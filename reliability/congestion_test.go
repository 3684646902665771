package reliability

import (
	"testing"
	"time"
)

// TestSenderCongestionWindow: a BBR or NewReno sender stops at its
// initial window in bytes (RFC 9002's 14,720 for 1,500-byte packets),
// counts bytes in flight down as acks come, and takes a packet back
// with Unpush; without a controller only the peer's window limits it.
func TestSenderCongestionWindow(t *testing.T) {
	now := time.Unix(1, 0)
	for _, cc := range []Congestion{CongestionBBR, CongestionNewReno} {
		s := NewSender[int](Config{Congestion: cc})
		n := 0
		for s.CanSend(now) {
			s.Push(n, 1500, now)
			n++
		}
		if n != 10 || s.BytesInFlight() != 15000 || s.CongestionWindow() != 14720 {
			t.Fatalf("%v: %d packets, %d bytes in flight, window %d; want 10, 15000, 14720", cc, n, s.BytesInFlight(), s.CongestionWindow())
		}
		seq := s.Push(n, 1500, now)
		if !s.Unpush(seq) || s.BytesInFlight() != 15000 {
			t.Fatalf("%v: Unpush left %d bytes in flight", cc, s.BytesInFlight())
		}
		later := now.Add(200 * time.Microsecond)
		if err := s.OnAck(&AckBlock{Cumulative: 4}, 256, false, later, func(uint32, *int) {}, func(uint32, *int) {}); err != nil {
			t.Fatal(err)
		}
		if s.BytesInFlight() != 9000 || !s.CanSend(later) {
			t.Fatalf("%v: %d bytes in flight after 4 of 10 acked, can send %v", cc, s.BytesInFlight(), s.CanSend(later))
		}
		if cc == CongestionBBR && s.MinRTT() != 200*time.Microsecond {
			t.Fatalf("min RTT %v, want 200µs", s.MinRTT())
		}
	}
	// One datagram larger than the window goes when nothing is in flight,
	// and does not make the floors count in packets of its size.
	big := NewSender[int](Config{})
	if !big.CanSend(now) {
		t.Fatal("an idle sender cannot send")
	}
	big.Push(0, 65000, now)
	if big.CanSend(now) || big.flow.mss != MaxMSS || big.CongestionWindow() != initialWindow(DefaultMSS) {
		t.Fatalf("after a 65,000-byte datagram: can send %v, packet size %d, window %d", big.CanSend(now), big.flow.mss, big.CongestionWindow())
	}
	s := NewSender[int](Config{Congestion: CongestionNone, Window: 64})
	n := 0
	for s.CanSend(now) {
		s.Push(n, 9000, now)
		n++
	}
	if n != 64 || !s.SendAt(now).IsZero() || s.CongestionWindow() != 0 || s.PacingRate() != 0 {
		t.Fatalf("no controller: %d packets (want the window, 64), send at %v, window %d, pacing %v", n, s.SendAt(now), s.CongestionWindow(), s.PacingRate())
	}
}

// TestSenderPacing: a paced sender lets a burst of Quantum bytes go at
// once, then one packet per size/rate; an idle sender's credit is one
// quantum, not more; Unpush gives back the time its packet took.
func TestSenderPacing(t *testing.T) {
	now := time.Unix(1, 0)
	s := NewSender[int](Config{Congestion: CongestionBBR, Window: 1024})
	rate, q := s.PacingRate(), s.Quantum()
	// Before any sample: 2/ln2 · 14,720 B / 5 ms, a burst of 1 ms of it.
	if rate < 8.4e6 || rate > 8.6e6 || q != int(rate/1000) {
		t.Fatalf("pacing %.0f B/s, quantum %d", rate, q)
	}
	burst := 0
	for s.SendAt(now).IsZero() {
		s.Push(burst, 1000, now)
		burst++
	}
	if want := q/1000 + 1; burst != want {
		t.Fatalf("a burst of %d packets of 1000 B, want %d (quantum %d B)", burst, want, q)
	}
	at := s.SendAt(now)
	gap := time.Duration(1000 / rate * 1e9)
	if d := at.Sub(now); d <= 0 || d > gap {
		t.Fatalf("next packet after %v, want within %v", d, gap)
	}
	seq := s.Push(burst, 1000, at)
	if next := s.SendAt(at); next.Sub(at) < gap-time.Microsecond || next.Sub(at) > gap+time.Microsecond {
		t.Fatalf("after one more packet: next in %v, want %v", next.Sub(at), gap)
	}
	s.Unpush(seq)
	if !s.SendAt(at).IsZero() {
		t.Fatal("Unpush kept the pacing time of the packet taken back")
	}
	// Idle for a second: the credit is a quantum again, no more.
	idle := now.Add(time.Second)
	n := 0
	for s.SendAt(idle).IsZero() && n < 1000 {
		s.Push(n, 1000, idle)
		n++
	}
	if n != burst {
		t.Fatalf("after idling, a burst of %d packets, want %d", n, burst)
	}
}

// TestNewRenoHalvesOnce: losses in one round trip halve NewReno's window
// once (RFC 9002 §7.3.2); BBR, on the same losses, keeps its window to
// packet conservation and brings it back when the recovery is over.
func TestNewRenoHalvesOnce(t *testing.T) {
	for _, cc := range []Congestion{CongestionNewReno, CongestionBBR} {
		now := time.Unix(1, 0)
		s := NewSender[int](Config{Congestion: cc})
		for i := range 10 {
			s.Push(i, 1000, now)
		}
		before := s.CongestionWindow()
		now = now.Add(time.Millisecond)
		var resent []uint32
		// 0 and 1 are missing, 2..9 arrived: both lost by the packet threshold.
		err := s.OnAck(&AckBlock{Cumulative: 0, Ranges: []Range{{2, 8}}}, 256, false, now, func(uint32, *int) {}, func(seq uint32, _ *int) { resent = append(resent, seq) })
		if err != nil || len(resent) != 2 {
			t.Fatalf("%v: %v, resent %v", cc, err, resent)
		}
		after := s.CongestionWindow()
		switch cc {
		case CongestionNewReno:
			if after != before/2 {
				t.Fatalf("NewReno: window %d after two losses in a round, want %d (once halved)", after, before/2)
			}
		case CongestionBBR:
			// Packet conservation: what is in flight plus what this ack
			// delivered (8 packets), so one packet goes per packet that left.
			if after != s.BytesInFlight()+8000 || after >= before {
				t.Fatalf("BBR: window %d in recovery with %d in flight, was %d", after, s.BytesInFlight(), before)
			}
			// The retransmissions acked: recovery ends, the window returns.
			now = now.Add(time.Millisecond)
			if err := s.OnAck(&AckBlock{Cumulative: 10}, 256, false, now, func(uint32, *int) {}, nil); err != nil {
				t.Fatal(err)
			}
			if s.CongestionWindow() < before {
				t.Fatalf("BBR: window %d after recovery, was %d", s.CongestionWindow(), before)
			}
		}
	}
}

// TestBBRCongestiveLoss: BBR reads a loss as congestion only at a
// standing queue. The same lost packet (its flight lost 5 %, over
// bbrLossThresh) leaves the window alone when the round's RTTs are at
// the minimum (random loss), and at a standing queue cuts inflightHi
// to bbrBeta of that flight, once per round trip, bounds the window by
// it less the headroom, and cuts the lower bounds when the round ends.
func TestBBRCongestiveLoss(t *testing.T) {
	now := time.Unix(1, 0)
	// The round's least RTT: at the minimum; 2.5 times it but only
	// 300 µs above it, within the granularity (1 ms: a host's scheduling,
	// not a queue); and 2 ms above it, a queue.
	for _, roundMin := range []time.Duration{210 * time.Microsecond, 500 * time.Microsecond, 2200 * time.Microsecond} {
		standing := roundMin > 2*time.Millisecond
		f := &flowState{mss: 1500, inflight: 60000, delivered: 1 << 20}
		var rtt RTT
		b := newBBR(f, &rtt, Config{}.Fill())
		b.rtProp, b.filledPipe = 200*time.Microsecond, true
		b.enterProbeBW(now)
		b.pacingGain = 1 // cruising, not probing
		b.btlBw.update(0, 125e6, bbrBtlBwRounds)
		b.window = 100000
		b.roundMinRTT = roundMin
		// Packets sent 1 ms ago with 60,000 B in flight; 3,000 B of it lost.
		lost := lostPacket{size: 1500, sentAt: now.Add(-time.Millisecond), txInflight: 60000, lostBefore: 0}
		f.lost = 1500
		b.onLoss(now, lost)
		f.lost = 3000
		b.onLoss(now, lost)
		f.inflight -= 3000
		b.nextRoundDelivered = f.delivered + 1 // the next ack ends the round
		b.onAck(now.Add(100*time.Microsecond), &rateSample{acked: 1500, priorDelivered: f.delivered + 1, rate: 100e6, delivered: 30000, rtt: b.roundMinRTT})
		f.delivered += 1500
		if !standing {
			if b.congestiveLosses != 0 || b.inflightHi != 0 || b.bwLo != 0 || b.inflightLo != 0 {
				t.Fatalf("loss with the round's least RTT %v (min %v) read as congestion: %d losses, inflight_hi %d, bw_lo %.0f, inflight_lo %d", roundMin, b.rtProp, b.congestiveLosses, b.inflightHi, b.bwLo, b.inflightLo)
			}
			continue
		}
		if b.congestiveLosses != 2 || b.tooHigh != 2 {
			t.Fatalf("at a standing queue: %d congestive losses, %d over the threshold; want 2, 2", b.congestiveLosses, b.tooHigh)
		}
		if want := int(bbrBeta * 60000); b.inflightHi != want {
			t.Fatalf("inflight_hi %d, want %d (cut once, to 0.7 of the flight)", b.inflightHi, want)
		}
		if hi := b.inflightHi - int(bbrHeadroom*float64(b.inflightHi)); b.cwnd() > hi {
			t.Fatalf("window %d above inflight_hi less the headroom, %d", b.cwnd(), hi)
		}
		if b.bwLo != bbrBeta*125e6 || b.inflightLo == 0 {
			t.Fatalf("the lossy round ended: bw_lo %.0f (want %.0f), inflight_lo %d", b.bwLo, bbrBeta*125e6, b.inflightLo)
		}
		if b.bw() != b.bwLo {
			t.Fatalf("bandwidth %.0f, want bw_lo %.0f", b.bw(), b.bwLo)
		}
		// A bandwidth probe forgets the lower bounds.
		b.cycleIndex = bbrGainCycleLen - 1
		b.advanceCycle(now)
		if !b.probingUp() || b.bwLo != 0 || b.inflightLo != 0 {
			t.Fatalf("probing %v: bw_lo %.0f, inflight_lo %d", b.probingUp(), b.bwLo, b.inflightLo)
		}
	}
}

// TestBBRCompetingLoss: while BBR competes with a loss-based flow, a
// loss the packet threshold found at a standing queue cuts its window to
// 0.7, once per round trip (a second loss of a packet sent before the cut
// does not); a loss by the time threshold alone does not cut it, nor does
// one with no queue standing (random: a lone flow that a loaded host's
// delays sent into competition must not cut at each random loss).
func TestBBRCompetingLoss(t *testing.T) {
	now := time.Unix(10, 0)
	f := &flowState{mss: 1500}
	b := newBBR(f, &RTT{}, Config{}.Fill())
	b.compete, b.compWindow, b.compCutAt = true, 100000, now.Add(-time.Second)
	b.rtProp, b.roundMinRTT = 200*time.Microsecond, 250*time.Microsecond // no queue
	b.onLoss(now, lostPacket{size: 1500, sentAt: now.Add(-time.Millisecond)})
	if b.compWindow != 100000 {
		t.Fatalf("a loss with no queue standing cut the competing window to %d", b.compWindow)
	}
	b.roundMinRTT = 5 * time.Millisecond // a queue stands
	b.onLoss(now, lostPacket{size: 1500, sentAt: now.Add(-time.Millisecond), byTime: true})
	if b.compWindow != 100000 {
		t.Fatalf("a loss by the time threshold cut the competing window to %d", b.compWindow)
	}
	b.onLoss(now, lostPacket{size: 1500, sentAt: now.Add(-time.Millisecond)})
	if b.compWindow != 70000 || b.window != 70000 {
		t.Fatalf("after a loss by the packet threshold: competing window %d, window %d; want 70000", b.compWindow, b.window)
	}
	b.onLoss(now.Add(time.Microsecond), lostPacket{size: 1500, sentAt: now.Add(-time.Microsecond)})
	if b.compWindow != 70000 {
		t.Fatalf("a second loss from the same flight cut the window again, to %d", b.compWindow)
	}
}

// TestBBRHostDelayIsNoQueue: on a path of tens of microseconds a host's
// scheduling stretches every RTT tenfold, but by less than the timer
// granularity: no round reads as a standing queue, so a lone flow never
// starts a drain test or competes. Counted with the ratio alone, a veth
// between two namespaces sent a lone RD flow into competition at 5 %
// random loss (1 Gb/s, 5.7 without a controller); a queue a millisecond
// deep still counts.
func TestBBRHostDelayIsNoQueue(t *testing.T) {
	for _, tc := range []struct {
		roundMin time.Duration
		queue    bool
	}{{300 * time.Microsecond, false}, {900 * time.Microsecond, false}, {1500 * time.Microsecond, true}} {
		now := time.Unix(10, 0)
		f := &flowState{mss: 1500, inflight: 30000, delivered: 1 << 20}
		b := newBBR(f, &RTT{}, Config{}.Fill())
		b.rtProp, b.filledPipe = 30*time.Microsecond, true
		b.enterProbeBW(now)
		for range 3 * bbrCompeteRounds {
			b.roundStart, b.prevRoundMinRTT = true, tc.roundMin
			b.updateCompetition(now, &rateSample{})
		}
		if got := b.queueStanding() || b.standRounds > 0 || b.testing; got != tc.queue {
			t.Errorf("rounds whose least RTT is %v (min 30µs): queue standing %v, standing rounds %d, drain test %v; want a queue: %v",
				tc.roundMin, b.queueStanding(), b.standRounds, b.testing, tc.queue)
		}
	}
}

// TestQuantumCoversLargeFrames: pacing's burst is at least two of the
// largest packets pushed, even where they are larger than MaxMSS
// (loopback's datagrams of up to 64 KiB): a quantum of two jumbo frames
// (18,000 bytes) held the second of two 60,000-byte frames back for a
// timer, and a 64 KiB RD Send on loopback, two frames, took milliseconds
// instead of tens of microseconds (BENCHMARKS.md, issue 34).
func TestQuantumCoversLargeFrames(t *testing.T) {
	now := time.Unix(1, 0)
	s := NewSender[int](Config{Congestion: CongestionBBR, Window: 1024})
	s.Push(0, 60000, now)
	if q := s.Quantum(); q < 2*60000 {
		t.Fatalf("quantum %d after a 60,000-byte frame, want at least two such", q)
	}
	if at := s.SendAt(now); !at.IsZero() {
		t.Fatalf("the second 60,000-byte frame of a burst waits until %v", at.Sub(now))
	}
	// The window floors still count in packets of at most MaxMSS.
	if s.flow.mss != MaxMSS {
		t.Fatalf("packet size %d, want MaxMSS", s.flow.mss)
	}
}
