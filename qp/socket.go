package qp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/udiwarp/udiwarp/protect"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// Socket is a UDP endpoint a device owns: the lower-layer protocol of its
// datagram QPs. One socket serves many QPs, told apart by QP number.
//
// Its parts: ll, the lower layer (package llp: a kernel UDP socket, an
// AF_XDP socket or an in-memory link, with batched reads into buffers
// the caller supplies, writes without waiting, waits, close; the
// impairment wraps it when the device has one); rx, the receive side that
// chooses those buffers and hands each datagram to the engines
// (rxside.go); and the datamover that serves the QPs with queued sends
// (send.go).
type Socket struct {
	dev   *Device
	ll    llp.Link
	udp   *llp.UDP // the kernel socket under ll, if it is one
	local netip.AddrPort
	v6    bool
	// maxDatagram is the largest UDP payload the socket can send.
	maxDatagram int
	// prot protects the socket's datagrams (DeviceConfig.Protect), nil
	// for today's wire.
	prot  *protect.Link
	noGSO atomic.Bool // the kernel refused UDP_SEGMENT once, or the impairment layer sees each datagram
	// gsoTooBig: a GSO send of segments this large (UDP payload bytes)
	// failed with EMSGSIZE — the route's MTU is smaller, and the kernel
	// does not fragment a GSO segment — so segments this large or larger
	// go one datagram per call, which the kernel fragments (0: no limit).
	gsoTooBig atomic.Uint32
	broadcast atomic.Bool // SetBroadcast(true)

	rxMu sync.Mutex // one reader at a time
	rx   rxSide

	// Datamover: QPs with queued work, served round-robin.
	txMu    sync.Mutex
	active  []*QP
	txWake  chan struct{}
	txDone  chan struct{} // closed by close: the datamover returns
	mover   bool          // the datamover goroutine started (under txMu)
	mcastMu sync.RWMutex
	mcast   map[netip.Addr][]*QP
	closed  bool

	// fallback says why the socket is a kernel UDP socket where the
	// device asked for AF_XDP (DeviceConfig.LowerFallback).
	fallback string
	// manual: BindFD's socket, read only by Progress.
	manual bool
	alias  atomic.Pointer[socketAlias] // Alias
}

type socketAlias struct {
	qpn uint32
	q   *QP
}

// maxUDPv4 is the largest UDP payload over IPv4.
const maxUDPv4 = 65507

func newSocket(d *Device, conn *net.UDPConn) (*Socket, error) {
	u, err := llp.NewUDP(conn, d.cfg.RecvBatch, d.cfg.RecvBuffer, d.cfg.SendBuffer)
	if err != nil {
		return nil, fmt.Errorf("qp: %w", err)
	}
	return newLinkSocket(d, u, false), nil
}

// newLinkSocket makes a socket over the link l (manual: read only by
// Progress), behind the device's impairment if it has one.
func newLinkSocket(d *Device, l llp.Link, manual bool) *Socket {
	la := l.LocalAddr()
	s := &Socket{dev: d, local: netip.AddrPortFrom(la.Addr().Unmap(), la.Port()), manual: manual,
		txWake: make(chan struct{}, 1), txDone: make(chan struct{}), mcast: map[netip.Addr][]*QP{}}
	s.v6 = la.Addr().Is6() && !la.Addr().Is4In6()
	s.udp, _ = l.(*llp.UDP)
	s.ll = l
	if d.cfg.Impair != nil || d.cfg.ImpairRx != nil {
		s.ll = llp.Impair(l, d.cfg.Impair, d.cfg.ImpairRx, llp.ImpairOptions{Batch: d.cfg.RecvBatch,
			TxActed: &d.stats.TxImpaired, RxActed: &d.stats.RxImpaired, Late: s.deliverLate})
	}
	if d.cfg.Protect.Mode != protect.None {
		st := &d.stats
		pl, err := protect.Wrap(s.ll, d.cfg.Protect, d.cfg.RecvBatch, protect.Stats{
			Sealed: &st.ProtSealed, Opened: &st.ProtOpened, Contacts: &st.ProtContacts, Sessions: &st.ProtSessions,
			PSKPeers: &st.ProtPSKPeers, KeyUpdates: &st.ProtKeyUpdates, AuthFailed: &st.ProtAuthFailed,
			Replayed: &st.ProtReplayed, NoKey: &st.ProtNoKey, Clear: &st.ProtClear, BadEnvelope: &st.ProtBadEnvelope,
			ModeMismatch: &st.ProtModeMismatch, Unsolicited: &st.ProtUnsolicited, Reflected: &st.ProtReflected,
			ContactLimited: &st.ProtContactLimited, PeersFull: &st.ProtPeersFull, WrongSource: &st.ProtWrongSource, RefusesSent: &st.ProtRefusesSent,
			TxNoKey: &st.ProtTxNoKey})
		if err != nil {
			panic(err) // Open checked the configuration
		}
		s.ll, s.prot = pl, pl
	}
	caps := s.ll.Caps()
	s.maxDatagram = caps.MaxDatagram
	s.noGSO.Store(caps.MaxTrain <= 1) // (the impairment acts on each datagram)
	s.rx.init(s, d.cfg.RecvBatch)
	return s
}

