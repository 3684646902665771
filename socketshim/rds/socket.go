package rds

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/reliability"
)

// QPN is the QP number of every Socket's RD QP: each Socket has its own
// device, whose first QP is number 1, so a peer is addressed by its UDP
// address alone.
const QPN = 1

// Options tune a Socket. The zero value is usable.
type Options struct {
	// MaxTransfer is the largest mapping and the largest RDMA operation,
	// in bytes (default 1 MiB, RDS's fmr_message_size).
	MaxTransfer int
	// MaxMappings is the most mappings a socket holds at once, counting
	// released ones not yet invalidated (default 2048, RDS's
	// fmr_pool_size). Over it, mapping fails with ErrMappingLimit.
	MaxMappings int
	// LazyFlush is how many released mappings wait before they are
	// invalidated together (default 32).
	LazyFlush int
	// MaxMessage is the longest message (default, and at most, what one
	// RD datagram carries: about 65 KB). Smaller values save memory:
	// every receive and send slot is this large.
	MaxMessage int
	// RecvDepth is how many received messages can wait for RecvMsg
	// (default 64); beyond, peers are told to retry later.
	RecvDepth int
	// SendSlots is how many messages, RDMA ACKs included, can be on their
	// way out (default 64); SendMsg waits for a free one.
	SendSlots int
	// MaxNotifications bounds the queue of notifications (default 1024).
	MaxNotifications int
	// MaxPeerCookies bounds the cookies the socket remembers from RDMA
	// requests it received (default 4096). Past it, the oldest cookie of
	// the hosts (IP addresses) that hold the most is forgotten, so that
	// no host's requests flush the cookies of one that holds fewer.
	MaxPeerCookies int
	// RD tunes the RD QP's reliability. RNRRetries 0 means no limit here
	// (not reliability's 7): a peer that is slow to read holds messages
	// back rather than losing them.
	RD qp.RDConfig
	// Device configures the socket's device (event polling only).
	Device qp.DeviceConfig
}

func (o *Options) fill() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxTransfer, 1<<20)
	def(&o.MaxMappings, 2048)
	def(&o.LazyFlush, 32)
	def(&o.RecvDepth, 64)
	def(&o.SendSlots, 64)
	def(&o.MaxNotifications, 1024)
	def(&o.MaxPeerCookies, 4096)
	if o.RD.RNRRetries == 0 {
		o.RD.RNRRetries = -1
	}
}

// Stats are a socket's counters.
type Stats struct {
	Mappings       int    // mappings held
	Released       int    // released mappings not yet invalidated
	Invalidated    uint64 // mappings invalidated
	PeerCookies    int    // cookies remembered from peers' RDMA requests
	Operations     uint64 // RDMA operations ended
	Succeeded      uint64 // of which successful
	RDMABytes      uint64 // bytes moved by successful RDMA operations
	MessagesSent   uint64 // messages (ACKs included) delivered to their peer
	MessagesLost   uint64 // messages the stack gave up on (peer gone)
	MessagesRecv   uint64
	BadMessages    uint64 // received Sends that were not messages of this protocol
	Notifications  uint64 // notifications queued
	NotifyOverflow uint64 // notifications lost: RECVERR turned on after admission, queue full
}

// mapping is a memory range this socket mapped for peers.
type mapping struct {
	mr    *qp.MR
	flags MapFlags
}

// peerCookie is what a server knows of a client's cookie.
type peerCookie struct {
	req  request
	used bool // a UseOnce cookie an operation was started with
}

type peerKey struct {
	peer   netip.AddrPort
	cookie Cookie
}

// op is an outgoing message, and the RDMA operation it is the ACK of.
type op struct {
	id        uint64
	peer      netip.AddrPort
	ah        *qp.AH
	slot      int
	size      int // header and message
	args      bool
	token     uint32
	notify    bool
	reserved  bool // a notification slot is held for it
	status    Status
	pending   int // RDMA work requests not completed
	bytes     uint64
	local     []*qp.MR
	queued    bool // waiting in its peer's queue for its ACK to be posted
	canceled  bool
	ackPosted bool
	done      bool
}

// incoming is a received message waiting for RecvMsg.
type incoming struct {
	slot, off, n int
	from         netip.AddrPort
	ctrl         []Control
}

// WR IDs: the op's number, and which of its work requests.
const (
	wrShift = 5
	wrAck   = 1<<wrShift - 1
)

const maxNotesPerRecv = 64

