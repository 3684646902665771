package llp

// XDP: a Link on an AF_XDP socket bound to one queue of an interface. The
// link's XDP program redirects the datagrams for its address:port to the
// socket; the link checks and strips their Ethernet, IP and UDP headers
// itself, and builds them for what it sends, with the next hop's MAC
// from the kernel's neighbour table. See docs/llp.md, "AF_XDP".
//
// Memory: one UMEM of Frames frames of FrameSize bytes; the first half
// receives (they circulate between the fill ring, the RX ring and Read),
// the second half sends (a free list, the TX ring, the completion ring).

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// XDPConfig configures an XDP link.
type XDPConfig struct {
	// Interface is the interface to attach to (required).
	Interface string
	// Queue is the RX/TX queue the socket serves (default 0). Only
	// datagrams the NIC steers to this queue come through the socket;
	// the rest reach the link's kernel socket on its port (slower).
	Queue int
	// Addr is the local IP and UDP port the link receives on; the IP
	// must be on Interface. Port 0 picks a free one.
	Addr netip.AddrPort
	// Frames is the number of UMEM frames (default 4096, at least 64),
	// FrameSize their size (2048 or 4096, the default).
	Frames, FrameSize int
	// Busy: WaitReadable spins on the RX ring for a while before it
	// parks in poll(2).
	Busy bool
	// ZeroCopy is "auto" (the default: zero-copy if the driver takes it,
	// else copy mode), "copy" or "zerocopy".
	ZeroCopy string
}

// XDPStats counts what an XDP link did.
type XDPStats struct {
	RxFrames uint64 // datagrams read from the RX ring
	RxKernel uint64 // datagrams read from the kernel socket (another queue)
	// RxDropped counts frames dropped by the link's checks; the fields
	// after it say why.
	RxDropped                                           uint64
	RxBadEthernet, RxBadIP, RxBadIPChecksum             uint64
	RxBadUDPLength, RxBadUDPChecksum, RxNotOurs         uint64
	TxFrames, TxKicks, TxNoNeighbour, TxNeighProbes     uint64
	KernelRxDropped, KernelRxInvalid, KernelRxRingFull  uint64 // XDP_STATISTICS
	KernelFillEmpty, KernelTxInvalid, KernelTxRingEmpty uint64
}

const (
	xdpMaxTrain       = 64
	xdpDefaultFrames  = 4096
	xdpDefaultFrameSz = 4096
	// xdpBusySpin is how long a busy WaitReadable watches the RX ring
	// before it parks in poll(2).
	xdpBusySpin = 50 * time.Microsecond
	// xdpNeighTTL: a cached next-hop MAC is checked against the kernel's
	// neighbour table again after this long.
	xdpNeighTTL = 10 * time.Second
	// xdpNeighProbePort is where a probe datagram goes to make the
	// kernel resolve a next hop: the discard port.
	xdpNeighProbePort = 9
)

// xdpKernelEvery: a busy reader looks at the port's kernel socket every
// this many reads that did not fill their batch (Read).
const xdpKernelEvery = 1024

// xdpReaderTick is how long (ms) WaitReadable parks at a time when no
// datagram waits for its next hop.
const xdpReaderTick = 20

// xdpForceGeneric makes OpenXDP attach in generic mode (tests).
var xdpForceGeneric bool

// xdpNeighMax bounds the next-hop cache; past it the cache starts over.
const xdpNeighMax = 4096

// Datagrams to a next hop the kernel is resolving wait in the link, as a
// socket's wait in the kernel's neighbour queue (unres_qlen): at most
// xdpUnresPerHop per destination and xdpUnresMax in all, each for
// xdpNeighWait (about the kernel's 3 ARP probes a second apart), then
// they are dropped. Write takes them (a datagram to a host that never
// answers is lost on the way, as on a socket); a full queue refuses
// them with ErrNoNeighbour. The queue is bounded so that replies drawn
// by spoofed sources (each a next hop nobody answers for) cost at most
// this much, and never hold up datagrams to hosts that are known.
const (
	xdpNeighWait   = 3 * time.Second
	xdpUnresPerHop = 3
	xdpUnresMax    = 64
	// The kernel's table is asked again for the waiting next hops at
	// most every xdpUnresCheck while the newest waiting datagram is
	// younger than xdpUnresFresh (a neighbour on the link answers within
	// it), then every xdpUnresSlow: next hops that never answer (the
	// sources a spoofer made up) cost a few lookups each, not a stream.
	xdpUnresCheck = 200 * time.Microsecond
	xdpUnresFresh = 5 * time.Millisecond
	xdpUnresSlow  = 10 * time.Millisecond
)

// ErrNoNeighbour is returned by an XDP link's Write when the next hop's
// MAC address is not known and the datagrams waiting for next hops fill
// the link's queue: the datagram is dropped.
var ErrNoNeighbour = errors.New("llp: xdp: next hop's MAC address not resolved and the queue of datagrams waiting for next hops is full (datagram dropped)")

// errResolving: the next hop is being resolved; the datagram may wait.
var errResolving = errors.New("llp: xdp: resolving the next hop")

// unresolved is a datagram waiting for its next hop's MAC address: a
// copy of its bytes, its destination and train segment size.
type unresolved struct {
	dst   netip.AddrPort
	b     []byte
	seg   int
	until time.Time
}

