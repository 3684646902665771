package qp

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Impairment is a lossy link in software: every datagram that passes
// through it may be dropped, corrupted, duplicated, held back behind the
// next one (reordered) or delayed, as drawn from a seeded generator, so a
// run can be repeated. A device runs what it sends through
// DeviceConfig.Impair and what its sockets read through
// DeviceConfig.ImpairRx (two Impairments: each direction has its own
// generator and counters). Tests and udperf -loss use it where netem is
// not available; it sits below the whole stack, so the real code runs
// through it.
type Impairment struct {
	Seed      uint64
	Loss      float64       // probability a datagram is dropped
	Corrupt   float64       // probability one bit of it is flipped
	Duplicate float64       // probability it is sent twice
	Reorder   float64       // probability it is held back until after the next one
	Delay     time.Duration // every datagram is delayed this long, plus
	Jitter    time.Duration // a uniform extra delay in [0, Jitter)
	// Burst is the probability that a datagram starts a burst: it and the
	// BurstLen-1 after it are dropped, as long as they come within
	// BurstTime (default 2 ms) of the first: a burst is a short event in
	// time (a queue overflowing), not a count that waits for traffic.
	Burst     float64
	BurstLen  int
	BurstTime time.Duration
	// Spike is the probability that a datagram is held SpikeDelay longer
	// (a delay spike, longer than a retransmission timeout).
	Spike      float64
	SpikeDelay time.Duration

	burstLeft int
	burstEnd  time.Time

	mu      sync.Mutex
	rng     *rand.Rand
	held    *impaired
	timers  map[*time.Timer]struct{}
	wg      sync.WaitGroup
	stopped bool

	Dropped, Corrupted, Duplicated, Reordered, Delayed, Bursts, Spikes atomic.Uint64
}

// impaired is one datagram in the link: on the way out (addr is its
// destination) or in (rx: addr is its source, and what the socket read
// about its destination goes with it).
type impaired struct {
	s     *Socket
	b     []byte
	addr  netip.AddrPort
	rx    bool
	trunc bool
	dst   rxDest
}

// rxDest is what a socket read about a datagram's destination
// (IP_PKTINFO): see Socket.rxDst.
type rxDest struct {
	addr        netip.Addr
	unicast, ok bool
}

func (im *Impairment) validate() error {
	for _, p := range []float64{im.Loss, im.Corrupt, im.Duplicate, im.Reorder, im.Burst, im.Spike} {
		if p < 0 || p > 1 {
			return fmt.Errorf("%w: impairment probability %v, want [0, 1]", ErrInvalidAttr, p)
		}
	}
	if im.Delay < 0 || im.Jitter < 0 || im.SpikeDelay < 0 || im.BurstLen < 0 {
		return fmt.Errorf("%w: negative impairment delay", ErrInvalidAttr)
	}
	im.rng = rand.New(rand.NewPCG(im.Seed, im.Seed^0x9e3779b97f4a7c15))
	im.timers = map[*time.Timer]struct{}{}
	return nil
}

// send takes the datagram t has built, copied out of the registered memory.
func (im *Impairment) send(s *Socket, t *txCtx) {
	n := 0
	for i := 0; i < int(t.msg.Iovlen); i++ {
		n += int(t.iov[i].Len)
	}
	b := make([]byte, 0, n)
	for i := 0; i < int(t.msg.Iovlen); i++ {
		b = append(b, unsafe.Slice(t.iov[i].Base, t.iov[i].Len)...)
	}
	addr := t.ah.addr
	if s.v6 && addr.Addr().Is4() {
		addr = netip.AddrPortFrom(netip.AddrFrom16(addr.Addr().As16()), addr.Port())
	}
	d := s.dev
	d.stats.TxBytes.Add(uint64(n))
	im.pass(&impaired{s: s, b: b, addr: addr}, &d.stats.TxImpaired)
}

