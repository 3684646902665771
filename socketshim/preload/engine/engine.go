//go:build cgo && linux

// Command engine is the Go half of udiwarp's LD_PRELOAD library, built
// with -buildmode=c-shared as libudiwarp_engine.so and dlopen()ed by
// libudiwarp_preload.so (../c/preload.c) on a program's first datagram
// socket. See the preload package for the design.
//
// Every exported function is non-blocking but for a bounded spin: the C
// side does all blocking waits, on the socket's eventfd, so a program's
// threads never park inside Go. Errors are returned as -errno.
package main

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/socketshim"
	"golang.org/x/sys/unix"
)

func main() {}

const (
	// heldPerSocket caps the pool's receives one socket holds at once
	// (QPAttr.SRQLimit): a socket reads one datagram per receive call
	// (Progress(1)), and holds one more for MSG_PEEK or FIONREAD.
	heldPerSocket = 4
	sendDepth     = 4 // send WRs queued per socket while its kernel buffer is full (UD)
	// rdSendDepth: an RD QP keeps each Send until its peer acknowledges
	// it, in order of posting across its peers, so a socket that answers
	// many peers (a SIP server's) needs many; they cost memory only while
	// outstanding.
	rdSendDepth = 4096
	// defaultRDPeers is UDIWARP_PRELOAD_RD_PEERS's default: the peers one
	// RD socket keeps state for (a server with a socket per client on the
	// other side has that many). Every peer may share one address (a
	// client host's sockets), so it is the per-address cap too.
	defaultRDPeers = 16384
	// defaultRDLinger is UDIWARP_PRELOAD_RD_LINGER's default: how long
	// close, shutdown and exit wait for an RD socket's Sends to be
	// acknowledged (RD's retries give up on an unreachable peer within
	// a few seconds at the default timeouts).
	defaultRDLinger = 5 * time.Second
	maxAHs          = 256
	// recvSize is the pool's receive size: a whole UD Send of the
	// largest UDP datagram, IPv6's.
	recvSize       = 65527
	smallSize      = 2048
	defaultPool    = 4 << 20 // UDIWARP_PRELOAD_POOL's default, bytes
	minPoolEntries = 8
	// maxQPs is the most sockets one process runs over the engine: its
	// table of QPs is this many pointers (8 MiB of address space, touched
	// only as far as used). Beyond it a socket stays on the kernel.
	maxQPs = 1 << 20
)

// engine is the process's one udiwarp device: every owned socket is one
// of its manual sockets (qp.Device.BindFD over the program's own
// descriptor) with one UD QP, and all the QPs receive from one shared
// receive queue over one registered pool (seed 004), so the receive
// memory of the process is the pool's, whatever the number of sockets.
var engine struct {
	once  sync.Once
	err   error
	dev   *qp.Device
	pd    *qp.PD
	srq   *qp.SRQ
	pool  *qp.MR
	small int // small receives in the pool (smallSize), ids 0..small-1
	n     int // large ones (recvSize), the ids after
	// reserve is the pool's receives a readiness probe leaves free for
	// the program's receives (udw_ready): a quarter of them over UD; -1
	// (none) over RD, whose probes always read: a Data frame that finds
	// no receive is refused and sent again by its peer, never lost, while
	// a socket called readable for a frame unread — often an RD
	// acknowledgement, no datagram — would hold a blocking receive until
	// the next datagram came.
	reserve int
	// scq is every QP's send CQ: sends are unsignaled, so it holds only
	// failed ones, and whichever socket sends next empties it (reap).
	scq   *qp.CQ
	typ   qp.QPType // UD, or RD with UDIWARP_PRELOAD_QP=rd
	peers int       // RD's MaxPeers
	// linger bounds RD's drain at close, shutdown and exit
	// (UDIWARP_PRELOAD_RD_LINGER, ms; 0: none).
	linger time.Duration
	reapM  sync.Mutex
	swcs   [64]qp.WorkCompletion
}

