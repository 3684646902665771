package reliability

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// Endpoint is the RD protocol of one RD QP as an engine that does no
// I/O (docs/wire.md §11): contact (Hello, the stateless Challenge, the
// keyed tokens of Tokens), sessions named by epochs, the graveyard of
// ended sessions, the peer table (MaxPeers, MaxPeersPerAddr, idle
// reclaim, held-byte budgets per peer and per endpoint, a heap of timed
// work), sequence numbers, acks (cumulative, selective, the error list,
// one ack per receive batch), retransmission, receiver-not-ready,
// zero-window probes, congestion control and pacing (Sender, Receiver).
//
// It has no goroutines, clocks or sockets. The caller hands it what
// happens — Receive (a frame read, its source, the time), EndBatch (the
// end of a read batch), Post (a message for a peer), Tick (the time, at
// or after Deadline), Writable (the socket has room again) — and it
// answers through the Host the caller implements: frames to send, the
// in-order segments to carry out, message completions and peer events.
// M is the caller's handle for a message (for a QP: its work request).
//
// What stays with the caller is what needs memory or a socket: the DDP
// segment of each Data frame (the Host appends it after the RD header
// the Endpoint built), placing what is delivered, completing work
// requests, the CRC and the send system call.
//
// Not safe for concurrent use: the caller serializes every call (a QP's
// lock). Host methods are called from inside these calls and must not
// call back into the Endpoint.
type Endpoint[M, P any] struct {
	cfg    EndpointConfig
	host   Host[M, P]
	rand   io.Reader
	tokens *Tokens
	graves *Graveyard[PeerKey]
	table[M, P]
	held  int // bytes every peer's receiver buffers ahead of gaps
	acks  []*peer[M, P]
	ready []*peer[M, P]
	// responses are the done messages posted with PostResponse, which
	// complete at the next complete, out of post order.
	responses []*Message[M, P]
	// delivering is set while Host.Deliver runs: Post and Responded
	// leave sending and completing to the Receive under way.
	delivering bool
	trains     *trainCtx[M, P] // made by the first train (trains.go)
	freeMsgs   []*Message[M, P]
	rxh        Header
	hb         [MaxHeaderSize]byte
	ack        AckBlock
	frame      Frame[M, P]
	// Stats counts what the endpoint did; the caller reads it under its
	// lock.
	Stats EndpointStats
}

// PeerKey names a peer: its address and QP number.
type PeerKey struct {
	Addr netip.AddrPort
	QPN  uint32
}

func (k PeerKey) String() string { return fmt.Sprintf("%v/qp%d", k.Addr, k.QPN) }

// EndpointConfig tunes an Endpoint. The zero value of each field but QPN
// is its default.
type EndpointConfig struct {
	// Config tunes each peer's Sender and Receiver.
	Config
	// QPN is the endpoint's QP number on the wire: its frames carry it,
	// and a frame to another number is not its (Receive returns
	// ErrNotMine).
	QPN uint32
	// MaxPeers caps the peers with state (default 1024): a first
	// contact over it reclaims the reclaimable peer touched longest ago,
	// or is dropped (its sender retries). MaxPeersPerAddr caps the peers
	// one address has (default 64), enforced on first contacts.
	MaxPeers, MaxPeersPerAddr int
	// IdleTimeout reclaims a peer with nothing outstanding after this
	// long without traffic, and one that holds frames ahead of a gap
	// after this long without the gap moving (default 30 s).
	IdleTimeout time.Duration
	// MaxHeldBytes is the most one peer's receiver buffers ahead of a
	// gap (default Window × 64 KiB), MaxEndpointHeldBytes the most all
	// of them do together (default 64 MiB). A frame over either is
	// dropped unacknowledged.
	MaxHeldBytes, MaxEndpointHeldBytes int
	// Graveyard is how many ended sessions a generation of the
	// graveyard keeps (default 1024; see Graveyard).
	Graveyard int
	// PaceSlack is how far ahead of the pacing clock a frame may leave
	// rather than wait for the timer (default 100 µs).
	PaceSlack time.Duration
	// ORD caps the messages awaiting a response (Post's awaits: RDMA
	// Reads and atomics) sent to one peer and not yet answered; later
	// messages wait in post order (default 16).
	ORD int
	// CompactAfter is how long a peer stays quiet before its Sender and
	// Receiver let go of their rings (default 1 s).
	CompactAfter time.Duration
	// Rand draws epochs, Hello tokens and token secrets (default
	// crypto/rand.Reader; a simulation passes a seeded one).
	Rand io.Reader
}

// Defaults of an EndpointConfig.
const (
	DefaultMaxPeers             = 1024
	DefaultMaxPeersPerAddr      = 64
	DefaultIdleTimeout          = 30 * time.Second
	DefaultMaxEndpointHeldBytes = 64 << 20
	DefaultGraveyard            = 1024
	DefaultPaceSlack            = 100 * time.Microsecond
	DefaultCompactAfter         = time.Second
	DefaultORD                  = 16
	maxHeldFrame                = 64 << 10
)