// XDP is a Link on an AF_XDP socket.
type XDP struct {
	cfg       XDPConfig
	ifindex   int
	ifname    string
	mac       [6]byte
	mtu       int
	addr      netip.AddrPort
	v6        bool
	frameSize int
	zeroCopy  bool
	native    bool
	caps      Caps

	// mu: every operation holds it for reading; Close takes it for
	// writing once closed is set and the waiters have been woken, then
	// frees what they use.
	mu     sync.RWMutex
	closed atomic.Bool
	once   sync.Once

	xsk   int // the AF_XDP socket
	udp   int // the kernel UDP socket holding the port
	evfd  int // eventfd: written by Close to wake pollers
	nl    *nlConn
	objs  *xdpObjs
	xlink link.Link

	umem     []byte
	ringMaps [][]byte

	rxMu sync.Mutex // the receive side: rx and fill rings, kernelPolls
	// kernelReady: a wait saw the port's kernel socket readable;
	// kernelPolls counts the reads since it was last looked at.
	kernelReady atomic.Bool
	kernelPolls int
	rx          xdpRing
	fill        xdpRing

	txMu   sync.Mutex // the send side: tx and completion rings, free frames, neighbours
	tx     xdpRing
	comp   xdpRing
	txFree []uint64
	ipID   uint16
	neigh  map[netip.Addr]neighEntry
	hot    hotNeigh
	// owed counts the frames on the TX ring that a deferred kick owes
	// (kickSoon); lastKick, timerSet and kickTimer are under txMu.
	owed      atomic.Int32
	rxAtWrite uint64 // the datagrams read when the last Write came
	lastKick  time.Time
	timerSet  bool
	kickTimer *time.Timer
	// unres are the datagrams waiting for their next hop's MAC address,
	// oldest first; unresAt when the kernel's table was last asked.
	unres   []unresolved
	unresAt time.Time
	// flushing: flushUnresolved is putting waiting datagrams on the ring
	// (resolve then looks their next hop up; otherwise a datagram for a
	// next hop others wait for queues behind them without a lookup).
	flushing bool
	nunres   atomic.Int32 // len(unres), for the reader's waits

	st struct {
		rxFrames, rxKernel, txFrames, txKicks, txNoNeigh, txProbes atomic.Uint64
		drops                                                      [numDropReasons]atomic.Uint64
	}
}

type neighEntry struct {
	mac [6]byte
	at  time.Time
}

// hotNeigh is the destination the link sent to last, with its next
// hop's MAC: the next datagram to it takes neither the map nor the
// clock (together a fifth of a small datagram's own cost here) but every
// xdpNeighClock datagrams, when the entry's age is checked.
type hotNeigh struct {
	dst  netip.Addr
	mac  [6]byte
	uses uint32
}

// xdpNeighClock: a cached next hop's age is checked every this many
// datagrams to the destination sent to last.
const xdpNeighClock = 64

var _ Link = (*XDP)(nil)

// xdpRing is one of the four rings shared with the kernel. Fill and
// completion rings hold UMEM addresses (u64), RX and TX rings
// descriptors (unix.XDPDesc).
type xdpRing struct {
	prod, cons, flags *uint32
	descs             unsafe.Pointer
	mask              uint32
	size              uint32
	// The side this process owns: the next index it writes (producer)
	// or reads (consumer).
	local uint32
}

func (r *xdpRing) addr(i uint32) *uint64 {
	return (*uint64)(unsafe.Add(r.descs, uintptr(i&r.mask)*8))
}

func (r *xdpRing) desc(i uint32) *unix.XDPDesc {
	return (*unix.XDPDesc)(unsafe.Add(r.descs, uintptr(i&r.mask)*unsafe.Sizeof(unix.XDPDesc{})))
}

// free is how many entries a producer may still write.
func (r *xdpRing) free() uint32 {
	return r.size - (r.local - atomic.LoadUint32(r.cons))
}

// avail is how many entries a consumer may read.
func (r *xdpRing) avail() uint32 {
	return atomic.LoadUint32(r.prod) - r.local
}

// submit publishes what a producer wrote; release gives back what a
// consumer read.
func (r *xdpRing) submit()  { atomic.StoreUint32(r.prod, r.local) }
func (r *xdpRing) release() { atomic.StoreUint32(r.cons, r.local) }

func (r *xdpRing) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

func pow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// OpenXDP opens an XDP link on cfg.Interface. It needs root (or
// CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW); XDPAvailable says why not.
func OpenXDP(cfg XDPConfig) (*XDP, error) {
	x, err := openXDP(cfg)
	switch {
	case errors.Is(err, unix.EPERM):
		return nil, fmt.Errorf("llp: xdp %s: %w (%w)", cfg.Interface, ErrXDPNotPermitted, err)
	case err != nil:
		return nil, fmt.Errorf("llp: xdp %s: %w", cfg.Interface, err)
	}
	return x, nil
}

// ErrXDPNotPermitted says what an AF_XDP link needs that the process does
// not have (OpenXDP, XDPAvailable).
var ErrXDPNotPermitted = errors.New("not permitted: AF_XDP needs root, or CAP_NET_RAW for the socket and CAP_BPF and CAP_NET_ADMIN for the XDP program")

