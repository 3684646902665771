package socketshim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
)

// RC sockets: a byte stream (net.Conn) over an RC queue pair (TCP + MPA),
// so that UD and RC sockets compare like for like (seed 003 has both).
//
// Each Write is cut into Sends of at most the peer's message size, each
// with an 8-byte header; Read returns the bytes of the received messages
// in order, a message over as many Reads as it takes.
//
// Credits. RC has no receiver-not-ready: a Send that finds no receive
// posted terminates the connection. So each side keeps RecvDepth data
// receives posted for the other and grants them as credits: a data
// message costs the sender one credit, and the receiver gives it back
// once the application has read the whole message and the receive is
// posted again — piggybacked on the next message it sends (the header's
// grant field), or, once a quarter of RecvDepth waits to be granted, in a
// credit-only message. A Write with no credit waits (within its
// deadline). Credit-only messages and the FIN need no credit: each side
// posts RecvDepth/T + 2 receives more than it grants (T the credit-only
// threshold), and a credit-only message carries at least T grants, each
// for a data message the peer sent — so the peer cannot have more than
// RecvDepth/T of them unread, and a credit message never waits for a
// credit (no deadlock between two writers waiting for each other's grants).
//
// The send queue. A message waits in the QP's send queue until TCP takes
// it, and the queue's depth is set before the peer's offer is known; so a
// side never has more data messages outstanding (sent, not yet granted
// back) than its queue holds beside the credit-only messages and the FIN
// (dataRoom), whatever the peer offers — a Write that cannot send waits
// for a grant, within its deadline, and the queue is never full. A peer
// that grants more than the receives it offered breaks the protocol and
// ends the connection.

// rcHeaderSize is the header of every message: kind, 3 bytes reserved,
// and the grant (receives posted again since the last grant).
const rcHeaderSize = 8

const (
	rcData   = 1
	rcCredit = 2
	rcFIN    = 3
)

// rcMagic opens the MPA private data both sides send: magic, version,
// receive depth and message size.
var rcMagic = [4]byte{'U', 'W', 'S', 'S'}

const rcPrivateSize = 16

// RCOptions tune an RC stream connection. The zero value is usable.
type RCOptions struct {
	// RecvDepth is how many data messages this side keeps receives posted
	// for: the credits it grants the peer (default 32, at least 4).
	RecvDepth int
	// MessageSize is the largest message this side receives, header
	// included (default and at most 65536, at least 256).
	MessageSize int
	// MPA configures the connection setup (revision, markers, CRC,
	// timeout, completion on acknowledgement). Its PrivateData is the
	// shim's own: setting it is an error.
	MPA qp.RCConfig
	// Device configures the connection's own device.
	Device qp.DeviceConfig
}

func (o *RCOptions) fill() error {
	if o.RecvDepth == 0 {
		o.RecvDepth = 32
	}
	if o.MessageSize == 0 {
		o.MessageSize = 65536
	}
	switch {
	case o.RecvDepth < 4 || o.RecvDepth > 1<<14:
		return fmt.Errorf("socketshim: RecvDepth %d, want 4..16384", o.RecvDepth)
	case o.MessageSize < 256 || o.MessageSize > 65536:
		return fmt.Errorf("socketshim: MessageSize %d, want 256..65536", o.MessageSize)
	case o.MPA.PrivateData != nil:
		return errors.New("socketshim: RCOptions.MPA.PrivateData is the shim's own")
	}
	return nil
}

func (o *RCOptions) private() []byte {
	b := make([]byte, rcPrivateSize)
	copy(b, rcMagic[:])
	b[4] = 1 // version
	binary.BigEndian.PutUint32(b[8:], uint32(o.RecvDepth))
	binary.BigEndian.PutUint32(b[12:], uint32(o.MessageSize))
	return b
}

// parsePrivate reads a peer's private data: its receive depth and message size.
func parsePrivate(b []byte) (depth, size int, err error) {
	if len(b) < rcPrivateSize || [4]byte(b[:4]) != rcMagic || b[4] != 1 {
		return 0, 0, fmt.Errorf("socketshim: the peer is not a socketshim RC socket (private data %x)", b)
	}
	depth, size = int(binary.BigEndian.Uint32(b[8:])), int(binary.BigEndian.Uint32(b[12:]))
	if depth < 1 || depth > 1<<14 || size <= rcHeaderSize || size > 65536 {
		return 0, 0, fmt.Errorf("socketshim: the peer offers %d receives of %d bytes", depth, size)
	}
	return depth, size, nil
}

