package qp

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The lower layer (LLP) under the datagram engines: what UD and RD need
// of a UDP socket, and nothing else. Reads come in batches into buffers
// the caller supplies (rxMsg.iov: a header slot, then a posted receive's
// memory or a region's bytes, then a spare buffer: see landing.go and
// wrlanding.go), so that "landing" is only a choice of buffers made above
// it. Writes take one datagram or a GSO train as a msghdr, without
// waiting. Both waits park in the netpoller. udpLLP is the socket itself;
// impairLLP (impair.go) wraps any lowerLayer with a seeded lossy link in
// both directions. Nothing above this interface makes a system call on a
// datagram socket, and nothing below it knows a QP.
type lowerLayer interface {
	// read reads up to len(ms) datagrams without waiting, each into the
	// iovecs of its rxMsg, and fills in what arrived. It returns how many
	// it read (0 when none is queued) and false once the layer is closed.
	read(ms []rxMsg) (n int, ok bool)
	// write sends the datagram, or the GSO train (a UDP_SEGMENT control
	// message), that msg describes without waiting. It returns the bytes
	// sent, errSocketFull when the socket cannot take it now, ErrClosed
	// once closed, or the kernel's error.
	write(msg *unix.Msghdr) (int, error)
	// waitReadable and waitWritable park until a read or a write may make
	// progress; they return an error once the layer is closed.
	waitReadable() error
	waitWritable() error
	close() error
}

// rxMsg is one slot of a batch read. The caller sets iov (its buffers, in
// order); read sets the rest.
type rxMsg struct {
	iov   []unix.Iovec
	n     int  // bytes read into iov
	trunc bool // the datagram was longer than iov
	// gro is the size of each datagram when the kernel merged several
	// (UDP_GRO) into this read, or 0.
	gro int
	src netip.AddrPort
	// ctl holds the datagram's control messages (IP_PKTINFO): valid until
	// the next read.
	ctl []byte
}

// udpLLP is a UDP socket as the lower layer. System calls use the
// descriptor directly (no RawConn callback per call: it costs a tenth of
// a small message's time) between acquire and release, so that close
// never pulls it from under one; the waits go through the RawConn, so the
// runtime's netpoller parks them.
type udpLLP struct {
	conn *net.UDPConn
	raw  syscall.RawConn
	fd   atomic.Uintptr // used between acquire and release; moves only by setFD
	// borrowed: fd is the caller's (BindFD), not conn's: it is never
	// closed here, it can move (SetFD), and the waits are poll(2)'s.
	borrowed bool
	fdUse
	v6      bool
	gro     bool        // UDP_GRO is on: a read may hold several datagrams
	pktinfo atomic.Bool // each read carries its destination (IP_PKTINFO)
	// The batch's headers, names and control buffers, owned here; the
	// data buffers are the caller's.
	hs    []mmsghdr
	names []unix.RawSockaddrAny
	ctrl  [][rxCtrlSize]byte
	rpoll [1]unix.PollFd // the reader's, reused: no allocation per wake
	wmu   sync.Mutex     // wpoll: the datamover and the impairment's writer
	wpoll [1]unix.PollFd
	// The RawConn callbacks, bound once: a method value made per call
	// would allocate.
	readableFn, writableFn func(fd uintptr) bool
}

type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// newUDPLLP takes conn as a lower layer reading batches of up to batch
// datagrams, with the given kernel buffer sizes.
func newUDPLLP(conn *net.UDPConn, v6 bool, batch, rcvbuf, sndbuf int) (*udpLLP, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	u := &udpLLP{conn: conn, raw: raw, v6: v6}
	if err := u.setBuffer(unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, rcvbuf); err != nil {
		return nil, err
	}
	_ = u.setBuffer(unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, sndbuf) // the default serves
	u.makeBatch(batch)
	raw.Control(func(fd uintptr) {
		u.fd.Store(fd)
		var info bool
		u.gro, info = enableRxControl(int(fd), v6, true)
		u.pktinfo.Store(info)
	})
	u.readableFn, u.writableFn = u.readable, u.writable
	return u, nil
}

