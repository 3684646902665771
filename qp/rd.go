package qp

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// RD: reliable datagram queue pairs. One RD QP talks to any number of
// peers over its (shared, unconnected) UDP socket; it holds state only for
// the peers it is talking to: per peer a reliability.Sender and Receiver
// (sequence numbers, SACK, retransmission, window), the tokens that
// authenticate the peer's frames, and the WRs queued for it. A WR
// completes only when the peer acknowledged every byte of it (seed 002):
// until then the registered buffer is the retransmit source, so its MRs
// cannot be deregistered. Completion order is per peer (rdPeer.posted):
// a WR waits for the WRs posted before it to the same peer, never for
// another peer's, so a peer that stops posting receives, is slow or
// loses half its packets holds back only its own completions (issue 31
// §5). See docs/wire.md §11 and docs/verbs.md.
//
// Contact (docs/wire.md §11.2): the side that posts first sends Hello with
// a fresh session epoch and a random token; the peer answers with a
// stateless Challenge (echoing that token, issuing its own, computed from
// the source address, QP and epoch and its own session epoch, which it
// derives from the opener's when it has no state) and keeps nothing; the
// first Data frame carries the issued token back and creates the peer's
// state. So state exists only for return-routable sources, a spoofed
// datagram cannot create, reset or feed a peer, and nothing is sent to an
// unvalidated address that is larger than what came from it.
//
// Sessions: every peer state is one session, named by the two sides'
// epochs, which are new for every session, and its tokens bind both, so
// no frame of one session counts in another. When one side drops a
// peer's state (a retry or RNR failure, eviction under the peer cap, idle
// reclaim) and the other keeps it, the survivor learns it from the first
// validated frame of the new session (a new epoch with a keyed token: the
// peer reopened) or from a Challenge echoing its own current token (the
// peer has no state for it: it reopens). Either way what it had in flight
// completes with RemoteAbortedError — unless the Challenge shows that
// nothing in flight can have been delivered, and then it goes again in
// the new session — and nothing of the old session is delivered after.
// The (peer, epoch) of every ended session is remembered for as long as
// any token of it verifies (rdGraveyard: the QP's token secret turns
// before it forgets one) so that a late frame of it cannot open it again.

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

type rdKey struct {
	addr netip.AddrPort
	qpn  uint32
}

// rdWR is a posted RD work request until it completes.
type rdWR struct {
	id     uint64
	op     SendOpcode
	flags  SendFlags
	peer   *rdPeer
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
	sent   uint32 // segments numbered
	acked  uint32
	status Status
	done   bool
	// RDMA Read: the sink (this QP's region), and whether the last Read
	// Response arrived. internal marks a Read Response the QP sends on
	// its own, which completes nothing.
	sinkSTag uint32
	sinkTO   uint64
	respDone bool
	internal bool
	got      uint64 // RDMA Read: response bytes placed; short at the last one fails it
	// RFC 7306: the Immediate Data of an OpImmediate, OpSendImm or
	// OpWriteImm (its own MSN on the Send queue, after the Send's); an
	// atomic's operands; an Atomic Response's request and value.
	imm              uint64
	immMSN           uint32
	compareAdd, swap uint64
	reqID            uint32
	again            bool // rdRenew: in flight, provably not delivered, goes again
	// cut: a Read Response whose source region was deregistered (rdCut):
	// its segments not yet acknowledged go empty, and its last ends short
	// of the Read, which fails it at the requester.
	cut bool
}

// rdPkt is what a peer's sender keeps per packet: enough to build it
// again from registered memory.
type rdPkt struct {
	w      *rdWR
	off, n uint32
	last   bool // the last segment of w's Send or Write
	imm    bool // w's trailing Immediate Data message
}

type rdErr struct {
	seq  uint32
	code reliability.Code
}

type rdPeer struct {
	key         rdKey
	ah          AH     // the peer's address, for sendmsg
	epoch       uint32 // ours in this session: every frame to the peer carries it
	prevEpoch   uint32 // ours before rdRenew drew epoch, until established again
	established bool
	myToken     uint64 // the peer's frames carry it
	keyedToken  uint64 // or this one, a Challenge's, once seen (0: none yet)
	theirToken  uint64 // ours to it carry it
	theirEpoch  uint32
	sendInit    bool // the peer may not have state yet: carry our token
	snd         *reliability.Sender[rdPkt]
	rcv         *reliability.Receiver[[]byte]
	queue       []*rdWR // WRs with segments not yet numbered, in post order
	msn         uint32  // Send MSNs to this peer
	helloAt     time.Time
	helloTries  int
	last        time.Time
	probe       bool                            // a zero-window probe is due: one packet may go past the window
	errs        [reliability.MaxAckErrors]rdErr // recent errors, reported in acks
	nerr        int
	outstanding int               // WRs posted to it and not completed (posted[postedAt:])
	reads       []*rdWR           // Reads sent to it, awaiting their responses, in order
	serving     int               // Read and Atomic Responses to it not yet all sent (IRD)
	readMSN     uint32            // Read and Atomic Request MSNs to it (one queue)
	atomicMSN   uint32            // Atomic Response MSNs to it
	wrMSN       map[uint32]uint32 // Write-Record MSNs to it, per STag
	// msgErr is the first refusal of the peer's last message delivered
	// (0: carried out), inMsg whether its last segment is yet to come: an
	// Immediate Data message after a refused Send or Write completes in
	// error (rdDeliver).
	msgErr reliability.Code
	inMsg  bool
	rxSend rdRxSend  // the peer's Send of several segments being placed
	held   int       // bytes its receiver buffers ahead of a gap
	moved  time.Time // when its gap last opened or moved (or the peer was made)
	// opens are the peer epochs whose opening (Hello) we answered with a
	// Challenge carrying our epoch before our session with the peer was
	// established (rdChallenge), nopens how many: buried if it is
	// established under another epoch (rdReceive).
	opens   [4]uint32
	nopens  uint8
	ackHeld bool // an ack due now waits for the end of the socket's batch (rdQP.acks)
	rdSlots      // its places in the QP's peer table (rdpeers.go)

	// posted are the WRs posted to it and not completed, in post order,
	// from postedAt: they complete in this order (rdComplete), and only
	// they wait for one another. ready says it is in rdQP.ready.
	posted   []*rdWR
	postedAt int
	ready    bool
}