func openXDP(cfg XDPConfig) (_ *XDP, err error) {
	if cfg.Frames == 0 {
		cfg.Frames = xdpDefaultFrames
	}
	if cfg.FrameSize == 0 {
		cfg.FrameSize = xdpDefaultFrameSz
	}
	if cfg.ZeroCopy == "" {
		cfg.ZeroCopy = "auto"
	}
	switch {
	case cfg.Frames < 64:
		return nil, fmt.Errorf("%d frames: at least 64", cfg.Frames)
	case cfg.FrameSize != 2048 && cfg.FrameSize != 4096:
		return nil, fmt.Errorf("frame size %d: 2048 or 4096", cfg.FrameSize)
	case cfg.Queue < 0:
		return nil, fmt.Errorf("queue %d: not a queue", cfg.Queue)
	case cfg.ZeroCopy != "auto" && cfg.ZeroCopy != "copy" && cfg.ZeroCopy != "zerocopy":
		return nil, fmt.Errorf("ZeroCopy %q: auto, copy or zerocopy", cfg.ZeroCopy)
	case !cfg.Addr.Addr().IsValid() || cfg.Addr.Addr().IsUnspecified():
		return nil, errors.New("the address must be a local IP address")
	}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, err
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, errors.New("not an Ethernet interface")
	}
	ip := cfg.Addr.Addr().Unmap()
	if !ifaceHas(ifi, ip) {
		return nil, fmt.Errorf("%v is not an address of the interface", ip)
	}
	x := &XDP{
		cfg: cfg, ifindex: ifi.Index, ifname: ifi.Name, mtu: ifi.MTU, v6: ip.Is6(),
		frameSize: cfg.FrameSize, xsk: -1, udp: -1, evfd: -1,
		neigh: make(map[netip.Addr]neighEntry),
	}
	x.kickTimer = time.AfterFunc(time.Hour, x.timerKick)
	x.kickTimer.Stop()
	copy(x.mac[:], ifi.HardwareAddr)
	defer func() {
		if err != nil {
			x.teardown()
		}
	}()

	// The port: a kernel socket holds it for the link's life, so the
	// kernel gives it to no one else and answers no datagram for it
	// with port unreachable.
	if x.udp, x.addr, err = reservePort(netip.AddrPortFrom(ip, cfg.Addr.Port())); err != nil {
		return nil, err
	}
	if x.evfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if x.nl, err = openNetlink(); err != nil {
		return nil, err
	}
	if err = removeStale(x.nl, x.ifindex); err != nil {
		return nil, err
	}

	// UMEM.
	x.umem, err = unix.Mmap(-1, 0, cfg.Frames*cfg.FrameSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("UMEM mmap: %w", err)
	}
	switch cfg.ZeroCopy {
	case "auto":
		if err = x.openSocket(true); err != nil {
			x.closeSocket()
			err = x.openSocket(false)
		}
	default:
		err = x.openSocket(cfg.ZeroCopy == "zerocopy")
	}
	if err != nil {
		return nil, err
	}

	// The program, its maps, and the attachment.
	if x.objs, err = loadXDPProgram(cfg.Queue + 1); err != nil {
		return nil, err
	}
	if err = x.objs.xsks.Put(uint32(cfg.Queue), uint32(x.xsk)); err != nil {
		return nil, fmt.Errorf("xsk map: %w", err)
	}
	key := xdpKey(x.addr)
	if err = x.objs.ports.Put(key, uint32(1)); err != nil {
		return nil, fmt.Errorf("ports map: %w", err)
	}
	// Native (driver) mode when the driver has it, else generic.
	err = errors.ErrUnsupported
	if !xdpForceGeneric {
		x.xlink, err = link.AttachXDP(link.XDPOptions{Program: x.objs.prog, Interface: x.ifindex, Flags: link.XDPDriverMode})
	}
	x.native = err == nil
	if err != nil {
		x.xlink, err = link.AttachXDP(link.XDPOptions{Program: x.objs.prog, Interface: x.ifindex, Flags: link.XDPGenericMode})
		if err != nil {
			return nil, fmt.Errorf("attach XDP program: %w", err)
		}
	}

	hdr := ipv4HdrLen
	if x.v6 {
		hdr = ipv6HdrLen
	}
	maxDG := min(x.mtu-hdr-udpHdrLen, x.frameSize-unix.XDP_PACKET_HEADROOM-frameHdrLen(x.v6))
	mode, attach := "copy mode", "generic XDP"
	if x.zeroCopy {
		mode = "zero-copy"
	}
	if x.native {
		attach = "native XDP"
	}
	busy := ""
	if cfg.Busy {
		busy = ", busy polling"
	}
	x.caps = Caps{
		Kind: "xdp", MaxDatagram: maxDG, MaxTrain: xdpMaxTrain,
		Detail: fmt.Sprintf("xdp %s queue %d %s, %s%s", x.ifname, cfg.Queue, mode, attach, busy),
	}
	return x, nil
}

// ifaceHas reports whether ip is an address of ifi.
func ifaceHas(ifi *net.Interface, ip netip.Addr) bool {
	addrs, err := ifi.Addrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == ip {
				return true
			}
		}
	}
	return false
}

