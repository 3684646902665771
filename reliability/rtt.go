package reliability

import "time"

// RTT estimates a peer's round-trip time as RFC 9002 §5 does: a smoothed
// value and its variation from samples of packets sent once (a
// retransmitted packet's ack is ambiguous, Karn's rule), less the delay
// the receiver reports having held the ack.
type RTT struct {
	smoothed, variation, min, latest time.Duration
	have                             bool
}

// Sample adds one measurement: the time from sending a packet to its
// ack, and the receiver's ack delay.
func (r *RTT) Sample(s, ackDelay time.Duration) {
	if s <= 0 {
		s = time.Microsecond
	}
	r.latest = s
	if !r.have {
		r.have = true
		r.min, r.smoothed, r.variation = s, s, s/2
		return
	}
	r.min = min(r.min, s)
	if s-ackDelay >= r.min {
		s -= ackDelay
	}
	d := r.smoothed - s
	if d < 0 {
		d = -d
	}
	r.variation = (3*r.variation + d) / 4
	r.smoothed = (7*r.smoothed + s) / 8
}

// Smoothed returns the smoothed RTT, or initial before any sample.
func (r *RTT) Smoothed(initial time.Duration) time.Duration {
	if !r.have {
		return initial
	}
	return r.smoothed
}

// Variation returns the RTT variation, or initial/2 before any sample.
func (r *RTT) Variation(initial time.Duration) time.Duration {
	if !r.have {
		return initial / 2
	}
	return r.variation
}

// Latest returns the newest sample.
func (r *RTT) Latest() time.Duration { return r.latest }

// Min returns the smallest sample.
func (r *RTT) Min() time.Duration { return r.min }
