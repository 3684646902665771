package qp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// Socket is a UDP socket a device owns: the lower-layer protocol of its
// datagram QPs. One socket serves many QPs, told apart by QP number.
//
// The receive path calls recvmmsg(2) directly on the socket's descriptor
// (through syscall.RawConn, so Close cannot race it) into buffers the
// socket owns. x/net's ReadBatch does the same system call but allocates a
// net.Addr per datagram and always parks in the netpoller on EAGAIN; busy
// polling needs a receive that never parks, and the hot path none that
// allocates.
type Socket struct {
	dev *Device
	// rxIn takes each datagram read: the device's deliver, or the receive
	// impairment (DeviceConfig.ImpairRx) in front of it. rxHeld is the
	// datagram the impairment is delivering, under rxMu; noLand turns
	// direct placement off (the impairment must see every datagram).
	rxIn   func(b []byte, truncated bool, src netip.AddrPort)
	txOut  func(t *txCtx) error // transmit: the socket, or Impair in front of it
	rxHeld *impaired
	noLand bool
	conn   *net.UDPConn
	raw    syscall.RawConn
	local  netip.AddrPort
	v6     bool
	// maxDatagram is the largest UDP payload the socket can send.
	maxDatagram int

	rxMu  sync.Mutex     // one reader at a time
	rpoll [1]unix.PollFd // the receive goroutine's, reused: no allocation per wake
	wpoll [1]unix.PollFd // the datamover's
	// The RawConn callbacks, bound once: a method value made per call
	// would allocate.
	readableFn, writableFn func(fd uintptr) bool
	rx                     rxBatch
	// fd is used directly for non-blocking system calls, each between
	// acquire and release, so that close never pulls it from under one.
	fd uintptr
	fdUse
	noGSO atomic.Bool // the kernel refused UDP_SEGMENT once, or the impairment layer sees each datagram
	gro   bool        // UDP_GRO is on: a read may hold several datagrams

	// Datamover: QPs with queued work, served round-robin.
	txMu    sync.Mutex
	active  []*QP
	txWake  chan struct{}
	mcastMu sync.RWMutex
	mcast   map[netip.Addr][]*QP
	// pktinfo: the kernel gives each datagram's destination address
	// (IP_PKTINFO, IPV6_PKTINFO), for multicast delivery and for the rule
	// that no datagram addressed to a group or a broadcast address draws a
	// reply (mayAnswer).
	pktinfo atomic.Bool
	// rxLeft is how many bytes of replies the datagram being delivered may
	// still draw (mayAnswer); under rxMu.
	rxLeft int
	// streak counts inline polls in a row that found a datagram.
	streak int
	// landQP is the QP the last Send was for: batch receives land in its
	// posted receives (see landing.go).
	landQP atomic.Pointer[QP]
	// landBig says recent messages were large enough that landing in
	// place beats preparing it, even for a single-datagram read.
	landBig atomic.Bool
	// landOff skips landing for this many reads after a wrong guess (the
	// socket's traffic goes to several QPs); under rxMu.
	landOff int
	// wrg is the Write-Record message whose next segments batch receives
	// land at their predicted place (see wrlanding.go); under rxMu.
	wrg    wrGuess
	rdh    reliability.Header // the RD header being handled; under rxMu
	closed bool
	// cur is the batch slot being delivered (for its control message).
	cur int
}

type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

type rxBatch struct {
	hs    []mmsghdr
	iovs  []unix.Iovec
	land  []landing // direct placement into posted receives, per slot
	names []unix.RawSockaddrAny
	ctrl  [][rxCtrlSize]byte // UDP_GRO, IP_PKTINFO, IPV6_PKTINFO
	bufs  [][]byte
	n     int
	errno syscall.Errno
	// landWR says the landed slots are Write-Record segments.
	landWR bool
}

const maxUDPv4 = 65507
const maxUDPv6 = 65527

