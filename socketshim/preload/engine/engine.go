//go:build cgo && linux

// Command engine is the Go half of udiwarp's LD_PRELOAD library, built
// with -buildmode=c-shared as libudiwarp_engine.so and dlopen()ed by
// libudiwarp_preload.so (../c/preload.c) on a program's first datagram
// socket. See the preload package for the design.
//
// Every exported function is non-blocking but for a bounded spin: the C
// side does all blocking waits, on the socket's eventfd, so a program's
// threads never park inside Go. Errors are returned as -errno.
package main

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/socketshim"
	"github.com/udiwarp/udiwarp/socketshim/internal/shim"
	"golang.org/x/sys/unix"
)

func main() {}

const (
	recvDepth = 128 // posted receives per socket
	sendSlots = 32  // registered send slots per socket (datagrams over maxInline)
	maxInline = 512
	maxAHs    = 1024
	maxSocks  = 1 << 16
)

// sock is one owned socket: its own device over the program's kernel
// socket, one UD QP (number socketshim.ShimQPN), and the eventfd the
// program polls.
type sock struct {
	dev  *qp.Device
	s    *qp.Socket
	pd   *qp.PD
	q    *qp.QP
	rcq  *qp.CQ
	scq  *qp.CQ
	rbuf *qp.MR
	sbuf *qp.MR
	slot int
	v6   bool
	evfd int

	signaled atomic.Bool
	// sigMu orders the notifier's look-and-signal against a reader's
	// settle: without it a notifier woken for a datagram the reader has
	// already taken could make the eventfd readable over an empty queue,
	// and an edge-triggered epoll would fire with nothing to read.
	sigMu sync.Mutex
	done  chan struct{}

	rmu  sync.Mutex
	rwc  [1]qp.WorkCompletion
	held *qp.WorkCompletion // a datagram MSG_PEEK looked at

	wmu  sync.Mutex
	free shim.Slots
	swcs []qp.WorkCompletion
	ahs  shim.AHCache
}

var (
	socks   [maxSocks]atomic.Pointer[sock]
	nextID  atomic.Int64
	statsMu sync.Mutex

	// Counters: datagrams and bytes through udiwarp, for the stats file.
	adopted, sent, received, sentBytes, receivedBytes atomic.Uint64
	// Device counters of closed sockets, added to the live ones'.
	closedTx, closedRx atomic.Uint64
	statsPath          string
)

func errno(err error) C.longlong {
	var e unix.Errno
	if errors.As(err, &e) {
		return -C.longlong(e)
	}
	switch {
	case errors.Is(err, qp.ErrQueueFull):
		return -C.longlong(unix.EAGAIN)
	case errors.Is(err, qp.ErrClosed), errors.Is(err, net.ErrClosed):
		return -C.longlong(unix.EBADF)
	}
	return -C.longlong(unix.EIO)
}

// udw_init sets the runtime up for a host process: enough Ps that
// program threads calling in never wait for one (they may outnumber the
// CPUs), the netpoller started (so its descriptors exist before the C
// side takes its inventory of them), and the stats file.
//
//export udw_init
func udw_init() C.int {
	n := 32
	if v, err := strconv.Atoi(os.Getenv("UDIWARP_PRELOAD_GOMAXPROCS")); err == nil && v > 0 {
		n = v
	}
	runtime.GOMAXPROCS(max(n, runtime.NumCPU()))
	// Start the netpoller now: its epoll and eventfd descriptors appear
	// during this call, where the C side looks for them.
	if pc, err := net.ListenPacket("udp4", "127.0.0.1:0"); err == nil {
		pc.Close()
	} else if pc, err := net.ListenPacket("udp6", "[::1]:0"); err == nil {
		pc.Close()
	}
	statsPath = os.Getenv("UDIWARP_PRELOAD_STATS")
	if statsPath != "" {
		writeStats()
		go func() {
			for range time.Tick(200 * time.Millisecond) {
				writeStats()
			}
		}()
	}
	return 0
}