// newFDLLP takes a descriptor its caller keeps (BindFD) as a lower layer.
// Its buffer sizes stay the caller's (SO_RCVBUF bounds what the kernel
// queues, as for any UDP socket), and UDP_GRO stays off, since whoever
// else reads the socket (a forked child of a preloaded program) would
// not expect merged datagrams. IP_PKTINFO goes on: RD answers only
// datagrams it knows were unicast to it, and a reader that passes no
// control buffer never sees it.
func newFDLLP(fd int, v6 bool, batch int) *udpLLP {
	u := &udpLLP{v6: v6, borrowed: true}
	u.fd.Store(uintptr(fd))
	_, info := enableRxControl(fd, v6, false)
	u.pktinfo.Store(info)
	u.makeBatch(batch)
	return u
}

// makeBatch makes the headers, names and control buffers of batch reads.
func (u *udpLLP) makeBatch(batch int) {
	u.hs = make([]mmsghdr, batch)
	u.names = make([]unix.RawSockaddrAny, batch)
	u.ctrl = make([][rxCtrlSize]byte, batch)
	for i := range u.hs {
		u.hs[i].hdr.Name = (*byte)(unsafe.Pointer(&u.names[i]))
		u.hs[i].hdr.Control = &u.ctrl[i][0]
	}
}

// control runs f with the descriptor, as RawConn.Control does.
func (u *udpLLP) control(f func(fd uintptr)) error {
	if !u.borrowed {
		return u.raw.Control(f)
	}
	if !u.acquire() {
		return ErrClosed
	}
	defer u.release()
	f(u.fd.Load())
	return nil
}

// packetConn returns the socket as a net.PacketConn for golang.org/x/net's
// option setters, and what to call when done with it. A borrowed
// descriptor is duplicated for the call: options such as group
// memberships belong to the socket, not to the descriptor, and stay.
func (u *udpLLP) packetConn() (net.PacketConn, func(), error) {
	if !u.borrowed {
		return u.conn, func() {}, nil
	}
	var nfd int
	var err error
	if cerr := u.control(func(fd uintptr) { nfd, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		return nil, nil, cerr
	}
	if err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(nfd), "udiwarp")
	pc, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return nil, nil, err
	}
	return pc, func() { pc.Close() }, nil
}

// setFD moves a borrowed lower layer to another descriptor of the same
// socket, once no call is using the old one.
func (u *udpLLP) setFD(fd int) error {
	if !u.borrowed {
		return fmt.Errorf("%w: the socket's descriptor is the device's own (Bind, BindConn)", ErrInvalidAttr)
	}
	u.fdMu.Lock()
	defer u.fdMu.Unlock()
	if u.closing.Load() {
		return ErrClosed
	}
	// Calls from now on use the new descriptor; wait for those that may
	// still use the old one (the caller closes it after this returns).
	// Calls are non-blocking: the wait is short.
	u.fd.Store(uintptr(fd))
	for u.users.Load() != 0 {
		runtime.Gosched()
	}
	return nil
}

// pollWait waits in poll(2) for events on a borrowed descriptor, a tenth
// of a second at a time so that close is seen; error once closed.
func (u *udpLLP) pollWait(events int16) error {
	for {
		if !u.acquire() {
			return ErrClosed
		}
		p := [1]unix.PollFd{{Fd: int32(u.fd.Load()), Events: events}}
		n, err := unix.Poll(p[:], 100)
		u.release()
		if err == nil && n == 1 {
			return nil
		}
		if err != nil && err != unix.EINTR {
			return err
		}
	}
}

func (u *udpLLP) read(ms []rxMsg) (int, bool) {
	if !u.acquire() {
		return 0, false
	}
	defer u.release()
	ctl := uint64(0)
	if u.gro || u.pktinfo.Load() {
		ctl = rxCtrlSize
	}
	vlen := min(len(ms), len(u.hs))
	for i := range vlen {
		h := &u.hs[i].hdr
		h.Iov = &ms[i].iov[0]
		h.SetIovlen(len(ms[i].iov))
		h.Namelen = unix.SizeofSockaddrAny
		h.Controllen = ctl
		h.Flags = 0
	}
	n := 0
	if vlen == 1 {
		// One datagram: recvmsg(2) is cheaper than a one-slot recvmmsg(2).
		r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, u.fd.Load(), uintptr(unsafe.Pointer(&u.hs[0].hdr)), unix.MSG_DONTWAIT)
		if e != 0 {
			return 0, true
		}
		u.hs[0].len = uint32(r)
		n = 1
	} else {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, u.fd.Load(), uintptr(unsafe.Pointer(&u.hs[0])), uintptr(vlen), unix.MSG_DONTWAIT, 0, 0)
		if e != 0 {
			return 0, true
		}
		n = int(r)
	}
	for i := range n {
		h := &u.hs[i]
		m := &ms[i]
		m.n = int(h.len)
		m.trunc = h.hdr.Flags&unix.MSG_TRUNC != 0
		m.src = sockaddrToAddrPort(&u.names[i])
		m.ctl = u.ctrl[i][:min(int(h.hdr.Controllen), rxCtrlSize)]
		m.gro = 0
		if u.gro {
			m.gro = groSegment(m.ctl)
		}
	}
	return n, true
}

