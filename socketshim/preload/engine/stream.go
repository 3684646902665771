//go:build cgo && linux

package main

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/sys/unix"
)

// Stream sockets over RC (UDIWARP_PRELOAD_TCP=rc): a program's connected
// TCP socket is an RC QP on that very descriptor (qp.ConnectFD,
// AcceptFD): MPA's exchange when it connects or is accepted, then every
// write is a Send of at most the peer's receive size and every read
// takes bytes from the received Sends, in order. The engine reads the
// socket only when the program reads it or asks whether it is readable
// (qp.QP.Progress), as for datagram sockets, so the kernel's queue is
// the only buffering the program's SO_RCVBUF does not see past two
// receives; a Send that finds both taken waits in the kernel's queue
// (RCConfig.WaitForRecv), TCP's window holding the peer back. What TCP
// cannot take at once the device's poller sends.

const (
	// streamMagic begins the private data of both MPA frames, and the
	// receive size follows it (4 bytes, big-endian): a connection
	// between two preloaded programs, not some other iWARP peer.
	streamMagic = "udiwarp-stream/1"
	// streamRecvDepth receives per connection: one the program reads
	// from, one filling.
	streamRecvDepth = 2
	// streamSendDepth: Sends queued per connection while TCP's buffer
	// is full (each an inline copy of at most the peer's receive size).
	streamSendDepth = 8
	// Receive size (UDIWARP_PRELOAD_TCP_RECV): the largest message the
	// peer sends us. Pages of it are touched only as data fills them.
	defaultStreamRecv = 64 << 10
	minStreamRecv     = 4 << 10
	// defaultStreamWait bounds MPA's exchange (UDIWARP_PRELOAD_TCP_WAIT,
	// ms), and close's wait for output held back.
	defaultStreamWait = 5 * time.Second
)

var (
	streamOnce sync.Once
	streamRecv = defaultStreamRecv
	streamWait = defaultStreamWait

	streams, streamsLive, streamsPlain, streamsRefused atomic.Uint64
	streamSent, streamReceived, streamDropped          atomic.Uint64
)

func streamConfig() {
	streamOnce.Do(func() {
		if v, err := strconv.Atoi(os.Getenv("UDIWARP_PRELOAD_TCP_RECV")); err == nil && v > 0 {
			streamRecv = min(max(v, minStreamRecv), 1<<16)
		}
		if v, err := strconv.Atoi(os.Getenv("UDIWARP_PRELOAD_TCP_WAIT")); err == nil && v > 0 {
			streamWait = time.Duration(v) * time.Millisecond
		}
	})
}

// stream is one owned TCP socket: an RC QP on the program's descriptor.
type stream struct {
	fd   int
	q    *qp.QP
	rcq  *qp.CQ
	mem  []byte // the receives, mmap'd: streamRecvDepth × streamRecv
	mr   *qp.MR
	size int // our receive size
	msg  int // the largest Send we post: the peer's receive size

	rmu    sync.Mutex
	wc     [1]qp.WorkCompletion
	cur    qp.WorkCompletion // the Send being read
	off    int               // bytes of it read
	have   bool
	broken bool // the connection failed: reads and writes report ECONNRESET
	rdShut bool // shutdown(SHUT_RD): reads see the end
	rsge   [1]qp.SGE
	rwr    qp.RecvWR

	wmu    sync.Mutex
	gather []byte
}

