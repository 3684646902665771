//go:build cgo && linux

// Command engine is the Go half of udiwarp's libfabric provider, built
// with -buildmode=c-shared as libudiwarp_fi_engine.so and dlopen()ed by
// libudiwarp-fi.so (../c/udiwarp_fi.c), which owns libfabric's ABI. See
// the libfabric package for the design.
//
// Each endpoint is a UDP socket the C side opened and bound (it keeps
// the descriptor, waits on it, and closes it), run as a manual socket of
// the process's one device (qp.Device.BindFD) with one datagram QP
// aliased to a fixed QP number, so that an endpoint's address is its
// socket's: a struct sockaddr_in or sockaddr_in6. Nothing here blocks:
// udwf_poll reads what the socket holds (Socket.Progress) and returns the
// completions that are ready, in batches; the C side does every wait.
// Errors are returned as -errno.
package main

/*
#include "udwf.h"
*/
import "C"

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

func main() {}

// EndpointQPN is the QP number every endpoint's QP answers to on its own
// socket (qp.Socket.Alias): an endpoint's address is its socket's alone.
const EndpointQPN = 1

// maxAHs bounds the address handles the process holds at once (its AVs'
// entries together).
const maxAHs = 1 << 20

// engine is the process's one udiwarp device and protection domain.
var engine struct {
	once sync.Once
	err  error
	dev  *qp.Device
	pd   *qp.PD

	ahMu    sync.Mutex
	ahs     []*qp.AH // by index; nil: free
	ahAddrs []netip.AddrPort
	ahFree  []int
}

func start() error {
	engine.once.Do(func() {
		// Manual sockets only: every endpoint's socket is read where the
		// C side polls its completion queue (FI_PROGRESS_MANUAL).
		engine.dev, engine.err = qp.Open(qp.DeviceConfig{Poll: qp.PollEvent, RecvBuffer: recvBuffer, SendBuffer: sendBuffer})
		if engine.err == nil {
			engine.pd = engine.dev.AllocPD()
		}
	})
	return engine.err
}

func errno(err error) C.longlong {
	var e unix.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return -C.longlong(e)
	case errors.Is(err, qp.ErrQueueFull):
		return -C.longlong(unix.EAGAIN)
	case errors.Is(err, qp.ErrClosed), errors.Is(err, net.ErrClosed):
		return -C.longlong(unix.EBADF)
	case errors.Is(err, qp.ErrInvalidWR), errors.Is(err, qp.ErrInvalidAttr):
		return -C.longlong(unix.EINVAL)
	case errors.Is(err, qp.ErrTooMany):
		return -C.longlong(unix.ENOSPC)
	case errors.Is(err, qp.ErrNotFound):
		return -C.longlong(unix.ENOENT)
	}
	return -C.longlong(unix.EIO)
}

// udwf_init starts the engine: the process's device and its protection
// domain. It returns 0 or -errno.
//
//export udwf_init
func udwf_init() C.int {
	return C.int(errno(start()))
}

// udwf_ah makes an address handle to the endpoint at sa (a struct
// sockaddr_in or sockaddr_in6 of salen bytes) and returns its index (0 or
// more), or -errno: -EINVAL for an address that is neither, -ENOSPC when
// the process holds maxAHs.
//
//export udwf_ah
func udwf_ah(sa unsafe.Pointer, salen C.int) C.longlong {
	if err := start(); err != nil {
		return errno(err)
	}
	ap, ok := parseSockaddr(sa, salen)
	if !ok || !ap.Addr().IsValid() || ap.Port() == 0 {
		return -C.longlong(unix.EINVAL)
	}
	qpn := uint32(EndpointQPN)
	if ap.Addr().IsMulticast() {
		qpn = qp.MulticastQPN
	}
	ah, err := engine.pd.CreateAH(ap, qpn)
	if err != nil {
		return errno(err)
	}
	engine.ahMu.Lock()
	defer engine.ahMu.Unlock()
	var i int
	if k := len(engine.ahFree); k > 0 {
		i = engine.ahFree[k-1]
		engine.ahFree = engine.ahFree[:k-1]
	} else {
		if len(engine.ahs) >= maxAHs {
			return -C.longlong(unix.ENOSPC)
		}
		engine.ahs = append(engine.ahs, nil)
		engine.ahAddrs = append(engine.ahAddrs, netip.AddrPort{})
		i = len(engine.ahs) - 1
	}
	engine.ahs[i] = ah
	engine.ahAddrs[i] = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	return C.longlong(i)
}

