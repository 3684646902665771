package qp

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/reliability"
)

// rxSide is the receive side of a socket's datagram engines: it supplies
// the buffers of every read to the lower layer and hands each datagram to
// the engines (Device.deliver). The buffers are the slot's own, or — when
// it can guess what comes next — the memory the datagram is for: a posted
// receive of the QP the last Sends were for (landing.go) or the next
// segments' place in a Write-Record region (wrlanding.go). The guesses
// live here, not in the lower layer, which only reads into what it is
// given. Everything but landQP, landBig and rdHdr is under Socket.rxMu.
type rxSide struct {
	s    *Socket
	msgs []llp.Msg
	bufs [][]byte  // each slot's own buffer
	land []landing // direct placement into posted receives, per slot
	n    int       // datagrams the last read returned
	// lendN is how many slots a manual socket's next Progress lends a
	// buffer (Socket.Progress); first is the buffer its first slot keeps
	// (lend).
	lendN int
	first *[1 << 16]byte
	// landWR says the landed slots are Write-Record segments.
	landWR bool
	// landQP is the QP the last Send was for: batch receives land in its
	// posted receives (see landing.go).
	landQP atomic.Pointer[QP]
	// landBig says recent messages were large enough that landing in
	// place beats preparing it, even for a single-datagram read.
	landBig atomic.Bool
	// rdHdr is the RD header size of the last RD Send placed: an RD QP's
	// receives land behind a header slot of that size plus DDP's.
	rdHdr atomic.Int32
	// landRD is the slot whose RD frame the engine is running, its payload
	// in the receive it landed in (landing.go, rdLanded); kept counts the
	// batch's slots whose payload waits in a receive that way.
	landRD *landing
	kept   int
	// batching is true while dispatch delivers a read's datagrams; rdAcks
	// are the RD QPs that hold acks until it ends (rdQP.flushAcks).
	batching bool
	rdAcks   []*rdQP
	// landOff skips landing for this many reads after a wrong guess (the
	// socket's traffic goes to several QPs).
	landOff int
	// wrg is the Write-Record message whose next segments batch receives
	// land at their predicted place (see wrlanding.go).
	wrg wrGuess
	rdh reliability.Header // the RD header being handled
	// cur is the slot being delivered (for its control messages); held,
	// a datagram the receive impairment delayed, delivered outside a read.
	cur  int
	held *llp.Msg
	// left is how many bytes of replies the datagram being delivered may
	// still draw (mayAnswer).
	left int
	// streak counts inline polls in a row that found a datagram.
	streak int
	// reads counts the reads that returned datagrams: the batches the
	// engines were handed (tests weigh RD's acks per batch with it).
	reads uint64
}

func (r *rxSide) init(s *Socket, batch int) {
	r.s = s
	r.msgs = make([]llp.Msg, batch)
	r.bufs = make([][]byte, batch)
	r.land = make([]landing, batch)
	for i := range batch {
		r.land[i].idx = i
		r.msgs[i].Bufs = r.bufs[i : i+1]
		if !s.manual {
			r.setBuf(i, make([]byte, 1<<16))
		}
	}
}

func (r *rxSide) setBuf(i int, b []byte) {
	r.bufs[i] = b
}

// rxBufs lends manual sockets their read buffers for the length of one
// Progress: a socket at rest holds none, so that ten thousand of them
// (the LD_PRELOAD engine's) cost no receive memory.
var rxBufs = sync.Pool{New: func() any { return new([1 << 16]byte) }}

// The first manual sockets to be read keep their first slot's buffer
// between reads, up to maxFirstBufs of them in the process (4 MiB): a
// program that spins on a few sockets (a libfabric endpoint's CQ) then
// reads without a pool round trip per poll, which costs a fifth of an
// idle poll, while ten thousand sockets still hold at most that much.
const maxFirstBufs = 64

var firstBufs atomic.Int32

// lend gives a manual socket's first n slots a buffer each.
func (r *rxSide) lend(n int) {
	if !r.s.manual {
		return
	}
	for i := range n {
		if i == 0 && r.first != nil {
			r.setBuf(0, r.first[:])
			continue
		}
		r.setBuf(i, rxBufs.Get().(*[1 << 16]byte)[:])
	}
}

// giveBack returns what lend gave, once the datagrams were handled
// (dispatch copies what it keeps); the first slot's stays with the
// socket while the process keeps fewer than maxFirstBufs so.
func (r *rxSide) giveBack(n int) {
	if !r.s.manual {
		return
	}
	for i := range n {
		b := (*[1 << 16]byte)(r.bufs[i])
		switch {
		case i == 0 && r.first == b:
		case i == 0 && r.first == nil && firstBufs.Add(1) <= maxFirstBufs:
			r.first = b
		default:
			if i == 0 && r.first == nil {
				firstBufs.Add(-1)
			}
			rxBufs.Put(b)
		}
		r.bufs[i] = nil
	}
}

