package llp

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

	"github.com/udiwarp/udiwarp/internal/fduse"
	"golang.org/x/sys/unix"
)

// UDP is a kernel UDP socket as a Link. System calls use the descriptor
// directly (no RawConn callback per call: it costs a tenth of a small
// message's time) between acquire and release, so that Close never pulls
// it from under one; the waits go through the RawConn, so the runtime's
// netpoller parks them. A borrowed descriptor (NewUDPFD) is its caller's:
// never closed here, it can move (SetFD), and the waits are poll(2)'s.
type UDP struct {
	conn     *net.UDPConn
	raw      syscall.RawConn
	fd       atomic.Uintptr // used between acquire and release; moves only by SetFD
	borrowed bool
	fduse.Use
	local   netip.AddrPort
	v6      bool
	gro     bool        // UDP_GRO is on: a read may hold several datagrams
	pktinfo atomic.Bool // each read carries its destination (IP_PKTINFO)
	// The batch's headers, names, iovecs and control buffers, owned
	// here; the data buffers are the caller's.
	hs    []mmsghdr
	names []unix.RawSockaddrAny
	ctrl  [][rxCtrlSize]byte
	iovs  [][]unix.Iovec
	rpoll [1]unix.PollFd // the reader's, reused: no allocation per wake
	wmu   sync.Mutex     // wpoll: several writers may wait
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

const (
	maxUDPv4 = 65507
	maxUDPv6 = 65527
	// maxTxIov is the most buffers a Write of several Msgs sends in all.
	maxTxIov = 256
	// smallIov is the most buffers a datagram sent alone takes from the
	// stack: a header, the SGEs of a small send, the trailer.
	smallIov = 20
	// uioMaxIov is the kernel's limit on the buffers of one datagram or
	// train (UIO_MAXIOV).
	uioMaxIov = 1024
	// maxTxBatch is the most datagrams one sendmmsg(2) carries.
	maxTxBatch = 16
)

// NewUDP takes conn as a link reading batches of up to batch datagrams,
// with the given kernel buffer sizes (0: the kernel's default). Close
// closes conn.
func NewUDP(conn *net.UDPConn, batch, rcvbuf, sndbuf int) (*UDP, error) {
	la, ok := conn.LocalAddr().(*net.UDPAddr)
	if !ok {
		return nil, fmt.Errorf("llp: %v is not a UDP address", conn.LocalAddr())
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	u := &UDP{conn: conn, raw: raw}
	u.setLocal(la.AddrPort())
	if rcvbuf > 0 {
		if err := u.setBuffer(unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, rcvbuf); err != nil {
			return nil, fmt.Errorf("llp: sizing the socket's receive buffer: %w", err)
		}
	}
	if sndbuf > 0 {
		_ = u.setBuffer(unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, sndbuf) // the default serves
	}
	u.makeBatch(batch)
	raw.Control(func(fd uintptr) {
		u.fd.Store(fd)
		var info bool
		u.gro, info = enableRxControl(int(fd), u.v6, true)
		u.pktinfo.Store(info)
	})
	u.readableFn, u.writableFn = u.readable, u.writable
	return u, nil
}

// NewUDPFD takes fd, a bound UDP socket's descriptor that its caller
// keeps, as a link. Its buffer sizes stay the caller's (SO_RCVBUF bounds
// what the kernel queues, as for any UDP socket), and UDP_GRO stays off,
// since whoever else reads the socket (a forked child of a preloaded
// program) would not expect merged datagrams. IP_PKTINFO goes on: a
// reader that passes no control buffer never sees it.
func NewUDPFD(fd int, batch int) (*UDP, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, fmt.Errorf("llp: descriptor %d: %w", fd, err)
	}
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_DGRAM {
		return nil, fmt.Errorf("llp: descriptor %d is not a datagram socket", fd)
	}
	var la netip.AddrPort
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		la = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		la = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	default:
		return nil, fmt.Errorf("llp: descriptor %d is not a UDP socket", fd)
	}
	if la.Port() == 0 {
		return nil, fmt.Errorf("llp: descriptor %d is not bound", fd)
	}
	u := &UDP{borrowed: true}
	u.setLocal(la)
	u.fd.Store(uintptr(fd))
	_, info := enableRxControl(fd, u.v6, false)
	u.pktinfo.Store(info)
	u.makeBatch(batch)
	return u, nil
}

