package reliability

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// A deterministic simulation of many RD endpoints (Endpoint) over a
// simulated network in virtual time, in the manner of FoundationDB's and
// TigerBeetle's simulators: every decision — the network's loss,
// duplication, reordering, delay, corruption, bottleneck queues and
// partitions; which endpoints restart (losing all state) or stop taking
// deliveries; what the hostile peers replay, forge and churn — comes
// from one seed, so a failing seed replays exactly:
//
//	go test -run 'TestSim$' ./reliability -sim.seed N -v
//
// and a campaign runs on demand:
//
//	go test -run 'TestSimCampaign' ./reliability -sim.seeds 10000
//
// After every run it checks the invariants (simnet.check): each segment
// delivered at most once and, per sender and receiver, in post order; a
// message completes once, Success only if every segment was delivered
// (and not refused); no segment of a message is delivered after the
// message failed; an "atomic" message executes at most once; every
// message of a live sender completes; between peers the faults never
// touched, every message completes Success (no peer starves another:
// a stalled, partitioned or hostile peer costs only itself); peers per
// endpoint and per address, held bytes per peer and per endpoint, and
// graves stay within their caps.

var (
	simSeeds   = flag.Int("sim.seeds", 0, "TestSimCampaign: how many seeds to run (0: skip)")
	simFirst   = flag.Uint64("sim.first", 1000, "TestSimCampaign: the first seed")
	simSeed    = flag.Uint64("sim.seed", 0, "TestSim: run this seed only")
	simTrace   = flag.String("sim.trace", "", "print the frames to and from this address")
	simVerbose = flag.Bool("sim.v", false, "log each run's parameters and counts")
)

// simFixedSeeds run in every `go test ./reliability`.
const simFixedSeeds = 120

var simStart = time.Unix(1_000_000_000, 0)

// simParams are a run's parameters, all drawn from its seed.
type simParams struct {
	honest, churners        int
	loss, dup, corrupt      float64
	delay, jitter           time.Duration
	rate                    float64 // bytes/s into each endpoint (0: unlimited)
	queue                   int     // bytes a bottleneck queues
	partitions, restarts    int
	rnr, forgers, full      bool
	shut                    bool // an endpoint advertises a shut window for a while
	poison                  float64
	active                  time.Duration
	msgs                    int // per honest endpoint
	maxPeers, perAddr, gy   int
	idle                    time.Duration
	cc                      Congestion
	window                  int
	batch                   float64
	churnEvery, replayEvery time.Duration
}

func drawParams(rng *rand.Rand) simParams {
	p := simParams{
		honest:  3 + rng.IntN(6),
		loss:    []float64{0, 0.01, 0.05, 0.15}[rng.IntN(4)],
		dup:     []float64{0, 0, 0.02, 0.1}[rng.IntN(4)],
		corrupt: []float64{0, 0, 0.01}[rng.IntN(3)],
		delay:   time.Duration(50+rng.IntN(5000)) * time.Microsecond,
		active:  time.Duration(500+rng.IntN(2500)) * time.Millisecond,
		msgs:    5 + rng.IntN(40),
		idle:    time.Duration(1+rng.IntN(5)) * time.Second,
		cc:      Congestion(rng.IntN(3)),
		window:  []int{4, 16, 256}[rng.IntN(3)],
		batch:   rng.Float64(),
	}
	p.jitter = time.Duration(rng.Int64N(int64(p.delay)))
	if rng.IntN(3) == 0 {
		p.rate = float64(1+rng.IntN(20)) * 125_000 // 1-20 Mbit/s
		p.queue = 2_000 + rng.IntN(60_000)
	}
	if rng.IntN(3) == 0 {
		p.partitions = 1 + rng.IntN(3)
	}
	if rng.IntN(3) == 0 {
		p.restarts = 1 + rng.IntN(2)
	}
	p.rnr = rng.IntN(3) == 0
	p.forgers = rng.IntN(3) == 0
	p.full = rng.IntN(4) == 0
	p.shut = rng.IntN(4) == 0
	if rng.IntN(3) == 0 {
		p.poison = 0.05
	}
	p.maxPeers, p.perAddr, p.gy = 64, 64, 1024
	if rng.IntN(2) == 0 {
		// The graveyard attack of issue 30 item 1: peers that reopen
		// their sessions over and over at small caps, replaying their
		// own old frames.
		p.churners = 1 + rng.IntN(6)
		p.maxPeers = p.honest + rng.IntN(4)
		p.perAddr = 1 + rng.IntN(3)
		p.gy = 1 + rng.IntN(8)
		p.churnEvery = time.Duration(2+rng.IntN(30)) * time.Millisecond
		p.replayEvery = time.Duration(1+rng.IntN(10)) * time.Millisecond
	}
	return p
}

