//go:build cgo && linux

package main

/*
#include "udwf.h"
*/
import "C"

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"unsafe"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/reliability"
	"golang.org/x/sys/unix"
)

// An RDM endpoint is an RD QP: reliable, in order per peer, messages of
// up to maxMsg bytes sent eagerly. Each message is an RD Send whose first
// rdmHeader bytes are the provider's own: its tag (tagged messages), its
// kind (an untagged message, a tagged one, with remote CQ data or not)
// and that data, so that a receive matches by kind, tag and source here,
// in the provider, as libfabric's FI_TAGGED asks. A message arrives into
// one of the endpoint's receive slots; one that matches no posted receive
// keeps its slot (an unexpected message) until a receive matching it is
// posted, so that unexpected messages cost no memory beyond the slots:
// with every slot held, the RD QP answers its peers receiver-not-ready
// and they send again later.
const rdmHeader = 24

// Messages up to eagerMax bytes are copied into a send slot (the send's
// buffer is the caller's again at once: inject's semantics) and land in
// one of the receiver's small slots; larger ones, up to the endpoint's
// largest, are sent from the caller's own buffer, registered for the
// send (its header from a send slot, a second SGE), and land in one of
// the receiver's few large slots, which the RD QP picks by length (an
// SRQ of two size classes, seed 004's pool).
const (
	eagerMax   = 65536
	largeSlots = 4
	// unexpBudget bounds the bytes of unexpected messages an endpoint
	// copies out of their slots. A message that waits in its slot keeps
	// the slot from the next message, and a receive the program posts
	// only after the one it waits for may then never be matched (MPI's
	// collectives: the four large slots held by messages of a later step,
	// the message of this step refused for ever); copied out, the slot
	// takes the next message. Past the budget, messages keep their slots
	// and their senders are held back: what a peer can make an endpoint
	// hold is this budget and the slots.
	unexpBudget = 64 << 20
)

const (
	kindMsg    = 1 // an untagged message (fi_send), for fi_recv
	kindTagged = 2 // a tagged message (fi_tsend), for fi_trecv
	kindData   = 4 // carries remote CQ data
)

type rdmState struct {
	tx      *qp.MR // the send slots: header and bytes, until the peer acknowledges them
	txFree  shim.Slots
	txCtx   []txOf
	srq     *qp.SRQ
	large   *qp.MR              // the large receive slots
	atom    *qp.MR              // per send slot, the 8 bytes an atomic's original value lands in (rma.go)
	lslot   int                 // bytes per large slot
	posted  []rdmRecv           // receives waiting for a message, in the order posted
	unexp   []unexpMsg          // messages waiting for a receive, in the order they came
	claimed map[uint64]unexpMsg // messages a peek claimed, by its context
	ready   []C.struct_udwf_comp
	maxMsg  int
	rxDepth int
	copied  int // bytes of unexpected messages copied out of their slots
}

type txOf struct {
	ctx    uint64
	report bool   // the caller asked for a completion
	mr     *qp.MR // a large message's buffer, registered for the send
	// RMA and atomics (rma.go): what the completion reports (UDWF_OP_*;
	// 0 a message), its bytes, and where a fetching atomic's original
	// value goes (from the endpoint's scratch word of the slot).
	op     uint32
	n      int
	result unsafe.Pointer
}

// An rdmRecv is a receive the caller posted: its buffer, and what it
// takes (kind, tag under ignore, source: the zero AddrPort for any).
type rdmRecv struct {
	buf         unsafe.Pointer
	len         int
	ctx         uint64
	tagged      bool
	tag, ignore uint64
	src         netip.AddrPort
}

// An unexpMsg is a message that came before its receive: in its slot, or
// copied out (buf, slot -1).
type unexpMsg struct {
	slot int
	buf  []byte
	n    int // its bytes, after the header
	kind byte
	tag  uint64
	data uint64
	src  netip.AddrPort
}

