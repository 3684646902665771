package qp

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// RC: standard iWARP — RDMAP (RFC 5040) over DDP (RFC 5041, DV = 1) over
// MPA (RFC 5044, with RFC 6581's enhanced connection setup) over TCP. It
// is the baseline every datagram result is compared with, so it is built
// as a real stack: MPA markers and CRC negotiated and implemented both
// ways, IRD/ORD negotiated, Terminate messages with the RFC codes, and no
// goroutine per connection: one per device waits on every RC socket
// (epoll) and sends what the sockets could not take at once.

// RCConfig sets up one RC connection.
type RCConfig struct {
	// Revision is the MPA revision: 2 (default: RFC 6581, IRD/ORD and a
	// ready-to-receive message) or 1 (RFC 5044).
	Revision uint8
	// Markers asks the peer to put MPA markers in the FPDUs it sends us
	// (M); we put them in ours when the peer asks.
	Markers bool
	// NoCRC leaves C clear; CRC32c is on if either side sets it.
	NoCRC bool
	// IRD and ORD: Read Requests this side serves at once, and issues at
	// once (default 16 each; negotiated with the peer's in revision 2).
	IRD, ORD int
	// PrivateData goes in the MPA Request or Reply (at most 512 bytes,
	// less the IRD/ORD word in revision 2).
	PrivateData []byte
	// Timeout bounds the MPA exchange (default 5 s).
	Timeout time.Duration
	// CompleteOnAck completes a send WR only when the peer's TCP
	// acknowledged its last byte (the socket's unacknowledged bytes,
	// SIOCOUTQ, seed 002), instead of when TCP took it.
	CompleteOnAck bool
	// WaitForRecv has a Send that finds no receive posted wait for one
	// instead of ending the stream with a Terminate (RFC 5041 §7.2, no
	// buffer): the QP stops reading its socket, so TCP's window holds the
	// peer back, until a PostRecv and the next Progress. Only on a
	// connection on the caller's descriptor (ConnectFD, AcceptFD): a
	// byte stream carried as Sends (the sockets preload) cannot know how
	// many receives its peer will need.
	WaitForRecv bool
}

func (c *RCConfig) fill() error {
	if c.Revision == 0 {
		c.Revision = udiwarp.MPARevision2
	}
	if c.Revision != udiwarp.MPARevision1 && c.Revision != udiwarp.MPARevision2 {
		return fmt.Errorf("%w: MPA revision %d (1 or 2)", ErrInvalidAttr, c.Revision)
	}
	if c.IRD <= 0 {
		c.IRD = 16
	}
	if c.ORD <= 0 {
		c.ORD = 16
	}
	c.IRD, c.ORD = min(c.IRD, udiwarp.MaxIRDORD-1), min(c.ORD, udiwarp.MaxIRDORD-1)
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	return nil
}

func (c *RCConfig) frame(reply, reject bool) ([]byte, error) {
	f := udiwarp.MPAFrameFields{Reply: reply, Reject: reject, Markers: c.Markers, CRC: !c.NoCRC, Revision: c.Revision,
		PrivateData: c.PrivateData}
	if c.Revision >= udiwarp.MPARevision2 {
		f.Enhanced = true
		// Peer-to-peer mode with a zero-length RDMA Write as the
		// ready-to-receive message: it needs no receive and no STag.
		f.IRDORD = udiwarp.IRDORD{PeerToPeer: true, WriteRTR: true, IRD: uint16(c.IRD), ORD: uint16(c.ORD)}
	}
	return udiwarp.AppendMPAFrame(nil, &f)
}

// ErrRejected is returned by Connect when the peer rejects the connection.
var ErrRejected = errors.New("qp: connection rejected by the peer")

// RejectError carries the private data of a rejecting MPA Reply.
type RejectError struct{ PrivateData []byte }

func (e *RejectError) Error() string {
	return fmt.Sprintf("qp: connection rejected by the peer (%d bytes of private data)", len(e.PrivateData))
}
func (e *RejectError) Unwrap() error { return ErrRejected }