// openStream runs an RC QP on fd, a connected TCP socket: as MPA's
// initiator (connect) or responder (accept). qp.ErrNotMPA: the peer is no
// preloaded program (a responder whose peer's first bytes are no MPA
// Request; nothing was read). A responder never waits for its peer's
// Request: one not all there yet is an *incomplete, with nothing read
// and nothing made.
func openStream(fd int, initiator bool) (*stream, error) {
	if err := start(); err != nil {
		return nil, err
	}
	if !initiator {
		need, err := qp.MPARequestNeed(fd)
		if err != nil {
			return nil, err
		}
		if need > 0 {
			return nil, &incomplete{need}
		}
	}
	streamConfig()
	s := &stream{fd: fd, size: streamRecv}
	var err error
	if s.rcq, err = engine.dev.CreateCQ(streamRecvDepth + 2); err != nil {
		return nil, err
	}
	s.q, err = engine.pd.CreateQP(qp.QPAttr{Type: qp.RC, SendCQ: engine.scq, RecvCQ: s.rcq,
		Caps: qp.QPCaps{MaxSendWR: streamSendDepth, MaxRecvWR: streamRecvDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 1 << 16}})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*stream, error) { s.release(); return nil, err }
	if err := s.q.Modify(qp.ModifyAttr{State: qp.StateInit}); err != nil {
		return fail(err)
	}
	if s.mem, err = unix.Mmap(-1, 0, streamRecvDepth*s.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		return fail(err)
	}
	if s.mr, err = engine.pd.RegisterMemory(s.mem, qp.AccessLocalWrite); err != nil {
		return fail(err)
	}
	for i := range streamRecvDepth {
		if err := s.repost(uint64(i)); err != nil {
			return fail(err)
		}
	}
	pd := make([]byte, len(streamMagic)+4)
	copy(pd, streamMagic)
	binary.BigEndian.PutUint32(pd[len(streamMagic):], uint32(s.size))
	cfg := qp.RCConfig{WaitForRecv: true, PrivateData: pd, Timeout: streamWait}
	var peer []byte
	if initiator {
		peer, err = s.q.ConnectFD(fd, cfg)
	} else {
		peer, err = s.q.AcceptFD(fd, cfg)
	}
	if err != nil {
		return fail(err)
	}
	if len(peer) != len(pd) || string(peer[:len(streamMagic)]) != streamMagic {
		return fail(errNotPreloaded)
	}
	s.msg = int(binary.BigEndian.Uint32(peer[len(streamMagic):]))
	if s.msg < minStreamRecv || s.msg > 1<<16 {
		return fail(errNotPreloaded)
	}
	return s, nil
}

// errNotPreloaded: the peer spoke MPA but is no preloaded program.
var errNotPreloaded = errors.New("the peer is not a udiwarp stream")

// incomplete: the peer's MPA Request has not all arrived; need is what
// it needs in all (qp.MPARequestNeed).
type incomplete struct{ need int }

func (e *incomplete) Error() string {
	return "the MPA Request has not all arrived (" + strconv.Itoa(e.need) + " bytes in all)"
}

func (s *stream) repost(id uint64) error {
	s.rsge[0] = s.mr.SGE(int(id)*s.size, s.size)
	s.rwr = qp.RecvWR{ID: id, SGL: s.rsge[:]}
	return s.q.PostRecv(&s.rwr)
}

// release destroys the QP and lets go of the receives (the descriptor
// stays the program's).
func (s *stream) release() {
	if s.q != nil {
		s.q.Destroy()
	}
	if s.mr != nil {
		s.mr.Deregister()
	}
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
}

// take makes sure a received Send is being read, polling the CQ and, if
// it is empty, reading the socket once. Under rmu.
func (s *stream) take() bool {
	if s.have {
		return true
	}
	for i := range 2 {
		for s.rcq.Poll(s.wc[:]) > 0 {
			wc := &s.wc[0]
			if wc.Status != qp.Success {
				s.broken = true // flushed: the connection ended in error
				continue
			}
			if wc.Len == 0 {
				s.repost(wc.ID) // an empty Send carries nothing to read
				continue
			}
			s.cur, s.off, s.have = *wc, 0, true
			return true
		}
		if i == 0 && !s.broken {
			s.q.Progress()
		}
	}
	if s.q.State() == qp.StateError {
		s.broken = true
	}
	return false
}

// ended reports a read's end: 0 (the peer's FIN, or SHUT_RD) or an error.
func (s *stream) ended() (C.longlong, bool) {
	switch {
	case s.broken:
		return -C.longlong(unix.ECONNRESET), true
	case s.rdShut, s.q.PeerClosed():
		return 0, true
	}
	return 0, false
}

// ready: data, the end or an error waits for the program. Under rmu.
func (s *stream) ready() bool {
	if s.take() {
		return true
	}
	_, end := s.ended()
	return end
}