// Socket is an RDS socket with the zerocopy interface over an RD QP.
type Socket struct {
	dev    *qp.Device
	sock   *qp.Socket
	pd     *qp.PD
	q      *qp.QP
	rcq    *qp.CQ
	scq    *qp.CQ
	rbuf   *qp.MR
	sbuf   *qp.MR
	slot   int // bytes per receive or send slot
	maxMsg int
	opt    Options
	v4     bool

	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	rmu sync.Mutex // one RecvMsg at a time
	dl  shim.Deadlines

	mu       sync.Mutex
	readable chan struct{} // closed when RecvMsg may have something; then replaced
	slotFree chan struct{} // closed when a send slot is freed; then replaced
	free     shim.Slots
	ready    []incoming
	notes    []StatusControl
	reserved int
	recvErr  bool
	maps     map[Cookie]*mapping
	lazy     []*qp.MR
	dying    []*qp.MR // invalidated, deregistered once no Read Response needs them
	known    map[peerKey]*peerCookie
	order    []peerKey          // known, oldest first
	held     map[netip.Addr]int // how many of known each host's address holds
	ops      map[uint64]*op
	nextOp   uint64
	queues   map[netip.AddrPort][]*op
	ahs      shim.AHCache
	st       Stats
}

// Listen opens a Socket on a UDP address ("udp", "udp4" or "udp6"), with
// its own device and RD QP.
func Listen(network, address string, opts *Options) (*Socket, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.fill()
	switch network {
	case "udp", "udp4", "udp6":
	default:
		return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
	}
	if o.Device.Poll != qp.PollEvent {
		return nil, errorf(ErrInvalid, "the socket's device must use event polling (its own goroutine waits on the CQs)")
	}
	dev, err := qp.Open(o.Device)
	if err != nil {
		return nil, err
	}
	s := &Socket{dev: dev, opt: o, closed: make(chan struct{}),
		readable: make(chan struct{}), slotFree: make(chan struct{}), maps: map[Cookie]*mapping{}, known: map[peerKey]*peerCookie{}, held: map[netip.Addr]int{},
		ops: map[uint64]*op{}, queues: map[netip.AddrPort][]*op{}}
	fail := func(err error) (*Socket, error) {
		dev.Close()
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if s.sock, err = dev.Bind(network, address); err != nil {
		return fail(err)
	}
	s.v4 = s.sock.LocalAddr().Addr().Is4()
	// The most one RD Send carries: a datagram less the largest RD header.
	rdMax := s.sock.MaxMessage() - reliability.MaxHeaderSize
	s.maxMsg = rdMax - hdrMax
	if o.MaxMessage > 0 && o.MaxMessage < s.maxMsg {
		s.maxMsg = o.MaxMessage
	}
	s.slot = s.maxMsg + hdrMax
	s.pd = dev.AllocPD()
	s.ahs = shim.AHCache{PD: s.pd, QPN: QPN, Max: 4096}
	s.dl.Init()
	if s.rbuf, err = s.pd.RegisterMemory(make([]byte, o.RecvDepth*s.slot), qp.AccessLocalWrite); err != nil {
		return fail(err)
	}
	if s.sbuf, err = s.pd.RegisterMemory(make([]byte, o.SendSlots*s.slot), 0); err != nil {
		return fail(err)
	}
	maxWR := o.SendSlots * (MaxLocalVecs + 1)
	if s.rcq, err = dev.CreateCQ(o.RecvDepth + 16); err != nil {
		return fail(err)
	}
	if s.scq, err = dev.CreateCQ(maxWR + 16); err != nil {
		return fail(err)
	}
	if s.q, err = s.pd.CreateQP(qp.QPAttr{Type: qp.RD, SendCQ: s.scq, RecvCQ: s.rcq, RD: o.RD,
		Caps: qp.QPCaps{MaxSendWR: maxWR, MaxRecvWR: o.RecvDepth, MaxSendSGE: MaxLocalVecs, MaxRecvSGE: 1, MaxInline: -1}}); err != nil {
		return fail(err)
	}
	if s.q.QPN() != QPN {
		return fail(fmt.Errorf("rds: the QP got number %d, not %d", s.q.QPN(), QPN))
	}
	if err := s.q.Activate(s.sock); err != nil {
		return fail(err)
	}
	for i := range o.RecvDepth {
		if err := s.postRecv(i); err != nil {
			return fail(err)
		}
	}
	s.free = shim.NewSlots(o.SendSlots)
	s.wg.Add(1)
	go s.run()
	return s, nil
}

func (s *Socket) postRecv(slot int) error {
	return s.q.PostRecv(&qp.RecvWR{ID: uint64(slot), SGL: []qp.SGE{s.rbuf.SGE(slot*s.slot, s.slot)}})
}

// LocalAddr returns the socket's address.
func (s *Socket) LocalAddr() netip.AddrPort { return s.sock.LocalAddr() }

// Device returns the socket's device (for its counters).
func (s *Socket) Device() *qp.Device { return s.dev }

// MaxMessage returns the longest message SendMsg takes.
func (s *Socket) MaxMessage() int { return s.maxMsg }

// Stats returns the socket's counters.
func (s *Socket) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Mappings, st.Released, st.PeerCookies = len(s.maps), len(s.lazy), len(s.known)
	return st
}