// Connect connects an RC QP in INIT to the RC listener at addr: TCP, the
// MPA Request and Reply, and in revision 2 the ready-to-receive message.
// On success the QP is in RTS; the peer's private data is returned.
func (q *QP) Connect(ctx context.Context, addr string, cfg RCConfig) ([]byte, error) {
	if q.typ != RC {
		return nil, fmt.Errorf("%w: Connect on a %v QP", ErrInvalidAttr, q.typ)
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if cfg.WaitForRecv {
		return nil, fmt.Errorf("%w: WaitForRecv is for a connection on the caller's descriptor (ConnectFD)", ErrInvalidAttr)
	}
	if st := q.State(); st != StateInit {
		return nil, fmt.Errorf("%w: Connect on a QP in %v (want INIT)", ErrQPState, st)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("qp: connecting to %s: %w", addr, err)
	}
	tc := c.(*net.TCPConn)
	if dl, ok := ctx.Deadline(); ok {
		tc.SetDeadline(dl)
	}
	neg, pd, early, err := initiate(tc, &cfg)
	if err != nil {
		tc.Close()
		return nil, err
	}
	tc.SetDeadline(time.Time{})
	if err := q.attachRC(tc, -1, neg, cfg, early, true); err != nil {
		tc.Close()
		return nil, err
	}
	return pd, nil
}

// initiate runs the initiator's side of the MPA exchange on rw: the
// Request out, the Reply in. It returns what was settled, the peer's
// private data and any stream bytes read after the Reply.
func initiate(rw io.ReadWriter, cfg *RCConfig) (rcNegotiated, []byte, []byte, error) {
	var neg rcNegotiated
	req, err := cfg.frame(false, false)
	if err != nil {
		return neg, nil, nil, err
	}
	if _, err := rw.Write(req); err != nil {
		return neg, nil, nil, fmt.Errorf("qp: sending the MPA Request: %w", err)
	}
	rep, early, err := readMPAFrame(rw)
	if err != nil {
		return neg, nil, nil, err
	}
	if !rep.Reply() {
		return neg, nil, nil, fmt.Errorf("%w: the peer answered with an MPA Request", udiwarp.ErrMPAFrame)
	}
	if rep.Reject() {
		return neg, nil, nil, &RejectError{PrivateData: append([]byte(nil), rep.PrivateData()...)}
	}
	if rep.Revision() != cfg.Revision {
		return neg, nil, nil, fmt.Errorf("%w: the peer replied with MPA revision %d to our %d", udiwarp.ErrVersion, rep.Revision(), cfg.Revision)
	}
	neg = rcNegotiated{markersOut: rep.Markers(), markersIn: cfg.Markers, crc: rep.CRC() || !cfg.NoCRC, ird: cfg.IRD, ord: cfg.ORD}
	if w, ok := rep.IRDORD(); ok {
		// Our ORD must not exceed what the responder serves.
		neg.ord = min(neg.ord, int(w.IRD))
		neg.rtrSend = true
	}
	return neg, append([]byte(nil), rep.PrivateData()...), early, nil
}

// rcNegotiated is what an MPA exchange settled.
type rcNegotiated struct {
	markersOut, markersIn bool // markers in what we send / what we receive
	crc                   bool
	ird, ord              int
	rtrSend, rtrWait      bool // revision 2: send the RTR / wait for it
}

// readMPAFrame reads one MPA Request or Reply, returning it and any
// stream bytes that came after it.
func readMPAFrame(c io.Reader) (udiwarp.MPAFrame, []byte, error) {
	buf := make([]byte, 0, udiwarp.MPAFrameHeaderSize+udiwarp.MaxMPAPrivateData+64)
	tmp := make([]byte, 1024)
	for {
		m, n, need, err := udiwarp.ParseMPAFrame(buf)
		if err != nil {
			return nil, nil, err
		}
		if n > 0 {
			return m, append([]byte(nil), buf[n:]...), nil
		}
		k, rerr := c.Read(tmp[:min(len(tmp), max(need-len(buf), 1))])
		buf = append(buf, tmp[:k]...)
		if rerr != nil {
			if k > 0 {
				continue
			}
			return nil, nil, fmt.Errorf("qp: reading the MPA frame: %w", rerr)
		}
	}
}

// RCListener accepts RC connections: each arrives as an RCRequest that
// the application accepts onto a QP or rejects.
type RCListener struct {
	dev    *Device
	ln     *net.TCPListener
	reqs   chan *RCRequest
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	mu     sync.Mutex
	open   map[*RCRequest]struct{}
	closed bool
	limits handshakeLimits

	// The MPA exchanges in progress (handshakes), oldest first, and how
	// many each source address holds; under hsMu.
	hsMu   sync.Mutex
	hs     list.List
	hsBy   map[netip.Addr]int
	hsDone bool // Close ended them all: admit no more
}

// handshakeLimits bound an RCListener's MPA exchanges in progress: a TCP
// connection accepted whose MPA Request has not been read (or, read,
// waits in the queue until Next takes it). Past either count a new
// connection sheds the oldest exchange — of its own source address when
// that address holds perAddr, else of all — as a TCP server under a SYN
// flood drops its oldest half-open connections rather than refuse new
// ones: silent connections cost at most total goroutines, one source
// never holds more than perAddr of them, and a real initiator, whose
// Request follows its connect at once, is shed only if total newer
// connections arrive before that Request does.
type handshakeLimits struct {
	total, perAddr int
	timeout        time.Duration // each exchange's deadline
}

// The listener's bounds (docs/verbs.md, "RC queue pairs").
const (
	maxHandshakes        = 256
	maxHandshakesPerAddr = 16
	handshakeTimeout     = 5 * time.Second
)

var defaultHandshakeLimits = handshakeLimits{total: maxHandshakes, perAddr: maxHandshakesPerAddr, timeout: handshakeTimeout}

// handshake is one MPA exchange in progress.
type handshake struct {
	c    *net.TCPConn
	src  netip.Addr
	elem *list.Element // in RCListener.hs; nil once it left
	shed chan struct{} // closed when a newer connection shed it
}

// ListenRC listens for RC connections on a TCP address.
func (d *Device) ListenRC(addr string) (*RCListener, error) {
	return d.listenRC(addr, defaultHandshakeLimits)
}

func (d *Device) listenRC(addr string, lim handshakeLimits) (*RCListener, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("qp: listening for RC on %s: %w", addr, err)
	}
	l := &RCListener{dev: d, ln: ln.(*net.TCPListener), reqs: make(chan *RCRequest, 64), done: make(chan struct{}),
		open: map[*RCRequest]struct{}{}, limits: lim, hsBy: map[netip.Addr]int{}}
	l.wg.Add(1)
	go l.acceptLoop()
	d.rc.addListener(l)
	return l, nil
}