// recv copies received bytes into the iovecs: what is there, across
// Sends, without waiting. MSG_PEEK leaves them; MSG_TRUNC drops them
// uncopied.
func (s *stream) recv(vs []unix.Iovec, flags int) C.longlong {
	want := iovLen(vs)
	if want == 0 {
		return 0
	}
	k := 0
	reposted := false
	vi, vo := 0, 0 // the iovec being filled, and the bytes in it
	peekOff := -1
	for k < want {
		if flags&msgPeek != 0 && peekOff >= 0 {
			break // a peek looks into the Send being read only
		}
		if !s.take() {
			break
		}
		off := int(s.cur.ID) * s.size
		data := s.mem[off+s.off : off+int(s.cur.Len)]
		if flags&msgPeek != 0 {
			peekOff = s.off
		}
		n := min(len(data), want-k)
		if flags&msgTrunc == 0 {
			for c := 0; c < n; {
				v := vs[vi]
				m := copy(unsafe.Slice(v.Base, int(v.Len))[vo:], data[c:n])
				c += m
				vo += m
				if vo == int(v.Len) {
					vi, vo = vi+1, 0
					for vi < len(vs) && vs[vi].Len == 0 {
						vi++
					}
				}
			}
		}
		k += n
		if flags&msgPeek != 0 {
			continue
		}
		s.off += n
		if s.off == int(s.cur.Len) {
			s.have = false
			if err := s.repost(s.cur.ID); err != nil {
				s.broken = true
			}
			reposted = true
		}
	}
	if reposted && s.q.RecvWaiting() {
		// A Send waited for the receive just given back: its bytes left
		// the socket already, so no readiness would say it is there.
		s.q.Progress()
	}
	if k > 0 {
		if flags&msgPeek == 0 {
			streamReceived.Add(uint64(k))
		}
		return C.longlong(k)
	}
	if r, end := s.ended(); end {
		return r
	}
	return -C.longlong(unix.EAGAIN)
}

// available is the byte count FIONREAD reports: what the received Sends
// hold unread.
func (s *stream) available() int {
	if !s.take() {
		return 0
	}
	return int(s.cur.Len) - s.off
}

// send posts the iovecs' bytes from skip on as Sends, as many as the
// queue takes: the count taken, -EAGAIN for none, or -EPIPE on a
// connection that ended.
func (s *stream) send(vs []unix.Iovec, skip int) C.longlong {
	reap()
	total := iovLen(vs) - skip
	if total <= 0 {
		return 0
	}
	done := 0
	for done < total {
		n := min(total-done, s.msg)
		b := s.bytes(vs, skip+done, n)
		wr := qp.SendWR{ID: ^uint64(0), Opcode: qp.OpSend, Inline: b}
		err := s.q.PostSend(&wr)
		if errors.Is(err, qp.ErrQueueFull) {
			// TCP may have room the poller has not used yet: send what is
			// held back now rather than have the program wait for it.
			s.q.Progress()
			err = s.q.PostSend(&wr)
		}
		if err != nil {
			if done > 0 {
				break
			}
			if errors.Is(err, qp.ErrQueueFull) {
				return -C.longlong(unix.EAGAIN)
			}
			return -C.longlong(unix.EPIPE)
		}
		done += n
	}
	streamSent.Add(uint64(done))
	return C.longlong(done)
}

// bytes returns n bytes of the iovecs from off on: in place when one
// iovec holds them, gathered into s.gather otherwise. Under wmu.
func (s *stream) bytes(vs []unix.Iovec, off, n int) []byte {
	for _, v := range vs {
		if off >= int(v.Len) {
			off -= int(v.Len)
			continue
		}
		if int(v.Len)-off >= n {
			return unsafe.Slice(v.Base, int(v.Len))[off : off+n]
		}
		break
	}
	s.gather = s.gather[:0]
	for _, v := range vs {
		if len(s.gather) == n {
			break
		}
		if off >= int(v.Len) {
			off -= int(v.Len)
			continue
		}
		b := unsafe.Slice(v.Base, int(v.Len))[off:]
		off = 0
		s.gather = append(s.gather, b[:min(len(b), n-len(s.gather))]...)
	}
	return s.gather
}

// drain waits, at most until deadline, for the output TCP has not taken
// yet to go: the kernel sends what it holds after a close, but what the
// engine holds must reach it first. It reports whether all went.
func (s *stream) drain(deadline time.Time) bool {
	for {
		s.q.Progress()
		if !s.q.SendQueued() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 || s.q.State() == qp.StateError {
			return false
		}
		p := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLOUT}}
		unix.Poll(p, int(min(left, 100*time.Millisecond)/time.Millisecond)+1)
	}
}

