//go:build cgo && linux

package main

/*
#include "udwf.h"
*/
import "C"

import (
	"errors"
	"io"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/sys/unix"
)

// An MSG endpoint (FI_EP_MSG) is an RC queue pair on a TCP socket the C
// side owns (qp.ConnectFD, AcceptFD): MPA's exchange when it connects or
// is accepted, carrying libfabric's connection data as MPA private data,
// then RDMAP Sends in FPDUs on that stream, read only where the C side
// polls (QP.Progress: FI_PROGRESS_MANUAL). A receive lands in the
// caller's own buffer, registered for it (RC places in order, into the
// receives in the order posted: no slot, no copy); a send of up to
// msgInline bytes is copied at the call, a larger one is sent from the
// caller's buffer, registered until TCP has taken it. A Send that finds
// no receive posted waits for one (RCConfig.WaitForRecv): the QP stops
// reading its socket and TCP's window holds the peer back, as
// FI_RM_ENABLED promises.
const msgInline = 1 << 16

// msgTimeout bounds MPA's exchange (the C side's connect thread waits
// this long at most for the peer's Reply).
const msgTimeout = 10 * time.Second

type msgState struct {
	fd       int
	sends    map[uint64]txOf // by WR id
	recvs    map[uint64]msgRecv
	nextID   uint64
	up       bool // connected: MPA's exchange done
	reported bool // the peer's end was reported (udwf_msg_ended)
}

type msgRecv struct {
	ctx uint64
	mr  *qp.MR // nil for a zero-length receive
}

// udwf_msg_open makes an MSG endpoint over fd, a TCP socket the caller
// keeps (connected later: udwf_msg_connect, or accepted already:
// udwf_msg_accept), with txDepth sends and rxDepth receives outstanding
// at most. It returns the endpoint's handle (> 0) or -errno.
//
//export udwf_msg_open
func udwf_msg_open(fd C.int, txDepth, rxDepth C.int) C.longlong {
	if err := start(); err != nil {
		return errno(err)
	}
	if txDepth <= 0 || rxDepth <= 0 {
		return -C.longlong(unix.EINVAL)
	}
	e := &ep{msg: &msgState{fd: int(fd), sends: map[uint64]txOf{}, recvs: map[uint64]msgRecv{}}}
	if err := e.openMsg(int(txDepth), int(rxDepth)); err != nil {
		e.close()
		return errno(err)
	}
	return register(e)
}

func (e *ep) openMsg(txDepth, rxDepth int) error {
	var err error
	if e.scq, err = engine.dev.CreateCQ(txDepth); err != nil {
		return err
	}
	if e.rcq, err = engine.dev.CreateCQ(rxDepth); err != nil {
		return err
	}
	attr := qp.QPAttr{Type: qp.RC, SendCQ: e.scq, RecvCQ: e.rcq,
		Caps: qp.QPCaps{MaxSendWR: txDepth, MaxRecvWR: rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: msgInline}}
	if e.q, err = engine.pd.CreateQP(attr); err != nil {
		return err
	}
	if err := e.q.Modify(qp.ModifyAttr{State: qp.StateInit}); err != nil {
		return err
	}
	e.wcs = make([]qp.WorkCompletion, 64)
	return nil
}

// connected runs MPA's exchange on the endpoint's socket, as initiator
// or responder, without the endpoint's lock (it waits for the peer); pd
// is the private data to send, out (room for *outLen bytes) takes the
// peer's, *outLen its length. -ECONNREFUSED: the peer rejected, out its
// private data.
func connected(h C.longlong, pd unsafe.Pointer, pdLen C.int, out unsafe.Pointer, outLen *C.int, initiator bool) C.int {
	e := lookup(h)
	if e == nil || e.msg == nil {
		return -C.int(unix.EBADF)
	}
	var mine []byte
	if pdLen > 0 {
		mine = C.GoBytes(pd, pdLen)
	}
	cfg := qp.RCConfig{WaitForRecv: true, PrivateData: mine, Timeout: msgTimeout}
	var peer []byte
	var err error
	if initiator {
		peer, err = e.q.ConnectFD(e.msg.fd, cfg)
	} else {
		peer, err = e.q.AcceptFD(e.msg.fd, cfg)
	}
	var rej *qp.RejectError
	if errors.As(err, &rej) {
		peer = rej.PrivateData
	}
	if outLen != nil {
		n := min(len(peer), int(max(*outLen, 0)))
		if n > 0 {
			copy(unsafe.Slice((*byte)(out), n), peer)
		}
		*outLen = C.int(n)
	}
	switch {
	case rej != nil:
		return -C.int(unix.ECONNREFUSED)
	case errors.Is(err, qp.ErrNotMPA):
		return -C.int(unix.EPROTO)
	case err != nil:
		if c := errno(err); c != -C.longlong(unix.EIO) {
			return C.int(c)
		}
		return -C.int(unix.ECONNABORTED)
	}
	e.mu.Lock()
	e.msg.up = true
	e.mu.Unlock()
	return 0
}

