package socketshim

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/udiwarp/udiwarp/internal/snapshot"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
)

// Write-Record mode (seed 003): a datagram socket whose WriteTo is an RDMA
// Write-Record into a ring of slots the receiver registered for this
// sender, and whose ReadFrom returns the next record that arrived whole.
//
// Control messages are Sends with Solicited Event on the same UD QP (so
// a stray datagram is never taken for one), big-endian:
//
//	 0  magic "UWR2"       4  kind           5  flags    6  zero (2)
//	 8  epoch: the sender's session with the receiver (0 in a CHALLENGE)
//	16  view: the receiver's session as the sender knows it (0: none)
//	24  the kind's body (HELLO 24 bytes, CREDIT and PROBE 16, others none)
//	    mine (8): the cookie the sender gives the receiver's address
//	    echo (8): the receiver's cookie for the sender's address, or 0
//
// HELLO (kind 1, 64 bytes; flag 1: answer me) carries the ring the sender
// registered for the receiver: STag at 24, slots at 28, slot size at 32,
// zero at 36, base at 40. CREDIT (2) and PROBE (3), 56 bytes, carry an
// STag at 24 (then 4 zero bytes) and a record number at 32. CHALLENGE (4)
// and BYE (5) are 40 bytes.
//
// Return routability. A cookie is a keyed hash of the address it is given
// to (reliability.Tokens, under a secret drawn per socket): only a host
// that receives what is sent to an address learns the cookie for it. A
// HELLO, CREDIT, PROBE or BYE counts only if its echo is the receiver's
// cookie for its source; otherwise it changes nothing, and the receiver
// answers with a CHALLENGE (its cookie for the source as mine, the
// message's mine as echo; 40 bytes, smaller than any message that draws
// it), keeping no state. A CHALLENGE counts only if its echo is the
// receiver's cookie for the challenger and the receiver has state for it
// (it wrote to it): it takes the cookie and sends its HELLO again. So a
// spoofed source can neither create a peer (no ring, no state) nor touch
// an established one: a forged HELLO from a peer's address draws a
// CHALLENGE to the real peer, which drops it (its echo is not the real
// peer's cookie).
//
// Handshake. The first WriteTo to a peer makes its state — a ring
// registered for its records and a session epoch (random, per peer state)
// — and sends a HELLO; the peer answers with a CHALLENGE, the HELLO goes
// again echoing its cookie, and the peer, now sure of the address, makes
// its state and answers with its HELLO (echoing ours). The HELLO is sent
// again after 20, 40, 80 ... ms; with no answer within HandshakeTimeout
// (or the write deadline) the WriteTo fails: nothing waits forever. A
// HELLO (with a valid cookie) with a new epoch from a known peer is a new
// session of it (it restarted, or forgot us): its ring and its view of
// ours start again, and its records of the old session not yet read are
// dropped.
//
// Expiry. A peer with nothing sent to it or received from it for
// IdleTimeout, and no record of it waiting to be read, is forgotten: its
// ring is deregistered, and it is told with a BYE (which makes it forget
// us too, or, with records of ours unread, stop writing to our old ring).
// Either side's next message then starts a new session. (Were the BYE
// lost, the records the other side writes to the forgotten ring would be
// lost, as datagrams may be, until its credits run out and its PROBE
// starts the new session.)
//
// Slots. Record k (k = 0, 1, ...) goes to slot k mod Slots at the slot's
// start: an 8-byte header holding k, then the datagram. The receiver
// takes records from its receive CQ's Write-Record entries (STag, offset,
// length, source), each only if it is whole (the QP discards messages
// with segments missing) or, with WROptions.Partial, partial (the QP
// delivers them with their valid ranges; a record whose header was lost
// is the one record number of the writer's window its slot maps to;
// ReadRecord returns them, ReadFrom passes over them), from the
// ring's owner, at the slot its number says, and newer than the last;
// ReadFrom copies it out and checks the header again after the copy, so a
// slot rewritten meanwhile is dropped rather than returned.
//
// Credits. The receiver has consumed records below C (read, or passed
// over: lost); the writer may write record k only while k < C + Slots, so
// it never rewrites a slot whose record is unread. The receiver sends C
// back in a CREDIT message each time it moved by a quarter of the ring. A
// writer out of slots sends a PROBE (its next record number) every few
// milliseconds: the receiver answers with C if records wait to be read.
// If none does, the writer sent every record it has out before the
// PROBE, so the last of them, if still in progress at the QP (its last
// segments lost), is ended at once (QP.EndWriteRecord: delivered partial,
// or dropped); once the receiver has taken every completion the QP made,
// a record that came is answered with C as above. If none came either,
// and the PROBE's number shows that the writer has the last C sent (were
// a CREDIT still on its way, the writer would write more records to this
// ring: the receiver sends C again), the writer's records since C were
// lost, and the receiver re-keys the ring (registers it again: a new
// STag, so no straggler of an old record can land in it) and sends a
// HELLO with it. (Within one ring, the QP drops any segment of a message
// older than the writer's newest, however late it comes, within the
// bounds docs/wire.md §4.3 states: a slot holds only the bytes of the
// record it was written for.) A writer that
// gets no slot within CreditWait drops the datagram, as a full UDP
// receive buffer would (CreditWait < 0: at once); its write deadline
// still fails the WriteTo first.
//
// Overrun. A writer that keeps the credits has at most 2·Slots records
// completing at the receiver between two advances of C (Slots in the
// window, and at most Slots late ones it had passed over). A peer that has
// more is breaking them: the record is dropped and counted
// (WRStats.Overruns) and the peer forgotten — its ring deregistered, so
// the stack places none of its records any more. The receive CQ holds
// every peer's 2·Slots and a margin of 16384, and a background goroutine
// takes completions off it within about a millisecond (the watcher's
// drainEvery) while the application calls nothing, so a writer is found
// out long before it could overflow it.
//
// Copies. Up to 512 bytes go inline (copied at post); up to ZeroCopy
// bytes are copied to a registered send slot and WriteTo returns at once;
// larger ones are sent from the caller's buffer, registered for the time
// of the send (zero copy: WriteTo returns once the stack sent it). The
// record lands in the slot (directly from the socket when the stack can);
// ReadFrom copies it to the caller, as a datagram socket must.