func (e *ep) openRDM(fd, txDepth, rxDepth, maxMsg int) error {
	var err error
	if err = e.bindFD(fd); err != nil {
		return err
	}
	e.slot = rdmHeader + min(maxMsg, eagerMax)
	if e.scq, err = engine.dev.CreateCQ(txDepth); err != nil {
		return err
	}
	if e.rcq, err = engine.dev.CreateCQ(rxDepth + largeSlots); err != nil {
		return err
	}
	r := &rdmState{maxMsg: maxMsg, rxDepth: rxDepth, txFree: shim.NewSlots(txDepth), txCtx: make([]txOf, txDepth)}
	classes := []qp.SRQClass{{Size: e.slot, Depth: rxDepth}}
	if maxMsg > eagerMax {
		r.lslot = rdmHeader + maxMsg
		classes = append(classes, qp.SRQClass{Size: r.lslot, Depth: largeSlots})
	}
	if r.srq, err = engine.pd.CreateSRQEx(qp.SRQAttr{Classes: classes, MaxSGE: 1}); err != nil {
		return err
	}
	e.rdm = r
	// A receiver without a free slot answers receiver-not-ready; its
	// sender waits and sends again for as long as that lasts, never
	// failing the message (libfabric's FI_RM_ENABLED: the provider keeps
	// a sender from overrunning its peer's receives, and a slow receiver
	// is not an error).
	attr := qp.QPAttr{Type: qp.RD, SendCQ: e.scq, RecvCQ: e.rcq, SRQ: r.srq,
		Caps: qp.QPCaps{MaxSendWR: txDepth, MaxSendSGE: 2, MaxRecvSGE: 1},
		RD:   qp.RDConfig{Config: reliability.Config{RNRRetries: -1}}}
	if e.q, err = engine.pd.CreateQP(attr); err != nil {
		return err
	}
	if err := e.q.Activate(e.s); err != nil {
		return err
	}
	if err := e.s.Alias(EndpointQPN, e.q); err != nil {
		return err
	}
	if e.mr, err = engine.pd.RegisterMemory(make([]byte, rxDepth*e.slot), qp.AccessLocalWrite); err != nil {
		return err
	}
	if r.lslot > 0 {
		if r.large, err = engine.pd.RegisterMemory(make([]byte, largeSlots*r.lslot), qp.AccessLocalWrite); err != nil {
			return err
		}
	}
	if r.tx, err = engine.pd.RegisterMemory(make([]byte, txDepth*e.slot), 0); err != nil {
		return err
	}
	e.wcs = make([]qp.WorkCompletion, 64)
	// Every slot is posted at once, and again as soon as its message is
	// taken: the slots are the endpoint's whole receive buffering.
	for i := range rxDepth + largeSlots*min(r.lslot, 1) {
		if err := e.repost(i); err != nil {
			return err
		}
	}
	return nil
}

// A receive slot's number: the small slots first, then the large.
func (e *ep) slotBytes(slot int) []byte {
	r := e.rdm
	if slot < r.rxDepth {
		return e.mr.Bytes()[slot*e.slot : (slot+1)*e.slot]
	}
	l := slot - r.rxDepth
	return r.large.Bytes()[l*r.lslot : (l+1)*r.lslot]
}

func (e *ep) repost(slot int) error {
	r := e.rdm
	sge := e.mr.SGE(slot*e.slot, e.slot)
	if slot >= r.rxDepth {
		l := slot - r.rxDepth
		sge = r.large.SGE(l*r.lslot, r.lslot)
	}
	return r.srq.PostRecv(&qp.RecvWR{ID: uint64(slot), SGL: []qp.SGE{sge}})
}