// reservePort binds a non-blocking kernel UDP socket to a and returns it
// with the address it got.
func reservePort(a netip.AddrPort) (int, netip.AddrPort, error) {
	var sa unix.Sockaddr
	fam := unix.AF_INET
	if a.Addr().Is6() {
		fam = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
	} else {
		sa = &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, a, fmt.Errorf("UDP socket: %w", err)
	}
	if fam == unix.AF_INET6 {
		unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, a, fmt.Errorf("reserve UDP port %v: %w", a, err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, a, fmt.Errorf("getsockname: %w", err)
	}
	switch s := got.(type) {
	case *unix.SockaddrInet4:
		a = netip.AddrPortFrom(a.Addr(), uint16(s.Port))
	case *unix.SockaddrInet6:
		a = netip.AddrPortFrom(a.Addr(), uint16(s.Port))
	}
	return fd, a, nil
}

func sockoptPtr(fd, level, opt int, p unsafe.Pointer, l uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), l, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockoptPtr(fd, level, opt int, p unsafe.Pointer, l uintptr) error {
	n := uint32(l)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// openSocket creates the AF_XDP socket, registers the UMEM, maps the
// rings, binds to the queue (zero-copy or copy), and fills the fill ring.
func (x *XDP) openSocket(zc bool) error {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("AF_XDP socket: %w", err)
	}
	x.xsk = fd
	reg := unix.XDPUmemReg{
		Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))), Len: uint64(len(x.umem)),
		Size: uint32(x.frameSize),
	}
	if err := sockoptPtr(fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return fmt.Errorf("XDP_UMEM_REG: %w", err)
	}
	nRx := x.cfg.Frames / 2
	nTx := x.cfg.Frames - nRx
	sizes := []struct {
		opt, n int
	}{
		{unix.XDP_UMEM_FILL_RING, pow2(nRx)}, {unix.XDP_UMEM_COMPLETION_RING, pow2(nTx)},
		{unix.XDP_RX_RING, pow2(nRx)}, {unix.XDP_TX_RING, pow2(nTx)},
	}
	for _, s := range sizes {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, s.opt, s.n); err != nil {
			return fmt.Errorf("ring size (option %d): %w", s.opt, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockoptPtr(fd, unix.SOL_XDP, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return fmt.Errorf("XDP_MMAP_OFFSETS: %w", err)
	}
	mapRing := func(r *xdpRing, o unix.XDPRingOffset, pgoff int64, n int, descSize uintptr) error {
		mem, err := unix.Mmap(fd, pgoff, int(o.Desc)+n*int(descSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("ring mmap: %w", err)
		}
		x.ringMaps = append(x.ringMaps, mem)
		base := unsafe.Pointer(&mem[0])
		*r = xdpRing{
			prod: (*uint32)(unsafe.Add(base, o.Producer)), cons: (*uint32)(unsafe.Add(base, o.Consumer)),
			flags: (*uint32)(unsafe.Add(base, o.Flags)), descs: unsafe.Add(base, o.Desc),
			mask: uint32(n - 1), size: uint32(n),
		}
		return nil
	}
	descSz := unsafe.Sizeof(unix.XDPDesc{})
	if err := mapRing(&x.fill, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, sizes[0].n, 8); err != nil {
		return err
	}
	if err := mapRing(&x.comp, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, sizes[1].n, 8); err != nil {
		return err
	}
	if err := mapRing(&x.rx, off.Rx, unix.XDP_PGOFF_RX_RING, sizes[2].n, descSz); err != nil {
		return err
	}
	if err := mapRing(&x.tx, off.Tx, unix.XDP_PGOFF_TX_RING, sizes[3].n, descSz); err != nil {
		return err
	}
	// Consumers start where the kernel's producers are (0), producers
	// where the kernel's consumers are.
	x.fill.local, x.tx.local = atomic.LoadUint32(x.fill.prod), atomic.LoadUint32(x.tx.prod)
	x.rx.local, x.comp.local = atomic.LoadUint32(x.rx.cons), atomic.LoadUint32(x.comp.cons)

	flags := uint16(unix.XDP_USE_NEED_WAKEUP)
	if zc {
		flags |= unix.XDP_ZEROCOPY
	} else {
		flags |= unix.XDP_COPY
	}
	// The kernel releases a closed socket's hold on its queue in
	// deferred work: a queue a link closed a moment ago may still be
	// busy for some milliseconds. Wait up to a second.
	for i := 0; i < 100; i++ {
		err = unix.Bind(fd, &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(x.ifindex), QueueID: uint32(x.cfg.Queue)})
		if err != unix.EBUSY {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		mode := "copy"
		if zc {
			mode = "zero-copy"
		}
		return fmt.Errorf("bind AF_XDP socket to queue %d (%s): %w", x.cfg.Queue, mode, err)
	}
	x.zeroCopy = zc
	// Copy mode sends at most a budget of frames (32 by default) per
	// kick; ask for a whole TX ring's worth (kernels before 6.16 refuse:
	// Write then kicks again).
	unix.SetsockoptInt(fd, unix.SOL_XDP, unix.XDP_MAX_TX_SKB_BUDGET, sizes[3].n)

	for i := range nRx {
		*x.fill.addr(x.fill.local) = uint64(i * x.frameSize)
		x.fill.local++
	}
	x.fill.submit()
	x.txFree = x.txFree[:0]
	for i := nRx; i < x.cfg.Frames; i++ {
		x.txFree = append(x.txFree, uint64(i*x.frameSize))
	}
	return nil
}

// closeSocket undoes openSocket.
func (x *XDP) closeSocket() {
	if x.xsk >= 0 {
		unix.Close(x.xsk)
		x.xsk = -1
	}
	for _, m := range x.ringMaps {
		unix.Munmap(m)
	}
	x.ringMaps = nil
}

// teardown frees everything; the link is not in use.
func (x *XDP) teardown() {
	if x.xlink != nil {
		x.xlink.Close()
		x.xlink = nil
	}
	if x.objs != nil {
		// The socket map holds the socket: out of it first, so that
		// closing the socket frees the queue now rather than when the
		// map goes.
		x.objs.xsks.Delete(uint32(x.cfg.Queue))
		x.objs.close()
		x.objs = nil
	}
	x.closeSocket()
	if x.umem != nil {
		unix.Munmap(x.umem)
		x.umem = nil
	}
	if x.nl != nil {
		x.nl.close()
	}
	for _, fd := range []*int{&x.udp, &x.evfd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// enter starts an operation: false once the link is closed. A true
// return must be followed by x.mu.RUnlock.
func (x *XDP) enter() bool {
	x.mu.RLock()
	if x.closed.Load() {
		x.mu.RUnlock()
		return false
	}
	return true
}

// Close detaches the program and frees the socket, the UMEM and the
// port. Operations in flight return ErrClosed.
func (x *XDP) Close() error {
	x.once.Do(func() {
		x.closed.Store(true)
		x.kickTimer.Stop() // one running waits for x.mu below, then finds the link closed
		var one [8]byte
		one[0] = 1 // eventfd takes a native u64; any non-zero value wakes
		unix.Write(x.evfd, one[:])
		x.mu.Lock()
		x.teardown()
		x.mu.Unlock()
	})
	return nil
}

// LocalAddr is the address and port the link receives on.
func (x *XDP) LocalAddr() netip.AddrPort { return x.addr }

// Caps says what the link does.
func (x *XDP) Caps() Caps { return x.caps }

// Stats returns the link's counters.
func (x *XDP) Stats() XDPStats {
	s := XDPStats{
		RxFrames: x.st.rxFrames.Load(), RxKernel: x.st.rxKernel.Load(),
		RxBadEthernet: x.st.drops[dropEth].Load(), RxBadIP: x.st.drops[dropIP].Load(),
		RxBadIPChecksum: x.st.drops[dropIPChecksum].Load(), RxBadUDPLength: x.st.drops[dropUDPLength].Load(),
		RxBadUDPChecksum: x.st.drops[dropUDPChecksum].Load(), RxNotOurs: x.st.drops[dropNotOurs].Load(),
		TxFrames: x.st.txFrames.Load(), TxKicks: x.st.txKicks.Load(),
		TxNoNeighbour: x.st.txNoNeigh.Load(), TxNeighProbes: x.st.txProbes.Load(),
	}
	for i := range x.st.drops {
		s.RxDropped += x.st.drops[i].Load()
	}
	if x.enter() {
		var k unix.XDPStatistics
		if getsockoptPtr(x.xsk, unix.SOL_XDP, unix.XDP_STATISTICS, unsafe.Pointer(&k), unsafe.Sizeof(k)) == nil {
			s.KernelRxDropped, s.KernelRxInvalid, s.KernelRxRingFull = k.Rx_dropped, k.Rx_invalid_descs, k.Rx_ring_full
			s.KernelFillEmpty, s.KernelTxInvalid, s.KernelTxRingEmpty = k.Rx_fill_ring_empty_descs, k.Tx_invalid_descs, k.Tx_ring_empty_descs
		}
		x.mu.RUnlock()
	}
	return s
}

// Read reads up to len(ms) datagrams from the RX ring, and then from the
// kernel socket on the port (datagrams that came in on other queues).
func (x *XDP) Read(ms []Msg) (int, error) {
	if !x.enter() {
		return 0, ErrClosed
	}
	defer x.mu.RUnlock()
	x.payKick()        // what close Writes left owed goes before the reader looks
	x.sendUnresolved() // a busy reader's turn to send them (WaitReadable)
	x.rxMu.Lock()
	defer x.rxMu.Unlock()
	n := 0
	for n < len(ms) {
		avail := min(x.rx.avail(), uint32(len(ms)-n))
		if avail == 0 {
			break
		}
		for range avail {
			d := x.rx.desc(x.rx.local)
			x.rx.local++
			if uint64(d.Addr)+uint64(d.Len) <= uint64(len(x.umem)) && x.deliver(&ms[n], x.umem[d.Addr:d.Addr+uint64(d.Len)]) {
				n++
			}
			// The frame goes back to the fill ring: there is always room,
			// the ring holds every receive frame.
			*x.fill.addr(x.fill.local) = d.Addr &^ uint64(x.frameSize-1)
			x.fill.local++
		}
		x.rx.release()
		x.fill.submit()
	}
	x.st.rxFrames.Add(uint64(n))
	if n > 0 && x.fill.needWakeup() { // frames went back: the driver may wait for them
		unix.Recvfrom(x.xsk, nil, unix.MSG_DONTWAIT)
	}
	// The port's kernel socket (datagrams steered to another queue) costs
	// a system call to look at: looked at when a wait saw it readable,
	// and every xdpKernelEvery empty reads of a busy reader that waits in
	// no poll.
	if n < len(ms) {
		x.kernelPolls++
		if x.kernelReady.Swap(false) || x.kernelPolls >= xdpKernelEvery {
			x.kernelPolls = 0
			for n < len(ms) && x.readKernel(&ms[n]) {
				n++
			}
		}
	}
	return n, nil
}

// deliver checks a received frame and copies its payload into m.
func (x *XDP) deliver(m *Msg, frame []byte) bool {
	f, why := parseFrame(frame)
	// Strictly the link's address: an IPv6 frame to the IPv4-mapped
	// form of an IPv4 link's address is not ours.
	if why == dropNone && f.Dst != x.addr {
		why = dropNotOurs
	}
	if why != dropNone {
		x.st.drops[why].Add(1)
		return false
	}
	p := frame[f.Payload : f.Payload+f.PayloadLen]
	m.N = Scatter(m.Bufs, p)
	m.Trunc = m.N < len(p)
	m.Segment = 0
	m.Addr = f.Src
	m.SetDst(f.Dst.Addr(), !f.Dst.Addr().IsMulticast())
	return true
}

// readKernel reads one datagram from the port's kernel socket, without
// waiting.
func (x *XDP) readKernel(m *Msg) bool {
	bufs := m.Bufs
	if len(bufs) == 0 {
		bufs = [][]byte{nil}
	}
	n, _, fl, from, err := unix.RecvmsgBuffers(x.udp, bufs, nil, unix.MSG_DONTWAIT)
	if err != nil {
		return false
	}
	m.N, m.Trunc, m.Segment = n, fl&unix.MSG_TRUNC != 0, 0
	switch s := from.(type) {
	case *unix.SockaddrInet4:
		m.Addr = netip.AddrPortFrom(netip.AddrFrom4(s.Addr), uint16(s.Port))
	case *unix.SockaddrInet6:
		m.Addr = netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), uint16(s.Port))
	}
	m.SetDst(x.addr.Addr(), true) // the socket is bound to the link's address
	x.st.rxKernel.Add(1)
	return true
}

// Write sends ms: each datagram in a UMEM frame of its own on the TX
// ring, then one kick.
func (x *XDP) Write(ms []Msg) (int, error) {
	if !x.enter() {
		return 0, ErrClosed
	}
	defer x.mu.RUnlock()
	x.txMu.Lock()
	defer x.txMu.Unlock()
	x.reclaim()
	queued := x.flushUnresolved(false)
	sent := 0
	var err error
	for i := range ms {
		m := &ms[i]
		err = x.queue(m)
		if err == errResolving {
			err = x.hold(m)
		} else if err == nil {
			queued++
		}
		if err != nil {
			break
		}
		m.N = m.Len()
		sent++
	}
	if queued > 0 {
		x.tx.submit()
		x.kickSoon(queued)
	}
	return sent, err
}

// Deferred kicks (busy links only). In copy mode every kick is a system
// call that runs the whole transmit; a busy link whose Writes come close
// together (a sender posting message after message) puts up to
// xdpKickBatch frames on the ring for one kick, as raw-xdp's batches do.
// A frame never waits long: the link's next Read, WaitReadable or
// WaitWritable kicks what is owed (a busy reader calls Read within
// microseconds), and a timer does after xdpKickDefer if none comes. A
// Write kicks at once when it comes xdpKickDefer or more after the last
// kick, or when the link has read a datagram since the Write before it:
// an answer (a ping-pong's, whose peer waits for it) is never deferred,
// only a run of sends with nothing read between them.
const (
	xdpKickBatch = 32
	xdpKickDefer = 50 * time.Microsecond
)

// xdpKickWindow and xdpKickTimer are xdpKickDefer as kickSoon uses it:
// how close a Write must come to the last kick to be deferred, and how
// long an owed kick waits for its timer (tests change them, to see the
// batching and what pays a kick without depending on timing).
var xdpKickWindow, xdpKickTimer = xdpKickDefer, xdpKickDefer

// kickSoon kicks now, or, on a busy link between close Writes, leaves the
// kick owed (under txMu).
func (x *XDP) kickSoon(queued int) {
	now := time.Now()
	owed := x.owed.Add(int32(queued))
	rx := x.st.rxFrames.Load() + x.st.rxKernel.Load()
	answer := rx != x.rxAtWrite
	x.rxAtWrite = rx
	if !x.cfg.Busy || answer || owed >= xdpKickBatch || now.Sub(x.lastKick) >= xdpKickWindow {
		x.kickOwed(now)
		return
	}
	if !x.timerSet {
		x.timerSet = true
		x.kickTimer.Reset(xdpKickTimer)
	}
}

// kickOwed kicks, and the kick is no longer owed (under txMu).
func (x *XDP) kickOwed(now time.Time) {
	x.owed.Store(0)
	x.lastKick = now
	x.kick()
}

// payKick kicks what Writes left owed, if any (Read, the waits, the
// timer).
func (x *XDP) payKick() {
	if x.owed.Load() == 0 {
		return
	}
	x.txMu.Lock()
	if x.owed.Load() > 0 {
		x.kickOwed(time.Now())
	}
	x.txMu.Unlock()
}

// timerKick is the deferred kick's timer: it pays what no Read or wait
// paid within xdpKickDefer.
func (x *XDP) timerKick() {
	if !x.enter() {
		return
	}
	defer x.mu.RUnlock()
	x.txMu.Lock()
	x.timerSet = false
	if x.owed.Load() > 0 {
		x.kickOwed(time.Now())
	}
	x.txMu.Unlock()
}

// queue puts m's datagrams on the TX ring (not yet submitted).
func (x *XDP) queue(m *Msg) error {
	dst := m.Addr
	if dst.Addr().Unmap().Is4() != !x.v6 || dst.Addr().IsUnspecified() || dst.Port() == 0 {
		return fmt.Errorf("llp: xdp: cannot send to %v from %v", dst, x.addr)
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	total := m.Len()
	seg, count := total, 1
	if m.Segment > 0 && total > 0 {
		seg = m.Segment
		count = (total + seg - 1) / seg
		if count > xdpMaxTrain {
			return fmt.Errorf("llp: xdp: a train of %d datagrams (at most %d)", count, xdpMaxTrain)
		}
	}
	if seg > x.caps.MaxDatagram {
		if m.Segment > 0 {
			return ErrTrainTooBig
		}
		return fmt.Errorf("llp: xdp: a %d-byte datagram exceeds the link's %d (no fragmentation)", seg, x.caps.MaxDatagram)
	}
	mac, err := x.resolve(dst.Addr())
	if err != nil {
		return err
	}
	if len(x.txFree) < count || x.tx.free() < uint32(count) {
		return ErrWouldBlock
	}
	h := frameHdr{DstMAC: mac, SrcMAC: x.mac, Src: x.addr, Dst: dst}
	hl := frameHdrLen(x.v6)
	bi, bo := 0, 0 // the cursor in m.Bufs
	for range count {
		n := min(seg, total)
		total -= n
		a := x.txFree[len(x.txFree)-1]
		x.txFree = x.txFree[:len(x.txFree)-1]
		frame := x.umem[a : a+uint64(x.frameSize)]
		p := frame[hl : hl+n]
		for len(p) > 0 {
			k := copy(p, m.Bufs[bi][bo:])
			p = p[k:]
			bo += k
			if bo == len(m.Bufs[bi]) {
				bi, bo = bi+1, 0
			}
		}
		x.ipID++
		h.ID = x.ipID
		l := buildFrame(frame, &h, n)
		*x.tx.desc(x.tx.local) = unix.XDPDesc{Addr: a, Len: uint32(l)}
		x.tx.local++
	}
	m.N = m.Len()
	x.st.txFrames.Add(uint64(count))
	return nil
}

// kick makes the kernel send what the TX ring holds: in copy mode always
// (sendto sends), in zero-copy mode when the ring asks for a wakeup.
func (x *XDP) kick() {
	if x.zeroCopy && !x.tx.needWakeup() {
		return
	}
	// Copy mode sends a budget of frames per call and says EAGAIN when
	// more are left: bounded by the ring's size.
	for range x.tx.size/32 + 2 {
		x.st.txKicks.Add(1)
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(x.xsk), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		if e != unix.EAGAIN && e != unix.EBUSY || x.zeroCopy {
			return
		}
		if atomic.LoadUint32(x.tx.cons) == x.tx.local {
			return
		}
	}
}

// reclaim takes the frames the kernel has sent back from the completion
// ring.
func (x *XDP) reclaim() {
	n := x.comp.avail()
	for range n {
		x.txFree = append(x.txFree, *x.comp.addr(x.comp.local)&^uint64(x.frameSize-1))
		x.comp.local++
	}
	if n > 0 {
		x.comp.release()
	}
}

// hold keeps a copy of m until its next hop resolves (unresolved).
func (x *XDP) hold(m *Msg) error {
	per := 0
	for i := range x.unres {
		if x.unres[i].dst.Addr() == m.Addr.Addr().Unmap() {
			per++
		}
	}
	if len(x.unres) >= xdpUnresMax || per >= xdpUnresPerHop {
		x.st.txNoNeigh.Add(1)
		return ErrNoNeighbour
	}
	x.unres = append(x.unres, unresolved{dst: netip.AddrPortFrom(m.Addr.Addr().Unmap(), m.Addr.Port()),
		b: gather(nil, m.Bufs), seg: m.Segment, until: time.Now().Add(xdpNeighWait)})
	x.nunres.Store(int32(len(x.unres)))
	return nil
}

// Waiting is how many datagrams wait for their next hop's MAC address.
// They leave with the link's next Read, Write or wait once it is known.
func (x *XDP) Waiting() int { return int(x.nunres.Load()) }

// sendUnresolved is flushUnresolved for a goroutine that is not writing
// (a reader's or writer's wait): it submits what it queued.
func (x *XDP) sendUnresolved() {
	if x.nunres.Load() == 0 {
		return
	}
	x.txMu.Lock()
	defer x.txMu.Unlock()
	if x.flushUnresolved(false) > 0 {
		x.tx.submit()
		x.kickOwed(time.Now())
	}
}

// flushUnresolved puts on the TX ring the waiting datagrams whose next
// hop is known now, drops those that waited too long, and returns how
// many it queued (for the caller to submit). The kernel's table is asked
// at most every xdpUnresCheck unless force.
func (x *XDP) flushUnresolved(force bool) int {
	if len(x.unres) == 0 {
		return 0
	}
	now := time.Now()
	every := xdpUnresSlow
	if newest := x.unres[len(x.unres)-1]; newest.until.Sub(now) > xdpNeighWait-xdpUnresFresh {
		every = xdpUnresCheck
	}
	if !force && now.Sub(x.unresAt) < every {
		return 0
	}
	x.unresAt = now
	x.flushing = true
	defer func() { x.flushing = false }()
	queued := 0
	keep := x.unres[:0]
	// A next hop still unknown is asked for once a pass.
	var unknown [xdpUnresMax]netip.Addr
	nu := 0
	for _, u := range x.unres {
		if now.After(u.until) {
			x.st.txNoNeigh.Add(1)
			continue
		}
		if slices.Contains(unknown[:nu], u.dst.Addr()) {
			keep = append(keep, u)
			continue
		}
		m := Msg{Bufs: [][]byte{u.b}, Segment: u.seg, Addr: u.dst}
		switch err := x.queue(&m); err {
		case nil:
			queued++
		case errResolving:
			unknown[nu] = u.dst.Addr()
			nu++
			keep = append(keep, u)
		case ErrWouldBlock:
			keep = append(keep, u)
		default: // the route went, say: dropped
			x.st.txNoNeigh.Add(1)
		}
	}
	clear(x.unres[len(keep):])
	x.unres = keep
	x.nunres.Store(int32(len(keep)))
	return queued
}

// resolve returns the MAC of dst's next hop: cached, else from the
// kernel's neighbour table. If the kernel does not know it, a probe
// datagram (the first time) makes it resolve, and the answer is
// errResolving: the datagram waits (hold).
func (x *XDP) resolve(dst netip.Addr) ([6]byte, error) {
	if h := &x.hot; h.uses > 0 && h.dst == dst {
		h.uses--
		return h.mac, nil
	}
	if !x.flushing && len(x.unres) > 0 && x.waitingFor(dst) {
		// Behind the datagrams that wait for the same next hop, in order,
		// and with no netlink lookup of its own: the flush asks for them.
		return [6]byte{}, errResolving
	}
	now := time.Now()
	e, ok := x.neigh[dst]
	if ok && now.Sub(e.at) < xdpNeighTTL {
		x.hot = hotNeigh{dst: dst, mac: e.mac, uses: xdpNeighClock}
		return e.mac, nil
	}
	oif, gw, err := x.nl.routeGet(dst)
	if err != nil {
		return [6]byte{}, fmt.Errorf("llp: xdp: route to %v: %w", dst, err)
	}
	if oif != x.ifindex {
		return [6]byte{}, fmt.Errorf("llp: xdp: the route to %v leaves by interface %d, not %s", dst, oif, x.ifname)
	}
	hop := dst
	if gw.IsValid() {
		hop = gw.Unmap()
	}
	mac, state, known, err := x.nl.neighGet(x.ifindex, hop)
	if err != nil {
		return [6]byte{}, fmt.Errorf("llp: xdp: neighbour %v: %w", hop, err)
	}
	if !known && !ok {
		if x.flushing {
			return [6]byte{}, errResolving // probed when the first one came
		}
		if len(x.unres) >= xdpUnresMax {
			x.st.txNoNeigh.Add(1)
			return [6]byte{}, ErrNoNeighbour // no room to wait: no probe
		}
	}
	if !known || state&nudStale != 0 {
		// The kernel resolves (or, for a stale entry, confirms) a
		// neighbour when it sends to it: the link's own frames bypass
		// it, so send it a datagram to the discard port.
		x.probe(hop)
	}
	if !known {
		if ok {
			return e.mac, nil // the old MAC until the kernel knows better
		}
		return [6]byte{}, errResolving
	}
	if len(x.neigh) >= xdpNeighMax {
		clear(x.neigh)
	}
	x.neigh[dst] = neighEntry{mac: mac, at: now}
	x.hot = hotNeigh{dst: dst, mac: mac, uses: xdpNeighClock}
	return mac, nil
}

// waitingFor reports whether a datagram to dst waits for its next hop.
func (x *XDP) waitingFor(dst netip.Addr) bool {
	for i := range x.unres {
		if x.unres[i].dst.Addr() == dst {
			return true
		}
	}
	return false
}

func (x *XDP) probe(hop netip.Addr) {
	x.st.txProbes.Add(1)
	var sa unix.Sockaddr
	if hop.Is4() {
		sa = &unix.SockaddrInet4{Port: xdpNeighProbePort, Addr: hop.As4()}
	} else {
		s6 := &unix.SockaddrInet6{Port: xdpNeighProbePort, Addr: hop.As16()}
		if hop.IsLinkLocalUnicast() {
			s6.ZoneId = uint32(x.ifindex) // a link-local gateway
		}
		sa = s6
	}
	unix.Sendto(x.udp, nil, unix.MSG_DONTWAIT, sa)
}

// WaitReadable parks until the RX ring or the port's kernel socket has a
// datagram.
func (x *XDP) WaitReadable() error {
	if !x.enter() {
		return ErrClosed
	}
	defer x.mu.RUnlock()
	x.payKick()
	if x.cfg.Busy {
		start := time.Now()
		for i := 0; ; i++ {
			if x.rxReady() {
				return nil
			}
			if i%64 == 63 && time.Since(start) > xdpBusySpin {
				break
			}
		}
	}
	fds := []unix.PollFd{
		{Fd: int32(x.evfd), Events: unix.POLLIN},
		{Fd: int32(x.xsk), Events: unix.POLLIN},
		{Fd: int32(x.udp), Events: unix.POLLIN},
	}
	// The reader also sends the datagrams that wait for their next hop
	// when it resolves, if no Write comes first: while any wait, it
	// looks every millisecond; otherwise every xdpReaderTick, for those
	// a Write left while it was parked.
	ready := func() bool {
		x.payKick()
		if x.rxReady() {
			return true
		}
		x.sendUnresolved()
		return false
	}
	defer func() {
		if fds[2].Revents != 0 {
			x.kernelReady.Store(true)
		}
	}()
	return x.poll(fds, -2, ready)
}

func (x *XDP) rxReady() bool {
	return atomic.LoadUint32(x.rx.prod) != atomic.LoadUint32(x.rx.cons)
}

// poll waits on fds (fds[0] the eventfd) until ready says so or one of
// them is readable, with timeout ms per round (-1: none); ErrClosed once
// the link is closed. ms -2 is the reader's tick: 1 ms while datagrams
// wait for their next hop, else xdpReaderTick.
func (x *XDP) poll(fds []unix.PollFd, ms int, ready func() bool) error {
	for {
		if x.closed.Load() {
			return ErrClosed
		}
		if ready() {
			return nil
		}
		for i := range fds {
			fds[i].Revents = 0
		}
		wait := ms
		if ms == -2 { // the reader's: see WaitReadable
			wait = xdpReaderTick
			if x.nunres.Load() > 0 {
				wait = 1
			}
		}
		n, err := unix.Poll(fds, wait)
		if err != nil && err != unix.EINTR {
			return err
		}
		if x.closed.Load() || fds[0].Revents != 0 {
			return ErrClosed
		}
		if n > 0 {
			return nil
		}
	}
}

// WaitWritable parks until a frame and a TX ring slot are free.
func (x *XDP) WaitWritable() error {
	if !x.enter() {
		return ErrClosed
	}
	defer x.mu.RUnlock()
	ready := func() bool {
		x.txMu.Lock()
		defer x.txMu.Unlock()
		if x.nunres.Load() > 0 && x.flushUnresolved(false) > 0 {
			x.tx.submit()
			x.kickOwed(time.Now())
		}
		x.reclaim()
		if len(x.txFree) > 0 && x.tx.free() > 0 {
			return true
		}
		x.kickOwed(time.Now()) // copy mode sends, and completes, only when kicked
		x.reclaim()
		return len(x.txFree) > 0 && x.tx.free() > 0
	}
	// Completions raise no event: look again every millisecond.
	fds := []unix.PollFd{{Fd: int32(x.evfd), Events: unix.POLLIN}}
	return x.poll(fds, 1, ready)
}

// XDPAvailable says, in one line, why an XDP link cannot be opened on
// interface ifname, or nil when it can (as far as can be told without
// attaching a program).
func XDPAvailable(ifname string) error {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.EAFNOSUPPORT):
		return errors.New("the kernel lacks AF_XDP (CONFIG_XDP_SOCKETS)")
	case errors.Is(err, unix.EPERM):
		return ErrXDPNotPermitted
	case err != nil:
		return fmt.Errorf("AF_XDP socket: %v", err)
	}
	unix.Close(fd)
	o, err := loadXDPProgram(1)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return ErrXDPNotPermitted
		}
		return fmt.Errorf("cannot load the XDP program: %v", err)
	}
	o.close()
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("interface %s: %v", ifname, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return fmt.Errorf("interface %s is not Ethernet", ifname)
	}
	nl, err := openNetlink()
	if err != nil {
		return err
	}
	defer nl.close()
	attached, id, err := nl.linkXDP(ifi.Index)
	if err != nil {
		return fmt.Errorf("interface %s: %v", ifname, err)
	}
	if attached != xdpAttachedNone {
		if name := progName(id); name != xdpProgName {
			return fmt.Errorf("interface %s already has XDP program %d (%q)", ifname, id, name)
		}
	}
	return nil
}