// WROptions tune a Write-Record PacketConn. The zero value is usable.
type WROptions struct {
	// Slots is the ring's length per peer: records a writer may have
	// unread at the receiver (default 32).
	Slots int
	// SlotSize is a slot's bytes, 8 of which are the record's header: the
	// largest datagram is SlotSize-8 (default 65536; at most 16 MiB, so a
	// datagram may be larger than UDP's and span several Write-Record
	// segments).
	SlotSize int
	// MaxPeers bounds the peers with a ring here (default 64): a HELLO
	// from one more is ignored. Only a peer whose address answered a
	// cookie challenge (or that this side wrote to) counts.
	MaxPeers int
	// HandshakeTimeout bounds the exchange of rings with a new peer
	// (default 2 s).
	HandshakeTimeout time.Duration
	// IdleTimeout forgets a peer after this long with nothing sent to it
	// or received from it (and no record of it unread): its ring is
	// deregistered, and its next message starts a new session (default
	// 30 s; negative: never).
	IdleTimeout time.Duration
	// CreditWait is how long a WriteTo waits for a free slot at the peer
	// before it drops the datagram (default 1 s; negative: drop at once).
	CreditWait time.Duration
	// ZeroCopy is the size from which a datagram is sent from the
	// caller's buffer rather than copied (default 16 KiB).
	ZeroCopy int
	// SendSlots is the number of copied datagrams that can be on their
	// way out at once (default 64).
	SendSlots int
	// Segment is the payload of one Write-Record segment, one datagram
	// (default: the most a datagram carries). A record larger than a
	// segment travels as several; with Partial, a lost one costs its own
	// bytes only.
	Segment int
	// Partial delivers a record whose deadline passed with segments
	// missing, with the byte ranges that arrived: ReadRecord returns it
	// (ReadFrom, which returns whole datagrams only, passes over it and
	// counts it in WRStats.Discarded). Without Partial such a record is
	// dropped, as a datagram with a lost fragment is.
	Partial bool
	// Deadline is how long a record may take from its first segment to
	// its last before it is delivered partial or dropped (default 10 s;
	// with Partial, a stream wants tens of milliseconds).
	Deadline time.Duration
	// Reliable runs the socket over an RD QP instead of UD: records and
	// control messages are delivered once, in order, or the writer's
	// stack gives the peer up (a record then never completes and is
	// dropped as lost). Both ends must be Reliable.
	Reliable bool
	// Device configures the PacketConn's own device.
	Device qp.DeviceConfig
}

const (
	wrHeaderSize = 8
	wrCtlSize    = 64 // control receives' size: every control message fits
	wrCtlRecvs   = 128
	wrInlineMax  = 512
	wrMagic      = 0x55575232 // "UWR2"

	wrHello     = 1
	wrCredit    = 2
	wrProbe     = 3
	wrChallenge = 4
	wrBye       = 5

	wrSpare = 4 // forgotten rings kept for reuse: a peer coming and going costs no allocation

	wrHelloLen = 64 // message lengths
	wrNoteLen  = 56 // CREDIT, PROBE
	wrShortLen = 40 // CHALLENGE, BYE

	wrAnswer = 1 // HELLO flag: the sender waits for our HELLO
)

// zcID marks the completion of a zero-copy send.
const zcID = ^uint64(0) - 2

// Errors of the Write-Record PacketConn.
var (
	// ErrNoPeer: the peer did not answer the Write-Record handshake (it is
	// not there, or is not a Write-Record socket).
	ErrNoPeer = errors.New("socketshim: the peer did not answer the Write-Record handshake")
	// ErrPeerSlots: the datagram is larger than the peer's slots.
	ErrPeerSlots = errors.New("socketshim: datagram larger than the peer's Write-Record slots")
)

// WRConn is a net.PacketConn in Write-Record mode; see the comment above
// and the package comment. Deadlines, Close, LocalAddr and the buffer
// setters are the PacketConn's.
type WRConn struct {
	pc     *PacketConn // its device, QP, CQs, deadlines and Close
	o      WROptions
	tokens *reliability.Tokens // the cookies
	bell   shim.Bell
	stage  int // bytes per send slot
	hdr    *qp.MR

	pmu    sync.Mutex // polls the receive CQ
	wcs    []qp.WorkCompletion
	probed []*wrRing // rings with a PROBE for probeLocked, once poll took the CQ's completions (under pmu)

	mu     sync.Mutex
	peers  map[netip.AddrPort]*wrPeer
	byTag  map[uint32]*wrRing
	rq     []wrEntry // whole records, in arrival order
	rqHead int
	spare  [][]byte // rings of forgotten peers, for new ones (at most wrSpare)
	ctl    [wrCtlSize]byte

	stats WRStats
	zcSeq uint64

	watch shim.Watcher // answers control messages while the application waits on nothing
	wg    sync.WaitGroup
}

// WRStats counts what the Write-Record mode did beside delivering.
type WRStats struct {
	Dropped    atomic.Uint64 // datagrams a WriteTo dropped: no slot at the peer within CreditWait
	Discarded  atomic.Uint64 // records not returned: stale, out of place, rewritten, or not the ring owner's
	Handshakes atomic.Uint64 // HELLOs received (with a valid cookie or not)
	Challenges atomic.Uint64 // CHALLENGEs sent: messages whose source had not proved its address
	Overruns   atomic.Uint64 // records dropped for exceeding their writer's credits (the writer is then forgotten)
	Expired    atomic.Uint64 // peers forgotten after IdleTimeout
	Rekeys     atomic.Uint64 // rings registered again after a writer stalled on lost records
	Probes     atomic.Uint64 // PROBEs sent
	Credits    atomic.Uint64 // CREDITs sent
}

type wrPeer struct {
	ap      netip.AddrPort
	ah      *qp.AH
	myEpoch uint64 // our session with it (random)
	epoch   uint64 // its session with us; 0 until its first HELLO
	cookie  uint64 // its cookie for us, to echo; 0 until it told us
	mine    uint64 // our cookie for it
	last    time.Time
	rx      *wrRing
	tx      wrTx
}

// wrRing is the ring this side registered for one peer's records.
type wrRing struct {
	peer     *wrPeer
	buf      []byte
	mr       *qp.MR
	consumed uint64 // C: records below are read or passed over
	seen     uint64 // records below were queued or passed over
	probe    uint64 // the newest PROBE with records out and none to read, for probeLocked (0: none)
	reported uint64 // the C the peer was last told
	queued   int
	arrivals int // the owner's records completed since C last advanced
}

