package qp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

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
	dev   *Device
	conn  *net.UDPConn
	raw   syscall.RawConn
	local netip.AddrPort
	v6    bool
	// maxDatagram is the largest UDP payload the socket can send.
	maxDatagram int

	rxMu    sync.Mutex // one reader at a time
	rx      rxBatch
	rxBlock func(fd uintptr) bool // parks on EAGAIN (event mode)
	rxSpin  func(fd uintptr) bool // never parks (busy mode)

	// Datamover: QPs with queued work, served round-robin.
	txMu    sync.Mutex
	active  []*QP
	txWake  chan struct{}
	mcastMu sync.RWMutex
	mcast   map[netip.Addr][]*QP
	pktinfo atomic.Bool // set once a group is joined
	closed  bool
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
	names []unix.RawSockaddrAny
	ctrl  [][rxCtrlSize]byte // IP_PKTINFO / IPV6_PKTINFO, once a group is joined
	bufs  [][]byte
	n     int
	errno syscall.Errno
}

const rxCtrlSize = 64

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
	for i := range n {
		b.bufs[i] = make([]byte, 1<<16)
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(len(b.bufs[i]))
		b.hs[i].hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		b.hs[i].hdr.Iov = &b.iovs[i]
		b.hs[i].hdr.Iovlen = 1
		b.hs[i].hdr.Control = &b.ctrl[i][0]
	}
	s.rxBlock = s.recvmmsgPark
	s.rxSpin = s.recvmmsgSpin
	return s, nil
}

// LocalAddr returns the address the socket is bound to.
func (s *Socket) LocalAddr() netip.AddrPort { return s.local }

// MaxMessage returns the largest UD Send payload this socket can carry in
// one datagram: the UDP limit less the untagged header and the CRC.
func (s *Socket) MaxMessage() int { return s.maxDatagram - udiwarpUntaggedOverhead }

func (s *Socket) start() {
	d := s.dev
	d.wg.Add(1)
	go s.datamover()
	if d.cfg.Poll == PollEvent {
		d.wg.Add(1)
		go s.recvLoop()
	}
}

func (s *Socket) close() {
	s.txMu.Lock()
	s.closed = true
	s.txMu.Unlock()
	s.conn.Close()
}

func (s *Socket) recvmmsg(fd uintptr) {
	b := &s.rx
	ctl := uint64(0)
	if s.pktinfo.Load() {
		ctl = rxCtrlSize
	}
	for i := range b.hs {
		b.hs[i].hdr.Namelen = unix.SizeofSockaddrAny
		b.hs[i].hdr.Controllen = ctl
		b.hs[i].hdr.Flags = 0
	}
	r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hs[0])), uintptr(len(b.hs)), unix.MSG_DONTWAIT, 0, 0)
	b.n, b.errno = int(r), e
}

func (s *Socket) recvmmsgPark(fd uintptr) bool {
	s.recvmmsg(fd)
	return s.rx.errno != unix.EAGAIN
}

func (s *Socket) recvmmsgSpin(fd uintptr) bool {
	s.recvmmsg(fd)
	return true
}

// recvLoop is the event-mode receive goroutine.
func (s *Socket) recvLoop() {
	defer s.dev.wg.Done()
	for {
		s.rxMu.Lock()
		err := s.raw.Read(s.rxBlock)
		if err != nil {
			s.rxMu.Unlock()
			return // closed
		}
		s.dispatchBatch()
		s.rxMu.Unlock()
	}
}

// pollOnce reads whatever is queued without waiting, if no other
// goroutine is reading this socket now.
func (s *Socket) pollOnce() {
	if !s.rxMu.TryLock() {
		return
	}
	if err := s.raw.Read(s.rxSpin); err == nil {
		s.dispatchBatch()
	}
	s.rxMu.Unlock()
}

func (s *Socket) dispatchBatch() {
	b := &s.rx
	if b.errno != 0 || b.n <= 0 {
		return
	}
	for i := 0; i < b.n; i++ {
		s.cur = i
		h := &b.hs[i]
		n := int(h.len)
		if h.hdr.Flags&unix.MSG_TRUNC != 0 {
			n = len(b.bufs[i]) + 1 // longer than any datagram we accept
		}
		s.dev.deliver(s, b.bufs[i][:min(n, len(b.bufs[i]))], n > len(b.bufs[i]), sockaddrToAddrPort(&b.names[i]))
	}
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
