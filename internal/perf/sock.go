package perf

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/sys/unix"
)

// The plain-socket ends: one home for both ends of the baselines, used by
// `udperf local` (both ends in one process) and by `udperf server` and
// `udperf client` (one end each), so that both sides of every ratio, in
// either setting, wait the same way:
//
//   - busy (qp.PollBusy): non-blocking raw system calls
//     (syscall.RawSyscall, no trip through the runtime's syscall
//     bookkeeping) retried on the descriptor, on a locked OS thread;
//   - event (qp.PollEvent): the same calls, each in a syscall.RawConn
//     callback that parks in the netpoller while nothing is there; a
//     ping-pong's receive first retries for eventSpin, as a queue pair's
//     CQ.Wait does.
//
// No call carries a deadline (a deadline costs a timer per call); an end
// stops when its Stop flag is set and its Conn is closed, in that order
// (see UDPEnd.Stop). The busy ends spin inside one syscall.RawConn
// callback for the whole run, which holds the descriptor open (no
// callback per call: it would cost a tenth of a small message's time):
// Close waits for them to see Stop, and no raw call can reach a
// descriptor number that was closed and reused.
//
// Why this is the fastest plain Go for each mode (measured on the
// project's 2-vCPU VM, one-way latency 64 B, busy on both sides): Go with
// RawSyscall read/write on a connected non-blocking UDP socket, thread
// locked, 2.3 µs mean and 4.7 µs p99, as fast as C (sockperf
// --nonblocked 2.3 µs, fi_pingpong udp 2.4 µs); the same with
// unix.Recvfrom(MSG_DONTWAIT) 3.4 µs and a p99 of 18 µs. Anything that
// sleeps (the netpoller, a blocking recvfrom, C or Go) pays a VM wake-up:
// 25-31 µs. Bandwidth needs batches (sendmmsg/recvmmsg: 57 Gb/s at
// 64000 B against 42 for one call per datagram) and a large receive
// buffer (a 512 KiB burst of 9 datagrams lost 11 % of them with the
// default 208 KiB, none with 32 MiB, which needs SO_RCVBUFFORCE above
// net.core.rmem_max). TCP: one write per message with TCP_NODELAY, as
// RC sets it, 45 Gb/s at 64000 B; small messages would gain from
// coalescing (bufio: 25 Gb/s at 1 KiB against 2.8), which RC does not
// do either. Source: the loopback study of 2026-11-21 (sockperf 3.7,
// qperf 0.4.11, iperf 3.12, libfabric 1.17 fi_pingpong, and Go programs
// for each variant; kernel 6.18, go1.26), summarized in docs/udperf.md.

// spinTries is how many empty tries a spinner makes between yields: a
// loop that lives in RawSyscall cannot be preempted, and with more
// spinners than cores the others must get to run.
const spinTries = 1024

// sockBuffer is what the bandwidth baselines ask of SO_RCVBUFFORCE and
// SO_SNDBUFFORCE (the kernel doubles it), as the UD devices ask 32 MiB:
// above net.core.rmem_max, so it needs CAP_NET_ADMIN; without it the
// plain SO_RCVBUF/SO_SNDBUF is capped at the sysctl.
const sockBuffer = 32 << 20

// setBuffers sizes c's kernel buffers to bytes, forced where allowed.
func setBuffers(c syscall.Conn, bytes int) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], bytes) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], bytes)
			}
		}
	})
}

// errStalled ends a ping-pong whose reply did not come.
var errStalled = errors.New("perf: no reply within 2 s")

// stallLimit is how long a ping-pong waits for a reply.
const stallLimit = 2 * time.Second

// eventSpin is how long an event end retries a receive before it parks in
// the netpoller: a queue pair's CQ.Wait polls its device as long
// (qp.DeviceConfig.EventSpin's default) before it parks, so a reply that
// comes back within it costs neither a wake-up.
const eventSpin = 50 * time.Microsecond

// An op is one non-blocking system call on a descriptor; it returns its
// errno, EAGAIN while it cannot go through.
type op func(fd uintptr) syscall.Errno

// sysIO runs ops the way an end's polling mode says (busyIO, eventIO).
type sysIO interface {
	read(o op) error  // a receive: waits until o goes through
	write(o op) error // a send: waits until o goes through
	// drain is a receive of a stream's sink: in event mode it parks at
	// once, as a queue pair's receive loop does (a spinning sink takes in
	// smaller batches: 4 against 7 Gb/s for 1 KiB datagrams).
	drain(o op) error
}

