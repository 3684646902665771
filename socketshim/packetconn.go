package socketshim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
)

// ShimQPN is the QP number a PacketConn's QP has: each PacketConn opens
// its own device, whose first QP is number 1, so a peer is addressed by
// its UDP address alone, as a socket application expects.
const ShimQPN = 1

// Options tune a PacketConn. The zero value is usable.
type Options struct {
	// RecvDepth is the number of receives kept posted (default 256): how
	// many datagrams can wait to be read before new ones are dropped, as
	// a socket's receive buffer bounds it.
	RecvDepth int
	// SendSlots is the number of datagrams that can be in the stack on
	// their way out (default 64).
	SendSlots int
	// MaxAHs bounds the address-handle cache, one per destination
	// (default 4096; the oldest goes first).
	MaxAHs int
	// Reliable runs the PacketConn over an RD QP instead of UD: every
	// datagram is delivered once, in order per peer, or its sender's
	// stack gives up on the peer (seed 003's reliable datagram socket).
	// Both ends must be Reliable. A datagram its stack could not deliver
	// is reported by the next WriteTo to the same destination (see
	// WriteTo and SendError), or else by Close, which waits for RD to
	// finish with what was written (Linger, UndeliveredError).
	Reliable bool
	// RD tunes the RD QP of a Reliable PacketConn: window, timeouts,
	// retry limits, peer cap (zero values are qp's defaults).
	RD qp.RDConfig
	// Device configures the PacketConn's own device (polling mode, socket
	// buffers, an impairment layer for tests). With qp.PollBusy and no
	// BusyPollThread nothing reads the socket but the PacketConn's calls:
	// a blocked ReadFrom or WriteTo drives the receive path itself, a
	// core for as long as it waits (shim.Park).
	Device qp.DeviceConfig
	// ReuseAddr sets SO_REUSEADDR before binding, so that several
	// PacketConns on one host can bind a multicast group's port.
	ReuseAddr bool
	// Linger bounds how long Close of a Reliable PacketConn waits for RD
	// to finish with the datagrams written: each acknowledged by its peer,
	// or failed. Zero means the default, DefaultLinger (5 s); a negative
	// Linger, not at all (Close drops what RD still holds at once).
	// Either way, Close reports the datagrams it leaves undelivered, and
	// the failures no WriteTo reported, in an *UndeliveredError. A UD
	// PacketConn holds nothing of the kind: Linger does not apply.
	Linger time.Duration
}

// DefaultLinger is Options.Linger's default: how long Close of a Reliable
// PacketConn waits for RD to deliver what was written (as the LD_PRELOAD
// library's UDIWARP_PRELOAD_RD_LINGER).
const DefaultLinger = 5 * time.Second

// PacketConn is a net.PacketConn over a UD queue pair: WriteTo posts a
// Send to the destination's address handle (cached), ReadFrom returns the
// next completed receive and its source. Deadlines behave as
// net.UDPConn's: one in the past interrupts a blocked call at once, and
// an expired one fails with an error for which os.IsTimeout and
// net.Error.Timeout report true.
type PacketConn struct {
	dev    *qp.Device
	sock   *qp.Socket
	pd     *qp.PD
	q      *qp.QP
	rcq    *qp.CQ // receives
	scq    *qp.CQ // sends
	rbuf   *qp.MR
	sbuf   *qp.MR
	slot   int // bytes per buffer slot
	depth  int
	closed chan struct{}
	once   sync.Once

	rmu   sync.Mutex // one reader at a time
	rwc   [1]qp.WorkCompletion
	wmu   sync.Mutex
	wr    qp.SendWR // the WR being posted, reused: one made per call escapes
	sge   [1]qp.SGE
	free  shim.Slots // free send slots
	swcs  []qp.WorkCompletion
	dst   []netip.AddrPort // Reliable: each send slot's destination
	serrs map[netip.AddrPort]*SendError
	lost  int // Reliable: failures past the bound of serrs, only Close reports
	ahs   shim.AHCache

	reliable bool
	linger   time.Duration // Options.Linger, its default filled in
	shim.Deadlines
}

var errClosed = net.ErrClosed

