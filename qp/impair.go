package qp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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
	// Passed counts the datagrams the link handed on: written to the
	// socket on the way out, given to the reader on the way in; each copy
	// of a duplicate, and a held or delayed one when it leaves. With
	// Delaying, it tells a test what to wait for: the far side has read
	// every datagram the link let through once nothing is delaying and
	// its reads add up to Passed.
	Passed   atomic.Uint64
	delaying atomic.Int64
}

// Delaying is how many datagrams the link is delaying now: their delay
// not yet run out, or run out and being handed on. (One held back behind
// the next, Reorder, waits for that datagram, not for a time: it is not
// counted.)
func (im *Impairment) Delaying() int { return int(im.delaying.Load()) }

// impaired is one datagram in the link, on its way out (sa is its
// destination as the stack addressed it) or in (rx: its source, whether
// the read cut it, and its control messages, so that it keeps its own
// destination however late it comes).
type impaired struct {
	w     *impairLLP
	b     []byte
	rx    bool
	sa    sockaddr
	addr  netip.AddrPort
	trunc bool
	ctl   []byte
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

// pass draws what the link does to p, counting each act in acted. cur is
// the lower layer whose reader is passing p (nil on the way out): only
// its own datagrams may be handed to its reader at once.
func (im *Impairment) pass(p *impaired, acted *atomic.Uint64, cur *impairLLP) {
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
			im.emitLocked(p, cur)
		}
		return
	}
	for range copies {
		im.emitLocked(p, cur)
	}
	if h := im.held; h != nil {
		im.held = nil
		im.emitLocked(h, cur)
	}
}

