package perf

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/qp"
)

// LinkEnd is one end of a raw-xdp run: plain UDP datagrams over an
// llp.Link (an AF_XDP socket, OpenXDPLink) with no stack above it, the
// floor of that path as UDPEnd is of the kernel socket's. It polls as
// UDPEnd does: busy, Read and Write retried without waiting, on a locked
// OS thread; event, WaitReadable (and WaitWritable when the link is
// full) between them. Bandwidth batches linkBatch datagrams a call, as
// UDPEnd's sendmmsg and recvmmsg do.
type LinkEnd struct {
	Link llp.Link
	Poll qp.PollMode
	// Peer is where PingPong and Blast send.
	Peer netip.AddrPort
	// From, if valid, is the only source the end takes datagrams from
	// (udperf server: the client's data end): Echo answers only it,
	// always at From, and Sink counts only its datagrams; the rest are
	// dropped and counted (Foreign).
	From    netip.AddrPort
	foreign atomic.Uint64
	// Stop ends the run: set it, then close Link; every method returns.
	Stop *atomic.Bool
	// Rate paces Blast at that many Gb/s of payload (0: unpaced).
	Rate float64
}

// linkBatch is how many datagrams one Read or Write of a LinkEnd carries.
const linkBatch = 32

func (e *LinkEnd) flag() *atomic.Bool {
	if e.Stop == nil {
		e.Stop = new(atomic.Bool)
	}
	return e.Stop
}

// Foreign is how many datagrams the end dropped for coming from
// elsewhere than From.
func (e *LinkEnd) Foreign() uint64 { return e.foreign.Load() }

// fits refuses a message the link cannot carry in one datagram (an
// AF_XDP link takes no IP fragments: its MTU less the headers).
func (e *LinkEnd) fits(size int) error {
	if most := e.Link.Caps().MaxDatagram; size > most {
		return fmt.Errorf("-s %d: the %s link carries at most %d bytes a datagram (its MTU less the headers; AF_XDP takes no IP fragments)", size, e.Link.Caps().Kind, most)
	}
	return nil
}

// linkWait is how an end waits for its link: spin (busy) or park.
type linkWait struct {
	link  llp.Link
	busy  bool
	stop  *atomic.Bool
	stall *atomic.Bool // may be nil
	k     int
}

// idle is called when a Read found nothing (or a Write no room): false
// once stopped or stalled.
func (w *linkWait) idle(write bool) error {
	if w.stop.Load() {
		return errStopped
	}
	if w.stall != nil && w.stall.Load() {
		return errStalled
	}
	if w.busy {
		if w.k++; w.k%spinTries == 0 {
			runtime.Gosched()
		}
		return nil
	}
	if write {
		return w.link.WaitWritable()
	}
	return w.link.WaitReadable()
}

// linkStopped maps what a stopped end's last call says to nil.
func linkStopped(err error, stop *atomic.Bool) error {
	if stop.Load() || errors.Is(err, errStopped) || errors.Is(err, llp.ErrClosed) {
		return nil
	}
	return err
}

// writeAll writes ms, waiting while the link is full (ErrWouldBlock:
// its ring, or a next hop being resolved); it returns how many went.
func writeAll(l llp.Link, ms []llp.Msg, w *linkWait) (int, error) {
	sent := 0
	for sent < len(ms) {
		n, err := l.Write(ms[sent:])
		sent += n
		switch {
		case errors.Is(err, llp.ErrWouldBlock):
			if err := w.idle(true); err != nil {
				return sent, err
			}
		case err != nil:
			return sent, err
		}
	}
	return sent, nil
}

// read reads a batch into in, waiting while none is there.
func (w *linkWait) read(in []llp.Msg) (int, error) {
	for {
		n, err := w.link.Read(in)
		if err != nil || n > 0 {
			return n, err
		}
		if err := w.idle(false); err != nil {
			return 0, err
		}
	}
}

func (e *LinkEnd) lock() func() {
	if e.Poll != qp.PollBusy {
		return func() {}
	}
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}

// Echo sends every datagram that arrives back to its sender (with From:
// only From's, to From): the far end of a ping-pong. It returns once
// stopped (nil), or on an error.
func (e *LinkEnd) Echo() error {
	stop := e.flag()
	defer e.lock()()
	in := make([]llp.Msg, linkBatch)
	out := make([]llp.Msg, linkBatch)
	bufs := make([][]byte, linkBatch)
	for i := range in {
		bufs[i] = make([]byte, 65536)
		in[i].Bufs = [][]byte{bufs[i]}
		out[i].Bufs = make([][]byte, 1)
	}
	w := &linkWait{link: e.Link, busy: e.Poll == qp.PollBusy, stop: stop}
	for {
		n, err := w.read(in)
		if err != nil {
			return linkStopped(err, stop)
		}
		k := 0
		for i := range in[:n] {
			m := &in[i]
			if e.From.IsValid() && m.Addr != e.From {
				e.foreign.Add(1)
				continue
			}
			out[k].Bufs[0], out[k].Addr, out[k].Segment = bufs[i][:m.N], m.Addr, 0
			k++
		}
		if _, err := writeAll(e.Link, out[:k], w); err != nil {
			return linkStopped(err, stop)
		}
	}
}