// rdGraveyard is how many ended sessions a QP remembers in a generation
// of its graveyard: a Data frame of one of them with a valid keyed token
// (late, or sent again by a peer that has not yet learnt the session
// ended) must not open it again. When a generation fills, the QP's token
// secret turns (reliability.Graveyard): a grave is forgotten only once no
// token of its session verifies. At most two generations, about 100
// bytes a grave.
const rdGraveyard = 1024

// rdQP is the RD state of a QP, under mu.
type rdQP struct {
	q       *QP
	mu      sync.Mutex
	cfg     RDConfig
	tokens  *reliability.Tokens
	rdTable                               // the peers (rdpeers.go)
	graves  *reliability.Graveyard[rdKey] // ended sessions
	nout    int                           // WRs posted and not completed, to every peer
	// ready are the peers a WR of which finished (done) since the last
	// rdComplete: it completes what each of them can, and nothing else.
	ready   []*rdPeer
	tx      txCtx
	hb      [reliability.MaxHeaderSize + udiwarp.DDPUntaggedHeaderSize + udiwarp.AtomicRequestSize]byte
	ack     reliability.AckBlock
	tmp     AH // for Challenges to sources without state
	next    time.Time
	inMover bool
	held    int // bytes all peers' receivers buffer ahead of gaps
	// acks are the peers whose acks, due now, wait for the end of the
	// batch the socket is delivering (ackAfterBatch); acking is true
	// while the QP is on the socket's list of QPs to flush them.
	acks   []*rdPeer
	acking bool
	trains *rdTrainCtx // made on the QP's first segment train (rdtrain.go)
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
	r := &rdQP{q: q, cfg: cfg, tokens: reliability.NewTokens()}
	r.graves = reliability.NewGraveyard[rdKey](rdGraveyard, r.tokens)
	r.rdTable.init()
	r.tx.init(q)
	return r
}

func (r *rdQP) segment(s *Socket) uint32 {
	max := s.maxDatagram - reliability.HeaderSize - reliability.SeqSize - reliability.TokenSize - udiwarp.DDPTaggedHeaderSize - udiwarp.CRCSize
	if n := r.cfg.Segment; n > 0 && n < max {
		return uint32(n)
	}
	return uint32(max)
}

// rdMaxSend is the largest RD Send: one datagram with the largest RD
// header a Data frame can carry.
func (s *Socket) rdMaxSend() int {
	return s.maxDatagram - reliability.MaxHeaderSize - udiwarp.DDPUntaggedHeaderSize - udiwarp.CRCSize
}

// postRD queues wr for its peer and sends what the window allows now.
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
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := q.State(); st != StateRTS {
		w.releaseMRs()
		return fmt.Errorf("%w: PostSend on a QP in %v", ErrQPState, st)
	}
	if r.nout >= q.caps.MaxSendWR {
		w.releaseMRs()
		return fmt.Errorf("%w: %d send WRs outstanding", ErrQueueFull, r.nout)
	}
	p, err := r.peerFor(wr.AH, now)
	if err != nil {
		w.releaseMRs()
		return err
	}
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
	p.queue = append(p.queue, w)
	p.post(w)
	r.nout++
	if !p.established {
		if p.helloAt.IsZero() {
			r.hello(s, p, now)
		}
	} else if r.pump(s, p, now) {
		r.toMover(s)
	}
	r.touch(p)
	r.arm(now)
	return nil
}

func (w *rdWR) releaseMRs() { w.refs.release() }

// rdSegments is how many segments of seg bytes carry a message of length
// bytes: at least one (an empty message is one empty segment). It counts
// in 64 bits: a length near 4 GiB must not wrap to a single segment.
func rdSegments(length, seg uint32) uint32 {
	return uint32(max(1, (uint64(length)+uint64(seg)-1)/uint64(seg)))
}

// rdEndWriteRecords ends, at the QP's Write-Record engine, the messages
// from the peer k: a new session with it numbers its Write-Records from
// MSN 1 again, and nothing of an ended session can still arrive, so what
// the engine remembers of the old one would only drop the new messages
// as an older message's. Caller holds r.mu.
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

// rdHello (re)sends Hello to a peer we have no tokens from yet.
func (r *rdQP) hello(s *Socket, p *rdPeer, now time.Time) {
	q := r.q
	p.helloAt = now
	b := reliability.Append(r.hb[:0], &reliability.Fields{Type: reliability.Hello, Window: p.rcv.Window(),
		DstQPN: p.key.qpn, SrcQPN: q.wireQPN(), Epoch: p.epoch, Init: true, Issued: p.myToken})
	r.control(s, &p.ah, b)
}

// rdControl sends a frame with no payload.
func (r *rdQP) control(s *Socket, ah *AH, hdr []byte) {
	q := r.q
	t := &r.tx
	t.begin(hdr)
	t.finish(s, ah, 0)
	if t.transmit(s) == nil {
		q.dev.stats.RDControlSent.Add(1)
	}
}

// rdPump numbers and sends queued segments to p while its window and the
// socket allow. It reports whether the socket filled up with work left.
func (r *rdQP) pump(s *Socket, p *rdPeer, now time.Time) (full bool) {
	q := r.q
	for len(p.queue) > 0 {
		probing := false
		switch {
		case p.snd.CanSend(now):
			p.probe = false
		case p.probe:
			probing = true // the window is shut: one packet past it asks for a new one
		default:
			return false
		}
		if !probing && !r.paced(p, now) {
			return false // the pacing clock holds it: the timer sends it (rdPeerDue)
		}
		w := p.queue[0]
		if w.done { // failed meanwhile
			p.popQueue()
			continue
		}
		if w.op.awaitsResponse() && len(p.reads) >= r.cfg.ORD {
			break // ORD reached: later WRs wait their turn, in order
		}
		body := w.nseg // the Send's or Write's segments; then the Immediate Data
		if w.op.imm() {
			body--
		}
		var pk rdPkt
		if w.sent >= body {
			pk = rdPkt{w: w, imm: true}
		} else {
			off := w.sent * w.seg
			pk = rdPkt{w: w, off: off, n: min(w.seg, w.length-off), last: w.sent+1 == body}
		}
		if w.op.awaitsResponse() || w.cut {
			pk.n = 0
		}
		if w.op.awaitsResponse() {
			pk.off = 0
		}
		if !probing && !pk.imm && p.rcv.AckDue(now).IsZero() && r.trainable(s, w, body) {
			k, full := r.train(s, p, w, body, now)
			if full {
				r.waitMover(p)
				return true
			}
			if k > 0 {
				if w.internal && w.sent == w.nseg {
					p.serving-- // as below
				}
				if w.sent == w.nseg {
					p.popQueue()
				}
				continue
			}
		}
		seq := p.snd.Push(pk, int(pk.n)+rdFrameOverhead, now)
		tail := w.sent+1 == w.nseg && len(p.queue) == 1
		if err := r.data(s, p, seq, &pk, now, probing || (tail && w.flags&FlagSignaled != 0)); err == errSocketFull {
			p.snd.Unpush(seq)
			r.waitMover(p)
			return true
		}
		if probing {
			p.probe = false
			q.dev.stats.RDWindowProbes.Add(1)
		}
		w.sent++
		if w.op.awaitsResponse() {
			p.reads = append(p.reads, w)
		}
		if w.internal && w.sent == w.nseg {
			// A response's last segment is out: IRD counts the responses
			// not yet sent. The requester frees its ORD slot when the
			// response arrives, maybe before our sender sees the ack, so
			// counting until then would refuse its next request.
			p.serving--
		}
		if w.sent == w.nseg {
			p.popQueue()
		}
	}
	if len(p.queue) == 0 {
		// Nothing more to send: what the peer acks until what is in
		// flight is acked measures us, not the path.
		p.snd.SetAppLimited()
	}
	return false
}