// Fill returns c with every zero field at its default.
func (c EndpointConfig) Fill() EndpointConfig {
	c.Config = c.Config.Fill()
	if c.MaxPeers <= 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if c.MaxPeersPerAddr <= 0 {
		c.MaxPeersPerAddr = DefaultMaxPeersPerAddr
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeldBytes <= 0 {
		c.MaxHeldBytes = c.Window * maxHeldFrame
	}
	if c.MaxEndpointHeldBytes <= 0 {
		c.MaxEndpointHeldBytes = DefaultMaxEndpointHeldBytes
	}
	if c.Graveyard <= 0 {
		c.Graveyard = DefaultGraveyard
	}
	if c.PaceSlack <= 0 {
		c.PaceSlack = DefaultPaceSlack
	}
	if c.ORD <= 0 {
		c.ORD = DefaultORD
	}
	if c.CompactAfter <= 0 {
		c.CompactAfter = DefaultCompactAfter
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return c
}

// Host is what an Endpoint's caller does for it. P is the caller's
// state per peer, which the Endpoint keeps in its own peer state
// (Peer.State): made zero with the peer, dropped when it is forgotten.
type Host[M, P any] interface {
	// SegmentSize returns the bytes segment i of m adds to a Data frame
	// after the RD header (its DDP segment), for congestion control's
	// count of bytes in flight.
	SegmentSize(m M, i uint32) int
	// Send transmits f. The frame is f.Header then, for a Data frame,
	// the DDP segment f.Index of f.Msg, which the caller appends (and
	// the CRC). f and its Header are valid only during the call.
	// ErrWouldBlock says the socket is full: a new Data frame is taken
	// back and goes when Writable is called; anything else counts as
	// sent (lost, for the protocol). A caller refuses here what it may
	// not send (a Challenge to a multicast or broadcast source).
	Send(f *Frame[M, P]) error
	// Deliver carries out the next in-order DDP segment from peer
	// (seq is its sequence number). ready false: the consumer cannot
	// take it now (receiver not ready; the peer sends it again later).
	// A Code other than 0 consumes it with that error, reported to the
	// peer in the acks. Deliver may call Post (a response to a request)
	// and Responded (a response that came): what they send goes when the
	// Receive that delivered ends.
	Deliver(peer *Peer[P], seq uint32, segment []byte) (ready bool, code Code)
	// Hold is asked before the endpoint buffers segment seq of peer
	// ahead of a gap: it returns the bytes to keep (a copy the caller
	// no longer touches; the segment's bytes are the caller's buffer),
	// whether the segment is a claim on a consumer's resource until it
	// is delivered (Receiver.Claim), and whether to keep it at all:
	// HoldDrop drops it (as if lost: the peer sends it again), HoldRenege
	// drops it and everything the peer's receiver holds (Receiver.Renege).
	Hold(peer *Peer[P], seq uint32, segment []byte, st HoldState) (kept []byte, claim bool, v HoldVerdict)
	// Complete reports that message m posted to peer is finished, in
	// post order per peer (a message posted with PostResponse as soon as
	// it is): err nil when every segment was acknowledged (and, for a
	// message posted with PostAwaits, its response noted by Responded),
	// else the failure (*RemoteError, ErrRetryExceeded,
	// ErrRNRRetryExceeded, ErrRemoteAborted, ErrFlushed, or what
	// Responded gave).
	Complete(peer *Peer[P], m M, err error)
	// Event reports a change of a peer's session (see Event).
	Event(peer *Peer[P], ev Event)
}

// Trainer is what a Host that can send several Data frames in one
// system call (a UDP GSO train) implements besides Host: the Endpoint
// then numbers a message's segments that may go together and hands them
// over at once.
type Trainer[M, P any] interface {
	// Train returns how many of m's segments from i on, of the n not
	// yet numbered, may go as one train (under 2: none).
	Train(m M, i, n uint32) int
	// SendTrain transmits fs, Data frames of one message back to back,
	// in one go: all of them, or none (ErrWouldBlock: the socket is
	// full; any other error: this train could not go, and its segments
	// go one at a time). fs and their headers are valid only during the
	// call.
	SendTrain(fs []Frame[M, P]) error
}

// Peer is a peer as its Endpoint shows it to the Host: its key and the
// Host's state for it.
type Peer[P any] struct {
	Key   PeerKey
	State P
}

// HoldState is what a peer's receiver holds when a segment would join
// it ahead of a gap (Host.Hold).
type HoldState struct {
	// Held is how many segments it holds, Claims how many of them are
	// claims (Receiver.Claims), HolesWith how many gaps they would span
	// with this one (Receiver.HolesWith).
	Held, Claims, HolesWith int
}

// HoldVerdict is a Host's answer to Hold.
type HoldVerdict uint8

const (
	HoldKeep   HoldVerdict = iota // buffer the segment
	HoldDrop                      // drop it, unacknowledged
	HoldRenege                    // drop it and everything the peer's receiver holds
)

// PostFlags qualify a message given to Post.
type PostFlags uint8

const (
	// PostAwaits: the message completes only once Responded too (an RDMA
	// Read or atomic, whose response the caller matches); ORD bounds
	// those in flight to a peer.
	PostAwaits PostFlags = 1 << iota
	// PostResponse: the message answers the peer's request (an RDMA
	// Read or Atomic Response): it completes as soon as it is acknowledged,
	// out of post order, and ends with its session (it never goes again
	// in a new one).
	PostResponse
	// PostQuiet: nobody waits on the message's completion, so its last
	// segment does not ask for an ack at once (FlagAckNow).
	PostQuiet
)

// Frame is one frame an Endpoint sends.
type Frame[M, P any] struct {
	Dst netip.AddrPort
	// Peer is the peer the frame goes to; nil for a Challenge to a
	// source without state.
	Peer   *Peer[P]
	Header []byte // the RD header
	Type   Type
	// Data frames: the segment of which message the caller appends.
	Msg   M
	Index uint32
	// First: the segment's first transmission (not a retransmission).
	First bool
}

// Event is a change of a peer's session that the caller may act on.
type Event uint8

const (
	// EventEstablished: a session with the peer is established (its
	// segments numbered from the first sequence number again).
	EventEstablished Event = iota + 1
	// EventSessionEnded: the peer's session ended (a new one, the peer
	// forgotten or given up on): what the caller holds of the peer's
	// messages in progress (a Send of several segments being placed,
	// Write-Records) ends with it; nothing more of them can arrive.
	EventSessionEnded
	// EventForgotten: the endpoint dropped the peer's state.
	EventForgotten
)

func (e Event) String() string {
	switch e {
	case EventEstablished:
		return "established"
	case EventSessionEnded:
		return "session ended"
	case EventForgotten:
		return "forgotten"
	}
	return fmt.Sprintf("Event(%d)", uint8(e))
}

// Errors of an Endpoint.
var (
	// ErrRemoteAborted: the peer's session ended with the message in
	// flight; the peer may or may not have carried it out.
	ErrRemoteAborted = errors.New("reliability: the peer's session ended with the message in flight")
	// ErrFlushed: Flush ended the message.
	ErrFlushed = errors.New("reliability: flushed")
	// ErrTooManyPeers: Post found the peer table full of peers that
	// cannot be reclaimed.
	ErrTooManyPeers = errors.New("reliability: too many peers with work outstanding")
	// ErrWouldBlock is what a Host's Send returns when the socket is full.
	ErrWouldBlock = errors.New("reliability: socket full")
	// ErrNotMine: Receive got a frame for another QP number.
	ErrNotMine = errors.New("reliability: frame for another QP")
)

// RemoteError is a message's failure the peer reported in an ack.
type RemoteError struct{ Code Code }

func (e *RemoteError) Error() string {
	return fmt.Sprintf("reliability: the peer refused a segment (code %d)", e.Code)
}

// EndpointStats counts an Endpoint's work.
type EndpointStats struct {
	Challenges, Rejected, Restarts, Reclaimed, AddrLimited, Refused uint64
	OverBudget, Buffered, Duplicates, BeyondWindow, NotReady        uint64
	DataSent, Retransmits, AcksSent, ControlSent, WindowProbes      uint64
	Trains                                                          uint64
	BadAcks, PeerFailures, Peers, Delivered, BadFrames              uint64
}

// Message is a message posted to a peer until it completes.
type Message[M, P any] struct {
	Handle  M
	peer    *peer[M, P]
	nseg    uint32
	sent    uint32 // segments numbered
	acked   uint32
	err     error
	done    bool
	again   bool // renew: in flight, provably not delivered, goes again
	awaits  bool
	resp    bool // its response came (Responded)
	reading bool // counted in its peer's reads (ORD)
	flags   PostFlags
}

// pkt is what a peer's sender keeps per frame.
type pkt[M, P any] struct {
	m *Message[M, P]
	i uint32
}

type peer[M, P any] struct {
	pub         Peer[P] // the Host's view: its key and the Host's state
	key         PeerKey
	epoch       uint32 // ours in this session
	prevEpoch   uint32 // ours before renew drew epoch, until established again
	established bool
	myToken     uint64 // the peer's frames carry it
	keyedToken  uint64 // or this one, a Challenge's, once seen
	theirToken  uint64 // ours to it carry it
	theirEpoch  uint32
	sendInit    bool
	snd         *Sender[pkt[M, P]]
	rcv         *Receiver[[]byte]
	queue       []*Message[M, P] // segments not yet all numbered, in post order
	posted      []*Message[M, P] // not completed, in post order, from postedAt
	postedAt    int
	helloAt     time.Time
	helloTries  int
	last        time.Time // last traffic
	moved       time.Time // the receiver last delivered (or the peer was made)
	probe       bool
	// opens are the peer epochs whose opening (Hello) we answered with
	// a Challenge carrying our epoch before our session with the peer
	// was established (see Receive, Challenge).
	opens   [4]uint32
	nopens  int
	reads   int // messages awaiting a response, sent and not answered (ORD)
	errs    [MaxAckErrors]AckError
	nerr    int
	held    int
	ackHeld bool
	ready   bool
	slots[M, P]
}

// NewEndpoint returns an Endpoint for QP cfg.QPN that answers through h.
func NewEndpoint[M, P any](cfg EndpointConfig, h Host[M, P]) *Endpoint[M, P] {
	cfg = cfg.Fill()
	e := &Endpoint[M, P]{cfg: cfg, host: h, rand: cfg.Rand}
	e.tokens = NewTokensFrom(cfg.Rand)
	e.graves = NewGraveyard[PeerKey](cfg.Graveyard, e.tokens)
	e.table.init()
	return e
}

// Config returns the endpoint's configuration, defaults filled.
func (e *Endpoint[M, P]) Config() EndpointConfig { return e.cfg }

// Peers returns how many peers have state.
func (e *Endpoint[M, P]) Peers() int { return len(e.peers) }

// PeersOf returns how many peers address addr has.
func (e *Endpoint[M, P]) PeersOf(addr netip.Addr) int { return e.perAddr[addr].n }

// Held returns the bytes all peers' receivers buffer ahead of gaps.
func (e *Endpoint[M, P]) Held() int { return e.held }

// Session returns the epochs of the session with peer k, ours and
// the peer's, if it has one established.
func (e *Endpoint[M, P]) Session(k PeerKey) (ours, theirs uint32, ok bool) {
	p := e.peers[k]
	if p == nil || !p.established {
		return 0, 0, false
	}
	return p.epoch, p.theirEpoch, true
}

// Graves returns how many ended sessions the endpoint remembers.
func (e *Endpoint[M, P]) Graves() int { return e.graves.Len() }

func (e *Endpoint[M, P]) newToken() uint64 {
	var b [8]byte
	for {
		io.ReadFull(e.rand, b[:])
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// Post queues message m of nseg segments (at least one) for peer k and
// sends what the windows allow now (or, called from Host.Deliver, when
// the Receive under way ends). flags qualify it (PostAwaits,
// PostResponse, PostQuiet). The returned Message names it to Responded
// and Cut.
func (e *Endpoint[M, P]) Post(now time.Time, k PeerKey, m M, nseg uint32, flags PostFlags) (*Message[M, P], error) {
	p, err := e.peerFor(now, k)
	if err != nil {
		return nil, err
	}
	w := e.newMessage()
	*w = Message[M, P]{Handle: m, peer: p, nseg: max(nseg, 1), awaits: flags&PostAwaits != 0, flags: flags}
	p.queue = append(p.queue, w)
	if flags&PostResponse == 0 {
		p.post(w)
	}
	switch {
	case e.delivering:
		// From Host.Deliver: the Receive under way sends it when it ends.
	case !p.established:
		if p.helloAt.IsZero() {
			e.hello(p, now)
		}
	default:
		e.pump(p, now)
	}
	e.touch(p)
	return w, nil
}

// maxFreeMessages bounds the completed messages an endpoint keeps for
// its next posts.
const maxFreeMessages = 256

func (e *Endpoint[M, P]) newMessage() *Message[M, P] {
	if n := len(e.freeMsgs); n > 0 {
		w := e.freeMsgs[n-1]
		e.freeMsgs[n-1] = nil
		e.freeMsgs = e.freeMsgs[:n-1]
		return w
	}
	return new(Message[M, P])
}

func (e *Endpoint[M, P]) freeMessage(w *Message[M, P]) {
	if len(e.freeMsgs) < maxFreeMessages {
		*w = Message[M, P]{}
		e.freeMsgs = append(e.freeMsgs, w)
	}
}

// post adds w to the messages posted to p. A full array whose front
// half or more is completed is compacted instead of grown, so that a
// peer with messages always outstanding allocates nothing per post.
func (p *peer[M, P]) post(w *Message[M, P]) {
	if len(p.posted) == cap(p.posted) && p.postedAt > 0 && p.postedAt >= len(p.posted)/2 {
		n := copy(p.posted, p.posted[p.postedAt:])
		clear(p.posted[n:])
		p.posted, p.postedAt = p.posted[:n], 0
	}
	p.posted = append(p.posted, w)
}

// Sent returns how many of the message's segments are numbered. A
// Message is the endpoint's again once its message completed Success
// (unless posted with PostAwaits): the caller lets go of it then.
func (w *Message[M, P]) Sent() uint32 { return w.sent }

// Cut ends w after the segments numbered so far and one more (which
// the Host sends short, an empty last segment): a Read Response whose
// source region went away. Nothing changes once all are numbered.
func (e *Endpoint[M, P]) Cut(w *Message[M, P]) {
	if !w.done && w.sent < w.nseg {
		w.nseg = w.sent + 1
	}
}

// Blocked reports whether peers wait for Writable: a full socket held
// them up.
func (e *Endpoint[M, P]) Blocked() bool { return e.writableAt < len(e.writable) }

// Responded notes that the response to w (posted with awaits) came,
// with err nil or the failure it shows; w completes once every segment
// of it is acknowledged too, and the next message awaiting a response
// may go (ORD).
func (e *Endpoint[M, P]) Responded(now time.Time, w *Message[M, P], err error) {
	if w.done || w.resp {
		return
	}
	w.resp = true
	if w.err == nil {
		w.err = err
	}
	p := w.peer
	w.unread()
	if w.acked == w.nseg {
		e.finish(w)
	}
	e.touch(p)
	if e.delivering {
		return // the Receive under way pumps and completes
	}
	if p.listed && p.established && len(p.queue) > 0 {
		e.pump(p, now)
	}
	e.complete()
}

// unread takes w off its peer's count of messages awaiting a response.
func (w *Message[M, P]) unread() {
	if w.reading {
		w.reading = false
		w.peer.reads--
	}
}

// hello (re)sends Hello to a peer we have no tokens from yet.
func (e *Endpoint[M, P]) hello(p *peer[M, P], now time.Time) {
	p.helloAt = now
	b := Append(e.hb[:0], &Fields{Type: Hello, Window: p.rcv.Window(), DstQPN: p.key.QPN, SrcQPN: e.cfg.QPN,
		Epoch: p.epoch, Init: true, Issued: p.myToken})
	e.control(p, p.key.Addr, Hello, b)
}

// control sends a frame without payload to dst (p's address, or a
// source without state: p nil), and reports whether it went.
func (e *Endpoint[M, P]) control(p *peer[M, P], dst netip.AddrPort, t Type, hdr []byte) bool {
	f := &e.frame
	*f = Frame[M, P]{Dst: dst, Header: hdr, Type: t}
	if p != nil {
		f.Peer = &p.pub
	}
	if e.host.Send(f) != nil {
		return false
	}
	e.Stats.ControlSent++
	return true
}

// frameOverhead is what a Data frame adds to its segment, near enough
// for the count of bytes in flight: the RD header with a sequence
// number, and the CRC.
const frameOverhead = HeaderSize + SeqSize + 4

// pump numbers and sends p's queued segments while its windows, its
// pacing and the socket allow.
func (e *Endpoint[M, P]) pump(p *peer[M, P], now time.Time) {
	for len(p.queue) > 0 {
		probing := false
		switch {
		case p.snd.CanSend(now):
			p.probe = false
		case p.probe:
			probing = true // the window is shut: one frame past it asks for a new one
		default:
			return
		}
		if !probing && !e.paced(p, now) {
			return // the pacing clock holds it: the timer sends it
		}
		w := p.queue[0]
		if w.done { // failed meanwhile
			p.popQueue()
			continue
		}
		if w.awaits && !w.reading && p.reads >= e.cfg.ORD {
			return // ORD reached: later messages wait their turn, in order
		}
		if !probing {
			k, blocked := e.train(p, w, now)
			if blocked {
				e.waitWritable(p)
				return
			}
			if k > 0 {
				if w.sent == w.nseg {
					p.popQueue()
				}
				continue
			}
		}
		pk := pkt[M, P]{m: w, i: w.sent}
		seq := p.snd.Push(pk, e.host.SegmentSize(w.Handle, w.sent)+frameOverhead, now)
		tail := w.sent+1 == w.nseg && len(p.queue) == 1 && w.flags&PostQuiet == 0
		if err := e.data(p, seq, &pk, now, probing || tail, true); err == ErrWouldBlock {
			p.snd.Unpush(seq)
			e.waitWritable(p)
			return
		}
		if probing {
			p.probe = false
			e.Stats.WindowProbes++
		}
		if w.awaits && !w.reading {
			w.reading = true
			p.reads++
		}
		w.sent++
		if w.sent == w.nseg {
			p.popQueue()
		}
	}
	// Nothing more to send: what the peer acks until what is in flight
	// is acked measures us, not the path.
	p.snd.SetAppLimited()
}

func (p *peer[M, P]) popQueue() {
	p.queue[0] = nil
	if len(p.queue) == 1 {
		p.queue = p.queue[:0]
		return
	}
	p.queue = p.queue[1:]
}

// data builds and sends Data frame seq for pk, with an ack for p
// piggybacked when one is due.
func (e *Endpoint[M, P]) data(p *peer[M, P], seq uint32, pk *pkt[M, P], now time.Time, ackNow, first bool) error {
	f := Fields{Type: Data, Window: p.rcv.Window(), DstQPN: p.key.QPN, SrcQPN: e.cfg.QPN,
		Epoch: p.epoch, Token: p.theirToken, Seq: seq, Init: p.sendInit, Issued: p.myToken, AckNow: ackNow}
	if !p.rcv.AckDue(now).IsZero() {
		f.Ack = e.ackBlock(p, now, &f.RNR)
	}
	fr := &e.frame
	*fr = Frame[M, P]{Dst: p.key.Addr, Peer: &p.pub, Header: Append(e.hb[:0], &f), Type: Data, Msg: pk.m.Handle, Index: pk.i, First: first}
	err := e.host.Send(fr)
	if err != ErrWouldBlock {
		p.last = now
		e.Stats.DataSent++
	}
	return err
}

// ackBlock fills the endpoint's ack block for p, with p's recent errors.
func (e *Endpoint[M, P]) ackBlock(p *peer[M, P], now time.Time, rnr *bool) *AckBlock {
	a := &e.ack
	*rnr = p.rcv.Ack(a, now)
	for i := 0; i < p.nerr; i++ {
		er := p.errs[i]
		if Before(er.Seq, a.Cumulative) && a.Cumulative-er.Seq < uint32(e.cfg.Window)*4 {
			a.Errors = append(a.Errors, er)
		}
	}
	return a
}

func (e *Endpoint[M, P]) sendAck(p *peer[M, P], now time.Time) {
	f := Fields{Type: Ack, Window: p.rcv.Window(), DstQPN: p.key.QPN, SrcQPN: e.cfg.QPN,
		Epoch: p.epoch, Token: p.theirToken, Init: p.sendInit, Issued: p.myToken}
	f.Ack = e.ackBlock(p, now, &f.RNR)
	e.control(p, p.key.Addr, Ack, Append(e.hb[:0], &f))
	e.Stats.AcksSent++
}

func (p *peer[M, P]) noteErr(seq uint32, code Code) {
	if p.nerr < len(p.errs) {
		p.nerr++
	} else {
		copy(p.errs[:], p.errs[1:])
	}
	p.errs[p.nerr-1] = AckError{Seq: seq, Code: code}
}

// Receive runs one RD frame (without its CRC, which the caller checked)
// from src through the endpoint. An ack it makes due waits for EndBatch,
// so that one ack answers every frame of a read batch: a caller that
// does not read in batches calls EndBatch after each Receive. It returns
// an error for a frame that does not parse (counted, nothing changed)
// or that names another QP (ErrNotMine).
func (e *Endpoint[M, P]) Receive(now time.Time, src netip.AddrPort, frame []byte) error {
	h := &e.rxh // the endpoint's: a Header on the stack would escape
	if err := h.Parse(frame); err != nil {
		e.Stats.BadFrames++
		return err
	}
	return e.ReceiveParsed(now, src, h, frame)
}

// ReceiveParsed is Receive for a caller that parsed the frame's header
// already (to find the endpoint it goes to): h is frame's, parsed.
func (e *Endpoint[M, P]) ReceiveParsed(now time.Time, src netip.AddrPort, h *Header, frame []byte) error {
	if h.DstQPN != e.cfg.QPN {
		return ErrNotMine
	}
	k := PeerKey{src, h.SrcQPN}
	p := e.peers[k]
	switch h.Type {
	case Hello:
		e.challenge(h, len(frame), src, h.Issued, p)
		return nil
	case Challenge:
		switch {
		case p != nil && !p.established && h.Token == p.myToken:
			p.theirEpoch, p.theirToken, p.established, p.sendInit = h.Epoch, h.Issued, true, true
			p.keyedToken = 0
			// A Challenge we sent meanwhile to an opening of the peer's
			// under another epoch issued a token that still verifies
			// (it binds our epoch, which stays): a Data frame of that
			// opening, late, would otherwise end this session as if the
			// peer had opened again, while the peer, which answered our
			// Hello without state, lives on in this one — and deliver
			// what we completed as aborted. The peer answered without
			// state (its epoch differs), so that opening's state is gone:
			// it is buried.
			for _, ep := range p.opens[:p.nopens] {
				if ep != h.Epoch {
					e.graves.Bury(k, ep)
				}
			}
			p.nopens = 0
			e.host.Event(&p.pub, EventEstablished)
		case p != nil && p.established && h.Token == p.theirToken:
			// The peer answered a frame of this session with a
			// Challenge: it has no state for it, and it proved it is
			// where our frames go. The session is over; we open a new one.
			e.Stats.Restarts++
			e.touch(p)
			e.renew(p, h.Window, now)
			e.complete()
			return nil
		default:
			e.Stats.Rejected++
			return nil
		}
		p.last = now
		e.touch(p)
	case Data, Ack:
		known := p != nil && p.established && h.Epoch == p.theirEpoch
		var epoch uint32
		switch {
		case known && (h.Token == p.myToken || h.Token == p.keyedToken && h.Token != 0):
		case known && e.tokens.Valid(h.Token, src, h.SrcQPN, h.Epoch, e.cfg.QPN, p.epoch):
			// The keyed token of a Challenge of ours (both sides opened
			// at once): kept, so that it counts after the secret turns.
			p.keyedToken = h.Token
		case h.Type == Data && h.HasInit && e.keyed(p, h, src, &epoch):
			// First contact, validated: the source received our Challenge.
			switch {
			case p == nil:
				if !e.addrRoom(src.Addr(), now) {
					e.Stats.AddrLimited++
					return nil
				}
				if !e.room(now) {
					e.Stats.Refused++
					return nil
				}
				p = e.newPeer(k, now)
			case p.established:
				// A new session from a return-routable source: the
				// peer reopened.
				e.Stats.Restarts++
				e.restart(p, now)
			}
			p.epoch, p.prevEpoch, p.nopens = epoch, 0, 0
			p.myToken, p.theirToken, p.theirEpoch, p.established, p.sendInit = h.Token, h.Issued, h.Epoch, true, false
			p.keyedToken = 0
			e.host.Event(&p.pub, EventEstablished)
		case h.Type == Data:
			// No state, a stale epoch or a wrong token: a Challenge no
			// larger than the frame; nothing changes.
			e.Stats.Rejected++
			if h.HasInit && p != nil && p.established && h.Epoch != p.theirEpoch && !e.graves.Buried(k, h.Epoch) {
				if _, ok := e.tokens.Derive(h.Token, src, h.SrcQPN, h.Epoch, e.cfg.QPN); ok {
					// A session opening with a keyed token of a Challenge
					// we sent without state, refused because another
					// session with the source began meanwhile. Our
					// Challenge tells its sender it found no session, so
					// it sends the frame's messages again in a new one
					// (renew): this session must never open after, from
					// another copy of the frame, once we drop the other.
					e.graves.Bury(k, h.Epoch)
				}
			}
			e.challenge(h, len(frame), src, h.Token, p)
			return nil
		default:
			e.Stats.Rejected++
			return nil
		}
		p.last = now
		e.touch(p)
		if h.HasAck {
			p.sendInit = false // the peer has our state
			if err := e.onAck(p, h, now); err != nil {
				e.failPeer(p, err)
				e.complete()
				return nil
			}
		}
		if h.Type == Data {
			e.onData(p, h, frame[h.Size:], now)
		}
	}
	if p.established && len(p.queue) > 0 {
		e.pump(p, now)
	}
	if due := p.rcv.AckDue(now); !due.IsZero() && !due.After(now) && !p.ackHeld {
		p.ackHeld = true
		e.acks = append(e.acks, p)
		e.touch(p)
	}
	e.complete()
	return nil
}

// Refused ends contact with the peer at (src, qpn) when the datagram
// that refused it echoes the token of our Hello, which only a receiver
// of the Hello knows: the peer will not talk to us (it protects its
// datagrams in another mode, package protect). Every message to it ends
// with err. It reports whether it ended one.
func (e *Endpoint[M, P]) Refused(src netip.AddrPort, qpn uint32, token uint64, err error) bool {
	p := e.peers[PeerKey{src, qpn}]
	if p == nil || p.established || token == 0 || p.myToken != token {
		return false
	}
	e.Stats.PeerFailures++
	e.abort(p, err, true)
	e.forget(p)
	e.complete()
	return true
}

// EndBatch sends the acks the frames of the batch just read made due,
// one per peer (a Data frame sent back meanwhile may have carried it).
func (e *Endpoint[M, P]) EndBatch(now time.Time) {
	for i, p := range e.acks {
		p.ackHeld = false
		e.acks[i] = nil
		e.touch(p)
		if e.peers[p.key] == p && p.established {
			if due := p.rcv.AckDue(now); !due.IsZero() && !due.After(now) {
				e.sendAck(p, now)
			}
		}
	}
	e.acks = e.acks[:0]
}

// keyed reports whether h, a Data frame opening a session, carries the
// keyed token a Challenge of ours issued for its source and epoch, and
// sets *epoch to ours in that session. A buried session is not opened
// again.
func (e *Endpoint[M, P]) keyed(p *peer[M, P], h *Header, src netip.AddrPort, epoch *uint32) bool {
	if e.graves.Buried(PeerKey{src, h.SrcQPN}, h.Epoch) {
		return false
	}
	if p != nil && e.tokens.Valid(h.Token, src, h.SrcQPN, h.Epoch, e.cfg.QPN, p.epoch) {
		*epoch = p.epoch
		return true
	}
	if p != nil && !p.established && p.prevEpoch != 0 && e.tokens.Valid(h.Token, src, h.SrcQPN, h.Epoch, e.cfg.QPN, p.prevEpoch) {
		// The peer opened a new session and took the epoch a Challenge
		// of ours gave before we renewed (docs/wire.md §11.2).
		*epoch = p.prevEpoch
		return true
	}
	if p == nil || !p.established {
		if d, ok := e.tokens.Derive(h.Token, src, h.SrcQPN, h.Epoch, e.cfg.QPN); ok {
			*epoch = d
			return true
		}
	}
	return false
}

// challenge answers a source without valid state, echoing echo, if the
// Challenge is no larger than the frame (size, without its CRC) that
// drew it.
func (e *Endpoint[M, P]) challenge(h *Header, size int, src netip.AddrPort, echo uint64, p *peer[M, P]) {
	if h.SrcQPN == 0 || h.SrcQPN > 1<<24-1 {
		return
	}
	var epoch uint32
	if p != nil {
		epoch = p.epoch
	} else {
		epoch = e.tokens.Epoch(src, h.SrcQPN, h.Epoch, e.cfg.QPN)
	}
	var seq16 uint16
	if h.Type == Data {
		seq16 = uint16(h.Seq)
	}
	if p != nil && !p.established && h.Type == Hello {
		if p.nopens == len(p.opens) {
			copy(p.opens[:], p.opens[1:])
			p.nopens--
		}
		p.opens[p.nopens] = h.Epoch
		p.nopens++
	}
	b := Append(e.hb[:0], &Fields{Type: Challenge, Window: seq16, DstQPN: h.SrcQPN, SrcQPN: e.cfg.QPN,
		Epoch: epoch, Token: echo, Init: true, Issued: e.tokens.Issue(src, h.SrcQPN, h.Epoch, e.cfg.QPN, epoch)})
	if len(b) > size {
		return // 1x: never more bytes to an unvalidated source than it sent
	}
	if e.control(nil, src, Challenge, b) {
		e.Stats.Challenges++
	}
}

// onAck applies an ack to p's sender.
func (e *Endpoint[M, P]) onAck(p *peer[M, P], h *Header, now time.Time) error {
	a := &h.Ack
	err := p.snd.OnAck(a, h.Window, h.HasRNR, now,
		func(seq uint32, pk *pkt[M, P]) {
			w := pk.m
			code, bad := a.Error(seq)
			if bad && w.err == nil {
				w.err = &RemoteError{Code: code}
			}
			w.acked++
			switch {
			case w.acked < w.nseg || w.done:
				return
			case w.awaits && !bad && !w.resp:
				return // when its response comes (Responded)
			}
			w.unread() // refused: no response will come
			e.finish(w)
		},
		func(seq uint32, pk *pkt[M, P]) {
			e.Stats.Retransmits++
			e.data(p, seq, pk, now, false, false)
		})
	if errors.Is(err, ErrAckUnsent) {
		e.Stats.BadAcks++
		return nil
	}
	return err
}

// onData runs a Data frame's sequence number through p's receiver and
// delivers what is in order.
func (e *Endpoint[M, P]) onData(p *peer[M, P], h *Header, seg []byte, now time.Time) {
	if h.WantsAck {
		p.rcv.Urge()
	}
	deliver := func(seq uint32, b []byte) bool {
		e.delivering = true
		ready, code := e.host.Deliver(&p.pub, seq, b)
		e.delivering = false
		if !ready {
			e.Stats.NotReady++
			return false
		}
		if code != 0 {
			p.noteErr(seq, code)
		}
		e.Stats.Delivered++
		if seq != h.Seq { // one the receiver held
			e.unhold(p, b)
		}
		return true
	}
	next := p.rcv.Next()
	switch v := p.rcv.Classify(h.Seq); v {
	case Buffered:
		if e.overBudget(p, len(seg)) {
			return
		}
		kept, claim, hv := e.host.Hold(&p.pub, h.Seq, seg, HoldState{Held: p.rcv.Held(), Claims: p.rcv.Claims(), HolesWith: p.rcv.HolesWith(h.Seq)})
		switch {
		case hv == HoldRenege:
			p.rcv.Renege() // its release takes each off the budgets
			return
		case hv != HoldKeep, e.overBudget(p, len(kept)):
			return
		}
		if p.rcv.Held() == 0 {
			// A gap opens now: the idle clock of what the peer holds
			// starts here, not at the last delivery, or a peer quiet for
			// IdleTimeout whose next frames arrive out of order would be
			// reclaimed with them in flight (reclaimAt).
			p.moved = now
		}
		p.held += len(kept)
		e.held += len(kept)
		p.rcv.Receive(h.Seq, kept, now, deliver)
		if claim {
			p.rcv.Claim(h.Seq)
		}
		e.Stats.Buffered++
	case Duplicate:
		p.rcv.Receive(h.Seq, nil, now, deliver)
		e.Stats.Duplicates++
	case Beyond:
		p.rcv.Receive(h.Seq, nil, now, deliver)
		e.Stats.BeyondWindow++
	default:
		p.rcv.Receive(h.Seq, seg, now, deliver)
	}
	if p.rcv.Next() != next {
		p.moved = now
	}
}

// overBudget reports whether n more bytes held for p would pass p's or
// the endpoint's budget, and counts it: such a frame is dropped
// unacknowledged, as if lost.
func (e *Endpoint[M, P]) overBudget(p *peer[M, P], n int) bool {
	if p.held+n > e.cfg.MaxHeldBytes || e.held+n > e.cfg.MaxEndpointHeldBytes {
		e.Stats.OverBudget++
		return true
	}
	return false
}

func (e *Endpoint[M, P]) unhold(p *peer[M, P], b []byte) {
	p.held -= len(b)
	e.held -= len(b)
}

func (e *Endpoint[M, P]) newReceiver(p *peer[M, P]) *Receiver[[]byte] {
	return NewReceiver[[]byte](e.cfg.Config, func(b []byte) { e.unhold(p, b) })
}

// finish marks w done: a response completes at the next complete, any
// other message when those posted before it to its peer have.
func (e *Endpoint[M, P]) finish(w *Message[M, P]) {
	w.done = true
	if w.flags&PostResponse != 0 {
		e.responses = append(e.responses, w)
		return
	}
	e.finished(w.peer)
}

func (e *Endpoint[M, P]) finished(p *peer[M, P]) {
	if !p.ready {
		p.ready = true
		e.ready = append(e.ready, p)
	}
}

// complete completes the finished messages of the peers that have any,
// in post order per peer: a message waits for those posted before it to
// the same peer, never for another peer's.
func (e *Endpoint[M, P]) complete() {
	for i := 0; i < len(e.responses); i++ {
		w := e.responses[i]
		e.responses[i] = nil
		e.host.Complete(&w.peer.pub, w.Handle, w.err)
	}
	e.responses = e.responses[:0]
	for i := 0; i < len(e.ready); i++ {
		p := e.ready[i]
		e.ready[i] = nil
		p.ready = false
		for p.postedAt < len(p.posted) && p.posted[p.postedAt].done {
			w := p.posted[p.postedAt]
			p.posted[p.postedAt] = nil
			p.postedAt++
			e.host.Complete(&p.pub, w.Handle, w.err)
			if w.err == nil && w.flags&PostAwaits == 0 {
				// Acknowledged whole: nothing of the endpoint's refers
				// to it (its frames left the sender, it left the
				// queue), and the caller had no use for it (Responded,
				// Cut): the next Post takes it.
				e.freeMessage(w)
			}
		}
		if p.postedAt == len(p.posted) {
			p.posted, p.postedAt = p.posted[:0], 0
		} else if p.postedAt >= len(p.posted)/2 {
			n := copy(p.posted, p.posted[p.postedAt:])
			clear(p.posted[n:])
			p.posted, p.postedAt = p.posted[:n], 0
		}
		e.touch(p)
	}
	e.ready = e.ready[:0]
}

// failPeer fails every message to p with err (mapped from the sender's)
// and drops its state; the endpoint goes on serving its other peers.
func (e *Endpoint[M, P]) failPeer(p *peer[M, P], err error) {
	if !errors.Is(err, ErrRNRRetryExceeded) {
		err = ErrRetryExceeded
	}
	e.Stats.PeerFailures++
	e.abort(p, err, true)
	e.forget(p)
}

// abort ends with err every message to p in flight and, if all, those
// still queued too.
func (e *Endpoint[M, P]) abort(p *peer[M, P], err error, all bool) {
	p.snd.Each(func(_ uint32, pk *pkt[M, P]) {
		if w := pk.m; !w.done && !w.again {
			w.err = err
			e.finish(w)
		}
	})
	p.snd.Reset()
	p.rcv.Reset()
	keep := p.queue[:0]
	for _, w := range p.queue {
		switch {
		case w.done:
		case all || w.sent > 0 || w.flags&PostResponse != 0:
			// A response answers the old session: it ends with it.
			w.err = err
			e.finish(w)
		default:
			keep = append(keep, w)
		}
	}
	clear(p.queue[len(keep):])
	p.queue = keep
	for _, w := range p.posted[p.postedAt:] {
		if !w.done && !w.again && (all || w.sent > 0) {
			w.err = err
			e.finish(w)
		}
		if w.done {
			w.unread()
		}
	}
	e.finished(p)
}

// bury remembers that p's session ended.
func (e *Endpoint[M, P]) bury(p *peer[M, P]) {
	e.host.Event(&p.pub, EventSessionEnded)
	if p.established {
		e.graves.Bury(p.key, p.theirEpoch)
	}
}

// restart handles a peer that came back with a new session: messages in
// flight to its old one fail with ErrRemoteAborted, queued ones start
// over in the new session, and the old session is buried.
func (e *Endpoint[M, P]) restart(p *peer[M, P], now time.Time) {
	e.bury(p)
	e.abort(p, ErrRemoteAborted, false)
	p.probe = false
	p.snd = NewSender[pkt[M, P]](e.cfg.Config)
	p.rcv = e.newReceiver(p)
	p.nerr = 0
	p.established = false
	p.last = now
}

// renew ends p's session after the peer answered its frame seq16 with a
// Challenge, and opens a new one. If the challenged frame went only
// once, its one copy found no session, so the peer carried out neither
// it nor anything after it: the messages wholly at or after it go again
// in the new session; those before it complete with ErrRemoteAborted.
func (e *Endpoint[M, P]) renew(p *peer[M, P], seq16 uint16, now time.Time) {
	cut := p.snd.Next()
	if seq, once, ok := p.snd.Find(seq16); ok && once {
		cut = seq
	}
	var again []*Message[M, P]
	var last *Message[M, P]
	p.snd.Each(func(seq uint32, pk *pkt[M, P]) {
		w := pk.m
		if w == last {
			return
		}
		last = w
		if !w.done && w.acked == 0 && w.flags&PostResponse == 0 && !Before(seq, cut) {
			w.again = true
			again = append(again, w)
		}
	})
	for _, w := range again {
		w.sent, w.acked = 0, 0
		w.unread()
	}
	e.restart(p, now)
	queue := make([]*Message[M, P], 0, len(again)+len(p.queue))
	queue = append(queue, again...)
	for _, w := range p.queue {
		if !w.again && !w.done {
			queue = append(queue, w)
		}
	}
	for _, w := range again {
		w.again = false
	}
	p.queue = queue
	p.prevEpoch, p.epoch = p.epoch, newEpochFrom(e.rand)
	p.myToken = e.newToken()
	p.theirToken, p.theirEpoch, p.sendInit, p.keyedToken = 0, 0, false, 0
	p.helloAt, p.helloTries = time.Time{}, 0
	if len(p.queue) == 0 {
		e.forget(p) // nothing to send: contact waits for the next message
		return
	}
	e.hello(p, now)
}

// Tick runs the endpoint's timers at now (at or after Deadline).
func (e *Endpoint[M, P]) Tick(now time.Time) {
	for _, p := range e.takeDue(now) {
		if !p.listed {
			continue // forgotten by an earlier one's work
		}
		if !p.established {
			if !p.helloAt.IsZero() && !now.Before(p.helloAt.Add(e.helloWait(p))) {
				if p.helloTries >= e.cfg.MaxRetries {
					e.failPeer(p, ErrRetryExceeded)
					continue
				}
				p.helloTries++
				e.hello(p, now)
			}
			continue
		}
		if d := p.snd.Deadline(); !d.IsZero() && !now.Before(d) {
			err := p.snd.OnTimer(now, func(seq uint32, pk *pkt[M, P]) {
				e.Stats.Retransmits++
				e.data(p, seq, pk, now, true, false)
			})
			if err != nil {
				e.failPeer(p, err)
				continue
			}
		}
		// An ack held for the end of a batch is that batch's (EndBatch).
		if due := p.rcv.AckDue(now); !p.ackHeld && !due.IsZero() && !now.Before(due) {
			e.sendAck(p, now)
		}
		if len(p.queue) > 0 {
			// A zero window holds our queued work: probe it, and give
			// the peer up when the probes run out.
			due, err := p.snd.Probe(now)
			if err != nil {
				e.failPeer(p, err)
				continue
			}
			p.probe = p.probe || due
		}
		if len(p.queue) > 0 && !p.waiting {
			e.pump(p, now)
		}
		e.compact(p, now)
		if at := e.reclaimAt(p); !at.IsZero() && now.After(at) {
			e.forget(p)
			e.Stats.Reclaimed++
		}
	}
	e.complete()
}

func (e *Endpoint[M, P]) helloWait(p *peer[M, P]) time.Duration {
	return min(e.cfg.InitialRTT<<min(p.helloTries, 20), e.cfg.MaxRTO)
}

func (e *Endpoint[M, P]) compact(p *peer[M, P], now time.Time) {
	if p.quiet() && !now.Before(p.last.Add(e.cfg.CompactAfter)) {
		p.snd.Compact()
		p.rcv.Compact()
		if p.postedAt == len(p.posted) {
			p.posted, p.postedAt = nil, 0
		}
	}
}

// Writable tells the endpoint the socket has room again: the peers a
// full socket held up send, in the order it held them.
func (e *Endpoint[M, P]) Writable(now time.Time) {
	for e.writableAt < len(e.writable) {
		p := e.writable[e.writableAt]
		e.writable[e.writableAt] = nil
		e.writableAt++
		p.waiting = false
		if p.listed && p.established && len(p.queue) > 0 {
			e.touch(p)
			e.pump(p, now)
			if p.waiting {
				return // full again
			}
		}
	}
	e.writable, e.writableAt = e.writable[:0], 0
}

func (e *Endpoint[M, P]) waitWritable(p *peer[M, P]) {
	if !p.waiting {
		p.waiting = true
		e.writable = append(e.writable, p)
	}
}

// Flush ends every message with ErrFlushed and forgets every peer,
// burying their sessions (the QP moved to ERROR).
func (e *Endpoint[M, P]) Flush() {
	for _, p := range e.byAge() {
		e.abort(p, ErrFlushed, true)
		e.forget(p)
	}
	e.complete()
}

// byAge returns the peers in the order they were made (a deterministic
// order for Flush).
func (e *Endpoint[M, P]) byAge() []*peer[M, P] {
	ps := make([]*peer[M, P], 0, len(e.peers))
	for _, p := range e.peers {
		ps = append(ps, p)
	}
	for i := 1; i < len(ps); i++ { // insertion sort by id: Flush is rare
		for j := i; j > 0 && ps[j].id < ps[j-1].id; j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
	return ps
}
