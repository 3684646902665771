package qp

import (
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTimer is a deviceTimer driven by hand: schedule records the times
// the timer is set for, run records the QPs it runs and returns what
// next says.
type fakeTimer struct {
	dt    deviceTimer
	wg    sync.WaitGroup
	sched []time.Time
	ran   []*QP
	next  func(q *QP, now time.Time) time.Time
}

func newFakeTimer() *fakeTimer {
	f := &fakeTimer{}
	f.dt.wg = &f.wg
	f.dt.schedule = func(at time.Time) { f.sched = append(f.sched, at) }
	f.dt.fired = func() {}
	f.dt.run = func(q *QP, now time.Time) time.Time {
		f.ran = append(f.ran, q)
		if f.next != nil {
			return f.next(q, now)
		}
		return time.Time{}
	}
	return f
}

// check verifies the heap: every entry knows its index, no parent is
// due after its children, and the timer is set by the earliest entry.
func (f *fakeTimer) check(t *testing.T) {
	t.Helper()
	h := f.dt.armed
	for i, q := range h {
		if q.tmIdx != i+1 {
			t.Fatalf("entry %d (QP %d) has index %d", i, q.num, q.tmIdx-1)
		}
		if i > 0 && h[(i-1)/2].tmAt.After(q.tmAt) {
			t.Fatalf("heap order broken at %d", i)
		}
	}
	if len(h) > 0 && (f.dt.at.IsZero() || f.dt.at.After(h[0].tmAt)) {
		t.Fatalf("timer set for %v, earliest QP due %v", f.dt.at, h[0].tmAt)
	}
}

func TestDeviceTimerArmLowers(t *testing.T) {
	f := newFakeTimer()
	t0 := time.Unix(1000, 0)
	q := &QP{num: 1}
	f.dt.arm(q, t0.Add(10*time.Second))
	f.dt.arm(q, t0.Add(20*time.Second)) // later: changes nothing
	f.dt.arm(q, time.Time{})            // zero: arms nothing
	if len(f.dt.armed) != 1 || !q.tmAt.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("%d entries, due %v", len(f.dt.armed), q.tmAt)
	}
	f.dt.arm(q, t0.Add(5*time.Second)) // earlier: lowers
	if len(f.dt.armed) != 1 || !q.tmAt.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("%d entries, due %v", len(f.dt.armed), q.tmAt)
	}
	want := []time.Time{t0.Add(10 * time.Second), t0.Add(5 * time.Second)}
	if !slices.EqualFunc(f.sched, want, time.Time.Equal) {
		t.Fatalf("timer set for %v, want %v", f.sched, want)
	}
	f.check(t)
	f.dt.fire(t0.Add(4 * time.Second)) // not due yet
	if len(f.ran) != 0 || len(f.dt.armed) != 1 {
		t.Fatalf("ran %d QPs early", len(f.ran))
	}
	f.check(t)
	f.dt.fire(t0.Add(5 * time.Second))
	if len(f.ran) != 1 || f.ran[0] != q || len(f.dt.armed) != 0 || q.tmIdx != 0 {
		t.Fatalf("ran %d QPs, %d left armed", len(f.ran), len(f.dt.armed))
	}
}

// TestDeviceTimerFireOrder arms many QPs, each many times, and checks
// that each fire runs exactly the QPs due, earliest first, and leaves
// the rest armed once each.
func TestDeviceTimerFireOrder(t *testing.T) {
	f := newFakeTimer()
	t0 := time.Unix(1000, 0)
	rng := rand.New(rand.NewPCG(15, 4))
	qs := make([]*QP, 4096)
	due := map[*QP]time.Time{}
	for i := range qs {
		qs[i] = &QP{num: uint32(i + 1)}
	}
	for range 5 {
		for _, q := range qs {
			at := t0.Add(time.Duration(1+rng.IntN(10000)) * time.Millisecond)
			f.dt.arm(q, at)
			if d, ok := due[q]; !ok || at.Before(d) {
				due[q] = at
			}
		}
	}
	if len(f.dt.armed) != len(qs) {
		t.Fatalf("%d entries for %d QPs", len(f.dt.armed), len(qs))
	}
	f.check(t)
	for now := t0; now.Before(t0.Add(11 * time.Second)); now = now.Add(700 * time.Millisecond) {
		f.ran = f.ran[:0]
		f.dt.fire(now)
		var want []*QP
		for q, at := range due {
			if !now.Before(at) {
				want = append(want, q)
				delete(due, q)
			}
		}
		if len(f.ran) != len(want) {
			t.Fatalf("at %v: ran %d QPs, %d were due", now.Sub(t0), len(f.ran), len(want))
		}
		for i := 1; i < len(f.ran); i++ {
			if f.ran[i].tmAt.Before(f.ran[i-1].tmAt) {
				t.Fatalf("at %v: QP %d ran before an earlier one", now.Sub(t0), f.ran[i-1].num)
			}
		}
		for _, q := range want {
			if !slices.Contains(f.ran, q) {
				t.Fatalf("at %v: QP %d was due and did not run", now.Sub(t0), q.num)
			}
		}
		if len(f.dt.armed) != len(due) {
			t.Fatalf("%d left armed, want %d", len(f.dt.armed), len(due))
		}
		f.check(t)
	}
	if len(due) != 0 {
		t.Fatalf("%d QPs never ran", len(due))
	}
}