// udwf_ah_free lets index i go.
//
//export udwf_ah_free
func udwf_ah_free(i C.longlong) {
	engine.ahMu.Lock()
	defer engine.ahMu.Unlock()
	if i >= 0 && int(i) < len(engine.ahs) && engine.ahs[i] != nil {
		engine.ahs[i] = nil
		engine.ahFree = append(engine.ahFree, int(i))
	}
}

func ahOf(i C.longlong) *qp.AH {
	engine.ahMu.Lock()
	defer engine.ahMu.Unlock()
	if i < 0 || int(i) >= len(engine.ahs) {
		return nil
	}
	return engine.ahs[i]
}

// ahAddr is the address of handle i (the zero AddrPort for none).
func ahAddr(i C.longlong) netip.AddrPort {
	engine.ahMu.Lock()
	defer engine.ahMu.Unlock()
	if i < 0 || int(i) >= len(engine.ahs) || engine.ahs[i] == nil {
		return netip.AddrPort{}
	}
	return engine.ahAddrs[i]
}

// An ep is one endpoint: its socket, QP, CQs and receive slots.
type ep struct {
	mu   sync.Mutex // the C side may call from any thread
	s    *qp.Socket
	q    *qp.QP
	scq  *qp.CQ
	rcq  *qp.CQ
	mr   *qp.MR // the receive slots
	slot int    // bytes per slot: the largest message
	free shim.Slots
	// posted[i] is the receive slot i holds for: the caller's buffer and
	// its context.
	posted []recvOf
	wcs    []qp.WorkCompletion
	swr    qp.SendWR // the work request a send fills (under mu)
	sges   [2]qp.SGE // and its SGL
	closed bool
	// RDM endpoints (RD QPs): the send slots, and tag matching.
	rdm *rdmState
	// MSG endpoints (RC QPs on TCP sockets).
	msg *msgState
}

type recvOf struct {
	buf unsafe.Pointer
	len int
	ctx uint64
}

var (
	tabMu sync.Mutex
	tab   []atomic.Pointer[ep]
	gens  []uint32
	freeH []int
)

func lookup(h C.longlong) *ep {
	i, gen := int(int64(h)&0xffffffff)-1, uint32(int64(h)>>32)
	if h <= 0 || i < 0 {
		return nil
	}
	tabMu.Lock()
	defer tabMu.Unlock()
	if i >= len(tab) || gens[i] != gen {
		return nil
	}
	return tab[i].Load()
}

// udwf_ep_open runs an endpoint over fd, a bound UDP socket the caller
// keeps (and closes after udwf_ep_close), with txDepth sends and rxDepth
// receives outstanding at most, messages of at most maxMsg bytes: a DGRAM
// endpoint on a UD QP (rdm 0), or an RDM endpoint on an RD QP (rdm 1). It
// returns the endpoint's handle (> 0) or -errno.
//
//export udwf_ep_open
func udwf_ep_open(fd C.int, rdm C.int, txDepth, rxDepth, maxMsg C.int) C.longlong {
	if err := start(); err != nil {
		return errno(err)
	}
	if txDepth <= 0 || rxDepth <= 0 || maxMsg <= 0 {
		return -C.longlong(unix.EINVAL)
	}
	e := &ep{}
	open := e.open
	if rdm != 0 {
		open = e.openRDM
	}
	if err := open(int(fd), int(txDepth), int(rxDepth), int(maxMsg)); err != nil {
		e.close()
		return errno(err)
	}
	return register(e)
}