// simMsg is one message and what became of it.
type simMsg struct {
	id           uint64
	from, to     *simNode
	fromInc      int
	nseg         uint32
	size         int
	atomic       bool
	poison       bool
	postedAt     time.Time
	delivered    []int // per segment
	refused      bool
	completed    bool
	err          error
	doneAt       time.Time
	execs        int
	orphan       bool // its sender restarted before it completed
	lastDelivery time.Time
	// epoch is the sender's epoch in the last frame of it sent;
	// failEpoch that epoch when the sender gave up (RetryExceeded,
	// RNRRetryExceeded, a flush): a copy already on its way may still be
	// delivered in that session, never in a later one (docs/verbs.md,
	// Sessions).
	epoch, failEpoch uint32
	// awaits: it completes only once its response came (Responded),
	// which its receiver sends when it delivered the last segment.
	awaits    bool
	ticket    *Message[*simMsg, struct{}]
	responded bool
}

type simNode struct {
	s       *simnet
	idx     int
	addr    netip.AddrPort
	qpn     uint32
	ep      *Endpoint[*simMsg, struct{}]
	inc     int
	hostile bool
	// faults it saw: restarted, stalled (not ready for a while), posts
	// it still has to make, its captured INIT Data frames (a churner
	// replays its own old frames).
	restarted bool
	rnrFrom   time.Time
	rnrUntil  time.Time
	stalled   bool
	shutFrom  time.Time
	shutUntil time.Time
	posts     []time.Time
	captured  []simPacket // with the incarnation that sent each in order
	capInc    []int
	fullUntil time.Time
	writable  time.Time
}

// simHost is one incarnation of a node: a restarted node's old endpoint
// is gone with its host.
type simHost struct {
	n   *simNode
	inc int
}

type simPacket struct {
	at       time.Time
	order    uint64
	from, to netip.AddrPort
	b        []byte
}

type simQueue []*simPacket

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].at.Equal(q[j].at) {
		return q[i].order < q[j].order
	}
	return q[i].at.Before(q[j].at)
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(*simPacket)) }
func (q *simQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// simResp is a response on its way back to the sender of an awaiting
// message (not itself an RD message: the simulation hands it over after
// a delay, which is all the sender's Endpoint sees of it).
type simResp struct {
	at  time.Time
	m   *simMsg
	inc int
}

type simPartition struct {
	a, b     int // node indexes; b < 0: a from everyone
	from, to time.Time
}

type simnet struct {
	seed   uint64
	p      simParams
	rng    *rand.Rand
	now    time.Time
	nodes  []*simNode
	byAddr map[netip.AddrPort]*simNode
	q      simQueue
	order  uint64
	msgs   map[uint64]*simMsg
	nextID uint64
	links  map[netip.AddrPort]time.Time // when each inbound bottleneck is free
	resps  []simResp
	parts  []simPartition
	last   map[[3]int][2]uint64 // per (sender, its incarnation, receiver): last (message, segment) delivered
	errs   []string
	// counts
	frames, dropped, forged, replayed, restarts, delivered uint64
	trains                                                 uint64 // trains sent whole
	late, aborted                                          uint64 // delivered after giving up, in the same session; aborted between untouched peers
	cov                                                    simCoverage
	peerSeconds                                            float64
}

func (s *simnet) fail(format string, a ...any) {
	if len(s.errs) < 10 {
		s.errs = append(s.errs, fmt.Sprintf("t=%v: ", s.now.Sub(simStart))+fmt.Sprintf(format, a...))
	}
}

// simRand feeds an Endpoint's epochs, tokens and secrets from the seed.
type simRand struct{ r *rand.Rand }

func (r simRand) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(r.r.Uint32())
	}
	return len(b), nil
}

// simCoverage counts what the endpoints did, over every incarnation:
// it shows which paths a run reached.
type simCoverage struct {
	challenges, restarts, reclaimed, addrLimited, refused, overBudget uint64
	notReady, probes, retransmits, failures, badFrames, rejected      uint64
	trains                                                            uint64
}

func (c *simCoverage) add(st *EndpointStats) {
	c.challenges += st.Challenges
	c.restarts += st.Restarts
	c.reclaimed += st.Reclaimed
	c.addrLimited += st.AddrLimited
	c.refused += st.Refused
	c.overBudget += st.OverBudget
	c.notReady += st.NotReady
	c.probes += st.WindowProbes
	c.retransmits += st.Retransmits
	c.failures += st.PeerFailures
	c.badFrames += st.BadFrames
	c.rejected += st.Rejected
	c.trains += st.Trains
}

func (c *simCoverage) sum(o *simCoverage) {
	c.challenges += o.challenges
	c.restarts += o.restarts
	c.reclaimed += o.reclaimed
	c.addrLimited += o.addrLimited
	c.refused += o.refused
	c.overBudget += o.overBudget
	c.notReady += o.notReady
	c.probes += o.probes
	c.retransmits += o.retransmits
	c.failures += o.failures
	c.badFrames += o.badFrames
	c.rejected += o.rejected
	c.trains += o.trains
}