// ErrConnLost is the error of a read or write on an RC connection whose
// peer went away without closing it (TCP reset or end of stream, or an
// MPA or DDP error that terminated it). errors.Is(err,
// syscall.ECONNRESET) is true for it.
var ErrConnLost = fmt.Errorf("socketshim: RC connection lost: %w", syscall.ECONNRESET)

// errWriteClosed is a Write after CloseWrite or Close began.
var errWriteClosed = fmt.Errorf("socketshim: write after CloseWrite: %w", syscall.EPIPE)

// RCConn is a stream connection over an RC queue pair: a net.Conn with
// deadlines as net.TCPConn's and CloseWrite. See the package comment.
type RCConn struct {
	dev      *qp.Device
	q        *qp.QP
	rcq, scq *qp.CQ
	rbuf     *qp.MR
	slot     int // our message size: one receive's bytes
	peerSlot int // the peer's
	depth    int // data receives we grant
	thresh   int // grants that make a credit-only message
	local    *net.TCPAddr
	remote   *net.TCPAddr
	closed   chan struct{}
	once     sync.Once
	dl       shim.Deadlines
	bell     shim.Bell

	pmu sync.Mutex // polls rcq
	wcs []qp.WorkCompletion

	mu        sync.Mutex
	credits   int // data messages the peer lets us send
	peerDepth int // receives the peer offered: credits never exceed it
	dataRoom  int // data messages outstanding at most (the send queue's share)
	ungranted int // data receives posted again, not yet granted
	inq       []rcRef
	peerFIN   bool
	finSent   bool
	finPosted bool // the FIN is posted, signaled: Close waits for its completion
	err       error
	ctl       [rcHeaderSize]byte

	rmu  sync.Mutex // one Read at a time
	cur  rcRef
	have bool

	wmu     sync.Mutex // one Write at a time
	scratch []byte
}

// rcRef is a received data message: its receive and how much of it is read.
type rcRef struct {
	id       int
	off, end int // payload bytes left: rbuf[id*slot+off : id*slot+end]
}

// finID marks the FIN's send completion.
const finID = ^uint64(0) - 1

// newRCConn opens the device, QP and receives of one connection; the
// caller connects or accepts the QP, then calls start.
func newRCConn(o *RCOptions) (*RCConn, error) {
	dev, err := qp.Open(o.Device)
	if err != nil {
		return nil, err
	}
	c := &RCConn{dev: dev, slot: o.MessageSize, depth: o.RecvDepth, thresh: max(1, o.RecvDepth/4), closed: make(chan struct{})}
	c.dl.Init()
	posted := c.depth + c.depth/c.thresh + 2
	fail := func(err error) (*RCConn, error) {
		dev.Close()
		return nil, err
	}
	pd := dev.AllocPD()
	if c.rbuf, err = pd.RegisterMemory(make([]byte, posted*c.slot), qp.AccessLocalWrite); err != nil {
		return fail(err)
	}
	sendWR := 2*posted + 8
	// Beside the data: credit-only messages (at most depth/thresh + 1 wait
	// for TCP at a time: each grants thresh of our receives) and the FIN.
	c.dataRoom = sendWR - c.depth/c.thresh - 4
	if c.rcq, err = dev.CreateCQ(2 * posted); err != nil {
		return fail(err)
	}
	if c.scq, err = dev.CreateCQ(2 * sendWR); err != nil {
		return fail(err)
	}
	if c.q, err = pd.CreateQP(qp.QPAttr{Type: qp.RC, SendCQ: c.scq, RecvCQ: c.rcq,
		Caps: qp.QPCaps{MaxSendWR: sendWR, MaxRecvWR: posted, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 65536}}); err != nil {
		return fail(err)
	}
	if err := c.q.Modify(qp.ModifyAttr{State: qp.StateInit}); err != nil {
		return fail(err)
	}
	for i := range posted {
		if err := c.repost(i); err != nil {
			return fail(err)
		}
	}
	c.wcs = make([]qp.WorkCompletion, 16)
	return c, nil
}