// register enters e in the table of endpoints and returns its handle:
// its index plus one, with the slot's generation above, so that a handle
// of a closed endpoint finds nothing.
func register(e *ep) C.longlong {
	tabMu.Lock()
	var i int
	if k := len(freeH); k > 0 {
		i = freeH[k-1]
		freeH = freeH[:k-1]
	} else {
		tab = append(tab, atomic.Pointer[ep]{})
		gens = append(gens, 0)
		i = len(tab) - 1
	}
	gens[i]++
	h := C.longlong(int64(gens[i])<<32 | int64(i+1))
	tab[i].Store(e)
	tabMu.Unlock()
	return h
}

// The kernel buffers of the device's sockets and of the endpoints' (qp's
// defaults: qp.DeviceConfig).
const (
	recvBuffer = 8 << 20
	sendBuffer = 4 << 20
)

// bindFD runs the endpoint's socket as a manual socket of the device,
// with the kernel buffers the device gives its own sockets (recvBuffer,
// sendBuffer; BindFD leaves a socket's options as they are, and a
// preloaded program's are its own): the socket is the provider's,
// and with the default 208 KiB two of loopback's 64 KiB datagrams filled
// it, so an RD message of a megabyte lost frames to the kernel at every
// burst and waited for retransmissions (9.7 ms a transfer instead of
// 0.5 ms).
func (e *ep) bindFD(fd int) error {
	var err error
	if e.s, err = engine.dev.BindFD(fd); err != nil {
		return err
	}
	if err := e.s.SetReadBuffer(recvBuffer); err != nil {
		return err
	}
	return e.s.SetWriteBuffer(sendBuffer)
}

func (e *ep) open(fd, txDepth, rxDepth, maxMsg int) error {
	var err error
	if err = e.bindFD(fd); err != nil {
		return err
	}
	if maxMsg > e.s.MaxMessage() {
		return unix.EMSGSIZE
	}
	e.slot = maxMsg
	if e.scq, err = engine.dev.CreateCQ(txDepth); err != nil {
		return err
	}
	if e.rcq, err = engine.dev.CreateCQ(rxDepth); err != nil {
		return err
	}
	// Sends are inline: the QP copies the caller's bytes before PostSend
	// returns, so the caller's buffer is its own again at once, as
	// libfabric lets a provider do for a send it completes (FI_INJECT's
	// semantics for every send).
	attr := qp.QPAttr{Type: qp.UD, SendCQ: e.scq, RecvCQ: e.rcq,
		Caps: qp.QPCaps{MaxSendWR: txDepth, MaxRecvWR: rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: maxMsg}}
	if e.q, err = engine.pd.CreateQP(attr); err != nil {
		return err
	}
	if err := e.q.Activate(e.s); err != nil {
		return err
	}
	if err := e.s.Alias(EndpointQPN, e.q); err != nil {
		return err
	}
	if e.mr, err = engine.pd.RegisterMemory(make([]byte, rxDepth*maxMsg), qp.AccessLocalWrite); err != nil {
		return err
	}
	e.free = shim.NewSlots(rxDepth)
	e.posted = make([]recvOf, rxDepth)
	e.wcs = make([]qp.WorkCompletion, 64)
	return nil
}

func (e *ep) close() {
	if e.q != nil {
		e.q.Destroy()
	}
	if e.s != nil {
		e.s.Close()
	}
	if e.mr != nil {
		e.mr.Deregister()
	}
	if m := e.msg; m != nil {
		for _, t := range m.sends {
			if t.mr != nil {
				t.mr.Deregister()
			}
		}
		for _, r := range m.recvs {
			if r.mr != nil {
				r.mr.Deregister()
			}
		}
	}
	if r := e.rdm; r != nil {
		for _, mr := range []*qp.MR{r.tx, r.large, r.atom} {
			if mr != nil {
				mr.Deregister()
			}
		}
		for _, t := range r.txCtx {
			if t.mr != nil {
				t.mr.Deregister()
			}
		}
	}
}