func start() error {
	engine.once.Do(func() {
		size := defaultPool
		if v, err := strconv.Atoi(os.Getenv("UDIWARP_PRELOAD_POOL")); err == nil && v > 0 {
			size = v
		}
		// Two size classes (seed 004's pool, qp.SRQClass): a quarter of the
		// pool in small receives, so that small datagrams (SIP, DNS, most
		// of what a datagram program sends) do not take 64 KiB each.
		switch q := os.Getenv("UDIWARP_PRELOAD_QP"); q {
		case "", "ud":
			engine.typ = qp.UD
		case "rd":
			engine.typ = qp.RD
			engine.peers = defaultRDPeers
			if v, err := strconv.Atoi(os.Getenv("UDIWARP_PRELOAD_RD_PEERS")); err == nil && v > 0 {
				engine.peers = v
			}
			engine.linger = defaultRDLinger
			if v, err := strconv.Atoi(os.Getenv("UDIWARP_PRELOAD_RD_LINGER")); err == nil && v >= 0 {
				engine.linger = time.Duration(v) * time.Millisecond
			}
		default:
			engine.err = fmt.Errorf("UDIWARP_PRELOAD_QP=%q: want ud or rd", q)
			return
		}
		engine.small = max(size/4/smallSize, minPoolEntries)
		engine.n = max((size-engine.small*smallSize)/recvSize, minPoolEntries)
		engine.reserve = (engine.small + engine.n) / 4
		if engine.typ == qp.RD {
			engine.reserve = -1
		}
		// A QP per socket: as many as a process can have descriptors.
		d, err := qp.Open(qp.DeviceConfig{RecvBatch: 1, EventSpin: -1, MaxQP: maxQPs})
		if err != nil {
			engine.err = err
			return
		}
		engine.dev, engine.pd = d, d.AllocPD()
		if engine.scq, err = d.CreateCQ(4096); err != nil {
			engine.err = err
			return
		}
		engine.srq, err = engine.pd.CreateSRQEx(qp.SRQAttr{MaxSGE: 1,
			Classes: []qp.SRQClass{{Size: smallSize, Depth: engine.small}, {Size: recvSize, Depth: engine.n}}})
		if err == nil {
			engine.pool, err = engine.pd.RegisterMemory(make([]byte, engine.small*smallSize+engine.n*recvSize), qp.AccessLocalWrite)
		}
		for i := 0; err == nil && i < engine.small+engine.n; i++ {
			err = repost(uint64(i))
		}
		engine.err = err
	})
	return engine.err
}

// receive is where receive id lies in the pool: the small ones first.
func receive(id uint64) (off, size int) {
	i := int(id)
	if i < engine.small {
		return i * smallSize, smallSize
	}
	return engine.small*smallSize + (i-engine.small)*recvSize, recvSize
}

// repost gives receive id back to the pool.
func repost(id uint64) error {
	off, size := receive(id)
	return engine.srq.PostRecv(&qp.RecvWR{ID: id, SGL: []qp.SGE{engine.pool.SGE(off, size)}})
}

// sock is one owned socket: a manual socket of the engine's device over
// the program's descriptor, and its UD QP, whose peers address it as
// socketshim.ShimQPN (Socket.Alias).
type sock struct {
	// stream is set for a TCP socket (stream.go); the fields below are
	// a datagram socket's.
	stream *stream

	s    *qp.Socket
	q    *qp.QP
	rcq  *qp.CQ
	slot int // the largest datagram
	v6   bool
	fd   atomic.Int32 // the program's descriptor the engine uses (udw_setfd)

	rmu  sync.Mutex
	rwc  [1]qp.WorkCompletion
	held *qp.WorkCompletion // a datagram MSG_PEEK, FIONREAD or a poll looked at
	// pending is the C side's flag (its memory): 1 while datagrams for
	// the program wait in the engine (held, or completed in the CQ), which
	// the kernel's readiness of the descriptor no longer shows.
	pending *int32

	wmu sync.Mutex
	ahs shim.AHCache
}

// The handle table: a handle is a slot's index and its generation, so
// that slots are reused (a program may open and close sockets without
// end) and a stale handle finds nothing.
var (
	tabMu   sync.Mutex
	tab     []atomic.Pointer[sock]
	gens    []uint32
	free    []int32
	statsMu sync.Mutex

	// Counters: datagrams and bytes through udiwarp, for the stats file.
	adopted, live, sent, received, sentBytes, receivedBytes atomic.Uint64
	// rdDropped counts the closes, shutdowns and exits that gave up on
	// RD Sends not acknowledged within UDIWARP_PRELOAD_RD_LINGER.
	rdDropped atomic.Uint64
	statsPath string
)

// statsEvery is how often the engine's goroutine writes the stats file;
// a program's call writes it only when the engine starts and at exit.
const statsEvery = 200 * time.Millisecond

func handleOf(i int, gen uint32) C.longlong { return C.longlong(int64(gen)<<32 | int64(i+1)) }

