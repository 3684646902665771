package llp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
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

// impaired is one datagram in the link, on its way out (addr is its
// destination) or in (rx: addr is its source; msg keeps whether the read
// cut it and its destination, so that it keeps them however late it
// comes).
type impaired struct {
	w    *Impaired
	b    []byte
	rx   bool
	addr netip.AddrPort
	msg  Msg
}

// Start checks the settings and seeds the generator; a link wraps an
// Impairment only once it is started.
func (im *Impairment) Start() error {
	for _, p := range []float64{im.Loss, im.Corrupt, im.Duplicate, im.Reorder, im.Burst, im.Spike} {
		if p < 0 || p > 1 {
			return fmt.Errorf("impairment probability %v, want [0, 1]", p)
		}
	}
	if im.Delay < 0 || im.Jitter < 0 || im.SpikeDelay < 0 || im.BurstLen < 0 {
		return fmt.Errorf("negative impairment delay")
	}
	im.rng = rand.New(rand.NewPCG(im.Seed, im.Seed^0x9e3779b97f4a7c15))
	im.timers = map[*time.Timer]struct{}{}
	return nil
}

// pass draws what the link does to p, counting each act in acted. cur is
// the lower layer whose reader is passing p (nil on the way out): only
// its own datagrams may be handed to its reader at once.
func (im *Impairment) pass(p *impaired, acted *atomic.Uint64, cur *Impaired) {
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
func (im *Impairment) emitLocked(p *impaired, cur *Impaired) {
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
		m := p.msg
		m.Bufs, m.N, m.Addr = [][]byte{p.b}, len(p.b), p.addr
		w.late(&m)
	case p.rx:
		w.rx.Passed.Add(1)
		w.ready = append(w.ready, p)
		w.nready.Store(int32(len(w.ready)))
	default:
		// A link does not push back; the socket does: wait for room,
		// as the stack's own datamover does.
		ms := [1]Msg{{Bufs: [][]byte{p.b}, Addr: p.addr}}
		for {
			if _, err := w.Link.Write(ms[:]); err != ErrWouldBlock {
				if err == nil {
					w.tx.Passed.Add(1)
				}
				return
			}
			if w.Link.WaitWritable() != nil {
				return
			}
		}
	}
}