// wrTx is what this side knows of the peer's ring for it.
type wrTx struct {
	ready          bool
	stag           uint32
	base           uint64
	slots, size    int
	next, freed    uint64 // records written; consumed as the peer said
	helloAt        time.Time
	helloEvery     time.Duration
	handshakeStart time.Time
	probeAt        time.Time
	creditStart    time.Time
}

type wrEntry struct {
	ring *wrRing
	seq  uint64
	off  int // the slot's first byte in ring.buf
	n    int // payload bytes
	// A partial record: the payload's ranges that arrived, and whether
	// its header did (then it was checked).
	partial bool
	valid   []validitymap.Range
	header  bool
}

// Record is a datagram ReadRecord returned: its length, its writer, and
// for a partial one the byte ranges of it that arrived.
type Record struct {
	// N is the datagram's length; ReadRecord copied min(N, len(b)) bytes.
	N    int
	Addr netip.AddrPort
	// Partial says the record's deadline passed with segments missing;
	// Valid then lists the byte ranges of b[:N] that arrived, in order
	// and disjoint, and the bytes between them are zero. A whole record
	// has Partial false and Valid nil.
	Partial bool
	Valid   []validitymap.Range
}

// ListenWriteRecord opens a Write-Record PacketConn on a UDP address
// ("udp", "udp4" or "udp6"), with its own device, socket and UD QP
// (number ShimQPN). Its peers must be Write-Record PacketConns too.
func ListenWriteRecord(network, address string, opts *WROptions) (*WRConn, error) {
	var o WROptions
	if opts != nil {
		o = *opts
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Slots, 32)
	def(&o.SlotSize, 65536)
	def(&o.MaxPeers, 64)
	def(&o.ZeroCopy, 16<<10)
	def(&o.SendSlots, 64)
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = 2 * time.Second
	}
	if o.CreditWait == 0 {
		o.CreditWait = time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 30 * time.Second
	}
	bad := func(err error) (*WRConn, error) {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	switch {
	case network != "udp" && network != "udp4" && network != "udp6":
		return bad(net.UnknownNetworkError(network))
	case o.Slots < 2 || o.Slots > 1<<14:
		return bad(fmt.Errorf("socketshim: Slots %d, want 2..16384", o.Slots))
	case o.SlotSize < 64 || o.SlotSize > 16<<20:
		return bad(fmt.Errorf("socketshim: SlotSize %d, want 64..16 MiB", o.SlotSize))
	case o.MaxPeers < 1 || o.MaxPeers > 1<<16:
		return bad(fmt.Errorf("socketshim: MaxPeers %d, want 1..65536", o.MaxPeers))
	case o.ZeroCopy < 1 || o.SendSlots < 1 || o.SendSlots > 1<<14 || o.HandshakeTimeout < 0:
		return bad(fmt.Errorf("socketshim: ZeroCopy %d, SendSlots %d, HandshakeTimeout %v", o.ZeroCopy, o.SendSlots, o.HandshakeTimeout))
	case o.Segment < 0 || o.Deadline < 0:
		return bad(fmt.Errorf("socketshim: Segment %d, Deadline %v: not negative", o.Segment, o.Deadline))
	}
	dev, err := qp.Open(o.Device)
	if err != nil {
		return bad(err)
	}
	fail := func(err error) (*WRConn, error) {
		dev.Close()
		return bad(err)
	}
	pc := &PacketConn{dev: dev, depth: wrCtlRecvs, closed: make(chan struct{})}
	pc.Deadlines.Init()
	c := &WRConn{pc: pc, o: o, tokens: reliability.NewTokens(), peers: map[netip.AddrPort]*wrPeer{}, byTag: map[uint32]*wrRing{}}
	if pc.sock, err = dev.Bind(network, address); err != nil {
		return fail(err)
	}
	c.stage = min(o.ZeroCopy, o.SlotSize-wrHeaderSize, pc.sock.MaxMessage()) + wrHeaderSize
	pc.slot = wrCtlSize
	pc.pd = dev.AllocPD()
	pc.ahs = shim.AHCache{PD: pc.pd, QPN: ShimQPN, Max: o.MaxPeers}
	if pc.rbuf, err = pc.pd.RegisterMemory(make([]byte, wrCtlRecvs*wrCtlSize), qp.AccessLocalWrite); err != nil {
		return fail(err)
	}
	if pc.sbuf, err = pc.pd.RegisterMemory(make([]byte, o.SendSlots*c.stage), 0); err != nil {
		return fail(err)
	}
	if c.hdr, err = pc.pd.RegisterMemory(make([]byte, wrHeaderSize), 0); err != nil {
		return fail(err)
	}
	// Every completion a peer keeping its credits can cause fits (the
	// control receives, 2·Slots records per peer), and a margin for what
	// an overrunning one gets in before it is found out; the shim.Watcher takes
	// completions off as they come.
	maxCQE := o.Device.MaxCQE
	if maxCQE <= 0 {
		maxCQE = 1 << 20
	}
	if pc.rcq, err = dev.CreateCQ(min(2*wrCtlRecvs+2*o.MaxPeers*o.Slots+16384, maxCQE)); err != nil {
		return fail(err)
	}
	if pc.scq, err = dev.CreateCQ(2*o.SendSlots + 16); err != nil {
		return fail(err)
	}
	policy := writerecord.Discard
	if o.Partial {
		policy = writerecord.DeliverPartial
	}
	typ := qp.UD
	if o.Reliable {
		typ = qp.RD
	}
	if pc.q, err = pc.pd.CreateQP(qp.QPAttr{Type: typ, SendCQ: pc.scq, RecvCQ: pc.rcq, RD: qp.RDConfig{Segment: o.Segment},
		Caps:               qp.QPCaps{MaxSendWR: o.SendSlots + 256, MaxRecvWR: wrCtlRecvs, MaxSendSGE: 2, MaxRecvSGE: 1, MaxInline: wrInlineMax},
		WriteRecordSegment: o.Segment, WriteRecord: writerecord.Config{Timeout: o.Deadline, Policy: policy}}); err != nil {
		return fail(err)
	}
	if pc.q.QPN() != ShimQPN {
		return fail(fmt.Errorf("socketshim: the QP got number %d, not %d", pc.q.QPN(), ShimQPN))
	}
	if err := pc.q.Activate(pc.sock); err != nil {
		return fail(err)
	}
	for i := range wrCtlRecvs {
		if err := c.repost(i); err != nil {
			return fail(err)
		}
	}
	pc.free = shim.NewSlots(o.SendSlots)
	pc.swcs = make([]qp.WorkCompletion, o.SendSlots+16)
	c.wcs = make([]qp.WorkCompletion, 32)
	c.watch.Init()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.watch.Run(pc.rcq, pc.closed, c.poll)
	}()
	if o.IdleTimeout > 0 {
		c.wg.Add(1)
		go c.sweep()
	}
	return c, nil
}