var errReliableGroup = errors.New("socketshim: a Reliable PacketConn cannot send to or join a multicast group, or broadcast (RD is point to point)")

var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// JoinGroup joins the multicast group (an IPv4 or IPv6 group address, as
// a *net.UDPAddr, *net.IPAddr or any net.Addr whose String is an IP) on
// interface ifi, nil for the system's choice, in the manner of
// golang.org/x/net/ipv4.PacketConn.JoinGroup: datagrams sent to the group
// at the PacketConn's port then reach ReadFrom, with their sources. Bind
// the PacketConn to the group's port on the wildcard address (and set
// Options.ReuseAddr where several on one host share it). WriteTo a group
// address sends to every member. A Reliable PacketConn cannot join.
func (c *PacketConn) JoinGroup(ifi *net.Interface, group net.Addr) error {
	g, err := groupAddr(group)
	if err != nil {
		return c.opErr("join", err)
	}
	if c.reliable {
		return c.opErr("join", errReliableGroup)
	}
	if err := c.q.JoinMulticast(g, ifi); err != nil {
		return c.opErr("join", err)
	}
	return nil
}

// LeaveGroup leaves a group JoinGroup joined (ifi is not used: a
// membership is left wherever it was made).
func (c *PacketConn) LeaveGroup(ifi *net.Interface, group net.Addr) error {
	g, err := groupAddr(group)
	if err != nil {
		return c.opErr("leave", err)
	}
	if err := c.q.LeaveMulticast(g); err != nil {
		return c.opErr("leave", err)
	}
	return nil
}

// SetMulticastInterface chooses the interface datagrams to groups leave by.
func (c *PacketConn) SetMulticastInterface(ifi *net.Interface) error {
	if err := c.sock.SetMulticastInterface(ifi); err != nil {
		return c.opErr("set", err)
	}
	return nil
}

// SetBroadcast allows sending to IPv4 broadcast addresses (SO_BROADCAST),
// as on a UDP socket: WriteTo 255.255.255.255 or a subnet's broadcast
// address then reaches every PacketConn bound to the port on the hosts
// it reaches. Without it, WriteTo the limited broadcast address fails
// with EACCES, as the kernel's sendto does (a subnet's broadcast address
// is the kernel's to refuse: that datagram is dropped and counted in
// qp.Stats.TxErrors). Receiving needs nothing.
func (c *PacketConn) SetBroadcast(on bool) error {
	if c.reliable && on {
		return c.opErr("set", errReliableGroup)
	}
	if err := c.sock.SetBroadcast(on); err != nil {
		return c.opErr("set", err)
	}
	return nil
}

// groupAddr is the IP address of a group given as a net.Addr.
func groupAddr(a net.Addr) (netip.Addr, error) {
	var ip net.IP
	switch a := a.(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.IPAddr:
		ip = a.IP
	case nil:
		return netip.Addr{}, errors.New("socketshim: no group address")
	default:
		s := a.String()
		if h, _, err := net.SplitHostPort(s); err == nil {
			s = h
		}
		ip = net.ParseIP(s)
	}
	g, ok := netip.AddrFromSlice(ip)
	if !ok || !g.Unmap().IsMulticast() {
		return netip.Addr{}, fmt.Errorf("socketshim: %v is not a multicast group", a)
	}
	return g.Unmap(), nil
}