// udwf_ep_close closes the endpoint: what was posted is dropped without
// completions (libfabric's fi_close of an endpoint). The caller's socket
// stays open.
//
//export udwf_ep_close
func udwf_ep_close(h C.longlong) C.int {
	e := lookup(h)
	if e == nil {
		return -C.int(unix.EBADF)
	}
	i := int(int64(h)&0xffffffff) - 1
	tabMu.Lock()
	tab[i].Store(nil)
	freeH = append(freeH, i)
	tabMu.Unlock()
	e.mu.Lock()
	e.closed = true
	e.close()
	e.mu.Unlock()
	return 0
}

// udwf_send sends len bytes at buf to the endpoint of address handle ah
// (udwf_ah), with 8 bytes of immediate data when hasData is set; a
// completion with ctx follows when signaled is. It returns 0 or -errno:
// -EAGAIN when the send queue is full (libfabric's FI_EAGAIN), -EMSGSIZE
// over the endpoint's largest message, -EINVAL for an unknown handle.
//
//export udwf_send
func udwf_send(h C.longlong, buf unsafe.Pointer, n C.size_t, ah C.longlong, ctx C.uint64_t, signaled C.int, hasData C.int, data C.uint64_t) C.int {
	e := lookup(h)
	if e == nil {
		return -C.int(unix.EBADF)
	}
	a := ahOf(ah)
	if a == nil {
		return -C.int(unix.EINVAL)
	}
	if int(n) > e.slot {
		return -C.int(unix.EMSGSIZE)
	}
	if hasData != 0 {
		return -C.int(unix.ENOSYS) // UD carries no immediate data (RFC 7306 is RD's and RC's)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	if e.rdm != nil {
		return -C.int(unix.EINVAL) // an RDM endpoint sends with udwf_tsend
	}
	// The endpoint's own work request, under its lock: one that escaped
	// to the heap cost an allocation per send.
	wr := &e.swr
	*wr = qp.SendWR{ID: uint64(ctx), AH: a, Opcode: qp.OpSend}
	if n > 0 {
		wr.Inline = unsafe.Slice((*byte)(buf), int(n))
	}
	if signaled != 0 {
		wr.Flags |= qp.FlagSignaled
	}
	err := e.q.PostSend(wr)
	wr.Inline, wr.AH = nil, nil
	runtime.KeepAlive(buf)
	return C.int(errno(err))
}

// udwf_recv posts a receive of up to n bytes into buf, completing with
// ctx. It returns 0 or -errno (-EAGAIN: every receive slot is posted).
//
//export udwf_recv
func udwf_recv(h C.longlong, buf unsafe.Pointer, n C.size_t, ctx C.uint64_t) C.int {
	e := lookup(h)
	if e == nil {
		return -C.int(unix.EBADF)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	if e.rdm != nil {
		return -C.int(unix.EINVAL) // an RDM endpoint receives with udwf_trecv
	}
	i, ok := e.free.Take()
	if !ok {
		return -C.int(unix.EAGAIN)
	}
	e.posted[i] = recvOf{buf: buf, len: int(n), ctx: uint64(ctx)}
	if err := e.q.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{e.mr.SGE(i*e.slot, e.slot)}}); err != nil {
		e.free.Put(i)
		return C.int(errno(err))
	}
	return 0
}