func (c *WRConn) repost(i int) error {
	return c.pc.q.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{c.pc.rbuf.SGE(i*wrCtlSize, wrCtlSize)}})
}

// Stats returns the mode's counters.
func (c *WRConn) Stats() *WRStats { return &c.stats }

//go:generate go run ../internal/genstats -in wrconn.go -type WRStats -out wrstats_snapshot.go

// Snapshot reads every counter once into plain integers, which print as
// numbers (fmt.Printf("%+v", conn.Stats().Snapshot())).
func (s *WRStats) Snapshot() WRStatsSnapshot {
	var out WRStatsSnapshot
	snapshot.Fill(&out, s)
	return out
}

// Device returns the PacketConn's device (for its counters).
func (c *WRConn) Device() *qp.Device { return c.pc.dev }

// LocalAddr returns the local address.
func (c *WRConn) LocalAddr() net.Addr { return c.pc.LocalAddr() }

// Close closes the connection; blocked reads and writes return at once.
func (c *WRConn) Close() error {
	err := c.pc.Close()
	c.wg.Wait()
	return err
}

// SetDeadline sets the read and write deadlines.
func (c *WRConn) SetDeadline(t time.Time) error { return c.pc.SetDeadline(t) }

// SetReadDeadline sets the deadline of ReadFrom calls, including one
// blocked now (one in the past interrupts it at once).
func (c *WRConn) SetReadDeadline(t time.Time) error { return c.pc.SetReadDeadline(t) }

// SetWriteDeadline sets the deadline of WriteTo calls, including one
// waiting for the handshake or for a slot.
func (c *WRConn) SetWriteDeadline(t time.Time) error { return c.pc.SetWriteDeadline(t) }

// SetReadBuffer sets the kernel receive buffer of the UDP socket.
func (c *WRConn) SetReadBuffer(bytes int) error { return c.pc.SetReadBuffer(bytes) }

// SetWriteBuffer sets the kernel send buffer.
func (c *WRConn) SetWriteBuffer(bytes int) error { return c.pc.SetWriteBuffer(bytes) }

// peerLocked returns the state for ap, making it (and its ring) if
// needed; an error when MaxPeers are known already. Its callers are the
// local WriteTo and messages whose source proved its address.
func (c *WRConn) peerLocked(ap netip.AddrPort) (*wrPeer, error) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if p := c.peers[ap]; p != nil {
		return p, nil
	}
	if len(c.peers) >= c.o.MaxPeers {
		return nil, fmt.Errorf("socketshim: %d Write-Record peers already (MaxPeers)", len(c.peers))
	}
	ah, err := c.pc.pd.CreateAH(ap, ShimQPN)
	if err != nil {
		return nil, err
	}
	var e [8]byte
	rand.Read(e[:])
	p := &wrPeer{ap: ap, ah: ah, myEpoch: binary.BigEndian.Uint64(e[:]) | 1, mine: c.cookie(ap), last: time.Now()}
	if err := c.newRingLocked(p, nil); err != nil {
		return nil, err
	}
	c.peers[ap] = p
	return p, nil
}

// newRingLocked registers a ring for p: fresh memory, or buf again under
// a new STag (a re-key: what is still on its way to the old STag is
// dropped by the stack, not placed). Records of the old ring not yet read
// are dropped with it (a re-key happens only when there are none).
func (c *WRConn) newRingLocked(p *wrPeer, buf []byte) error {
	if old := p.rx; old != nil {
		c.dropRingLocked(old)
	}
	if buf == nil {
		if n := len(c.spare); n > 0 {
			buf, c.spare = c.spare[n-1], c.spare[:n-1]
		} else {
			buf = make([]byte, c.o.Slots*c.o.SlotSize)
		}
	}
	mr, err := c.pc.pd.RegisterMemory(buf, qp.AccessLocalWrite|qp.AccessRemoteWrite)
	if err != nil {
		p.rx = nil
		return err
	}
	p.rx = &wrRing{peer: p, buf: buf, mr: mr}
	c.byTag[mr.STag()] = p.rx
	return nil
}

// dropRingLocked deregisters r (it waits for a placement in progress) and
// drops its records not yet read.
func (c *WRConn) dropRingLocked(r *wrRing) {
	delete(c.byTag, r.mr.STag())
	r.mr.Deregister()
	if r.peer.rx == r {
		r.peer.rx = nil
	}
	if r.queued == 0 {
		return
	}
	q := c.rq[:c.rqHead]
	for _, e := range c.rq[c.rqHead:] {
		if e.ring != r {
			q = append(q, e)
		} else {
			c.stats.Discarded.Add(1)
		}
	}
	clear(c.rq[len(q):])
	c.rq = q
	r.queued = 0
}

// forgetLocked drops every trace of p: ring, records unread, state. The
// ring's memory is kept for another peer if no ReadFrom can be copying
// from it (none of its records was queued).
func (c *WRConn) forgetLocked(p *wrPeer) {
	if r := p.rx; r != nil {
		idle := r.queued == 0
		c.dropRingLocked(r)
		if idle && len(c.spare) < wrSpare {
			c.spare = append(c.spare, r.buf)
		}
	}
	if c.peers[p.ap] == p {
		delete(c.peers, p.ap)
	}
}