// ListenPacket opens a PacketConn on a UDP address ("udp", "udp4" or
// "udp6"), with its own device, socket and UD QP.
func ListenPacket(network, address string, opts *Options) (*PacketConn, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.RecvDepth <= 0 {
		o.RecvDepth = 256
	}
	if o.SendSlots <= 0 {
		o.SendSlots = 64
	}
	if o.MaxAHs <= 0 {
		o.MaxAHs = 4096
	}
	if o.Linger == 0 {
		o.Linger = DefaultLinger
	}
	switch network {
	case "udp", "udp4", "udp6":
	default:
		return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
	}
	dev, err := qp.Open(o.Device)
	if err != nil {
		return nil, err
	}
	c := &PacketConn{dev: dev, depth: o.RecvDepth, closed: make(chan struct{}), linger: o.Linger}
	c.Deadlines.Init()
	fail := func(err error) (*PacketConn, error) {
		dev.Close()
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	var bopts []qp.BindOption
	if o.ReuseAddr {
		bopts = append(bopts, qp.ReuseAddr())
	}
	if c.sock, err = dev.Bind(network, address, bopts...); err != nil {
		return fail(err)
	}
	c.slot = c.sock.MaxMessage()
	c.pd = dev.AllocPD()
	c.ahs = shim.AHCache{PD: c.pd, QPN: ShimQPN, Max: o.MaxAHs}
	if c.rbuf, err = c.pd.RegisterMemory(make([]byte, o.RecvDepth*c.slot), qp.AccessLocalWrite); err != nil {
		return fail(err)
	}
	if o.Reliable {
		// RD keeps every datagram until acknowledged: a slot each. A UD
		// datagram leaves from the caller's buffer (WriteTo).
		if c.sbuf, err = c.pd.RegisterMemory(make([]byte, o.SendSlots*c.slot), qp.AccessLocalWrite); err != nil {
			return fail(err)
		}
	}
	if c.rcq, err = dev.CreateCQ(2 * o.RecvDepth); err != nil {
		return fail(err)
	}
	if c.scq, err = dev.CreateCQ(2 * o.SendSlots); err != nil {
		return fail(err)
	}
	typ, inline := qp.UD, c.slot
	if o.Reliable {
		typ, inline = qp.RD, rdInline
		c.reliable = true
	}
	if c.q, err = c.pd.CreateQP(qp.QPAttr{Type: typ, SendCQ: c.scq, RecvCQ: c.rcq, RD: o.RD,
		Caps: qp.QPCaps{MaxSendWR: o.SendSlots, MaxRecvWR: o.RecvDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: inline}}); err != nil {
		return fail(err)
	}
	if c.q.QPN() != ShimQPN {
		return fail(fmt.Errorf("socketshim: the QP got number %d, not %d", c.q.QPN(), ShimQPN))
	}
	if err := c.q.Activate(c.sock); err != nil {
		return fail(err)
	}
	for i := range o.RecvDepth {
		if err := c.q.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{c.rbuf.SGE(i*c.slot, c.slot)}}); err != nil {
			return fail(err)
		}
	}
	c.free = shim.NewSlots(o.SendSlots)
	c.swcs = make([]qp.WorkCompletion, o.SendSlots)
	c.dst = make([]netip.AddrPort, o.SendSlots)
	c.serrs = map[netip.AddrPort]*SendError{}
	return c, nil
}

// Device returns the PacketConn's device (for its counters).
func (c *PacketConn) Device() *qp.Device { return c.dev }

// LocalAddr returns the local address.
func (c *PacketConn) LocalAddr() net.Addr { return net.UDPAddrFromAddrPort(c.sock.LocalAddr()) }

// ReadFrom reads the next datagram into b; a longer one is cut to
// len(b), as a UDP socket does.
func (c *PacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, ap, err := c.ReadFromUDPAddrPort(b)
	if err != nil {
		return n, nil, err
	}
	return n, net.UDPAddrFromAddrPort(ap), nil
}

// ReadFromUDPAddrPort is ReadFrom without the allocation of a net.Addr.
func (c *PacketConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	if c.isClosed() {
		return 0, netip.AddrPort{}, c.opErr("read", errClosed)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.isClosed() {
			return 0, netip.AddrPort{}, c.opErr("read", errClosed)
		}
		if c.rcq.Poll(c.rwc[:]) == 1 {
			wc := &c.rwc[0]
			off := int(wc.ID) * c.slot
			n := 0
			if wc.Status == qp.Success {
				n = copy(b, c.rbuf.Bytes()[off:off+int(wc.Len)])
			}
			src := wc.Source
			if err := c.q.PostRecv(&qp.RecvWR{ID: wc.ID, SGL: []qp.SGE{c.rbuf.SGE(off, c.slot)}}); err != nil {
				return 0, netip.AddrPort{}, c.opErr("read", err)
			}
			if wc.Status != qp.Success {
				continue // flushed or too long for a slot: nothing a socket would return
			}
			return n, src, nil
		}
		if err := c.wait(c.rcq, &c.Read, c.ReadKick); err != nil {
			return 0, netip.AddrPort{}, c.opErr("read", err)
		}
	}
}