// udwf_msg_connect runs the initiator's side of MPA's exchange on the
// endpoint's socket, connected by the caller (it waits for the peer's
// Reply, msgTimeout at most: call it from a thread that may wait).
//
//export udwf_msg_connect
func udwf_msg_connect(h C.longlong, pd unsafe.Pointer, pdLen C.int, out unsafe.Pointer, outLen *C.int) C.int {
	return connected(h, pd, pdLen, out, outLen, true)
}

// udwf_msg_accept answers the peer's MPA Request (whole on the socket:
// udwf_mpa_peek said so) with a Reply carrying pd.
//
//export udwf_msg_accept
func udwf_msg_accept(h C.longlong, pd unsafe.Pointer, pdLen C.int, out unsafe.Pointer, outLen *C.int) C.int {
	return connected(h, pd, pdLen, out, outLen, false)
}

// udwf_mpa_peek looks at fd, a TCP socket the caller accepted, reading
// nothing: 0 with the MPA Request's private data in out (*outLen bytes)
// when the whole Request is there; -EAGAIN when it is not yet (with
// SO_RCVLOWAT set to what it needs, so that the socket polls readable
// once it is); -EPROTO for bytes that are no MPA Request; -ECONNRESET
// for a peer that ended first.
//
//export udwf_mpa_peek
func udwf_mpa_peek(fd C.int, out unsafe.Pointer, outLen *C.int) C.int {
	pd, err := qp.PeekMPARequest(int(fd))
	switch {
	case errors.Is(err, qp.ErrMPAIncomplete):
		if need, err := qp.MPARequestNeed(int(fd)); err == nil && need > 0 {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, need)
		}
		return -C.int(unix.EAGAIN)
	case err != nil:
		var en unix.Errno
		if errors.As(err, &en) {
			return -C.int(en)
		}
		if errors.Is(err, io.EOF) {
			return -C.int(unix.ECONNRESET)
		}
		return -C.int(unix.EPROTO)
	}
	_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, 1)
	n := min(len(pd), int(max(*outLen, 0)))
	if n > 0 {
		copy(unsafe.Slice((*byte)(out), n), pd)
	}
	*outLen = C.int(n)
	return 0
}

// udwf_mpa_reject refuses the connection on fd: its MPA Request is read
// and answered with a rejecting Reply carrying pd. The caller closes fd.
//
//export udwf_mpa_reject
func udwf_mpa_reject(fd C.int, pd unsafe.Pointer, pdLen C.int) C.int {
	var b []byte
	if pdLen > 0 {
		b = C.GoBytes(pd, pdLen)
	}
	if err := qp.RejectFD(int(fd), b, msgTimeout); err != nil {
		return -C.int(unix.EPROTO)
	}
	return 0
}

// udwf_msend sends n bytes at buf on a connected MSG endpoint; a
// completion with ctx follows when signaled is set. It returns 0 or
// -errno: -EAGAIN with the send queue full, -ENOTCONN before the
// connection is up.
//
//export udwf_msend
func udwf_msend(h C.longlong, buf unsafe.Pointer, n C.size_t, ctx C.uint64_t, signaled C.int) C.int {
	e := lookup(h)
	if e == nil || e.msg == nil {
		return -C.int(unix.EBADF)
	}
	return e.msgPost(0, buf, n, 0, 0, ctx, signaled)
}