// sweep forgets the peers that went quiet, until Close.
func (c *WRConn) sweep() {
	defer c.wg.Done()
	t := time.NewTicker(min(max(c.o.IdleTimeout/4, time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-c.pc.closed:
			return
		case now := <-t.C:
			c.mu.Lock()
			for _, p := range c.peers {
				if now.Sub(p.last) < c.o.IdleTimeout || (p.rx != nil && p.rx.queued > 0) {
					continue
				}
				if p.cookie != 0 && p.epoch != 0 {
					c.sendCtlLocked(p, c.ctlHeader(wrBye, 0, p)[:wrShortLen])
				}
				c.forgetLocked(p)
				c.stats.Expired.Add(1)
			}
			c.mu.Unlock()
		}
	}
}

// poll takes the receive CQ's completions: records queue for ReadFrom,
// control messages update the peers. It rings the shim.Bell on a change.
func (c *WRConn) poll() {
	c.pmu.Lock()
	changed := false
	for {
		n := c.pc.rcq.Poll(c.wcs)
		if n == 0 {
			break
		}
		changed = true
		now := time.Now()
		c.mu.Lock()
		for i := range c.wcs[:n] {
			c.handleLocked(&c.wcs[i], now)
		}
		c.mu.Unlock()
	}
	if len(c.probed) > 0 {
		c.mu.Lock()
		for _, r := range c.probed {
			c.probeLocked(r)
		}
		c.mu.Unlock()
		clear(c.probed)
		c.probed = c.probed[:0]
	}
	c.pmu.Unlock()
	if changed {
		c.bell.Ring()
	}
}

func (c *WRConn) handleLocked(wc *qp.WorkCompletion, now time.Time) {
	if wc.Opcode == qp.WCWriteRecord {
		c.recordLocked(wc, now)
		return
	}
	if wc.Status == qp.WRFlushError {
		return // the QP is closing: no receive again
	}
	if wc.Status != qp.Success || !wc.Solicited || wc.Len < wrShortLen {
		if c.repost(int(wc.ID)) != nil {
			return
		}
		if wc.Status == qp.Success {
			c.stats.Discarded.Add(1) // not ours: a plain datagram
		}
		return
	}
	var m [wrCtlSize]byte
	copy(m[:], c.pc.rbuf.Bytes()[int(wc.ID)*wrCtlSize:][:wc.Len])
	c.repost(int(wc.ID))
	c.controlLocked(wc.Source, m[:wc.Len], now)
}

// recordLocked queues a whole record that passes every check; the ring's
// owner pays for every record against its credits.
func (c *WRConn) recordLocked(wc *qp.WorkCompletion, now time.Time) {
	r := c.byTag[wc.STag]
	src := netip.AddrPortFrom(wc.Source.Addr().Unmap(), wc.Source.Port())
	if r == nil || src != r.peer.ap {
		c.stats.Discarded.Add(1) // a ring gone, or not the owner's record
		return
	}
	r.peer.last = now
	if r.arrivals++; r.arrivals > 2*c.o.Slots {
		// More than a writer keeping its credits can have: stop it here,
		// before it fills the CQ.
		c.stats.Overruns.Add(1)
		c.forgetLocked(r.peer)
		return
	}
	size := uint64(c.o.SlotSize)
	base := r.mr.Addr()
	switch {
	case wc.Status != qp.Success || (wc.Partial && !c.o.Partial),
		wc.TO < base || (wc.TO-base)%size != 0 || wc.Len < wrHeaderSize || uint64(wc.Len) > size:
		c.stats.Discarded.Add(1)
		return
	}
	off := int(wc.TO - base)
	slots := uint64(c.o.Slots)
	e := wrEntry{ring: r, off: off, n: int(wc.Len) - wrHeaderSize, partial: wc.Partial, header: true}
	if e.partial {
		e.valid, e.header = payloadRanges(wc.Valid, wc.TO, e.n)
	}
	if e.header {
		e.seq = binary.BigEndian.Uint64(r.buf[off:])
	} else {
		// The header was lost: the slot says which record it was, as
		// only one record number in the writer's window maps to it.
		lo := max(r.consumed, r.seen)
		e.seq = lo + (uint64(off)/size+slots-lo%slots)%slots
	}
	if e.seq < max(r.consumed, r.seen) || e.seq >= r.consumed+slots || e.seq%slots != uint64(off)/size {
		c.stats.Discarded.Add(1)
		return
	}
	r.seen = e.seq + 1
	r.queued++
	c.rq = append(c.rq, e)
}

// payloadRanges turns a partial record's valid ranges (tagged offsets,
// the record at to) into ranges of its n-byte payload, and says whether
// its whole header arrived.
func payloadRanges(valid []validitymap.Range, to uint64, n int) (out []validitymap.Range, header bool) {
	start := to + wrHeaderSize
	for _, v := range valid {
		if v.Start <= to && v.End >= start {
			header = true
		}
		lo, hi := max(v.Start, start), min(v.End, start+uint64(n))
		if lo < hi {
			out = append(out, validitymap.Range{Start: lo - start, End: hi - start})
		}
	}
	return out, header
}

// cookie is this socket's cookie for ap.
func (c *WRConn) cookie(ap netip.AddrPort) uint64 {
	return c.tokens.Issue(ap, ShimQPN, 0, ShimQPN, 0)
}

// controlLocked handles a control message from src.
func (c *WRConn) controlLocked(src netip.AddrPort, m []byte, now time.Time) {
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	want := 0
	kind, flags := m[4], m[5]
	switch kind {
	case wrHello:
		want = wrHelloLen
		c.stats.Handshakes.Add(1)
	case wrCredit, wrProbe:
		want = wrNoteLen
	case wrChallenge, wrBye:
		want = wrShortLen
	}
	if binary.BigEndian.Uint32(m) != wrMagic || want == 0 || len(m) < want {
		c.stats.Discarded.Add(1)
		return
	}
	m = m[:want]
	epoch, view := binary.BigEndian.Uint64(m[8:]), binary.BigEndian.Uint64(m[16:])
	mine, echo := binary.BigEndian.Uint64(m[want-16:]), binary.BigEndian.Uint64(m[want-8:])
	p := c.peers[src]
	var valid bool
	switch {
	case p != nil:
		valid = echo == p.mine // the same cookie, kept
	case kind != wrChallenge: // (one for no peer is dropped anyway)
		valid = c.tokens.Valid(echo, src, ShimQPN, 0, ShimQPN, 0)
	}
	if kind == wrChallenge {
		// The answer to a message of ours to a peer we know; anything else
		// is a forgery or a stray.
		if p == nil || !valid || mine == 0 {
			c.stats.Discarded.Add(1)
			return
		}
		p.cookie, p.last = mine, now
		c.helloLocked(p, true)
		return
	}
	if !valid {
		// The source has not shown it receives at its address: nothing
		// changes; a CHALLENGE (smaller than this message) goes there.
		c.challengeLocked(src, mine)
		return
	}
	// The source receives what is sent to src: it may make and change
	// its state here.
	switch kind {
	case wrBye:
		if p != nil && p.epoch == epoch && view == p.myEpoch {
			if p.rx == nil || p.rx.queued == 0 {
				c.forgetLocked(p)
			} else {
				p.tx = wrTx{} // our ring there is gone; its records here wait to be read
			}
		}
		return
	case wrHello:
		fresh := p == nil
		if fresh {
			var err error
			if p, err = c.peerLocked(src); err != nil {
				return // MaxPeers: its handshake times out
			}
		}
		p.cookie, p.last = mine, now
		restarted := p.epoch != 0 && p.epoch != epoch
		if restarted {
			// A new session of the peer: a new ring for it, and forget its
			// old one.
			p.tx = wrTx{}
			if c.newRingLocked(p, nil) != nil {
				return
			}
		}
		p.epoch = epoch
		stag, slots, size, base := binary.BigEndian.Uint32(m[24:]), int(binary.BigEndian.Uint32(m[28:])), int(binary.BigEndian.Uint32(m[32:])), binary.BigEndian.Uint64(m[40:])
		if slots < 2 || size < wrHeaderSize+1 {
			return
		}
		if !p.tx.ready || p.tx.stag != stag || p.tx.base != base {
			p.tx = wrTx{ready: true, stag: stag, base: base, slots: slots, size: size}
		}
		if flags&wrAnswer != 0 || view != p.myEpoch || restarted || fresh {
			c.helloLocked(p, false)
		}
		return
	}
	if p == nil || p.epoch != epoch || view != p.myEpoch {
		// From a peer we do not know (we forgot it, or missed its new
		// session), or that knows another session of ours: tell it who we
		// are.
		var err error
		if p, err = c.peerLocked(src); err != nil {
			return
		}
		if p.epoch != epoch {
			p.tx = wrTx{}
		}
		p.cookie, p.last = mine, now
		c.helloLocked(p, true)
		return
	}
	p.cookie, p.last = mine, now
	stag, n := binary.BigEndian.Uint32(m[24:]), binary.BigEndian.Uint64(m[32:])
	switch kind {
	case wrCredit:
		if p.tx.ready && p.tx.stag == stag && n > p.tx.freed && n <= p.tx.next {
			p.tx.freed = n
		}
	case wrProbe:
		r := p.rx
		switch {
		case r == nil:
		case r.mr.STag() != stag:
			c.helloLocked(p, false) // it writes to an old ring
		case r.queued == 0 && n > r.consumed:
			// Nothing waits to be read, yet the writer has records out.
			// It sent all of them before this PROBE; the last may still be
			// in progress at the QP, its last segments lost: ended now, it
			// is recorded at once (deliver-partial; discard drops it)
			// rather than at its deadline. Whether the others were lost
			// is decided once poll has taken every completion the QP made
			// so far, that one included (probeLocked).
			c.pc.q.EndWriteRecord(p.ap, ShimQPN, stag)
			if r.probe == 0 {
				c.probed = append(c.probed, r)
			}
			r.probe = max(r.probe, n)
		default:
			c.creditLocked(r)
		}
	}
}

// probeLocked answers the PROBEs of r's writer that found nothing to
// read while it had records out, now that poll has taken every completion
// the QP made up to them (the record EndWriteRecord ended for them, and
// one its deadline ended meanwhile, included).
func (c *WRConn) probeLocked(r *wrRing) {
	n := r.probe
	r.probe = 0
	switch {
	case r.peer.rx != r: // dropped meanwhile
	case r.queued > 0 || n <= r.consumed:
		c.creditLocked(r) // records came after all
	case r.reported+uint64(c.o.Slots) > n:
		// The writer probed before our last CREDIT reached it (it would
		// not be out of slots): once it does, it writes more records to
		// this ring, which a re-key would lose. Tell it C again.
		c.creditLocked(r)
	default:
		// Nothing waits to be read or is in progress, yet the writer has
		// records out, and knows every credit: they were lost. A new STag
		// makes sure none of them lands late in a slot the writer will
		// use again.
		c.stats.Rekeys.Add(1)
		if c.newRingLocked(r.peer, r.buf) == nil {
			c.helloLocked(r.peer, false)
		}
	}
}

// challengeLocked answers a message from src that did not echo our cookie
// for it: our cookie, and its own (mine) to prove the answer is ours. No
// state: an address handle made and dropped.
func (c *WRConn) challengeLocked(src netip.AddrPort, mine uint64) {
	ah, err := c.pc.pd.CreateAH(src, ShimQPN)
	if err != nil {
		return
	}
	m := c.ctl[:wrShortLen]
	clear(m)
	binary.BigEndian.PutUint32(m, wrMagic)
	m[4] = wrChallenge
	binary.BigEndian.PutUint64(m[24:], c.cookie(src))
	binary.BigEndian.PutUint64(m[32:], mine)
	c.pc.q.PostSend(&qp.SendWR{ID: inlineID, Flags: qp.FlagSolicited, Inline: m, AH: ah})
	c.stats.Challenges.Add(1)
}

// sendCtlLocked sends p a control message (unsignaled, solicited) made by
// ctlHeader and cut to its length, with its cookies at the end; a full
// queue drops it: every control message is sent again when it matters.
func (c *WRConn) sendCtlLocked(p *wrPeer, m []byte) {
	binary.BigEndian.PutUint64(m[len(m)-16:], p.mine)
	binary.BigEndian.PutUint64(m[len(m)-8:], p.cookie)
	c.pc.q.PostSend(&qp.SendWR{ID: inlineID, Flags: qp.FlagSolicited, Inline: m, AH: p.ah})
	p.last = time.Now()
}

func (c *WRConn) ctlHeader(kind, flags byte, p *wrPeer) []byte {
	m := c.ctl[:]
	clear(m)
	binary.BigEndian.PutUint32(m, wrMagic)
	m[4], m[5] = kind, flags
	binary.BigEndian.PutUint64(m[8:], p.myEpoch)
	binary.BigEndian.PutUint64(m[16:], p.epoch)
	return m
}

// helloLocked sends p our ring for it.
func (c *WRConn) helloLocked(p *wrPeer, answer bool) {
	if p.rx == nil {
		return
	}
	flags := byte(0)
	if answer {
		flags = wrAnswer
	}
	m := c.ctlHeader(wrHello, flags, p)
	binary.BigEndian.PutUint32(m[24:], p.rx.mr.STag())
	binary.BigEndian.PutUint32(m[28:], uint32(c.o.Slots))
	binary.BigEndian.PutUint32(m[32:], uint32(c.o.SlotSize))
	binary.BigEndian.PutUint64(m[40:], p.rx.mr.Addr())
	c.sendCtlLocked(p, m[:wrHelloLen])
}

// creditLocked tells r's writer which records it may write. When C moved,
// the writer's allowance of records starts again.
func (c *WRConn) creditLocked(r *wrRing) {
	m := c.ctlHeader(wrCredit, 0, r.peer)
	binary.BigEndian.PutUint32(m[24:], r.mr.STag())
	binary.BigEndian.PutUint64(m[32:], r.consumed)
	c.sendCtlLocked(r.peer, m[:wrNoteLen])
	if r.consumed != r.reported {
		r.arrivals = 0
	}
	r.reported = r.consumed
	c.stats.Credits.Add(1)
}

// ReadFrom reads the next whole record into b (a longer one is cut to
// len(b), as a UDP socket does) and returns its writer's address.
func (c *WRConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, ap, err := c.ReadFromUDPAddrPort(b)
	if err != nil {
		return n, nil, err
	}
	return n, net.UDPAddrFromAddrPort(ap), nil
}

// ReadFromUDPAddrPort is ReadFrom without the allocation of a net.Addr.
// It returns whole records only: a partial one (WROptions.Partial) is
// passed over and counted in WRStats.Discarded.
func (c *WRConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	r, err := c.read(b, false)
	return min(r.N, len(b)), r.Addr, err
}

// ReadRecord reads the next record into b, whole or, with
// WROptions.Partial, partial: Record says which bytes of it arrived. It
// is how a program uses partial delivery through the socket; a stream
// of MPEG-TS, say, keeps every 188-byte packet inside a valid range. It
// honours the read deadline and Close as ReadFrom does.
func (c *WRConn) ReadRecord(b []byte) (Record, error) {
	return c.read(b, true)
}

func (c *WRConn) read(b []byte, partialOK bool) (Record, error) {
	pc := c.pc
	pc.rmu.Lock()
	defer pc.rmu.Unlock()
	for {
		if pc.isClosed() {
			return Record{}, pc.opErr("read", errClosed)
		}
		if shim.Expired(&pc.Read) {
			return Record{}, pc.opErr("read", os.ErrDeadlineExceeded)
		}
		rang := c.bell.C()
		c.poll()
		c.mu.Lock()
		if c.rqHead < len(c.rq) {
			e := c.rq[c.rqHead]
			c.rq[c.rqHead] = wrEntry{}
			c.rqHead++
			if c.rqHead == len(c.rq) {
				c.rq, c.rqHead = c.rq[:0], 0
			}
			c.mu.Unlock()
			ok := !e.partial || partialOK
			var n int
			if ok {
				n = copy(b, e.ring.buf[e.off+wrHeaderSize:e.off+wrHeaderSize+e.n])
				if e.partial {
					zeroGaps(b[:n], e.valid)
				}
			}
			// Still the record queued? (Only a writer breaking the
			// credits, or a datagram older than the ring's turn, could
			// have rewritten it. A partial record whose header was lost
			// has nothing to check it by.)
			ok = ok && (!e.header || binary.BigEndian.Uint64(e.ring.buf[e.off:]) == e.seq)
			c.mu.Lock()
			r := e.ring
			if r.queued > 0 { // 0: its ring was dropped meanwhile
				r.queued--
			}
			r.consumed = max(r.consumed, e.seq+1)
			if r.peer.rx == r && r.consumed-r.reported >= uint64(max(1, c.o.Slots/4)) {
				c.creditLocked(r)
			}
			c.mu.Unlock()
			if !ok {
				c.stats.Discarded.Add(1)
				continue
			}
			return Record{N: e.n, Addr: r.peer.ap, Partial: e.partial, Valid: e.valid}, nil
		}
		c.mu.Unlock()
		if err := shim.Park(pc.dev, pc.rcq, &c.watch, &pc.Read, pc.ReadKick, pc.closed, rang, 0); err != nil {
			return Record{}, pc.opErr("read", err)
		}
	}
}

// zeroGaps clears the bytes of b outside the valid ranges: what a slot
// held before is not this record's.
func zeroGaps(b []byte, valid []validitymap.Range) {
	at := uint64(0)
	for _, v := range valid {
		if v.Start > at {
			clear(b[min(at, uint64(len(b))):min(v.Start, uint64(len(b)))])
		}
		at = max(at, v.End)
	}
	if at < uint64(len(b)) {
		clear(b[at:])
	}
}

// WriteTo writes b as one record into the next slot of addr's ring.
func (c *WRConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	var ap netip.AddrPort
	switch a := addr.(type) {
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		p, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return 0, c.pc.opErr("write", fmt.Errorf("socketshim: address %v: %w", addr, err))
		}
		ap = p
	}
	return c.WriteToUDPAddrPort(b, ap)
}