// rdPaceSlack is how far ahead of the pacing clock a frame may leave
// rather than wait for the timer: no timer wakes more precisely than
// this, and at high rates a wait this short would cost more rate than
// the burst it saves (it lets about the slack's worth of bytes more go
// together than the sender's Quantum).
const rdPaceSlack = 100 * time.Microsecond

// paced reports whether p's congestion control lets a frame leave now
// (reliability.Sender.SendAt, within rdPaceSlack).
func (r *rdQP) paced(p *rdPeer, now time.Time) bool {
	at := p.snd.SendAt(now)
	return at.IsZero() || at.Sub(now) <= rdPaceSlack
}

// rdData builds and sends Data frame seq for pk, with an ack for p
// piggybacked when one is waiting.
func (r *rdQP) data(s *Socket, p *rdPeer, seq uint32, pk *rdPkt, now time.Time, ackNow bool) error {
	q := r.q
	w := pk.w
	f := r.dataFields(p, seq, ackNow)
	if !p.rcv.AckDue(now).IsZero() {
		f.Ack = r.ackBlock(p, now, &f.RNR)
	}
	b := r.frameHeader(r.hb[:0], p, &f, pk)
	t := &r.tx
	t.begin(b)
	n := pk.n
	if st := r.gather(t, w, pk.off, pk.n); st != Success {
		if !w.internal {
			return nil // cannot happen: the MRs are referenced; the peer's ack completes it
		}
		// A Read Response whose source is no longer readable by the peer
		// (MR.Invalidate since the Read was served): the segment goes out
		// empty, and the requester, short of bytes at the last one, fails
		// the Read (docs/wire.md §11).
		t.begin(b)
		n = 0
	}
	t.finish(s, &p.ah, int(n))
	err := t.transmit(s)
	t.release()
	if err == nil {
		p.last = now
		q.dev.stats.RDDataSent.Add(1)
	}
	return err
}

// dataFields are the RD header fields of p's Data frame seq, without
// an ack.
func (r *rdQP) dataFields(p *rdPeer, seq uint32, ackNow bool) reliability.Fields {
	return reliability.Fields{Type: reliability.Data, Window: p.rcv.Window(), DstQPN: p.key.qpn, SrcQPN: r.q.wireQPN(),
		Epoch: p.epoch, Token: p.theirToken, Seq: seq, Init: p.sendInit, Issued: p.myToken, AckNow: ackNow}
}

// frameHeader appends to b the headers of the Data frame f for pk: the
// RD header, then the DDP (and RDMAP) headers of pk's segment.
func (r *rdQP) frameHeader(b []byte, p *rdPeer, f *reliability.Fields, pk *rdPkt) []byte {
	q := r.q
	w := pk.w
	b = reliability.Append(b, f)
	last := pk.last
	// untagged appends an untagged DDP header; only a Send's segments
	// have an MO and may leave L clear (udiwarp.ParseRDSegment).
	untagged := func(opc udiwarp.Opcode, queue udiwarp.Queue, msn uint32, last bool, mo uint32) {
		b = udiwarp.AppendUntagged(b, &udiwarp.UntaggedFields{Last: last, DV: udiwarp.DatagramDDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(opc), ULP: q.wireQPN(), QN: udiwarp.DatagramQN(p.key.qpn, queue), MSN: msn, MO: mo})
	}
	switch op := w.op; {
	case !pk.imm && (op == OpSend || op == OpSendImm):
		opc := udiwarp.OpSend
		if w.flags&FlagSolicited != 0 && op == OpSend { // Send with Immediate: the SE rides on the Immediate Data
			opc = udiwarp.OpSendSE
		}
		untagged(opc, udiwarp.QueueSend, w.msn, last, pk.off) // a segment of the Send at its MO, L on the last
	case pk.imm:
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
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite), STag: w.rstag, TO: w.rto + uint64(pk.off)})
	case op == opReadResponse:
		b = udiwarp.AppendTagged(b, &udiwarp.TaggedFields{Last: last, DV: udiwarp.DatagramDDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpReadResponse), STag: w.rstag, TO: w.rto + uint64(pk.off)})
	case op == OpWriteRecord:
		b = udiwarp.AppendWriteRecord(b, &udiwarp.WriteRecordFields{Last: last, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
			STag: w.rstag, TO: w.rto + uint64(pk.off), MSN: w.msn, MO: pk.off, MessageLength: w.length, DstQPN: p.key.qpn, SrcQPN: q.wireQPN()})
	case op == OpRead:
		untagged(udiwarp.OpReadRequest, udiwarp.QueueReadRequest, w.msn, true, 0)
		b = udiwarp.AppendReadRequest(b, &udiwarp.ReadRequestFields{SinkSTag: w.sinkSTag, SinkTO: w.sinkTO, Size: w.length,
			SourceSTag: w.rstag, SourceTO: w.rto})
	}
	return b
}

