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
//   - event (qp.PollEvent): the net package's calls, parked in the
//     netpoller while nothing is there.
//
// No call carries a deadline (a deadline costs a timer per call); an end
// stops when its Stop flag is set and its Conn is closed, in that order
// (see UDPEnd.Stop). The busy ends spin inside the socket's
// syscall.RawConn callback, which holds the descriptor open: Close waits
// for them to see Stop, and no raw call can reach a descriptor number
// that was closed and reused.
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

// onDescriptor runs f on c's descriptor, held open while f runs: a
// concurrent Close waits for f to return.
func onDescriptor(c syscall.Conn, f func(fd uintptr) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Read(func(fd uintptr) bool { ferr = f(fd); return true }); err != nil {
		return err
	}
	return ferr
}

// spinner retries a non-blocking system call while it says EAGAIN (or
// EINTR), until halt.
type spinner struct {
	stop  *atomic.Bool
	stall *atomic.Bool // set by a watchdog; may be nil
	k     int
}

// again reports whether to retry after errno e.
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

// ok counts a call that went through: a stream whose calls never say
// EAGAIN yields as often (a goroutine inside RawSyscall is seldom at a
// point where the runtime can preempt it, and the run's timer needs a P).
func (s *spinner) ok() {
	if s.k++; s.k%spinTries == 0 {
		runtime.Gosched()
	}
}

// lockOS locks the calling goroutine to its OS thread in busy mode
// (unless shared) and returns the unlock.
func lockOS(poll qp.PollMode, shared bool) func() {
	if poll != qp.PollBusy || shared {
		return func() {}
	}
	runtime.LockOSThread()
	return runtime.UnlockOSThread
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
// connect.
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

// UDPEnd is one end of a plain-UDP baseline run (raw-udp: a connected
// socket, read and write; raw-udp-unconn: an unconnected one, sendto and
// recvfrom, as a UD queue pair's socket must be).
type UDPEnd struct {
	Conn *net.UDPConn
	Poll qp.PollMode
	// Unconnected sends with sendto (WriteTo) to Peer, or for Echo to
	// whoever sent, and receives with recvfrom (ReadFrom). Otherwise the
	// socket is connected (Echo connects it to the first sender) and
	// uses write and read.
	Unconnected bool
	Peer        netip.AddrPort
	// Stop ends the run: set it, then close Conn; every method returns.
	// (A busy end sees Stop; an event end sees the Close.)
	Stop *atomic.Bool
	// Shared: more ends than one pair share the cores; a busy end does
	// not lock its OS thread (with more locked spinners than cores the
	// scheduler hands threads back and forth).
	Shared bool
}

func (e *UDPEnd) flag() *atomic.Bool {
	if e.Stop == nil {
		e.Stop = new(atomic.Bool)
	}
	return e.Stop
}

// recv is one non-blocking read or recvfrom into b.
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

// spinRecv and spinSend retry recv and send until they go through: the
// busy-poll discipline.
func spinRecv(fd uintptr, b []byte, from *rawAddr, s *spinner) (int, error) {
	for {
		n, e := recv(fd, b, from)
		if e == 0 {
			return n, nil
		}
		if !s.again(e) {
			return 0, spinErr(e, s)
		}
	}
}

func spinSend(fd uintptr, b []byte, to *rawAddr, s *spinner) error {
	for {
		_, e := send(fd, b, to)
		if e == 0 {
			return nil
		}
		if !s.again(e) {
			return spinErr(e, s)
		}
	}
}

func spinErr(e syscall.Errno, s *spinner) error {
	switch {
	case s.stall != nil && s.stall.Load():
		return errStalled
	case s.stop.Load():
		return errStopped
	}
	return e
}

// Echo sends every datagram that arrives back to its sender: the far end
// of a ping-pong. A connected-mode end whose socket is not connected yet
// connects it to the first sender. It returns once stopped.
func (e *UDPEnd) Echo() error {
	stop := e.flag()
	defer lockOS(e.Poll, e.Shared)()
	buf := make([]byte, 65536)
	connected := e.Conn.RemoteAddr() != nil
	if e.Poll == qp.PollBusy {
		return onDescriptor(e.Conn, func(fd uintptr) error {
			s := &spinner{stop: stop}
			var from *rawAddr
			if e.Unconnected || !connected {
				from = &rawAddr{}
			}
			for {
				n, err := spinRecv(fd, buf, from, s)
				if err != nil {
					return err
				}
				to := from
				if !e.Unconnected && from != nil { // connect to the first sender
					if _, _, errno := syscall.RawSyscall(syscall.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&from.sa)), uintptr(from.len)); errno != 0 {
						return errno
					}
					from, to = nil, nil
				}
				if err := spinSend(fd, buf[:n], to, s); err != nil {
					return err
				}
			}
		})
	}
	for {
		var n int
		var err error
		if e.Unconnected || !connected {
			var from netip.AddrPort
			if n, from, err = e.Conn.ReadFromUDPAddrPort(buf); err != nil {
				return err
			}
			if !e.Unconnected {
				if err := connectTo(e.Conn, from); err != nil {
					return err
				}
				connected = true
				_, err = e.Conn.Write(buf[:n])
			} else {
				_, err = e.Conn.WriteToUDPAddrPort(buf[:n], from)
			}
		} else {
			if n, err = e.Conn.Read(buf); err != nil {
				return err
			}
			_, err = e.Conn.Write(buf[:n])
		}
		if err != nil {
			return err
		}
	}
}