// WriteToUDPAddrPort is WriteTo for a netip.AddrPort.
func (c *WRConn) WriteToUDPAddrPort(b []byte, ap netip.AddrPort) (int, error) {
	pc := c.pc
	if len(b) > c.o.SlotSize-wrHeaderSize {
		return 0, pc.opErr("write", fmt.Errorf("socketshim: a %d-byte datagram, at most %d: %w", len(b), c.o.SlotSize-wrHeaderSize, errMessageTooLong))
	}
	if !ap.IsValid() || ap.Port() == 0 {
		return 0, pc.opErr("write", fmt.Errorf("socketshim: invalid destination %v", ap))
	}
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	for {
		if pc.isClosed() {
			return 0, pc.opErr("write", errClosed)
		}
		if shim.Expired(&pc.Write) {
			return 0, pc.opErr("write", os.ErrDeadlineExceeded)
		}
		rang := c.bell.C()
		c.poll()
		now := time.Now()
		c.mu.Lock()
		p, err := c.peerLocked(ap)
		if err != nil {
			c.mu.Unlock()
			return 0, pc.opErr("write", err)
		}
		t := &p.tx
		var tmo time.Duration
		switch {
		case !t.ready:
			if t.handshakeStart.IsZero() {
				t.handshakeStart, t.helloEvery = now, 20*time.Millisecond
			} else if now.Sub(t.handshakeStart) >= c.o.HandshakeTimeout {
				t.handshakeStart = time.Time{}
				c.mu.Unlock()
				return 0, pc.opErr("write", fmt.Errorf("%w: %v sent no answer within %v (Options.HandshakeTimeout)", ErrNoPeer, ap, c.o.HandshakeTimeout))
			}
			if now.Sub(t.helloAt) >= t.helloEvery {
				c.helloLocked(p, true)
				if !t.helloAt.IsZero() {
					t.helloEvery = min(2*t.helloEvery, 500*time.Millisecond)
				}
				t.helloAt = now
			}
			tmo = t.helloEvery - now.Sub(t.helloAt)
		case len(b)+wrHeaderSize > t.size:
			c.mu.Unlock()
			return 0, pc.opErr("write", fmt.Errorf("%w: %d bytes, the peer's slots take %d", ErrPeerSlots, len(b), t.size-wrHeaderSize))
		case t.next-t.freed < uint64(t.slots):
			seq, stag := t.next, t.stag
			to := t.base + (seq%uint64(t.slots))*uint64(t.size)
			t.next++
			t.creditStart = time.Time{}
			p.last = now
			ah := p.ah
			c.mu.Unlock()
			if err := c.post(b, seq, ah, stag, to); err != nil {
				return 0, pc.opErr("write", err)
			}
			return len(b), nil
		default: // no slot: probe, wait, in the end drop
			if t.creditStart.IsZero() {
				t.creditStart = now
			}
			if c.o.CreditWait < 0 || now.Sub(t.creditStart) >= c.o.CreditWait {
				t.creditStart = time.Time{}
				c.mu.Unlock()
				c.stats.Dropped.Add(1)
				return len(b), nil
			}
			const probeEvery = 5 * time.Millisecond
			if now.Sub(t.probeAt) >= probeEvery {
				m := c.ctlHeader(wrProbe, 0, p)
				binary.BigEndian.PutUint32(m[24:], t.stag)
				binary.BigEndian.PutUint64(m[32:], t.next)
				c.sendCtlLocked(p, m[:wrNoteLen])
				c.stats.Probes.Add(1)
				t.probeAt = now
			}
			tmo = min(probeEvery, c.o.CreditWait-now.Sub(t.creditStart))
		}
		c.mu.Unlock()
		if err := shim.Park(pc.dev, pc.rcq, &c.watch, &pc.Write, pc.WriteKick, pc.closed, rang, max(tmo, time.Millisecond)); err != nil {
			return 0, pc.opErr("write", err)
		}
	}
}