// busyIO retries ops on a descriptor held open (onDescriptor), spinning.
type busyIO struct {
	fd uintptr
	s  spinner
}

func (b *busyIO) read(o op) error { return b.spin(o) }

func (b *busyIO) write(o op) error { return b.spin(o) }

func (b *busyIO) drain(o op) error { return b.spin(o) }

func (b *busyIO) spin(o op) error {
	for {
		e := o(b.fd)
		if e == 0 {
			b.s.ok()
			return nil
		}
		if !b.s.again(e) {
			return b.s.err(e)
		}
	}
}

// eventIO runs each op in a RawConn callback: a receive is retried for
// up to eventSpin, then (as a send or a drain at once) parks in the
// netpoller until the socket is ready.
type eventIO struct {
	rc    syscall.RawConn
	o     op
	spin  bool
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

func newEventIO(rc syscall.RawConn) *eventIO {
	e := &eventIO{rc: rc}
	e.fn = func(fd uintptr) bool {
		var start time.Time
		for k := 0; ; k++ {
			e.errno = e.o(fd)
			if e.errno != unix.EAGAIN && e.errno != unix.EINTR {
				return true
			}
			if !e.spin {
				return false
			}
			if k == 0 {
				start = time.Now()
			} else if time.Since(start) > eventSpin {
				return false
			}
		}
	}
	return e
}

func (e *eventIO) read(o op) error  { return e.do(o, true, true) }
func (e *eventIO) write(o op) error { return e.do(o, false, false) }
func (e *eventIO) drain(o op) error { return e.do(o, true, false) }

func (e *eventIO) do(o op, read, spin bool) error {
	e.o, e.spin = o, spin
	do := e.rc.Write
	if read {
		do = e.rc.Read
	}
	if err := do(e.fn); err != nil {
		return err
	}
	if e.errno != 0 {
		return e.errno
	}
	return nil
}

// withIO runs f with c's sysIO for poll: busy, on c's descriptor held
// open for f's length, on the OS thread locked unless shared; event, one
// RawConn callback per op.
func withIO(c syscall.Conn, poll qp.PollMode, shared bool, stop, stall *atomic.Bool, f func(sysIO) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	if poll != qp.PollBusy {
		return f(newEventIO(rc))
	}
	if !shared {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	var ferr error
	if err := rc.Read(func(fd uintptr) bool {
		ferr = f(&busyIO{fd: fd, s: spinner{stop: stop, stall: stall}})
		return true
	}); err != nil {
		return err
	}
	return ferr
}

// spinner says whether to retry a non-blocking call that said EAGAIN (or
// EINTR): until stop (or stall, set by a watchdog) is set.
type spinner struct {
	stop  *atomic.Bool
	stall *atomic.Bool // may be nil
	k     int
}

func (s *spinner) again(e syscall.Errno) bool {
	if e != unix.EAGAIN && e != unix.EINTR {
		return false
	}
	if s.stop.Load() || (s.stall != nil && s.stall.Load()) {
		return false
	}
	s.ok()
	return true
}

// ok counts a call: every spinTries the spinner yields, whether its calls
// went through or not (a stream whose calls never say EAGAIN must yield
// too: a goroutine inside RawSyscall is seldom at a point where the
// runtime can preempt it, and the run's timer needs a P).
func (s *spinner) ok() {
	if s.k++; s.k%spinTries == 0 {
		runtime.Gosched()
	}
}

// err is what ends a spin on errno e.
func (s *spinner) err(e syscall.Errno) error {
	switch {
	case s.stall != nil && s.stall.Load():
		return errStalled
	case s.stop.Load():
		return errStopped
	}
	return e
}

// stopped maps what a stopped end's last call says to nil.
func stopped(err error, stop *atomic.Bool) error {
	if stop.Load() || errors.Is(err, errStopped) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// watchdog sets stall, and calls fire, once progress has not moved for
// limit; the returned function ends it.
func watchdog(limit time.Duration, progress *atomic.Uint64, stall *atomic.Bool, fire func()) func() {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(limit)
		defer t.Stop()
		seen := progress.Load()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if now := progress.Load(); now != seen {
					seen = now
					continue
				}
				stall.Store(true)
				fire()
				return
			}
		}
	}()
	return func() { close(done); <-exited }
}