// Link returns what the socket runs on: its kind, and how it runs
// (where AF_XDP was asked for and could not open, Detail says why).
func (s *Socket) Link() llp.Caps {
	c := s.ll.Caps()
	if s.fallback != "" {
		c.Detail += " (AF_XDP refused: " + s.fallback + ")"
	}
	return c
}

// LocalAddr returns the address the socket is bound to.
func (s *Socket) LocalAddr() netip.AddrPort { return s.local }

// MaxMessage returns the largest UD Send payload this socket can carry in
// one datagram: the UDP limit less the untagged header and the CRC.
func (s *Socket) MaxMessage() int {
	return s.maxDatagram - udiwarp.DDPUntaggedHeaderSize - udiwarp.CRCSize
}

// start starts the socket's receive goroutine, in event mode; the
// datamover starts with the first send that has to wait (activate).
// A manual socket (BindFD) has no receive goroutine: its owner calls
// Progress.
func (s *Socket) start() {
	d := s.dev
	if d.cfg.Poll == PollEvent && !s.manual {
		d.wg.Add(1)
		go s.recvLoop()
	}
}

func (s *Socket) close() {
	s.txMu.Lock()
	if !s.closed {
		s.closed = true
		close(s.txDone)
	}
	s.txMu.Unlock()
	s.ll.Close()
}

// Close closes the socket alone, the device and its other sockets going
// on: the device stops reading and sending on it, and a descriptor it
// opened (Bind) or was given (BindConn) is closed; one BindFD was given
// stays its owner's. Destroy or move the QPs active on it first: their
// sends fail afterwards. Closing a closed socket does nothing.
func (s *Socket) Close() error {
	d := s.dev
	d.mu.Lock()
	_, listed := d.sockets[s]
	if listed {
		delete(d.sockets, s)
		if !s.manual {
			d.relistLocked()
		}
	}
	d.mu.Unlock()
	if !listed {
		return nil // closed already, or by the device's Close
	}
	s.close()
	s.rxMu.Lock() // once a reader in flight has finished
	s.rx.n = 0
	s.rx.dropFirst()
	s.rxMu.Unlock()
	return nil
}

