package qp

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

var epoch = time.Now()

// nanotime is a monotonic clock reading.
func nanotime() int64 { return int64(time.Since(epoch)) }

// CQ is a completion queue of fixed depth (ibv_cq). Poll never blocks and
// never allocates. A CQ that would overflow does not overwrite: it stops
// accepting, counts what it refused, and raises an AsyncCQOverflow event.
type CQ struct {
	dev  *Device
	mu   sync.Mutex
	ring ring[WorkCompletion]

	overflowed atomic.Bool
	dropped    atomic.Uint64

	// count mirrors n for lock-free emptiness checks by pollers.
	count atomic.Int32
	// wake is signalled whenever an entry is added and someone waits.
	wake    chan struct{}
	waiters atomic.Int32

	// Notification channel (ibv_req_notify_cq): armed once, fires once.
	notifyMu sync.Mutex
	armed    int8 // 0 off, 1 any, 2 solicited only
	armedAny atomic.Int32
	notify   chan struct{}
	progress func() // busy-poll mode: drive the device when empty
}

// CreateCQ makes a completion queue that holds depth entries.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if depth <= 0 || depth > d.cfg.MaxCQE {
		return nil, fmt.Errorf("%w: CQ depth %d, want 1..%d", ErrInvalidAttr, depth, d.cfg.MaxCQE)
	}
	if d.closed.Load() {
		return nil, ErrClosed
	}
	cq := &CQ{dev: d, ring: newRing[WorkCompletion](depth), wake: make(chan struct{}, 1), notify: make(chan struct{}, 1)}
	if d.cfg.Poll == PollBusy {
		cq.progress = d.progressOnce
	}
	return cq, nil
}

// Depth returns the number of entries the CQ holds.
func (cq *CQ) Depth() int { return cq.ring.cap() }

// Overflowed reports whether the CQ refused a completion; once it has, it
// accepts no more.
func (cq *CQ) Overflowed() bool { return cq.overflowed.Load() }

// push adds a completion. It reports false when the CQ is full or has
// overflowed; the completion is then lost and counted.
func (cq *CQ) push(wc *WorkCompletion) bool {
	cq.mu.Lock()
	if cq.overflowed.Load() || cq.ring.full() {
		first := !cq.overflowed.Swap(true)
		cq.mu.Unlock()
		cq.dropped.Add(1)
		cq.dev.stats.CQDropped.Add(1)
		if q := wc.srqQP; q != nil { // nobody will poll it: give the SRQ receive back
			q.releaseRecv(wc)
		}
		if first {
			cq.dev.raise(AsyncEvent{Type: AsyncCQOverflow, CQ: cq})
		}
		return false
	}
	*cq.ring.push() = *wc
	cq.count.Store(int32(cq.ring.len()))
	cq.mu.Unlock()
	if int(wc.Status) < len(cq.dev.stats.Completions) {
		cq.dev.stats.Completions[wc.Status].Add(1)
	}
	if cq.waiters.Load() > 0 {
		select {
		case cq.wake <- struct{}{}:
		default:
		}
	}
	cq.fire(wc.Solicited)
	return true
}

func (cq *CQ) fire(solicited bool) {
	if cq.armedAny.Load() == 0 {
		return
	}
	cq.notifyMu.Lock()
	if cq.armed == 1 || (cq.armed == 2 && solicited) {
		cq.armed = 0
		cq.armedAny.Store(0)
		select {
		case cq.notify <- struct{}{}:
		default:
		}
	}
	cq.notifyMu.Unlock()
}

// Poll moves up to len(wcs) completions into wcs and returns how many. It
// never blocks. On a busy-poll device an empty CQ first drives the
// device's receive path once in the caller's goroutine.
func (cq *CQ) Poll(wcs []WorkCompletion) int {
	if cq.count.Load() == 0 {
		if cq.progress == nil {
			return 0
		}
		cq.progress()
		if cq.count.Load() == 0 {
			return 0
		}
	}
	cq.mu.Lock()
	k := min(len(wcs), cq.ring.len())
	for j := 0; j < k; j++ {
		f := cq.ring.front()
		wcs[j] = *f
		if q := f.srqQP; q != nil {
			q.releaseRecv(f)
			wcs[j].srqQP = nil
			f.srqQP = nil
		}
		cq.ring.pop()
	}
	cq.count.Store(int32(cq.ring.len()))
	cq.mu.Unlock()
	return k
}

// Wait blocks until the CQ holds a completion or ctx ends, in either
// polling mode. In event mode it first polls the device in the caller's
// goroutine for up to DeviceConfig.EventSpin, then parks until the
// receive goroutine delivers. On a busy-poll device without
// BusyPollThread nothing receives but the application, so Wait drives the
// receive path itself, spinning in the caller's goroutine (as CQ.Poll
// does once) until a completion arrives or ctx ends; with BusyPollThread
// it parks while that thread receives.
func (cq *CQ) Wait(ctx context.Context) error {
	if cq.count.Load() > 0 {
		return nil
	}
	if cq.progress != nil && !cq.dev.cfg.BusyPollThread {
		return cq.spinWait(ctx)
	}
	if spin := cq.dev.cfg.EventSpin; spin > 0 && cq.progress == nil {
		start := nanotime()
		for cq.count.Load() == 0 && nanotime()-start < int64(spin) {
			cq.dev.progressOnce()
		}
		if cq.count.Load() > 0 {
			return nil
		}
	}
	cq.waiters.Add(1)
	defer cq.waiters.Add(-1)
	for cq.count.Load() == 0 {
		if cq.dev.closed.Load() {
			return ErrClosed
		}
		select {
		case <-cq.wake:
		case <-cq.dev.done:
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// spinWait is Wait on a busy-poll device without a poller thread.
func (cq *CQ) spinWait(ctx context.Context) error {
	done := ctx.Done()
	for k := 1; cq.count.Load() == 0; k++ {
		if cq.dev.closed.Load() {
			return ErrClosed
		}
		select {
		case <-done:
			return ctx.Err()
		default:
		}
		cq.progress()
		if k%1024 == 0 {
			runtime.Gosched() // spinners may outnumber cores
		}
	}
	return nil
}

// RequestNotify arms the notification channel for the next completion, or
// for the next solicited one (ibv_req_notify_cq). The channel C receives
// once per arming.
func (cq *CQ) RequestNotify(solicitedOnly bool) {
	cq.notifyMu.Lock()
	if solicitedOnly {
		cq.armed = 2
	} else {
		cq.armed = 1
	}
	cq.armedAny.Store(1)
	cq.notifyMu.Unlock()
}

// C is the completion channel: it receives after RequestNotify once a
// matching completion arrives.
func (cq *CQ) C() <-chan struct{} { return cq.notify }

// Spin drives the device's receive path in the caller's goroutine for up
// to d, until the CQ holds a completion, and reports whether it does: the
// first part of a wait, before parking (what Wait does for EventSpin),
// for callers that park on their own terms (socketshim's deadlines).
func (cq *CQ) Spin(d time.Duration) bool {
	start := nanotime()
	for cq.count.Load() == 0 && nanotime()-start < int64(d) {
		cq.dev.progressOnce()
	}
	return cq.count.Load() > 0
}

// Pending returns how many completions the CQ holds now.
func (cq *CQ) Pending() int { return int(cq.count.Load()) }

// Dropped returns how many completions the CQ refused after it overflowed.
func (cq *CQ) Dropped() uint64 { return cq.dropped.Load() }
