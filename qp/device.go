package qp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"weak"

	"github.com/udiwarp/udiwarp/protect"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// PollMode is how a device waits for datagrams: what RDMA users know as
// completion channels (event) versus polling the CQ (busy).
type PollMode uint8

const (
	// PollEvent parks receive goroutines in Go's netpoller; they wake on data.
	PollEvent PollMode = iota
	// PollBusy never parks: CQ.Poll receives in the caller's goroutine when
	// its CQ is empty, and, with BusyPollThread, a goroutine locked to an OS
	// thread spins on non-blocking receives. Without BusyPollThread, CQ.Wait
	// spins on the receive path in the caller's goroutine.
	PollBusy
)

func (m PollMode) String() string {
	if m == PollBusy {
		return "busy"
	}
	return "event"
}

// DeviceConfig sets a device's limits and modes. The zero value is usable.
type DeviceConfig struct {
	Poll PollMode
	// BusyPollThread adds, in PollBusy mode, a goroutine locked to an OS
	// thread that spins on non-blocking receives, so progress does not
	// depend on the application polling. It costs a core.
	BusyPollThread bool
	MaxMR          int // memory regions; default 65535
	MaxQP          int // queue pairs; default 4096
	MaxCQE         int // largest CQ; default 1<<20
	// RecvBatch is the number of datagrams one recvmmsg reads; default 32.
	RecvBatch int
	// RecvBuffer and SendBuffer size the sockets' kernel buffers (bytes);
	// default 8 MiB and 4 MiB. As root the receive size is forced past
	// net.core.rmem_max (SO_RCVBUFFORCE).
	RecvBuffer, SendBuffer int
	// Impair, if set, runs every datagram this device sends through an
	// impairment layer (loss, reordering, duplication, delay, corruption).
	Impair *Impairment
	// ImpairRx, if set, runs every datagram this device's sockets read
	// through another impairment layer before the stack sees it: loss,
	// corruption, duplication, reordering and delay on the way in. It
	// must not be the same Impairment as Impair. Direct placement is off
	// on a device with it (every datagram passes through it).
	ImpairRx *Impairment
	// NoCRC sends every CRC32c trailer as zero and checks none, for peers
	// whose applications agreed to rely on the UDP checksum alone (seed
	// 003 leaves CRC settings to the ULP). Both ends must agree.
	NoCRC bool
	// Protect protects every datagram of the device's sockets (UD, RD,
	// Write-Record): authenticated, or authenticated and encrypted, with
	// keys agreed in RD's contact or pre-shared (package protect,
	// docs/wire.md §12). The tag replaces the CRC32c: a protected device
	// runs with NoCRC within. Both ends must run the same mode; RD
	// contact with a peer of another mode fails at once with
	// ProtectionModeError. The zero value is today's wire.
	Protect protect.Config
	// Lower chooses what Bind opens under the datagram QPs: LowerUDP, a
	// kernel UDP socket (the default), or LowerXDP, an AF_XDP socket on
	// the interface that holds Bind's address (docs/llp.md). BindConn,
	// BindFD and BindLink take what they are given.
	Lower Lower
	// XDP sets LowerXDP's link: its queue, UMEM frames, copy or zero-copy
	// mode, and busy waits (on with PollBusy). Bind fills in the address,
	// and the interface when it is empty.
	XDP llp.XDPConfig
	// LowerFallback: a Bind that cannot open LowerXDP (no root or
	// CAP_NET_ADMIN and CAP_BPF, no AF_XDP in the kernel, a driver that
	// refuses) opens a kernel UDP socket instead, and Socket.Link says
	// why; without it, that Bind fails with the reason.
	LowerFallback bool
	// EventSpin is how long CQ.Wait polls the device itself, in the
	// caller's goroutine, before it parks (event mode): a reply that comes
	// back within it costs no wake-up. Default 50µs; negative disables.
	EventSpin time.Duration
}

func (c *DeviceConfig) fill() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxMR, 65535)
	def(&c.MaxQP, 4096)
	def(&c.MaxCQE, 1<<20)
	def(&c.RecvBatch, 32)
	def(&c.RecvBuffer, 8<<20)
	def(&c.SendBuffer, 4<<20)
	if c.EventSpin == 0 {
		c.EventSpin = 50 * time.Microsecond
	}
	if c.MaxMR > 1<<24-1 {
		c.MaxMR = 1<<24 - 1
	}
	if c.MaxQP > udiwarp.MaxQPN-1 {
		c.MaxQP = udiwarp.MaxQPN - 1
	}
}