// wait parks until cq may have a completion, the deadline passes (or
// moves), or the connection closes; it spins a little first (park).
func (c *PacketConn) wait(cq *qp.CQ, dl *atomic.Int64, kick chan struct{}) error {
	return shim.Park(c.dev, cq, nil, dl, kick, c.closed, nil, 0)
}

// WriteTo sends b to addr as one datagram. On a Reliable PacketConn it
// returns instead the failure of an earlier datagram to addr that the
// stack could not deliver (a *SendError; see WriteToUDPAddrPort).
func (c *PacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	var ap netip.AddrPort
	switch a := addr.(type) {
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		p, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return 0, c.opErr("write", fmt.Errorf("socketshim: address %v: %w", addr, err))
		}
		ap = p
	}
	return c.WriteToUDPAddrPort(b, ap)
}

// WriteToUDPAddrPort is WriteTo for a netip.AddrPort.
//
// On a Reliable PacketConn a datagram is on its way when WriteTo returns:
// RD reports its fate later, in a completion. A datagram it could not
// deliver (its peer acknowledged nothing within the retry limit, had no
// receive posted through the receiver-not-ready retries, or restarted
// meanwhile) is reported, as an ICMP error is on a connected UDP socket,
// by the next WriteTo to the same destination: that call sends nothing
// and returns a *net.OpError whose Addr is the destination, wrapping a
// *SendError with the completion status and how many datagrams to it
// failed since the last report. The next WriteTo sends again (RD then
// contacts the peer anew). A failure to a destination never written to
// again is reported by Close (UndeliveredError).
func (c *PacketConn) WriteToUDPAddrPort(b []byte, ap netip.AddrPort) (int, error) {
	if len(b) > c.slot {
		return 0, c.opErr("write", fmt.Errorf("socketshim: a %d-byte datagram, at most %d: %w", len(b), c.slot, errMessageTooLong))
	}
	if c.isClosed() { // not waiting on the lock a lingering Close holds
		return 0, c.opErr("write", errClosed)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.isClosed() {
		return 0, c.opErr("write", errClosed)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if c.reliable && (ap.Addr().IsMulticast() || ap.Addr() == limitedBroadcast) {
		return 0, c.opErr("write", errReliableGroup)
	}
	if ap.Addr() == limitedBroadcast && !c.sock.Broadcast() {
		return 0, c.opErr("write", syscall.EACCES) // as sendto without SO_BROADCAST
	}
	ah, err := c.ahs.Get(ap)
	if err != nil {
		return 0, c.opErr("write", err)
	}
	if c.reliable {
		// RD completes every send when the peer acknowledges it (or it
		// fails); take what has completed, so the CQ never holds more than
		// the send queue, and report a failure to ap.
		c.drain()
		if err := c.sendErr(ap); err != nil {
			return 0, err
		}
	} else {
		// Inline, whatever its size: a UD send that goes out at once (the
		// QP has nothing queued and the socket takes it) is gathered from
		// b by the kernel's copy alone; one that must wait is copied into
		// the send queue at post. No slot, no completion (UD sends only
		// fail locally, as a datagram a socket drops).
		c.wr = qp.SendWR{ID: inlineID, Inline: b, AH: ah}
		err := c.post(&c.wr)
		c.wr.Inline = nil
		if err != nil {
			return 0, c.opErr("write", err)
		}
		return len(b), nil
	}
	// RD: a slot for every send, so that its completion names the
	// destination (the send queue holds SendSlots WRs: the slots cost no
	// concurrency), and for the copy of b that RD keeps until it is
	// acknowledged.
	i, ok := c.free.Take()
	for ; !ok; i, ok = c.free.Take() {
		if err := c.reap(); err != nil {
			return 0, c.opErr("write", err)
		}
		if err := c.sendErr(ap); err != nil {
			return 0, err
		}
	}
	c.wr = qp.SendWR{ID: uint64(i), Flags: qp.FlagSignaled, AH: ah}
	if len(b) <= rdInline {
		c.wr.Inline = b // copied at post
	} else {
		off := i * c.slot
		copy(c.sbuf.Bytes()[off:], b)
		c.sge[0] = c.sbuf.SGE(off, len(b))
		c.wr.SGL = c.sge[:]
	}
	c.dst[i] = ap
	err = c.post(&c.wr)
	c.wr.Inline = nil
	if err != nil {
		c.free.Put(i)
		return 0, c.opErr("write", err)
	}
	return len(b), nil
}

// SendError reports datagrams a Reliable PacketConn's stack could not
// deliver to Addr: their RD Sends completed with Status
// (qp.RetryExceededError: the peer acknowledged nothing within the retry
// limit; qp.RNRRetryExceededError: it had no receive posted;
// qp.RemoteAbortedError: it restarted while they were in flight, and they
// may or may not have arrived; qp.WRFlushError: the QP failed before they
// were done). WriteTo returns it, in a *net.OpError, on the next call to
// Addr; Count datagrams to Addr failed since the last report, Status is
// the first one's. Close returns those no WriteTo reported, in an
// *UndeliveredError.
type SendError struct {
	Addr   netip.AddrPort
	Status qp.Status
	Count  int
}

func (e *SendError) Error() string {
	s := "a datagram"
	if e.Count > 1 {
		s = fmt.Sprintf("%d datagrams", e.Count)
	}
	return fmt.Sprintf("socketshim: %s to %v not delivered: %v", s, e.Addr, e.Status)
}

// UndeliveredError is what Close of a Reliable PacketConn returns, in a
// *net.OpError (Op "close"), when it leaves datagrams written to it
// neither known delivered nor reported. Pending datagrams RD still held
// when Close stopped waiting (Options.Linger): sent and not acknowledged
// (they may or may not have arrived), or still waiting for the peer's
// handshake or window (they were not sent); they are dropped. Failed
// datagrams failed (see SendError) and no WriteTo reported them:
// SendErrors gives them by destination (at most Options.MaxAHs
// destinations, as WriteTo keeps them; Failed counts them all). The
// connection is closed all the same.
type UndeliveredError struct {
	Pending    int
	Failed     int
	SendErrors []*SendError
}

func (e *UndeliveredError) Error() string {
	s := "socketshim: closed with"
	if e.Pending > 0 {
		s += fmt.Sprintf(" %d datagram(s) not delivered (RD still held them: unacknowledged, or not sent)", e.Pending)
		if e.Failed > 0 {
			s += " and"
		}
	}
	if e.Failed > 0 {
		s += fmt.Sprintf(" %d failed datagram(s) not reported", e.Failed)
		for i, se := range e.SendErrors {
			if i == 4 {
				s += fmt.Sprintf("; %d more destinations", len(e.SendErrors)-i)
				break
			}
			sep := ": "
			if i > 0 {
				sep = "; "
			}
			s += fmt.Sprintf("%s%d to %v (%v)", sep, se.Count, se.Addr, se.Status)
		}
	}
	return s
}

// Unwrap returns the SendErrors, for errors.As.
func (e *UndeliveredError) Unwrap() []error {
	errs := make([]error, len(e.SendErrors))
	for i, se := range e.SendErrors {
		errs[i] = se
	}
	return errs
}

// sent takes a send completion: it frees the slot and, on RD, keeps a
// failure for the next WriteTo to its destination, or for Close. (The
// completions of the QP's flush when the device closes are never polled:
// Close counts what they would have reported first.)
func (c *PacketConn) sent(wc *qp.WorkCompletion) {
	if wc.ID == inlineID {
		return
	}
	i := int(wc.ID)
	c.free.Put(i)
	if !c.reliable || wc.Status == qp.Success {
		return
	}
	ap := c.dst[i]
	if e := c.serrs[ap]; e != nil {
		e.Count++
		return
	}
	if len(c.serrs) < c.ahs.Max { // bounded as the AH cache is
		c.serrs[ap] = &SendError{Addr: ap, Status: wc.Status, Count: 1}
		return
	}
	c.lost++
}

// sendErr returns (and forgets) the failure kept for ap, if any.
func (c *PacketConn) sendErr(ap netip.AddrPort) error {
	e := c.serrs[ap]
	if e == nil {
		return nil
	}
	delete(c.serrs, ap)
	return &net.OpError{Op: "write", Net: "udp", Source: c.LocalAddr(), Addr: net.UDPAddrFromAddrPort(ap), Err: e}
}

// post posts wr, reaping completions while the send queue is full.
func (c *PacketConn) post(wr *qp.SendWR) error {
	for {
		err := c.q.PostSend(wr)
		if err == nil || !errors.Is(err, qp.ErrQueueFull) {
			return err
		}
		if !c.reliable {
			// UD: the queue holds datagrams the datamover has yet to send
			// (the socket is full); unsignaled ones complete silently, so
			// there is nothing to wait on but time.
			if shim.Expired(&c.Write) {
				return os.ErrDeadlineExceeded
			}
			if c.isClosed() {
				return errClosed
			}
			time.Sleep(10 * time.Microsecond)
			continue
		}
		if err := c.reap(); err != nil {
			return err
		}
	}
}

var errMessageTooLong = errors.New("message too long")

// rdInline is the largest datagram a Reliable PacketConn sends inline
// (copied into the send queue at post) rather than from its slot.
const rdInline = 512

// inlineID marks the completions of inline sends, which hold no slot.
const inlineID = ^uint64(0)

// drain takes whatever send completions are there, without waiting.
func (c *PacketConn) drain() {
	for {
		n := c.scq.Poll(c.swcs)
		for i := range c.swcs[:n] {
			c.sent(&c.swcs[i])
		}
		if n < len(c.swcs) {
			return
		}
	}
}

// reap takes send completions, freeing their slots, waiting for one if
// none is there (within the write deadline).
func (c *PacketConn) reap() error {
	if n := c.scq.Poll(c.swcs); n > 0 {
		for i := range c.swcs[:n] {
			c.sent(&c.swcs[i])
		}
		return nil
	}
	return c.wait(c.scq, &c.Write, c.WriteKick)
}

// Close closes the connection; blocked reads and writes return at once.
//
// A Reliable PacketConn's Close first waits, up to Options.Linger, for RD
// to finish with every datagram written — each acknowledged by its peer,
// or failed — reading the acknowledgements (and the handshakes datagrams
// to new peers wait for) meanwhile; datagrams that arrive meanwhile are
// not read. It returns an *UndeliveredError, in a *net.OpError, when it
// leaves datagrams undelivered (the linger ran out, or was negative) or
// datagrams failed that no WriteTo reported; the connection is closed
// all the same. It returns nil when every datagram written was
// acknowledged or its failure reported.
func (c *PacketConn) Close() error {
	if !shim.CloseOnce(&c.once, c.closed) {
		return c.opErr("close", errClosed)
	}
	c.wmu.Lock() // a writer in progress has returned
	defer c.wmu.Unlock()
	var err error
	if c.reliable {
		err = c.lingerOut()
	}
	c.rmu.Lock() // a reader in progress has returned
	defer c.rmu.Unlock()
	c.dev.Close()
	return err
}

// lingerWake bounds one wait of Close's linger, so that it notices a QP
// gone to the error state (whose flushed sends complete all the same).
const lingerWake = 100 * time.Millisecond

// lingerOut waits, up to c.linger, until RD has completed every Send the
// PacketConn posted, and reports what it leaves undelivered or
// unreported. Every Send holds a slot until its completion is taken, so
// the slots still taken are the datagrams RD still holds. The wait is
// CQ.Wait's: in event mode the device's receive goroutine reads the
// acknowledgements, in busy-poll mode the wait itself does. Caller holds
// wmu.
func (c *PacketConn) lingerOut() error {
	deadline := time.Now().Add(c.linger)
	for {
		c.drain()
		if c.free.Free() == len(c.swcs) || c.linger < 0 || c.q.State() == qp.StateError {
			break
		}
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(left, lingerWake))
		err := c.scq.Wait(ctx)
		cancel()
		if errors.Is(err, qp.ErrClosed) {
			break
		}
	}
	e := &UndeliveredError{Pending: len(c.swcs) - c.free.Free(), Failed: c.lost}
	for _, se := range c.serrs {
		e.Failed += se.Count
		e.SendErrors = append(e.SendErrors, se)
	}
	if e.Pending == 0 && e.Failed == 0 {
		return nil
	}
	slices.SortFunc(e.SendErrors, func(a, b *SendError) int { return a.Addr.Compare(b.Addr) })
	return &net.OpError{Op: "close", Net: "udp", Source: c.LocalAddr(), Err: e}
}

func (c *PacketConn) isClosed() bool { return shim.Done(c.closed) }

func (c *PacketConn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "udp", Source: c.LocalAddr(), Err: err}
}

