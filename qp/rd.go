package qp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/protect"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// RD: reliable datagram queue pairs. One RD QP talks to any number of
// peers over its (shared, unconnected) UDP socket. The protocol — contact
// and sessions, the graveyard, the peer table, sequence numbers, acks,
// retransmission, RNR, probes, congestion control, pacing, and which
// segments go together as GSO trains — is the QP's reliability.Endpoint
// (docs/wire.md §11), an engine that does no I/O; the rdQP is its Host:
// it builds each Data frame's DDP segment from registered memory after
// the RD header the engine made and sends it (rdtrain.go for trains),
// places what the engine delivers in order, serves Reads and atomics and
// matches their responses, and completes WRs. A WR completes only when the
// peer acknowledged every byte of it (seed 002): until then the
// registered buffer is the retransmit source, so its MRs cannot be
// deregistered. Completion order is per peer (issue 31 §5). See
// docs/verbs.md ("Inside qp").

// RDConfig tunes a QP's reliable-datagram service.
type RDConfig struct {
	reliability.Config
	// MaxPeers caps the peers with state (default 1024); a new peer over
	// the cap replaces the reclaimable peer touched longest ago (nothing
	// of ours outstanding to it; nothing held, or held frames stalled for
	// IdleTimeout), or is refused (its sender retries), at the same cost
	// at any cap. The default keeps what other hosts can make the QP hold
	// to about 30 MB (a peer holding frames ahead of a gap costs 30 KB at
	// the default Window of 1024, an idle one 1.6 KB) besides the frames
	// (MaxQPHeldBytes). A server
	// of many clients raises it to the clients it serves at once: 100,000
	// peers cost about 160 MB idle, 270 MB active (docs/verbs.md, "How
	// many peers").
	MaxPeers int
	// IdleTimeout reclaims a peer with nothing outstanding after this long
	// without traffic, and one that holds frames ahead of a gap after this
	// long without its gap moving (default 30 s).
	IdleTimeout time.Duration
	// Segment is the largest payload of one RDMA Write, Read Response or
	// Write-Record segment (default: what one datagram carries).
	Segment int
	// ORD caps the RDMA Reads this QP has outstanding to one peer; more
	// wait in order (default 16). IRD caps the Reads one peer may have
	// this QP serve at once; a Read over it is refused with a remote
	// operation error (default 16).
	ORD, IRD int
	// MaxPeersPerAddr caps the peers one address (any port, any QP) may
	// have (default 64), so one host cannot fill MaxPeers. The peers this
	// QP opened to the address count too, but the cap is enforced on
	// first contacts from it: one over the cap first reclaims a
	// reclaimable peer of the address, else it is refused (RDAddrLimited).
	MaxPeersPerAddr int
	// MaxHeldBytes is the most a peer's receiver buffers ahead of a gap
	// (default: a full window of 64 KiB segments, at most half of
	// MaxQPHeldBytes: 32 MiB at the defaults),
	// MaxQPHeldBytes the most all of the QP's peers buffer together
	// (default 64 MiB): it is what bounds the memory many peers, or one
	// host under many QP numbers, can pin. A frame over either budget is
	// dropped unacknowledged (its sender sends it again) and counted
	// (Stats.RDOverBudget).
	MaxHeldBytes, MaxQPHeldBytes int
}

// The internal WRs a QP queues to answer a Read Request and an Atomic
// Request.
const (
	opReadResponse   SendOpcode = 0xff
	opAtomicResponse SendOpcode = 0xfc
)

const (
	defaultMaxPeers    = 1024
	defaultIdleTimeout = 30 * time.Second
	defaultORD         = 16
	defaultIRD         = 16

	defaultMaxPeersPerAddr = 64
	maxHeldFrame           = 64 << 10 // the largest DDP segment a datagram carries, rounded up
	defaultMaxQPHeldBytes  = 64 << 20
)

// rdGraveyard is how many ended sessions a QP remembers in a generation
// of its graveyard: a Data frame of one of them with a valid keyed token
// (late, or sent again by a peer that has not yet learnt the session
// ended) must not open it again. When a generation fills, the QP's token
// secret turns (reliability.Graveyard): a grave is forgotten only once no
// token of its session verifies. At most two generations, about 100
// bytes a grave.
const rdGraveyard = 1024

// rdPaceSlack is how far ahead of the pacing clock a frame may leave
// rather than wait for the timer: no timer wakes more precisely than
// this, and at high rates a wait this short would cost more rate than
// the burst it saves.
const rdPaceSlack = 100 * time.Microsecond

// rdCompactAfter is how long a peer stays quiet before its sender and
// receiver let go of their rings (Sender.Compact, Receiver.Compact): a
// peer that exchanges more often keeps them (no allocation per message),
// an idle one costs its state without them, and a ring a peer grew to
// the window with frames out of order does not stay grown.
const rdCompactAfter = time.Second

type rdKey struct {
	addr netip.AddrPort
	qpn  uint32
}

// rdEndpoint is an RD QP's protocol engine: *rdWR is its message, rdPeer
// the QP's own state per peer, which the engine keeps in its peer table.
type rdEndpoint = reliability.Endpoint[*rdWR, rdPeer]

// rdPeerRef is a peer as the engine hands it to the QP.
type rdPeerRef = reliability.Peer[rdPeer]

// rdWR is a posted RD work request until it completes.
type rdWR struct {
	id     uint64
	op     SendOpcode
	flags  SendFlags
	peer   *rdPeer
	msg    *reliability.Message[*rdWR, rdPeer] // the engine's, once posted
	nsge   int
	sge    [maxSGE]SGE
	refs   mrRefs // the regions of its data, until completion
	inline []byte
	length uint32
	rstag  uint32
	rto    uint64
	msn    uint32
	seg    uint32 // payload per segment
	nseg   uint32
	status Status
	// RDMA Read: the sink (this QP's region). internal marks a Read or
	// Atomic Response the QP sends on its own, which completes nothing;
	// serving that it counts in its peer's IRD (rdPeer.serving) until
	// its last segment is out; resp its index in rdQP.resps.
	sinkSTag uint32
	sinkTO   uint64
	internal bool
	serving  bool
	resp     int
	got      uint64 // RDMA Read: response bytes placed; short at the last one fails it
	// RFC 7306: the Immediate Data of an OpImmediate, OpSendImm or
	// OpWriteImm (its own MSN on the Send queue, after the Send's); an
	// atomic's operands; an Atomic Response's request and value.
	imm              uint64
	immMSN           uint32
	compareAdd, swap uint64
	reqID            uint32
	// cut: a Read Response whose source region was deregistered (rdQP.cut):
	// its segments not yet acknowledged go empty, and its last ends short
	// of the Read, which fails it at the requester.
	cut bool
}

// rdPeer is what an RD QP keeps per peer beside the engine's state (the
// engine holds it: reliability.Peer.State, made zero with the peer and
// dropped with it): the DDP side of the peer's messages.
type rdPeer struct {
	key       rdKey
	ah        AH // the peer's address, for sendmsg
	ok        bool
	msn       uint32            // Send MSNs to this peer
	readMSN   uint32            // Read and Atomic Request MSNs to it (one queue)
	atomicMSN uint32            // Atomic Response MSNs to it
	wrMSN     map[uint32]uint32 // Write-Record MSNs to it, per STag
	reads     []*rdWR           // Reads and atomics sent to it, awaiting their responses, in order
	serving   int               // Read and Atomic Responses to it not yet all sent (IRD)
	// msgErr is the first refusal of the peer's last message delivered
	// (0: carried out), inMsg whether its last segment is yet to come: an
	// Immediate Data message after a refused Send or Write completes in
	// error (rdQP.deliver). code is the refusal of the segment being
	// delivered, for the engine's acks.
	msgErr reliability.Code
	inMsg  bool
	code   reliability.Code
	rxSend rdRxSend // the peer's Send of several segments being placed
}