// udw_adopt runs a device over the kernel UDP socket fd (bound or
// connected already) and signals evfd whenever datagrams wait to be read.
// It returns a handle (> 0) and stores the engine's own descriptor in
// *efd, or returns -errno.
//
//export udw_adopt
func udw_adopt(fd C.int, evfd C.int, efd *C.int) C.longlong {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return errno(err)
	}
	f := os.NewFile(uintptr(nfd), "udiwarp")
	pc, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return errno(err)
	}
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return -C.longlong(unix.EPROTOTYPE)
	}
	dev, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		uc.Close()
		return errno(err)
	}
	s := &sock{dev: dev, evfd: int(evfd), done: make(chan struct{})}
	if err := s.setup(uc); err != nil {
		dev.Close()
		uc.Close()
		return errno(err)
	}
	if rc, err := uc.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { *efd = C.int(fd) })
	}
	id := nextID.Add(1)
	if id >= maxSocks {
		s.close()
		return -C.longlong(unix.EMFILE)
	}
	socks[id].Store(s)
	adopted.Add(1)
	go s.notifier()
	return C.longlong(id)
}

func (s *sock) setup(uc *net.UDPConn) error {
	var err error
	if s.s, err = s.dev.BindConn(uc); err != nil {
		return err
	}
	s.v6 = uc.LocalAddr().(*net.UDPAddr).IP.To4() == nil
	s.slot = s.s.MaxMessage()
	s.pd = s.dev.AllocPD()
	s.ahs = shim.AHCache{PD: s.pd, QPN: socketshim.ShimQPN, Max: maxAHs}
	if s.rbuf, err = s.pd.RegisterMemory(make([]byte, recvDepth*s.slot), qp.AccessLocalWrite); err != nil {
		return err
	}
	if s.sbuf, err = s.pd.RegisterMemory(make([]byte, sendSlots*s.slot), qp.AccessLocalWrite); err != nil {
		return err
	}
	if s.rcq, err = s.dev.CreateCQ(2 * recvDepth); err != nil {
		return err
	}
	if s.scq, err = s.dev.CreateCQ(2 * sendSlots); err != nil {
		return err
	}
	if s.q, err = s.pd.CreateQP(qp.QPAttr{Type: qp.UD, SendCQ: s.scq, RecvCQ: s.rcq,
		Caps: qp.QPCaps{MaxSendWR: 4 * sendSlots, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: maxInline}}); err != nil {
		return err
	}
	if s.q.QPN() != socketshim.ShimQPN {
		return fmt.Errorf("the QP got number %d, not %d", s.q.QPN(), socketshim.ShimQPN)
	}
	if err := s.q.Activate(s.s); err != nil {
		return err
	}
	for i := range recvDepth {
		if err := s.q.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{s.rbuf.SGE(i*s.slot, s.slot)}}); err != nil {
			return err
		}
	}
	s.free = shim.NewSlots(sendSlots)
	s.swcs = make([]qp.WorkCompletion, sendSlots)
	return nil
}

// notifier makes the eventfd readable whenever receives completed.
func (s *sock) notifier() {
	for {
		s.rcq.RequestNotify(false)
		s.signalPending()
		select {
		case <-s.rcq.C():
			s.signalPending()
		case <-s.done:
			return
		}
	}
}

// signalPending makes the eventfd readable if completions wait.
func (s *sock) signalPending() {
	s.sigMu.Lock()
	if s.rcq.Pending() > 0 {
		s.signal()
	}
	s.sigMu.Unlock()
}

var one = [8]byte{1}

func (s *sock) signal() {
	if !s.signaled.Swap(true) {
		unix.Write(s.evfd, one[:])
	}
}

// settle makes the eventfd's readability match the queue, after a read:
// drain first, then clear the flag, then look again, so that a datagram
// completing meanwhile always leaves it readable.
func (s *sock) settle() {
	s.sigMu.Lock()
	defer s.sigMu.Unlock()
	if s.held != nil || s.rcq.Pending() > 0 {
		s.signal()
		return
	}
	if !s.signaled.Load() {
		return
	}
	var b [8]byte
	unix.Read(s.evfd, b[:])
	s.signaled.Store(false)
	if s.rcq.Pending() > 0 {
		s.signal()
	}
}

func lookup(h C.longlong) *sock {
	if h <= 0 || h >= maxSocks {
		return nil
	}
	return socks[h].Load()
}

// iovecs views a C struct iovec array.
func iovecs(p unsafe.Pointer, n C.int) []unix.Iovec {
	if p == nil || n <= 0 {
		return nil
	}
	return unsafe.Slice((*unix.Iovec)(p), int(n))
}

func iovLen(iov []unix.Iovec) int {
	n := 0
	for _, v := range iov {
		n += int(v.Len)
	}
	return n
}

