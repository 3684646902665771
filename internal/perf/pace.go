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

// ThroughputSteps is how many paced trials Throughput's search makes
// after its unpaced probe: the answer is within ceiling/2^steps of the
// rate sought.
const ThroughputSteps = 6

// Throughput finds cfg's throughput in the sense of RFC 2544 §26.1: the
// fastest offered rate (Config.Rate, Gb/s of payload) at which a
// bandwidth run loses nothing. run makes one bandwidth run (perf.Run, or
// a remote session's). The search first runs unpaced; unless cfg.Rate
// sets the ceiling, it is a fifth above that run's goodput (a sender
// cannot offer more losslessly than its receiver takes unpaced, give or
// take a noisy host). It then bisects [0, ceiling] ThroughputSteps
// times, each trial a full run of cfg.Duration. A trial passes when
// nothing was lost (Result.Lost: messages, or Write-Records not whole)
// and the goodput reached 97 % of the rate offered (a reliable mode that
// cannot keep up loses nothing but falls behind). The result is the
// fastest passing trial's, its Rate the rate offered; Gbps 0 when none
// passed.
func Throughput(cfg Config, run func(Config) (Result, error)) (Result, error) {
	if err := cfg.throughputCheck(); err != nil {
		return Result{Config: cfg}, err
	}
	ceiling := cfg.Rate
	probe := cfg
	probe.Rate = 0
	r, err := run(probe)
	if err != nil {
		return r, err
	}
	if ceiling <= 0 {
		ceiling = 1.2 * r.Gbps
	}
	best := Result{Config: cfg}
	best.Rate = 0
	lo, hi := 0.0, ceiling
	for range ThroughputSteps {
		c := cfg
		c.Rate = (lo + hi) / 2
		r, err := run(c)
		if err != nil {
			return r, err
		}
		if r.Lost == 0 && r.Gbps >= 0.97*c.Rate {
			lo, best = c.Rate, r
		} else {
			hi = c.Rate
		}
	}
	return best, nil
}

// throughputCheck refuses a throughput search of a mode -rate cannot
// pace.
func (c Config) throughputCheck() error {
	p := c
	p.Rate = 1
	return p.Check()
}