// connectTo connects c's socket to ap (connect(2): a UDP socket may be
// connected after it was bound).
func connectTo(c *net.UDPConn, ap netip.AddrPort) error {
	r := rawAddrFor(socketFamily(c), ap)
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&r.sa)), uintptr(r.len))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// PingPong sends size-byte pings (to Peer when unconnected) and waits
// for each to come back, warmup+iters times; it returns the last iters
// round trips halved, in nanoseconds. A reply that does not come within
// 2 s ends it with an error.
func (e *UDPEnd) PingPong(size, warmup, iters int) ([]int64, error) {
	stop := e.flag()
	defer lockOS(e.Poll, e.Shared)()
	msg, buf := make([]byte, size), make([]byte, 65536)
	ns := make([]int64, 0, iters)
	var progress atomic.Uint64
	var stall atomic.Bool
	defer watchdog(stallLimit, &progress, &stall, func() { e.Conn.SetReadDeadline(time.Unix(1, 0)) })()
	if e.Poll == qp.PollBusy {
		var to, from *rawAddr
		if e.Unconnected {
			to, from = rawAddrFor(socketFamily(e.Conn), e.Peer), &rawAddr{}
		}
		err := onDescriptor(e.Conn, func(fd uintptr) error {
			s := &spinner{stop: stop, stall: &stall}
			for it := range warmup + iters {
				t0 := time.Now()
				if err := spinSend(fd, msg, to, s); err != nil {
					return err
				}
				if _, err := spinRecv(fd, buf, from, s); err != nil {
					return err
				}
				if it >= warmup {
					ns = append(ns, int64(time.Since(t0))/2)
				}
				progress.Add(1)
			}
			return nil
		})
		return ns, err
	}
	for it := range warmup + iters {
		t0 := time.Now()
		var err error
		if e.Unconnected {
			if _, err = e.Conn.WriteToUDPAddrPort(msg, e.Peer); err == nil {
				_, _, err = e.Conn.ReadFromUDPAddrPort(buf)
			}
		} else if _, err = e.Conn.Write(msg); err == nil {
			_, err = e.Conn.Read(buf)
		}
		if err != nil {
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

// call is one non-blocking sendmmsg or recvmmsg of the whole vector.
func (m *mmsg) call(fd uintptr, trap uintptr) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&m.hdrs[0])), uintptr(len(m.hdrs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

// batches runs sendmmsg or recvmmsg on c's descriptor, over and over,
// handing each result to each (which returns false to end): spinning in
// busy mode, parked in the netpoller between batches in event mode.
func batches(c *net.UDPConn, poll qp.PollMode, m *mmsg, trap uintptr, stop *atomic.Bool, each func(n int) bool) error {
	if poll == qp.PollBusy {
		return onDescriptor(c, func(fd uintptr) error {
			s := &spinner{stop: stop}
			for {
				n, e := m.call(fd, trap)
				if e == 0 {
					if !each(n) {
						return nil
					}
					s.ok()
					continue
				}
				if !s.again(e) {
					return spinErr(e, s)
				}
			}
		})
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	do, goOn := rc.Read, true
	if trap == unix.SYS_SENDMMSG {
		do = rc.Write
	}
	var cerr error
	for goOn && !stop.Load() {
		if err := do(func(fd uintptr) bool {
			n, e := m.call(fd, trap)
			if e == unix.EAGAIN || e == unix.EINTR {
				return false // wait in the netpoller
			}
			if e != 0 {
				cerr, goOn = e, false
				return true
			}
			goOn = each(n)
			return true
		}); err != nil {
			return err
		}
	}
	return cerr
}

// Blast sends size-byte datagrams, udpBatch to a sendmmsg, while sending
// holds (or until stopped); it returns how many went out. It sizes the
// socket's buffers first (sockBuffer), as Sink does.
func (e *UDPEnd) Blast(size int, sending *atomic.Bool) (uint64, error) {
	stop := e.flag()
	setBuffers(e.Conn, sockBuffer)
	defer lockOS(e.Poll, e.Shared)()
	msg := make([]byte, size)
	bufs := make([][]byte, udpBatch)
	for i := range bufs {
		bufs[i] = msg
	}
	var to *rawAddr
	if e.Unconnected {
		to = rawAddrFor(socketFamily(e.Conn), e.Peer)
	}
	m := newMmsg(bufs, to)
	var sent uint64
	err := batches(e.Conn, e.Poll, m, unix.SYS_SENDMMSG, stop, func(n int) bool {
		sent += uint64(n)
		return sending.Load()
	})
	if errors.Is(err, errStopped) {
		err = nil
	}
	return sent, err
}

// Sink takes in datagrams, udpBatch to a recvmmsg, and calls got with
// each batch's count and bytes, until stopped.
func (e *UDPEnd) Sink(got func(datagrams, bytes int)) error {
	stop := e.flag()
	setBuffers(e.Conn, sockBuffer)
	defer lockOS(e.Poll, e.Shared)()
	bufs := make([][]byte, udpBatch)
	for i := range bufs {
		bufs[i] = make([]byte, 65536)
	}
	m := newMmsg(bufs, nil)
	return batches(e.Conn, e.Poll, m, unix.SYS_RECVMMSG, stop, func(n int) bool {
		b := 0
		for _, h := range m.hdrs[:n] {
			b += int(h.Len)
		}
		got(n, b)
		return true
	})
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

// full reads or writes exactly len(b) bytes on fd, spinning.
func full(fd uintptr, b []byte, write bool, s *spinner) error {
	call := uintptr(syscall.SYS_READ)
	if write {
		call = syscall.SYS_WRITE
	}
	for len(b) > 0 {
		n, _, e := syscall.RawSyscall(call, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
		if e == 0 && int(n) > 0 {
			b = b[n:]
			s.ok()
			continue
		}
		if e == 0 {
			return errors.New("perf: the peer closed the connection")
		}
		if !s.again(e) {
			return spinErr(e, s)
		}
	}
	return nil
}

// Echo reads size-byte messages and writes each back: the far end of a
// ping-pong. It returns once stopped, or the peer closes.
func (e *TCPEnd) Echo(size int) error {
	stop := e.flag()
	defer lockOS(e.Poll, e.Shared)()
	buf := make([]byte, max(size, 1))
	if e.Poll == qp.PollBusy {
		return onDescriptor(e.Conn, func(fd uintptr) error {
			s := &spinner{stop: stop}
			for {
				if err := full(fd, buf, false, s); err != nil {
					return err
				}
				if err := full(fd, buf, true, s); err != nil {
					return err
				}
			}
		})
	}
	for {
		if _, err := readFull(e.Conn, buf); err != nil {
			return err
		}
		if _, err := e.Conn.Write(buf); err != nil {
			return err
		}
	}
}

func readFull(c *net.TCPConn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// PingPong writes size-byte messages and reads each back, warmup+iters
// times; it returns the last iters round trips halved, in nanoseconds.
func (e *TCPEnd) PingPong(size, warmup, iters int) ([]int64, error) {
	stop := e.flag()
	defer lockOS(e.Poll, e.Shared)()
	size = max(size, 1)
	msg, buf := make([]byte, size), make([]byte, size)
	ns := make([]int64, 0, iters)
	var progress atomic.Uint64
	var stall atomic.Bool
	defer watchdog(stallLimit, &progress, &stall, func() { e.Conn.SetReadDeadline(time.Unix(1, 0)) })()
	if e.Poll == qp.PollBusy {
		err := onDescriptor(e.Conn, func(fd uintptr) error {
			s := &spinner{stop: stop, stall: &stall}
			for it := range warmup + iters {
				t0 := time.Now()
				if err := full(fd, msg, true, s); err != nil {
					return err
				}
				if err := full(fd, buf, false, s); err != nil {
					return err
				}
				if it >= warmup {
					ns = append(ns, int64(time.Since(t0))/2)
				}
				progress.Add(1)
			}
			return nil
		})
		return ns, err
	}
	for it := range warmup + iters {
		t0 := time.Now()
		_, err := e.Conn.Write(msg)
		if err == nil {
			_, err = readFull(e.Conn, buf)
		}
		if err != nil {
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

// Stream writes size-byte messages, one write each, while sending holds;
// it returns the bytes written (a message cut short when stopped counts
// what went).
func (e *TCPEnd) Stream(size int, sending *atomic.Bool) (uint64, error) {
	stop := e.flag()
	defer lockOS(e.Poll, e.Shared)()
	msg := make([]byte, max(size, 1))
	var sent uint64
	if e.Poll == qp.PollBusy {
		err := onDescriptor(e.Conn, func(fd uintptr) error {
			s := &spinner{stop: stop}
			for off := 0; sending.Load() || off > 0; {
				n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&msg[off])), uintptr(len(msg)-off))
				if errno == 0 {
					sent += uint64(n)
					off = (off + int(n)) % len(msg)
					s.ok()
					continue
				}
				if !s.again(errno) {
					return spinErr(errno, s)
				}
			}
			return nil
		})
		if errors.Is(err, errStopped) {
			err = nil
		}
		return sent, err
	}
	for sending.Load() && !stop.Load() {
		n, err := e.Conn.Write(msg)
		sent += uint64(n)
		if err != nil {
			if stop.Load() {
				err = nil
			}
			return sent, err
		}
	}
	return sent, nil
}

// tcpSinkBuffer is how much a TCP sink asks of each read.
const tcpSinkBuffer = 1 << 20

// Sink reads whatever arrives, calling got with each read's bytes, until
// stopped or the peer closes.
func (e *TCPEnd) Sink(got func(bytes int)) error {
	stop := e.flag()
	defer lockOS(e.Poll, e.Shared)()
	buf := make([]byte, tcpSinkBuffer)
	if e.Poll == qp.PollBusy {
		return onDescriptor(e.Conn, func(fd uintptr) error {
			s := &spinner{stop: stop}
			for {
				n, e := recv(fd, buf, nil)
				if e == 0 {
					if n == 0 {
						return nil // the peer closed
					}
					got(n)
					s.ok()
					continue
				}
				if !s.again(e) {
					return spinErr(e, s)
				}
			}
		})
	}
	for {
		n, err := e.Conn.Read(buf)
		if n > 0 {
			got(n)
		}
		if err != nil {
			return err
		}
	}
}