// udwf_mrecv posts a receive of up to n bytes into buf (the caller's
// until its completion, with ctx).
//
//export udwf_mrecv
func udwf_mrecv(h C.longlong, buf unsafe.Pointer, n C.size_t, ctx C.uint64_t) C.int {
	e := lookup(h)
	if e == nil || e.msg == nil {
		return -C.int(unix.EBADF)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	m := e.msg
	m.nextID++
	id := m.nextID
	r := msgRecv{ctx: uint64(ctx)}
	wr := qp.RecvWR{ID: id}
	if n > 0 {
		var err error
		if r.mr, err = engine.pd.RegisterMemory(unsafe.Slice((*byte)(buf), int(n)), qp.AccessLocalWrite); err != nil {
			return C.int(errno(err))
		}
		wr.SGL = []qp.SGE{r.mr.SGE(0, int(n))}
	}
	if err := e.q.PostRecv(&wr); err != nil {
		if r.mr != nil {
			r.mr.Deregister()
		}
		return C.int(errno(err))
	}
	m.recvs[id] = r
	if m.up && e.q.RecvWaiting() {
		e.q.Progress() // a Send waited for this receive
	}
	return 0
}

// udwf_msg_ended reports whether the connection has ended: the peer
// closed its side (TCP's FIN, after everything it sent was handled) or
// the connection failed. It says so once (1), then 0.
//
//export udwf_msg_ended
func udwf_msg_ended(h C.longlong) C.int {
	e := lookup(h)
	if e == nil || e.msg == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.msg
	if !m.up || m.reported || e.closed {
		return 0
	}
	if e.q.PeerClosed() || e.q.State() == qp.StateError {
		m.reported = true
		return 1
	}
	return 0
}

// pollMsg reads what the connection holds and fills comps with the
// endpoint's completions, sends' first. Caller holds e.mu.
func (e *ep) pollMsg(comps []C.struct_udwf_comp) int {
	m := e.msg
	if m.up {
		e.q.Progress()
	}
	k := 0
	for k < len(comps) {
		got := e.scq.Poll(e.wcs[:min(len(e.wcs), len(comps)-k)])
		if got == 0 {
			break
		}
		for _, wc := range e.wcs[:got] {
			t, ok := m.sends[wc.ID]
			if !ok {
				continue
			}
			delete(m.sends, wc.ID)
			if t.mr != nil {
				t.mr.Deregister()
			}
			if !t.report && wc.Status == qp.Success {
				continue
			}
			c := &comps[k]
			*c = C.struct_udwf_comp{ctx: C.uint64_t(t.ctx), len: C.uint64_t(wc.Len)}
			if wc.Status != qp.Success {
				c.err = C.int32_t(unix.EIO)
				if wc.Status == qp.WRFlushError {
					c.err = C.int32_t(unix.ECANCELED)
				}
			}
			if t.op != 0 {
				c.op, c.len, c.err = C.uint32_t(t.op), C.uint64_t(t.n), rmaErr(wc.Status)
				if wc.Status == qp.WRFlushError {
					c.err = C.int32_t(unix.ECANCELED)
				}
			}
			k++
		}
	}
	for k < len(comps) {
		got := e.rcq.Poll(e.wcs[:min(len(e.wcs), len(comps)-k)])
		if got == 0 {
			break
		}
		for _, wc := range e.wcs[:got] {
			r, ok := m.recvs[wc.ID]
			if !ok {
				continue
			}
			delete(m.recvs, wc.ID)
			if r.mr != nil {
				r.mr.Deregister()
			}
			c := &comps[k]
			*c = C.struct_udwf_comp{recv: 1, ctx: C.uint64_t(r.ctx), len: C.uint64_t(wc.Len)}
			switch {
			case wc.Status == qp.WRFlushError:
				c.err = C.int32_t(unix.ECANCELED)
			case wc.Status == qp.LocalLengthError:
				c.err = C.int32_t(unix.EMSGSIZE)
			case wc.Status != qp.Success:
				c.err = C.int32_t(unix.EIO)
			}
			k++
		}
	}
	return k
}

// msgRMA writes n bytes at buf into the connection's peer's region of
// STag key at offset to (UDWF_OP_WRITE), or reads them from there into
// buf (UDWF_OP_READ): RDMA Write and Read on the RC QP, as udwf_rma on
// an RDM endpoint.
func (e *ep) msgRMA(op C.int, buf unsafe.Pointer, n C.size_t, key C.uint32_t, to C.uint64_t, ctx C.uint64_t, signaled C.int) C.int {
	if op != C.UDWF_OP_WRITE && op != C.UDWF_OP_READ {
		return -C.int(unix.EINVAL)
	}
	return e.msgPost(op, buf, n, key, to, ctx, signaled)
}

// msgPost posts a Send (op 0), an RDMA Write (UDWF_OP_WRITE) or an RDMA
// Read (UDWF_OP_READ) of n bytes at buf on the connection. What it sends
// of up to msgInline bytes is copied; a larger send, and every read,
// registers the caller's buffer for the operation (the Read Responses
// are tagged writes into it). Always signaled at the QP, reported only
// if asked: a registered buffer is let go at its completion.
func (e *ep) msgPost(op C.int, buf unsafe.Pointer, n C.size_t, key C.uint32_t, to C.uint64_t, ctx C.uint64_t, signaled C.int) C.int {
	if n > 0 && buf == nil {
		return -C.int(unix.EINVAL)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.msg
	if e.closed {
		return -C.int(unix.EBADF)
	}
	if !m.up {
		return -C.int(unix.ENOTCONN)
	}
	m.nextID++
	id := m.nextID
	t := txOf{ctx: uint64(ctx), report: signaled != 0, op: uint32(op), n: int(n)}
	wr := qp.SendWR{ID: id, Opcode: qp.OpSend, Flags: qp.FlagSignaled}
	if op != 0 {
		wr.Opcode, wr.RemoteSTag, wr.RemoteTO = qp.OpWrite, uint32(key), uint64(to)
	}
	var b []byte
	if n > 0 {
		b = unsafe.Slice((*byte)(buf), int(n))
	}
	var err error
	switch {
	case op == C.UDWF_OP_READ:
		if t.mr, err = engine.pd.RegisterMemory(b, qp.AccessLocalWrite|qp.AccessRemoteWrite); err != nil {
			return C.int(errno(err))
		}
		wr.Opcode, wr.SGL = qp.OpRead, []qp.SGE{t.mr.SGE(0, int(n))}
	case n == 0:
	case int(n) <= msgInline:
		wr.Inline = b
	default:
		if t.mr, err = engine.pd.RegisterMemory(b, 0); err != nil {
			return C.int(errno(err))
		}
		wr.SGL = []qp.SGE{t.mr.SGE(0, int(n))}
	}
	if err := e.q.PostSend(&wr); err != nil {
		if t.mr != nil {
			t.mr.Deregister()
		}
		return C.int(errno(err))
	}
	m.sends[id] = t
	return 0
}