// parseSockaddr reads a struct sockaddr_in or sockaddr_in6.
func parseSockaddr(p unsafe.Pointer, n C.int) (netip.AddrPort, bool) {
	if p == nil || n < 2 {
		return netip.AddrPort{}, false
	}
	b := unsafe.Slice((*byte)(p), int(n))
	fam := uint16(b[0]) | uint16(b[1])<<8
	switch {
	case fam == unix.AF_INET && n >= 16:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), uint16(b[2])<<8|uint16(b[3])), true
	case fam == unix.AF_INET6 && n >= 28:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), uint16(b[2])<<8|uint16(b[3])), true
	}
	return netip.AddrPort{}, false
}

// putSockaddr writes ap as the socket's family does (an IPv4 source as
// ::ffff:a.b.c.d on an IPv6 socket), cut to *n bytes, and sets *n to
// the full length.
func putSockaddr(p unsafe.Pointer, n *C.int, ap netip.AddrPort, v6 bool) {
	if p == nil || n == nil {
		return
	}
	var b [28]byte
	l := 16
	if v6 || ap.Addr().Is6() {
		l = 28
		b[0], b[1] = byte(unix.AF_INET6), 0
		a := ap.Addr().As16()
		copy(b[8:24], a[:])
	} else {
		b[0], b[1] = byte(unix.AF_INET), 0
		a := ap.Addr().As4()
		copy(b[4:8], a[:])
	}
	b[2], b[3] = byte(ap.Port()>>8), byte(ap.Port())
	copy(unsafe.Slice((*byte)(p), int(max(*n, 0))), b[:l])
	*n = C.int(l)
}