// post sends record seq (header, then b) as a Write-Record to (stag, to):
// inline, copied to a send slot, or from b itself (zero copy), by size.
func (c *WRConn) post(b []byte, seq uint64, ah *qp.AH, stag uint32, to uint64) error {
	pc := c.pc
	if pc.scq.Pending() > 0 {
		c.reapNow() // failed inline sends complete too: keep the CQ from filling
	}
	wr := qp.SendWR{ID: inlineID, Opcode: qp.OpWriteRecord, AH: ah, RemoteSTag: stag, RemoteTO: to}
	n := wrHeaderSize + len(b)
	switch {
	case n <= wrInlineMax:
		var m [wrInlineMax]byte
		binary.BigEndian.PutUint64(m[:], seq)
		copy(m[wrHeaderSize:], b)
		wr.Inline = m[:n]
		return pc.post(&wr)
	case n <= c.stage:
		i, ok := pc.free.Take()
		for ; !ok; i, ok = pc.free.Take() {
			if err := c.reap(false); err != nil {
				return err
			}
		}
		off := i * c.stage
		s := pc.sbuf.Bytes()[off : off+n]
		binary.BigEndian.PutUint64(s, seq)
		copy(s[wrHeaderSize:], b)
		wr.ID, wr.Flags, wr.SGL = uint64(i), qp.FlagSignaled, []qp.SGE{pc.sbuf.SGE(off, n)}
		if err := pc.post(&wr); err != nil {
			pc.free.Put(i)
			return err
		}
		return nil
	}
	// Zero copy: b registered for the time of the send.
	mr, err := pc.pd.RegisterMemory(b, 0)
	if err != nil {
		return err
	}
	defer mr.Deregister() // after the send completed, or, on a deadline, once no copy from b runs
	binary.BigEndian.PutUint64(c.hdr.Bytes(), seq)
	c.zcSeq++
	wr.ID, wr.Flags, wr.SGL = zcID-c.zcSeq, qp.FlagSignaled, []qp.SGE{c.hdr.SGE(0, wrHeaderSize), mr.SGE(0, len(b))}
	if err := pc.post(&wr); err != nil {
		return err
	}
	return c.reap(true)
}

// reapNow takes the send completions there are, freeing send slots.
func (c *WRConn) reapNow() {
	pc := c.pc
	n := pc.scq.Poll(pc.swcs)
	for _, wc := range pc.swcs[:n] {
		if wc.ID < uint64(c.o.SendSlots) {
			pc.free.Put(int(wc.ID))
		}
	}
}

// reap takes send completions, freeing send slots; with zc it waits for
// the current zero-copy send's, else for any (within the write deadline).
func (c *WRConn) reap(zc bool) error {
	pc := c.pc
	want := zcID - c.zcSeq
	for {
		got := false
		n := pc.scq.Poll(pc.swcs)
		for _, wc := range pc.swcs[:n] {
			switch {
			case wc.ID < uint64(c.o.SendSlots):
				pc.free.Put(int(wc.ID))
				got = got || !zc
			case wc.ID == want && zc:
				got = true
			}
		}
		if got {
			return nil
		}
		if n == 0 {
			if err := pc.wait(pc.scq, &pc.Write, pc.WriteKick); err != nil {
				return err
			}
		}
	}
}

var _ net.PacketConn = (*WRConn)(nil)