// Device is a software RNIC: it owns UDP sockets, their receive loops and
// datamovers, and the tables of MRs and QPs. Close stops every goroutine it
// started and closes every socket.
type Device struct {
	cfg    DeviceConfig
	mrs    *mrTable
	qps    []atomic.Pointer[QP]
	qpMu   sync.Mutex
	qpNext uint32
	pdNext atomic.Uint32

	mu      sync.Mutex
	sockets map[*Socket]struct{}
	// peerKeys are the pre-shared keys SetPeerKey set, for sockets to come.
	peerKeys map[netip.AddrPort][]byte
	// socketList is a snapshot of the sockets a busy poller reads (every
	// socket but the manual ones), remade when one comes or goes.
	socketList atomic.Pointer[[]*Socket]

	events     chan AsyncEvent
	eventsLost atomic.Uint64
	ev         eventBook // what is in events; see raise
	closed     atomic.Bool
	done       chan struct{}
	wg         sync.WaitGroup
	stats      Stats

	timer deviceTimer // Write-Record deadlines, RD timers, RC acks (timer.go)

	rc rcPoller // RC: one poller for every connection (rcpoller.go)

	srqMu sync.Mutex
	srqs  []weak.Pointer[SRQ] // for Levels; an SRQ nobody holds any more drops out
}

// Impairment is a lossy link in software (llp.Impairment): a device runs
// what it sends through DeviceConfig.Impair and what its sockets read
// through DeviceConfig.ImpairRx.
type Impairment = llp.Impairment

// Open creates a device.
func Open(cfg DeviceConfig) (*Device, error) {
	cfg.fill()
	switch cfg.Lower {
	case "", LowerUDP, LowerXDP:
	default:
		return nil, fmt.Errorf("%w: lower layer %q (want %q or %q)", ErrInvalidAttr, cfg.Lower, LowerUDP, LowerXDP)
	}
	if cfg.Impair != nil && cfg.Impair == cfg.ImpairRx {
		return nil, fmt.Errorf("%w: Impair and ImpairRx must be two Impairments (each direction draws its own)", ErrInvalidAttr)
	}
	if err := cfg.Protect.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidAttr, err)
	}
	if cfg.Protect.Mode != protect.None {
		cfg.NoCRC = true // the tag is the check
	}
	for _, im := range []*Impairment{cfg.Impair, cfg.ImpairRx} {
		if im != nil {
			if err := im.Start(); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidAttr, err)
			}
		}
	}
	d := &Device{
		cfg:    cfg,
		mrs:    newMRTable(cfg.MaxMR),
		qps:    make([]atomic.Pointer[QP], cfg.MaxQP+1),
		qpNext: 1,
		events: make(chan AsyncEvent, eventQueueLen),
		done:   make(chan struct{}),
	}
	d.timer.init(d)
	d.rc.init(cfg.Poll == PollBusy)
	if cfg.Poll == PollBusy && cfg.BusyPollThread {
		d.wg.Add(1)
		go d.busyLoop()
	}
	return d, nil
}

// Config returns the device's configuration with defaults filled in.
func (d *Device) Config() DeviceConfig { return d.cfg }

// AllocPD creates a protection domain.
func (d *Device) AllocPD() *PD { return &PD{dev: d, id: d.pdNext.Add(1)} }

// Events delivers asynchronous events: CQ overflow, SRQ limits, QP
// fatal, error messages from peers. It holds 256 events and is never
// waited for. A quarter of it is kept for the device's own events, which
// remote ones can never crowd out; remote error messages are queued at
// most one per (QP, source) at a time — more from a source whose event is
// still waiting are dropped — and only while the remote share has room.
// Dropped remote events are counted in Stats().RemoteEventsDropped, local
// events that found the channel full in Stats().EventsLost.
func (d *Device) Events() <-chan AsyncEvent { return d.events }

// Close stops the device: every socket is closed, every goroutine the
// device started has returned, and every QP is in ERROR with its
// outstanding work requests flushed.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	close(d.done)
	d.timer.stop()
	d.mu.Lock()
	socks := d.sockets
	d.sockets = nil
	d.socketList.Store(nil)
	d.mu.Unlock()
	for s := range socks { // in any order
		s.close()
		if s.manual {
			s.rxMu.Lock() // once a reader in flight has finished
			s.rx.dropFirst()
			s.rxMu.Unlock()
		}
	}
	d.rc.close()
	d.wg.Wait()
	for i := range d.qps {
		if q := d.qps[i].Load(); q != nil {
			q.toError()
		}
	}
	for _, im := range []*Impairment{d.cfg.Impair, d.cfg.ImpairRx} {
		if im != nil {
			im.Stop()
		}
	}
	return nil
}