// SetRecvErr sets RDS_RECVERR: with it on, every RDMA operation that
// fails produces a notification, NotifyMe or not. It is off by default.
func (s *Socket) SetRecvErr(on bool) {
	s.mu.Lock()
	s.recvErr = on
	s.mu.Unlock()
}

// RecvErr reports RDS_RECVERR.
func (s *Socket) RecvErr() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recvErr
}

// GetMR maps buf for RDMA by peers and returns its cookie (RDS_GET_MR);
// flags may hold UseOnce and Invalidate. Errors: ErrTooLarge for a buffer
// longer than Options.MaxTransfer, ErrMappingLimit when
// Options.MaxMappings mappings exist, ErrNoMapping when the device cannot
// register more memory, ErrInvalid for an empty buffer or unknown flags.
func (s *Socket) GetMR(buf []byte, flags MapFlags) (Cookie, error) {
	if err := s.checkMap(buf, flags); err != nil {
		return 0, s.opErr("getmr", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if shim.Done(s.closed) {
		return 0, s.opErr("getmr", net.ErrClosed)
	}
	c, err := s.mapLocked(buf, flags)
	if err != nil {
		return 0, s.opErr("getmr", err)
	}
	return c, nil
}

// FreeMR releases the mapping of cookie c (RDS_FREE_MR). It stays valid
// for peers' RDMA until the released mappings are invalidated together,
// unless flags or the mapping's own flags hold Invalidate: then it is
// invalidated before FreeMR returns, and an RDMA still arriving for it
// fails (StatusRemoteError at the server, which sends no ACK). The zero
// cookie with Invalidate invalidates every released mapping now. An
// unknown cookie is ErrBadCookie.
func (s *Socket) FreeMR(c Cookie, flags MapFlags) error {
	if flags&^Invalidate != 0 {
		return s.opErr("freemr", errorf(ErrInvalid, "FreeMR takes only Invalidate, not flags %v", flags))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if shim.Done(s.closed) {
		return s.opErr("freemr", net.ErrClosed)
	}
	if c == 0 {
		if flags&Invalidate == 0 {
			return s.opErr("freemr", errorf(ErrBadCookie, "the zero cookie is only for FreeMR(0, Invalidate)"))
		}
		s.flushLocked()
		return nil
	}
	s.retireLocked()
	m := s.maps[c]
	if m == nil {
		return s.opErr("freemr", errorf(ErrBadCookie, "%v", c))
	}
	s.releaseLocked(c, m, flags&Invalidate != 0)
	return nil
}

func (s *Socket) checkMap(buf []byte, flags MapFlags) error {
	switch {
	case len(buf) == 0:
		return errorf(ErrInvalid, "mapping an empty buffer")
	case len(buf) > s.opt.MaxTransfer:
		return errorf(ErrTooLarge, "mapping %d bytes, at most %d", len(buf), s.opt.MaxTransfer)
	case flags&^(UseOnce|Invalidate) != 0:
		return errorf(ErrInvalid, "map flags %v", flags)
	}
	return nil
}

// mapLocked registers buf and records the mapping.
func (s *Socket) mapLocked(buf []byte, flags MapFlags) (Cookie, error) {
	s.retireLocked()
	if len(s.maps)+len(s.lazy) >= s.opt.MaxMappings {
		s.flushLocked()
	}
	if len(s.maps) >= s.opt.MaxMappings {
		return 0, errorf(ErrMappingLimit, "%d mappings", len(s.maps))
	}
	mr, err := s.pd.RegisterMemory(buf, qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessRemoteRead)
	if err != nil && errors.Is(err, qp.ErrTooMany) && len(s.lazy) > 0 {
		s.flushLocked()
		mr, err = s.pd.RegisterMemory(buf, qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessRemoteRead)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoMapping, err)
	}
	c := makeCookie(mr.STag(), 0)
	s.maps[c] = &mapping{mr: mr, flags: flags}
	return c, nil
}

// releaseLocked ends mapping c: invalidated now, or later with the others.
func (s *Socket) releaseLocked(c Cookie, m *mapping, invalidate bool) {
	delete(s.maps, c)
	if invalidate || m.flags&Invalidate != 0 {
		s.invalidate(m.mr)
		return
	}
	s.lazy = append(s.lazy, m.mr)
	if len(s.lazy) >= s.opt.LazyFlush {
		s.flushLocked()
	}
}

// flushLocked invalidates every released mapping.
func (s *Socket) flushLocked() {
	for i, mr := range s.lazy {
		s.invalidate(mr)
		s.lazy[i] = nil
	}
	s.lazy = s.lazy[:0]
}

// invalidate ends a mapping: once it returns no peer's RDMA reaches the
// memory (MR.Invalidate): an RDMA arriving for it fails, and a peer's
// Read of it still in flight ends with REMOTE_ERROR. The region is then
// deregistered, at once or — while Read Responses from it wait for the
// peer's acknowledgement (ErrBusy) — by a later call (retireLocked) or
// Close; it never becomes usable again.
func (s *Socket) invalidate(mr *qp.MR) {
	mr.Invalidate()
	s.st.Invalidated++
	if err := mr.Deregister(); errors.Is(err, qp.ErrBusy) {
		s.dying = append(s.dying, mr)
	}
}

// retireLocked deregisters the invalidated regions that were still busy.
func (s *Socket) retireLocked() {
	keep := s.dying[:0]
	for _, mr := range s.dying {
		if err := mr.Deregister(); errors.Is(err, qp.ErrBusy) {
			keep = append(keep, mr)
		}
	}
	clear(s.dying[len(keep):])
	s.dying = keep
}

// learnLocked remembers a peer's cookie from an RDMA request.
func (s *Socket) learnLocked(peer netip.AddrPort, r request) {
	k := peerKey{peer, r.cookie}
	if pc := s.known[k]; pc != nil {
		*pc = peerCookie{req: r} // the client sent it again: in use again
		return
	}
	s.known[k] = &peerCookie{req: r}
	s.order = append(s.order, k)
	s.held[peer.Addr()]++
	if len(s.known) <= s.opt.MaxPeerCookies {
		return
	}
	// Full: the oldest cookie of the hosts that hold the most goes, so
	// that one host's requests, however many, never make the server
	// forget the cookies of a host that holds fewer.
	most := 0
	for _, n := range s.held {
		most = max(most, n)
	}
	i := slices.IndexFunc(s.order, func(k peerKey) bool { return s.held[k.peer.Addr()] == most })
	gone := s.order[i]
	delete(s.known, gone)
	s.order = slices.Delete(s.order, i, i+1)
	if s.held[gone.peer.Addr()]--; s.held[gone.peer.Addr()] == 0 {
		delete(s.held, gone.peer.Addr())
	}
}

// SendMsg sends message b to the socket at to, with control messages:
// at most one of MapControl and DestControl (which make it an RDMA
// request carrying the cookie) and at most one ArgsControl (which makes
// it the RDMA ACK of an operation on to's memory: the message is
// delivered only once the RDMA succeeded, and not at all if it fails).
// It returns len(b) once the message and its operation are under way; the
// operation's outcome is a notification (NotifyMe, SetRecvErr). It waits
// for a send slot when all are in use, until the write deadline.
func (s *Socket) SendMsg(b []byte, to netip.AddrPort, ctrl ...Control) (int, error) {
	var mc *MapControl
	var dc *DestControl
	var ac *ArgsControl
	for _, c := range ctrl {
		switch v := c.(type) {
		case MapControl:
			c = &v
		case DestControl:
			c = &v
		case ArgsControl:
			c = &v
		}
		switch v := c.(type) {
		case *MapControl:
			if v == nil {
				return 0, s.opErr("sendmsg", errorf(ErrInvalid, "a nil *MapControl"))
			}
			if mc != nil || dc != nil {
				return 0, s.opErr("sendmsg", errorf(ErrConflict, "a map with another map or a dest"))
			}
			mc = v
		case *DestControl:
			if v == nil {
				return 0, s.opErr("sendmsg", errorf(ErrInvalid, "a nil *DestControl"))
			}
			if mc != nil || dc != nil {
				return 0, s.opErr("sendmsg", errorf(ErrConflict, "a dest with a map or another dest"))
			}
			dc = v
		case *ArgsControl:
			if v == nil {
				return 0, s.opErr("sendmsg", errorf(ErrInvalid, "a nil *ArgsControl"))
			}
			if ac != nil {
				return 0, s.opErr("sendmsg", errorf(ErrConflict, "two args"))
			}
			ac = v
		default:
			return 0, s.opErr("sendmsg", errorf(ErrInvalid, "control %T cannot be sent", c))
		}
	}
	if err := s.checkSend(b, to, mc, ac); err != nil {
		return 0, s.opErr("sendmsg", err)
	}
	to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	slot, err := s.takeSlot()
	if err != nil {
		return 0, s.opErr("sendmsg", err)
	}
	defer s.mu.Unlock() // takeSlot returns holding it
	if err := s.sendLocked(b, to, slot, mc, dc, ac); err != nil {
		s.freeSlotLocked(slot)
		return 0, s.opErr("sendmsg", err)
	}
	return len(b), nil
}

// checkSend checks what needs no state.
func (s *Socket) checkSend(b []byte, to netip.AddrPort, mc *MapControl, ac *ArgsControl) error {
	switch {
	case !to.IsValid() || to.Port() == 0 || to.Addr().IsUnspecified() || to.Addr().IsMulticast():
		return errorf(ErrInvalid, "destination %v", to)
	case s.v4 && !to.Addr().Unmap().Is4():
		return errorf(ErrInvalid, "destination %v: an IPv4 socket", to)
	case len(b) > s.maxMsg:
		return errorf(ErrMessageTooLong, "%d bytes, at most %d", len(b), s.maxMsg)
	}
	if mc != nil {
		if err := s.checkMap(mc.Buf, mc.Flags); err != nil {
			return err
		}
	}
	if ac == nil {
		return nil
	}
	var total uint64
	n := 0
	for _, l := range ac.Local {
		total += uint64(len(l))
		if len(l) > 0 {
			n++
		}
	}
	switch {
	case ac.Cookie == 0:
		return errorf(ErrBadCookie, "args with the zero cookie")
	case ac.Flags&^(ReadWrite|Fence|NotifyMe) != 0:
		return errorf(ErrInvalid, "args flags %v", ac.Flags)
	case ac.Remote.Len == 0:
		return errorf(ErrInvalid, "an RDMA of 0 bytes")
	case ac.Remote.Len > uint64(s.opt.MaxTransfer):
		return errorf(ErrTooLarge, "an RDMA of %d bytes, at most %d", ac.Remote.Len, s.opt.MaxTransfer)
	case ac.Remote.Offset+ac.Remote.Len < ac.Remote.Offset:
		return errorf(ErrInvalid, "remote range %+v wraps", ac.Remote)
	case total != ac.Remote.Len:
		return errorf(ErrSizeMismatch, "local buffers of %d bytes, remote range of %d", total, ac.Remote.Len)
	case n > MaxLocalVecs:
		return errorf(ErrInvalid, "%d local buffers, at most %d", n, MaxLocalVecs)
	}
	return nil
}

// takeSlot waits for a free send slot and returns it with s.mu held.
func (s *Socket) takeSlot() (int, error) {
	for {
		s.mu.Lock()
		if shim.Done(s.closed) {
			s.mu.Unlock()
			return 0, net.ErrClosed
		}
		if i, ok := s.free.Take(); ok {
			return i, nil
		}
		ch := s.slotFree
		s.mu.Unlock()
		if err := shim.Until(ch, &s.dl.Write, s.dl.WriteKick, s.closed); err != nil {
			return 0, err
		}
	}
}

func (s *Socket) freeSlotLocked(i int) {
	s.free.Put(i)
	close(s.slotFree)
	s.slotFree = make(chan struct{})
}

// sendLocked does SendMsg's work with a slot taken; on an error nothing
// was sent and nothing is left mapped or reserved.
func (s *Socket) sendLocked(b []byte, to netip.AddrPort, slot int, mc *MapControl, dc *DestControl, ac *ArgsControl) error {
	var req *request
	if dc != nil {
		m := s.maps[dc.Cookie]
		if m == nil {
			return errorf(ErrBadCookie, "dest %v", dc.Cookie)
		}
		req = &request{cookie: dc.Cookie, addr: m.mr.Addr(), length: uint64(m.mr.Len()), flags: m.flags}
	}
	ah, err := s.ahs.Get(to)
	if err != nil {
		return errorf(ErrInvalid, "destination %v: %v", to, err)
	}
	s.nextOp++
	o := &op{id: s.nextOp, peer: to, ah: ah, slot: slot}
	var pc *peerCookie
	if ac != nil {
		o.args, o.token, o.notify = true, ac.Token, ac.Flags&NotifyMe != 0
		if o.notify || s.recvErr {
			if len(s.notes)+s.reserved >= s.opt.MaxNotifications {
				return errorf(ErrNoBufs, "%d notifications queued, %d reserved", len(s.notes), s.reserved)
			}
		}
		pc = s.known[peerKey{to, ac.Cookie}]
		if pc != nil && pc.req.flags&UseOnce != 0 && pc.used {
			pc = nil // used once already
		}
		if pc != nil {
			access := qp.Access(0)
			if ac.Flags&ReadWrite == 0 {
				access = qp.AccessLocalWrite | qp.AccessRemoteWrite // a Read's sink
			}
			for _, l := range ac.Local {
				if len(l) == 0 {
					continue
				}
				mr, err := s.pd.RegisterMemory(l, access)
				if err != nil {
					s.deregister(o)
					return fmt.Errorf("%w: local buffer: %w", ErrNoMapping, err)
				}
				o.local = append(o.local, mr)
			}
		}
	}
	if mc != nil {
		c, err := s.mapLocked(mc.Buf, mc.Flags)
		if err != nil {
			s.deregister(o)
			return err
		}
		m := s.maps[c]
		req = &request{cookie: c, addr: m.mr.Addr(), length: uint64(m.mr.Len()), flags: mc.Flags}
		if mc.Cookie != nil {
			*mc.Cookie = c
		}
	}
	// Nothing can fail from here on: the message is committed.
	var ack Cookie
	if ac != nil {
		ack = ac.Cookie
		if o.notify || s.recvErr {
			o.reserved = true
			s.reserved++
		}
	}
	buf := s.sbuf.Bytes()[slot*s.slot : (slot+1)*s.slot]
	h := putHeader(buf, req, ack)
	o.size = h + copy(buf[h:], b)
	s.ops[o.id] = o
	if ac != nil {
		if pc == nil {
			o.status = StatusRemoteError // no region known for the cookie: nothing reaches the wire
		} else {
			if pc.req.flags&UseOnce != 0 {
				pc.used = true
			}
			s.postRDMA(o, pc, ac)
		}
	}
	o.queued = true
	s.queues[to] = append(s.queues[to], o)
	s.advanceLocked(to)
	return nil
}

// postRDMA posts an operation's RDMA: one Write of every local buffer, or
// one Read per local buffer, each signaled.
func (s *Socket) postRDMA(o *op, pc *peerCookie, ac *ArgsControl) {
	to := pc.req.addr + uint64(ac.Cookie.Offset()) + ac.Remote.Offset
	wr := qp.SendWR{Flags: qp.FlagSignaled, AH: o.ah, RemoteSTag: ac.Cookie.STag()}
	post := func(k int) bool {
		wr.ID = o.id<<wrShift | uint64(k)
		if err := s.q.PostSend(&wr); err != nil {
			o.status = StatusOtherError
			return false
		}
		o.pending++
		return true
	}
	if ac.Flags&ReadWrite != 0 {
		sgl := make([]qp.SGE, len(o.local))
		for i, mr := range o.local {
			sgl[i] = mr.SGE(0, mr.Len())
		}
		wr.Opcode, wr.SGL, wr.RemoteTO = qp.OpWrite, sgl, to
		post(0)
		return
	}
	wr.Opcode = qp.OpRead
	for i, mr := range o.local {
		wr.SGL, wr.RemoteTO = []qp.SGE{mr.SGE(0, mr.Len())}, to
		if !post(i) {
			return
		}
		to += uint64(mr.Len())
	}
}

// advanceLocked posts the ACKs and messages at the head of a peer's
// queue whose RDMA is done, in order, and ends the operations that failed.
func (s *Socket) advanceLocked(peer netip.AddrPort) {
	q := s.queues[peer]
	for len(q) > 0 {
		o := q[0]
		if !o.canceled && o.pending > 0 {
			break
		}
		q[0] = nil
		q = q[1:]
		o.queued = false
		switch {
		case o.canceled:
			if o.pending == 0 {
				s.finishLocked(o, StatusCanceled)
			} // else when its RDMA completes
		case o.status != StatusSuccess:
			s.finishLocked(o, o.status)
		default:
			err := s.q.PostSend(&qp.SendWR{ID: o.id<<wrShift | wrAck, Opcode: qp.OpSend, Flags: qp.FlagSignaled,
				SGL: []qp.SGE{s.sbuf.SGE(o.slot*s.slot, o.size)}, AH: o.ah})
			if err != nil {
				s.finishLocked(o, StatusOtherError)
				continue
			}
			o.ackPosted = true
		}
	}
	if len(q) == 0 {
		delete(s.queues, peer)
	} else {
		s.queues[peer] = q
	}
}

// finishLocked ends an op: frees its slot, and queues its notification.
func (s *Socket) finishLocked(o *op, st Status) {
	if o.done {
		return
	}
	o.done = true
	delete(s.ops, o.id)
	s.deregister(o)
	s.freeSlotLocked(o.slot)
	if !o.args {
		return
	}
	s.st.Operations++
	if st == StatusSuccess {
		s.st.Succeeded++
		s.st.RDMABytes += o.bytes
	}
	if o.notify || (st != StatusSuccess && s.recvErr) {
		if o.reserved || len(s.notes)+s.reserved < s.opt.MaxNotifications {
			s.notes = append(s.notes, StatusControl{Token: o.token, Status: st, Peer: o.peer})
			s.st.Notifications++
			s.wakeReaders()
		} else {
			s.st.NotifyOverflow++
		}
	}
	if o.reserved {
		s.reserved--
		o.reserved = false
	}
}

// deregister releases an op's local buffers (its RDMA is done).
func (s *Socket) deregister(o *op) {
	for i, mr := range o.local {
		mr.Deregister()
		o.local[i] = nil
	}
	o.local = o.local[:0]
}

func (s *Socket) wakeReaders() {
	close(s.readable)
	s.readable = make(chan struct{})
}

// Cancel cancels the RDMA operations to peer (every peer, if peer is the
// zero AddrPort) whose ACK has not been posted: no ACK is sent, and each
// ends with StatusCanceled once its RDMA work requests completed (until
// then the RDMA may still happen; its local buffers are in use). It
// returns how many it canceled.
func (s *Socket) Cancel(peer netip.AddrPort) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancelLocked(peer)
}

func (s *Socket) cancelLocked(peer netip.AddrPort) int {
	peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	var peers []netip.AddrPort
	n := 0
	for p, q := range s.queues {
		if peer.IsValid() && p != peer {
			continue
		}
		for _, o := range q {
			if o.args && !o.canceled {
				o.canceled = true
				n++
			}
		}
		peers = append(peers, p)
	}
	for _, p := range peers {
		s.advanceLocked(p)
	}
	return n
}

// run is the socket's progress engine: it takes receive completions (an
// ACK releases a UseOnce mapping, a request teaches a peer's cookie) and
// send completions (an RDMA done lets its ACK go; an ACK done ends its
// operation), without waiting for the application.
func (s *Socket) run() {
	defer s.wg.Done()
	wcs := make([]qp.WorkCompletion, 64)
	for !shim.Done(s.closed) {
		nr := s.rcq.Poll(wcs)
		if nr > 0 {
			s.mu.Lock()
			for i := range wcs[:nr] {
				s.onRecv(&wcs[i])
			}
			s.mu.Unlock()
		}
		ns := s.scq.Poll(wcs)
		if ns > 0 {
			s.mu.Lock()
			for i := range wcs[:ns] {
				s.onSend(&wcs[i])
			}
			s.mu.Unlock()
		}
		if nr+ns > 0 {
			continue
		}
		s.rcq.RequestNotify(false)
		s.scq.RequestNotify(false)
		if s.rcq.Pending() > 0 || s.scq.Pending() > 0 {
			continue
		}
		select {
		case <-s.rcq.C():
		case <-s.scq.C():
		case <-s.closed:
			return
		}
	}
}

// onRecv takes a receive completion.
func (s *Socket) onRecv(wc *qp.WorkCompletion) {
	slot := int(wc.ID)
	if wc.Status == qp.WRFlushError {
		return // the QP is going away
	}
	if wc.Status != qp.Success {
		s.postRecv(slot)
		return
	}
	off := slot * s.slot
	h, ok := parseHeader(s.rbuf.Bytes()[off : off+int(wc.Len)])
	if !ok {
		s.st.BadMessages++
		s.postRecv(slot)
		return
	}
	from := netip.AddrPortFrom(wc.Source.Addr().Unmap(), wc.Source.Port())
	if h.hasAck {
		if m := s.maps[h.ack]; m != nil && m.flags&UseOnce != 0 {
			s.releaseLocked(h.ack, m, false)
		}
	}
	var ctrl []Control
	if h.hasReq {
		s.learnLocked(from, h.req)
		ctrl = []Control{DestControl{Cookie: h.req.cookie}}
	}
	s.st.MessagesRecv++
	s.ready = append(s.ready, incoming{slot: slot, off: off + h.size, n: int(wc.Len) - h.size, from: from, ctrl: ctrl})
	s.wakeReaders()
}

// onSend takes a send completion.
func (s *Socket) onSend(wc *qp.WorkCompletion) {
	o := s.ops[wc.ID>>wrShift]
	if o == nil {
		return
	}
	if wc.ID&wrAck == wrAck {
		st := StatusSuccess
		switch wc.Status {
		case qp.Success:
			s.st.MessagesSent++
		case qp.WRFlushError:
			st = StatusCanceled
			s.st.MessagesLost++
		default:
			// The RDMA was done, its ACK did not arrive, or arrived and
			// was not acknowledged: the peer went away.
			st = StatusDropped
			s.st.MessagesLost++
		}
		s.finishLocked(o, st)
		return
	}
	o.pending--
	if wc.Status == qp.Success {
		o.bytes += uint64(wc.Len)
	} else if o.status == StatusSuccess {
		o.status = rdmaStatus(wc.Status)
	}
	if o.pending > 0 {
		return
	}
	s.deregister(o)
	switch {
	case o.queued:
		s.advanceLocked(o.peer)
	case o.canceled:
		s.finishLocked(o, StatusCanceled)
	}
}

// rdmaStatus maps an RDMA work request's failure to a notification status.
func rdmaStatus(st qp.Status) Status {
	switch st {
	case qp.RemoteAccessError:
		return StatusRemoteError
	case qp.RetryExceededError, qp.RNRRetryExceededError, qp.RemoteAbortedError:
		return StatusDropped
	case qp.WRFlushError:
		return StatusCanceled
	}
	return StatusOtherError
}

// RecvMsg returns the next message into b, with its source and control
// messages (a DestControl for an RDMA request), or, before any message,
// the queued notifications: n == 0, a zero source, and one StatusControl
// each (at most 64 per call). A message longer than b is cut to len(b).
// It waits until the read deadline; Close unblocks it.
func (s *Socket) RecvMsg(b []byte) (n int, from netip.AddrPort, ctrl []Control, err error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for {
		s.mu.Lock()
		if shim.Done(s.closed) {
			s.mu.Unlock()
			return 0, netip.AddrPort{}, nil, s.opErr("recvmsg", net.ErrClosed)
		}
		if len(s.notes) > 0 {
			k := min(len(s.notes), maxNotesPerRecv)
			ctrl = make([]Control, k)
			for i := range k {
				ctrl[i] = s.notes[i]
			}
			s.notes = append(s.notes[:0], s.notes[k:]...)
			s.mu.Unlock()
			return 0, netip.AddrPort{}, ctrl, nil
		}
		if len(s.ready) > 0 {
			in := s.ready[0]
			s.ready[0] = incoming{}
			s.ready = s.ready[1:]
			n = copy(b, s.rbuf.Bytes()[in.off:in.off+in.n])
			err := s.postRecv(in.slot)
			s.mu.Unlock()
			if err != nil {
				return n, in.from, in.ctrl, s.opErr("recvmsg", err)
			}
			return n, in.from, in.ctrl, nil
		}
		ch := s.readable
		s.mu.Unlock()
		if err := shim.Until(ch, &s.dl.Read, s.dl.ReadKick, s.closed); err != nil {
			return 0, netip.AddrPort{}, nil, s.opErr("recvmsg", err)
		}
	}
}

// SetDeadline sets the read and write deadlines.
func (s *Socket) SetDeadline(t time.Time) error {
	if err := s.SetReadDeadline(t); err != nil {
		return err
	}
	return s.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline of RecvMsg, including one blocked
// now; the zero time means none.
func (s *Socket) SetReadDeadline(t time.Time) error {
	return s.setDeadline(&s.dl.Read, s.dl.ReadKick, t)
}

// SetWriteDeadline sets the deadline of SendMsg waiting for a send slot.
func (s *Socket) SetWriteDeadline(t time.Time) error {
	return s.setDeadline(&s.dl.Write, s.dl.WriteKick, t)
}

func (s *Socket) setDeadline(dl *atomic.Int64, kick chan struct{}, t time.Time) error {
	if shim.Done(s.closed) {
		return s.opErr("set", net.ErrClosed)
	}
	shim.SetDeadline(dl, kick, t)
	return nil
}

// Close closes the socket: blocked calls return, operations not ended are
// canceled (no ACK is sent for them; their notifications are discarded
// with the socket), every mapping is invalidated, and every goroutine the
// socket started has returned.
func (s *Socket) Close() error {
	if !shim.CloseOnce(&s.once, s.closed) {
		return s.opErr("close", net.ErrClosed)
	}
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelLocked(netip.AddrPort{})
	err := s.dev.Close() // flushes what is in flight; no more placement
	return err
}

func (s *Socket) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "rds", Source: net.UDPAddrFromAddrPort(s.sock.LocalAddr()), Err: err}
}