func errno(err error) C.longlong {
	var e unix.Errno
	if errors.As(err, &e) {
		return -C.longlong(e)
	}
	switch {
	case errors.Is(err, qp.ErrQueueFull):
		return -C.longlong(unix.EAGAIN)
	case errors.Is(err, qp.ErrClosed), errors.Is(err, net.ErrClosed):
		return -C.longlong(unix.EBADF)
	}
	return -C.longlong(unix.EIO)
}

// udw_init sets the runtime up for a host process: enough Ps that
// program threads calling in never wait for one (they may outnumber the
// CPUs), the netpoller started (so its descriptors exist before the C
// side takes its inventory of them), the device and its receive pool,
// and the stats file.
//
//export udw_init
func udw_init() C.int {
	n := 32
	if v, err := strconv.Atoi(os.Getenv("UDIWARP_PRELOAD_GOMAXPROCS")); err == nil && v > 0 {
		n = v
	}
	runtime.GOMAXPROCS(max(n, runtime.NumCPU()))
	// Start the netpoller now: its epoll and eventfd descriptors appear
	// during this call, where the C side looks for them.
	if pc, err := net.ListenPacket("udp4", "127.0.0.1:0"); err == nil {
		pc.Close()
	} else if pc, err := net.ListenPacket("udp6", "[::1]:0"); err == nil {
		pc.Close()
	}
	if err := start(); err != nil {
		fmt.Fprintf(os.Stderr, "udiwarp preload[%d]: the engine cannot start: %v\n", os.Getpid(), err)
		return -1
	}
	statsPath = os.Getenv("UDIWARP_PRELOAD_STATS")
	if statsPath != "" {
		writeStats()
		go func() {
			for range time.Tick(statsEvery) {
				writeStats()
			}
		}()
	}
	return 0
}

// udw_adopt runs a UD QP over fd, the program's own bound UDP socket,
// which stays the program's: the engine reads it only when the program
// receives (so the kernel's queue, bounded by the socket's SO_RCVBUF, is
// the only buffering, and poll, select and epoll see the kernel's
// readiness), and never closes it. It returns a handle (> 0) or -errno.
//
//export udw_adopt
func udw_adopt(fd C.int, pending *C.int) C.longlong {
	if err := start(); err != nil {
		return errno(err)
	}
	qs, err := engine.dev.BindFD(int(fd))
	if err != nil {
		return errno(err)
	}
	s := &sock{s: qs, v6: qs.LocalAddr().Addr().Is6(), slot: qs.MaxMessage(), pending: (*int32)(unsafe.Pointer(pending))}
	s.fd.Store(int32(fd))
	if err := s.setup(); err != nil {
		s.close()
		return errno(err)
	}
	h := install(s)
	adopted.Add(1)
	live.Add(1)
	return h
}

// install puts s in the handle table and returns its handle.
func install(s *sock) C.longlong {
	tabMu.Lock()
	var i int
	if k := len(free); k > 0 {
		i = int(free[k-1])
		free = free[:k-1]
	} else {
		tab = append(tab, atomic.Pointer[sock]{})
		gens = append(gens, 0)
		i = len(tab) - 1
	}
	gens[i]++
	h := handleOf(i, gens[i])
	tab[i].Store(s)
	tabMu.Unlock()
	return h
}

func (s *sock) setup() error {
	var err error
	s.ahs = shim.AHCache{PD: engine.pd, QPN: socketshim.ShimQPN, Max: maxAHs}
	if s.rcq, err = engine.dev.CreateCQ(heldPerSocket + 2); err != nil {
		return err
	}
	// Every send is inline: a UD QP copies a datagram only if it has to
	// wait for the kernel's buffer, into a slot made then; an RD QP keeps
	// a copy until the peer acknowledges it.
	attr := qp.QPAttr{Type: engine.typ, SendCQ: engine.scq, RecvCQ: s.rcq, SRQ: engine.srq, SRQLimit: heldPerSocket,
		Caps: qp.QPCaps{MaxSendWR: sendDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: s.slot}}
	if engine.typ == qp.RD {
		attr.Caps.MaxSendWR = rdSendDepth
		attr.RD = qp.RDConfig{MaxPeers: engine.peers, MaxPeersPerAddr: engine.peers}
	}
	if s.q, err = engine.pd.CreateQP(attr); err != nil {
		return err
	}
	if err := s.q.Activate(s.s); err != nil {
		return err
	}
	return s.s.Alias(socketshim.ShimQPN, s.q)
}