// BindOption changes how Bind opens its socket.
type BindOption func(*net.ListenConfig)

// ReuseAddr sets SO_REUSEADDR, so that several sockets (of one or several
// devices) can bind one multicast port and each receive the group's
// datagrams.
func ReuseAddr() BindOption {
	return func(lc *net.ListenConfig) {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
}

// Bind opens a UDP socket on address ("127.0.0.1:0", "[::1]:7471", …)
// for datagram QPs; network is "udp", "udp4" or "udp6". Several QPs may
// share one socket.
func (d *Device) Bind(network, address string, opts ...BindOption) (*Socket, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if d.cfg.Lower == LowerXDP {
		return d.bindXDP(network, address, opts)
	}
	return d.bindUDP(network, address, opts)
}

// bindUDP is Bind on a kernel UDP socket.
func (d *Device) bindUDP(network, address string, opts []BindOption) (*Socket, error) {
	var lc net.ListenConfig
	for _, o := range opts {
		o(&lc)
	}
	pc, err := lc.ListenPacket(context.Background(), network, address)
	if err != nil {
		return nil, err
	}
	conn, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil, fmt.Errorf("%w: network %q is not UDP", ErrInvalidAttr, network)
	}
	s, err := d.adopt(conn)
	if err != nil {
		conn.Close()
	}
	return s, err
}

// adopt makes conn one of the device's sockets and starts receiving on
// it: the one path behind Bind (a socket the device opened) and BindConn
// (one opened elsewhere). On an error conn is left to the caller.
func (d *Device) adopt(conn *net.UDPConn) (*Socket, error) {
	s, err := newSocket(d, conn)
	if err != nil {
		return nil, err
	}
	if err := d.addSocket(s); err != nil {
		return nil, err
	}
	return s, nil
}

// addSocket lists s among the device's sockets and starts it; on
// ErrClosed s is closed (a descriptor it was given stays open).
func (d *Device) addSocket(s *Socket) error {
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		s.close()
		return ErrClosed
	}
	if d.sockets == nil {
		d.sockets = map[*Socket]struct{}{}
	}
	d.sockets[s] = struct{}{}
	for peer, psk := range d.peerKeys {
		if s.prot != nil {
			s.prot.SetPeerKey(peer, psk)
		}
	}
	if !s.manual {
		d.relistLocked()
	}
	s.start() // under d.mu: Close cannot run between the check and wg.Add
	d.mu.Unlock()
	return nil
}

// progressOnce runs one non-blocking receive pass over the device's
// sockets in the caller's goroutine (busy-poll mode).
func (d *Device) progressOnce() {
	if socks := d.socketList.Load(); socks != nil {
		for _, s := range *socks {
			s.pollOnce()
		}
	}
	d.rc.pollOnce()
}

// busyLoop spins on non-blocking receives on a locked OS thread.
func (d *Device) busyLoop() {
	defer d.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for !d.closed.Load() {
		d.progressOnce()
	}
}

// relistLocked remakes the pollers' snapshot; under d.mu.
func (d *Device) relistLocked() {
	list := make([]*Socket, 0, len(d.sockets))
	for s := range d.sockets {
		if !s.manual {
			list = append(list, s)
		}
	}
	d.socketList.Store(&list)
}

func (d *Device) lookupQP(qpn uint32) *QP {
	if qpn == 0 || int(qpn) >= len(d.qps) {
		return nil
	}
	return d.qps[qpn].Load()
}

func (d *Device) addQP(q *QP) error {
	d.qpMu.Lock()
	defer d.qpMu.Unlock()
	for range len(d.qps) - 1 {
		n := d.qpNext
		d.qpNext++
		if int(d.qpNext) >= len(d.qps) {
			d.qpNext = 1
		}
		if d.qps[n].Load() == nil {
			q.num = n
			q.wire.Store(n)
			d.qps[n].Store(q)
			return nil
		}
	}
	return fmt.Errorf("%w: %d queue pairs", ErrTooMany, len(d.qps)-1)
}

func (d *Device) removeQP(q *QP) {
	d.qpMu.Lock()
	d.qps[q.num].CompareAndSwap(q, nil)
	d.qpMu.Unlock()
	d.timer.cancel(q)
}