// rdFrameOverhead is what a Data frame adds to its payload on the wire,
// near enough for congestion control's count of bytes in flight: the RD
// header with a sequence number, an untagged DDP header and the CRC.
const rdFrameOverhead = reliability.HeaderSize + reliability.SeqSize + udiwarp.DDPUntaggedHeaderSize + udiwarp.CRCSize

// rdGather adds bytes [off, off+n) of w's message to the frame.
func (r *rdQP) gather(t *txCtx, w *rdWR, off, n uint32) Status {
	if w.inline != nil {
		t.add(w.inline[off : off+n])
		return Success
	}
	c := sglSlice{sge: w.sge[:w.nsge], off: off, left: n}
	for part, ok := c.next(); ok; part, ok = c.next() {
		var b []byte
		var st Status
		if w.internal {
			b, st = t.pinRemote(&part) // a Read Response: the peer's access, checked as it is sent
		} else {
			b, st = t.pin(&part) // (a method value here would allocate per segment)
		}
		if st != Success {
			return st
		}
		t.add(b)
	}
	return Success
}

// rdAckBlock fills the QP's ack block for p, with p's recent errors.
func (r *rdQP) ackBlock(p *rdPeer, now time.Time, rnr *bool) *reliability.AckBlock {
	a := &r.ack
	*rnr = p.rcv.Ack(a, now)
	for i := 0; i < p.nerr; i++ {
		e := p.errs[i]
		if reliability.Before(e.seq, a.Cumulative) && a.Cumulative-e.seq < uint32(r.cfg.Window)*4 {
			a.Errors = append(a.Errors, reliability.AckError{Seq: e.seq, Code: e.code})
		}
	}
	return a
}