// peerOf returns the QP's state for the engine's peer, set up on first
// use.
func peerOf(pp *rdPeerRef) *rdPeer {
	p := &pp.State
	if !p.ok {
		p.ok = true
		p.key = rdKey{pp.Key.Addr, pp.Key.QPN}
		p.ah.setAddr(p.key.addr, p.key.qpn)
	}
	return p
}

// rdQP is the RD state of a QP, under mu: the engine and what the QP
// needs to answer it (the Host of reliability.Endpoint, rdhost.go).
type rdQP struct {
	q    *QP
	mu   sync.Mutex
	cfg  RDConfig
	ep   *rdEndpoint
	seen reliability.EndpointStats // what of ep.Stats the device's counters have
	nout int                       // WRs posted and not completed, to every peer
	tx   txCtx
	hb   [reliability.MaxHeaderSize + udiwarp.DDPUntaggedHeaderSize + udiwarp.AtomicRequestSize]byte
	next time.Time
	// resps are the Read and Atomic Responses not yet complete (rdQP.cut).
	resps   []*rdWR
	tmp     AH // for Challenges to sources without state
	now     time.Time
	inMover bool
	// acking is true while the QP is on its socket's list of QPs whose
	// acks wait for the end of the batch (rdQP.flushAcks).
	acking bool
	trains *rdTrainCtx // made on the QP's first segment train (rdtrain.go)
	// The call under way: its socket, whether a send found the socket
	// full, the RD Data frame being received (its source, sequence number,
	// header size, and the receive its payload landed in, if it did), and
	// whether the QP is being flushed.
	s        *Socket
	full     bool
	src      netip.AddrPort
	rxSeq    uint32
	rxData   bool
	rxHdr    int
	land     *landing
	flushing bool
}

func newRDQP(q *QP, cfg RDConfig) *rdQP {
	cfg.Config = cfg.Config.Fill()
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = defaultMaxPeers
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = defaultIdleTimeout
	}
	if cfg.ORD <= 0 {
		cfg.ORD = defaultORD
	}
	if cfg.IRD <= 0 {
		cfg.IRD = defaultIRD
	}
	if cfg.MaxPeersPerAddr <= 0 {
		cfg.MaxPeersPerAddr = defaultMaxPeersPerAddr
	}
	if cfg.MaxQPHeldBytes <= 0 {
		cfg.MaxQPHeldBytes = defaultMaxQPHeldBytes
	}
	if cfg.MaxHeldBytes <= 0 {
		// What a full window of the largest segments holds, up to half
		// the QP's budget: the window already bounds one peer, and a
		// smaller budget drops a legitimate sender's frames after every
		// loss (RD Write goodput at 1 % loss fell to half with 4 MiB
		// against a 16 MiB window); half leaves the other peers room.
		cfg.MaxHeldBytes = min(cfg.Window*maxHeldFrame, max(cfg.MaxQPHeldBytes/2, maxHeldFrame))
	}
	r := &rdQP{q: q, cfg: cfg}
	r.ep = reliability.NewEndpoint[*rdWR, rdPeer](reliability.EndpointConfig{
		Config: cfg.Config, QPN: q.wireQPN(), MaxPeers: cfg.MaxPeers, MaxPeersPerAddr: cfg.MaxPeersPerAddr,
		IdleTimeout: cfg.IdleTimeout, MaxHeldBytes: cfg.MaxHeldBytes, MaxEndpointHeldBytes: cfg.MaxQPHeldBytes,
		Graveyard: rdGraveyard, PaceSlack: rdPaceSlack, ORD: cfg.ORD, CompactAfter: rdCompactAfter,
	}, r)
	r.tx.init(q)
	return r
}

// lock takes the QP's RD lock for a call on socket s (nil: none).
func (r *rdQP) lock(s *Socket) {
	r.mu.Lock()
	r.s = s
	if n := r.q.wireQPN(); n != r.ep.QPN() {
		r.ep.SetQPN(n)
	}
}

// unlock ends a call: the device timer is armed for the engine's next
// deadline, then release.
func (r *rdQP) unlock(now time.Time) {
	r.arm(now)
	r.release()
}

// release ends a call without arming the timer (the timer's own run
// returns its deadline): the datamover takes over if a send found the
// socket full, the engine's counters reach the device's, and the lock
// goes.
func (r *rdQP) release() {
	if r.full {
		r.full = false
		if r.s != nil {
			r.toMover(r.s)
		}
	}
	r.syncStats()
	r.s = nil
	r.mu.Unlock()
}

// syncStats adds what the engine counted since the last call to the
// device's counters. Caller holds r.mu.
func (r *rdQP) syncStats() {
	e, o := &r.ep.Stats, &r.seen
	if *e == *o {
		return
	}
	st := &r.q.dev.stats
	add := func(c *atomic.Uint64, now, was uint64) {
		if now != was {
			c.Add(now - was)
		}
	}
	add(&st.RDChallenges, e.Challenges, o.Challenges)
	add(&st.RDRejected, e.Rejected, o.Rejected)
	add(&st.RDPeerRestarts, e.Restarts, o.Restarts)
	add(&st.RDPeersReclaimed, e.Reclaimed, o.Reclaimed)
	add(&st.RDAddrLimited, e.AddrLimited, o.AddrLimited)
	add(&st.RDRefused, e.Refused, o.Refused)
	add(&st.RDOverBudget, e.OverBudget, o.OverBudget)
	add(&st.RDBuffered, e.Buffered, o.Buffered)
	add(&st.RDDuplicates, e.Duplicates, o.Duplicates)
	add(&st.RDBeyondWindow, e.BeyondWindow, o.BeyondWindow)
	add(&st.RDNotReady, e.NotReady, o.NotReady)
	add(&st.RDDataSent, e.DataSent, o.DataSent)
	add(&st.RDRetransmits, e.Retransmits, o.Retransmits)
	add(&st.RDAcksSent, e.AcksSent, o.AcksSent)
	add(&st.RDControlSent, e.ControlSent, o.ControlSent)
	add(&st.RDWindowProbes, e.WindowProbes, o.WindowProbes)
	add(&st.RDBadAcks, e.BadAcks, o.BadAcks)
	add(&st.RDPeerFailures, e.PeerFailures, o.PeerFailures)
	add(&st.RDPeers, e.Peers, o.Peers)
	add(&st.RxBadHeader, e.BadFrames, o.BadFrames)
	*o = *e
}

func (r *rdQP) segment(s *Socket) uint32 {
	max := s.maxDatagram - reliability.HeaderSize - reliability.SeqSize - reliability.TokenSize - udiwarp.DDPTaggedHeaderSize - udiwarp.CRCSize
	if n := r.cfg.Segment; n > 0 && n < max {
		return uint32(n)
	}
	return uint32(max)
}

// rdMaxSend is the largest RD Send segment: one datagram with the
// largest RD header a Data frame can carry.
func (s *Socket) rdMaxSend() int {
	return s.maxDatagram - reliability.MaxHeaderSize - udiwarp.DDPUntaggedHeaderSize - udiwarp.CRCSize
}