func newSocket(d *Device, conn *net.UDPConn) (*Socket, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	la := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	s := &Socket{dev: d, conn: conn, raw: raw, local: netip.AddrPortFrom(la.Addr().Unmap(), la.Port()),
		txWake: make(chan struct{}, 1), mcast: map[netip.Addr][]*QP{}}
	s.v6 = la.Addr().Is6() && !la.Addr().Is4In6()
	s.maxDatagram = maxUDPv4
	if s.v6 {
		s.maxDatagram = maxUDPv6
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, d.cfg.RecvBuffer); e != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, d.cfg.RecvBuffer)
		}
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, d.cfg.SendBuffer); e != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, d.cfg.SendBuffer)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return nil, fmt.Errorf("qp: sizing socket buffers: %w", err)
	}
	n := d.cfg.RecvBatch
	b := &s.rx
	b.hs = make([]mmsghdr, n)
	b.iovs = make([]unix.Iovec, n)
	b.names = make([]unix.RawSockaddrAny, n)
	b.bufs = make([][]byte, n)
	b.ctrl = make([][rxCtrlSize]byte, n)
	b.land = make([]landing, n)
	for i := range n {
		b.bufs[i] = make([]byte, 1<<16)
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(len(b.bufs[i]))
		b.hs[i].hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		b.hs[i].hdr.Iov = &b.iovs[i]
		b.hs[i].hdr.Iovlen = 1
		b.hs[i].hdr.Control = &b.ctrl[i][0]
	}
	raw.Control(func(fd uintptr) {
		s.fd = fd
		var info bool
		s.gro, info = enableRxControl(int(fd), s.v6)
		s.pktinfo.Store(info)
	})
	s.readableFn, s.writableFn = s.readable, s.writable
	s.txOut = func(t *txCtx) error { return t.sendDirect(s) }
	if im := d.cfg.Impair; im != nil {
		s.txOut = func(t *txCtx) error {
			im.send(s, t)
			d.stats.TxDatagrams.Add(1)
			return nil
		}
		s.noGSO.Store(true) // the impairment acts on each datagram
	}
	s.rxIn = func(b []byte, truncated bool, src netip.AddrPort) { d.deliver(s, b, truncated, src) }
	if im := d.cfg.ImpairRx; im != nil {
		s.rxIn = func(b []byte, truncated bool, src netip.AddrPort) { im.receive(s, b, truncated, src) }
		s.noLand = true
	}
	return s, nil
}

// LocalAddr returns the address the socket is bound to.
func (s *Socket) LocalAddr() netip.AddrPort { return s.local }

// MaxMessage returns the largest UD Send payload this socket can carry in
// one datagram: the UDP limit less the untagged header and the CRC.
func (s *Socket) MaxMessage() int {
	return s.maxDatagram - udiwarp.DDPUntaggedHeaderSize - udiwarp.CRCSize
}

func (s *Socket) start() {
	d := s.dev
	d.wg.Add(1)
	go s.datamover()
	if d.cfg.Poll == PollEvent {
		d.wg.Add(1)
		go s.recvLoop()
	}
}

// fdUse lets system calls use a descriptor directly (no RawConn callback
// per call: it costs a tenth of a small message's time) while another
// goroutine may close it: calls run between acquire and release, and
// retire waits for those in flight before the descriptor is closed.
type fdUse struct {
	closing atomic.Bool
	users   atomic.Int64
}

// acquire reports whether the descriptor may be used; every true must be
// paired with release.
func (u *fdUse) acquire() bool {
	u.users.Add(1)
	if u.closing.Load() {
		u.users.Add(-1)
		return false
	}
	return true
}

func (u *fdUse) release() { u.users.Add(-1) }

// retire refuses new calls and waits for those in flight to end.
func (u *fdUse) retire() {
	u.closing.Store(true)
	for u.users.Load() != 0 {
		runtime.Gosched()
	}
}

func (s *Socket) close() {
	s.txMu.Lock()
	s.closed = true
	s.txMu.Unlock()
	s.retire()
	s.conn.Close()
}

// recvmmsg reads up to vlen datagrams without waiting; false means the
// socket closed.
func (s *Socket) recvmmsg(vlen int) bool {
	if !s.acquire() {
		return false
	}
	defer s.release()
	fd := s.fd
	b := &s.rx
	ctl := uint64(0)
	if s.gro || s.pktinfo.Load() {
		ctl = rxCtrlSize
	}
	vlen = min(vlen, len(b.hs))
	landed := 0
	if s.landOff > 0 {
		s.landOff--
	} else if big := s.landBig.Load(); !s.noLand && (vlen > 1 || big) {
		if s.wrg.q != nil {
			landed = s.prepareWRLanding(vlen)
		}
		// Large Sends land in their posted receives. Small ones do not:
		// copying a few hundred bytes costs less than binding a batch of
		// receives (BenchmarkRoundTripCPU).
		if landed == 0 && big {
			landed = s.prepareLanding(vlen)
		}
		if big && landed > 0 {
			vlen = landed // large datagrams: read no more than can land in place
		}
	}
	for i := range b.hs[:vlen] {
		b.hs[i].hdr.Namelen = unix.SizeofSockaddrAny
		b.hs[i].hdr.Controllen = ctl
		b.hs[i].hdr.Flags = 0
	}
	if vlen == 1 {
		// One datagram: recvmsg(2) is cheaper than a one-slot recvmmsg(2).
		r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&b.hs[0].hdr)), unix.MSG_DONTWAIT)
		b.hs[0].len = uint32(r)
		b.n, b.errno = 1, e
		if e != 0 {
			b.n = -1
		}
	} else {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hs[0])), uintptr(vlen), unix.MSG_DONTWAIT, 0, 0)
		b.n, b.errno = int(r), e
	}
	switch {
	case landed > 0 && b.landWR:
		s.endWRLanding(landed)
	case landed > 0:
		s.endLanding(landed)
	}
	return true
}