func progName(id uint32) string {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Name
}

// RemoveStaleXDP detaches from interface ifname an XDP program of ours
// that a crashed run left attached. It refuses a program of someone
// else's, and one a live link holds.
func RemoveStaleXDP(ifname string) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return err
	}
	nl, err := openNetlink()
	if err != nil {
		return err
	}
	defer nl.close()
	return removeStale(nl, ifi.Index)
}

func removeStale(nl *nlConn, ifindex int) error {
	attached, id, err := nl.linkXDP(ifindex)
	if err != nil || attached == xdpAttachedNone {
		return err
	}
	if name := progName(id); name != xdpProgName {
		return fmt.Errorf("the interface has another XDP program attached (id %d, %q)", id, name)
	}
	var modes []uint32
	switch attached {
	case xdpAttachedDrv:
		modes = []uint32{unix.XDP_FLAGS_DRV_MODE}
	case xdpAttachedSKB:
		modes = []uint32{unix.XDP_FLAGS_SKB_MODE}
	case xdpAttachedHW:
		modes = []uint32{unix.XDP_FLAGS_HW_MODE}
	default:
		modes = []uint32{unix.XDP_FLAGS_DRV_MODE, unix.XDP_FLAGS_SKB_MODE, unix.XDP_FLAGS_HW_MODE}
	}
	for _, m := range modes {
		if err := nl.setLinkXDP(ifindex, -1, m); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("our XDP program %d is held by a live link", id)
			}
			return fmt.Errorf("detach stale XDP program %d: %w", id, err)
		}
	}
	return nil
}