// postOn queues wr for its peer and sends what the windows allow now.
func (r *rdQP) postOn(wr *SendWR, s *Socket) error {
	q := r.q
	var length uint64
	for _, g := range wr.SGL {
		length += uint64(g.Length)
	}
	length += uint64(len(wr.Inline))
	switch wr.Opcode {
	case OpSend, OpSendImm, OpImmediate:
		if length > 1<<32-1 {
			return fmt.Errorf("%w: an RD Send of %d bytes (at most 4 GiB - 1)", ErrInvalidWR, length)
		}
		if err := checkImmWR(wr); err != nil {
			return err
		}
	case OpAtomicFetchAdd, OpAtomicCmpSwap:
		if err := checkAtomicWR(wr); err != nil {
			return err
		}
	case OpWrite, OpWriteRecord, OpWriteImm:
		if length > 1<<32-1 {
			return fmt.Errorf("%w: an RDMA Write of %d bytes (at most 4 GiB - 1)", ErrInvalidWR, length)
		}
	case OpRead:
		if len(wr.SGL) != 1 || wr.Inline != nil {
			return fmt.Errorf("%w: an RDMA Read names one sink SGE (a region with remote-write access), not %d SGEs", ErrInvalidWR, len(wr.SGL))
		}
	default:
		return fmt.Errorf("%w: opcode %v is not available on RD QPs", ErrInvalidWR, wr.Opcode)
	}
	w := rdWRs.Get().(*rdWR)
	*w = rdWR{id: wr.ID, op: wr.Opcode, flags: wr.Flags, length: uint32(length), rstag: wr.RemoteSTag, rto: wr.RemoteTO,
		imm: wr.Imm, compareAdd: wr.CompareAdd, swap: wr.Swap, inline: w.inline[:0]}
	if wr.Inline != nil {
		w.inline = append(w.inline, wr.Inline...)
	} else {
		w.inline = nil
	}
	// Take a reference on every MR now: the buffer is the retransmit
	// source until the peer acknowledged it.
	w.nsge = copy(w.sge[:], wr.SGL)
	need := Access(0)
	switch {
	case w.op == OpRead:
		// The Read Responses are tagged writes into the sink (RFC 5040).
		need = AccessLocalWrite | AccessRemoteWrite
		w.sinkSTag, w.sinkTO = w.sge[0].LKey, w.sge[0].Addr
	case w.op.atomic():
		need = AccessLocalWrite // the original value lands there
	}
	if st := w.refs.take(q.dev, q.pd, w.sge[:w.nsge], need); st != Success {
		q.completeSend(wr.ID, st, 0)
		return nil
	}
	switch w.op {
	case OpSend, OpSendImm:
		w.seg = uint32(s.rdMaxSend())
		if n := r.cfg.Segment; n > 0 && n < int(w.seg) {
			w.seg = uint32(n)
		}
	case OpWrite, OpWriteImm:
		w.seg = r.segment(s)
	case OpWriteRecord:
		w.seg = r.segment(s) - (udiwarp.WriteRecordHeaderSize - udiwarp.DDPTaggedHeaderSize)
	default:
		w.seg = 1 // a request, or Immediate Data alone: one segment
	}
	w.nseg = rdSegments(w.length, w.seg)
	switch {
	case w.op.awaitsResponse(), w.op == OpImmediate:
		w.nseg = 1
	case w.op.imm():
		w.nseg++ // the Immediate Data after the Send or Write
	}
	var flags reliability.PostFlags
	if w.op.awaitsResponse() {
		flags |= reliability.PostAwaits
	}
	if w.flags&FlagSignaled == 0 || w.flags&FlagAckLazily != 0 {
		flags |= reliability.PostQuiet
	}
	now := time.Now()
	r.lock(s)
	defer r.unlock(now)
	if st := q.State(); st != StateRTS {
		w.releaseMRs()
		return fmt.Errorf("%w: PostSend on a QP in %v", ErrQPState, st)
	}
	if r.nout >= q.caps.MaxSendWR {
		w.releaseMRs()
		return fmt.Errorf("%w: %d send WRs outstanding", ErrQueueFull, r.nout)
	}
	k := reliability.PeerKey{Addr: wr.AH.addr, QPN: wr.AH.qpn}
	pp, err := r.ep.PeerFor(now, k)
	if err != nil {
		w.releaseMRs()
		return fmt.Errorf("%w: %d RD peers with work outstanding", ErrTooMany, r.ep.Peers())
	}
	p := peerOf(pp)
	w.peer = p
	switch w.op {
	case OpSend, OpSendImm:
		p.msn++
		w.msn = p.msn
	case OpRead, OpAtomicFetchAdd, OpAtomicCmpSwap:
		p.readMSN++
		w.msn = p.readMSN
	case OpWriteRecord:
		if p.wrMSN == nil {
			p.wrMSN = map[uint32]uint32{}
		}
		p.wrMSN[w.rstag]++
		w.msn = p.wrMSN[w.rstag]
	}
	if w.op.imm() {
		p.msn++
		w.immMSN = p.msn
	}
	r.nout++
	w.msg, _ = r.ep.Post(now, k, w, w.nseg, flags) // the peer exists: it cannot fail
	return nil
}

func (w *rdWR) releaseMRs() { w.refs.release() }

// pin pins part of w's source for the frame t is building: a Read
// Response's by the peer's access, checked as it is sent, anything else
// by ours (the one home of that choice, for single frames and trains).
func (w *rdWR) pin(t *txCtx, part *SGE) ([]byte, Status) {
	if w.internal {
		return t.pinRemote(part)
	}
	return t.pin(part)
}

// rdSegments is how many segments of seg bytes carry a message of length
// bytes: at least one (an empty message is one empty segment). It counts
// in 64 bits: a length near 4 GiB must not wrap to a single segment.
func rdSegments(length, seg uint32) uint32 {
	return uint32(max(1, (uint64(length)+uint64(seg)-1)/uint64(seg)))
}

// body is how many of w's segments carry its Send's or Write's bytes:
// all but a trailing Immediate Data message.
func (w *rdWR) body() uint32 {
	if w.op.imm() {
		return w.nseg - 1
	}
	return w.nseg
}

// part is what segment i of w carries: bytes [off, off+n) of the
// message, whether it is the last of them, or (imm) the trailing
// Immediate Data.
func (w *rdWR) part(i uint32) (off, n uint32, last, imm bool) {
	body := w.body()
	switch {
	case i >= body:
		return 0, 0, false, true
	case w.op.awaitsResponse():
		return 0, 0, true, false // a request: its length is the Read's, not its payload
	}
	off = i * w.seg
	if !w.cut {
		n = min(w.seg, w.length-off)
	}
	return off, n, i+1 == body, false
}

// The QP as the engine's Host (reliability.Host, reliability.Trainer).

// SegmentSize is the bytes segment i of w adds after the RD header.
func (r *rdQP) SegmentSize(w *rdWR, i uint32) int {
	_, n, _, imm := w.part(i)
	if imm {
		return udiwarp.DDPUntaggedHeaderSize + udiwarp.ImmediateDataSize
	}
	return int(n) + udiwarp.DDPUntaggedHeaderSize
}