// start takes the peer's private data once the QP is connected.
func (c *RCConn) start(peer []byte) error {
	depth, size, err := parsePrivate(peer)
	if err != nil {
		return err
	}
	c.credits, c.peerDepth, c.peerSlot = depth, depth, size
	l, r, ok := c.q.RCAddrs()
	if !ok {
		return errors.New("socketshim: the RC QP is not connected")
	}
	c.local, c.remote = net.TCPAddrFromAddrPort(l), net.TCPAddrFromAddrPort(r)
	c.scratch = make([]byte, c.peerSlot)
	return nil
}

func (c *RCConn) repost(id int) error {
	return c.q.PostRecv(&qp.RecvWR{ID: uint64(id), SGL: []qp.SGE{c.rbuf.SGE(id*c.slot, c.slot)}})
}

// DialRC connects to an RC listener (ListenRC) at address over TCP
// ("tcp", "tcp4" or "tcp6") and MPA; ctx bounds the connection setup.
func DialRC(ctx context.Context, network, address string, opts *RCOptions) (*RCConn, error) {
	var o RCOptions
	if opts != nil {
		o = *opts
	}
	opErr := func(err error) error { return &net.OpError{Op: "dial", Net: network, Err: err} }
	if err := o.fill(); err != nil {
		return nil, opErr(err)
	}
	ta, err := resolveTCP(ctx, network, address)
	if err != nil {
		return nil, opErr(err)
	}
	c, err := newRCConn(&o)
	if err != nil {
		return nil, opErr(err)
	}
	cfg := o.MPA
	cfg.PrivateData = o.private()
	peer, err := c.q.Connect(ctx, ta.String(), cfg)
	if err == nil {
		err = c.start(peer)
	}
	if err != nil {
		c.dev.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Addr: ta, Err: err}
	}
	return c, nil
}

func resolveTCP(ctx context.Context, network, address string) (*net.TCPAddr, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, net.UnknownNetworkError(network)
	}
	if ap, err := netip.ParseAddrPort(address); err == nil {
		ta := net.TCPAddrFromAddrPort(ap)
		if (network == "tcp4" && !ap.Addr().Unmap().Is4()) || (network == "tcp6" && !ap.Addr().Is6()) {
			return nil, &net.AddrError{Err: "address of the wrong family for " + network, Addr: address}
		}
		return ta, nil
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, map[string]string{"tcp": "ip", "tcp4": "ip4", "tcp6": "ip6"}[network], host)
	if err != nil {
		return nil, err
	}
	p, err := net.DefaultResolver.LookupPort(ctx, network, port)
	if err != nil {
		return nil, err
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ips[0].Unmap(), uint16(p))), nil
}

// poll takes the receive CQ's completions: data messages queue for Read,
// grants add credits, FIN marks the end, a failed receive the
// connection's loss. It rings the shim.Bell when something changed.
func (c *RCConn) poll() {
	c.pmu.Lock()
	changed := false
	for {
		n := c.rcq.Poll(c.wcs)
		if n == 0 {
			break
		}
		changed = true
		c.mu.Lock()
		for i := range c.wcs[:n] {
			c.handleLocked(&c.wcs[i])
		}
		c.maybeGrantLocked()
		c.mu.Unlock()
	}
	c.pmu.Unlock()
	if changed {
		c.bell.Ring()
	}
}

func (c *RCConn) handleLocked(wc *qp.WorkCompletion) {
	if wc.Status != qp.Success {
		c.failLocked(ErrConnLost)
		return
	}
	id := int(wc.ID)
	b := c.rbuf.Bytes()[id*c.slot : id*c.slot+int(wc.Len)]
	if len(b) < rcHeaderSize {
		c.failLocked(fmt.Errorf("socketshim: a %d-byte message, shorter than the header", len(b)))
		return
	}
	c.credits += int(binary.BigEndian.Uint32(b[4:]))
	if c.credits > c.peerDepth {
		c.failLocked(fmt.Errorf("socketshim: the peer granted %d credits, more than the %d receives it offered", c.credits, c.peerDepth))
		return
	}
	switch b[0] {
	case rcData:
		if len(b) > rcHeaderSize {
			c.inq = append(c.inq, rcRef{id: id, off: rcHeaderSize, end: len(b)})
			return
		}
		c.ungranted++ // empty: nothing to read
	case rcCredit:
	case rcFIN:
		c.peerFIN = true
	default:
		c.failLocked(fmt.Errorf("socketshim: a message of unknown kind %d", b[0]))
		return
	}
	if err := c.repost(id); err != nil {
		c.failLocked(err)
	}
}