func (s *simnet) newEndpoint(n *simNode) {
	if n.ep != nil {
		s.cov.add(&n.ep.Stats)
	}
	cfg := EndpointConfig{
		Config:      Config{Window: s.p.window, Congestion: s.p.cc, MaxRetries: 10},
		QPN:         n.qpn,
		MaxPeers:    s.p.maxPeers,
		IdleTimeout: s.p.idle,
		Graveyard:   s.p.gy,
		Rand:        simRand{rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64()))},
		// Small budgets, so that the simulation reaches them.
		MaxHeldBytes:         8 << 10,
		MaxEndpointHeldBytes: 24 << 10,
	}
	cfg.MaxPeersPerAddr = s.p.perAddr
	n.ep = NewEndpoint[*simMsg, struct{}](cfg, &simHost{n: n, inc: n.inc})
}

func runSim(seed uint64) *simnet {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed5eed))
	s := &simnet{seed: seed, rng: rng, now: simStart, byAddr: map[netip.AddrPort]*simNode{}, msgs: map[uint64]*simMsg{},
		links: map[netip.AddrPort]time.Time{}, last: map[[3]int][2]uint64{}}
	s.p = drawParams(rng)
	p := &s.p
	end := simStart.Add(p.active)
	for i := range p.honest + p.churners {
		n := &simNode{s: s, idx: i, hostile: i >= p.honest}
		if n.hostile {
			// Churners share one address (MaxPeersPerAddr), each its port.
			n.addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 9, 9, 9}), uint16(5000+i))
			n.qpn = 7
		} else {
			n.addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + i)}), 4791)
			n.qpn = uint32(1 + i%3)
			for range p.msgs {
				n.posts = append(n.posts, simStart.Add(time.Duration(rng.Int64N(int64(p.active)))))
			}
			sortTimes(n.posts)
		}
		s.nodes = append(s.nodes, n)
		s.byAddr[n.addr] = n
		s.newEndpoint(n)
	}
	for range p.partitions {
		a := rng.IntN(p.honest)
		b := rng.IntN(p.honest+1) - 1
		from := simStart.Add(time.Duration(rng.Int64N(int64(p.active))))
		s.parts = append(s.parts, simPartition{a: a, b: b, from: from, to: from.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))})
	}
	type restart struct {
		n     *simNode
		at    time.Time
		flush bool
	}
	var restarts []restart
	for range p.restarts {
		restarts = append(restarts, restart{s.nodes[rng.IntN(p.honest)], simStart.Add(time.Duration(rng.Int64N(int64(p.active)))), rng.IntN(2) == 0})
	}
	if p.rnr {
		n := s.nodes[rng.IntN(p.honest)]
		n.rnrFrom = simStart.Add(time.Duration(rng.Int64N(int64(p.active))))
		n.rnrUntil = n.rnrFrom.Add(time.Duration(rng.Int64N(int64(2 * time.Second))))
		n.stalled = true
	}
	if p.shut {
		// Its frames say it can take nothing more: its peers' senders
		// probe it (zero-window probes) and give up after MaxRetries.
		n := s.nodes[rng.IntN(p.honest)]
		n.shutFrom = simStart.Add(time.Duration(rng.Int64N(int64(p.active))))
		n.shutUntil = n.shutFrom.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
		n.stalled = true
	}
	nextChurn := make([]time.Time, len(s.nodes))
	nextReplay := make([]time.Time, len(s.nodes))
	for i := p.honest; i < len(s.nodes); i++ {
		nextChurn[i] = simStart.Add(time.Duration(rng.Int64N(int64(p.churnEvery))))
		nextReplay[i] = simStart.Add(p.replayEvery)
	}
	nextForge := simStart
	// The run: the active phase, then a quiet one (faults over, nothing
	// new posted) long enough for every message to complete or fail.
	limit := end.Add(40 * time.Second)
	stuck := 0
	for steps := 0; ; steps++ {
		next := limit
		early := func(t time.Time) {
			if !t.IsZero() && t.Before(next) {
				next = t
			}
		}
		if len(s.q) > 0 {
			early(s.q[0].at)
		}
		for i, n := range s.nodes {
			early(n.ep.Deadline(s.now))
			if len(n.posts) > 0 {
				early(n.posts[0])
			}
			if !n.writable.IsZero() {
				early(n.writable)
			}
			if n.hostile && s.now.Before(end) {
				early(nextChurn[i])
				early(nextReplay[i])
			}
		}
		for _, r := range restarts {
			early(r.at)
		}
		for _, r := range s.resps {
			early(r.at)
		}
		if p.forgers && s.now.Before(end) {
			early(nextForge)
		}
		if !next.After(s.now) {
			next = s.now
			if stuck++; stuck > 100_000 {
				s.fail("livelock: no progress at one instant")
				break
			}
		} else {
			stuck = 0
		}
		if next.After(end) && s.quiet() || !next.Before(limit) {
			s.peerSeconds += float64(len(s.nodes)) * next.Sub(simStart).Seconds()
			break
		}
		s.now = next
		// Arrivals at this instant, a batch per node in a row.
		for len(s.q) > 0 && !s.q[0].at.After(s.now) {
			pk := heap.Pop(&s.q).(*simPacket)
			n := s.byAddr[pk.to]
			if *simTrace != "" && (pk.to.String() == *simTrace || pk.from.String() == *simTrace) {
				var h Header
				err := h.Parse(pk.b)
				var id uint64
				if err == nil && h.Type == Data && len(pk.b) >= h.Size+8 {
					id = binary.BigEndian.Uint64(pk.b[h.Size:])
				}
				fmt.Printf("%v %v->%v %v flags=%x ep=%x tok=%x seq=%d issued=%x win=%d msg=%d err=%v\n", s.now.Sub(simStart), pk.from, pk.to, h.Type, h.Flags, h.Epoch, h.Token, h.Seq, h.Issued, h.Window, id, err)
			}
			n.ep.Receive(s.now, pk.from, pk.b)
			if len(s.q) > 0 && !s.q[0].at.After(s.now) && s.q[0].to == pk.to && rng.Float64() < p.batch {
				continue // the same read batch
			}
			n.ep.EndBatch(s.now)
		}
		for i, n := range s.nodes {
			if !n.writable.IsZero() && !n.writable.After(s.now) {
				n.writable = time.Time{}
				n.ep.Writable(s.now)
			}
			if d := n.ep.Deadline(s.now); !d.IsZero() && !d.After(s.now) {
				n.ep.Tick(s.now)
			}
			for len(n.posts) > 0 && !n.posts[0].After(s.now) {
				n.posts = n.posts[1:]
				s.post(n)
			}
			if n.hostile && s.now.Before(end) {
				if !nextChurn[i].After(s.now) {
					s.churn(n)
					nextChurn[i] = s.now.Add(time.Duration(1 + rng.Int64N(int64(2*p.churnEvery))))
				}
				if !nextReplay[i].After(s.now) {
					s.replay(n)
					nextReplay[i] = s.now.Add(time.Duration(1 + rng.Int64N(int64(2*p.replayEvery))))
				}
			}
		}
		for j := 0; j < len(s.resps); j++ {
			if r := s.resps[j]; !r.at.After(s.now) {
				if r.m.from.inc == r.inc && r.m.ticket != nil {
					r.m.responded = true
					r.m.from.ep.Responded(s.now, r.m.ticket, nil)
				}
				s.resps = append(s.resps[:j], s.resps[j+1:]...)
				j--
			}
		}
		for j := 0; j < len(restarts); j++ {
			if r := restarts[j]; !r.at.After(s.now) {
				if r.flush {
					// The QP went to ERROR and back: its endpoint
					// flushes every message and buries every session,
					// and serves on.
					r.n.restarted = true
					r.n.ep.Flush()
				} else {
					s.restart(r.n)
				}
				restarts = append(restarts[:j], restarts[j+1:]...)
				j--
			}
		}
		if p.forgers && s.now.Before(end) && !nextForge.After(s.now) {
			s.forge()
			nextForge = s.now.Add(time.Duration(rng.Int64N(int64(5 * time.Millisecond))))
		}
		if steps%64 == 0 {
			s.checkCaps()
		}
	}
	s.checkCaps()
	s.check()
	for _, n := range s.nodes {
		s.cov.add(&n.ep.Stats)
	}
	return s
}

