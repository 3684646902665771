// Package shim holds what udiwarp's socket shims share: PacketConn,
// WRConn and RCConn (socketshim), the RDS socket (socketshim/rds) and the
// LD_PRELOAD engine (socketshim/preload/engine). Waiting: a bell, parking
// on a CQ with deadlines and a close, the watcher that takes a CQ's
// completions while nobody waits; deadlines; the address-handle cache;
// the send-slot free list.
package shim

import (
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// SpinFor is how long a wait spins on a CQ before it parks: a VM wake-up
// costs about 20 µs here, so a completion that comes sooner is cheaper to
// wait for awake.
const SpinFor = 50 * time.Microsecond

// Until waits until ch closes, the deadline in dl (UnixNano; 0 none)
// passes or moves (kick), or closed closes: os.ErrDeadlineExceeded,
// net.ErrClosed, else nil (look again).
func Until(ch <-chan struct{}, dl *atomic.Int64, kick, closed <-chan struct{}) error {
	d := dl.Load()
	var timer <-chan time.Time
	if d != 0 {
		left := time.Duration(d - time.Now().UnixNano())
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(left)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ch:
	case <-kick:
	case <-timer:
		return os.ErrDeadlineExceeded
	case <-closed:
		return net.ErrClosed
	}
	return nil
}

// Waiting shared by the Write-Record PacketConn and the RC stream: there
// a reader and a writer both poll one receive CQ (a reader waits for
// data, a writer for credits or a handshake, and both arrive there), so
// whoever polls rings a bell that wakes the other.

// Bell broadcasts "the state changed" to parked goroutines. Take C before
// looking at the state, then park on it: a change in between is not lost.
type Bell struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns the channel the next ring closes.
func (b *Bell) C() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// Ring wakes every goroutine parked on a channel C returned.
func (b *Bell) Ring() {
	b.mu.Lock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
	b.mu.Unlock()
}

// Park waits until cq, a CQ of dev, may hold a completion, the bell
// rings (rang), the deadline (UnixNano in dl; 0 none) passes or moves
// (kick), closed closes, or tmo (if not 0) passes, telling w (if not
// nil) that a foreground goroutine waits. It spins for SpinFor first: a
// completion that comes within it costs no goroutine hand-off. It
// returns os.ErrDeadlineExceeded or net.ErrClosed, else nil: look again.
//
// On a busy-poll device without BusyPollThread nothing reads the sockets
// but the calls that poll (Drives): there Park never sleeps, but goes on
// driving the receive path in the caller's goroutine until one of those
// happens, as CQ.Wait does on such a device — a core while it waits,
// the documented cost of busy polling (docs/verbs.md).
func Park(dev *qp.Device, cq *qp.CQ, w *Watcher, dl *atomic.Int64, kick, closed chan struct{}, rang <-chan struct{}, tmo time.Duration) error {
	d := dl.Load()
	now := time.Now().UnixNano()
	if d != 0 && now >= d {
		return os.ErrDeadlineExceeded
	}
	select {
	case <-closed:
		return net.ErrClosed
	case <-rang:
		return nil
	default:
	}
	spin := SpinFor
	if d != 0 {
		spin = min(spin, time.Duration(d-now))
	}
	if cq.Spin(spin) {
		return nil
	}
	parks.Add(1)
	drive := Drives(dev)
	switch {
	case w != nil:
		w.Enter(cq) // on a busy-poll device too: the watcher stands aside
		defer w.Exit()
	case !drive:
		cq.RequestNotify(false)
	}
	if cq.Pending() > 0 {
		return nil
	}
	if drive {
		return driveUntil(cq, d, kick, closed, rang, tmo)
	}
	var timer <-chan time.Time
	if d != 0 {
		t := time.NewTimer(time.Duration(d - time.Now().UnixNano()))
		defer t.Stop()
		timer = t.C
	}
	var wake <-chan time.Time
	if tmo > 0 {
		t := time.NewTimer(tmo)
		defer t.Stop()
		wake = t.C
	}
	select {
	case <-cq.C():
	case <-rang:
	case <-kick:
	case <-wake:
	case <-timer:
		return os.ErrDeadlineExceeded
	case <-closed:
		return net.ErrClosed
	}
	return nil
}

// Drives reports whether dev is a busy-poll device without a poller
// thread: one whose sockets nothing reads but the calls that poll its
// CQs, so that a wait on one of them must drive the receive path itself
// (CQ.Spin) rather than sleep on the CQ's channel (C), which nothing
// would fill.
func Drives(dev *qp.Device) bool {
	cfg := dev.Config()
	return cfg.Poll == qp.PollBusy && !cfg.BusyPollThread
}

// driveUntil is Park's wait on a device that Drives: it spins on cq's
// receive path (CQ.Spin, in slices of at most SpinFor) until cq holds a
// completion (nil), the deadline d (UnixNano; 0 none) passes
// (os.ErrDeadlineExceeded), tmo (if not 0) passes, kick or rang
// signals (nil: look again), or closed closes (net.ErrClosed). Between
// slices it yields, as spinners may outnumber cores.
func driveUntil(cq *qp.CQ, d int64, kick, closed chan struct{}, rang <-chan struct{}, tmo time.Duration) error {
	var end int64
	if tmo > 0 {
		end = time.Now().UnixNano() + int64(tmo)
	}
	for {
		select {
		case <-closed:
			return net.ErrClosed
		case <-rang:
			return nil
		case <-kick:
			return nil
		default:
		}
		now := time.Now().UnixNano()
		if d != 0 && now >= d {
			return os.ErrDeadlineExceeded
		}
		if end != 0 && now >= end {
			return nil
		}
		slice := SpinFor
		if d != 0 {
			slice = min(slice, time.Duration(d-now))
		}
		if end != 0 {
			slice = min(slice, time.Duration(end-now))
		}
		if cq.Spin(slice) {
			return nil
		}
		runtime.Gosched()
	}
}

// parks counts the waits that went on past their spin (Parks).
var parks atomic.Int64

// Parks returns how many waits of Park have gone on past their spin: a
// test that sees it move knows that the call it started waits.
func Parks() int64 { return parks.Load() }

// Done reports whether ch is closed.
func Done(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Expired reports whether the deadline in dl (UnixNano; 0 none) has
// passed.
func Expired(dl *atomic.Int64) bool {
	d := dl.Load()
	return d != 0 && time.Now().UnixNano() >= d
}

// Deadlines are a connection's read and write deadlines (UnixNano; 0
// none), each with the kick that tells a parked call it moved.
type Deadlines struct {
	Read, Write         atomic.Int64
	ReadKick, WriteKick chan struct{}
}

// Init makes the kicks.
func (d *Deadlines) Init() {
	d.ReadKick, d.WriteKick = make(chan struct{}, 1), make(chan struct{}, 1)
}

// SetDeadline sets the deadline in dl to t (zero: none) and, if it
// moved, kicks a call parked on it.
func SetDeadline(dl *atomic.Int64, kick chan struct{}, t time.Time) {
	v := int64(0)
	if !t.IsZero() {
		v = t.UnixNano()
	}
	if dl.Swap(v) != v {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
}

// Watcher lets a background goroutine take a CQ's completions while no
// foreground goroutine waits on it, and stand aside (not take the
// notification) while one does: control messages are answered, and
// records taken off the CQ as they come, even while the application
// calls nothing, so no peer can fill the CQ (the Write-Record socket).
// On a device that Drives nothing fills the CQ while nobody polls it:
// the watcher takes nothing there, and what comes waits in the socket
// for the next call. The arming is under mu.
type Watcher struct {
	mu         sync.Mutex
	fg         int
	busy, idle chan struct{}
}

// Init makes the watcher's channels.
func (w *Watcher) Init() {
	w.busy, w.idle = make(chan struct{}, 1), make(chan struct{}, 1)
}

// Signal sends on ch, a channel of one, unless a signal waits there.
func Signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Enter arms cq for any completion on behalf of a foreground waiter.
func (w *Watcher) Enter(cq *qp.CQ) {
	w.mu.Lock()
	w.fg++
	cq.RequestNotify(false)
	w.mu.Unlock()
	Signal(w.busy)
}

// Exit ends a foreground wait.
func (w *Watcher) Exit() {
	w.mu.Lock()
	w.fg--
	idle := w.fg == 0
	w.mu.Unlock()
	if idle {
		Signal(w.idle)
	}
}

// drainEvery is how long the watcher lets ordinary completions gather
// once it has taken some, before it looks again (solicited ones it takes
// at once): under a stream it wakes about once per drainEvery, not once
// per completion, and a CQ gains at most drainEvery's worth of them
// before they are taken.
const drainEvery = time.Millisecond

// Run is the background goroutine: while no foreground goroutine waits,
// it waits for a completion on cq and calls poll; after a poll it waits
// drainEvery (or a solicited completion) before the next, as long as
// completions keep coming.
func (w *Watcher) Run(cq *qp.CQ, closed chan struct{}, poll func()) {
	gather := time.NewTimer(time.Hour)
	gather.Stop()
	defer gather.Stop()
	gathering := false
	for {
		w.mu.Lock()
		if w.fg > 0 {
			w.mu.Unlock()
			gathering = false
			select {
			case <-w.idle:
			case <-closed:
				return
			}
			continue
		}
		cq.RequestNotify(gathering) // gathering: solicited ones only
		w.mu.Unlock()
		if !gathering {
			if cq.Pending() > 0 {
				poll()
				gathering = true
				continue
			}
			select {
			case <-cq.C():
				poll()
				gathering = true
			case <-w.busy:
			case <-closed:
				return
			}
			continue
		}
		gather.Reset(drainEvery)
		select {
		case <-cq.C():
			poll() // a control message: answer it now
		case <-gather.C:
			if cq.Pending() > 0 {
				poll()
			} else {
				gathering = false
			}
		case <-w.busy:
		case <-closed:
			return
		}
		if !gather.Stop() {
			select {
			case <-gather.C:
			default:
			}
		}
	}
}

// CloseOnce closes ch the first time it is called with once, and reports
// whether this call did: a socket's Close is the first, every later one
// returns net.ErrClosed.
func CloseOnce(once *sync.Once, ch chan struct{}) (first bool) {
	once.Do(func() {
		first = true
		close(ch)
	})
	return first
}