// PingPong sends size-byte pings to Peer and waits for each to come back
// (from Peer), warmup+iters times; it returns the last iters round trips
// halved, in nanoseconds. A reply that does not come within 2 s ends it
// with an error (and closes the link: an event end is parked in it).
func (e *LinkEnd) PingPong(size, warmup, iters int) ([]int64, error) {
	stop := e.flag()
	if err := e.fits(size); err != nil {
		return nil, err
	}
	defer e.lock()()
	ping := []llp.Msg{{Bufs: [][]byte{make([]byte, size)}, Addr: e.Peer}}
	in := make([]llp.Msg, linkBatch)
	for i := range in {
		in[i].Bufs = [][]byte{make([]byte, 65536)}
	}
	var progress atomic.Uint64
	var stall atomic.Bool
	defer watchdog(stallLimit, &progress, &stall, func() { e.Link.Close() })()
	w := &linkWait{link: e.Link, busy: e.Poll == qp.PollBusy, stop: stop, stall: &stall}
	ns := make([]int64, 0, iters)
	trip := func() error {
		if _, err := writeAll(e.Link, ping, w); err != nil {
			return err
		}
		for {
			n, err := e.Link.Read(in)
			if err != nil {
				return err
			}
			for i := range in[:n] {
				if in[i].Addr == e.Peer {
					return nil // one ping is out: one reply
				}
				e.foreign.Add(1)
			}
			if n == 0 {
				if err := w.idle(false); err != nil {
					return err
				}
			}
		}
	}
	for it := range warmup + iters {
		t0 := time.Now()
		if err := trip(); err != nil {
			if stall.Load() {
				err = errStalled
			}
			return ns, err
		}
		if it >= warmup {
			ns = append(ns, int64(time.Since(t0))/2)
		}
		progress.Add(1)
	}
	return ns, nil
}

// Blast sends size-byte datagrams to Peer, linkBatch to a Write, while
// sending holds (or until stopped), and, when count is not 0, until
// count have gone; it returns how many went out.
func (e *LinkEnd) Blast(size int, sending *atomic.Bool, count uint64) (uint64, error) {
	stop := e.flag()
	if err := e.fits(size); err != nil {
		return 0, err
	}
	defer e.lock()()
	msg := make([]byte, size)
	ms := make([]llp.Msg, linkBatch)
	for i := range ms {
		ms[i] = llp.Msg{Bufs: [][]byte{msg}, Addr: e.Peer}
	}
	pace := newPacer(e.Rate)
	if pace != nil {
		ms = ms[:1] // paced: a datagram per call, as the stack's senders post
	}
	w := &linkWait{link: e.Link, busy: e.Poll == qp.PollBusy, stop: stop}
	var sent uint64
	for sending.Load() && !stop.Load() && (count == 0 || sent < count) {
		batch := ms
		if left := count - sent; count > 0 && left < uint64(len(batch)) {
			batch = batch[:left]
		}
		n, err := e.Link.Write(batch)
		sent += uint64(n)
		pace.pace(n * size)
		switch {
		case errors.Is(err, llp.ErrWouldBlock):
			if err := w.idle(true); err != nil {
				return sent, linkStopped(err, stop)
			}
		case err != nil:
			return sent, linkStopped(err, stop)
		}
	}
	return sent, nil
}

// Sink takes in datagrams, linkBatch to a Read, and calls got with each
// batch's count and bytes (with From, of From's datagrams only), until
// stopped.
func (e *LinkEnd) Sink(got func(datagrams, bytes int)) error {
	stop := e.flag()
	defer e.lock()()
	in := make([]llp.Msg, linkBatch)
	for i := range in {
		in[i].Bufs = [][]byte{make([]byte, 65536)}
	}
	w := &linkWait{link: e.Link, busy: e.Poll == qp.PollBusy, stop: stop}
	for {
		n, err := w.read(in)
		if err != nil {
			return linkStopped(err, stop)
		}
		k, b := 0, 0
		for i := range in[:n] {
			if e.From.IsValid() && in[i].Addr != e.From {
				e.foreign.Add(1)
				continue
			}
			k++
			b += in[i].N
		}
		if k > 0 {
			got(k, b)
		}
	}
}

// XDPUsable says, in one line, why an AF_XDP end on a cannot open (no
// interface, loopback, llp.XDPAvailable's reasons), or nil.
func XDPUsable(a netip.Addr) error {
	ifname, err := llp.InterfaceOf(a)
	if err != nil {
		return err
	}
	if err := llp.XDPAvailable(ifname); err != nil {
		return fmt.Errorf("AF_XDP on %s: %w", ifname, err)
	}
	return nil
}

// OpenXDPLink opens raw-xdp's link: an AF_XDP socket on ap (port 0: a
// free one) on the interface that holds its address, with busy polling
// in WaitReadable when poll is busy.
func OpenXDPLink(ap netip.AddrPort, poll qp.PollMode) (*llp.XDP, error) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	ifname, err := llp.InterfaceOf(ap.Addr())
	if err != nil {
		return nil, err
	}
	return llp.OpenXDP(llp.XDPConfig{Interface: ifname, Addr: ap, Busy: poll == qp.PollBusy})
}
