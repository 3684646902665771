//go:build cgo && linux

package main

/*
#include "udwf.h"
*/
import "C"

import (
	"net/netip"
	"sync"
	"unsafe"

	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/sys/unix"
)

// RMA and atomics on RDM endpoints: RFC 5040's RDMA Write and Read and
// RFC 7306's FetchAdd, CmpSwap and Write with Immediate Data, as the RD
// QP carries them, on the stack's own memory regions. A region the
// program registers for remote access (fi_mr_reg) is a qp.MR of the
// process's one PD, its STag the key peers name it by, its tagged
// offsets zero-based: the address a peer passes is an offset into the
// region. What the initiator's side needs registered it registers (or
// copies) per operation, as udwf_tsend does for a large message: a
// write of up to eagerMax bytes is copied into the send slot, a larger
// one is sent from the caller's buffer, registered for the write; a
// read lands in the caller's buffer, registered for the read with local
// and remote write (the Read Responses are tagged writes into it,
// RFC 5040); an atomic's original value lands in the send slot's 8
// scratch bytes (ep.rdm.atom) and is copied to the caller's result when
// it completes. Each takes one send slot until it completes.

// mrs holds the regions the program registered for remote access, by
// STag.
var mrs struct {
	sync.Mutex
	m map[uint32]*qp.MR
}

// udwf_mr_reg registers n bytes at buf for remote access: reads by
// peers (remoteRead), writes and RFC 7306 atomics (remoteWrite). It
// returns the region's STag (its key, 0 to 2^32-1) or -errno.
//
//export udwf_mr_reg
func udwf_mr_reg(buf unsafe.Pointer, n C.size_t, remoteRead, remoteWrite C.int) C.longlong {
	if err := start(); err != nil {
		return errno(err)
	}
	if buf == nil || n == 0 {
		return -C.longlong(unix.EINVAL)
	}
	access := qp.AccessLocalWrite
	if remoteRead != 0 {
		access |= qp.AccessRemoteRead
	}
	if remoteWrite != 0 {
		access |= qp.AccessRemoteWrite | qp.AccessRemoteAtomic
	}
	mr, err := engine.pd.RegisterMemory(unsafe.Slice((*byte)(buf), int(n)), access)
	if err != nil {
		return errno(err)
	}
	mrs.Lock()
	defer mrs.Unlock()
	if mrs.m == nil {
		mrs.m = map[uint32]*qp.MR{}
	}
	mrs.m[mr.STag()] = mr
	return C.longlong(mr.STag())
}

// udwf_mr_dereg ends the region of STag stag: once it returns, no peer
// reads or writes its memory. It returns 0 or -errno (-ENOENT: no such
// region).
//
//export udwf_mr_dereg
func udwf_mr_dereg(stag C.uint32_t) C.int {
	mrs.Lock()
	mr := mrs.m[uint32(stag)]
	delete(mrs.m, uint32(stag))
	mrs.Unlock()
	if mr == nil {
		return -C.int(unix.ENOENT)
	}
	return C.int(errno(mr.Deregister()))
}

// rmaScratch gives the endpoint its atomics' scratch words, once.
// Caller holds e.mu.
func (e *ep) rmaScratch() error {
	r := e.rdm
	if r.atom != nil {
		return nil
	}
	mr, err := engine.pd.RegisterMemory(make([]byte, 8*len(r.txCtx)), qp.AccessLocalWrite)
	if err != nil {
		return err
	}
	r.atom = mr
	return nil
}