// rawAddr is a socket address in the kernel's form, for sendto and
// connect, or filled in by recvfrom.
type rawAddr struct {
	sa  unix.RawSockaddrAny
	len uint32
}

// socketFamily is c's address family (AF_INET or AF_INET6).
func socketFamily(c syscall.Conn) int {
	fam := unix.AF_INET
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil {
				fam = v
			}
		})
	}
	return fam
}

// rawAddrFor is ap as a socket of family fam addresses it (an IPv4
// address to an IPv6 socket: IPv4-mapped).
func rawAddrFor(fam int, ap netip.AddrPort) *rawAddr {
	r := &rawAddr{}
	port := ap.Port()
	if fam == unix.AF_INET {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.sa))
		sa.Family = unix.AF_INET
		sa.Port = port<<8 | port>>8
		sa.Addr = ap.Addr().Unmap().As4()
		r.len = unix.SizeofSockaddrInet4
		return r
	}
	sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&r.sa))
	sa.Family = unix.AF_INET6
	sa.Port = port<<8 | port>>8
	sa.Addr = ap.Addr().As16()
	r.len = unix.SizeofSockaddrInet6
	return r
}

// is says r and o are the same socket address (as recvfrom fills r in
// and rawAddrFor makes o: the same family, port and address bytes).
func (r *rawAddr) is(o *rawAddr) bool {
	if r.len != o.len {
		return false
	}
	a := unsafe.Slice((*byte)(unsafe.Pointer(&r.sa)), r.len)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&o.sa)), o.len)
	switch r.sa.Addr.Family {
	case unix.AF_INET: // family, port, address; not the padding
		return string(a[:8]) == string(b[:8])
	case unix.AF_INET6: // family, port, (not the flow label) address, scope
		return string(a[:4]) == string(b[:4]) && string(a[8:28]) == string(b[8:28])
	}
	return false
}

// recv is one non-blocking read, or recvfrom filling in from.
func recv(fd uintptr, b []byte, from *rawAddr) (int, syscall.Errno) {
	if from == nil {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
		return int(n), e
	}
	from.len = unix.SizeofSockaddrAny
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&from.sa)), uintptr(unsafe.Pointer(&from.len)))
	return int(n), e
}

// send is one non-blocking write, or sendto to.
func send(fd uintptr, b []byte, to *rawAddr) (int, syscall.Errno) {
	if to == nil {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
		return int(n), e
	}
	n, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&to.sa)), uintptr(to.len))
	return int(n), e
}

// UDPEnd is one end of a plain-UDP baseline run (raw-udp: a connected
// socket, read and write; raw-udp-unconn: an unconnected one, sendto and
// recvfrom, as a UD queue pair's socket must be).
type UDPEnd struct {
	Conn *net.UDPConn
	Poll qp.PollMode
	// Unconnected sends with sendto to Peer (Echo: to whoever sent) and
	// receives with recvfrom. Otherwise the socket is connected (Echo
	// connects it to the first sender) and uses write and read.
	Unconnected bool
	Peer        netip.AddrPort
	// From, if valid, is the only source an unconnected end takes
	// datagrams from (udperf server: the client's data socket, named in
	// its request): Echo answers only it, always at From, and Sink counts
	// only its datagrams; the rest are dropped and counted (Foreign). A
	// connected end needs no From: the kernel takes only its peer's.
	From netip.AddrPort
	// foreign counts datagrams dropped for coming from elsewhere than From.
	foreign atomic.Uint64
	// Stop ends the run: set it, then close Conn; every method returns.
	// (A busy end sees Stop; an event end sees the Close.)
	Stop *atomic.Bool
	// Shared: more ends than one pair share the cores; a busy end does
	// not lock its OS thread (with more locked spinners than cores the
	// scheduler hands threads back and forth).
	Shared bool
	// Rate paces Blast at that many Gb/s of payload (0: unpaced).
	Rate float64
}

func (e *UDPEnd) flag() *atomic.Bool {
	if e.Stop == nil {
		e.Stop = new(atomic.Bool)
	}
	return e.Stop
}

// Foreign is how many datagrams the end dropped for coming from
// elsewhere than From.
func (e *UDPEnd) Foreign() uint64 { return e.foreign.Load() }