// failLocked records the connection's first error and ends the QP.
func (c *RCConn) failLocked(err error) {
	if c.err == nil {
		c.err = err
		if !errors.Is(err, ErrConnLost) {
			c.q.Modify(qp.ModifyAttr{State: qp.StateError})
		}
	}
}

// maybeGrantLocked sends a credit-only message once enough grants wait.
func (c *RCConn) maybeGrantLocked() {
	if c.ungranted >= c.thresh && c.err == nil {
		c.sendLocked(rcCredit, nil, 0)
	}
}

// sendLocked posts a message carrying every pending grant: a credit-only
// message or the FIN (payload nil), or data (payload is the message,
// its header left for this to fill).
func (c *RCConn) sendLocked(kind byte, payload []byte, flags qp.SendFlags) error {
	b := payload
	if b == nil {
		b = c.ctl[:]
	}
	id := uint64(0)
	if kind == rcFIN {
		id = finID
	}
	var full time.Time
	for {
		g := c.ungranted
		b[0] = kind
		b[1], b[2], b[3] = 0, 0, 0
		binary.BigEndian.PutUint32(b[4:], uint32(g))
		err := c.q.PostSend(&qp.SendWR{ID: id, Opcode: qp.OpSend, Flags: flags, Inline: b})
		if err == nil {
			c.ungranted -= g
			return nil
		}
		if !errors.Is(err, qp.ErrQueueFull) {
			if errors.Is(err, qp.ErrQPState) {
				err = ErrConnLost
			}
			return err
		}
		// Cannot happen: the credits and dataRoom keep the queue from
		// filling (see the package comment). Should it, TCP takes what
		// waits in a moment — or gives up with the connection, and then
		// so does this, within closeLinger.
		if full.IsZero() {
			full = time.Now()
		} else if time.Since(full) > closeLinger {
			return err
		}
		c.mu.Unlock()
		time.Sleep(20 * time.Microsecond)
		c.mu.Lock()
		if c.isClosed() && kind != rcFIN {
			return errClosed
		}
	}
}

// Read reads the next bytes of the stream: from the message being read,
// and from the messages after it that have arrived, without waiting for
// more once it has some. io.EOF follows the peer's Close or CloseWrite.
func (c *RCConn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.isClosed() {
			return 0, c.opErr("read", errClosed)
		}
		if shim.Expired(&c.dl.Read) {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		if len(b) == 0 {
			return 0, nil
		}
		rang := c.bell.C()
		c.poll()
		if n := c.copyOut(b); n > 0 {
			return n, nil
		}
		c.mu.Lock()
		fin, err := c.peerFIN, c.err
		c.mu.Unlock()
		if fin {
			return 0, io.EOF
		}
		if err != nil {
			return 0, c.opErr("read", err)
		}
		if err := shim.Park(c.dev, c.rcq, nil, &c.dl.Read, c.dl.ReadKick, c.closed, rang, 0); err != nil {
			return 0, c.opErr("read", err)
		}
	}
}

// copyOut copies what has arrived into b; a message read to its end has
// its receive posted again (and granted, in time).
func (c *RCConn) copyOut(b []byte) int {
	n := 0
	buf := c.rbuf.Bytes()
	for n < len(b) {
		if !c.have {
			c.mu.Lock()
			if len(c.inq) == 0 {
				c.mu.Unlock()
				break
			}
			c.cur = c.inq[0]
			c.inq = c.inq[1:]
			if len(c.inq) == 0 {
				c.inq = c.inq[:0:0] // let the backing array go
			}
			c.mu.Unlock()
			c.have = true
		}
		base := c.cur.id * c.slot
		k := copy(b[n:], buf[base+c.cur.off:base+c.cur.end])
		n += k
		c.cur.off += k
		if c.cur.off == c.cur.end {
			c.have = false
			c.mu.Lock()
			if err := c.repost(c.cur.id); err != nil {
				c.failLocked(err)
			} else {
				c.ungranted++
				c.maybeGrantLocked()
			}
			c.mu.Unlock()
		}
	}
	return n
}

