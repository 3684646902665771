package qp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"unsafe"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// RFC 7306 on reliable QPs: what RD and RC share of atomics and
// Immediate Data — the checks of a posted WR, the responder's execution,
// the requester's placement of the original value, and the receive an
// Immediate Data message completes. The engines carry the messages (RD
// in its per-peer ordered stream, RC in its TCP stream), number them and
// apply ORD/IRD; docs/verbs.md says what each guarantees.
//
// Exactly once. An atomic changes the word once per request: on RD the
// peer's receiver delivers each sequence number once (a retransmitted
// request is a duplicate, acknowledged and dropped), and the response is
// a Data frame the responder retransmits from the value it stored, never
// by running the operation again; a request in flight when its session
// ends completes RemoteAbortedError (it may or may not have run) and is
// never sent again. On RC, TCP delivers each request once, so the
// responder keeps no cache of results (RFC 7306's responder resources
// bound only how many responses are outstanding: IRD).
//
// The word is read and written in the host's byte order, as verbs
// atomics are, and with the CPU's atomic instructions, so local
// sync/atomic users of the same word see each operation whole.

// checkAtomicWR is what an atomic WR needs beyond PostSend's checks: one
// 8-byte SGE for the original value (its region needs local write).
func checkAtomicWR(wr *SendWR) error {
	if len(wr.SGL) != 1 || wr.SGL[0].Length != 8 || wr.Inline != nil {
		return fmt.Errorf("%w: an atomic names one 8-byte SGE for the original value", ErrInvalidWR)
	}
	return nil
}

// checkImmWR is what an Immediate Data WR needs: OpImmediate carries no
// data of its own.
func checkImmWR(wr *SendWR) error {
	if wr.Opcode == OpImmediate && (len(wr.SGL) > 0 || wr.Inline != nil) {
		return fmt.Errorf("%w: Immediate Data carries Imm only, no SGL or inline data", ErrInvalidWR)
	}
	return nil
}

// atomicRequest is the RFC 7306 header of an atomic WR: request id, the
// peer's word, and the operands (masks all ones: a plain 64-bit add, a
// whole-word compare and swap).
func atomicRequest(op SendOpcode, id, stag uint32, to, compareAdd, swap uint64) udiwarp.AtomicRequestFields {
	f := udiwarp.AtomicRequestFields{RequestID: id, STag: stag, TO: to, SwapAddMask: ^uint64(0), CompareMask: ^uint64(0)}
	if op == OpAtomicFetchAdd {
		f.Op, f.SwapAddData = udiwarp.AtomicFetchAdd, compareAdd
	} else {
		f.Op, f.SwapAddData, f.CompareData = udiwarp.AtomicCmpSwap, swap, compareAdd
	}
	return f
}

// atomicFault is why a responder did not carry out an Atomic Request.
type atomicFault uint8

const (
	atomicOK      atomicFault = iota
	atomicAccess              // the one remote-access check refused it (tagFault says why)
	atomicInvalid             // an AOpCode or Add Mask this responder does not carry out
)

// executeAtomic carries out the Atomic Request a of a peer of pd on the
// word it names, after the one remote-access check (remote atomic
// access, bounds, 8-byte alignment), and returns the word's original
// value. FetchAdd takes only the all-ones Add Mask (a plain 64-bit add);
// CmpSwap honours both masks: the word becomes (word &^ swapMask) |
// (swap & swapMask) when (word ^ compare) & compareMask is zero.
func (d *Device) executeAtomic(pd *PD, a udiwarp.AtomicRequest) (uint64, atomicFault, tagFault) {
	switch a.Op() {
	case udiwarp.AtomicFetchAdd:
		if a.SwapAddMask() != ^uint64(0) {
			d.stats.RxBadOpcode.Add(1)
			return 0, atomicInvalid, faultNone
		}
	case udiwarp.AtomicCmpSwap:
	default:
		d.stats.RxBadOpcode.Add(1)
		return 0, atomicInvalid, faultNone
	}
	m, f := d.remoteRegion(pd, a.STag(), a.TO(), 8, AccessRemoteAtomic)
	if f != faultNone {
		return 0, atomicAccess, f
	}
	word := (*uint64)(unsafe.Pointer(&m.buf[a.TO()]))
	var orig uint64
	if a.Op() == udiwarp.AtomicFetchAdd {
		orig = atomic.AddUint64(word, a.SwapAddData()) - a.SwapAddData()
	} else {
		cmp, cmask, swap, smask := a.CompareData(), a.CompareMask(), a.SwapAddData(), a.SwapAddMask()
		for {
			orig = atomic.LoadUint64(word)
			if (orig^cmp)&cmask != 0 || atomic.CompareAndSwapUint64(word, orig, orig&^smask|swap&smask) {
				break
			}
		}
	}
	m.unpin()
	d.stats.RxAtomics.Add(1)
	return orig, atomicOK, faultNone
}

// placeAtomicResult writes the original value an Atomic Response brought
// into the WR's 8-byte SGE, in host byte order.
func (q *QP) placeAtomicResult(sge SGE, v uint64) Status {
	m, b, st := q.dev.resolve(q.pd, &sge, AccessLocalWrite)
	if st != Success {
		return st
	}
	binary.NativeEndian.PutUint64(b, v)
	m.unpin()
	return Success
}

// deliverImmediate completes receive w with the Immediate Data message
// seg from src: the value goes in the completion, nothing in the buffer.
// With a status other than Success (the Send or Write it completes was
// refused), the completion carries that status and no value.
func (q *QP) deliverImmediate(w *recvWQE, seg udiwarp.Segment, src netip.AddrPort, st Status) {
	wc := q.sendWC(w.id, seg.Opcode(), seg.Untagged(), src, 0)
	wc.WithImm = true
	if st == Success {
		wc.Imm = seg.ImmediateData().Value()
		q.dev.stats.RxImmediate.Add(1)
	} else {
		wc.Status = st
	}
	q.completeRecv(&wc)
}