func (u *UDP) setLocal(la netip.AddrPort) {
	u.v6 = la.Addr().Is6() && !la.Addr().Is4In6()
	u.local = netip.AddrPortFrom(la.Addr().Unmap(), la.Port())
}

// makeBatch makes the headers, names and control buffers of batch reads.
func (u *UDP) makeBatch(batch int) {
	batch = max(batch, 1)
	u.hs = make([]mmsghdr, batch)
	u.names = make([]unix.RawSockaddrAny, batch)
	u.ctrl = make([][rxCtrlSize]byte, batch)
	u.iovs = make([][]unix.Iovec, batch)
	for i := range u.hs {
		u.hs[i].hdr.Name = (*byte)(unsafe.Pointer(&u.names[i]))
		u.hs[i].hdr.Control = &u.ctrl[i][0]
		u.iovs[i] = make([]unix.Iovec, 0, 4)
	}
}

// LocalAddr returns the address the socket is bound to.
func (u *UDP) LocalAddr() netip.AddrPort { return u.local }

// Caps: a UDP socket takes trains of MaxTrain datagrams (GSO), and reads
// merged ones where UDP_GRO is on.
func (u *UDP) Caps() Caps {
	c := Caps{Kind: "udp", MaxDatagram: maxUDPv4, MaxTrain: MaxTrain, GRO: u.gro, Detail: "kernel UDP socket"}
	if u.v6 {
		c.MaxDatagram = maxUDPv6
	}
	if u.borrowed {
		c.Detail = "kernel UDP socket (a caller's descriptor)"
	}
	return c
}

// Borrowed reports whether the descriptor is its caller's (NewUDPFD).
func (u *UDP) Borrowed() bool { return u.borrowed }

// Control runs f with the descriptor, as RawConn.Control does.
func (u *UDP) Control(f func(fd uintptr)) error {
	if !u.borrowed {
		return u.raw.Control(f)
	}
	if !u.Acquire() {
		return ErrClosed
	}
	defer u.Release()
	f(u.fd.Load())
	return nil
}