// emitLocked sends p on now, or after the configured delay. A datagram
// on its way in that another socket's reader let out (a held one, the
// generator being the device's) goes through a timer too: only its own
// reader may hand it over at once.
func (im *Impairment) emitLocked(p *impaired, cur *impairLLP) {
	delay := im.Delay
	if im.Jitter > 0 {
		delay += time.Duration(im.rng.Int64N(int64(im.Jitter)))
	}
	if im.Spike > 0 && im.rng.Float64() < im.Spike {
		delay += im.SpikeDelay
		im.Spikes.Add(1)
	}
	if delay <= 0 && !(p.rx && p.w != cur) {
		p.out(false)
		return
	}
	if delay > 0 {
		im.Delayed.Add(1)
	}
	im.wg.Add(1)
	im.delaying.Add(1)
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		defer im.wg.Done()
		defer im.delaying.Add(-1) // after out has counted it Passed
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

// out sends p on, or (rx) hands it to its socket's reader: at once
// (now: in the read that passed it), or later, under the socket's
// receive lock. What went on counts in Passed of the impairment that
// passed it.
func (p *impaired) out(later bool) {
	w := p.w
	switch {
	case p.rx && later:
		w.rx.Passed.Add(1)
		w.s.deliverLate(p)
	case p.rx:
		w.rx.Passed.Add(1)
		w.ready = append(w.ready, p)
		w.nready.Store(int32(len(w.ready)))
	default:
		// A link does not push back; the socket does: wait for room,
		// as the stack's own datamover does.
		iov := unix.Iovec{Base: unsafe.SliceData(p.b)}
		iov.SetLen(len(p.b))
		msg := unix.Msghdr{Name: &p.sa.raw[0], Namelen: p.sa.len, Iov: &iov}
		msg.SetIovlen(1)
		for {
			if _, err := w.lowerLayer.write(&msg); err != errSocketFull {
				if err == nil {
					w.tx.Passed.Add(1)
				}
				return
			}
			if w.lowerLayer.waitWritable() != nil {
				return
			}
		}
	}
}

// stop cancels pending delayed datagrams and waits for any being sent.
func (im *Impairment) stop() {
	im.mu.Lock()
	im.stopped = true
	im.held = nil
	for t := range im.timers {
		if t.Stop() {
			im.wg.Done()
			im.delaying.Add(-1)
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

// impairLLP is a lower layer behind the impairment: what the stack
// writes passes tx, what the socket reads passes rx (either may be nil).
// It is the only place the impairment touches the stack: the engines and
// the receive side above run as they do on a clean link, landing
// included (a datagram that passes is scattered into the buffers the
// reader supplied).
type impairLLP struct {
	lowerLayer
	s      *Socket
	tx, rx *Impairment
	// The reader's own batch, and the datagrams that passed the receive
	// link and wait for a read; under the socket's rxMu (nready is
	// len(ready), for waitReadable).
	scratch []rxMsg
	iov     []unix.Iovec
	bufs    [][]byte
	ready   []*impaired
	nready  atomic.Int32
}

func newImpairLLP(s *Socket, inner lowerLayer, tx, rx *Impairment) *impairLLP {
	w := &impairLLP{lowerLayer: inner, s: s, tx: tx, rx: rx}
	if rx != nil {
		n := s.dev.cfg.RecvBatch
		w.scratch = make([]rxMsg, n)
		w.iov = make([]unix.Iovec, n)
		w.bufs = make([][]byte, n)
		for i := range n {
			w.bufs[i] = make([]byte, 1<<16)
			w.iov[i].Base = &w.bufs[i][0]
			w.iov[i].SetLen(len(w.bufs[i]))
			w.scratch[i].iov = w.iov[i : i+1]
		}
	}
	return w
}

// read reads what the socket has into the layer's own buffers, passes
// each datagram (a GRO read cut into its datagrams) through the receive
// link, and hands what came out at once to the caller's buffers.
func (w *impairLLP) read(ms []rxMsg) (int, bool) {
	if w.rx == nil {
		return w.lowerLayer.read(ms)
	}
	ok := true
	if room := min(len(ms), len(w.scratch)) - len(w.ready); room > 0 {
		var n int
		n, ok = w.lowerLayer.read(w.scratch[:room])
		acted := &w.s.dev.stats.RxImpaired
		for i := range n {
			m := &w.scratch[i]
			b := w.bufs[i][:min(m.n, len(w.bufs[i]))]
			ctl := bytes.Clone(m.ctl)
			for {
				k := len(b)
				if m.gro > 0 && m.gro < k && !m.trunc {
					k = m.gro
				}
				w.rx.pass(&impaired{w: w, b: bytes.Clone(b[:k]), rx: true, addr: m.src, trunc: m.trunc, ctl: ctl}, acted, w)
				if b = b[k:]; len(b) == 0 {
					break
				}
			}
		}
	}
	k := 0
	for ; k < len(ms) && len(w.ready) > 0; k++ {
		p := w.ready[0]
		w.ready[0] = nil
		w.ready = w.ready[1:]
		m := &ms[k]
		m.n = scatter(m.iov, p.b)
		m.trunc = p.trunc || m.n < len(p.b)
		m.src, m.ctl, m.gro = p.addr, p.ctl, 0
	}
	if len(w.ready) == 0 {
		w.ready = w.ready[:0:0]
	}
	w.nready.Store(int32(len(w.ready)))
	if !ok {
		return 0, false
	}
	return k, true
}

// scatter copies b into iov in order and returns how much fit.
func scatter(iov []unix.Iovec, b []byte) int {
	n := 0
	for i := range iov {
		if len(b) == 0 {
			break
		}
		k := copy(unsafe.Slice(iov[i].Base, iov[i].Len), b)
		b = b[k:]
		n += k
	}
	return n
}

// waitReadable returns at once while datagrams that passed wait for a
// read (a duplicate can leave more than one read takes).
func (w *impairLLP) waitReadable() error {
	if w.nready.Load() > 0 {
		return nil
	}
	return w.lowerLayer.waitReadable()
}

// write passes the datagram through the send link: a copy, so the
// registered memory it names is free when write returns, as on a socket.
func (w *impairLLP) write(msg *unix.Msghdr) (int, error) {
	if w.tx == nil {
		return w.lowerLayer.write(msg)
	}
	n := 0
	iov := unsafe.Slice(msg.Iov, msg.Iovlen)
	for i := range iov {
		n += int(iov[i].Len)
	}
	p := &impaired{w: w, b: make([]byte, 0, n)}
	for i := range iov {
		p.b = append(p.b, unsafe.Slice(iov[i].Base, iov[i].Len)...)
	}
	p.sa.len = uint32(copy(p.sa.raw[:], unsafe.Slice(msg.Name, msg.Namelen)))
	w.tx.pass(p, &w.s.dev.stats.TxImpaired, nil)
	return n, nil
}