// rdSendAck sends a standalone ack to p.
func (r *rdQP) sendAck(s *Socket, p *rdPeer, now time.Time) {
	q := r.q
	f := reliability.Fields{Type: reliability.Ack, Window: p.rcv.Window(), DstQPN: p.key.qpn, SrcQPN: q.wireQPN(),
		Epoch: p.epoch, Token: p.theirToken, Init: p.sendInit, Issued: p.myToken}
	f.Ack = r.ackBlock(p, now, &f.RNR)
	r.control(s, &p.ah, reliability.Append(r.hb[:0], &f))
	q.dev.stats.RDAcksSent.Add(1)
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
	st := &d.stats
	frame := b[:len(b)-udiwarp.CRCSize]
	if !d.cfg.NoCRC {
		var err error
		if frame, err = udiwarp.OpenDatagram(b); err != nil {
			st.countRx(err)
			return
		}
	}
	d.deliverRDFrame(s, frame, src)
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

// rdReceive runs one RD frame through the QP.
func (r *rdQP) receive(s *Socket, h *reliability.Header, frame []byte, src netip.AddrPort) {
	q := r.q
	d := q.dev
	st := &d.stats
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	k := rdKey{src, h.SrcQPN}
	p := r.peers[k]
	switch h.Type {
	case reliability.Hello:
		r.challenge(s, h, src, h.Issued, p)
		return
	case reliability.Challenge:
		switch {
		case p != nil && !p.established && h.Token == p.myToken:
			p.theirEpoch, p.theirToken, p.established, p.sendInit = h.Epoch, h.Issued, true, true
			p.keyedToken = 0
			// A Challenge we sent meanwhile to an opening of the peer's
			// under another epoch issued a keyed token that still
			// verifies (it binds our epoch, which stays): a Data frame
			// of that opening, late, would end this session as if the
			// peer had opened again, while the peer, which answered our
			// Hello without state, lives on in this one, and our WRs in
			// flight would complete RemoteAbortedError although it
			// delivers them. The peer answered without state (its epoch
			// differs), so that opening's sender is gone: it is buried
			// (docs/wire.md §11.2).
			for _, ep := range p.opens[:p.nopens] {
				if ep != h.Epoch {
					r.graves.Bury(k, ep)
				}
			}
			p.nopens = 0
		case p != nil && p.established && h.Token == p.theirToken:
			// The peer answered a frame of this session with a
			// Challenge: it has no state for it (it restarted, or
			// dropped ours), and it proved it is where our frames go
			// (only a receiver of them knows the token echoed). The
			// session is over; we open a new one.
			st.RDPeerRestarts.Add(1)
			r.touch(p)
			r.renew(s, p, h.Window, now)
			r.complete()
			r.arm(now)
			return
		default:
			st.RDRejected.Add(1)
			return
		}
		p.last = now
		r.touch(p)
	case reliability.Data, reliability.Ack:
		// A peer's frames carry the token it got from us: the random one
		// of our Hello, or the keyed one of our Challenge (both sides may
		// have opened contact at once).
		known := p != nil && p.established && h.Epoch == p.theirEpoch
		var epoch uint32
		switch {
		case known && (h.Token == p.myToken || h.Token == p.keyedToken && h.Token != 0):
		case known && r.tokens.Valid(h.Token, src, h.SrcQPN, h.Epoch, q.wireQPN(), p.epoch):
			// The keyed token of a Challenge of ours (both sides opened
			// at once): kept, so that it needs no hash again and still
			// counts after the secret turns (rdGraveyard).
			p.keyedToken = h.Token
		case h.Type == reliability.Data && h.HasInit && r.keyed(p, h, src, &epoch):
			// First contact, validated: the source received our Challenge.
			switch {
			case p == nil:
				if !r.addrRoom(src.Addr(), now) {
					st.RDAddrLimited.Add(1)
					return
				}
				if !r.room(now) {
					st.RDRefused.Add(1)
					return
				}
				p = r.newPeer(k, now)
			case p.established:
				// A new session from a return-routable source: the peer
				// reopened (it restarted, or dropped our state).
				st.RDPeerRestarts.Add(1)
				r.restart(p, now)
			}
			p.epoch, p.prevEpoch, p.nopens = epoch, 0, 0
			p.myToken, p.theirToken, p.theirEpoch, p.established, p.sendInit = h.Token, h.Issued, h.Epoch, true, false
			p.keyedToken = 0
		case h.Type == reliability.Data:
			// No state, a stale epoch or a wrong token: answer with a
			// Challenge no larger than the frame; change nothing.
			st.RDRejected.Add(1)
			if h.HasInit && p != nil && p.established && h.Epoch != p.theirEpoch && !r.graves.Buried(k, h.Epoch) {
				if _, ok := r.tokens.Derive(h.Token, src, h.SrcQPN, h.Epoch, q.wireQPN()); ok {
					// A session opening with the keyed token of a
					// Challenge we sent without state, refused because
					// another session with the source began meanwhile.
					// Our Challenge tells its sender that the frame found
					// no session, so it sends the frame's messages again
					// in a new one (rdRenew): this session must never
					// open after, from another copy of the frame, once we
					// drop the other (docs/wire.md §11.2).
					r.graves.Bury(k, h.Epoch)
				}
			}
			r.challenge(s, h, src, h.Token, p)
			return
		default:
			st.RDRejected.Add(1)
			return
		}
		p.last = now
		r.touch(p)
		if h.HasAck {
			p.sendInit = false // the peer has our state
			if err := r.onAck(s, p, h, now); err != nil {
				r.failPeer(p, err)
				r.complete()
				r.arm(now)
				return
			}
		}
		if h.Type == reliability.Data {
			r.onData(s, p, h, frame[h.Size:], src, now)
		}
	}
	if p.established && len(p.queue) > 0 && r.pump(s, p, now) {
		r.toMover(s)
	}
	if due := p.rcv.AckDue(now); !due.IsZero() && !due.After(now) {
		r.ackAfterBatch(s, p, now)
	}
	r.complete()
	r.arm(now)
}

// ackAfterBatch sends p the ack due now — at the end of the batch the
// socket is delivering, if it is delivering one: one ack then covers
// every frame of the batch, where a sender that asks for an ack on each
// of its frames (the last it has, AckNow) would otherwise draw one
// standalone ack, two system calls, per frame. The batch ends within the
// same read, so the ack is no later for it; the device timer leaves a
// held ack alone meanwhile (rdQP.timer, rdPeerDue). Caller holds r.mu.
func (r *rdQP) ackAfterBatch(s *Socket, p *rdPeer, now time.Time) {
	if !s.rx.batching {
		r.sendAck(s, p, now)
		return
	}
	if !p.ackHeld {
		p.ackHeld = true
		r.acks = append(r.acks, p)
		r.touch(p) // off the timer's heap for its ack
	}
	if !r.acking {
		r.acking = true
		s.rx.rdAcks = append(s.rx.rdAcks, r)
	}
}

// flushAcks sends the acks ackAfterBatch held, to the peers still known
// and still owed one (a Data frame sent back meanwhile may have carried
// it).
func (r *rdQP) flushAcks(s *Socket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for i, p := range r.acks {
		p.ackHeld = false
		r.acks[i] = nil
		r.touch(p) // its due time counts its acks again (rdPeerDue)
		if r.peers[p.key] == p && p.established {
			if due := p.rcv.AckDue(now); !due.IsZero() && !due.After(now) {
				r.sendAck(s, p, now)
			}
		}
	}
	r.acks = r.acks[:0]
	r.acking = false
	r.arm(now)
}

// rdKeyed reports whether h, a Data frame opening a session, carries the
// keyed token a Challenge of ours issued for its source and epoch, and
// sets *epoch to our epoch in that session: p's when we have state for
// the source (the Challenge carried it), else the one derived from the
// source's epoch (a Challenge without state did), which a peer state not
// yet established also takes (its Hello's epoch is then unknown to the
// peer, or answered by a Challenge that no longer matters). A session
// that ended (rdBury) is not opened again.
func (r *rdQP) keyed(p *rdPeer, h *reliability.Header, src netip.AddrPort, epoch *uint32) bool {
	q := r.q
	if r.graves.Buried(rdKey{src, h.SrcQPN}, h.Epoch) {
		return false
	}
	if p != nil && r.tokens.Valid(h.Token, src, h.SrcQPN, h.Epoch, q.wireQPN(), p.epoch) {
		*epoch = p.epoch
		return true
	}
	if p != nil && !p.established && p.prevEpoch != 0 && r.tokens.Valid(h.Token, src, h.SrcQPN, h.Epoch, q.wireQPN(), p.prevEpoch) {
		// The peer opened a new session (its epoch is not buried) and
		// took the epoch a Challenge of ours gave before we renewed:
		// the pair is new all the same, and refusing it would have each
		// side renew in turn.
		*epoch = p.prevEpoch
		return true
	}
	if p == nil || !p.established {
		if d, ok := r.tokens.Derive(h.Token, src, h.SrcQPN, h.Epoch, q.wireQPN()); ok {
			*epoch = d
			return true
		}
	}
	return false
}

// rdChallenge answers a source without valid state, echoing echo, if
// mayAnswer allows a Challenge of its size to the datagram that drew it. Our
// epoch in it is p's when we have state for the source, else derived from
// the source's epoch. Answering a Data frame, its window field carries
// the low 16 bits of the frame's sequence number: the peer learns which
// of its frames found no session (rdRenew).
func (r *rdQP) challenge(s *Socket, h *reliability.Header, src netip.AddrPort, echo uint64, p *rdPeer) {
	q := r.q
	if h.SrcQPN == 0 || h.SrcQPN > udiwarp.MaxQPN {
		return
	}
	var epoch uint32
	if p != nil {
		epoch = p.epoch
	} else {
		epoch = r.tokens.Epoch(src, h.SrcQPN, h.Epoch, q.wireQPN())
	}
	var seq16 uint16
	if h.Type == reliability.Data {
		seq16 = uint16(h.Seq)
	}
	if p != nil && !p.established && h.Type == reliability.Hello {
		// An opening of the peer's answered with our epoch before our
		// own session with it is established (rdReceive, Challenge).
		if int(p.nopens) == len(p.opens) {
			copy(p.opens[:], p.opens[1:])
			p.nopens--
		}
		p.opens[p.nopens] = h.Epoch
		p.nopens++
	}
	b := reliability.Append(r.hb[:0], &reliability.Fields{Type: reliability.Challenge, Window: seq16, DstQPN: h.SrcQPN, SrcQPN: q.wireQPN(),
		Epoch: epoch, Token: echo, Init: true, Issued: r.tokens.Issue(src, h.SrcQPN, h.Epoch, q.wireQPN(), epoch)})
	if !s.mayAnswer(src, len(b)+udiwarp.CRCSize) {
		return
	}
	r.tmp.setAddr(src, h.SrcQPN)
	r.control(s, &r.tmp, b)
	q.dev.stats.RDChallenges.Add(1)
}

// rdOnAck applies an ack to p's sender.
func (r *rdQP) onAck(s *Socket, p *rdPeer, h *reliability.Header, now time.Time) error {
	q := r.q
	a := &h.Ack
	err := p.snd.OnAck(a, h.Window, h.HasRNR, now,
		func(seq uint32, pk *rdPkt) {
			w := pk.w
			code, bad := a.Error(seq)
			if bad && w.status == Success {
				w.status = rdStatus(code)
			}
			w.acked++
			switch {
			case w.acked < w.nseg || w.done:
			case w.op.awaitsResponse() && bad:
				p.dropRead(w) // refused: no response will come
				w.done = true
			case w.op.awaitsResponse():
				w.done = w.respDone // else when its last response arrives
			default:
				w.done = true
			}
			switch {
			case !w.done:
			case w.internal:
				w.releaseMRs()
			default:
				r.finished(p)
			}
		},
		func(seq uint32, pk *rdPkt) {
			q.dev.stats.RDRetransmits.Add(1)
			r.data(s, p, seq, pk, now, false)
		})
	if errors.Is(err, reliability.ErrAckUnsent) {
		q.dev.stats.RDBadAcks.Add(1)
		return nil
	}
	return err
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

// rdOnData runs a Data frame's sequence number through p's receiver and
// delivers what is in order.
//
// The frame may have landed in a posted receive (s.rx.landRD, see
// landing.go): seg is then its DDP header alone, and its payload is in
// that receive. In order, it completes there if that receive is the next
// (deliverLanded); a frame to buffer is copied out first.
func (r *rdQP) onData(s *Socket, p *rdPeer, h *reliability.Header, seg []byte, src netip.AddrPort, now time.Time) {
	q := r.q
	st := &q.dev.stats
	if h.WantsAck {
		p.rcv.Urge()
	}
	land := s.rx.landRD
	if land != nil && land.q != q {
		// It landed in another QP's receive (a number an alias of the
		// socket guessed for, now the device's own QP's): copied out, it
		// is this QP's ordinary frame.
		var ok bool
		if seg, ok = s.rx.copyOut(land); !ok {
			return
		}
		seg, land = seg[h.Size:], nil
	}
	deliver := func(seq uint32, b []byte) bool {
		if land != nil && seq == h.Seq {
			return r.deliverLanded(s, p, seq, b, land, src)
		}
		ok := r.deliver(s, p, seq, b, src)
		if ok && seq != h.Seq { // one the receiver held (a refused one it lets go of itself)
			r.unhold(p, b)
		}
		return ok
	}
	next := p.rcv.Next()
	switch v := p.rcv.Classify(h.Seq); v {
	case reliability.Buffered:
		if land != nil {
			f, ok := s.rx.copyOut(land)
			if !ok {
				return // as if lost: unacknowledged, the peer sends it again
			}
			seg, land = f[h.Size:], nil
		}
		if p.held+len(seg) > r.cfg.MaxHeldBytes || r.held+len(seg) > r.cfg.MaxQPHeldBytes {
			// Over the peer's or the QP's budget: dropped unacknowledged,
			// as if lost; the sender sends it again.
			st.RDOverBudget.Add(1)
			return
		}
		if q.srq != nil && !r.admitOutOfOrder(p, h.Seq, seg) {
			return
		}
		if p.rcv.Held() == 0 {
			// A gap opens now: the clock of what the peer holds ahead of
			// it starts here, not at its last in-order delivery, or a
			// peer that sent nothing for IdleTimeout (the traffic went
			// the other way) and whose next frames arrive out of order
			// would be reclaimed at once with them in flight (reclaimAt).
			p.moved = now
		}
		p.held += len(seg)
		r.held += len(seg)
		p.rcv.Receive(h.Seq, append([]byte(nil), seg...), now, deliver)
		if q.srq != nil && rdNeedsRecv(seg) {
			p.rcv.Claim(h.Seq) // a claim on a receive (srq_rd.go)
		}
		st.RDBuffered.Add(1)
	case reliability.Duplicate:
		p.rcv.Receive(h.Seq, nil, now, deliver)
		st.RDDuplicates.Add(1)
	case reliability.Beyond:
		p.rcv.Receive(h.Seq, nil, now, deliver)
		st.RDBeyondWindow.Add(1)
	default:
		if p.rcv.Receive(h.Seq, seg, now, deliver) == reliability.Delivered && q.srq == nil {
			if land != nil {
				s.rx.noteSend(q, land.payload(), h.Size)
			} else if op, ok := rdUntaggedOp(seg); ok && isSend(op) {
				s.rx.noteSend(q, len(seg)-udiwarp.DDPUntaggedHeaderSize, h.Size)
			}
		}
	}
	if p.rcv.Next() != next {
		p.moved = now // the gap moved: what it holds is not stalled
	}
}

// rdDeliver carries out one in-order DDP segment from p. It returns false
// when a Send finds no receive posted (receiver not ready: the peer sends
// it again later); a segment that fails its checks is consumed and its
// error reported in the acks.
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
		st.RDNotReady.Add(1) // at an SRQ limit too: the sender sends it again
		return false
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
		if q.takeRecv(x.w, len(seg.Payload), src) != recvTaken {
			q.dev.stats.RDNotReady.Add(1)
			return false
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
		q.dev.stats.RDNotReady.Add(1)
		return false // not received: the peer sends it again
	}
	return r.deliver(s, p, seq, f[land.hlen-len(hdr):], src)
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

// rdServeRead answers a Read Request from p: after the checks of RFC
// 5040 §7.2 (source STag and key, PD, remote-read access, bounds), it
// queues the Read Responses, tagged writes into the requester's sink,
// which the window clocks out like any data: a peer gets no more than it
// acknowledges, and only a validated peer has state to ask at all.
func (r *rdQP) serveRead(p *rdPeer, seq uint32, seg udiwarp.Segment) {
	q := r.q
	st := &q.dev.stats
	rr := seg.ReadRequest()
	if p.serving >= r.cfg.IRD {
		st.RDReadsRefused.Add(1)
		p.noteErr(seq, reliability.CodeRemoteOperation)
		return
	}
	s := q.sock.Load()
	w := &rdWR{op: opReadResponse, internal: true, peer: p, length: rr.Size(), rstag: rr.SinkSTag(), rto: rr.SinkTO()}
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
	p.queue = append(p.queue, w)
	p.serving++
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
			// invalidated (sent empty) or deregistered (rdCut) under it.
			w.status = RemoteAccessError
		}
		p.reads = append(p.reads[:i], p.reads[i+1:]...)
		w.respDone = true
		if w.acked == w.nseg {
			w.done = true
			r.finished(p)
		}
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
	w := &rdWR{op: opAtomicResponse, internal: true, peer: p, msn: p.atomicMSN, reqID: a.RequestID(), compareAdd: v, seg: 1, nseg: 1}
	p.queue = append(p.queue, w)
	p.serving++
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
		w.respDone = true
		if w.acked == w.nseg {
			w.done = true
			r.finished(p)
		}
		return
	}
	r.q.dev.stats.RxBadOpcode.Add(1) // a response to nothing
}

