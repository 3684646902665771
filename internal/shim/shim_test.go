package shim

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// long bounds a wait that must end: only a hung helper reaches it.
const long = 10 * time.Second

func device(t *testing.T) (*qp.Device, *qp.PD, *qp.CQ) {
	t.Helper()
	return deviceIn(t, qp.PollEvent)
}

// deviceIn is device in a polling mode (busy: without BusyPollThread).
func deviceIn(t *testing.T, mode qp.PollMode) (*qp.Device, *qp.PD, *qp.CQ) {
	t.Helper()
	d, err := qp.Open(qp.DeviceConfig{Poll: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	return d, d.AllocPD(), cq
}

// returns runs f in a goroutine and fails the test unless it returns
// within long; it gives f's error.
func returns(t *testing.T, f func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		return err
	case <-time.After(long):
		t.Fatal("the wait did not end")
		return nil
	}
}

// modes runs f in both polling modes, busy without BusyPollThread (where
// Park drives the receive path rather than sleep).
func modes(t *testing.T, f func(t *testing.T, d *qp.Device, cq *qp.CQ)) {
	for _, mode := range []qp.PollMode{qp.PollEvent, qp.PollBusy} {
		t.Run(mode.String(), func(t *testing.T) {
			d, _, cq := deviceIn(t, mode)
			if Drives(d) != (mode == qp.PollBusy) {
				t.Fatalf("Drives: %v on a %v device", Drives(d), mode)
			}
			f(t, d, cq)
		})
	}
}

func TestParkDeadline(t *testing.T) {
	modes(t, func(t *testing.T, dev *qp.Device, cq *qp.CQ) {
		var d Deadlines
		d.Init()
		// A deadline already past: at once.
		d.Read.Store(time.Now().Add(-time.Second).UnixNano())
		if err := Park(dev, cq, nil, &d.Read, d.ReadKick, make(chan struct{}), nil, 0); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a past deadline: %v", err)
		}
		// A deadline that passes while parked.
		SetDeadline(&d.Read, d.ReadKick, time.Now().Add(20*time.Millisecond))
		<-d.ReadKick // the set kicked; nobody was parked
		err := returns(t, func() error { return Park(dev, cq, nil, &d.Read, d.ReadKick, make(chan struct{}), nil, 0) })
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a deadline passing while parked: %v", err)
		}
		if !Expired(&d.Read) {
			t.Fatal("Expired: false after the deadline")
		}
		SetDeadline(&d.Read, d.ReadKick, time.Time{})
		if Expired(&d.Read) {
			t.Fatal("Expired: true with no deadline")
		}
	})
}