// Send transmits a frame the engine built: a control frame as it is, a
// Data frame with the DDP segment it names appended.
func (r *rdQP) Send(f *reliability.Frame[*rdWR, rdPeer]) error {
	s := r.s
	if f.Type != reliability.Data {
		var ah *AH
		if f.Peer != nil {
			ah = &peerOf(f.Peer).ah
		} else {
			// A Challenge to a source without state: only what may
			// answer the datagram that drew it (Socket.mayAnswer).
			if !s.mayAnswer(f.Dst, len(f.Header)+udiwarp.CRCSize) {
				return errWithheld
			}
			ah = &r.tmp
			ah.setAddr(f.Dst, binary.BigEndian.Uint32(f.Header[4:]))
		}
		return r.control(s, ah, f.Header)
	}
	p := peerOf(f.Peer)
	w := f.Msg
	off, n, last, imm := w.part(f.Index)
	b := r.ddpHeader(append(r.hb[:0], f.Header...), p, w, off, last, imm)
	t := &r.tx
	t.begin(b)
	if !imm {
		if st := r.gather(t, w, off, n); st != Success {
			if !w.internal {
				return nil // cannot happen: the MRs are referenced; the peer's ack completes it
			}
			// A Read Response whose source is no longer readable by the
			// peer (MR.Invalidate since the Read was served): the segment
			// goes out empty, and the requester, short of bytes at the
			// last one, fails the Read (docs/wire.md §11).
			t.begin(b)
			n = 0
		}
	} else {
		n = 0
	}
	t.finish(s, &p.ah, int(n))
	err := t.transmit(s)
	t.release()
	switch {
	case err == errSocketFull:
		r.full = true
		return reliability.ErrWouldBlock
	case f.First:
		r.sent(p, w, f.Index)
	}
	return err
}

// errWithheld: a reply the socket may not send (Socket.mayAnswer).
var errWithheld = errors.New("qp: reply withheld")

// sent notes that segment i of w went for the first time: a Read or
// atomic now awaits its response, and a response whose last segment is
// out no longer counts against the peer's IRD.
func (r *rdQP) sent(p *rdPeer, w *rdWR, i uint32) {
	switch {
	case w.op.awaitsResponse():
		p.reads = append(p.reads, w)
	case w.internal && i+1 >= w.nseg:
		// The requester frees its ORD slot when the response arrives,
		// maybe before our sender sees the ack, so counting until then
		// would refuse its next request.
		r.unserve(p, w)
	}
}

// unserve takes response w off its peer's IRD count.
func (r *rdQP) unserve(p *rdPeer, w *rdWR) {
	if w.serving {
		w.serving = false
		p.serving--
	}
}

// control sends a frame with no payload.
func (r *rdQP) control(s *Socket, ah *AH, hdr []byte) error {
	t := &r.tx
	t.begin(hdr)
	t.finish(s, ah, 0)
	err := t.transmit(s)
	if err == errSocketFull {
		return reliability.ErrWouldBlock
	}
	return err
}

// Deliver carries out the in-order DDP segment seq of the peer. The
// frame being received may have landed in a posted receive (r.land): it
// completes there if that receive is the next (deliverLanded).
func (r *rdQP) Deliver(pp *rdPeerRef, seq uint32, b []byte) (bool, reliability.Code) {
	p := peerOf(pp)
	p.code = 0
	var ok bool
	if l := r.land; l != nil && r.rxData && seq == r.rxSeq {
		r.land = nil
		if ok = r.deliverLanded(r.s, p, seq, b, l, r.src); ok && r.q.srq == nil {
			r.s.rx.noteSend(r.q, l.payload(), r.rxHdr) // the next frames land here too
		}
	} else {
		ok = r.deliver(r.s, p, seq, b, r.src)
		if ok && r.rxData && seq == r.rxSeq && r.q.srq == nil {
			if op, isUntagged := rdUntaggedOp(b); isUntagged && isSend(op) {
				r.s.rx.noteSend(r.q, len(b)-udiwarp.DDPUntaggedHeaderSize, r.rxHdr)
			}
		}
	}
	return ok, p.code
}

// Hold gives the engine the copy of a frame it buffers ahead of a gap:
// copied out of the receive it landed in if it did, admitted by the
// SRQ's out-of-order limits (srq_rd.go), a claim on a receive if it is
// a Send.
func (r *rdQP) Hold(pp *rdPeerRef, seq uint32, seg []byte, hs reliability.HoldState) ([]byte, bool, reliability.HoldVerdict) {
	q := r.q
	p := peerOf(pp)
	if r.land != nil && r.rxData && seq == r.rxSeq {
		f, ok := r.s.rx.copyOut(r.land)
		r.land = nil
		if !ok {
			return nil, false, reliability.HoldDrop // as if lost: unacknowledged, the peer sends it again
		}
		seg = f[r.rxHdr:]
	}
	if q.srq != nil {
		if v := r.admitOutOfOrder(p, hs, seg); v != reliability.HoldKeep {
			return nil, false, v
		}
	}
	return append([]byte(nil), seg...), q.srq != nil && rdNeedsRecv(seg), reliability.HoldKeep
}

// Complete completes WR w to the peer: err nil when the peer
// acknowledged all of it (and its response came), else the failure.
func (r *rdQP) Complete(pp *rdPeerRef, w *rdWR, err error) {
	q := r.q
	p := peerOf(pp)
	if w.internal {
		// A response the QP sent on its own: it completes nothing.
		r.unserve(p, w)
		w.releaseMRs()
		r.dropResp(w)
		return
	}
	if w.op.awaitsResponse() {
		p.dropRead(w)
	}
	r.nout--
	w.releaseMRs()
	st := w.status
	if st == Success && err != nil {
		st = rdErrStatus(err)
	}
	if st != Success || w.flags&FlagSignaled != 0 {
		n := int(w.length)
		if st != Success {
			n = 0
		}
		q.pushSend(w.id, st, w.op.wcOpcode(), n)
	}
	if st == Success && !w.op.awaitsResponse() {
		// Nothing refers to it any more: every segment was numbered
		// and acknowledged, so the engine let go of it; a stream of RD
		// Sends then allocates nothing per message.
		inline := w.inline
		*w = rdWR{inline: inline[:0]}
		rdWRs.Put(w)
	}
}

// rdErrStatus is the work completion status of an engine's failure.
func rdErrStatus(err error) Status {
	var re *reliability.RemoteError
	var pe *protect.RefusedError
	switch {
	case errors.As(err, &re):
		return rdStatus(re.Code)
	case errors.As(err, &pe):
		return ProtectionModeError
	case errors.Is(err, reliability.ErrRNRRetryExceeded):
		return RNRRetryExceededError
	case errors.Is(err, reliability.ErrRetryExceeded):
		return RetryExceededError
	case errors.Is(err, reliability.ErrRemoteAborted):
		return RemoteAbortedError
	case errors.Is(err, reliability.ErrFlushed):
		return WRFlushError
	}
	return RemoteOperationError
}

// Event: a session with the peer began or ended. Either way the peer's
// messages in progress at this QP end: a Send of several segments being
// placed, and its Write-Records at the QP's engine (a new session
// numbers them from MSN 1 again, and nothing of an ended one can still
// arrive). The Reads and atomics it awaited responses to complete with
// the session (the engine fails or sends them again).
func (r *rdQP) Event(pp *rdPeerRef, ev reliability.Event) {
	p := peerOf(pp)
	switch ev {
	case reliability.EventSessionEnded:
		st := RemoteAbortedError
		if r.flushing {
			st = WRFlushError
		}
		r.endRxSend(p, st)
		clear(p.reads)
		p.reads = p.reads[:0]
		r.endWriteRecords(p.key)
	case reliability.EventEstablished:
		r.endWriteRecords(p.key)
	}
}