// receive takes a datagram a socket read (b is the socket's buffer: it is
// copied) before the stack sees it; what passes is delivered as if read
// at that moment.
func (im *Impairment) receive(s *Socket, b []byte, trunc bool, src netip.AddrPort) {
	p := &impaired{s: s, b: append([]byte(nil), b...), addr: src, rx: true, trunc: trunc}
	p.dst.addr, p.dst.unicast, p.dst.ok = s.rxDst()
	im.pass(p, &s.dev.stats.RxImpaired)
}

// pass draws what the link does to p, counting each act in acted.
func (im *Impairment) pass(p *impaired, acted *atomic.Uint64) {
	b := p.b
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.stopped {
		return
	}
	r := im.rng
	if im.burstLeft > 0 && time.Now().After(im.burstEnd) {
		im.burstLeft = 0
	}
	if im.burstLeft > 0 {
		im.burstLeft--
		im.Dropped.Add(1)
		acted.Add(1)
		return
	}
	if im.Burst > 0 && r.Float64() < im.Burst {
		im.burstLeft = max(im.BurstLen, 1) - 1
		bt := im.BurstTime
		if bt <= 0 {
			bt = 2 * time.Millisecond
		}
		im.burstEnd = time.Now().Add(bt)
		im.Bursts.Add(1)
		im.Dropped.Add(1)
		acted.Add(1)
		return
	}
	if r.Float64() < im.Loss {
		im.Dropped.Add(1)
		acted.Add(1)
		return
	}
	if r.Float64() < im.Corrupt && len(b) > 0 {
		b[r.IntN(len(b))] ^= 1 << r.IntN(8)
		im.Corrupted.Add(1)
		acted.Add(1)
	}
	copies := 1
	if r.Float64() < im.Duplicate {
		copies = 2
		im.Duplicated.Add(1)
		acted.Add(1)
	}
	if im.held == nil && r.Float64() < im.Reorder {
		im.held = p
		im.Reordered.Add(1)
		acted.Add(1)
		if copies == 2 {
			im.emitLocked(p)
		}
		return
	}
	for range copies {
		im.emitLocked(p)
	}
	if h := im.held; h != nil {
		im.held = nil
		im.emitLocked(h)
	}
}

// emitLocked sends p now, or after the configured delay.
func (im *Impairment) emitLocked(p *impaired) {
	delay := im.Delay
	if im.Jitter > 0 {
		delay += time.Duration(im.rng.Int64N(int64(im.Jitter)))
	}
	if im.Spike > 0 && im.rng.Float64() < im.Spike {
		delay += im.SpikeDelay
		im.Spikes.Add(1)
	}
	if delay <= 0 {
		p.out(false)
		return
	}
	im.Delayed.Add(1)
	im.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		defer im.wg.Done()
		im.mu.Lock()
		delete(im.timers, t)
		stopped := im.stopped
		im.mu.Unlock()
		if !stopped {
			p.out(true)
		}
	})
	im.timers[t] = struct{}{}
}

// out sends p on, or (rx) delivers it to the stack. A datagram on its
// way in that was delayed (later: not in the socket's receive goroutine)
// is delivered under the socket's receive lock, unless the socket closed.
func (p *impaired) out(later bool) {
	s := p.s
	if !p.rx {
		_, _ = s.conn.WriteToUDPAddrPort(p.b, p.addr)
		return
	}
	if later {
		s.txMu.Lock()
		closed := s.closed
		s.txMu.Unlock()
		if closed {
			return
		}
		s.rxMu.Lock()
		defer s.rxMu.Unlock()
	}
	s.rxHeld = p
	s.dev.deliver(s, p.b, p.trunc, p.addr)
	s.rxHeld = nil
}

// stop cancels pending delayed datagrams and waits for any being sent.
func (im *Impairment) stop() {
	im.mu.Lock()
	im.stopped = true
	im.held = nil
	for t := range im.timers {
		if t.Stop() {
			im.wg.Done()
		}
		delete(im.timers, t)
	}
	im.mu.Unlock()
	im.wg.Wait()
}

// TxImpairedTotal counts every datagram the impairment acted on (in
// whichever direction it serves).
func (im *Impairment) TxImpairedTotal() uint64 {
	return im.Dropped.Load() + im.Corrupted.Load() + im.Duplicated.Load() + im.Reordered.Load() + im.Spikes.Load()
}