// waitParks waits until Parks moves past before: a Park waits past its
// spin.
func waitParks(before int64) {
	for end := time.Now().Add(long); Parks() == before && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// TestParkWakes: a Park past its spin returns at once on close, kick and
// the bell, and once tmo passes, in both polling modes.
func TestParkWakes(t *testing.T) {
	modes(t, func(t *testing.T, dev *qp.Device, cq *qp.CQ) {
		var dl atomic.Int64
		for _, c := range []struct {
			name string
			wake func(kick, closed chan struct{}, b *Bell)
			want error
		}{
			{"closed", func(_, closed chan struct{}, _ *Bell) { close(closed) }, net.ErrClosed},
			{"kick (the deadline moved)", func(kick, _ chan struct{}, _ *Bell) { Signal(kick) }, nil},
			{"the bell", func(_, _ chan struct{}, b *Bell) { b.Ring() }, nil},
		} {
			t.Run(c.name, func(t *testing.T) {
				kick, closed := make(chan struct{}, 1), make(chan struct{})
				var b Bell
				rang := b.C()
				before := Parks()
				go func() { waitParks(before); c.wake(kick, closed, &b) }()
				err := returns(t, func() error { return Park(dev, cq, nil, &dl, kick, closed, rang, 0) })
				if !errors.Is(err, c.want) && err != c.want {
					t.Fatalf("got %v, want %v", err, c.want)
				}
				if Parks() == before {
					t.Fatal("Park returned within its spin: the test does not reach the wait")
				}
			})
		}
		// tmo: a nil return (look again) once it passes.
		if err := returns(t, func() error {
			return Park(dev, cq, nil, &dl, make(chan struct{}), make(chan struct{}), nil, 5*time.Millisecond)
		}); err != nil {
			t.Fatalf("tmo: %v", err)
		}
	})
}

// TestParkDrivesBusy: on a busy-poll device without BusyPollThread
// nothing reads the socket but the callers that poll; a Park with no
// deadline that waits past its spin must read it itself. A datagram sent
// only once it waits ends the wait, a completion on the CQ.
func TestParkDrivesBusy(t *testing.T) {
	d, pd, rcq := deviceIn(t, qp.PollBusy)
	scq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	mr, err := pd.RegisterMemory(buf, qp.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(qp.QPAttr{Type: qp.UD, SendCQ: scq, RecvCQ: rcq})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.Bind("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Activate(s); err != nil {
		t.Fatal(err)
	}
	if err := q.PostRecv(&qp.RecvWR{SGL: []qp.SGE{mr.SGE(0, 2048)}}); err != nil {
		t.Fatal(err)
	}
	ah, err := pd.CreateAH(s.LocalAddr(), q.QPN())
	if err != nil {
		t.Fatal(err)
	}
	var dl atomic.Int64
	closed := make(chan struct{})
	before := Parks()
	parked := make(chan error, 1)
	go func() { parked <- Park(d, rcq, nil, &dl, make(chan struct{}), closed, nil, 0) }()
	waitParks(before)
	if Parks() == before {
		t.Fatal("Park never waited past its spin")
	}
	if err := q.PostSend(&qp.SendWR{SGL: []qp.SGE{mr.SGE(2048, 8)}, AH: ah}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-parked:
		if err != nil || rcq.Pending() != 1 {
			t.Fatalf("Park: %v, %d completions on the CQ; want nil and the receive", err, rcq.Pending())
		}
	case <-time.After(long):
		close(closed)
		<-parked
		t.Fatalf("a busy-poll Park did not see a datagram sent while it waited (the device read %d)", d.Stats().RxDatagrams.Load())
	}
}

func TestBellNotLost(t *testing.T) {
	var b Bell
	ch := b.C()
	b.Ring() // between taking C and parking on it
	select {
	case <-ch:
	default:
		t.Fatal("a ring between C and the wait was lost")
	}
	if b.C() == ch {
		t.Fatal("the next C is the rung channel")
	}
}

func TestUntil(t *testing.T) {
	var d Deadlines
	d.Init()
	closed := make(chan struct{})
	ch := make(chan struct{})
	close(ch)
	if err := Until(ch, &d.Write, d.WriteKick, closed); err != nil {
		t.Fatalf("a closed ch: %v", err)
	}
	SetDeadline(&d.Write, d.WriteKick, time.Now().Add(10*time.Millisecond))
	<-d.WriteKick
	if err := returns(t, func() error { return Until(make(chan struct{}), &d.Write, d.WriteKick, closed) }); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a deadline: %v", err)
	}
	SetDeadline(&d.Write, d.WriteKick, time.Time{})
	<-d.WriteKick
	close(closed)
	if err := returns(t, func() error { return Until(make(chan struct{}), &d.Write, d.WriteKick, closed) }); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
	if !Done(closed) || Done(make(chan struct{})) {
		t.Fatal("Done")
	}
}

// TestSetDeadlineKicksOnce: a deadline set to the value it has kicks no
// one; a moved one kicks, and kicks never block (the channel holds one).
func TestSetDeadlineKicksOnce(t *testing.T) {
	var d Deadlines
	d.Init()
	at := time.Now().Add(time.Hour)
	SetDeadline(&d.Read, d.ReadKick, at)
	SetDeadline(&d.Read, d.ReadKick, at) // unchanged
	SetDeadline(&d.Read, d.ReadKick, at.Add(time.Second))
	if len(d.ReadKick) != 1 {
		t.Fatalf("%d kicks waiting, want 1", len(d.ReadKick))
	}
	<-d.ReadKick
	SetDeadline(&d.Read, d.ReadKick, at.Add(time.Second))
	if len(d.ReadKick) != 0 {
		t.Fatal("an unchanged deadline kicked")
	}
}

// TestWatcher: while nobody waits the watcher takes the CQ's completions
// itself; a foreground waiter parks beside it; Run returns when closed
// closes.
func TestWatcher(t *testing.T) {
	d, pd, cq := device(t)
	buf := make([]byte, 4096)
	mr, err := pd.RegisterMemory(buf, qp.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(qp.QPAttr{Type: qp.UD, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.Bind("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Activate(s); err != nil {
		t.Fatal(err)
	}
	ah, err := pd.CreateAH(s.LocalAddr(), q.QPN())
	if err != nil {
		t.Fatal(err)
	}
	var w Watcher
	w.Init()
	closed := make(chan struct{})
	polled := make(chan int, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(cq, closed, func() {
			wc := make([]qp.WorkCompletion, 4)
			polled <- cq.Poll(wc)
		})
	}()
	send := func() {
		if err := q.PostSend(&qp.SendWR{Flags: qp.FlagSignaled, SGL: []qp.SGE{mr.SGE(0, 8)}, AH: ah}); err != nil {
			t.Fatal(err)
		}
	}
	send()
	select {
	case n := <-polled:
		if n == 0 {
			t.Fatal("the watcher polled an empty CQ")
		}
	case <-time.After(long):
		t.Fatal("the watcher did not take a completion while nobody waited")
	}
	// A foreground waiter parks with it (Park tells it through Enter and
	// Exit, which never block however often they are called), and the
	// completion is taken once, by one of them.
	var dl atomic.Int64
	send()
	taken := 0
	err = returns(t, func() error {
		for taken == 0 {
			select {
			case n := <-polled:
				taken += n
				continue
			default:
			}
			taken += cq.Poll(make([]qp.WorkCompletion, 4))
			if taken == 0 {
				if err := Park(d, cq, &w, &dl, make(chan struct{}), closed, nil, time.Millisecond); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil || taken != 1 {
		t.Fatalf("taken %d, %v; want the one completion", taken, err)
	}
	for range 100 {
		w.Enter(cq)
		w.Exit()
	}
	close(closed)
	select {
	case <-done:
	case <-time.After(long):
		t.Fatal("Run did not return after closed closed")
	}
}

func TestAHCache(t *testing.T) {
	_, pd, _ := device(t)
	c := AHCache{PD: pd, QPN: 9, Max: 3}
	at := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port) }
	a1, err := c.Get(at(1))
	if err != nil {
		t.Fatal(err)
	}
	// The same address (also IPv4-mapped) is the same handle.
	if b, _ := c.Get(netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), 1)); b != a1 {
		t.Fatal("an IPv4-mapped address made a second handle")
	}
	for p := uint16(2); p <= 5; p++ {
		if _, err := c.Get(at(p)); err != nil {
			t.Fatal(err)
		}
		if c.Len() > c.Max {
			t.Fatalf("%d handles cached, Max %d", c.Len(), c.Max)
		}
	}
	// The oldest went first: 1 and 2 are gone, 3, 4, 5 stay.
	if b, _ := c.Get(at(5)); b == nil || c.Len() != 3 {
		t.Fatalf("Len %d after a hit", c.Len())
	}
	if b, _ := c.Get(at(1)); b == a1 {
		t.Fatal("the oldest handle was kept past Max")
	}
	if _, err := (&AHCache{PD: pd, QPN: 9, Max: 1}).Get(netip.AddrPort{}); err == nil {
		t.Fatal("an invalid address made a handle")
	}
}

func TestSlots(t *testing.T) {
	s := NewSlots(3)
	seen := map[int]bool{}
	for range 3 {
		i, ok := s.Take()
		if !ok || i < 0 || i > 2 || seen[i] {
			t.Fatalf("Take: %d %v (seen %v)", i, ok, seen)
		}
		seen[i] = true
	}
	if _, ok := s.Take(); ok || s.Free() != 0 {
		t.Fatal("a fourth slot of three")
	}
	s.Put(1)
	if i, ok := s.Take(); !ok || i != 1 {
		t.Fatalf("after Put(1): %d %v", i, ok)
	}
}

func TestCloseOnce(t *testing.T) {
	var once sync.Once
	ch := make(chan struct{})
	if !CloseOnce(&once, ch) || !Done(ch) {
		t.Fatal("the first CloseOnce did not close")
	}
	if CloseOnce(&once, ch) { // and no panic: ch is not closed twice
		t.Fatal("a second CloseOnce said it was the first")
	}
}