// SetDeadline sets the read and write deadlines.
func (c *PacketConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline of ReadFrom calls, including one
// blocked now. It is cheap: quic-go calls it before every read.
func (c *PacketConn) SetReadDeadline(t time.Time) error {
	return c.setDeadline(&c.Read, c.ReadKick, t)
}

// SetWriteDeadline sets the deadline of WriteTo calls.
func (c *PacketConn) SetWriteDeadline(t time.Time) error {
	return c.setDeadline(&c.Write, c.WriteKick, t)
}

func (c *PacketConn) setDeadline(dl *atomic.Int64, kick chan struct{}, t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", errClosed)
	}
	shim.SetDeadline(dl, kick, t)
	return nil
}

// SetReadBuffer sets the kernel receive buffer of the UDP socket under
// the QP (quic-go probes for it); datagrams wait first in the kernel,
// then in the RecvDepth posted receives.
func (c *PacketConn) SetReadBuffer(bytes int) error { return c.sock.SetReadBuffer(bytes) }

// SetWriteBuffer sets the kernel send buffer.
func (c *PacketConn) SetWriteBuffer(bytes int) error { return c.sock.SetWriteBuffer(bytes) }

var _ net.PacketConn = (*PacketConn)(nil)

// Conn is a connected datagram socket over a PacketConn: Write sends to
// the peer, Read returns only the peer's datagrams (as a connected UDP
// socket filters them).
type Conn struct {
	*PacketConn
	peer netip.AddrPort
}