// Addr returns the address the listener is bound to.
func (l *RCListener) Addr() netip.AddrPort { return l.ln.Addr().(*net.TCPAddr).AddrPort() }

func (l *RCListener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE, ENFILE, ENOBUFS, a connection aborted before it was
			// taken: wait a little and go on, as net/http's Serve does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-l.done:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		h := l.admit(c)
		if h == nil {
			return // closed meanwhile
		}
		l.wg.Add(1)
		go l.handshake(h) // ends with the request queued or refused, by the deadline or when shed
	}
}

// admit enters c among the exchanges in progress, shedding the oldest
// of its source's, or of all, when that is full. It returns nil when the
// listener has closed (c is closed).
func (l *RCListener) admit(c *net.TCPConn) *handshake {
	h := &handshake{c: c, shed: make(chan struct{})}
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		h.src = a.AddrPort().Addr().Unmap()
	}
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	if l.hsDone {
		c.Close()
		return nil
	}
	if l.hsBy[h.src] >= l.limits.perAddr {
		for e := l.hs.Front(); e != nil; e = e.Next() {
			if o := e.Value.(*handshake); o.src == h.src {
				l.shedLocked(o)
				break
			}
		}
	}
	if l.hs.Len() >= l.limits.total {
		l.shedLocked(l.hs.Front().Value.(*handshake))
	}
	h.elem = l.hs.PushBack(h)
	l.hsBy[h.src]++
	return h
}

// leaveLocked takes h off the exchanges in progress; false if it was
// not on them (shed, or the listener closed).
func (l *RCListener) leaveLocked(h *handshake) bool {
	if h.elem == nil {
		return false
	}
	l.hs.Remove(h.elem)
	h.elem = nil
	if l.hsBy[h.src]--; l.hsBy[h.src] <= 0 {
		delete(l.hsBy, h.src)
	}
	return true
}

// shedLocked ends h's exchange: its connection closes, so its read
// fails, and its wait for the queue ends.
func (l *RCListener) shedLocked(h *handshake) {
	if l.leaveLocked(h) {
		close(h.shed)
		h.c.Close()
		l.dev.stats.RCHandshakesShed.Add(1)
	}
}

// leave takes h off the exchanges in progress: false when it was shed.
func (l *RCListener) leave(h *handshake) bool {
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	return l.leaveLocked(h)
}

// testHookQueued, when a test sets it, runs in a handshake's goroutine
// once its request is queued: the window in which the request may be
// the application's while the goroutine still runs.
var testHookQueued func()