func (u *udpLLP) write(msg *unix.Msghdr) (int, error) {
	if !u.acquire() {
		return 0, ErrClosed
	}
	r, _, e := unix.RawSyscall(unix.SYS_SENDMSG, u.fd.Load(), uintptr(unsafe.Pointer(msg)), unix.MSG_DONTWAIT)
	u.release()
	switch e {
	case 0:
		return int(r), nil
	case unix.EAGAIN:
		return 0, errSocketFull
	}
	return 0, e
}

func (u *udpLLP) waitReadable() error {
	if u.borrowed {
		return u.pollWait(unix.POLLIN)
	}
	return u.raw.Read(u.readableFn)
}

func (u *udpLLP) waitWritable() error {
	if u.borrowed {
		return u.pollWait(unix.POLLOUT)
	}
	return u.raw.Write(u.writableFn)
}

// readable reports whether a datagram is queued; as a RawConn.Read
// callback it parks the caller in the netpoller until one is.
func (u *udpLLP) readable(fd uintptr) bool {
	u.rpoll[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	n, err := unix.Poll(u.rpoll[:], 0)
	return err != nil || (n == 1 && u.rpoll[0].Revents != 0)
}

// writable reports whether the socket can take a datagram now; as a
// RawConn.Write callback it parks the writer until it can.
func (u *udpLLP) writable(fd uintptr) bool {
	u.wmu.Lock()
	defer u.wmu.Unlock()
	u.wpoll[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	n, err := unix.Poll(u.wpoll[:], 0)
	return err != nil || (n == 1 && u.wpoll[0].Revents&(unix.POLLOUT|unix.POLLERR|unix.POLLHUP) != 0)
}

func (u *udpLLP) close() error {
	u.fdMu.Lock()
	u.retire()
	u.fdMu.Unlock()
	if u.borrowed {
		return nil // the caller's to close
	}
	return u.conn.Close()
}

func (u *udpLLP) setBuffer(force, plain, bytes int) error {
	if u.setsockopt(unix.SOL_SOCKET, force, bytes) != nil {
		return u.setsockopt(unix.SOL_SOCKET, plain, bytes)
	}
	return nil
}

// setsockopt sets an integer socket option.
func (u *udpLLP) setsockopt(level, name, v int) error {
	var serr error
	if err := u.control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, name, v) }); err != nil {
		return err
	}
	return serr
}

// fdUse lets system calls use a descriptor directly while another
// goroutine may close it: calls run between acquire and release, and
// retire waits for those in flight before the descriptor is closed.
type fdUse struct {
	closing atomic.Bool
	users   atomic.Int64
	fdMu    sync.Mutex // setFD against close
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

// sockaddr is a destination in a socket's family, for a msghdr.
type sockaddr struct {
	raw [unix.SizeofSockaddrInet6]byte
	len uint32
}

// sockaddrFor encodes to for a socket of the given family; false when an
// IPv6 address cannot be reached from an IPv4 socket.
func sockaddrFor(to netip.AddrPort, v6 bool) (sa sockaddr, ok bool) {
	a := to.Addr()
	port := to.Port()
	if v6 {
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(&sa.raw[0]))
		p.Family = unix.AF_INET6
		p.Port = port<<8 | port>>8
		p.Addr = a.As16()
		sa.len = unix.SizeofSockaddrInet6
		return sa, true
	}
	if !a.Is4() {
		return sa, false
	}
	p := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sa.raw[0]))
	p.Family = unix.AF_INET
	p.Port = port<<8 | port>>8
	p.Addr = a.As4()
	sa.len = unix.SizeofSockaddrInet4
	return sa, true
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
