package perf

import "time"

// pacer holds a sender to a byte rate (Config.Rate): after each message
// it sleeps while the bytes sent so far are more than paceSlack ahead of
// the schedule. The schedule is absolute from the first message, so a
// late wake-up is made up by the messages after it, not lost; a sender
// that cannot keep the rate simply sends as fast as it can.
type pacer struct {
	bytesPerNs float64
	start      time.Time
	sent       float64
}

// paceSlack is how far ahead of its schedule a sender may run before it
// sleeps: a sleep shorter than this costs more than the burst it saves
// (a few 64000-byte messages at 10–20 Gb/s).
const paceSlack = 100 * time.Microsecond

// newPacer returns a pacer for gbps Gb/s, or nil (no pacing) for 0.
func newPacer(gbps float64) *pacer {
	if gbps <= 0 {
		return nil
	}
	return &pacer{bytesPerNs: gbps / 8}
}

// sent notes n bytes sent and waits for the schedule if ahead of it.
func (p *pacer) pace(n int) {
	if p == nil {
		return
	}
	if p.start.IsZero() {
		p.start = time.Now()
	}
	p.sent += float64(n)
	due := p.start.Add(time.Duration(p.sent / p.bytesPerNs))
	if d := time.Until(due); d > paceSlack {
		time.Sleep(d)
	}
}

// FlowRate is the rate each of cfg's flows is paced at: Rate split evenly
// over its QP pairs, and over both directions with Bidir.
func (c Config) FlowRate() float64 {
	flows := max(c.QPs, 1)
	if c.Bidir {
		flows *= 2
	}
	return c.Rate / float64(flows)
}