// udwf_tsend sends n bytes at buf to address handle ah as a tagged
// message (tagged non-zero, with tag) or an untagged one, with 8 bytes of
// remote CQ data when hasData is set; a completion with ctx follows, once
// the peer acknowledged it, when signaled is set. It returns 0 or -errno:
// -EAGAIN when every send slot is in flight, -EMSGSIZE over the largest
// message.
//
//export udwf_tsend
func udwf_tsend(h C.longlong, buf unsafe.Pointer, n C.size_t, ah C.longlong, tagged C.int, tag C.uint64_t, hasData C.int, data C.uint64_t, ctx C.uint64_t, signaled C.int) C.int {
	e := lookup(h)
	if e == nil || e.rdm == nil {
		return -C.int(unix.EBADF)
	}
	a := ahOf(ah)
	if a == nil {
		return -C.int(unix.EINVAL)
	}
	r := e.rdm
	if int(n) > r.maxMsg {
		return -C.int(unix.EMSGSIZE)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	i, ok := r.txFree.Take()
	if !ok {
		return -C.int(unix.EAGAIN)
	}
	b := r.tx.Bytes()[i*e.slot : (i+1)*e.slot]
	kind := byte(kindMsg)
	if tagged != 0 {
		kind = kindTagged
	}
	if hasData != 0 {
		kind |= kindData
	}
	clear(b[:rdmHeader])
	b[0] = kind
	binary.LittleEndian.PutUint64(b[8:], uint64(tag))
	binary.LittleEndian.PutUint64(b[16:], uint64(data))
	t := txOf{ctx: uint64(ctx), report: signaled != 0}
	e.sges[0] = r.tx.SGE(i*e.slot, rdmHeader+min(int(n), eagerMax))
	sgl := e.sges[:1]
	if int(n) <= eagerMax {
		if n > 0 {
			copy(b[rdmHeader:], unsafe.Slice((*byte)(buf), int(n)))
		}
	} else {
		// The caller's buffer is the message's until its completion, as
		// libfabric's fi_send promises: registered, not copied.
		mr, err := engine.pd.RegisterMemory(unsafe.Slice((*byte)(buf), int(n)), 0)
		if err != nil {
			r.txFree.Put(i)
			return C.int(errno(err))
		}
		t.mr = mr
		e.sges[0], e.sges[1] = r.tx.SGE(i*e.slot, rdmHeader), mr.SGE(0, int(n))
		sgl = e.sges[:2]
	}
	r.txCtx[i] = t
	// Always signaled at the QP: the slot is free only once the peer has
	// acknowledged the message (RD keeps it as the retransmit source).
	wr := &e.swr
	*wr = qp.SendWR{ID: uint64(i), AH: a, Opcode: qp.OpSend, Flags: qp.FlagSignaled, SGL: sgl}
	defer func() { *wr = qp.SendWR{} }()
	if signaled == 0 {
		// An inject: nobody waits for its completion, so the peer's ack
		// may ride on its next message to us (a reply, in request and
		// response traffic) or come after its ack delay, instead of
		// costing each side a system call now (qp.FlagAckLazily).
		wr.Flags |= qp.FlagAckLazily
	}
	if err := e.q.PostSend(wr); err != nil {
		r.txFree.Put(i)
		if t.mr != nil {
			t.mr.Deregister()
		}
		return C.int(errno(err))
	}
	return 0
}

// udwf_trecv posts a receive of up to n bytes into buf: of a tagged
// message (tagged non-zero) whose tag equals tag in the bits ignore
// leaves clear, or of an untagged one; from the endpoint of address
// handle src, or any (src < 0). A message that came before it and
// matches completes it at once (its completion is in the next poll). It
// returns 0 or -errno.
//
//export udwf_trecv
func udwf_trecv(h C.longlong, buf unsafe.Pointer, n C.size_t, src C.longlong, tagged C.int, tag, ignore C.uint64_t, ctx C.uint64_t) C.int {
	e := lookup(h)
	if e == nil || e.rdm == nil {
		return -C.int(unix.EBADF)
	}
	rv, ok := recvTerms(src, tagged, tag, ignore, ctx)
	if !ok {
		return -C.int(unix.EINVAL)
	}
	rv.buf, rv.len = buf, int(n)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	r := e.rdm
	for k, m := range r.unexp {
		if rv.matches(m.kind, m.tag, m.src) {
			r.unexp = slices.Delete(r.unexp, k, k+1)
			var c C.struct_udwf_comp
			e.deliver(&rv, m, &c)
			r.ready = append(r.ready, c)
			return 0
		}
	}
	if len(r.posted) >= 4*r.rxDepth {
		return -C.int(unix.EAGAIN)
	}
	r.posted = append(r.posted, rv)
	return 0
}

// recvTerms is what a receive (or a peek) of these terms takes; false for
// a source handle the process does not hold.
func recvTerms(src C.longlong, tagged C.int, tag, ignore, ctx C.uint64_t) (rdmRecv, bool) {
	rv := rdmRecv{ctx: uint64(ctx), tagged: tagged != 0, tag: uint64(tag), ignore: uint64(ignore)}
	if src >= 0 {
		if rv.src = ahAddr(src); !rv.src.IsValid() {
			return rv, false
		}
	}
	return rv, true
}

func (rv *rdmRecv) matches(kind byte, tag uint64, src netip.AddrPort) bool {
	if rv.tagged != (kind&kindTagged != 0) {
		return false
	}
	if rv.tagged && (tag&^rv.ignore) != (rv.tag&^rv.ignore) {
		return false
	}
	return !rv.src.IsValid() || rv.src == src
}

// deliver copies message m into receive rv, fills c, and posts m's slot
// again.
func (e *ep) deliver(rv *rdmRecv, m unexpMsg, c *C.struct_udwf_comp) {
	*c = C.struct_udwf_comp{recv: 1, ctx: C.uint64_t(rv.ctx), tag: C.uint64_t(m.tag)}
	if m.kind&kindTagged != 0 {
		c.tagged = 1
	}
	n := min(m.n, rv.len)
	if n > 0 {
		src := m.buf
		if src == nil {
			src = e.slotBytes(m.slot)[rdmHeader:]
		}
		copy(unsafe.Slice((*byte)(rv.buf), n), src[:n])
	}
	c.len = C.uint64_t(n)
	if m.n > rv.len {
		c.err, c.olen = C.int32_t(unix.EMSGSIZE), C.uint64_t(m.n-rv.len)
	}
	if m.kind&kindData != 0 {
		c.has_data, c.data = 1, C.uint64_t(m.data)
	}
	var l C.int = 28
	putSockaddr(unsafe.Pointer(&c.src[0]), &l, m.src, e.s.LocalAddr().Addr().Is6())
	c.srclen = C.uint32_t(l)
	e.release(m)
}

// release gives back what message m held: its slot (posted again: it is
// the endpoint's own and was just taken, so that fails only with the SRQ
// gone, the endpoint closing), or its copy's share of the budget.
func (e *ep) release(m unexpMsg) {
	if m.buf != nil {
		e.rdm.copied -= len(m.buf)
		return
	}
	_ = e.repost(m.slot)
}

// pollRDM fills comps with the endpoint's completions: sends the peer
// acknowledged, receives matched now or at their posting. Caller holds
// e.mu.
func (e *ep) pollRDM(comps []C.struct_udwf_comp) int {
	r := e.rdm
	k := copy(comps, r.ready)
	r.ready = r.ready[:copy(r.ready, r.ready[k:])]
	for k < len(comps) {
		got := e.scq.Poll(e.wcs)
		if got == 0 {
			break
		}
		for _, wc := range e.wcs[:got] {
			i := int(wc.ID)
			t := r.txCtx[i]
			r.txFree.Put(i)
			if t.mr != nil {
				t.mr.Deregister()
			}
			if t.op != 0 {
				e.rmaDone(i, &t, &wc)
			}
			if !t.report && wc.Status == qp.Success {
				continue
			}
			c := C.struct_udwf_comp{ctx: C.uint64_t(t.ctx), len: C.uint64_t(max(int(wc.Len)-rdmHeader, 0))}
			if wc.Status != qp.Success {
				c.err = C.int32_t(unix.EIO)
			}
			if t.op != 0 {
				c.op, c.len, c.err = C.uint32_t(t.op), C.uint64_t(t.n), rmaErr(wc.Status)
			}
			if k < len(comps) {
				comps[k] = c
				k++
			} else {
				r.ready = append(r.ready, c)
			}
		}
	}
	for {
		got := e.rcq.Poll(e.wcs)
		if got == 0 {
			break
		}
		for _, wc := range e.wcs[:got] {
			slot := int(wc.ID)
			if wc.WithImm {
				// No message: a peer's RMA write with remote CQ data (rma.go).
				e.remoteWrite(slot, &wc, comps, &k)
				continue
			}
			if wc.Status != qp.Success || wc.Len < rdmHeader {
				// A flushed receive (the QP is going), or a message too
				// short to be the provider's: nothing to deliver.
				if wc.Status == qp.Success {
					_ = e.repost(slot) // as in deliver
				}
				continue
			}
			b := e.slotBytes(slot)
			m := unexpMsg{slot: slot, n: int(wc.Len) - rdmHeader, kind: b[0], tag: binary.LittleEndian.Uint64(b[8:]),
				data: binary.LittleEndian.Uint64(b[16:]), src: netip.AddrPortFrom(wc.Source.Addr().Unmap(), wc.Source.Port())}
			matched := false
			for j := range r.posted {
				if r.posted[j].matches(m.kind, m.tag, m.src) {
					rv := r.posted[j]
					r.posted = slices.Delete(r.posted, j, j+1)
					var c C.struct_udwf_comp
					e.deliver(&rv, m, &c)
					if k < len(comps) {
						comps[k] = c
						k++
					} else {
						r.ready = append(r.ready, c)
					}
					matched = true
					break
				}
			}
			if !matched {
				if r.copied+m.n <= unexpBudget {
					m.buf = slices.Clone(b[rdmHeader : rdmHeader+m.n])
					r.copied += m.n
					_ = e.repost(slot) // as in release
					m.slot = -1
				}
				r.unexp = append(r.unexp, m)
			}
		}
	}
	return k
}

// udwf_tpeek looks for a message that came and that a receive of these
// terms (as udwf_trecv's) would take, without taking it: found, its
// completion (length, tag, data, source; no bytes) is in the next poll,
// else a completion with ENOMSG is. With claim set, the message found is
// set aside for the receive that names ctx with udwf_tclaim; with discard
// set too, it is dropped instead. It returns 0 or -errno.
//
//export udwf_tpeek
func udwf_tpeek(h C.longlong, src C.longlong, tagged C.int, tag, ignore C.uint64_t, ctx C.uint64_t, claim, discard C.int) C.int {
	e := lookup(h)
	if e == nil || e.rdm == nil {
		return -C.int(unix.EBADF)
	}
	rv, ok := recvTerms(src, tagged, tag, ignore, ctx)
	if !ok {
		return -C.int(unix.EINVAL)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	r := e.rdm
	e.s.Progress(64)
	e.pollRDM(nil) // what came is in unexp (or matched a posted receive)
	c := C.struct_udwf_comp{recv: 1, ctx: ctx, err: C.int32_t(unix.ENOMSG)}
	if rv.tagged {
		c.tagged = 1
	}
	for k, m := range r.unexp {
		if !rv.matches(m.kind, m.tag, m.src) {
			continue
		}
		c.err, c.len, c.tag = 0, C.uint64_t(m.n), C.uint64_t(m.tag)
		if m.kind&kindData != 0 {
			c.has_data, c.data = 1, C.uint64_t(m.data)
		}
		var l C.int = 28
		putSockaddr(unsafe.Pointer(&c.src[0]), &l, m.src, e.s.LocalAddr().Addr().Is6())
		c.srclen = C.uint32_t(l)
		if claim != 0 {
			r.unexp = slices.Delete(r.unexp, k, k+1)
			if discard != 0 {
				e.release(m)
				c.len = 0
			} else {
				if r.claimed == nil {
					r.claimed = map[uint64]unexpMsg{}
				}
				r.claimed[uint64(ctx)] = m
			}
		}
		break
	}
	r.ready = append(r.ready, c)
	return 0
}

// udwf_tclaim receives into buf (n bytes) the message a peek claimed
// for ctx (discard set: drops it): its completion, with ctx, is in the
// next poll. It returns 0, or -ENOENT when no message is claimed for ctx.
//
//export udwf_tclaim
func udwf_tclaim(h C.longlong, buf unsafe.Pointer, n C.size_t, ctx C.uint64_t, discard C.int) C.int {
	e := lookup(h)
	if e == nil || e.rdm == nil {
		return -C.int(unix.EBADF)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rdm
	m, ok := r.claimed[uint64(ctx)]
	if !ok {
		return -C.int(unix.ENOENT)
	}
	delete(r.claimed, uint64(ctx))
	rv := rdmRecv{buf: buf, len: int(n), ctx: uint64(ctx), tagged: m.kind&kindTagged != 0}
	if discard != 0 {
		rv.len = 0
	}
	var c C.struct_udwf_comp
	e.deliver(&rv, m, &c)
	if discard != 0 {
		c.err, c.olen = 0, 0
	}
	r.ready = append(r.ready, c)
	return 0
}

// udwf_cancel cancels the receive posted with ctx, if it is still
// waiting: 1 (its completion, ECANCELED, is in the next poll), 0 if none
// is.
//
//export udwf_cancel
func udwf_cancel(h C.longlong, ctx C.uint64_t) C.int {
	e := lookup(h)
	if e == nil || e.rdm == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rdm
	for j, rv := range r.posted {
		if rv.ctx == uint64(ctx) {
			r.posted = slices.Delete(r.posted, j, j+1)
			c := C.struct_udwf_comp{recv: 1, ctx: C.uint64_t(rv.ctx), err: C.int32_t(unix.ECANCELED)}
			if rv.tagged {
				c.tagged = 1
			}
			r.ready = append(r.ready, c)
			return 1
		}
	}
	return 0
}