// dropFirst lets the socket's kept buffer go (its Close).
func (r *rxSide) dropFirst() {
	if r.first != nil {
		rxBufs.Put(r.first)
		r.first = nil
		firstBufs.Add(-1)
	}
}

// read reads up to vlen datagrams without waiting, landing them in place
// where it can guess their place; false means the socket closed.
func (r *rxSide) read(vlen int) bool {
	vlen = min(vlen, len(r.msgs))
	landed := 0
	if r.landOff > 0 {
		r.landOff--
	} else if r.s.manual {
		// Lent buffers: no landing guesses (a manual socket reads a
		// datagram or a few at a time, for a program's receive).
	} else if big := r.landBig.Load(); vlen > 1 || big {
		if r.wrg.q != nil {
			landed = r.prepareWRLanding(vlen)
		}
		// Large Sends land in their posted receives. Small ones do not:
		// copying a few hundred bytes costs less than binding a batch of
		// receives (BenchmarkRoundTripCPU).
		if landed == 0 && big {
			landed = r.prepareLanding(vlen)
		}
		if big && landed > 0 {
			vlen = landed // large datagrams: read no more than can land in place
		}
	}
	n, err := r.s.ll.Read(r.msgs[:vlen])
	ok := err == nil
	r.n = n
	if n > 0 {
		r.reads++
	}
	switch {
	case landed > 0 && r.landWR:
		r.endWRLanding(landed)
	case landed > 0:
		// (A read that finds the socket closed reads nothing, so every
		// slot endLanding kept has a dispatch coming.)
		r.endLanding(landed)
	}
	return ok
}

// arrived counts a datagram of n bytes the socket read, and lets it draw
// replies of as many bytes (mayAnswer): the one home of both, for the
// ordinary path and the landing ones.
func (r *rxSide) arrived(n int) {
	st := &r.s.dev.stats
	st.RxDatagrams.Add(1)
	st.RxBytes.Add(uint64(n))
	r.left = n
}

// dispatch hands every datagram of the last read to the engines; false
// when there was none.
func (r *rxSide) dispatch() bool {
	if r.n <= 0 {
		return false
	}
	r.batching = true
	defer r.endBatch()
	for i := 0; i < r.n; i++ {
		r.deliverSlot(i)
	}
	return true
}

// deliverSlot hands the datagrams of the last read's slot i to the
// engines.
func (r *rxSide) deliverSlot(i int) {
	r.cur = i
	m := &r.msgs[i]
	if l := &r.land[i]; l.q != nil {
		// Landed in a posted receive: endLanding either completed it
		// there, kept it for the RD engine, or copied it out for the
		// ordinary path.
		switch {
		case l.keep: // (evicted meanwhile: copied out, l.flat)
			r.rdLanded(l, m.Addr)
		case !l.done:
			r.deliverSplit(l.flat, m.Trunc || m.N > len(l.flat), m.Segment, m.Addr)
		}
		l.q, l.done, l.flat = nil, false, nil
		return
	}
	r.deliverSplit(r.bufs[i][:min(m.N, len(r.bufs[i]))], m.Trunc, m.Segment, m.Addr)
}

// endBatch sends the acks RD QPs held for the end of the batch.
func (r *rxSide) endBatch() {
	r.batching = false
	for i, q := range r.rdAcks {
		q.flushAcks(r.s)
		r.rdAcks[i] = nil
	}
	r.rdAcks = r.rdAcks[:0]
}

// deliverSplit delivers a read, cutting it into its datagrams when GRO
// merged several (every one gso bytes but the last).
func (r *rxSide) deliverSplit(b []byte, truncated bool, gso int, src netip.AddrPort) {
	d := r.s.dev
	if gso <= 0 || gso >= len(b) || truncated {
		d.deliver(r.s, b, truncated, src)
		return
	}
	for len(b) > 0 {
		k := min(gso, len(b))
		d.deliver(r.s, b[:k], false, src)
		b = b[k:]
	}
}

// deliverLate delivers a datagram the receive impairment delayed, under
// the socket's receive lock, unless the socket has closed.
func (s *Socket) deliverLate(m *llp.Msg) {
	s.txMu.Lock()
	closed := s.closed
	s.txMu.Unlock()
	if closed {
		return
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	s.rx.held = m
	s.dev.deliver(s, m.Bufs[0][:m.N], m.Trunc, m.Addr)
	s.rx.held = nil
}

// rxDst returns the destination address of the datagram being delivered
// and whether it is unicast (llp.Msg.Dst).
func (s *Socket) rxDst() (dst netip.Addr, unicast, ok bool) {
	if m := s.rx.held; m != nil {
		return m.Dst()
	}
	return s.rx.msgs[s.rx.cur].Dst()
}