// Write writes b as messages of at most the peer's message size, each
// waiting for a credit (within the write deadline). On an error it
// returns how many bytes were sent.
func (c *RCConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	done := 0
	for {
		if c.isClosed() {
			return done, c.opErr("write", errClosed)
		}
		if shim.Expired(&c.dl.Write) {
			return done, c.opErr("write", os.ErrDeadlineExceeded)
		}
		if done == len(b) {
			return done, nil
		}
		rang := c.bell.C()
		c.poll()
		c.mu.Lock()
		switch {
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return done, c.opErr("write", err)
		case c.finSent:
			c.mu.Unlock()
			return done, c.opErr("write", errWriteClosed)
		case c.credits > 0 && c.peerDepth-c.credits < c.dataRoom:
			n := min(len(b)-done, c.peerSlot-rcHeaderSize)
			msg := c.scratch[:rcHeaderSize+n]
			copy(msg[rcHeaderSize:], b[done:done+n])
			if err := c.sendLocked(rcData, msg, 0); err != nil {
				c.mu.Unlock()
				return done, c.opErr("write", err)
			}
			c.credits--
			c.mu.Unlock()
			done += n
			continue
		}
		c.mu.Unlock()
		if err := shim.Park(c.dev, c.rcq, nil, &c.dl.Write, c.dl.WriteKick, c.closed, rang, 0); err != nil {
			return done, c.opErr("write", err)
		}
	}
}

// CloseWrite sends the FIN: the peer reads what was written, then io.EOF.
// Reading goes on; writing fails from now on.
func (c *RCConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.isClosed() {
		return c.opErr("close", errClosed)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.opErr("close", c.err)
	}
	if c.finSent {
		return nil
	}
	c.finSent = true
	// Signaled, on the peer's acknowledgement: Close waits for its
	// completion, which says everything written before it reached the
	// peer (see finFlags).
	if err := c.sendLocked(rcFIN, nil, finFlags); err != nil {
		return c.opErr("close", err)
	}
	c.finPosted = true
	return nil
}

// finFlags are the FIN's: its completion tells Close that the peer's TCP
// acknowledged it, and so everything before it. That TCP took it is not
// enough: the peer's credit-only messages, which no application reads,
// may sit unread in the socket when Close closes it, and closing a
// socket with unread input resets the connection (RFC 2525 §2.17),
// throwing away what TCP still holds — the stream's tail and the FIN.
// What the peer acknowledged, a reset cannot take back.
const finFlags = qp.FlagSignaled | qp.FlagCompleteOnAck

// closeLinger bounds how long Close waits for the peer to acknowledge the
// FIN.
const closeLinger = 2 * time.Second

// Close closes the connection: blocked reads and writes return at once;
// what Write sent goes to TCP, then the FIN (or the one CloseWrite sent:
// Close waits for it all the same), and Close waits, up to closeLinger,
// until the peer's TCP acknowledged the FIN, so the peer reads it all and
// then io.EOF even if the connection then resets.
func (c *RCConn) Close() error {
	if !shim.CloseOnce(&c.once, c.closed) {
		return c.opErr("close", errClosed)
	}
	c.rmu.Lock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	defer c.rmu.Unlock()
	c.mu.Lock()
	if c.err == nil && !c.finSent {
		c.finSent = true
		c.finPosted = c.sendLocked(rcFIN, nil, finFlags) == nil
	}
	fin := c.finPosted // by Close or by CloseWrite: wait for it either way
	c.mu.Unlock()
	if fin {
		// Sends complete in order: the FIN's completion says the peer's
		// TCP has everything before it (finFlags).
		ctx, cancel := context.WithTimeout(context.Background(), closeLinger)
		wcs := make([]qp.WorkCompletion, 16)
	wait:
		for {
			n := c.scq.Poll(wcs)
			for _, wc := range wcs[:n] {
				if wc.ID == finID {
					break wait
				}
			}
			if n == 0 && c.scq.Wait(ctx) != nil {
				break
			}
		}
		cancel()
	}
	return c.dev.Close()
}