func (p *rdPeer) noteErr(seq uint32, code reliability.Code) {
	if p.msgErr == 0 {
		p.msgErr = code // the message's first refusal (deliver)
	}
	if p.nerr < len(p.errs) {
		p.nerr++
	} else {
		copy(p.errs[:], p.errs[1:])
	}
	p.errs[p.nerr-1] = rdErr{seq, code}
}

// rdComplete completes the finished WRs of the peers that have any, in
// post order per peer: a WR waits for the ones posted before it to the
// same peer, never for another peer's (issue 31 §5: a peer that stops
// posting receives, is slow or loses half its packets holds back only
// its own WRs). Across peers, completions come as WRs finish.
func (r *rdQP) complete() {
	q := r.q
	for i, p := range r.ready {
		r.ready[i] = nil
		p.ready = false
		for p.postedAt < len(p.posted) && p.posted[p.postedAt].done {
			w := p.posted[p.postedAt]
			p.posted[p.postedAt] = nil
			p.postedAt++
			p.outstanding--
			r.nout--
			w.releaseMRs()
			if w.status != Success || w.flags&FlagSignaled != 0 {
				n := int(w.length)
				if w.status != Success {
					n = 0
				}
				q.pushSend(w.id, w.status, w.op.wcOpcode(), n)
			}
			w.recycle()
		}
		if p.postedAt == len(p.posted) {
			p.posted, p.postedAt = p.posted[:0], 0 // keeps its array: the next post appends without allocating
		}
		r.touch(p)
	}
	r.ready = r.ready[:0]
}