// Echo sends every datagram that arrives back to its sender: the far end
// of a ping-pong. A connected-mode end whose socket is not connected yet
// connects it to the first sender. With From, an unconnected end answers
// only From's datagrams. It returns once stopped (nil), or on an error.
func (e *UDPEnd) Echo() error {
	stop := e.flag()
	buf := make([]byte, 65536)
	var from, to, only *rawAddr
	if e.Unconnected || e.Conn.RemoteAddr() == nil {
		from = &rawAddr{}
	}
	if e.Unconnected && e.From.IsValid() {
		only = rawAddrFor(socketFamily(e.Conn), e.From)
	}
	var n int
	var errno syscall.Errno
	rd := func(fd uintptr) syscall.Errno { n, errno = recv(fd, buf, from); return errno }
	wr := func(fd uintptr) syscall.Errno { _, errno = send(fd, buf[:n], to); return errno }
	connect := func(fd uintptr) syscall.Errno {
		_, _, errno = syscall.RawSyscall(syscall.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&from.sa)), uintptr(from.len))
		return errno
	}
	err := withIO(e.Conn, e.Poll, e.Shared, stop, nil, func(io sysIO) error {
		for {
			if err := io.read(rd); err != nil {
				return err
			}
			if only != nil {
				if !from.is(only) {
					e.foreign.Add(1)
					continue
				}
				to = only
			} else if e.Unconnected {
				to = from
			} else if from != nil { // connect to the first sender
				if err := io.write(connect); err != nil {
					return err
				}
				from = nil
			}
			if err := io.write(wr); err != nil {
				return err
			}
		}
	})
	return stopped(err, stop)
}

// PingPong sends size-byte pings (to Peer when unconnected) and waits
// for each to come back, warmup+iters times; it returns the last iters
// round trips halved, in nanoseconds. A reply that does not come within
// 2 s ends it with an error.
func (e *UDPEnd) PingPong(size, warmup, iters int) ([]int64, error) {
	stop := e.flag()
	msg, buf := make([]byte, size), make([]byte, 65536)
	var to, from *rawAddr
	if e.Unconnected {
		to, from = rawAddrFor(socketFamily(e.Conn), e.Peer), &rawAddr{}
	}
	rd := func(fd uintptr) syscall.Errno { _, errno := recv(fd, buf, from); return errno }
	wr := func(fd uintptr) syscall.Errno { _, errno := send(fd, msg, to); return errno }
	return pingPong(e.Conn, e.Poll, e.Shared, stop, warmup, iters, func() { e.Conn.SetReadDeadline(time.Unix(1, 0)) },
		func(io sysIO) error {
			if err := io.write(wr); err != nil {
				return err
			}
			return io.read(rd)
		})
}

// pingPong times warmup+iters round trips of trip, with a watchdog that
// ends a stalled one (fire unblocks an event end's wait).
func pingPong(c syscall.Conn, poll qp.PollMode, shared bool, stop *atomic.Bool, warmup, iters int, fire func(), trip func(sysIO) error) ([]int64, error) {
	ns := make([]int64, 0, iters)
	var progress atomic.Uint64
	var stall atomic.Bool
	defer watchdog(stallLimit, &progress, &stall, fire)()
	err := withIO(c, poll, shared, stop, &stall, func(io sysIO) error {
		for it := range warmup + iters {
			t0 := time.Now()
			if err := trip(io); err != nil {
				return err
			}
			if it >= warmup {
				ns = append(ns, int64(time.Since(t0))/2)
			}
			progress.Add(1)
		}
		return nil
	})
	if err != nil && stall.Load() {
		err = errStalled
	}
	return ns, err
}

// udpBatch is how many datagrams one sendmmsg or recvmmsg carries.
const udpBatch = 32

// mmsg is a sendmmsg/recvmmsg vector.
type mmsg struct {
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec
}

func newMmsg(bufs [][]byte, to *rawAddr) *mmsg {
	m := &mmsg{hdrs: make([]unix.Mmsghdr, len(bufs)), iovs: make([]unix.Iovec, len(bufs))}
	for i, b := range bufs {
		m.iovs[i].Base = unsafe.SliceData(b)
		m.iovs[i].SetLen(len(b))
		h := &m.hdrs[i].Hdr
		h.Iov = &m.iovs[i]
		h.SetIovlen(1)
		if to != nil {
			h.Name = (*byte)(unsafe.Pointer(&to.sa))
			h.Namelen = to.len
		}
	}
	return m
}