// Stop cancels pending delayed datagrams and waits for any being sent.
func (im *Impairment) Stop() {
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

// Impaired is a link behind the impairment: what the stack writes passes
// tx, what the inner link reads passes rx (either may be nil). It is the
// only place the impairment touches the stack: the engines and the
// receive side above run as they do on a clean link, landing included (a
// datagram that passes is scattered into the buffers the reader
// supplied).
type Impaired struct {
	Link
	tx, rx *Impairment
	opt    ImpairOptions
	// The reader's own batch, and the datagrams that passed the receive
	// link and wait for a read; under the reader's lock (nready is
	// len(ready), for WaitReadable).
	scratch []Msg
	bufs    [][]byte
	ready   []*impaired
	nready  atomic.Int32
	closed  atomic.Bool
}

// Close closes the inner link; Writes that would pass the send link
// from then on say ErrClosed, as the inner link's own do.
func (w *Impaired) Close() error {
	w.closed.Store(true)
	return w.Link.Close()
}

// ImpairOptions are what an Impaired link needs of its user.
type ImpairOptions struct {
	// Batch is the most datagrams one read takes from the inner link.
	Batch int
	// TxActed and RxActed, if set, count every datagram the impairment
	// acted on in each direction.
	TxActed, RxActed *atomic.Uint64
	// Late is handed a datagram the receive link delayed once its delay
	// runs out, outside any Read (required with rx): the reader delivers
	// it under its own lock.
	Late func(m *Msg)
}

// Impair wraps inner with tx (what is written) and rx (what is read);
// either may be nil, and both must be started (Impairment.Start).
func Impair(inner Link, tx, rx *Impairment, opt ImpairOptions) *Impaired {
	w := &Impaired{Link: inner, tx: tx, rx: rx, opt: opt}
	if w.opt.TxActed == nil {
		w.opt.TxActed = new(atomic.Uint64)
	}
	if w.opt.RxActed == nil {
		w.opt.RxActed = new(atomic.Uint64)
	}
	if rx != nil {
		n := max(opt.Batch, 1)
		w.scratch = make([]Msg, n)
		w.bufs = make([][]byte, n)
		for i := range n {
			w.bufs[i] = make([]byte, 1<<16)
			w.scratch[i].Bufs = w.bufs[i : i+1]
		}
	}
	return w
}

func (w *Impaired) late(m *Msg) {
	if w.opt.Late != nil {
		w.opt.Late(m)
	}
}

// Caps: an impairment on the way out acts on each datagram, so the link
// takes no trains, and none merged come out of it.
func (w *Impaired) Caps() Caps {
	c := w.Link.Caps()
	if w.tx != nil {
		c.MaxTrain = 1
	}
	if w.rx != nil {
		c.GRO = false
	}
	c.Detail += ", impaired"
	return c
}

// Read reads what the inner link has into the layer's own buffers,
// passes each datagram (a GRO read cut into its datagrams) through the
// receive link, and hands what came out at once to the caller's buffers.
func (w *Impaired) Read(ms []Msg) (int, error) {
	if w.rx == nil {
		return w.Link.Read(ms)
	}
	var err error
	if room := min(len(ms), len(w.scratch)) - len(w.ready); room > 0 {
		var n int
		n, err = w.Link.Read(w.scratch[:room])
		for i := range n {
			m := &w.scratch[i]
			b := w.bufs[i][:min(m.N, len(w.bufs[i]))]
			keep := Msg{Trunc: m.Trunc, dst: m.dst, unicast: m.unicast, dstOK: m.dstOK, ctl: bytes.Clone(m.ctl)}
			for {
				k := len(b)
				if m.Segment > 0 && m.Segment < k && !m.Trunc {
					k = m.Segment
				}
				w.rx.pass(&impaired{w: w, b: bytes.Clone(b[:k]), rx: true, addr: m.Addr, msg: keep}, w.opt.RxActed, w)
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
		m.N = Scatter(m.Bufs, p.b)
		m.Trunc = p.msg.Trunc || m.N < len(p.b)
		m.Addr, m.Segment = p.addr, 0
		m.dst, m.unicast, m.dstOK, m.ctl = p.msg.dst, p.msg.unicast, p.msg.dstOK, p.msg.ctl
	}
	if len(w.ready) == 0 {
		w.ready = w.ready[:0:0]
	}
	w.nready.Store(int32(len(w.ready)))
	if err != nil {
		return 0, err
	}
	return k, nil
}

// WaitReadable returns at once while datagrams that passed wait for a
// read (a duplicate can leave more than one read takes).
func (w *Impaired) WaitReadable() error {
	if w.nready.Load() > 0 {
		return nil
	}
	return w.Link.WaitReadable()
}

// Write passes each datagram through the send link: a copy, so the
// memory it names is free when Write returns, as on a socket. A train is
// cut into its datagrams.
func (w *Impaired) Write(ms []Msg) (int, error) {
	if w.tx == nil {
		return w.Link.Write(ms)
	}
	if w.closed.Load() {
		return 0, ErrClosed
	}
	for i := range ms {
		m := &ms[i]
		b := gather(make([]byte, 0, m.Len()), m.Bufs)
		m.N = len(b)
		for {
			k := len(b)
			if m.Segment > 0 && m.Segment < k {
				k = m.Segment
			}
			w.tx.pass(&impaired{w: w, b: b[:k:k], addr: m.Addr}, w.opt.TxActed, nil)
			if b = b[k:]; len(b) == 0 {
				break
			}
		}
	}
	return len(ms), nil
}

// Holding reports whether datagrams the receive link let through are
// still on their way to a read: delayed, or waiting for one.
func (w *Impaired) Holding() bool {
	return w.rx != nil && (w.rx.Delaying() != 0 || w.nready.Load() != 0)
}

// Inner returns the link the impairment wraps.
func (w *Impaired) Inner() Link { return w.Link }

// Holds reports whether the link holds a datagram back behind the next
// one (Reorder): it has neither passed nor dropped it yet.
func (im *Impairment) Holds() bool {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.held != nil
}