// udwf_join makes the endpoint a member of the multicast group sa names
// (join non-zero) or ends its membership; the group's datagrams reach it
// when its socket is bound to the group's port (and to the wildcard
// address or the group's). It returns 0 or -errno (-EINVAL: not a
// multicast group).
//
//export udwf_join
func udwf_join(h C.longlong, sa unsafe.Pointer, salen C.int, join C.int) C.int {
	e := lookup(h)
	if e == nil {
		return -C.int(unix.EBADF)
	}
	ap, ok := parseSockaddr(sa, salen)
	if !ok || !ap.Addr().IsMulticast() {
		return -C.int(unix.EINVAL)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	if join == 0 {
		return C.int(errno(e.q.LeaveMulticast(ap.Addr())))
	}
	return C.int(errno(e.q.JoinMulticast(ap.Addr(), nil)))
}

// udwf_poll reads what the endpoint's socket holds and fills out (room
// for n) with completions, sends' first; it returns how many, or -errno.
//
//export udwf_poll
func udwf_poll(h C.longlong, out *C.struct_udwf_comp, n C.int) C.int {
	e := lookup(h)
	if e == nil {
		return -C.int(unix.EBADF)
	}
	if n <= 0 {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -C.int(unix.EBADF)
	}
	comps := unsafe.Slice(out, int(n))
	if e.msg != nil {
		return C.int(e.pollMsg(comps))
	}
	e.s.Progress(64)
	if e.rdm != nil {
		return C.int(e.pollRDM(comps))
	}
	k := 0
	for _, cq := range []*qp.CQ{e.scq, e.rcq} {
		for k < len(comps) {
			got := cq.Poll(e.wcs[:min(len(e.wcs), len(comps)-k)])
			if got == 0 {
				break
			}
			for j := range got {
				e.complete(&e.wcs[j], &comps[k])
				k++
			}
		}
	}
	return C.int(k)
}

// complete turns wc into c: a receive's bytes copied from its slot into
// the caller's buffer (cut to it, EMSGSIZE then), its source, its
// immediate data.
func (e *ep) complete(wc *qp.WorkCompletion, c *C.struct_udwf_comp) {
	*c = C.struct_udwf_comp{}
	if wc.Opcode != qp.WCRecv {
		c.ctx = C.uint64_t(wc.ID)
		c.len = C.uint64_t(wc.Len)
		if wc.Status != qp.Success {
			c.err = C.int32_t(unix.EIO)
		}
		return
	}
	i := int(wc.ID)
	r := e.posted[i]
	e.posted[i] = recvOf{}
	e.free.Put(i)
	c.recv = 1
	c.ctx = C.uint64_t(r.ctx)
	if wc.Status != qp.Success {
		c.err = C.int32_t(unix.EIO)
		if wc.Status == qp.WRFlushError {
			c.err = C.int32_t(unix.ECANCELED)
		}
		return
	}
	got := int(wc.Len)
	n := min(got, r.len)
	if n > 0 {
		copy(unsafe.Slice((*byte)(r.buf), n), e.mr.Bytes()[i*e.slot:i*e.slot+n])
	}
	c.len = C.uint64_t(n)
	if got > r.len {
		c.err, c.olen = C.int32_t(unix.EMSGSIZE), C.uint64_t(got-r.len)
	}
	if wc.WithImm {
		c.has_data, c.data = 1, C.uint64_t(wc.Imm)
	}
	var l C.int = 28
	putSockaddr(unsafe.Pointer(&c.src[0]), &l, wc.Source, e.s.LocalAddr().Addr().Is6())
	c.srclen = C.uint32_t(l)
}

// udwf_max_msg is the largest message an endpoint carries in one
// datagram: a UDP datagram's payload over IPv4 (65,507 bytes, the
// smaller of the two families') less the DDP header and the CRC.
//
//export udwf_max_msg
func udwf_max_msg() C.int {
	return C.int(65507 - udiwarp.DDPUntaggedHeaderSize - udiwarp.CRCSize)
}

// parseSockaddr reads a struct sockaddr_in or sockaddr_in6 (shim.ParseSockaddr).
func parseSockaddr(p unsafe.Pointer, n C.int) (netip.AddrPort, bool) {
	if p == nil || n < 2 {
		return netip.AddrPort{}, false
	}
	return shim.ParseSockaddr(unsafe.Slice((*byte)(p), int(n)))
}

// putSockaddr writes ap as the socket's family does, cut to *n bytes, and
// sets *n to the full length (shim.PutSockaddr).
func putSockaddr(p unsafe.Pointer, n *C.int, ap netip.AddrPort, v6 bool) {
	if p == nil || n == nil {
		return
	}
	*n = C.int(shim.PutSockaddr(unsafe.Slice((*byte)(p), int(max(*n, 0))), ap, v6))
}