// Train is how many of w's segments from i on may go as one GSO train:
// body segments (not a request, a response to one, or an Immediate Data
// message) from registered memory or inline data, to a socket that takes
// trains of their size.
func (r *rdQP) Train(w *rdWR, i, n uint32) int {
	switch w.op {
	case OpWrite, OpWriteImm, OpWriteRecord, opReadResponse, OpSend, OpSendImm:
	default:
		return 0
	}
	s := r.s
	size := rdTrainHeader + int(w.seg) + udiwarp.CRCSize
	if w.cut || i >= w.body() || !s.gsoFits(size) {
		return 0
	}
	return min(int(w.body()-i), maxGSOSegments, s.maxDatagram/size)
}

// rdToMover hands the QP to the socket's datamover: the socket is full.
func (r *rdQP) toMover(s *Socket) {
	q := r.q
	if !r.inMover {
		r.inMover = true
		s.activate(q)
	}
}

// deliverRD handles an RD frame received on s.
func (d *Device) deliverRD(s *Socket, b []byte, src netip.AddrPort) {
	if frame, ok := d.frameOf(b); ok {
		d.deliverRDFrame(s, frame, src)
	}
}

// frameOf is datagram b without its CRC trailer, checked unless the
// device runs without CRC (NoCRC, or protected: the tag checked it); a
// bad trailer is counted and false returned.
func (d *Device) frameOf(b []byte) ([]byte, bool) {
	if d.cfg.NoCRC {
		return b[:len(b)-udiwarp.CRCSize], true
	}
	frame, err := udiwarp.OpenDatagram(b)
	if err != nil {
		d.stats.countRx(err)
		return nil, false
	}
	return frame, true
}

// deliverRDFrame hands a checked RD frame (without its CRC) to its QP.
func (d *Device) deliverRDFrame(s *Socket, frame []byte, src netip.AddrPort) {
	st := &d.stats
	h := &s.rx.rdh
	if err := h.Parse(frame); err != nil {
		st.RxBadHeader.Add(1)
		return
	}
	if q := s.lookupQP(h.DstQPN); q == nil || !q.eng.receiveRD(s, h, frame, src) {
		st.RxUnknownQP.Add(1)
	}
}

// receive runs one RD frame through the QP's engine. A frame that landed
// in another QP's receive (a number an alias of the socket guessed for,
// now the device's own QP's) is copied out first: it is this QP's
// ordinary frame. An ack it makes due goes at the end of the batch the
// socket is delivering, if it is delivering one: one ack then covers
// every frame of the batch (flushAcks).
func (r *rdQP) receive(s *Socket, h *reliability.Header, frame []byte, src netip.AddrPort) {
	now := time.Now()
	r.lock(s)
	defer r.unlock(now)
	r.now, r.src, r.rxData, r.rxSeq, r.rxHdr, r.land = now, src, h.Type == reliability.Data, h.Seq, h.Size, nil
	if l := s.rx.landRD; l != nil && r.rxData {
		if l.q != r.q {
			f, ok := s.rx.copyOut(l)
			if !ok {
				return
			}
			frame = f
		} else {
			r.land = l
		}
	}
	r.ep.ReceiveParsed(now, src, h, frame)
	r.land = nil
	switch {
	case !r.ep.AcksPending():
	case !s.rx.batching:
		r.ep.EndBatch(now)
	case !r.acking:
		r.acking = true
		s.rx.rdAcks = append(s.rx.rdAcks, r)
	}
}

// flushAcks sends the acks the frames of the batch just delivered made
// due (reliability.Endpoint.EndBatch).
func (r *rdQP) flushAcks(s *Socket) {
	now := time.Now()
	r.lock(s)
	defer r.unlock(now)
	r.acking = false
	r.ep.EndBatch(now)
}

// timer runs the QP's RD timers at now and returns the next deadline.
func (r *rdQP) timer(now time.Time) time.Time {
	q := r.q
	s := q.sock.Load()
	r.lock(s)
	defer r.release()
	r.next = time.Time{} // the device timer arms the deadline returned
	if s == nil || q.State() == StateError || q.State() == StateReset {
		return time.Time{} // the timer no longer holds q: the next arm arms it
	}
	r.ep.Tick(now)
	return r.ep.Deadline(now)
}

// arm makes sure the device timer runs by the QP's next deadline.
func (r *rdQP) arm(now time.Time) {
	next := r.ep.Deadline(now)
	if next.IsZero() || (!r.next.IsZero() && !next.Before(r.next)) {
		return
	}
	r.next = next
	r.q.armTimer(next)
}

// drain is the datamover's turn for an RD QP: the peers a full socket
// held up send, in the order it did.
func (r *rdQP) drain(s *Socket, _ int) (more, full bool) {
	now := time.Now()
	r.lock(s)
	defer r.unlock(now)
	r.ep.Writable(now)
	if r.ep.Blocked() {
		r.full = false // in the mover already
		return true, true
	}
	r.inMover = false
	return false, false
}

// unfinished reports whether a WR posted is not complete yet (QP.SendQueued).
func (r *rdQP) unfinished() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nout > 0
}

// rdWRs keeps completed WRs for the next posts: a stream of RD Sends
// then allocates nothing per message.
var rdWRs = sync.Pool{New: func() any { return new(rdWR) }}

// rdFlush fails every WR of the QP with WRFlushError (ERROR, Destroy).
// Every session ends: none opens again if the QP comes back (RESET, RTS).
func (r *rdQP) flush() {
	now := time.Now()
	r.lock(nil)
	defer r.unlock(now)
	r.flushing = true
	r.ep.Flush()
	r.flushing = false
}

// ddpHeader appends to b, the RD header of a Data frame for w, the DDP
// (and RDMAP) headers of w's segment at offset off (last: the last of
// its Send's or Write's; imm: its trailing Immediate Data message).
func (r *rdQP) ddpHeader(b []byte, p *rdPeer, w *rdWR, off uint32, last, imm bool) []byte {
	q := r.q
	// untagged appends an untagged DDP header; only a Send's segments
	// have an MO and may leave L clear (udiwarp.ParseRDSegment).
	untagged := func(opc udiwarp.Opcode, queue udiwarp.Queue, msn uint32, last bool, mo uint32) {
		b = udiwarp.AppendUntagged(b, &udiwarp.UntaggedFields{Last: last, DV: udiwarp.DatagramDDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(opc), ULP: q.wireQPN(), QN: udiwarp.DatagramQN(p.key.qpn, queue), MSN: msn, MO: mo})
	}
	switch op := w.op; {
	case !imm && (op == OpSend || op == OpSendImm):
		opc := udiwarp.OpSend
		if w.flags&FlagSolicited != 0 && op == OpSend { // Send with Immediate: the SE rides on the Immediate Data
			opc = udiwarp.OpSendSE
		}
		untagged(opc, udiwarp.QueueSend, w.msn, last, off) // a segment of the Send at its MO, L on the last
	case imm:
		opc := udiwarp.OpImmediateData
		if w.flags&FlagSolicited != 0 {
			opc = udiwarp.OpImmediateDataSE
		}
		untagged(opc, udiwarp.QueueSend, w.immMSN, true, 0)
		b = udiwarp.AppendImmediateData(b, w.imm)
	case op == OpAtomicFetchAdd, op == OpAtomicCmpSwap:
		untagged(udiwarp.OpAtomicRequest, udiwarp.QueueReadRequest, w.msn, true, 0)
		a := atomicRequest(op, w.msn, w.rstag, w.rto, w.compareAdd, w.swap)
		b = udiwarp.AppendAtomicRequest(b, &a)
	case op == opAtomicResponse:
		untagged(udiwarp.OpAtomicResponse, udiwarp.QueueAtomicResponse, w.msn, true, 0)
		b = udiwarp.AppendAtomicResponse(b, w.reqID, w.compareAdd)
	case op == OpWrite, op == OpWriteImm:
		b = udiwarp.AppendTagged(b, &udiwarp.TaggedFields{Last: last, DV: udiwarp.DatagramDDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite), STag: w.rstag, TO: w.rto + uint64(off)})
	case op == opReadResponse:
		b = udiwarp.AppendTagged(b, &udiwarp.TaggedFields{Last: last, DV: udiwarp.DatagramDDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpReadResponse), STag: w.rstag, TO: w.rto + uint64(off)})
	case op == OpWriteRecord:
		b = udiwarp.AppendWriteRecord(b, &udiwarp.WriteRecordFields{Last: last, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
			STag: w.rstag, TO: w.rto + uint64(off), MSN: w.msn, MO: off, MessageLength: w.length, DstQPN: p.key.qpn, SrcQPN: q.wireQPN()})
	case op == OpRead:
		untagged(udiwarp.OpReadRequest, udiwarp.QueueReadRequest, w.msn, true, 0)
		b = udiwarp.AppendReadRequest(b, &udiwarp.ReadRequestFields{SinkSTag: w.sinkSTag, SinkTO: w.sinkTO, Size: w.length,
			SourceSTag: w.rstag, SourceTO: w.rto})
	}
	return b
}