// finished notes that a WR posted to p is done: the next rdComplete
// looks at p's.
func (r *rdQP) finished(p *rdPeer) {
	if !p.ready {
		p.ready = true
		r.ready = append(r.ready, p)
	}
}

// post adds w to the WRs posted to p. A full array whose front half or
// more is completed is compacted instead of grown, so that a peer with
// WRs always outstanding allocates nothing per post either.
func (p *rdPeer) post(w *rdWR) {
	if len(p.posted) == cap(p.posted) && p.postedAt > 0 && p.postedAt >= len(p.posted)/2 {
		n := copy(p.posted, p.posted[p.postedAt:])
		clear(p.posted[n:])
		p.posted, p.postedAt = p.posted[:n], 0
	}
	p.posted = append(p.posted, w)
	p.outstanding++
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

// recycle returns w to rdWRs if nothing can refer to it any more: it
// completed successfully with every segment numbered and acknowledged
// (so it is off its peer's queue, and its sender let go of its packets),
// and it is no Read or atomic (kept on the peer's Reads until the
// response) nor a response the QP sent on its own. Anything else is left
// to the garbage collector, which needs no such proof.
func (w *rdWR) recycle() {
	if w.status != Success || w.internal || w.again || w.op.awaitsResponse() || w.sent != w.nseg || w.acked < w.nseg {
		return
	}
	inline := w.inline
	*w = rdWR{inline: inline[:0]}
	rdWRs.Put(w)
}

// popQueue takes the first WR off p's queue; an emptied queue keeps its
// array, so that a peer sent one message at a time allocates nothing.
func (p *rdPeer) popQueue() {
	p.queue[0] = nil
	if len(p.queue) == 1 {
		p.queue = p.queue[:0]
		return
	}
	p.queue = p.queue[1:]
}

// rdFailPeer fails every WR to p with the status err maps to and drops
// its state; the QP goes on serving its other peers.
func (r *rdQP) failPeer(p *rdPeer, err error) {
	q := r.q
	st := RetryExceededError
	if errors.Is(err, reliability.ErrRNRRetryExceeded) {
		st = RNRRetryExceededError
	}
	q.dev.stats.RDPeerFailures.Add(1)
	r.abort(p, st, true)
	r.forget(p)
}

// rdAbort completes every WR to p with st: those in flight and, if all,
// those still queued too.
func (r *rdQP) abort(p *rdPeer, st Status, all bool) {
	p.snd.Each(func(_ uint32, pk *rdPkt) {
		if !pk.w.done && !pk.w.again {
			pk.w.status, pk.w.done = st, true
			if pk.w.internal {
				pk.w.releaseMRs()
				if pk.w.sent < pk.w.nseg {
					p.serving--
				}
			}
		}
	})
	for _, w := range p.reads {
		if !w.done {
			w.status, w.done = st, true
		}
	}
	p.reads = p.reads[:0]
	p.snd.Reset()
	p.rcv.Reset()
	keep := p.queue[:0]
	for _, w := range p.queue {
		switch {
		case w.done:
		case w.internal: // a response to the old incarnation: drop it (not all sent: it is in the queue)
			w.status, w.done = st, true
			w.releaseMRs()
			p.serving--
		case all || w.sent > 0:
			w.status, w.done = st, true
		default:
			keep = append(keep, w)
		}
	}
	clear(p.queue[len(keep):])
	p.queue = keep
	// WRs fully sent but not yet acked are in the sender's ring (done
	// above); anything else of this peer still open is in p.posted.
	for _, w := range p.posted[p.postedAt:] {
		if !w.done && (all || w.sent > 0) {
			w.status, w.done = st, true
		}
	}
	r.finished(p)
}

// rdRestart handles a peer that came back with a new session: the WRs in
// flight to its old one fail with RemoteAbortedError (it may or may not
// have carried them out), queued ones start over in the new session, and
// the old session is buried.
func (r *rdQP) restart(p *rdPeer, now time.Time) {
	r.bury(p)
	r.abort(p, RemoteAbortedError, false)
	r.endWriteRecords(p.key)
	p.probe = false
	p.snd = reliability.NewSender[rdPkt](r.cfg.Config)
	p.rcv = r.newReceiver(p)
	p.nerr = 0
	p.established = false
	p.last = now
}

// rdRenew ends p's session after the peer answered its frame seq16 (the
// low 16 bits of a sequence number) with a Challenge: the peer has no
// state for the session, and we open a new one, with a new epoch and
// token (the old ones may still open the old session at the peer).
//
// What was in flight is lost with the old session, but not all of it
// need fail: if the challenged frame went only once, its one copy found
// no session, so the peer never carried it out, nor, delivering in order,
// anything after it. The WRs wholly at or after it go again in the new
// session; those before it may have been carried out before the peer
// dropped the session (an ack lost) and complete with
// RemoteAbortedError, as does everything when the frame is unknown or
// went more than once.
func (r *rdQP) renew(s *Socket, p *rdPeer, seq16 uint16, now time.Time) {
	cut := p.snd.Next() // frames before cut may have been delivered
	if seq, once, ok := p.snd.Find(seq16); ok && once {
		cut = seq
	}
	// A WR's segments are numbered one after another (rdPump), so the
	// first of its segments in flight decides: it goes again if that
	// one is at or after the cut and none of it was acknowledged.
	var again []*rdWR
	var last *rdWR
	p.snd.Each(func(seq uint32, pk *rdPkt) {
		w := pk.w
		if w == last {
			return
		}
		last = w
		if !w.done && !w.internal && w.acked == 0 && !reliability.Before(seq, cut) {
			w.again = true
			again = append(again, w)
		}
	})
	for _, w := range again {
		w.sent, w.acked = 0, 0
		if w.op.awaitsResponse() {
			p.dropRead(w)
		}
	}
	r.restart(p, now)
	// The WRs that go again come first, in post order; then the queue
	// as it was, less any of them.
	queue := make([]*rdWR, 0, len(again)+len(p.queue))
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
	p.prevEpoch, p.epoch = p.epoch, reliability.NewEpoch()
	p.newToken()
	p.theirToken, p.theirEpoch, p.sendInit, p.keyedToken = 0, 0, false, 0
	p.helloAt, p.helloTries = time.Time{}, 0
	if len(p.queue) == 0 {
		r.forget(p) // nothing to send: contact waits for the next WR
		return
	}
	r.hello(s, p, now)
}

// rdTimer runs the QP's RD timers at now and returns the next deadline.
func (r *rdQP) timer(now time.Time) time.Time {
	q := r.q
	r.mu.Lock()
	defer r.mu.Unlock()
	s := q.sock.Load()
	if s == nil || q.State() == StateError || q.State() == StateReset {
		r.next = time.Time{} // the timer no longer holds q: the next rdArm arms it
		return time.Time{}
	}
	for _, p := range r.takeDue(now) {
		if !p.listed {
			continue // forgotten by an earlier one's work
		}
		if !p.established {
			if !p.helloAt.IsZero() && !now.Before(p.helloAt.Add(r.helloWait(p))) {
				if p.helloTries >= r.cfg.MaxRetries {
					r.failPeer(p, reliability.ErrRetryExceeded)
					continue
				}
				p.helloTries++
				r.hello(s, p, now)
			}
			continue
		}
		if d := p.snd.Deadline(); !d.IsZero() && !now.Before(d) {
			err := p.snd.OnTimer(now, func(seq uint32, pk *rdPkt) {
				q.dev.stats.RDRetransmits.Add(1)
				r.data(s, p, seq, pk, now, true)
			})
			if err != nil {
				r.failPeer(p, err)
				continue
			}
		}
		// An ack held for the end of the batch the socket is delivering
		// is that batch's (ackAfterBatch): sent now, mid-batch, it would
		// answer only the frames handled so far, and the next one would
		// draw another.
		if due := p.rcv.AckDue(now); !p.ackHeld && !due.IsZero() && !now.Before(due) {
			r.sendAck(s, p, now)
		}
		if len(p.queue) > 0 {
			// A zero window holds our queued work (and the regions it
			// names): probe it, and give the peer up when the probes run
			// out.
			due, err := p.snd.Probe(now)
			if err != nil {
				r.failPeer(p, err)
				continue
			}
			p.probe = p.probe || due
		}
		if len(p.queue) > 0 && r.pump(s, p, now) {
			r.toMover(s)
		}
		r.compact(p, now)
		if at := r.reclaimAt(p); !at.IsZero() && now.After(at) {
			r.forget(p)
			q.dev.stats.RDPeersReclaimed.Add(1)
		}
	}
	r.complete()
	r.next = time.Time{}
	return r.settle(now)
}

func (r *rdQP) helloWait(p *rdPeer) time.Duration {
	c := r.cfg
	return min(c.InitialRTT<<min(p.helloTries, 20), c.MaxRTO)
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

// rdCut lets go of m in every Read Response of q that sends from it.
// What was transmitted stays transmitted; every segment not yet
// acknowledged goes (again) empty, and the response ends with an empty
// last segment short of the Read's length, so the requester completes
// the Read with RemoteAccessError, never Success.
func (r *rdQP) cut(m *MR) {
	q := r.q
	r.mu.Lock()
	defer r.mu.Unlock()
	cut := func(w *rdWR) {
		if !w.internal || w.done || w.cut || !w.refs.holds(m) {
			return
		}
		w.cut = true
		w.releaseMRs()
		if w.sent < w.nseg {
			w.nseg = w.sent + 1 // one more segment: the empty last
		}
		q.dev.stats.RDReadsFlushed.Add(1)
	}
	for _, p := range r.peers {
		for _, w := range p.queue {
			cut(w)
		}
		p.snd.Each(func(_ uint32, pk *rdPkt) {
			if cut(pk.w); pk.w.cut {
				pk.n = 0
			}
		})
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

// rdFlush fails every WR of the QP with WRFlushError (ERROR, Destroy).
func (r *rdQP) flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.peers {
		r.endRxSend(p, WRFlushError)
		r.abort(p, WRFlushError, true)
		r.bury(p) // its sessions end: none opens again if the QP comes back (RESET, RTS)
	}
	// A peer no longer in the table has nothing posted left open: it was
	// forgotten only after every WR to it finished (rdFailPeer, reclaim
	// of a quiet peer, rdRenew with nothing to send).
	r.complete()
	r.rdTable.reset()
}