func (c *RCConn) isClosed() bool { return shim.Done(c.closed) }

func (c *RCConn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.local, Addr: c.remote, Err: err}
}

// LocalAddr returns the local TCP address.
func (c *RCConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's TCP address.
func (c *RCConn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets the read and write deadlines.
func (c *RCConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline of Read calls, including one blocked
// now: one in the past interrupts it at once.
func (c *RCConn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", errClosed)
	}
	shim.SetDeadline(&c.dl.Read, c.dl.ReadKick, t)
	return nil
}

// SetWriteDeadline sets the deadline of Write calls, including one
// blocked now waiting for credits.
func (c *RCConn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", errClosed)
	}
	shim.SetDeadline(&c.dl.Write, c.dl.WriteKick, t)
	return nil
}

// Device returns the connection's device (for its counters).
func (c *RCConn) Device() *qp.Device { return c.dev }

var _ net.Conn = (*RCConn)(nil)

// RCListener accepts RC stream connections: a net.Listener.
type RCListener struct {
	dev    *qp.Device
	l      *qp.RCListener
	opts   RCOptions
	addr   *net.TCPAddr
	closed chan struct{}
	once   sync.Once
}

// ListenRC listens for RC stream connections (DialRC) on a TCP address
// ("tcp", "tcp4" or "tcp6"). Each accepted connection has its own
// device: closing the listener leaves them open.
func ListenRC(network, address string, opts *RCOptions) (*RCListener, error) {
	var o RCOptions
	if opts != nil {
		o = *opts
	}
	opErr := func(err error) error { return &net.OpError{Op: "listen", Net: network, Err: err} }
	if err := o.fill(); err != nil {
		return nil, opErr(err)
	}
	ta, err := resolveTCP(context.Background(), network, address)
	if err != nil {
		return nil, opErr(err)
	}
	dev, err := qp.Open(o.Device)
	if err != nil {
		return nil, opErr(err)
	}
	l, err := dev.ListenRC(ta.String())
	if err != nil {
		dev.Close()
		return nil, opErr(err)
	}
	return &RCListener{dev: dev, l: l, opts: o, addr: net.TCPAddrFromAddrPort(l.Addr()), closed: make(chan struct{})}, nil
}

// Accept waits for the next connection. A request that is not a
// socketshim RC socket's, or whose setup fails, is refused and skipped.
func (l *RCListener) Accept() (net.Conn, error) { return l.AcceptRC() }

// AcceptRC is Accept returning the *RCConn.
func (l *RCListener) AcceptRC() (*RCConn, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		r, err := l.l.Next(ctx)
		if err != nil {
			return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.addr, Err: errClosed}
		}
		if c, err := l.accept(r); err == nil {
			return c, nil
		}
	}
}

func (l *RCListener) accept(r *qp.RCRequest) (*RCConn, error) {
	peer := r.PrivateData()
	if _, _, err := parsePrivate(peer); err != nil {
		r.Reject([]byte(err.Error()))
		return nil, err
	}
	o := l.opts
	c, err := newRCConn(&o)
	if err != nil {
		r.Reject(nil)
		return nil, err
	}
	cfg := o.MPA
	cfg.PrivateData = o.private()
	if err := r.Accept(c.q, cfg); err != nil {
		c.dev.Close()
		return nil, err
	}
	if err := c.start(peer); err != nil {
		c.dev.Close()
		return nil, err
	}
	return c, nil
}

// Close stops listening; connections already accepted stay open.
func (l *RCListener) Close() error {
	if !shim.CloseOnce(&l.once, l.closed) {
		return &net.OpError{Op: "close", Net: "tcp", Addr: l.addr, Err: errClosed}
	}
	l.l.Close()
	return l.dev.Close()
}

// Addr returns the listener's address.
func (l *RCListener) Addr() net.Addr { return l.addr }

var _ net.Listener = (*RCListener)(nil)