// op is one non-blocking sendmmsg or recvmmsg (trap) of the whole vector;
// it leaves the count in *n.
func (m *mmsg) op(trap uintptr, n *int) op {
	return func(fd uintptr) syscall.Errno {
		r, _, e := syscall.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&m.hdrs[0])), uintptr(len(m.hdrs)), unix.MSG_DONTWAIT, 0, 0)
		*n = int(r)
		return e
	}
}

// Blast sends size-byte datagrams, udpBatch to a sendmmsg, while sending
// holds (or until stopped), and, when count is not 0, until count have
// gone; it returns how many went out. It sizes the socket's buffers first
// (sockBuffer), as Sink does.
func (e *UDPEnd) Blast(size int, sending *atomic.Bool, count uint64) (uint64, error) {
	stop := e.flag()
	setBuffers(e.Conn, sockBuffer)
	msg := make([]byte, size)
	bufs := make([][]byte, udpBatch)
	for i := range bufs {
		bufs[i] = msg
	}
	var to *rawAddr
	if e.Unconnected {
		to = rawAddrFor(socketFamily(e.Conn), e.Peer)
	}
	pace := newPacer(e.Rate)
	if pace != nil {
		bufs = bufs[:1] // paced: a datagram per call, as the stack's senders post
	}
	var n int
	wr := newMmsg(bufs, to).op(unix.SYS_SENDMMSG, &n)
	var sent uint64
	err := withIO(e.Conn, e.Poll, e.Shared, stop, nil, func(io sysIO) error {
		for sending.Load() && !stop.Load() && (count == 0 || sent < count) {
			if left := count - sent; count > 0 && left < uint64(len(bufs)) {
				wr = newMmsg(bufs[:left], to).op(unix.SYS_SENDMMSG, &n) // the last batch: what is left
			}
			if err := io.write(wr); err != nil {
				return err
			}
			sent += uint64(n)
			pace.pace(n * size)
		}
		return nil
	})
	return sent, stopped(err, stop)
}

// Sink takes in datagrams, udpBatch to a recvmmsg, and calls got with
// each batch's count and bytes (with From, of From's datagrams only),
// until stopped.
func (e *UDPEnd) Sink(got func(datagrams, bytes int)) error {
	stop := e.flag()
	setBuffers(e.Conn, sockBuffer)
	bufs := make([][]byte, udpBatch)
	for i := range bufs {
		bufs[i] = make([]byte, 65536)
	}
	m := newMmsg(bufs, nil)
	var n int
	rd := m.op(unix.SYS_RECVMMSG, &n)
	var only *rawAddr
	var names []rawAddr
	if e.Unconnected && e.From.IsValid() { // take in the sources too, to keep From's only
		only = rawAddrFor(socketFamily(e.Conn), e.From)
		names = make([]rawAddr, len(bufs))
		for i := range m.hdrs {
			m.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&names[i].sa))
		}
		named := rd
		rd = func(fd uintptr) syscall.Errno {
			for i := range m.hdrs {
				m.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrAny
			}
			return named(fd)
		}
	}
	err := withIO(e.Conn, e.Poll, e.Shared, stop, nil, func(io sysIO) error {
		for {
			if err := io.drain(rd); err != nil {
				return err
			}
			k, b := 0, 0
			for i, h := range m.hdrs[:n] {
				if only != nil {
					names[i].len = h.Hdr.Namelen
					if !names[i].is(only) {
						e.foreign.Add(1)
						continue
					}
				}
				k++
				b += int(h.Len)
			}
			if k > 0 {
				got(k, b)
			}
		}
	})
	return stopped(err, stop)
}

// TCPEnd is one end of a plain-TCP baseline run (raw-tcp).
type TCPEnd struct {
	Conn *net.TCPConn
	Poll qp.PollMode
	// Stop ends the run: set it, then close Conn (UDPEnd.Stop).
	Stop   *atomic.Bool
	Shared bool // UDPEnd.Shared
}