func lookup(h C.longlong) *sock {
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

// iovecs views a C struct iovec array.
func iovecs(p unsafe.Pointer, n C.int) []unix.Iovec {
	if p == nil || n <= 0 {
		return nil
	}
	return unsafe.Slice((*unix.Iovec)(p), int(n))
}

func iovLen(iov []unix.Iovec) int {
	n := 0
	for _, v := range iov {
		n += int(v.Len)
	}
	return n
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

// gather holds a datagram of several iovecs while it is sent inline.
var gather = sync.Pool{New: func() any { return new([1 << 16]byte) }}

// udw_send sends the iovecs as one datagram to the address at to.
// It returns the length, or -EAGAIN when the socket's send queue is
// full (the C side waits for the descriptor to be writable).
//
//export udw_send
func udw_send(h C.longlong, iov unsafe.Pointer, iovcnt C.int, to unsafe.Pointer, tolen C.int) C.longlong {
	s := lookup(h)
	if s == nil || s.stream != nil {
		return -C.longlong(unix.EBADF)
	}
	ap, ok := parseSockaddr(to, tolen)
	if !ok {
		return -C.longlong(unix.EAFNOSUPPORT)
	}
	if !s.v6 && ap.Addr().Is6() {
		return -C.longlong(unix.EAFNOSUPPORT)
	}
	if ap.Port() == 0 {
		return -C.longlong(unix.EINVAL)
	}
	vs := iovecs(iov, iovcnt)
	n := iovLen(vs)
	if n > s.slot {
		return -C.longlong(unix.EMSGSIZE)
	}
	var b []byte
	switch {
	case n == 0:
		b = []byte{}
	case len(vs) == 1:
		b = unsafe.Slice(vs[0].Base, n)
	default:
		g := gather.Get().(*[1 << 16]byte)
		defer gather.Put(g)
		for _, v := range vs {
			if v.Len > 0 {
				copy(g[len(b):], unsafe.Slice(v.Base, int(v.Len)))
				b = g[:len(b)+int(v.Len)]
			}
		}
	}
	reap()
	if engine.typ == qp.RD {
		// RD's acknowledgements come on the socket, which the engine reads
		// only when the program calls: a sender that never receives must
		// see them as it sends (data read meanwhile waits in its CQ). It
		// reads only while the socket may hold one more Data frame: past
		// its share of the pool (heldPerSocket) one is refused, receiver
		// not ready, and its peer sends it again later — a SIP server's
		// socket, answering each request with two datagrams, filled its
		// share so and refused its requests (3,351 at 30,000 clients).
		// The program's next receive or wait reads what is left.
		s.rmu.Lock()
		if s.rcq.Pending() < heldPerSocket {
			s.s.Progress(16)
		}
		s.note()
		s.rmu.Unlock()
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	ah, err := s.ahs.Get(ap)
	if err != nil {
		return errno(err)
	}
	if err := s.q.PostSend(&qp.SendWR{ID: ^uint64(0), Inline: b, AH: ah}); err != nil {
		if engine.typ == qp.RD && errors.Is(err, qp.ErrQueueFull) {
			// Full of Sends the peers have not acknowledged: wait for
			// the socket to be readable (their acks), not writable.
			return -C.longlong(unix.ENOBUFS)
		}
		return errno(err)
	}
	sent.Add(1)
	sentBytes.Add(uint64(n))
	return C.longlong(n)
}

// reap empties the send CQ: the sends are unsignaled, so it holds only
// failed ones, which a datagram socket does not report either.
func reap() {
	if engine.scq.Pending() == 0 {
		return
	}
	engine.reapM.Lock()
	for engine.scq.Poll(engine.swcs[:]) == len(engine.swcs) {
	}
	engine.reapM.Unlock()
}

const (
	msgPeek  = 0x2
	msgTrunc = 0x20
)

// next returns the next completed receive, reading one datagram from
// the kernel if none is waiting; nil when the kernel's queue is empty.
// With keep >= 0 it reads only while the pool has more than keep
// receives free, and says unread when it left the kernel's queue for
// want of them (a readiness probe's case; a receive passes -1: it reads,
// and the device drops the datagram if no receive is free).
// A receive that did not complete well (a datagram too long; a flush)
// goes back to the pool, as the kernel drops such a datagram. Under rmu.
func (s *sock) next(keep int) (wc *qp.WorkCompletion, unread bool) {
	if s.held != nil {
		return s.held, false
	}
	// A datagram that is not a Send for this socket (an error report, a
	// stray frame) makes no completion: read on, a bounded number.
	for range 64 {
		if s.rcq.Poll(s.rwc[:]) == 0 {
			if keep >= 0 && engine.srq.Len() <= keep {
				return nil, true
			}
			if s.s.Progress(1) == 0 {
				return nil, false
			}
			continue
		}
		if wc := &s.rwc[0]; wc.Status == qp.Success {
			s.held = wc
			if engine.typ == qp.RD {
				// Taken from the CQ, which now has room for one more: read a
				// frame meanwhile, so that RD's acknowledgements do not wait
				// behind the datagrams the CQ holds (a send reads only while
				// it has room).
				s.s.Progress(1)
			}
			return wc, false
		}
		repost(s.rwc[0].ID)
	}
	return nil, false
}

// note publishes whether datagrams wait in the engine (sock.pending).
// Under rmu, or with the CQ's only other writer (send's Progress) done.
func (s *sock) note() {
	v := int32(0)
	if st := s.stream; st != nil {
		if st.have || st.rcq.Pending() > 0 || st.broken || st.rdShut || st.q.PeerClosed() {
			v = 1
		}
	} else if s.held != nil || s.rcq.Pending() > 0 {
		v = 1
	}
	s.setPending(v)
}

// holding is the C side's count of sockets whose pending flag is set
// (udw_pending_counter), kept as the flags change, so that a wait with
// none set skips looking at each.
var holding *int32

// setPending publishes v in the socket's pending flag and keeps the
// count of those set.
func (s *sock) setPending(v int32) {
	if s.pending == nil {
		return
	}
	if old := atomic.SwapInt32(s.pending, v); old != v && holding != nil {
		atomic.AddInt32(holding, v-old)
	}
}

// udw_ready reports whether a datagram for the program waits (1) or not
// (0), reading the socket's queue until it finds one or the queue is
// empty: how the C side's poll, select and epoll tell a descriptor the
// kernel calls readable for frames that are not the program's (an RD
// acknowledgement, an error report) from one with data. A datagram it
// finds is kept for the next receive, in a receive of the pool; so over
// UD it reads only while the pool has more than engine.reserve free, and
// past that says 1 with the kernel's queue unread (the program's receive
// reads it). One wait may ask about a thousand sockets (a SIPp UAC's
// epoll_wait) before the program reads any: probes that took every
// receive had the device drop the datagrams read after them.
//
//export udw_ready
func udw_ready(h C.longlong) C.int {
	s := lookup(h)
	if s == nil {
		return 1 // the receive will say what is wrong
	}
	if st := s.stream; st != nil {
		st.rmu.Lock()
		defer st.rmu.Unlock()
		r := st.ready()
		s.note()
		if r {
			return 1
		}
		return 0
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	wc, unread := s.next(engine.reserve)
	s.note()
	if wc != nil || unread {
		return 1
	}
	return 0
}

// udw_recv reads the next datagram into the iovecs and returns its
// length (its full length with MSG_TRUNC in flags), or -EAGAIN when
// none is queued (the C side waits for the descriptor to be readable).
// *msgflags gets MSG_TRUNC when the datagram was cut; from/fromlen get
// the source as recvfrom(2) does. With none queued it polls the socket
// for up to spin nanoseconds first (a blocking receive's busy poll).
//
//export udw_recv
func udw_recv(h C.longlong, iov unsafe.Pointer, iovcnt C.int, from unsafe.Pointer, fromlen *C.int, flags C.int, msgflags *C.int, spin C.longlong) C.longlong {
	s := lookup(h)
	if s == nil {
		return -C.longlong(unix.EBADF)
	}
	if st := s.stream; st != nil {
		st.rmu.Lock()
		defer st.rmu.Unlock()
		defer s.note()
		if fromlen != nil {
			*fromlen = 0 // a connected stream names no source
		}
		vs := iovecs(iov, iovcnt)
		r := st.recv(vs, int(flags))
		for end := time.Now().Add(time.Duration(spin)); r == -C.longlong(unix.EAGAIN) && spin > 0 && time.Now().Before(end); {
			r = st.recv(vs, int(flags))
		}
		return r
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	defer s.note()
	wc, _ := s.next(-1)
	if wc == nil && spin > 0 {
		for end := time.Now().Add(time.Duration(spin)); wc == nil && time.Now().Before(end); {
			wc, _ = s.next(-1)
		}
	}
	if wc == nil {
		return -C.longlong(unix.EAGAIN)
	}
	off, _ := receive(wc.ID)
	data := engine.pool.Bytes()[off : off+int(wc.Len)]
	k := 0
	for _, v := range iovecs(iov, iovcnt) {
		if k == len(data) {
			break
		}
		if v.Len > 0 {
			k += copy(unsafe.Slice(v.Base, int(v.Len)), data[k:])
		}
	}
	if msgflags != nil && k < len(data) {
		*msgflags |= msgTrunc
	}
	putSockaddr(from, fromlen, wc.Source, s.v6)
	n := len(data)
	if flags&msgPeek == 0 {
		s.held = nil
		if err := repost(wc.ID); err != nil {
			return errno(err)
		}
		received.Add(1)
		receivedBytes.Add(uint64(n))
	}
	if flags&msgTrunc != 0 {
		return C.longlong(n)
	}
	return C.longlong(k)
}

// udw_next_len returns the length of the next datagram, 0 if none (FIONREAD).
//
//export udw_next_len
func udw_next_len(h C.longlong) C.longlong {
	s := lookup(h)
	if s == nil {
		return -C.longlong(unix.EBADF)
	}
	if st := s.stream; st != nil {
		st.rmu.Lock()
		defer st.rmu.Unlock()
		defer s.note()
		return C.longlong(st.available())
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	defer s.note()
	if wc, _ := s.next(-1); wc != nil {
		return C.longlong(wc.Len)
	}
	return 0
}

// udw_close closes the socket's device (and the engine's descriptor of
// the kernel socket; the C side keeps its own).
//
// udw_group joins (join != 0) or leaves the multicast group a program
// gave setsockopt: IP_ADD_MEMBERSHIP / IP_DROP_MEMBERSHIP with a struct
// ip_mreq or ip_mreqn (v6 == 0), IPV6_JOIN_GROUP / IPV6_LEAVE_GROUP with
// a struct ipv6_mreq. The socket's QP becomes a member (qp.JoinMulticast,
// which makes the kernel's membership too). It returns 0 or -errno as
// the kernel's setsockopt would fail.
//
//export udw_group
func udw_group(h C.longlong, join C.int, v6 C.int, opt unsafe.Pointer, optlen C.int) C.longlong {
	s := lookup(h)
	if s == nil || s.stream != nil {
		return -C.longlong(unix.EBADF)
	}
	b := unsafe.Slice((*byte)(opt), max(int(optlen), 0))
	var group netip.Addr
	var ifi *net.Interface
	if v6 == 0 {
		if len(b) < 8 { // struct ip_mreq: group, interface address
			return -C.longlong(unix.EINVAL)
		}
		group = netip.AddrFrom4([4]byte(b[0:4]))
		if len(b) >= 12 { // struct ip_mreqn: group, address, interface index
			if i := int32(binary.NativeEndian.Uint32(b[8:12])); i > 0 {
				x, err := net.InterfaceByIndex(int(i))
				if err != nil {
					return -C.longlong(unix.ENODEV)
				}
				ifi = x
			}
		}
		if a := netip.AddrFrom4([4]byte(b[4:8])); ifi == nil && !a.IsUnspecified() {
			ifi = interfaceOf(a)
			if ifi == nil {
				return -C.longlong(unix.ENODEV)
			}
		}
	} else {
		if len(b) < 20 { // struct ipv6_mreq: group, interface index
			return -C.longlong(unix.EINVAL)
		}
		group = netip.AddrFrom16([16]byte(b[0:16]))
		if i := binary.NativeEndian.Uint32(b[16:20]); i > 0 {
			x, err := net.InterfaceByIndex(int(i))
			if err != nil {
				return -C.longlong(unix.ENODEV)
			}
			ifi = x
		}
	}
	if !group.IsMulticast() {
		return -C.longlong(unix.EINVAL)
	}
	var err error
	if join != 0 {
		err = s.q.JoinMulticast(group, ifi)
	} else {
		err = s.q.LeaveMulticast(group)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, qp.ErrNotFound):
		return -C.longlong(unix.EADDRNOTAVAIL) // not a member: the kernel's answer
	case errors.Is(err, qp.ErrInvalidAttr):
		return -C.longlong(unix.EINVAL)
	}
	return errno(err)
}

// interfaceOf is the interface that has address a, or nil.
func interfaceOf(a netip.Addr) *net.Interface {
	ifs, _ := net.Interfaces()
	for i := range ifs {
		addrs, _ := ifs[i].Addrs()
		for _, x := range addrs {
			if p, err := netip.ParsePrefix(x.String()); err == nil && p.Addr() == a {
				return &ifs[i]
			}
		}
	}
	return nil
}

// udw_pending_counter gives the engine the C side's count of sockets
// whose pending flag is set, which it keeps from then on.
//
//export udw_pending_counter
func udw_pending_counter(p *C.int) {
	holding = (*int32)(unsafe.Pointer(p))
}

//export udw_close
func udw_close(h C.longlong) C.int {
	s := lookup(h)
	if s == nil {
		return -C.int(unix.EBADF)
	}
	defer s.setPending(0) // a closed socket holds nothing for the program
	i := int(int64(h)&0xffffffff) - 1
	tabMu.Lock()
	if !tab[i].CompareAndSwap(s, nil) {
		tabMu.Unlock()
		return -C.int(unix.EBADF)
	}
	free = append(free, int32(i))
	tabMu.Unlock()
	if st := s.stream; st != nil {
		st.wmu.Lock()
		if !st.drain(time.Now().Add(streamWait)) {
			streamDropped.Add(1)
		}
		st.rmu.Lock()
		st.release()
		st.rmu.Unlock()
		st.wmu.Unlock()
		streamsLive.Add(^uint64(0))
		return 0
	}
	if !s.linger(time.Now().Add(engine.linger)) {
		rdDropped.Add(1)
	}
	s.close()
	live.Add(^uint64(0))
	// The stats file shows the close at its next write (statsEvery): a
	// write here would be the program's thread creating and renaming a
	// file for every socket it closes (a SIP UAC with a socket per call
	// closed thousands a second, and spent most of its time in the file
	// system; see docs/preload.md "Counters").
	return 0
}

// linger waits until the socket's RD QP is done with every Send the
// program made — each acknowledged by its peer, or failed — or until
// deadline, and reports whether it is. Meanwhile it reads the socket,
// for the acknowledgements and for the handshake a Send to a new peer
// waits for; the device's timer sends again what is lost. A datagram for
// the program read meanwhile waits in the socket's CQ, as when a send
// reads (udw_send); one over the socket's share of the pool is dropped
// unacknowledged, and its sender sends it again. A UD socket holds
// nothing of the kind.
func (s *sock) linger(deadline time.Time) bool {
	if engine.typ != qp.RD {
		return true
	}
	for {
		if !s.q.SendQueued() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 || s.q.State() == qp.StateError {
			return false
		}
		s.rmu.Lock()
		n := s.s.Progress(64)
		s.note()
		s.rmu.Unlock()
		if n == 0 && s.q.SendQueued() {
			p := []unix.PollFd{{Fd: s.fd.Load(), Events: unix.POLLIN}}
			unix.Poll(p, int(min(left, 10*time.Millisecond)/time.Millisecond)+1)
		}
	}
}

// lingerAll is linger for every RD socket still open, within one
// UDIWARP_PRELOAD_RD_LINGER: what the process's exit waits for.
func lingerAll() {
	if engine.typ != qp.RD {
		return
	}
	var socks []*sock
	tabMu.Lock()
	for i := range tab {
		if s := tab[i].Load(); s != nil && s.stream == nil {
			socks = append(socks, s)
		}
	}
	tabMu.Unlock()
	deadline := time.Now().Add(engine.linger)
	for _, s := range socks {
		if !s.linger(deadline) {
			rdDropped.Add(1)
		}
	}
}

// close destroys the QP (its held receives go back to the pool) and
// closes the manual socket; the descriptor stays the program's, which
// closes it when this returns.
func (s *sock) close() {
	s.rmu.Lock()
	s.wmu.Lock()
	if s.held != nil {
		repost(s.held.ID)
		s.held = nil
	}
	if s.q != nil {
		s.q.Destroy()
	}
	if s.rcq != nil {
		for s.rcq.Poll(s.rwc[:]) > 0 {
			if s.rwc[0].Status == qp.Success {
				repost(s.rwc[0].ID)
			}
		}
	}
	s.s.Close()
	s.wmu.Unlock()
	s.rmu.Unlock()
}

// udw_setfd follows the socket to fd, another descriptor of it, before
// the C side closes the one the engine used.
//
//export udw_setfd
func udw_setfd(h C.longlong, fd C.int) C.int {
	s := lookup(h)
	if s == nil {
		return -C.int(unix.EBADF)
	}
	if st := s.stream; st != nil {
		if err := st.q.SetFD(int(fd)); err != nil {
			return C.int(errno(err))
		}
		st.fd = int(fd)
		return 0
	}
	if err := s.s.SetFD(int(fd)); err != nil {
		return C.int(errno(err))
	}
	s.fd.Store(int32(fd))
	return 0
}

// udw_exit is the process's exit (the C side's destructor calls it): it
// waits for what RD still holds of the open sockets' Sends (lingerAll),
// and writes the stats file one last time.
//
//export udw_exit
func udw_exit() {
	lingerAll()
	if statsPath != "" {
		writeStats()
	}
}

// Stats is what the stats file holds: datagrams through udiwarp.
type Stats struct {
	PID int `json:"pid"`
	// QP is the QP type every socket runs over: "ud" or "rd".
	QP string `json:"qp"`
	// Sockets is the number of program sockets run over udiwarp; Live,
	// those open now.
	Sockets uint64 `json:"sockets"`
	Live    uint64 `json:"live"`
	// Sent and Received count the program's datagrams the engine sent
	// and delivered; the bytes are their payloads.
	Sent          uint64 `json:"sent"`
	Received      uint64 `json:"received"`
	SentBytes     uint64 `json:"sent_bytes"`
	ReceivedBytes uint64 `json:"received_bytes"`
	// DeviceTx and DeviceRx are the device's own counters: UDP datagrams
	// (udiwarp frames) sent, and messages placed and completed.
	DeviceTx uint64 `json:"device_tx_datagrams"`
	DeviceRx uint64 `json:"device_rx_delivered"`
	// Pool is the receive pool's size in receives, PoolFree those posted
	// and free now; NoRecv and Overdraft count datagrams dropped because
	// the pool was empty or a socket held its share.
	Pool      int    `json:"pool_receives"`
	PoolFree  int    `json:"pool_free"`
	NoRecv    uint64 `json:"dropped_no_receive"`
	Overdraft uint64 `json:"dropped_overdraft"`
	// Streams counts the TCP sockets run over RC (UDIWARP_PRELOAD_TCP=rc),
	// StreamsLive those open now; StreamsPlain, accepted connections
	// from plain TCP peers, left to the kernel; StreamsRefused, MPA
	// exchanges that failed; StreamsDropped, closes or shutdowns that
	// gave up on output TCP would not take in time.
	Streams        uint64 `json:"streams"`
	StreamsLive    uint64 `json:"streams_live"`
	StreamsPlain   uint64 `json:"streams_plain"`
	StreamsRefused uint64 `json:"streams_refused"`
	StreamsDropped uint64 `json:"streams_dropped"`
	StreamSent     uint64 `json:"stream_sent_bytes"`
	StreamReceived uint64 `json:"stream_received_bytes"`
	// RDDropped counts the closes, shutdowns and exits that gave up on
	// RD Sends their peers had not acknowledged within
	// UDIWARP_PRELOAD_RD_LINGER (each socket that gave up, once each time).
	RDDropped uint64 `json:"rd_dropped"`
	// Device is every counter of the device (qp.Stats) that is not zero.
	Device map[string]uint64 `json:"device,omitempty"`
}

// counters lists the device's non-zero counters by their qp.Stats names.
func counters(st *qp.Stats) map[string]uint64 {
	m := map[string]uint64{}
	v := reflect.ValueOf(st).Elem()
	for i := range v.NumField() {
		if !v.Type().Field(i).IsExported() {
			continue
		}
		if c, ok := v.Field(i).Addr().Interface().(*atomic.Uint64); ok {
			if n := c.Load(); n != 0 {
				m[v.Type().Field(i).Name] = n
			}
		}
	}
	return m
}

func writeStats() {
	statsMu.Lock()
	defer statsMu.Unlock()
	st := Stats{PID: os.Getpid(), QP: strings.ToLower(engine.typ.String()), Sockets: adopted.Load(), Live: live.Load(), Sent: sent.Load(), Received: received.Load(),
		SentBytes: sentBytes.Load(), ReceivedBytes: receivedBytes.Load(), Pool: engine.small + engine.n,
		Streams: streams.Load(), StreamsLive: streamsLive.Load(), StreamsPlain: streamsPlain.Load(), StreamsRefused: streamsRefused.Load(),
		StreamsDropped: streamDropped.Load(), StreamSent: streamSent.Load(), StreamReceived: streamReceived.Load(),
		RDDropped: rdDropped.Load()}
	if engine.dev != nil {
		ds := engine.dev.Stats()
		st.DeviceTx, st.DeviceRx = ds.TxDatagrams.Load(), ds.RxDelivered.Load()
		st.NoRecv, st.Overdraft = ds.RxNoRecv.Load(), ds.RxSRQOverdraft.Load()
		st.PoolFree = engine.srq.Len()
		st.Device = counters(ds)
	}
	b, _ := json.Marshal(st)
	tmp := statsPath + ".tmp"
	if os.WriteFile(tmp, append(b, '\n'), 0o644) == nil {
		os.Rename(tmp, statsPath)
	}
}
