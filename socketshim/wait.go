package socketshim

import (
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// Waiting shared by the Write-Record PacketConn and the RC stream: there
// a reader and a writer both poll one receive CQ (a reader waits for
// data, a writer for credits or a handshake, and both arrive there), so
// whoever polls rings a bell that wakes the other.

// bell broadcasts "the state changed" to parked goroutines. Take C before
// looking at the state, then park on it: a change in between is not lost.
type bell struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns the channel the next ring closes.
func (b *bell) C() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// ring wakes every goroutine parked on a channel C returned.
func (b *bell) ring() {
	b.mu.Lock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
	b.mu.Unlock()
}

// park waits until cq may hold a completion, the bell rings, the deadline
// (UnixNano in dl; 0 none) passes or moves (kick), closed closes, or tmo
// (if not 0) passes. It spins for spinFor first: a completion that comes
// within it costs no goroutine hand-off.
// Returns os.ErrDeadlineExceeded or errClosed, else nil: look again.
func park(cq *qp.CQ, dl *atomic.Int64, kick, closed chan struct{}, rang <-chan struct{}, tmo time.Duration) error {
	return parkW(cq, nil, dl, kick, closed, rang, tmo)
}

// parkW is park that tells w (if not nil) a foreground goroutine waits.
func parkW(cq *qp.CQ, w *watcher, dl *atomic.Int64, kick, closed chan struct{}, rang <-chan struct{}, tmo time.Duration) error {
	d := dl.Load()
	now := time.Now().UnixNano()
	if d != 0 && now >= d {
		return os.ErrDeadlineExceeded
	}
	select {
	case <-closed:
		return errClosed
	case <-rang:
		return nil
	default:
	}
	spin := spinFor
	if d != 0 {
		spin = min(spin, time.Duration(d-now))
	}
	if cq.Spin(spin) {
		return nil
	}
	if w != nil {
		w.enter(cq)
		defer w.exit()
	} else {
		cq.RequestNotify(false)
	}
	if cq.Pending() > 0 {
		return nil
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
		return errClosed
	}
	return nil
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// expired reports whether the deadline in dl has passed.
func expired(dl *atomic.Int64) bool {
	d := dl.Load()
	return d != 0 && time.Now().UnixNano() >= d
}

// deadlines are a connection's read and write deadlines, set as
// PacketConn's are: an atomic store and a kick to a parked call.
type deadlines struct {
	rdl, wdl     atomic.Int64
	rkick, wkick chan struct{}
}

func (d *deadlines) init() {
	d.rkick, d.wkick = make(chan struct{}, 1), make(chan struct{}, 1)
}

func setDL(dl *atomic.Int64, kick chan struct{}, t time.Time) {
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

// errTimeout is a deadline's error: os.IsTimeout and net.Error.Timeout
// report true for it, wrapped in a net.OpError.
var errTimeout = os.ErrDeadlineExceeded

// watcher lets a background goroutine take a CQ's completions while no
// foreground goroutine waits on it, and stand aside (not take the
// notification) while one does: control messages are answered, and
// records taken off the CQ as they come, even while the application
// calls nothing, so no peer can fill the CQ (the Write-Record socket).
// The arming is under mu.
type watcher struct {
	mu         sync.Mutex
	fg         int
	busy, idle chan struct{}
}

func (w *watcher) init() {
	w.busy, w.idle = make(chan struct{}, 1), make(chan struct{}, 1)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// enter arms cq for any completion on behalf of a foreground waiter.
func (w *watcher) enter(cq *qp.CQ) {
	w.mu.Lock()
	w.fg++
	cq.RequestNotify(false)
	w.mu.Unlock()
	signal(w.busy)
}

func (w *watcher) exit() {
	w.mu.Lock()
	w.fg--
	idle := w.fg == 0
	w.mu.Unlock()
	if idle {
		signal(w.idle)
	}
}

// drainEvery is how long the watcher lets ordinary completions gather
// once it has taken some, before it looks again (solicited ones it takes
// at once): under a stream it wakes about once per drainEvery, not once
// per completion, and a CQ gains at most drainEvery's worth of them
// before they are taken.
const drainEvery = time.Millisecond

// run is the background goroutine: while no foreground goroutine waits,
// it waits for a completion on cq and calls poll; after a poll it waits
// drainEvery (or a solicited completion) before the next, as long as
// completions keep coming.
func (w *watcher) run(cq *qp.CQ, closed chan struct{}, poll func()) {
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