// udw_stream_open runs the connected TCP socket fd over an RC QP: as
// MPA's initiator after the program's connect (initiator != 0), or as
// its responder on a socket accept returned. It returns a handle (> 0),
// -ENOTCONN when the peer is a plain TCP program (accept: its first
// bytes are no MPA Request, and nothing was read, so the kernel may
// carry the socket), -EAGAIN when the responder's peer has not sent its
// whole MPA Request yet (nothing read, nothing made; *need is how many
// bytes the Request needs in all, for SO_RCVLOWAT), or another -errno
// when the exchange failed. The responder never waits for its peer.
//
//export udw_stream_open
func udw_stream_open(fd C.int, initiator C.int, pending *C.int, need *C.int) C.longlong {
	s, err := openStream(int(fd), initiator != 0)
	if err != nil {
		var inc *incomplete
		if errors.As(err, &inc) {
			*need = C.int(inc.need)
			return -C.longlong(unix.EAGAIN)
		}
		if errors.Is(err, qp.ErrNotMPA) {
			streamsPlain.Add(1)
			return -C.longlong(unix.ENOTCONN)
		}
		streamsRefused.Add(1)
		var e unix.Errno
		switch {
		case errors.As(err, &e):
			return -C.longlong(e)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return -C.longlong(unix.ETIMEDOUT)
		}
		return -C.longlong(unix.ECONNREFUSED)
	}
	h := install(&sock{stream: s, pending: (*int32)(unsafe.Pointer(pending))})
	streams.Add(1)
	streamsLive.Add(1)
	return h
}

// udw_stream_plain counts an accepted connection the C side left to the
// kernel: its peer's first bytes were no MPA Request (a plain TCP client).
//
//export udw_stream_plain
func udw_stream_plain() { streamsPlain.Add(1) }

// udw_stream_refused counts an accepted connection the C side shut down
// without the engine: its peer began an MPA Request and did not finish
// it within UDIWARP_PRELOAD_TCP_WAIT of the accept.
//
//export udw_stream_refused
func udw_stream_refused() { streamsRefused.Add(1) }

// udw_stream_send writes the iovecs' bytes from skip on: the count the
// engine took (at least one, unless the iovecs are empty), -EAGAIN when
// it could take none (the C side waits for the descriptor to be
// writable), -EPIPE or -ECONNRESET when the connection ended.
//
//export udw_stream_send
func udw_stream_send(h C.longlong, iov unsafe.Pointer, iovcnt C.int, skip C.longlong) C.longlong {
	s := lookup(h)
	if s == nil || s.stream == nil {
		return -C.longlong(unix.EBADF)
	}
	st := s.stream
	st.wmu.Lock()
	r := st.send(iovecs(iov, iovcnt), int(skip))
	st.wmu.Unlock()
	st.rmu.Lock()
	s.note() // a full queue's Progress may have read the socket: data may wait now
	st.rmu.Unlock()
	return r
}

// udw_shutdown carries shutdown(2) over. On a stream SHUT_RD (0) ends
// the reads; SHUT_WR (1) and SHUT_RDWR (2) first wait for what the
// engine holds to reach TCP (at most UDIWARP_PRELOAD_TCP_WAIT), for the
// C side's kernel shutdown that follows to send the FIN after it. On an
// RD datagram socket SHUT_WR and SHUT_RDWR wait for its Sends to be
// acknowledged (linger, at most UDIWARP_PRELOAD_RD_LINGER); the C side
// has stopped the program's sends already.
//
//export udw_shutdown
func udw_shutdown(h C.longlong, how C.int) C.int {
	s := lookup(h)
	if s == nil {
		return -C.int(unix.EBADF)
	}
	if s.stream == nil {
		if how != unix.SHUT_RD && !s.linger(time.Now().Add(engine.linger)) {
			rdDropped.Add(1)
		}
		return 0
	}
	st := s.stream
	if how != unix.SHUT_WR {
		st.rmu.Lock()
		st.rdShut = true
		s.note()
		st.rmu.Unlock()
	}
	if how != unix.SHUT_RD {
		st.wmu.Lock()
		if !st.drain(time.Now().Add(streamWait)) {
			streamDropped.Add(1)
		}
		st.wmu.Unlock()
	}
	return 0
}