// PacketConn returns the socket as a net.PacketConn for golang.org/x/net's
// option setters, and what to call when done with it. A borrowed
// descriptor is duplicated for the call: options such as group
// memberships belong to the socket, not to the descriptor, and stay.
func (u *UDP) PacketConn() (net.PacketConn, func(), error) {
	if !u.borrowed {
		return u.conn, func() {}, nil
	}
	var nfd int
	var err error
	if cerr := u.Control(func(fd uintptr) { nfd, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
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

// ReportDst makes every read carry its datagram's destination (a
// multicast member needs it; NewUDP and NewUDPFD ask for it already,
// and a kernel that refused then may have been asked again since).
func (u *UDP) ReportDst() { u.pktinfo.Store(true) }

// SetFD moves a borrowed link to another descriptor of the same socket,
// once no call is using the old one.
func (u *UDP) SetFD(fd int) error {
	if !u.borrowed {
		return fmt.Errorf("%w: the socket's descriptor is the link's own", ErrUnsupported)
	}
	u.Mu.Lock()
	defer u.Mu.Unlock()
	if u.Closing() {
		return ErrClosed
	}
	// Calls from now on use the new descriptor; wait for those that may
	// still use the old one (the caller closes it after this returns).
	// Calls are non-blocking: the wait is short.
	u.fd.Store(uintptr(fd))
	u.Drain()
	return nil
}

// pollWait waits in poll(2) for events on a borrowed descriptor, a tenth
// of a second at a time so that Close is seen; ErrClosed once closed.
func (u *UDP) pollWait(events int16) error {
	for {
		if !u.Acquire() {
			return ErrClosed
		}
		p := [1]unix.PollFd{{Fd: int32(u.fd.Load()), Events: events}}
		n, err := unix.Poll(p[:], 100)
		u.Release()
		if err == nil && n == 1 {
			return nil
		}
		if err != nil && err != unix.EINTR {
			return err
		}
	}
}

// setIov points iov at bufs, reusing its array.
func setIov(iov []unix.Iovec, bufs [][]byte) []unix.Iovec {
	iov = iov[:0]
	for _, b := range bufs {
		v := unix.Iovec{Base: unsafe.SliceData(b)}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	return iov
}

func (u *UDP) Read(ms []Msg) (int, error) {
	if !u.Acquire() {
		return 0, ErrClosed
	}
	defer u.Release()
	ctl := uint64(0)
	info := u.pktinfo.Load()
	if u.gro || info {
		ctl = rxCtrlSize
	}
	vlen := min(len(ms), len(u.hs))
	for i := range vlen {
		h := &u.hs[i].hdr
		u.iovs[i] = setIov(u.iovs[i], ms[i].Bufs)
		h.Iov = unsafe.SliceData(u.iovs[i])
		h.SetIovlen(len(u.iovs[i]))
		h.Namelen = unix.SizeofSockaddrAny
		h.Controllen = ctl
		h.Flags = 0
	}
	n := 0
	if vlen == 1 {
		// One datagram: recvmsg(2) is cheaper than a one-slot recvmmsg(2).
		r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, u.fd.Load(), uintptr(unsafe.Pointer(&u.hs[0].hdr)), unix.MSG_DONTWAIT)
		if e != 0 {
			return 0, nil
		}
		u.hs[0].len = uint32(r)
		n = 1
	} else if vlen > 1 {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, u.fd.Load(), uintptr(unsafe.Pointer(&u.hs[0])), uintptr(vlen), unix.MSG_DONTWAIT, 0, 0)
		if e != 0 {
			return 0, nil
		}
		n = int(r)
	}
	for i := range n {
		h := &u.hs[i]
		m := &ms[i]
		m.N = int(h.len)
		m.Trunc = h.hdr.Flags&unix.MSG_TRUNC != 0
		m.Addr = sockaddrToAddrPort(&u.names[i])
		m.dstOK = false
		m.ctl = nil
		c := u.ctrl[i][:min(int(h.hdr.Controllen), rxCtrlSize)]
		if info {
			m.ctl = c
		}
		m.Segment = 0
		if u.gro {
			m.Segment = groSegment(c)
		}
	}
	return n, nil
}

// Write sends ms: one sendmsg(2) for a single Msg, sendmmsg(2) for more.
func (u *UDP) Write(ms []Msg) (int, error) {
	if !u.Acquire() {
		return 0, ErrClosed
	}
	defer u.Release()
	if len(ms) == 1 {
		return u.writeOne(&ms[0])
	}
	sent := 0
	for sent < len(ms) {
		n, err := u.writeBatch(ms[sent:min(len(ms), sent+maxTxBatch)])
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

var iovPool = sync.Pool{New: func() any { return new([uioMaxIov]unix.Iovec) }}

func (u *UDP) writeOne(m *Msg) (int, error) {
	// A datagram's few buffers fit an array on the stack (zeroed on every
	// call, so kept small); a train's come from iovPool.
	var stack [smallIov]unix.Iovec
	var ctl [gsoCtlSize]byte
	var msg unix.Msghdr
	sa, ok := sockaddrFor(m.Addr, u.v6)
	if !ok {
		return 0, fmt.Errorf("llp: %v cannot be reached from an IPv4 socket", m.Addr)
	}
	iov := stack[:]
	switch {
	case len(m.Bufs) > uioMaxIov && m.Segment > 0:
		return 0, fmt.Errorf("%w: %d buffers in one train, at most %d", ErrTrainTooBig, len(m.Bufs), uioMaxIov)
	case len(m.Bufs) > uioMaxIov:
		return 0, fmt.Errorf("llp: %d buffers in one datagram, at most %d", len(m.Bufs), uioMaxIov)
	case len(m.Bufs) > smallIov:
		big := iovPool.Get().(*[uioMaxIov]unix.Iovec)
		defer iovPool.Put(big)
		iov = big[:]
	}
	n := len(setIov(iov[:0], m.Bufs))
	msg.Name, msg.Namelen = &sa.raw[0], sa.len
	msg.Iov = &iov[0]
	msg.SetIovlen(n)
	if m.Segment > 0 {
		msg.Control = &ctl[0]
		msg.SetControllen(putUDPSegment(ctl[:], uint16(m.Segment)))
	}
	r, _, e := unix.RawSyscall(unix.SYS_SENDMSG, u.fd.Load(), uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT)
	runtime.KeepAlive(iov)
	if e != 0 {
		return 0, sendError(e, m.Segment > 0)
	}
	m.N = int(r)
	return 1, nil
}

func (u *UDP) writeBatch(ms []Msg) (int, error) {
	var iov [maxTxIov]unix.Iovec
	var hs [maxTxBatch]mmsghdr
	var sas [maxTxBatch]sockaddr
	var ctl [maxTxBatch][gsoCtlSize]byte
	k := 0
	vlen := 0
	for i := range ms {
		m := &ms[i]
		if k+len(m.Bufs) > len(iov) {
			break
		}
		sa, ok := sockaddrFor(m.Addr, u.v6)
		if !ok {
			if i == 0 {
				return 0, fmt.Errorf("llp: %v cannot be reached from an IPv4 socket", m.Addr)
			}
			break
		}
		sas[i] = sa
		n := len(setIov(iov[k:k], m.Bufs))
		h := &hs[i].hdr
		h.Name, h.Namelen = &sas[i].raw[0], sas[i].len
		h.Iov = &iov[k]
		h.SetIovlen(n)
		if m.Segment > 0 {
			h.Control = &ctl[i][0]
			h.SetControllen(putUDPSegment(ctl[i][:], uint16(m.Segment)))
		}
		k += n
		vlen++
	}
	if vlen == 0 {
		return 0, fmt.Errorf("llp: %d buffers in one datagram, at most %d", len(ms[0].Bufs), maxTxIov)
	}
	r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, u.fd.Load(), uintptr(unsafe.Pointer(&hs[0])), uintptr(vlen), unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, sendError(e, ms[0].Segment > 0)
	}
	for i := range int(r) {
		ms[i].N = int(hs[i].len)
	}
	return int(r), nil
}

// sendError says what a failed send means: the socket is full, the
// kernel refuses trains or this train's segment size, or the kernel's
// own error.
func sendError(e unix.Errno, train bool) error {
	switch {
	case e == unix.EAGAIN:
		return ErrWouldBlock
	case !train:
		return e
	case e == unix.EINVAL || e == unix.EIO || e == unix.ENOPROTOOPT || e == unix.EOPNOTSUPP:
		return fmt.Errorf("%w: %w", ErrTrains, e)
	case e == unix.EMSGSIZE:
		return fmt.Errorf("%w: %w", ErrTrainTooBig, e)
	}
	return e
}

func (u *UDP) WaitReadable() error {
	if u.borrowed {
		return u.pollWait(unix.POLLIN)
	}
	if err := u.raw.Read(u.readableFn); err != nil {
		return ErrClosed
	}
	return nil
}

func (u *UDP) WaitWritable() error {
	if u.borrowed {
		return u.pollWait(unix.POLLOUT)
	}
	if err := u.raw.Write(u.writableFn); err != nil {
		return ErrClosed
	}
	return nil
}

// readable reports whether a datagram is queued; as a RawConn.Read
// callback it parks the caller in the netpoller until one is.
func (u *UDP) readable(fd uintptr) bool {
	u.rpoll[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	n, err := unix.Poll(u.rpoll[:], 0)
	return err != nil || (n == 1 && u.rpoll[0].Revents != 0)
}

// writable reports whether the socket can take a datagram now; as a
// RawConn.Write callback it parks the writer until it can.
func (u *UDP) writable(fd uintptr) bool {
	u.wmu.Lock()
	defer u.wmu.Unlock()
	u.wpoll[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	n, err := unix.Poll(u.wpoll[:], 0)
	return err != nil || (n == 1 && u.wpoll[0].Revents&(unix.POLLOUT|unix.POLLERR|unix.POLLHUP) != 0)
}

// Close closes the link; a borrowed descriptor stays its caller's.
func (u *UDP) Close() error {
	u.Mu.Lock()
	already := u.Closing()
	u.Retire()
	u.Mu.Unlock()
	if u.borrowed || already {
		return nil
	}
	return u.conn.Close()
}

// SetReadBuffer sets the socket's kernel receive buffer (SO_RCVBUF, or
// SO_RCVBUFFORCE where allowed).
func (u *UDP) SetReadBuffer(bytes int) error {
	return u.setBuffer(unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, bytes)
}

// SetWriteBuffer sets the socket's kernel send buffer.
func (u *UDP) SetWriteBuffer(bytes int) error {
	return u.setBuffer(unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, bytes)
}

func (u *UDP) setBuffer(force, plain, bytes int) error {
	if u.SetsockoptInt(unix.SOL_SOCKET, force, bytes) != nil {
		return u.SetsockoptInt(unix.SOL_SOCKET, plain, bytes)
	}
	return nil
}

// SetsockoptInt sets an integer socket option.
func (u *UDP) SetsockoptInt(level, name, v int) error {
	var serr error
	if err := u.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, name, v) }); err != nil {
		return err
	}
	return serr
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
	a = a.Unmap()
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
