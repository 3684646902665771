package qp

import (
	"container/heap"
	"sync"
	"time"
)

// deviceTimer is the device's one timer: it serves every QP's timed work
// (Write-Record deadlines, RD retransmission, ack, probe, contact and
// idle-reclaim timers, RC CompleteOnAck acks). It keeps the armed QPs in a
// min-heap by due time, one entry per QP, and a fire runs only the QPs
// that are due; each returns its next due time, at which it is armed
// again. A QP's entry lives in the QP (tmAt, tmIdx) under mu.
type deviceTimer struct {
	mu     sync.Mutex
	t      *time.Timer
	at     time.Time // when t fires; zero when it is not set
	armed  timerHeap
	closed bool

	wg *sync.WaitGroup // the device's: Close waits for a fire in progress
	// run does q's timed work at now and returns when q is next due (zero:
	// not until it is armed again). It takes the engines' own locks.
	run func(q *QP, now time.Time) time.Time
	// schedule sets the timer to fire at at; tests replace it to drive
	// fire by hand.
	schedule func(at time.Time)
	// fired counts the timer's runs (Stats.Timers).
	fired func()
}

func (dt *deviceTimer) init(d *Device) {
	dt.wg = &d.wg
	dt.run = d.timerWork
	dt.schedule = dt.reset
	dt.fired = func() { d.stats.Timers.Add(1) }
}

// arm makes q due no later than at: it records q's due time, or lowers
// it; a later time than the one recorded changes nothing (an early run
// is harmless: the QP's work returns when it is next due). A zero at, a
// closed device or a cancelled QP arm nothing.
func (dt *deviceTimer) arm(q *QP, at time.Time) {
	if at.IsZero() {
		return
	}
	dt.mu.Lock()
	if dt.armLocked(q, at) {
		dt.scheduleLocked()
	}
	dt.mu.Unlock()
}

// armLocked records or lowers q's due time and reports whether it did.
func (dt *deviceTimer) armLocked(q *QP, at time.Time) bool {
	if dt.closed || q.tmGone || at.IsZero() {
		return false
	}
	if q.tmIdx != 0 {
		if !at.Before(q.tmAt) {
			return false
		}
		q.tmAt = at
		heap.Fix(&dt.armed, q.tmIdx-1)
		return true
	}
	q.tmAt = at
	heap.Push(&dt.armed, q)
	return true
}

// scheduleLocked sets the timer for the earliest due QP unless it already
// fires by then.
func (dt *deviceTimer) scheduleLocked() {
	if len(dt.armed) == 0 {
		return
	}
	top := dt.armed[0].tmAt
	if !dt.at.IsZero() && !top.Before(dt.at) {
		return
	}
	dt.at = top
	dt.schedule(top)
}

// reset is schedule on the real clock. The caller holds mu.
func (dt *deviceTimer) reset(at time.Time) {
	delay := max(time.Until(at), 0)
	if dt.t == nil {
		dt.t = time.AfterFunc(delay, dt.onTimer)
	} else {
		dt.t.Reset(delay)
	}
}

// cancel takes q off the timer for good: it is being destroyed. A fire
// that already took q off the heap skips it (timerWork) and does not
// arm it again.
func (dt *deviceTimer) cancel(q *QP) {
	dt.mu.Lock()
	q.tmGone = true
	if q.tmIdx != 0 {
		heap.Remove(&dt.armed, q.tmIdx-1)
	}
	dt.mu.Unlock()
}

// stop stops the timer for good (Device.Close); a fire in progress is
// waited for by the device's WaitGroup.
func (dt *deviceTimer) stop() {
	dt.mu.Lock()
	dt.closed = true
	if dt.t != nil {
		dt.t.Stop()
	}
	for _, q := range dt.armed {
		q.tmIdx = 0
	}
	dt.armed = nil
	dt.at = time.Time{}
	dt.mu.Unlock()
}

// onTimer is the timer's function.
func (dt *deviceTimer) onTimer() {
	dt.mu.Lock()
	if dt.closed {
		dt.mu.Unlock()
		return
	}
	dt.wg.Add(1) // Close waits for a fire in progress
	dt.mu.Unlock()
	defer dt.wg.Done()
	dt.fired()
	dt.fire(time.Now())
}

// fire runs the QPs due at now, in due order, arms each again at the
// time its work returns, and sets the timer for the earliest left. QPs
// armed while it runs (by their own work, or the receive path) keep the
// earlier of the two times.
func (dt *deviceTimer) fire(now time.Time) {
	var buf [8]dueQP
	due := buf[:0]
	dt.mu.Lock()
	if dt.closed {
		dt.mu.Unlock()
		return
	}
	dt.at = time.Time{}
	for len(dt.armed) > 0 && !now.Before(dt.armed[0].tmAt) {
		due = append(due, dueQP{q: heap.Pop(&dt.armed).(*QP)})
	}
	dt.mu.Unlock()
	for i := range due {
		due[i].next = dt.run(due[i].q, now)
	}
	dt.mu.Lock()
	for i := range due {
		dt.armLocked(due[i].q, due[i].next)
	}
	dt.scheduleLocked()
	dt.mu.Unlock()
}

// dueQP is a QP a fire runs and when its work says it is next due.
type dueQP struct {
	q    *QP
	next time.Time
}

// timerHeap orders armed QPs by due time; each QP knows its index
// (tmIdx, one more than it so that zero is "not armed").
type timerHeap []*QP

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].tmAt.Before(h[j].tmAt) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].tmIdx, h[j].tmIdx = i+1, j+1
}
func (h *timerHeap) Push(x any) {
	q := x.(*QP)
	q.tmIdx = len(*h) + 1
	*h = append(*h, q)
}
func (h *timerHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.tmIdx = 0
	return q
}

// armTimer makes the device timer run q's timed work no later than at.
func (q *QP) armTimer(at time.Time) { q.dev.timer.arm(q, at) }

// timerWork is q's timed work at now, as the device timer runs it: RD's
// timers, RC's acks, Write-Record deadlines, each under its engine's
// locks. It returns when q is next due, zero for not until armed.
func (d *Device) timerWork(q *QP, now time.Time) time.Time {
	if d.lookupQP(q.num) != q {
		return time.Time{} // destroyed after the fire took it off the heap
	}
	next := q.eng.timer(now)
	if at := q.wrExpire(now); !at.IsZero() && (next.IsZero() || at.Before(next)) {
		next = at
	}
	return next
}