// recvLoop is the event-mode receive goroutine. It waits for the socket
// to become readable without holding rxMu, so that a goroutine spinning in
// CQ.Wait can receive in its own stack meanwhile; then it reads.
func (s *Socket) recvLoop() {
	defer s.dev.wg.Done()
	for {
		if err := s.raw.Read(s.readableFn); err != nil {
			return // closed
		}
		s.rxMu.Lock()
		ok := s.recvmmsg(len(s.rx.hs))
		delivered := ok && s.dispatchBatch()
		s.rxMu.Unlock()
		if !ok {
			return
		}
		if delivered {
			// Let the goroutines this batch woke (CQ waiters) run now, on
			// this P, before the next receive: they repost receives and
			// answer, and under load the loop would not park to let them.
			runtime.Gosched()
		}
	}
}

// readable reports whether a datagram is queued; as a RawConn.Read
// callback it parks the caller in the netpoller until one is.
func (s *Socket) readable(fd uintptr) bool {
	s.rpoll[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	n, err := unix.Poll(s.rpoll[:], 0)
	return err != nil || (n == 1 && s.rpoll[0].Revents != 0)
}

// pollOnce reads whatever is queued without waiting, if no other
// goroutine is reading this socket now.
func (s *Socket) pollOnce() {
	if !s.rxMu.TryLock() {
		return
	}
	// A poller that finds nothing tries again at once, so each try reads
	// one datagram (recvmsg is cheapest); once datagrams come back to back
	// it reads batches, until a batch comes back short.
	vlen := 1
	if s.streak >= 2 {
		vlen = len(s.rx.hs)
	}
	if s.recvmmsg(vlen) {
		s.dispatchBatch()
		switch {
		case s.rx.n <= 0:
			s.streak = 0
		case vlen == 1:
			s.streak++
		case s.rx.n < vlen:
			s.streak = 0
		}
	}
	s.rxMu.Unlock()
}

func (s *Socket) dispatchBatch() bool {
	b := &s.rx
	if b.errno != 0 || b.n <= 0 {
		return false
	}
	for i := 0; i < b.n; i++ {
		s.cur = i
		h := &b.hs[i]
		n := int(h.len)
		src := sockaddrToAddrPort(&b.names[i])
		gso := s.groSize(i)
		if l := &b.land[i]; l.q != nil {
			// Landed in a posted receive: endLanding either completed it
			// there or copied it out for the ordinary path.
			if !l.done {
				s.deliverSplit(l.flat, n > len(l.flat), gso, src)
			}
			l.q, l.done, l.flat = nil, false, nil
			continue
		}
		if h.hdr.Flags&unix.MSG_TRUNC != 0 {
			n = len(b.bufs[i]) + 1 // longer than any datagram we accept
		}
		s.deliverSplit(b.bufs[i][:min(n, len(b.bufs[i]))], n > len(b.bufs[i]), gso, src)
	}
	return true
}

func sockaddrToAddrPort(sa *unix.RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := uint16(p.Port>>8) | uint16(p.Port<<8)
		return netip.AddrPortFrom(netip.AddrFrom4(p.Addr), port)
	case unix.AF_INET6:
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		port := uint16(p.Port>>8) | uint16(p.Port<<8)
		return netip.AddrPortFrom(netip.AddrFrom16(p.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}

// errSocketFull is returned by a direct send that found the socket full.
var errSocketFull = errors.New("socket send buffer full")

// sendNow sends one small datagram the stack built itself (an error
// message) without waiting: dropped if the socket cannot take it now.
func (s *Socket) sendNow(b []byte, to netip.AddrPort) {
	if !s.acquire() {
		return
	}
	defer s.release()
	var sa unix.Sockaddr
	a := to.Addr()
	if s.v6 {
		sa = &unix.SockaddrInet6{Port: int(to.Port()), Addr: a.As16()}
	} else if a.Is4() {
		sa = &unix.SockaddrInet4{Port: int(to.Port()), Addr: a.As4()}
	} else {
		return
	}
	if err := unix.Sendto(int(s.fd), b, unix.MSG_DONTWAIT, sa); err != nil {
		s.dev.stats.TxErrors.Add(1)
		return
	}
	s.dev.stats.TxDatagrams.Add(1)
}

// SetReadBuffer sets the socket's kernel receive buffer (SO_RCVBUF, or
// SO_RCVBUFFORCE where allowed), as net.UDPConn.SetReadBuffer does.
func (s *Socket) SetReadBuffer(bytes int) error {
	return s.setBuffer(unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, bytes)
}

// SetWriteBuffer sets the socket's kernel send buffer.
func (s *Socket) SetWriteBuffer(bytes int) error {
	return s.setBuffer(unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, bytes)
}

func (s *Socket) setBuffer(force, plain, bytes int) error {
	var serr error
	err := s.raw.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, force, bytes) != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, plain, bytes)
		}
	})
	if err != nil {
		return err
	}
	return serr
}