// TestDeviceTimerRearm: a QP's work returns its next due time and is
// armed at it; one that returns zero is not; arming while a fire runs
// (the QP itself, or another) keeps the earlier time.
func TestDeviceTimerRearm(t *testing.T) {
	f := newFakeTimer()
	t0 := time.Unix(1000, 0)
	a, b, c := &QP{num: 1}, &QP{num: 2}, &QP{num: 3}
	f.next = func(q *QP, now time.Time) time.Time {
		switch q {
		case a:
			f.dt.arm(a, now.Add(3*time.Second)) // armed by its own work: the earlier wins
			f.dt.arm(c, now.Add(time.Second))   // another QP armed mid-fire
			return now.Add(2 * time.Second)
		case b:
			return time.Time{}
		}
		return now.Add(time.Hour)
	}
	f.dt.arm(a, t0)
	f.dt.arm(b, t0)
	f.dt.fire(t0)
	if len(f.ran) != 2 || b.tmIdx != 0 || a.tmIdx == 0 || c.tmIdx == 0 {
		t.Fatalf("ran %d; armed a %v b %v c %v", len(f.ran), a.tmIdx != 0, b.tmIdx != 0, c.tmIdx != 0)
	}
	if !a.tmAt.Equal(t0.Add(2*time.Second)) || !c.tmAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("a due %v, c due %v", a.tmAt.Sub(t0), c.tmAt.Sub(t0))
	}
	if got := f.sched[len(f.sched)-1]; !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("timer set for %v, want c's due time", got.Sub(t0))
	}
	f.check(t)
}

// TestDeviceTimerCancel: a destroyed QP leaves the heap, is never armed
// again, and one destroyed while a fire runs it is not armed again
// after.
func TestDeviceTimerCancel(t *testing.T) {
	f := newFakeTimer()
	t0 := time.Unix(1000, 0)
	qs := []*QP{{num: 1}, {num: 2}, {num: 3}, {num: 4}}
	for i, q := range qs {
		f.dt.arm(q, t0.Add(time.Duration(i)*time.Second))
	}
	f.dt.cancel(qs[1])
	f.dt.cancel(qs[1]) // twice: harmless
	f.dt.arm(qs[1], t0)
	if len(f.dt.armed) != 3 || qs[1].tmIdx != 0 {
		t.Fatalf("%d entries after cancelling one of 4", len(f.dt.armed))
	}
	f.check(t)
	f.next = func(q *QP, now time.Time) time.Time {
		f.dt.cancel(q) // destroyed while its work runs
		return now.Add(time.Second)
	}
	f.dt.fire(t0.Add(time.Hour))
	if len(f.ran) != 3 || slices.Contains(f.ran, qs[1]) {
		t.Fatalf("ran %d QPs (the cancelled one: %v)", len(f.ran), slices.Contains(f.ran, qs[1]))
	}
	if len(f.dt.armed) != 0 {
		t.Fatalf("%d QPs armed again after they were destroyed", len(f.dt.armed))
	}
}

func TestDeviceTimerStop(t *testing.T) {
	f := newFakeTimer()
	t0 := time.Unix(1000, 0)
	q := &QP{num: 1}
	f.dt.arm(q, t0)
	f.dt.stop()
	f.dt.arm(q, t0)
	f.dt.arm(&QP{num: 2}, t0)
	f.dt.fire(t0.Add(time.Hour))
	if len(f.ran) != 0 || len(f.dt.armed) != 0 || q.tmIdx != 0 {
		t.Fatalf("after stop: ran %d, %d armed", len(f.ran), len(f.dt.armed))
	}
}