// udw_send sends the iovecs as one datagram to the address at to.
// It returns the length, or -EAGAIN when the send queue is full.
//
//export udw_send
func udw_send(h C.longlong, iov unsafe.Pointer, iovcnt C.int, to unsafe.Pointer, tolen C.int) C.longlong {
	s := lookup(h)
	if s == nil {
		return -C.longlong(unix.EBADF)
	}
	ap, ok := parseSockaddr(to, tolen)
	if !ok {
		return -C.longlong(unix.EAFNOSUPPORT)
	}
	if !s.v6 && ap.Addr().Is6() {
		return -C.longlong(unix.EAFNOSUPPORT)
	}
	if ap.Port() == 0 {
		return -C.longlong(unix.EINVAL)
	}
	vs := iovecs(iov, iovcnt)
	n := iovLen(vs)
	if n > s.slot {
		return -C.longlong(unix.EMSGSIZE)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	ah, err := s.ahs.Get(ap)
	if err != nil {
		return errno(err)
	}
	if n <= maxInline && len(vs) <= 1 {
		var b []byte
		if n > 0 {
			b = unsafe.Slice(vs[0].Base, n)
		}
		if err := s.q.PostSend(&qp.SendWR{ID: ^uint64(0), Inline: b, AH: ah}); err != nil {
			return errno(err)
		}
	} else {
		s.reap()
		i, ok := s.free.Take()
		if !ok {
			return -C.longlong(unix.EAGAIN)
		}
		off := i * s.slot
		dst := s.sbuf.Bytes()[off : off+n]
		k := 0
		for _, v := range vs {
			if v.Len > 0 {
				k += copy(dst[k:], unsafe.Slice(v.Base, int(v.Len)))
			}
		}
		if err := s.q.PostSend(&qp.SendWR{ID: uint64(i), Flags: qp.FlagSignaled, SGL: []qp.SGE{s.sbuf.SGE(off, n)}, AH: ah}); err != nil {
			s.free.Put(i)
			return errno(err)
		}
	}
	sent.Add(1)
	sentBytes.Add(uint64(n))
	return C.longlong(n)
}

func (s *sock) reap() {
	for {
		k := s.scq.Poll(s.swcs)
		for _, wc := range s.swcs[:k] {
			if wc.ID != ^uint64(0) {
				s.free.Put(int(wc.ID))
			}
		}
		if k < len(s.swcs) {
			return
		}
	}
}

const (
	msgPeek  = 0x2
	msgTrunc = 0x20
)

// udw_recv reads the next datagram into the iovecs, spinning up to spin
// nanoseconds for one, and returns its length (its full length with
// MSG_TRUNC in flags), or -EAGAIN. *msgflags gets MSG_TRUNC when the
// datagram was cut; from/fromlen get the source as recvfrom(2) does.
//
//export udw_recv
func udw_recv(h C.longlong, iov unsafe.Pointer, iovcnt C.int, from unsafe.Pointer, fromlen *C.int, flags C.int, msgflags *C.int, spin C.longlong) C.longlong {
	s := lookup(h)
	if s == nil {
		return -C.longlong(unix.EBADF)
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for range recvDepth + 1 {
		wc := s.held
		if wc == nil {
			if s.rcq.Poll(s.rwc[:]) == 0 {
				if spin <= 0 || !s.rcq.Spin(time.Duration(spin)) || s.rcq.Poll(s.rwc[:]) == 0 {
					s.settle()
					return -C.longlong(unix.EAGAIN)
				}
				spin = 0
			}
			wc = &s.rwc[0]
		}
		off := int(wc.ID) * s.slot
		if wc.Status != qp.Success {
			s.held = nil
			if err := s.q.PostRecv(&qp.RecvWR{ID: wc.ID, SGL: []qp.SGE{s.rbuf.SGE(off, s.slot)}}); err != nil {
				return errno(err)
			}
			continue // flushed or too long: nothing a socket would return
		}
		data := s.rbuf.Bytes()[off : off+int(wc.Len)]
		k := 0
		for _, v := range iovecs(iov, iovcnt) {
			if k == len(data) {
				break
			}
			if v.Len > 0 {
				k += copy(unsafe.Slice(v.Base, int(v.Len)), data[k:])
			}
		}
		if msgflags != nil && k < len(data) {
			*msgflags |= msgTrunc
		}
		putSockaddr(from, fromlen, wc.Source, s.v6)
		n := len(data)
		if flags&msgPeek != 0 {
			if s.held == nil {
				w := *wc
				s.held = &w
			}
		} else {
			s.held = nil
			if err := s.q.PostRecv(&qp.RecvWR{ID: wc.ID, SGL: []qp.SGE{s.rbuf.SGE(off, s.slot)}}); err != nil {
				return errno(err)
			}
			received.Add(1)
			receivedBytes.Add(uint64(n))
		}
		s.settle()
		if flags&msgTrunc != 0 {
			return C.longlong(n)
		}
		return C.longlong(k)
	}
	return -C.longlong(unix.EAGAIN)
}

// udw_next_len returns the length of the next datagram, 0 if none (FIONREAD).
//
//export udw_next_len
func udw_next_len(h C.longlong) C.longlong {
	s := lookup(h)
	if s == nil {
		return -C.longlong(unix.EBADF)
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for s.held == nil {
		if s.rcq.Poll(s.rwc[:]) == 0 {
			return 0
		}
		wc := s.rwc[0]
		if wc.Status == qp.Success {
			s.held = &wc
			break
		}
		if err := s.q.PostRecv(&qp.RecvWR{ID: wc.ID, SGL: []qp.SGE{s.rbuf.SGE(int(wc.ID)*s.slot, s.slot)}}); err != nil {
			return errno(err)
		}
	}
	return C.longlong(s.held.Len)
}

// udw_close closes the socket's device (and the engine's descriptor of
// the kernel socket; the C side keeps its own).
//
// udw_group joins (join != 0) or leaves the multicast group a program
// gave setsockopt: IP_ADD_MEMBERSHIP / IP_DROP_MEMBERSHIP with a struct
// ip_mreq or ip_mreqn (v6 == 0), IPV6_JOIN_GROUP / IPV6_LEAVE_GROUP with
// a struct ipv6_mreq. The socket's QP becomes a member (qp.JoinMulticast,
// which makes the kernel's membership too). It returns 0 or -errno as
// the kernel's setsockopt would fail.
//
//export udw_group
func udw_group(h C.longlong, join C.int, v6 C.int, opt unsafe.Pointer, optlen C.int) C.longlong {
	s := lookup(h)
	if s == nil {
		return -C.longlong(unix.EBADF)
	}
	b := unsafe.Slice((*byte)(opt), max(int(optlen), 0))
	var group netip.Addr
	var ifi *net.Interface
	if v6 == 0 {
		if len(b) < 8 { // struct ip_mreq: group, interface address
			return -C.longlong(unix.EINVAL)
		}
		group = netip.AddrFrom4([4]byte(b[0:4]))
		if len(b) >= 12 { // struct ip_mreqn: group, address, interface index
			if i := int32(binary.NativeEndian.Uint32(b[8:12])); i > 0 {
				x, err := net.InterfaceByIndex(int(i))
				if err != nil {
					return -C.longlong(unix.ENODEV)
				}
				ifi = x
			}
		}
		if a := netip.AddrFrom4([4]byte(b[4:8])); ifi == nil && !a.IsUnspecified() {
			ifi = interfaceOf(a)
			if ifi == nil {
				return -C.longlong(unix.ENODEV)
			}
		}
	} else {
		if len(b) < 20 { // struct ipv6_mreq: group, interface index
			return -C.longlong(unix.EINVAL)
		}
		group = netip.AddrFrom16([16]byte(b[0:16]))
		if i := binary.NativeEndian.Uint32(b[16:20]); i > 0 {
			x, err := net.InterfaceByIndex(int(i))
			if err != nil {
				return -C.longlong(unix.ENODEV)
			}
			ifi = x
		}
	}
	if !group.IsMulticast() {
		return -C.longlong(unix.EINVAL)
	}
	var err error
	if join != 0 {
		err = s.q.JoinMulticast(group, ifi)
	} else {
		err = s.q.LeaveMulticast(group)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, qp.ErrNotFound):
		return -C.longlong(unix.EADDRNOTAVAIL) // not a member: the kernel's answer
	case errors.Is(err, qp.ErrInvalidAttr):
		return -C.longlong(unix.EINVAL)
	}
	return errno(err)
}

// interfaceOf is the interface that has address a, or nil.
func interfaceOf(a netip.Addr) *net.Interface {
	ifs, _ := net.Interfaces()
	for i := range ifs {
		addrs, _ := ifs[i].Addrs()
		for _, x := range addrs {
			if p, err := netip.ParsePrefix(x.String()); err == nil && p.Addr() == a {
				return &ifs[i]
			}
		}
	}
	return nil
}

//export udw_close
func udw_close(h C.longlong) C.int {
	s := lookup(h)
	if s == nil || !socks[h].CompareAndSwap(s, nil) {
		return -C.int(unix.EBADF)
	}
	s.close()
	if statsPath != "" {
		writeStats()
	}
	return 0
}

func (s *sock) close() {
	close(s.done)
	s.rmu.Lock()
	s.wmu.Lock()
	st := s.dev.Stats()
	tx, rx := st.TxDatagrams.Load(), st.RxDelivered.Load()
	s.dev.Close()
	closedTx.Add(tx)
	closedRx.Add(rx)
	s.wmu.Unlock()
	s.rmu.Unlock()
}

// udw_exit writes the stats file one last time (the C side calls it at exit).
//
//export udw_exit
func udw_exit() {
	if statsPath != "" {
		writeStats()
	}
}

// Stats is what the stats file holds: datagrams through udiwarp.
type Stats struct {
	PID int `json:"pid"`
	// Sockets is the number of program sockets run over udiwarp.
	Sockets uint64 `json:"sockets"`
	// Sent and Received count the program's datagrams the engine sent
	// and delivered; the bytes are their payloads.
	Sent          uint64 `json:"sent"`
	Received      uint64 `json:"received"`
	SentBytes     uint64 `json:"sent_bytes"`
	ReceivedBytes uint64 `json:"received_bytes"`
	// DeviceTx and DeviceRx are the devices' own counters: UDP datagrams
	// (udiwarp frames) sent, and messages placed and completed.
	DeviceTx uint64 `json:"device_tx_datagrams"`
	DeviceRx uint64 `json:"device_rx_delivered"`
}

func writeStats() {
	statsMu.Lock()
	defer statsMu.Unlock()
	st := Stats{PID: os.Getpid(), Sockets: adopted.Load(), Sent: sent.Load(), Received: received.Load(),
		SentBytes: sentBytes.Load(), ReceivedBytes: receivedBytes.Load(), DeviceTx: closedTx.Load(), DeviceRx: closedRx.Load()}
	for i := range socks {
		if int64(i) > nextID.Load() {
			break
		}
		if s := socks[i].Load(); s != nil {
			ds := s.dev.Stats()
			st.DeviceTx += ds.TxDatagrams.Load()
			st.DeviceRx += ds.RxDelivered.Load()
		}
	}
	b, _ := json.Marshal(st)
	tmp := statsPath + ".tmp"
	if os.WriteFile(tmp, append(b, '\n'), 0o644) == nil {
		os.Rename(tmp, statsPath)
	}
}