// Dial connects to address as net.Dial does, over udiwarp: on "udp",
// "udp4" or "udp6" it opens a PacketConn on an ephemeral local port and
// returns it connected (*Conn) to a peer's PacketConn; on "tcp", "tcp4"
// or "tcp6" it returns an RC stream (*RCConn) to a Listen or ListenRC
// listener (DialRC, with default options and no setup deadline).
func Dial(network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
		return DialRC(context.Background(), network, address, nil)
	case "udp", "udp4", "udp6":
		return dialUD(network, address)
	}
	return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
}

// Listen listens for RC streams on a TCP address ("tcp", "tcp4" or
// "tcp6") as net.Listen does, with default options (ListenRC). Datagram
// networks have no listener: use ListenPacket.
func Listen(network, address string) (net.Listener, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
		return ListenRC(network, address, nil)
	}
	return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
}

// dialUD opens a PacketConn on an ephemeral local port and connects it
// to address, a peer's PacketConn.
func dialUD(network, address string) (*Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		ua, rerr := net.ResolveUDPAddr(network, address)
		if rerr != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: rerr}
		}
		ap = ua.AddrPort()
	}
	local := "0.0.0.0:0"
	if ap.Addr().Unmap().Is4() {
		if ap.Addr().IsLoopback() {
			local = "127.0.0.1:0"
		}
	} else {
		local = "[::]:0"
		if ap.Addr().IsLoopback() {
			local = "[::1]:0"
		}
	}
	pc, err := ListenPacket(network, local, nil)
	if err != nil {
		return nil, err
	}
	return &Conn{PacketConn: pc, peer: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
}

// Read reads the peer's next datagram.
func (c *Conn) Read(b []byte) (int, error) {
	for {
		n, from, err := c.ReadFromUDPAddrPort(b)
		if err != nil || from == c.peer {
			return n, err
		}
	}
}

// Write sends b to the peer.
func (c *Conn) Write(b []byte) (int, error) { return c.WriteToUDPAddrPort(b, c.peer) }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(c.peer) }

var _ net.Conn = (*Conn)(nil)