// timerCounts wraps d's timer work to count the runs per QP. It is set
// before anything is armed, so before the timer's goroutine exists.
func timerCounts(d *Device) (func() map[uint32]int, func(func(*QP))) {
	var mu sync.Mutex
	counts := map[uint32]int{}
	var hook func(*QP)
	work := d.timer.run
	d.timer.run = func(q *QP, now time.Time) time.Time {
		mu.Lock()
		counts[q.num]++
		h := hook
		mu.Unlock()
		if h != nil {
			h(q)
		}
		return work(q, now)
	}
	get := func() map[uint32]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(counts)
	}
	set := func(h func(*QP)) {
		mu.Lock()
		hook = h
		mu.Unlock()
	}
	return get, set
}

func idleQPs(t testing.TB, d *Device, n int) []*QP {
	t.Helper()
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	pd := d.AllocPD()
	qs := make([]*QP, n)
	for i := range qs {
		if qs[i], err = pd.CreateQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, Caps: QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxInline: -1}}); err != nil {
			t.Fatal(err)
		}
	}
	return qs
}

// TestDeviceTimerTouchesOnlyArmed: with every QP slot of a device taken,
// a fire of the real timer for the one armed QP runs that QP's work and
// no other's (the sweep it replaces ran all 4,096).
func TestDeviceTimerTouchesOnlyArmed(t *testing.T) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	counts, _ := timerCounts(d)
	qs := idleQPs(t, d, d.cfg.MaxQP)
	armed := qs[len(qs)/2]
	runs := d.stats.Timers.Load()
	armed.armTimer(time.Now())
	for deadline := time.Now().Add(time.Minute); d.stats.Timers.Load() == runs; {
		if time.Now().After(deadline) {
			t.Fatal("the device timer did not fire in a minute")
		}
		time.Sleep(time.Millisecond)
	}
	d.Close() // waits for the fire in progress
	got := counts()
	if len(got) != 1 || got[armed.num] != 1 {
		t.Fatalf("timer work ran for %d QPs (%v), want only QP %d once", len(got), got, armed.num)
	}
}

// TestDeviceTimerDestroyedQP: a QP destroyed while armed leaves the
// timer's heap and its work never runs.
func TestDeviceTimerDestroyedQP(t *testing.T) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	counts, _ := timerCounts(d)
	qs := idleQPs(t, d, 3)
	far := time.Now().Add(time.Hour)
	for _, q := range qs {
		q.armTimer(far)
	}
	qs[1].Destroy()
	qs[1].armTimer(far) // a destroyed QP arms nothing
	d.timer.mu.Lock()
	n := len(d.timer.armed)
	d.timer.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d QPs armed after destroying 1 of 3", n)
	}
	d.timer.fire(far)
	got := counts()
	if got[qs[1].num] != 0 || got[qs[0].num] != 1 || got[qs[2].num] != 1 {
		t.Fatalf("timer work per QP %v; QP %d was destroyed", got, qs[1].num)
	}
}

// TestDeviceTimerClose: Close waits for a fire in progress, and after it
// nothing is armed and the timer does not run again.
func TestDeviceTimerClose(t *testing.T) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	counts, hook := timerCounts(d)
	qs := idleQPs(t, d, 2)
	entered, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	hook(func(q *QP) {
		if q != qs[0] {
			return
		}
		close(entered)
		<-release
		finished.Store(true)
	})
	qs[0].armTimer(time.Now())
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the device timer did not fire in a minute")
	}
	qs[1].armTimer(time.Now().Add(time.Hour)) // sets the timer again, for Close to stop
	closed := make(chan bool)
	go func() {
		d.Close()
		closed <- finished.Load()
	}()
	close(release)
	if !<-closed {
		t.Fatal("Close returned while the timer's work was still running")
	}
	qs[1].armTimer(time.Now()) // after Close: arms nothing
	d.timer.mu.Lock()
	n, tm := len(d.timer.armed), d.timer.t
	d.timer.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d QPs armed after Close", n)
	}
	if tm.Stop() {
		t.Fatal("the timer was still set after Close")
	}
	if got := counts(); len(got) != 1 {
		t.Fatalf("timer work ran for %v", got)
	}
}

// BenchmarkDeviceTimerFire arms one QP among 4,096 idle ones and fires
// the timer for it.
func BenchmarkDeviceTimerFire(b *testing.B) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	qs := idleQPs(b, d, d.cfg.MaxQP)
	q := qs[len(qs)/2]
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		q.armTimer(now.Add(time.Hour))
		d.timer.fire(now.Add(2 * time.Hour))
	}
}