// udwf_rma writes n bytes at buf (op UDWF_OP_WRITE; with 8 bytes of
// remote CQ data when hasData is set: RDMA Write with Immediate Data)
// into the region of STag key at offset to of the endpoint of address
// handle ah, or reads n bytes from there into buf (UDWF_OP_READ). A
// completion with ctx follows, once the peer acknowledged the write or
// the read's last byte landed, when signaled is set; an error one
// always. It returns 0 or -errno: -EAGAIN when every send slot is in
// flight, -EMSGSIZE over the endpoint's largest message, -EINVAL for an
// unknown handle.
//
//export udwf_rma
func udwf_rma(h C.longlong, op C.int, buf unsafe.Pointer, n C.size_t, ah C.longlong, key C.uint32_t, to C.uint64_t,
	hasData C.int, data C.uint64_t, ctx C.uint64_t, signaled C.int) C.int {
	e := lookup(h)
	if e != nil && e.msg != nil {
		return e.msgRMA(op, buf, n, key, to, ctx, signaled)
	}
	if e == nil || e.rdm == nil {
		return -C.int(unix.EBADF)
	}
	a := ahOf(ah)
	if a == nil || (op != C.UDWF_OP_WRITE && op != C.UDWF_OP_READ) || (op == C.UDWF_OP_READ && hasData != 0) || (n > 0 && buf == nil) {
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
	var b []byte
	if n > 0 {
		b = unsafe.Slice((*byte)(buf), int(n))
	}
	if op == C.UDWF_OP_READ && n == 0 {
		// Nothing to read: done at once (a zero-length access needs no
		// valid key, RFC 5042 §6.3.5).
		if signaled != 0 {
			r.ready = append(r.ready, C.struct_udwf_comp{ctx: ctx, op: C.UDWF_OP_READ})
		}
		return 0
	}
	i, ok := r.txFree.Take()
	if !ok {
		return -C.int(unix.EAGAIN)
	}
	t := txOf{ctx: uint64(ctx), report: signaled != 0, op: uint32(op), n: int(n)}
	// Always signaled at the QP: the slot is free only once the WR is done.
	wr := qp.SendWR{ID: uint64(i), AH: a, Opcode: qp.OpWrite, Flags: qp.FlagSignaled, RemoteSTag: uint32(key), RemoteTO: uint64(to)}
	switch {
	case op == C.UDWF_OP_READ:
		mr, err := engine.pd.RegisterMemory(b, qp.AccessLocalWrite|qp.AccessRemoteWrite)
		if err != nil {
			r.txFree.Put(i)
			return C.int(errno(err))
		}
		t.mr = mr
		wr.Opcode, wr.SGL = qp.OpRead, []qp.SGE{mr.SGE(0, int(n))}
	case n == 0:
	case int(n) <= eagerMax:
		off := i * e.slot
		copy(r.tx.Bytes()[off:off+int(n)], b)
		wr.SGL = []qp.SGE{r.tx.SGE(off, int(n))}
	default:
		// The caller's buffer is the write's until its completion, as
		// fi_write promises: registered, not copied.
		mr, err := engine.pd.RegisterMemory(b, 0)
		if err != nil {
			r.txFree.Put(i)
			return C.int(errno(err))
		}
		t.mr = mr
		wr.SGL = []qp.SGE{mr.SGE(0, int(n))}
	}
	if hasData != 0 {
		wr.Opcode, wr.Imm = qp.OpWriteImm, uint64(data)
	}
	return e.postRMA(i, t, &wr)
}

// udwf_atomic carries out an RFC 7306 atomic on the 64-bit word of the
// region of STag key at offset to (8-byte aligned) of the endpoint of
// address handle ah: UDWF_ATOMIC_ADD adds operand (FetchAdd),
// UDWF_ATOMIC_CSWAP writes operand if the word equals compare (CmpSwap).
// The word's original value goes to result (8 bytes, host order) before
// the completion, if result is not NULL. Completions and the return
// value as udwf_rma's.
//
//export udwf_atomic
func udwf_atomic(h C.longlong, op C.int, ah C.longlong, key C.uint32_t, to C.uint64_t, operand, compare C.uint64_t,
	result unsafe.Pointer, ctx C.uint64_t, signaled C.int) C.int {
	e := lookup(h)
	if e == nil || e.rdm == nil {
		return -C.int(unix.EBADF)
	}
	a := ahOf(ah)
	if a == nil || (op != C.UDWF_ATOMIC_ADD && op != C.UDWF_ATOMIC_CSWAP) || to%8 != 0 {
		return -C.int(unix.EINVAL)
	}
	r := e.rdm
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	if err := e.rmaScratch(); err != nil {
		return C.int(errno(err))
	}
	i, ok := r.txFree.Take()
	if !ok {
		return -C.int(unix.EAGAIN)
	}
	t := txOf{ctx: uint64(ctx), report: signaled != 0, op: C.UDWF_OP_ATOMIC, n: 8, result: result}
	if result != nil {
		t.op = C.UDWF_OP_FETCH
	}
	wr := qp.SendWR{ID: uint64(i), AH: a, Opcode: qp.OpAtomicFetchAdd, Flags: qp.FlagSignaled, RemoteSTag: uint32(key),
		RemoteTO: uint64(to), SGL: []qp.SGE{r.atom.SGE(i*8, 8)}, CompareAdd: uint64(operand)}
	if op == C.UDWF_ATOMIC_CSWAP {
		wr.Opcode, wr.CompareAdd, wr.Swap = qp.OpAtomicCmpSwap, uint64(compare), uint64(operand)
	}
	return e.postRMA(i, t, &wr)
}

// postRMA posts wr from send slot i, which t describes. Caller holds
// e.mu.
func (e *ep) postRMA(i int, t txOf, wr *qp.SendWR) C.int {
	r := e.rdm
	r.txCtx[i] = t
	if err := e.q.PostSend(wr); err != nil {
		r.txFree.Put(i)
		if t.mr != nil {
			t.mr.Deregister()
		}
		return C.int(errno(err))
	}
	return 0
}

// rmaDone finishes RMA or atomic t of send slot i as wc completes it:
// a fetching atomic's original value goes to the caller's result.
// Caller holds e.mu.
func (e *ep) rmaDone(i int, t *txOf, wc *qp.WorkCompletion) {
	if t.result != nil && wc.Status == qp.Success {
		copy(unsafe.Slice((*byte)(t.result), 8), e.rdm.atom.Bytes()[i*8:i*8+8])
	}
}

// rmaErr is the errno an RMA or atomic completion reports for status:
// EACCES for a refused key, access or range at the target, EINVAL for a
// request the target found invalid (a misaligned word), EREMOTEIO for
// one it could not carry out, EIO for anything else.
func rmaErr(s qp.Status) C.int32_t {
	switch s {
	case qp.Success:
		return 0
	case qp.RemoteAccessError:
		return C.int32_t(unix.EACCES)
	case qp.RemoteInvalidRequestError:
		return C.int32_t(unix.EINVAL)
	case qp.RemoteOperationError:
		return C.int32_t(unix.EREMOTEIO)
	}
	return C.int32_t(unix.EIO)
}

// remoteWrite reports the Immediate Data of a peer's RDMA Write with
// Immediate Data, which took receive slot slot: no message, a
// completion with the data (UDWF_OP_REMOTE_WRITE) once the Write's bytes
// are placed, into comps[*k] or, comps full, the next poll's. Caller
// holds e.mu.
func (e *ep) remoteWrite(slot int, wc *qp.WorkCompletion, comps []C.struct_udwf_comp, k *int) {
	if wc.Status == qp.WRFlushError {
		return // the QP is going
	}
	_ = e.repost(slot) // as in release
	if wc.Status != qp.Success {
		return // the Write before it was refused: its initiator has the error
	}
	c := C.struct_udwf_comp{recv: 1, op: C.UDWF_OP_REMOTE_WRITE, has_data: 1, data: C.uint64_t(wc.Imm)}
	var l C.int = 28
	putSockaddr(unsafe.Pointer(&c.src[0]), &l, netip.AddrPortFrom(wc.Source.Addr().Unmap(), wc.Source.Port()),
		e.s.LocalAddr().Addr().Is6())
	c.srclen = C.uint32_t(l)
	if *k < len(comps) {
		comps[*k] = c
		*k++
	} else {
		e.rdm.ready = append(e.rdm.ready, c)
	}
}