// Progress reads and handles up to limit datagrams queued on the socket
// now, without waiting, in the caller's goroutine, and returns how many
// it read (a busy-poll device reads this way when a CQ is polled; a
// manual socket, BindFD's, only this way). It waits for another
// goroutine reading the socket to finish first.
func (s *Socket) Progress(limit int) int {
	if limit <= 0 {
		return 0
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	r := &s.rx
	vlen := min(limit, len(r.msgs))
	if s.manual {
		// A manual socket lends each slot it reads into a pooled buffer
		// for the call: as many as the last read needed, doubling while
		// reads fill them, so that the poll of a program spinning on an
		// idle socket lends one buffer, not limit (a pool's Get and Put
		// cost more than the empty read).
		vlen = min(vlen, max(r.lendN, 1))
	}
	r.lend(vlen)
	defer r.giveBack(vlen)
	if !r.read(vlen) {
		return 0
	}
	if got := r.n; s.manual && got >= vlen {
		r.lendN = min(2*vlen, len(r.msgs))
	} else if s.manual {
		r.lendN = max(got, 1)
	}
	r.dispatch()
	return max(r.n, 0)
}

// SetFD tells a socket BindFD made that its owner moved it to descriptor
// fd, another descriptor of the same socket (a dup), so that the old one
// may be closed once SetFD returns.
func (s *Socket) SetFD(fd int) error {
	if fd < 0 {
		return fmt.Errorf("%w: descriptor %d", ErrInvalidAttr, fd)
	}
	if s.udp == nil || !s.udp.Borrowed() {
		return fmt.Errorf("%w: the socket's descriptor is the device's own (Bind, BindConn, BindLink)", ErrInvalidAttr)
	}
	if err := s.udp.SetFD(fd); err != nil {
		if errors.Is(err, llp.ErrClosed) {
			return ErrClosed
		}
		return err
	}
	return nil
}

// Alias makes the datagrams that arrive on this socket addressed to QP
// number qpn go to q, a QP active on it, whatever number q has: how one
// device serving many sockets gives each socket's QP the fixed number
// its peers address (socketshim.ShimQPN, the LD_PRELOAD engine); q's
// frames then carry qpn as their source QP number. One alias per
// socket; a later call replaces it, and q == nil removes it.
// A QP the device numbered qpn itself is found first only when it is
// active on this socket.
func (s *Socket) Alias(qpn uint32, q *QP) error {
	if q != nil && (q.sock.Load() != s || q.dev != s.dev) {
		return fmt.Errorf("%w: QP %d is not active on this socket", ErrInvalidAttr, q.num)
	}
	if q != nil && q.typ != UD && q.typ != RD {
		return fmt.Errorf("%w: %v QPs are not datagram QPs", ErrInvalidAttr, q.typ)
	}
	// The QP's frames carry the alias as their source: its peers key
	// their state (RD's sessions and tokens) by the number they address.
	if old := s.alias.Swap(nil); old != nil {
		old.q.wire.Store(old.q.num)
	}
	if q != nil {
		q.wire.Store(qpn)
		s.alias.Store(&socketAlias{qpn, q})
	}
	return nil
}

// lookupQP finds the QP a datagram that arrived on s for qpn is for: the
// device's QP of that number if it is active here, else the alias.
func (s *Socket) lookupQP(qpn uint32) *QP {
	if q := s.dev.lookupQP(qpn); q != nil && q.sock.Load() == s {
		return q
	}
	if a := s.alias.Load(); a != nil && a.qpn == qpn && a.q.sock.Load() == s {
		return a.q
	}
	return nil
}

// recvLoop is the event-mode receive goroutine. It waits for the socket
// to become readable without holding rxMu, so that a goroutine spinning in
// CQ.Wait can receive in its own stack meanwhile; then it reads.
func (s *Socket) recvLoop() {
	defer s.dev.wg.Done()
	for {
		if err := s.ll.WaitReadable(); err != nil {
			return // closed
		}
		s.rxMu.Lock()
		ok := s.rx.read(len(s.rx.msgs))
		delivered := ok && s.rx.dispatch()
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

// pollOnce reads whatever is queued without waiting, if no other
// goroutine is reading this socket now.
func (s *Socket) pollOnce() {
	if s.manual || !s.rxMu.TryLock() { // a manual socket: its owner's Progress only
		return
	}
	r := &s.rx
	// A poller that finds nothing tries again at once, so each try reads
	// one datagram (recvmsg is cheapest); once datagrams come back to back
	// it reads batches, until a batch comes back short.
	vlen := 1
	if r.streak >= 2 {
		vlen = len(r.msgs)
	}
	if r.read(vlen) {
		r.dispatch()
		switch {
		case r.n <= 0:
			r.streak = 0
		case vlen == 1:
			r.streak++
		case r.n < vlen:
			r.streak = 0
		}
	}
	s.rxMu.Unlock()
}

// errSocketFull is returned by a direct send that found the socket full.
var errSocketFull = errors.New("socket send buffer full")

// sendNow sends one small datagram the stack built itself (an error
// message) without waiting: dropped if the socket cannot take it now.
func (s *Socket) sendNow(b []byte, to netip.AddrPort) {
	if len(b) == 0 {
		return
	}
	msg := [1]llp.Msg{{Bufs: [][]byte{b}, Addr: to}}
	if _, err := s.ll.Write(msg[:]); err != nil {
		if err != llp.ErrClosed {
			s.dev.stats.TxErrors.Add(1)
		}
		return
	}
	s.dev.stats.TxDatagrams.Add(1)
}

// SetReadBuffer sets the socket's kernel receive buffer (SO_RCVBUF, or
// SO_RCVBUFFORCE where allowed), as net.UDPConn.SetReadBuffer does.
func (s *Socket) SetReadBuffer(bytes int) error {
	if s.udp == nil {
		return s.notSocket("SO_RCVBUF")
	}
	return s.udp.SetReadBuffer(bytes)
}

// notSocket is the error of an option only a kernel UDP socket has.
func (s *Socket) notSocket(what string) error {
	return fmt.Errorf("%w: %s: the socket's lower layer is %s, not a kernel UDP socket", ErrInvalidAttr, what, s.ll.Caps().Kind)
}

// SetWriteBuffer sets the socket's kernel send buffer.
func (s *Socket) SetWriteBuffer(bytes int) error {
	if s.udp == nil {
		return s.notSocket("SO_SNDBUF")
	}
	return s.udp.SetWriteBuffer(bytes)
}

// SetBroadcast allows (or forbids) sending to IPv4 broadcast addresses
// from the socket (SO_BROADCAST), as a UDP socket needs it. Receiving
// needs nothing: a datagram to a broadcast address reaches every socket
// bound to its port, and the QP its header names there. IPv4 only.
func (s *Socket) SetBroadcast(on bool) error {
	if s.v6 {
		return fmt.Errorf("%w: broadcast is IPv4's (IPv6 has multicast groups)", ErrInvalidAttr)
	}
	v := 0
	if on {
		v = 1
	}
	if s.udp == nil {
		return s.notSocket("SO_BROADCAST")
	}
	if err := s.udp.SetsockoptInt(unix.SOL_SOCKET, unix.SO_BROADCAST, v); err != nil {
		return err
	}
	s.broadcast.Store(on)
	return nil
}

// Broadcast reports whether SetBroadcast allowed sending to broadcast
// addresses.
func (s *Socket) Broadcast() bool { return s.broadcast.Load() }