// handshake reads an MPA Request (within the limits' timeout) and
// queues it.
func (l *RCListener) handshake(h *handshake) {
	defer l.wg.Done()
	c := h.c
	c.SetDeadline(time.Now().Add(l.limits.timeout))
	m, early, err := readMPAFrame(c)
	if err != nil || m.Reply() {
		if !l.leave(h) {
			return // shed: closed already
		}
		// A bogus MPA Request: RFC 5044 §7.1 has the responder close; a
		// Reply with R set tells a confused initiator why.
		if err != nil && !errors.Is(err, unix.ECONNRESET) {
			l.dev.stats.RCBadRequests.Add(1)
			rej, _ := udiwarp.AppendMPAFrame(nil, &udiwarp.MPAFrameFields{Reply: true, Reject: true, Revision: udiwarp.MPARevision1})
			c.Write(rej)
		}
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	r := &RCRequest{l: l, h: h, conn: c, req: append(udiwarp.MPAFrame(nil), m...), early: early}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.leave(h)
		c.Close()
		return
	}
	l.open[r] = struct{}{}
	l.mu.Unlock()
	select {
	case l.reqs <- r:
		if testHookQueued != nil {
			testHookQueued()
		}
		// Next takes it off the exchanges in progress (h), or finds it
		// shed meanwhile. Taking it here, after the send, left a window
		// in which a shed or Close closed a connection the application
		// had already accepted: its peer saw a reset, its QP EBADF.
	case <-h.shed:
		r.drop()
	case <-l.done:
		l.leave(h)
		r.drop()
	}
}