func sortTimes(ts []time.Time) {
	for i := 1; i < len(ts); i++ {
		for j := i; j > 0 && ts[j].Before(ts[j-1]); j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

// quiet: every honest message of a live sender completed.
func (s *simnet) quiet() bool {
	for _, m := range s.msgs {
		if !m.completed && !m.orphan && !m.from.hostile {
			return false
		}
	}
	return true
}

func (s *simnet) post(n *simNode) {
	to := s.nodes[s.rng.IntN(s.p.honest)]
	if s.p.churners > 0 && s.rng.IntN(8) == 0 {
		// Work for a churner: its peer state is not reclaimable while
		// the work is outstanding, so the caps refuse first contacts.
		to = s.nodes[s.p.honest+s.rng.IntN(s.p.churners)]
	}
	if to == n {
		return
	}
	s.nextID++
	m := &simMsg{id: s.nextID, from: n, to: to, fromInc: n.inc, nseg: uint32(1 + s.rng.IntN(6)), size: 64 + s.rng.IntN(1300), postedAt: s.now}
	if s.rng.IntN(10) == 0 {
		m.atomic, m.nseg = true, 1
	}
	m.poison = s.rng.Float64() < s.p.poison
	m.delivered = make([]int, m.nseg)
	s.msgs[m.id] = m
	m.awaits = s.rng.IntN(8) == 0
	var flags PostFlags
	if m.awaits {
		flags = PostAwaits
	}
	w, err := n.ep.Post(s.now, PeerKey{to.addr, to.qpn}, m, m.nseg, flags)
	if err != nil {
		m.completed, m.err, m.doneAt = true, err, s.now
	}
	m.ticket = w
}

// churn: a hostile peer reopens its session (a new endpoint on the same
// address and QP) and sends one message to a random honest endpoint.
func (s *simnet) churn(n *simNode) {
	n.inc++
	s.restarts++
	s.newEndpoint(n)
	to := s.nodes[s.rng.IntN(s.p.honest)]
	s.nextID++
	m := &simMsg{id: s.nextID, from: n, to: to, fromInc: n.inc, nseg: 1, size: 32, postedAt: s.now, atomic: true, delivered: make([]int, 1)}
	s.msgs[m.id] = m
	w, err := n.ep.Post(s.now, PeerKey{to.addr, to.qpn}, m, 1, 0)
	if err != nil {
		m.completed, m.err, m.doneAt = true, err, s.now
	}
	m.ticket = w
}

// replay: a hostile peer sends again one of its own session-opening
// Data frames of an earlier session to where it went.
func (s *simnet) replay(n *simNode) {
	if len(n.captured) == 0 {
		return
	}
	i := s.rng.IntN(len(n.captured))
	if n.capInc[i] == n.inc {
		// Not its current session's: a peer that replays its own live
		// frames only draws Challenges that make it send them again,
		// which is its own doing (docs/wire.md §11.2); the attack is on
		// ended sessions.
		return
	}
	c := n.captured[i]
	s.replayed++
	s.transmit(c.from, c.to, append([]byte(nil), c.b...))
}

// forge: a datagram with a spoofed honest source and made-up epoch and
// tokens, of any type, to an honest endpoint.
func (s *simnet) forge() {
	from := s.nodes[s.rng.IntN(s.p.honest)]
	to := s.nodes[s.rng.IntN(s.p.honest)]
	f := Fields{Type: Type(1 + s.rng.IntN(4)), Window: uint16(s.rng.Uint32()), DstQPN: to.qpn, SrcQPN: from.qpn,
		Epoch: 1 + s.rng.Uint32N(1<<31), Token: s.rng.Uint64(), Seq: s.rng.Uint32N(64), Init: true, Issued: s.rng.Uint64()}
	if f.Type == Ack {
		f.Init = s.rng.IntN(2) == 0
		f.Ack = &AckBlock{Cumulative: s.rng.Uint32N(64)}
	}
	if f.Type != Data && f.Type != Ack {
		f.Token = 0
	}
	b := Append(nil, &f)
	if f.Type == Data {
		b = binary.BigEndian.AppendUint64(b, 1<<62|s.rng.Uint64N(1000)) // a message no one posted
		b = binary.BigEndian.AppendUint32(b, 0)
	}
	s.forged++
	s.transmit(from.addr, to.addr, b)
}

// restart: an honest endpoint loses all its state.
func (s *simnet) restart(n *simNode) {
	for _, m := range s.msgs {
		if m.from == n && m.fromInc == n.inc && !m.completed {
			m.orphan = true
		}
	}
	n.inc++
	n.restarted = true
	s.restarts++
	s.newEndpoint(n)
}

func (s *simnet) partitioned(a, b *simNode) bool {
	for _, p := range s.parts {
		if s.now.Before(p.from) || !s.now.Before(p.to) {
			continue
		}
		if p.a == a.idx && (p.b < 0 || p.b == b.idx) || p.a == b.idx && (p.b < 0 || p.b == a.idx) {
			return true
		}
	}
	return false
}

// transmit puts a datagram on the network.
func (s *simnet) transmit(from, to netip.AddrPort, b []byte) {
	s.frames++
	src, dst := s.byAddr[from], s.byAddr[to]
	if dst == nil || src == nil {
		s.dropped++
		return
	}
	p := &s.p
	end := simStart.Add(p.active)
	faults := s.now.Before(end)
	if faults && (s.partitioned(src, dst) || s.rng.Float64() < p.loss) {
		s.dropped++
		return
	}
	if faults && s.rng.Float64() < p.corrupt {
		// A frame the CRC would refuse reaches the parser damaged:
		// truncated, or a reserved flag set.
		if s.rng.IntN(2) == 0 {
			b = b[:s.rng.IntN(HeaderSize)]
		} else {
			b[1] |= 0x80
		}
	}
	at := s.now.Add(p.delay)
	if p.rate > 0 {
		start := at
		if free := s.links[to]; free.After(start) {
			start = free
		}
		if backlog := start.Sub(at).Seconds() * p.rate; backlog > float64(p.queue) {
			s.dropped++
			return
		}
		free := start.Add(time.Duration(float64(len(b)+28) / p.rate * 1e9))
		s.links[to] = free
		at = free
	}
	if p.jitter > 0 {
		at = at.Add(time.Duration(s.rng.Int64N(int64(p.jitter))))
	}
	copies := 1
	if faults && s.rng.Float64() < p.dup {
		copies = 2 // back to back
	}
	for range copies {
		s.order++
		heap.Push(&s.q, &simPacket{at: at, order: s.order, from: from, to: to, b: b})
	}
}

// The Host of a node's incarnation.

func (h *simHost) SegmentSize(m *simMsg, i uint32) int { return m.size }

func (h *simHost) Send(f *Frame[*simMsg, struct{}]) error {
	n, s := h.n, h.n.s
	if n.inc != h.inc {
		panic("a restarted endpoint's host was called")
	}
	if f.Type == Data && f.First && s.p.full && s.now.Before(n.fullUntil) {
		return ErrWouldBlock
	}
	h.send(f)
	return nil
}

// Train lets up to 16 segments go together, as a GSO socket lets 64.
func (h *simHost) Train(m *simMsg, i, n uint32) int { return min(int(n), 16) }

// SendTrain sends the frames of a train all at once, or none: the socket
// is full, or (one time in ten) it refuses the train, as a socket that
// cannot take GSO does.
func (h *simHost) SendTrain(fs []Frame[*simMsg, struct{}]) error {
	n, s := h.n, h.n.s
	if n.inc != h.inc {
		panic("a restarted endpoint's host was called")
	}
	if s.p.full && s.now.Before(n.fullUntil) {
		return ErrWouldBlock
	}
	if s.rng.IntN(10) == 0 {
		return errTrainRefused
	}
	s.trains++
	for i := range fs {
		h.send(&fs[i])
	}
	return nil
}

var errTrainRefused = errors.New("simnet: train refused")

func (h *simHost) send(f *Frame[*simMsg, struct{}]) {
	n, s := h.n, h.n.s
	b := append([]byte(nil), f.Header...)
	if (f.Type == Data || f.Type == Ack) && !s.now.Before(n.shutFrom) && s.now.Before(n.shutUntil) {
		b[2], b[3] = 0, 0 // window 0
	}
	if f.Type == Data {
		f.Msg.epoch = binary.BigEndian.Uint32(f.Header[12:])
		b = binary.BigEndian.AppendUint64(b, f.Msg.id)
		b = binary.BigEndian.AppendUint32(b, f.Index)
		b = append(b, make([]byte, f.Msg.size-12)...)
		if n.hostile && f.Header[1]&byte(FlagInit) != 0 && len(n.captured) < 64 {
			n.captured = append(n.captured, simPacket{from: n.addr, to: f.Dst, b: append([]byte(nil), b...)})
			n.capInc = append(n.capInc, n.inc)
		}
		if s.p.full && f.First && s.rng.IntN(20) == 0 {
			// The socket fills up after this frame for a while.
			n.fullUntil = s.now.Add(time.Duration(s.rng.Int64N(int64(time.Millisecond))))
			n.writable = n.fullUntil
		}
	}
	s.transmit(n.addr, f.Dst, b)
}

func (h *simHost) Hold(_ *Peer[struct{}], _ uint32, seg []byte, _ HoldState) ([]byte, bool, HoldVerdict) {
	return append([]byte(nil), seg...), false, HoldKeep
}

func (h *simHost) Deliver(p *Peer[struct{}], seq uint32, seg []byte) (bool, Code) {
	k := p.Key
	n, s := h.n, h.n.s
	if len(seg) < 12 {
		s.fail("%v delivered a segment of %d bytes", n.addr, len(seg))
		return true, CodeInvalidRequest
	}
	id, i := binary.BigEndian.Uint64(seg), binary.BigEndian.Uint32(seg[8:])
	m := s.msgs[id]
	if m == nil || i >= m.nseg || m.from.addr != k.Addr || m.to != n {
		s.fail("%v delivered a segment no one sent it: message %d segment %d from %v", n.addr, id, i, k)
		return true, CodeInvalidRequest
	}
	if !s.now.Before(n.rnrFrom) && s.now.Before(n.rnrUntil) {
		return false, 0
	}
	gaveUp := errors.Is(m.err, ErrRetryExceeded) || errors.Is(m.err, ErrRNRRetryExceeded) || errors.Is(m.err, ErrFlushed)
	if _, theirs, ok := n.ep.Session(k); m.completed && gaveUp && ok && theirs == m.failEpoch {
		s.late++ // a copy on its way when the sender gave up, in the session still open
	} else if m.completed && m.err != nil {
		s.fail("message %d (%v -> %v) segment %d delivered after it failed at %v with %v", id, m.from.addr, n.addr, i, m.doneAt.Sub(simStart), m.err)
	}
	key := [3]int{m.from.idx, m.fromInc, n.idx}
	if last, ok := s.last[key]; ok && (id < last[0] || id == last[0] && uint64(i) <= last[1]) {
		s.fail("out of order or again: %v -> %v delivered message %d segment %d after message %d segment %d", m.from.addr, n.addr, id, i, last[0], last[1])
	}
	s.last[key] = [2]uint64{id, uint64(i)}
	m.lastDelivery = s.now
	if m.poison {
		m.refused = true
		return true, CodeRemoteOperation
	}
	m.delivered[i]++
	s.delivered++
	if m.delivered[i] > 1 {
		s.fail("message %d (%v -> %v) segment %d delivered %d times", id, m.from.addr, n.addr, i, m.delivered[i])
	}
	if m.awaits && i == m.nseg-1 {
		s.resps = append(s.resps, simResp{at: s.now.Add(s.p.delay), m: m, inc: m.fromInc})
	}
	if m.atomic {
		if m.execs++; m.execs > 1 {
			s.fail("atomic message %d (%v -> %v) executed %d times", id, m.from.addr, n.addr, m.execs)
		}
	}
	return true, 0
}

func (h *simHost) Complete(_ *Peer[struct{}], m *simMsg, err error) {
	s := h.n.s
	if m.completed {
		s.fail("message %d completed twice (%v, then %v)", m.id, m.err, err)
		return
	}
	m.completed, m.err, m.doneAt = true, err, s.now
	if err != nil {
		if errors.Is(err, ErrRetryExceeded) || errors.Is(err, ErrRNRRetryExceeded) || errors.Is(err, ErrFlushed) {
			m.failEpoch = m.epoch
		}
		return
	}
	if m.poison {
		s.fail("message %d was refused by its receiver but completed Success", m.id)
	}
	if m.awaits && !m.responded {
		s.fail("message %d completed Success before its response", m.id)
	}
	for i, d := range m.delivered {
		if d != 1 && !m.poison {
			s.fail("message %d (%v -> %v) completed Success with segment %d delivered %d times", m.id, m.from.addr, m.to.addr, i, d)
		}
	}
}

func (h *simHost) Event(p *Peer[struct{}], ev Event) {
	k := p.Key
	if *simTrace != "" && (h.n.addr.String() == *simTrace || k.Addr.String() == *simTrace) {
		fmt.Printf("%v %v: %v %v\n", h.n.s.now.Sub(simStart), h.n.addr, k, ev)
	}
}

// checkCaps checks each endpoint's state against its caps.
func (s *simnet) checkCaps() {
	for _, n := range s.nodes {
		e := n.ep
		c := e.Config()
		if e.Peers() > c.MaxPeers {
			s.fail("%v holds %d peers, over MaxPeers %d", n.addr, e.Peers(), c.MaxPeers)
		}
		// First contacts from an address stop at MaxPeersPerAddr; the
		// peers an endpoint opened to it (one per churner at most) come
		// on top (RDConfig.MaxPeersPerAddr).
		if k := e.PeersOf(netip.AddrFrom4([4]byte{10, 9, 9, 9})); k > c.MaxPeersPerAddr+s.p.churners {
			s.fail("%v holds %d peers of one address, over MaxPeersPerAddr %d and %d it opened", n.addr, k, c.MaxPeersPerAddr, s.p.churners)
		}
		if e.Held() > c.MaxEndpointHeldBytes {
			s.fail("%v holds %d bytes, over %d", n.addr, e.Held(), c.MaxEndpointHeldBytes)
		}
		sum := 0
		e.EachPeer(func(pi *PeerInfo) {
			sum += pi.HeldBytes
			if pi.HeldBytes > c.MaxHeldBytes {
				s.fail("%v holds %d bytes of %v, over %d", n.addr, pi.HeldBytes, pi.Key, c.MaxHeldBytes)
			}
		})
		if sum != e.Held() {
			s.fail("%v: its peers hold %d bytes, it counts %d", n.addr, sum, e.Held())
		}
		if err := e.Check(s.now); err != nil {
			s.fail("%v: %v", n.addr, err)
		}
		if e.Graves() > 2*c.Graveyard {
			s.fail("%v remembers %d graves, over %d", n.addr, e.Graves(), 2*c.Graveyard)
		}
	}
}

// check runs the end-of-run invariants.
func (s *simnet) check() {
	clean := s.p.churners == 0
	touched := map[int]bool{}
	for _, pt := range s.parts {
		touched[pt.a] = true
		if pt.b < 0 {
			clean = false
		} else {
			touched[pt.b] = true
		}
	}
	for _, n := range s.nodes {
		if n.restarted || n.stalled {
			touched[n.idx] = true
		}
	}
	for id := uint64(1); id <= s.nextID; id++ {
		m := s.msgs[id]
		if m.from.hostile || m.orphan {
			continue
		}
		if !m.completed {
			s.fail("message %d (%v -> %v, posted at %v) never completed", m.id, m.from.addr, m.to.addr, m.postedAt.Sub(simStart))
			continue
		}
		if m.poison && m.err == nil {
			s.fail("message %d refused, completed Success", m.id)
		}
		if clean && !m.poison && m.err != nil && !touched[m.from.idx] && !touched[m.to.idx] && errors.Is(m.err, ErrRemoteAborted) {
			// A session end that no fault caused: an idle reclaim on one
			// side as the other posts, or both sides opening at once
			// with a stateless Challenge crossing (docs/wire.md §11.2).
			s.aborted++
		} else if clean && !m.poison && m.err != nil && !touched[m.from.idx] && !touched[m.to.idx] {
			s.fail("message %d (%v -> %v) between untouched peers failed: %v", m.id, m.from.addr, m.to.addr, m.err)
		}
		if m.err != nil && !m.lastDelivery.IsZero() && m.lastDelivery.After(m.doneAt) && m.failEpoch == 0 {
			s.fail("message %d delivered after it failed", m.id)
		}
	}
}

func (s *simnet) report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %+v\n", s.seed, s.p)
	fmt.Fprintf(&b, "  messages %d, segments delivered %d, frames %d (dropped %d), forged %d, replayed %d, restarts %d, late %d, aborted %d, %.1f peer-seconds",
		s.nextID, s.delivered, s.frames, s.dropped, s.forged, s.replayed, s.restarts, s.late, s.aborted, s.peerSeconds)
	for _, n := range s.nodes {
		if !n.hostile {
			fmt.Fprintf(&b, "\n  %v: %+v", n.addr, n.ep.Stats)
		}
	}
	return b.String()
}

func simRun(t *testing.T, seed uint64) *simnet {
	s := runSim(seed)
	if *simVerbose {
		t.Log(s.report())
	}
	if len(s.errs) > 0 {
		t.Errorf("seed %d failed (replay: go test -run 'TestSim$' ./reliability -sim.seed %d -sim.v):\n  %s\n%s",
			seed, seed, strings.Join(s.errs, "\n  "), s.report())
	}
	return s
}

// TestSim runs the fixed seeds (or -sim.seed).
func TestSim(t *testing.T) {
	if *simSeed != 0 {
		simRun(t, *simSeed)
		return
	}
	var ps float64
	var cov simCoverage
	for seed := uint64(1); seed <= simFixedSeeds; seed++ {
		s := simRun(t, seed)
		ps += s.peerSeconds
		cov.sum(&s.cov)
	}
	t.Logf("%d seeds, %.0f simulated peer-seconds; endpoints did %+v", simFixedSeeds, ps, cov)
	if cov.trains == 0 || cov.probes == 0 || cov.restarts == 0 || cov.notReady == 0 {
		t.Errorf("the fixed seeds missed a path: %+v", cov)
	}
}

// TestSimReplays: a seed runs the same way twice.
func TestSimReplays(t *testing.T) {
	for _, seed := range []uint64{3, 17} {
		a, b := runSim(seed), runSim(seed)
		if a.report() != b.report() || a.frames != b.frames || a.delivered != b.delivered {
			t.Fatalf("seed %d ran two ways:\n%s\n%s", seed, a.report(), b.report())
		}
	}
}

// TestSimCampaign runs -sim.seeds seeds from -sim.first.
func TestSimCampaign(t *testing.T) {
	if *simSeeds <= 0 {
		t.Skip("no -sim.seeds")
	}
	var ps float64
	var msgs, late, aborted uint64
	var cov simCoverage
	failed := 0
	for seed := *simFirst; seed < *simFirst+uint64(*simSeeds); seed++ {
		s := runSim(seed)
		ps += s.peerSeconds
		msgs, late, aborted = msgs+s.nextID, late+s.late, aborted+s.aborted
		cov.sum(&s.cov)
		if len(s.errs) > 0 {
			failed++
			if failed <= 5 {
				t.Errorf("seed %d failed (replay: go test -run 'TestSim$' ./reliability -sim.seed %d -sim.v):\n  %s", seed, seed, strings.Join(s.errs, "\n  "))
			}
		}
	}
	t.Logf("%d seeds from %d, %d failed, %.0f simulated peer-seconds, %d messages (%d segments delivered late in the session open when their sender gave up; %d aborted by a session end between peers no fault touched)",
		*simSeeds, *simFirst, failed, ps, msgs, late, aborted)
	t.Logf("endpoints did %+v", cov)
}