// TuneTCP sets what the raw-tcp baseline runs with: TCP_NODELAY, as RC
// sets it (one message, one write, sent at once), and large kernel
// buffers, forced where allowed.
func TuneTCP(c *net.TCPConn) {
	c.SetNoDelay(true)
	setBuffers(c, sockBuffer)
}

func (e *TCPEnd) flag() *atomic.Bool {
	if e.Stop == nil {
		e.Stop = new(atomic.Bool)
	}
	return e.Stop
}

var errPeerClosed = errors.New("perf: the peer closed the connection")

// streamIO reads or writes whole buffers of a TCP stream.
type streamIO struct {
	b      []byte
	n      int
	rd, wr op
}

func newStreamIO() *streamIO {
	s := &streamIO{}
	s.rd = func(fd uintptr) syscall.Errno { var e syscall.Errno; s.n, e = recv(fd, s.b, nil); return e }
	s.wr = func(fd uintptr) syscall.Errno { var e syscall.Errno; s.n, e = send(fd, s.b, nil); return e }
	return s
}

// full reads (or writes) all of b.
func (s *streamIO) full(io sysIO, b []byte, write bool) error {
	for len(b) > 0 {
		s.b = b
		var err error
		if write {
			err = io.write(s.wr)
		} else {
			err = io.read(s.rd)
		}
		if err != nil {
			return err
		}
		if s.n <= 0 {
			return errPeerClosed
		}
		b = b[s.n:]
	}
	return nil
}

// Echo reads size-byte messages and writes each back: the far end of a
// ping-pong. It returns once stopped, or the peer closes (nil).
func (e *TCPEnd) Echo(size int) error {
	stop := e.flag()
	buf := make([]byte, max(size, 1))
	s := newStreamIO()
	err := withIO(e.Conn, e.Poll, e.Shared, stop, nil, func(io sysIO) error {
		for {
			if err := s.full(io, buf, false); err != nil {
				return err
			}
			if err := s.full(io, buf, true); err != nil {
				return err
			}
		}
	})
	if errors.Is(err, errPeerClosed) {
		err = nil
	}
	return stopped(err, stop)
}

// PingPong writes size-byte messages and reads each back, warmup+iters
// times; it returns the last iters round trips halved, in nanoseconds.
func (e *TCPEnd) PingPong(size, warmup, iters int) ([]int64, error) {
	stop := e.flag()
	size = max(size, 1)
	msg, buf := make([]byte, size), make([]byte, size)
	s := newStreamIO()
	return pingPong(e.Conn, e.Poll, e.Shared, stop, warmup, iters, func() { e.Conn.SetReadDeadline(time.Unix(1, 0)) },
		func(io sysIO) error {
			if err := s.full(io, msg, true); err != nil {
				return err
			}
			return s.full(io, buf, false)
		})
}

// Stream writes size-byte messages, one write each, while sending holds,
// and, when count is not 0, until count messages have gone; it returns
// the bytes written (a message cut short when stopped counts what went).
func (e *TCPEnd) Stream(size int, sending *atomic.Bool, count uint64) (uint64, error) {
	stop := e.flag()
	msg := make([]byte, max(size, 1))
	s := newStreamIO()
	var sent, msgs uint64
	err := withIO(e.Conn, e.Poll, e.Shared, stop, nil, func(io sysIO) error {
		for off := 0; (sending.Load() || off > 0) && !stop.Load() && (count == 0 || msgs < count); {
			s.b = msg[off:]
			if err := io.write(s.wr); err != nil {
				return err
			}
			sent += uint64(s.n)
			if off = (off + s.n) % len(msg); off == 0 {
				msgs++
			}
		}
		return nil
	})
	return sent, stopped(err, stop)
}

// tcpSinkBuffer is how much a TCP sink asks of each read.
const tcpSinkBuffer = 1 << 20

// Sink reads whatever arrives, calling got with each read's bytes, until
// stopped or the peer closes.
func (e *TCPEnd) Sink(got func(bytes int)) error {
	stop := e.flag()
	s := newStreamIO()
	s.b = make([]byte, tcpSinkBuffer)
	err := withIO(e.Conn, e.Poll, e.Shared, stop, nil, func(io sysIO) error {
		for {
			if err := io.drain(s.rd); err != nil {
				return err
			}
			if s.n == 0 {
				return nil // the peer closed
			}
			got(s.n)
		}
	})
	return stopped(err, stop)
}