// Next returns the next connection request.
func (l *RCListener) Next(ctx context.Context) (*RCRequest, error) {
	for {
		select {
		case r := <-l.reqs:
			// Once off the exchanges in progress, nothing sheds it: it is
			// the caller's. One shed as it was queued is closed already.
			if !l.leave(r.h) {
				r.drop()
				continue
			}
			return r, nil
		case <-l.done:
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close stops listening; requests not yet accepted are refused.
func (l *RCListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.ln.Close()
		l.mu.Lock()
		l.closed = true
		for r := range l.open {
			r.conn.Close()
		}
		clear(l.open)
		l.mu.Unlock()
		l.hsMu.Lock() // the exchanges in progress end now, not at their deadlines
		l.hsDone = true
		for l.hs.Len() > 0 {
			h := l.hs.Front().Value.(*handshake)
			l.leaveLocked(h)
			close(h.shed)
			h.c.Close()
		}
		l.hsMu.Unlock()
	})
	l.wg.Wait()
	return nil
}

// RCRequest is an incoming RC connection waiting for Accept or Reject.
type RCRequest struct {
	l     *RCListener
	h     *handshake // its place among the exchanges in progress, until Next takes it
	conn  *net.TCPConn
	req   udiwarp.MPAFrame
	early []byte
}

// PrivateData returns the initiator's private data.
func (r *RCRequest) PrivateData() []byte { return r.req.PrivateData() }

// Peer returns the initiator's address.
func (r *RCRequest) Peer() netip.AddrPort { return r.conn.RemoteAddr().(*net.TCPAddr).AddrPort() }

// Revision returns the MPA revision the initiator asked for.
func (r *RCRequest) Revision() uint8 { return r.req.Revision() }

func (r *RCRequest) drop() {
	r.l.mu.Lock()
	delete(r.l.open, r)
	r.l.mu.Unlock()
}

// Accept answers with an MPA Reply and binds the connection to q, an RC
// QP in INIT, which then moves to RTS. The Reply carries cfg's private
// data; markers, CRC, IRD and ORD are settled with the request's.
func (r *RCRequest) Accept(q *QP, cfg RCConfig) error {
	r.drop()
	if q.typ != RC || q.State() != StateInit {
		r.conn.Close()
		return fmt.Errorf("%w: Accept onto a %v QP in %v (want an RC QP in INIT)", ErrInvalidAttr, q.typ, q.State())
	}
	if cfg.WaitForRecv {
		r.conn.Close()
		return fmt.Errorf("%w: WaitForRecv is for a connection on the caller's descriptor (AcceptFD)", ErrInvalidAttr)
	}
	neg, err := respond(r.conn, r.req, &cfg)
	if err != nil {
		r.conn.Close()
		return err
	}
	if err := q.attachRC(r.conn, -1, neg, cfg, r.early, false); err != nil {
		r.conn.Close()
		return err
	}
	return nil
}

// respond answers req, an MPA Request, with a Reply on w carrying cfg's
// private data, in the initiator's revision, and returns what was
// settled: markers, CRC, IRD and ORD with the request's.
func respond(w io.Writer, req udiwarp.MPAFrame, cfg *RCConfig) (rcNegotiated, error) {
	var neg rcNegotiated
	cfg.Revision = req.Revision() // answer in the initiator's revision
	if err := cfg.fill(); err != nil {
		return neg, err
	}
	neg = rcNegotiated{markersOut: req.Markers(), markersIn: cfg.Markers, crc: req.CRC() || !cfg.NoCRC, ird: cfg.IRD, ord: cfg.ORD}
	if w, ok := req.IRDORD(); ok {
		neg.ord = min(neg.ord, int(w.IRD))
		neg.rtrWait = w.PeerToPeer
	}
	rep, err := cfg.frame(true, false)
	if err != nil {
		return neg, err
	}
	if _, err := w.Write(rep); err != nil {
		return neg, fmt.Errorf("qp: sending the MPA Reply: %w", err)
	}
	return neg, nil
}

// Reject answers with an MPA Reply with R set, carrying privateData, and
// closes the connection.
func (r *RCRequest) Reject(privateData []byte) error {
	r.drop()
	defer r.conn.Close()
	rev := r.req.Revision()
	f := udiwarp.MPAFrameFields{Reply: true, Reject: true, Revision: rev, PrivateData: privateData}
	if rev >= udiwarp.MPARevision2 {
		f.Enhanced = true
	}
	b, err := udiwarp.AppendMPAFrame(nil, &f)
	if err != nil {
		return err
	}
	_, err = r.conn.Write(b)
	return err
}

// attachRC binds an established MPA connection to q and moves q to RTS.
// tc is nil for a connection on the caller's descriptor fd (ConnectFD,
// AcceptFD): a manual one.
func (q *QP) attachRC(tc *net.TCPConn, fd int, neg rcNegotiated, cfg RCConfig, early []byte, initiator bool) error {
	d := q.dev
	if tc != nil {
		raw, err := tc.SyscallConn()
		if err != nil {
			return err
		}
		if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
			return err
		}
		tc.SetNoDelay(true)
	} else {
		// An FPDU is a message: Nagle would hold a small one back until
		// the last is acknowledged (a delayed ACK later), as for qp's own.
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	mss := 1460
	if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG); err == nil && v > 0 {
		mss = v
	}
	c := &rcConn{q: q, tc: tc, fd: fd, manual: tc == nil, waitRecv: cfg.WaitForRecv, neg: neg, ackMode: cfg.CompleteOnAck,
		sendMSN: 1, readMSN: 1, termMSN: 1, atomicMSN: 1, rxSendMSN: 1, rxReadMSN: 1, rxTermMSN: 1, rxAtomicMSN: 1}
	// The largest ULPDU: what fits one TCP segment with MPA's 8 bytes of
	// framing, as RFC 5044 §4.1 advises (MULPDU from the EMSS); markers
	// take 4 bytes per 512 more.
	c.mulpdu = min(mss-udiwarp.MPAHeaderSize-udiwarp.CRCSize-3, udiwarp.MaxULPDU)
	if neg.markersOut {
		c.mulpdu -= (mss/udiwarp.MPAMarkerInterval + 1) * udiwarp.MPAMarkerSize
	}
	c.mulpdu = max(c.mulpdu, 256)
	c.framer = udiwarp.MPAFramer{Markers: neg.markersOut, CRC: neg.crc}
	c.deframer = udiwarp.MPADeframer{Markers: neg.markersIn, CRC: neg.crc}
	rxCap := 16 << 10
	if c.manual {
		rxCap = 4 << 10 // one per socket of a program that may have thousands
	}
	c.rx = make([]byte, 0, rxCap) // grows, doubling, while reads fill it
	c.rx = append(c.rx, early...)
	c.rtrPending = neg.rtrWait
	q.sqMu.Lock()
	if q.State() != StateInit || q.rc.Load() != nil {
		q.sqMu.Unlock()
		return fmt.Errorf("%w: the QP left INIT or is connected", ErrQPState)
	}
	q.rc.Store(c)
	q.state.Store(uint32(StateRTS))
	q.sqMu.Unlock()
	if err := d.rc.register(c); err != nil {
		return err
	}
	if neg.rtrSend {
		// The ready-to-receive message: a zero-length RDMA Write.
		c.mu.Lock()
		c.queue = append(c.queue, &rcMsg{op: opRTR, internal: true})
		c.pumpLocked()
		c.mu.Unlock()
	}
	if len(early) > 0 {
		c.onReadable()
	}
	return nil
}