// gather adds bytes [off, off+n) of w's message to the frame.
func (r *rdQP) gather(t *txCtx, w *rdWR, off, n uint32) Status {
	if w.inline != nil {
		t.add(w.inline[off : off+n])
		return Success
	}
	c := sglSlice{sge: w.sge[:w.nsge], off: off, left: n}
	for part, ok := c.next(); ok; part, ok = c.next() {
		b, st := w.pin(t, &part)
		if st != Success {
			return st
		}
		t.add(b)
	}
	return Success
}

func (r *rdQP) endWriteRecords(k rdKey) {
	q := r.q
	q.wrMu.Lock()
	defer q.wrMu.Unlock()
	if q.wr == nil {
		return
	}
	q.wr.EndSource(writerecord.Source{Addr: k.addr, QPN: k.qpn}, func(rec writerecord.Record) {
		if m := q.dev.mrs.lookup(rec.STag); m != nil {
			q.recordWriteRecord(m, &rec)
		} // else the region was deregistered: nothing of it is valid
	})
}

func (r *rdQP) deliver(s *Socket, p *rdPeer, seq uint32, b []byte, src netip.AddrPort) bool {
	q := r.q
	st := &q.dev.stats
	seg, err := udiwarp.ParseRDSegment(b)
	if err != nil {
		st.countRx(err)
		p.beginMessage()
		p.noteErr(seq, reliability.CodeInvalidRequest)
		p.endMessage(true)
		return true
	}
	// p.msgErr is the outcome of the peer's message before this one
	// while this one begins, of this one after: an Immediate Data
	// message reads the one before (rdDeliverSegment).
	before, open := p.msgErr, p.inMsg
	if !open {
		p.beginMessage()
	}
	if !r.deliverSegment(s, p, seq, seg, src, before) {
		p.msgErr, p.inMsg = before, open // not taken: as if it had not come
		return false
	}
	p.endMessage(seg.Control.Last())
	return true
}

// beginMessage notes that the peer's next message begins: nothing of it
// refused yet.
func (p *rdPeer) beginMessage() { p.msgErr, p.inMsg = 0, true }

// endMessage notes that a segment of the peer's current message was
// carried out or refused; last, that it was the message's last.
func (p *rdPeer) endMessage(last bool) { p.inMsg = !last }

// rdDeliverSegment carries out the parsed in-order segment seg (see
// deliver); before is the outcome of the peer's message before it, which
// decides an Immediate Data message's.
func (r *rdQP) deliverSegment(s *Socket, p *rdPeer, seq uint32, seg udiwarp.Segment, src netip.AddrPort, before reliability.Code) bool {
	q := r.q
	st := &q.dev.stats
	if p.rxSend.active && !rdIsSend(seg) {
		// A Send of several segments was cut short by another message:
		// the peer broke the order it must keep.
		r.endRxSend(p, RemoteAbortedError)
	}
	if seg.Control.Tagged() {
		switch {
		case seg.Control.WriteRecord():
			// Write-Record over RD: the UD target engine, now fed in order
			// and without loss (docs/verbs.md).
			if h := seg.WriteRecord(); h.DstQPN() != q.wireQPN() || h.SrcQPN() != p.key.qpn {
				st.RxBadHeader.Add(1)
				p.noteErr(seq, reliability.CodeInvalidRequest)
				return true
			}
			switch f, placed := q.receiveWriteRecord(nil, seg, src); {
			case f != faultNone:
				// Refused by the target region: reported in the acks as
				// an RDMA Write's refusal is, so the WR completes with
				// RemoteAccessError.
				p.noteErr(seq, reliability.CodeRemoteAccess)
			case !placed:
				// Dropped as an older message's (a stale MSN): not
				// placed, so never Success at the source.
				p.noteErr(seq, reliability.CodeRemoteOperation)
			}
		case seg.Opcode() == udiwarp.OpWrite:
			if code, ok := r.place(seg); !ok {
				p.noteErr(seq, code)
			}
		case seg.Opcode() == udiwarp.OpReadResponse:
			r.readResponse(p, seg)
		default:
			st.RxBadOpcode.Add(1)
			p.noteErr(seq, reliability.CodeInvalidRequest)
		}
		return true
	}
	h := seg.Untagged()
	if h.DstQPN() != q.wireQPN() || h.SrcQPN() != p.key.qpn {
		st.RxBadHeader.Add(1)
		p.noteErr(seq, reliability.CodeInvalidRequest)
		return true
	}
	// ParseSegment checked that each opcode came on its queue.
	op := seg.Opcode()
	switch {
	case op == udiwarp.OpReadRequest:
		r.serveRead(p, seq, seg)
		return true
	case op == udiwarp.OpAtomicRequest:
		r.serveAtomic(p, seq, seg)
		return true
	case op == udiwarp.OpAtomicResponse:
		r.atomicResponse(p, seg)
		return true
	case !isSend(op) && op != udiwarp.OpImmediateData && op != udiwarp.OpImmediateDataSE:
		st.RxBadOpcode.Add(1)
		p.noteErr(seq, reliability.CodeInvalidRequest)
		return true
	}
	if isSend(op) && (p.rxSend.active || !seg.Control.Last() || h.MO() != 0) {
		return r.deliverSendPart(s, p, seq, seg, src)
	}
	var w recvWQE
	n := len(seg.Payload)
	if !isSend(seg.Opcode()) {
		n = 0 // Immediate Data: the value goes in the completion
	}
	if q.takeRecv(&w, n, src) != recvTaken {
		return false // at an SRQ limit too: the sender sends it again (the engine counts it)
	}
	s.rx.evict(q, w.seq) // a later datagram of this batch landed there
	if !isSend(seg.Opcode()) {
		// Immediate Data: the second part of a Send or Write with
		// Immediate, or alone. If the message before it (the first part)
		// was refused, its data is not there: the receive completes with
		// that refusal's status, never Success (docs/verbs.md).
		st := Success
		if before != 0 {
			st = rdStatus(before)
			p.noteErr(seq, before)
		}
		q.deliverImmediate(&w, seg, src, st)
		return true
	}
	switch q.deliverSend(&w, seg, src) {
	case Success:
	case LocalLengthError:
		p.noteErr(seq, reliability.CodeInvalidRequest)
	default:
		p.noteErr(seq, reliability.CodeRemoteOperation)
	}
	return true
}

// rdRxSend is a peer's Send of several segments while it is placed: the
// receive its first segment took, the MSN and the offset the next
// segment must have, and what became of it so far. A receive costs a
// peer nothing until then: the state is the receive itself, held once.
type rdRxSend struct {
	w      *recvWQE
	msn    uint32
	next   uint32
	st     Status
	opc    udiwarp.Opcode
	hdr    [udiwarp.DDPUntaggedHeaderSize]byte // the first segment's, for the completion
	active bool
}

// deliverSendPart places one segment of a Send of several segments
// (udiwarp.ParseRDSegment): the first takes a receive (none posted: not
// ready, the peer sends it again), each places at its MO, the last
// completes the receive. The segments come in order (RD delivers them
// so, and a sender numbers a message's segments back to back); one at
// another offset or of another message ends the receive with
// RemoteAbortedError and is refused. A message longer than the receive
// completes it with LocalLengthError and fails the peer's WR.
func (r *rdQP) deliverSendPart(s *Socket, p *rdPeer, seq uint32, seg udiwarp.Segment, src netip.AddrPort) bool {
	q := r.q
	h := seg.Untagged()
	x := &p.rxSend
	if x.active && (h.MSN() != x.msn || h.MO() != x.next) {
		r.endRxSend(p, RemoteAbortedError)
		if h.MO() != 0 {
			p.noteErr(seq, reliability.CodeInvalidRequest)
			return true
		}
	}
	if !x.active {
		if h.MO() != 0 {
			q.dev.stats.RxBadHeader.Add(1)
			p.noteErr(seq, reliability.CodeInvalidRequest)
			return true
		}
		if x.w == nil {
			x.w = new(recvWQE)
		}
		// A Send of several segments: its length is not known until its
		// last, so a size-classed SRQ gives it a receive of its largest
		// class, not one the first segment alone would fit.
		n := len(seg.Payload)
		if !seg.Control.Last() {
			n = -1
		}
		if q.takeRecv(x.w, n, src) != recvTaken {
			return false // the engine counts it
		}
		s.rx.evict(q, x.w.seq)
		x.active, x.msn, x.next, x.st, x.opc = true, h.MSN(), 0, Success, seg.Opcode()
		copy(x.hdr[:], h)
	}
	n := uint32(len(seg.Payload))
	if x.next+n < x.next && x.st == Success {
		x.st = LocalLengthError // past 4 GiB
		p.noteErr(seq, reliability.CodeInvalidRequest)
	}
	if x.st == Success {
		if x.st = q.scatterAt(x.w, x.next, seg.Payload); x.st != Success {
			// Reported once, at the segment that failed: it fails the
			// peer's WR, whichever of its segments the error names.
			code := reliability.CodeRemoteOperation
			if x.st == LocalLengthError {
				code = reliability.CodeInvalidRequest
			}
			p.noteErr(seq, code)
		}
	}
	x.next += n
	if seg.Control.Last() {
		r.endRxSend(p, x.st)
	}
	return true
}

// endRxSend completes the receive p's Send of several segments took, with
// st (Success only when its last segment was placed).
func (r *rdQP) endRxSend(p *rdPeer, st Status) {
	x := &p.rxSend
	if !x.active {
		return
	}
	q := r.q
	h := udiwarp.DDPUntagged(x.hdr[:])
	wc := q.sendWC(x.w.id, x.opc, h, p.key.addr, int(x.next))
	wc.Status = st
	if st != Success {
		wc.Len = 0
	}
	q.completeRecv(&wc)
	x.active = false
}

// deliverLanded carries out the in-order frame seq from p whose payload
// landed in a posted receive (slot land): hdr is its DDP header. If that
// receive is the next one, the Send completes where it is, with no copy;
// otherwise (an earlier message took another receive, or the QP was
// flushed) the frame is copied out and takes the ordinary path.
func (r *rdQP) deliverLanded(s *Socket, p *rdPeer, seq uint32, hdr []byte, land *landing, src netip.AddrPort) bool {
	q := r.q
	seg, err := udiwarp.ParseSegment(hdr, udiwarp.ProfileDatagram)
	if h := seg.Untagged(); err == nil && land.q == q && rdIsSend(seg) && !p.rxSend.active && h.DstQPN() == q.wireQPN() && h.SrcQPN() == p.key.qpn {
		q.rqMu.Lock()
		if q.srq == nil && q.rq.len() > 0 && q.rq.front().seq == land.seq {
			q.rq.pop()
			q.rqMu.Unlock()
			q.dev.stats.RxLanded.Add(1)
			wc := q.sendWC(land.id, seg.Opcode(), h, src, land.payload()) // landed whole: Success
			q.completeRecv(&wc)
			p.beginMessage() // a Send of one segment, carried out
			p.endMessage(true)
			return true
		}
		q.rqMu.Unlock()
	}
	f, ok := s.rx.copyOut(land)
	if !ok {
		return false // not received: the peer sends it again (the engine counts it)
	}
	return r.deliver(s, p, seq, f[land.hlen-len(hdr):], src)
}

// rdIsSend reports whether seg is an untagged Send (not Immediate Data).
func (r *rdQP) serveRead(p *rdPeer, seq uint32, seg udiwarp.Segment) {
	q := r.q
	st := &q.dev.stats
	rr := seg.ReadRequest()
	if p.serving >= r.cfg.IRD {
		st.RDReadsRefused.Add(1)
		p.noteErr(seq, reliability.CodeRemoteOperation)
		return
	}
	s := r.s
	w := &rdWR{op: opReadResponse, internal: true, serving: true, peer: p, length: rr.Size(), rstag: rr.SinkSTag(), rto: rr.SinkTO()}
	if w.length > 0 {
		w.sge[0] = SGE{LKey: rr.SourceSTag(), Addr: rr.SourceTO(), Length: w.length}
		m, f := q.dev.remoteRegion(q.pd, rr.SourceSTag(), rr.SourceTO(), uint64(w.length), AccessRemoteRead)
		if f != faultNone {
			p.noteErr(seq, reliability.CodeRemoteAccess)
			return
		}
		w.refs.add(m)
		m.unpin()
		w.nsge = 1
	} // a zero-length Read needs no valid STag (RFC 5042 §6.3.5)
	w.seg = r.segment(s)
	w.nseg = rdSegments(w.length, w.seg)
	r.respond(p, w)
	st.RDReadsServed.Add(1)
}

// rdReadResponse places a Read Response segment into the sink of the
// oldest Read outstanding to p; its last segment completes that Read.
func (r *rdQP) readResponse(p *rdPeer, seg udiwarp.Segment) {
	q := r.q
	st := &q.dev.stats
	// Responses come in the order of the requests: an atomic ahead of the
	// first Read with no response yet was refused (its error is on its way
	// in an ack), so the response is the first Read's.
	i := 0
	for i < len(p.reads) && p.reads[i].op != OpRead {
		i++
	}
	if i == len(p.reads) {
		st.RxBadOpcode.Add(1) // a response to nothing
		return
	}
	w := p.reads[i]
	t := seg.Tagged()
	to := t.TO()
	if t.STag() != w.sinkSTag || to < w.sinkTO || to-w.sinkTO > uint64(w.length) || uint64(len(seg.Payload)) > uint64(w.length)-(to-w.sinkTO) {
		st.RxBounds.Add(1)
		if w.status == Success {
			w.status = RemoteOperationError // the responder answered outside the request
		}
	} else if len(seg.Payload) > 0 {
		if _, ok := r.place(seg); !ok && w.status == Success {
			w.status = LocalProtectionError // the sink went bad under the Read
		}
		w.got += uint64(len(seg.Payload))
	}
	if seg.Control.Last() {
		if w.got != uint64(w.length) && w.status == Success {
			// The responder ended the Read short: its source region was
			// invalidated (sent empty) or deregistered (rdQP.cut) under it.
			w.status = RemoteAccessError
		}
		p.reads = append(p.reads[:i], p.reads[i+1:]...)
		r.ep.Responded(r.now, w.msg, nil) // w.status says how it went
	}
}

// rdServeAtomic carries out an Atomic Request from p (Device.executeAtomic:
// the one remote-access check, then the operation, once: the receiver
// delivers each sequence number once) and queues the Atomic Response,
// which holds the original value and is retransmitted from it. Atomics
// share the Read Requests' queue and IRD: responses go in request order.
func (r *rdQP) serveAtomic(p *rdPeer, seq uint32, seg udiwarp.Segment) {
	q := r.q
	if p.serving >= r.cfg.IRD {
		q.dev.stats.RDReadsRefused.Add(1)
		p.noteErr(seq, reliability.CodeRemoteOperation)
		return
	}
	a := seg.AtomicRequest()
	v, af, f := q.dev.executeAtomic(q.pd, a)
	switch {
	case af == atomicInvalid || f == faultAlign:
		p.noteErr(seq, reliability.CodeInvalidRequest)
		return
	case af != atomicOK:
		p.noteErr(seq, reliability.CodeRemoteAccess)
		return
	}
	p.atomicMSN++
	w := &rdWR{op: opAtomicResponse, internal: true, serving: true, peer: p, msn: p.atomicMSN, reqID: a.RequestID(), compareAdd: v, seg: 1, nseg: 1}
	r.respond(p, w)
}

// respond queues response w to p, counted in p's IRD until its last
// segment is out (rdQP.sent), and among the QP's responses (rdQP.cut).
func (r *rdQP) respond(p *rdPeer, w *rdWR) {
	p.serving++
	w.resp = len(r.resps)
	r.resps = append(r.resps, w)
	w.msg, _ = r.ep.Post(r.now, reliability.PeerKey{Addr: p.key.addr, QPN: p.key.qpn}, w, w.nseg, reliability.PostResponse)
}

// dropResp takes response w off the QP's responses.
func (r *rdQP) dropResp(w *rdWR) {
	i := w.resp
	if i < 0 || i >= len(r.resps) || r.resps[i] != w {
		return
	}
	last := len(r.resps) - 1
	r.resps[i] = r.resps[last]
	r.resps[i].resp = i
	r.resps[last] = nil
	r.resps = r.resps[:last]
	w.resp = -1
}

// rdAtomicResponse places the original value an Atomic Response brought
// into its atomic's SGE; the atomic completes once its request is also
// acknowledged. It is matched by request identifier (the request's MSN).
func (r *rdQP) atomicResponse(p *rdPeer, seg udiwarp.Segment) {
	a := seg.AtomicResponse()
	for i, w := range p.reads {
		if !w.op.atomic() || w.msn != a.RequestID() {
			continue
		}
		p.reads = append(p.reads[:i], p.reads[i+1:]...)
		if w.status == Success {
			w.status = r.q.placeAtomicResult(w.sge[0], a.Value())
		}
		r.ep.Responded(r.now, w.msg, nil)
		return
	}
	r.q.dev.stats.RxBadOpcode.Add(1) // a response to nothing
}

// noteErr notes that the segment seq being delivered is refused with
// code: the engine reports it to the peer in its acks (Deliver).
func (p *rdPeer) noteErr(seq uint32, code reliability.Code) {
	if p.msgErr == 0 {
		p.msgErr = code // the message's first refusal (deliver)
	}
	if p.code == 0 {
		p.code = code
	}
}

// dropRead takes w off the peer's outstanding Reads.
func (p *rdPeer) dropRead(w *rdWR) {
	for i, r := range p.reads {
		if r == w {
			p.reads = append(p.reads[:i], p.reads[i+1:]...)
			return
		}
	}
}

func rdStatus(c reliability.Code) Status {
	switch c {
	case reliability.CodeRemoteAccess:
		return RemoteAccessError
	case reliability.CodeInvalidRequest:
		return RemoteInvalidRequestError
	}
	return RemoteOperationError
}

// rdCutReads cuts short the Read Responses the device's RD QPs are
// sending out of m, which its owner is deregistering (MR.Deregister): a
// peer's Read does not hold a region. The caller holds the MR table's
// lock (no RD path takes it, so the order is safe).
func (d *Device) rdCutReads(m *MR) {
	for i := range d.qps {
		if q := d.qps[i].Load(); q != nil && q.rd != nil {
			q.rd.cut(m)
		}
	}
}

// cut lets go of m in every Read Response of the QP that sends from it.
// What was transmitted stays transmitted; every segment not yet
// acknowledged goes (again) empty, and the response ends with an empty
// last segment short of the Read's length (reliability.Endpoint.Cut),
// so the requester completes the Read with RemoteAccessError, never
// Success.
func (r *rdQP) cut(m *MR) {
	now := time.Now()
	r.lock(nil)
	defer r.unlock(now)
	for _, w := range r.resps {
		if w.cut || !w.refs.holds(m) {
			continue
		}
		w.cut = true
		w.releaseMRs()
		r.ep.Cut(w.msg)
		if s := w.msg.Sent(); s < w.nseg {
			w.nseg = s + 1
		}
		r.q.dev.stats.RDReadsFlushed.Add(1)
	}
}

// holds reports whether m is among the regions.
func (r *mrRefs) holds(m *MR) bool {
	for i := 0; i < r.n; i++ {
		if r.mrs[i] == m {
			return true
		}
	}
	return false
}

// rdIsSend reports whether seg is an untagged Send (not Immediate Data).
func rdIsSend(seg udiwarp.Segment) bool { return !seg.Control.Tagged() && isSend(seg.Opcode()) }

// rdPlace places an RDMA Write or Read Response segment (Device.placeTagged).
func (r *rdQP) place(seg udiwarp.Segment) (reliability.Code, bool) {
	q := r.q
	t := seg.Tagged()
	if _, ok := q.dev.placeTagged(q.pd, t.STag(), t.TO(), seg.Payload, AccessRemoteWrite); !ok {
		return reliability.CodeRemoteAccess, false
	}
	q.dev.stats.RDWritePlaced.Add(1)
	return 0, true
}

// RDPeerInfo is what an RD QP holds of one peer: its session, what it
// buffers, what is outstanding to it, and its sender's congestion control
// (the RD counterpart of what `ss -ti` shows of a TCP connection).
type RDPeerInfo = reliability.PeerInfo

// RDPeer returns what the RD QP holds of the peer ah names (ok false: it
// has no state for it, or the QP is not RD).
func (q *QP) RDPeer(ah *AH) (info RDPeerInfo, ok bool) {
	r := q.rd
	if r == nil || ah == nil {
		return RDPeerInfo{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ep.Info(reliability.PeerKey{Addr: ah.addr, QPN: ah.qpn})
}

// RDPeers returns what the RD QP holds of each of its peers, in no
// particular order (nil for a QP that is not RD). It costs time and
// memory in proportion to the peers.
func (q *QP) RDPeers() []RDPeerInfo {
	r := q.rd
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]RDPeerInfo, 0, r.ep.Peers())
	r.ep.EachPeer(func(pi *reliability.PeerInfo) { out = append(out, *pi) })
	return out
}
