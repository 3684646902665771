package qp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// RC on the caller's descriptor: the sockets preload runs a program's
// own TCP socket as an RC QP, so that the socket stays the program's
// (one descriptor, its options, its readiness) and nothing reads it
// behind the program's back. ConnectFD and AcceptFD run MPA's exchange
// on the descriptor and attach it; the caller then drives the receive
// side with Progress (when the descriptor is readable, or after a
// PostRecv that a waiting Send needs) and closes the descriptor itself.
// What TCP cannot take at once is sent by the device's poller, which
// waits on the descriptor only while it holds such output.

// ErrNotMPA is AcceptFD's error when the peer's first bytes are not an
// MPA Request: nothing was read from the descriptor (the caller may go
// on with it as a plain TCP stream), and q is unchanged.
var ErrNotMPA = errors.New("qp: the peer's first bytes are not an MPA Request")

// mpaRequestKey begins every MPA Request (RFC 5044 §7.1).
const mpaRequestKey = "MPA ID Req Frame"

// ConnectFD runs the initiator's side of MPA's exchange on fd, a
// connected TCP socket the caller keeps, and attaches it to q, an RC QP
// in INIT, which moves to RTS. It waits (in poll, whatever fd's blocking
// mode) at most cfg.Timeout. It returns the peer's private data.
func (q *QP) ConnectFD(fd int, cfg RCConfig) ([]byte, error) {
	if err := q.checkFD(&cfg); err != nil {
		return nil, err
	}
	s := fdStream{fd: fd, deadline: time.Now().Add(cfg.Timeout)}
	neg, pd, early, err := initiate(s, &cfg)
	if err != nil {
		return nil, err
	}
	if err := q.attachRC(nil, fd, neg, cfg, early, true); err != nil {
		return nil, err
	}
	return pd, nil
}

// AcceptFD runs the responder's side of MPA's exchange on fd, a TCP
// socket the caller accepted and keeps: it waits at most cfg.Timeout for
// the peer's whole MPA Request, answers it with a Reply carrying cfg's
// private data, and attaches fd to q, an RC QP in INIT, which moves to
// RTS. It returns the initiator's private data. When the peer's first
// bytes are not an MPA Request, it returns ErrNotMPA having read nothing.
// On a non-blocking descriptor (O_NONBLOCK) it never waits for the
// peer: a Request not all there yet is ErrMPAIncomplete, with nothing
// read and q unchanged (MPARequestNeed says what is missing).
func (q *QP) AcceptFD(fd int, cfg RCConfig) ([]byte, error) {
	if err := q.checkFD(&cfg); err != nil {
		return nil, err
	}
	s := fdStream{fd: fd, deadline: time.Now().Add(cfg.Timeout)}
	if err := s.awaitRequest(); err != nil {
		return nil, err
	}
	req, early, err := readMPAFrame(s)
	if err != nil {
		return nil, err
	}
	if req.Reply() {
		return nil, fmt.Errorf("%w: an MPA Reply where a Request was due", ErrNotMPA)
	}
	neg, err := respond(s, req, &cfg)
	if err != nil {
		return nil, err
	}
	if err := q.attachRC(nil, fd, neg, cfg, early, false); err != nil {
		return nil, err
	}
	return append([]byte(nil), req.PrivateData()...), nil
}

// ErrMPAIncomplete is AcceptFD's error on a non-blocking descriptor
// whose peer has not sent its whole MPA Request yet (it is EAGAIN).
var ErrMPAIncomplete = fmt.Errorf("qp: the MPA Request has not all arrived: %w", unix.EAGAIN)

// MPARequestNeed looks at what waits on fd, a TCP socket the caller
// accepted, reading nothing and never waiting (MSG_PEEK): 0 when a whole
// MPA Request is there (AcceptFD takes it at once), else how many bytes
// the Request needs in all, from the stream's start — at least 20, the
// header's; with SO_RCVLOWAT at that, the socket polls readable when
// they are there or the peer has ended. ErrNotMPA: the bytes there are
// not an MPA Request; io.EOF: the peer ended before sending any; an
// error of package udiwarp: a Request that is bogus (a Reply's key, a
// revision or private data length no Request has).
func MPARequestNeed(fd int) (int, error) {
	_, need, err := peekRequest(fd)
	return need, err
}

// PeekMPARequest returns the private data of the whole MPA Request
// waiting on fd, a TCP socket the caller accepted, reading nothing
// (MSG_PEEK) and never waiting: so that a listener can show it to the
// application (libfabric's FI_CONNREQ) before AcceptFD or RejectFD
// answers it. ErrMPAIncomplete: it has not all arrived (MPARequestNeed
// says how much it needs); the other errors are MPARequestNeed's.
func PeekMPARequest(fd int) ([]byte, error) {
	m, need, err := peekRequest(fd)
	switch {
	case err != nil:
		return nil, err
	case need > 0:
		return nil, ErrMPAIncomplete
	}
	return append([]byte(nil), m.PrivateData()...), nil
}

// peekRequest looks at what waits on fd without reading it or waiting:
// the whole MPA Request (a copy), or else need, the bytes it needs in
// all; the errors are MPARequestNeed's.
func peekRequest(fd int) (m udiwarp.MPAFrame, need int, err error) {
	var b [udiwarp.MPAFrameHeaderSize + udiwarp.MaxMPAPrivateData]byte
	for {
		n, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			n = 0
		case err != nil:
			return nil, 0, err
		case n == 0:
			return nil, 0, io.EOF
		}
		if k := min(n, len(mpaRequestKey)); string(b[:k]) != mpaRequestKey[:k] {
			return nil, 0, ErrNotMPA
		}
		m, whole, need, err := udiwarp.ParseMPAFrame(b[:n])
		if err != nil || whole == 0 {
			return nil, need, err
		}
		return append(udiwarp.MPAFrame(nil), m...), 0, nil
	}
}

// RejectFD refuses the connection on fd, a TCP socket the caller
// accepted: it reads the peer's MPA Request (waiting at most timeout for
// all of it) and answers with a Reply with R set carrying privateData,
// in the Request's revision, as RCRequest.Reject does; the initiator's
// ConnectFD or Connect returns a *RejectError with it. The caller closes
// fd.
func RejectFD(fd int, privateData []byte, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	s := fdStream{fd: fd, deadline: time.Now().Add(timeout)}
	if err := s.awaitRequest(); err != nil {
		return err
	}
	req, _, err := readMPAFrame(s)
	if err != nil {
		return err
	}
	if req.Reply() {
		return fmt.Errorf("%w: an MPA Reply where a Request was due", ErrNotMPA)
	}
	f := udiwarp.MPAFrameFields{Reply: true, Reject: true, Revision: req.Revision(), PrivateData: privateData}
	if f.Revision >= udiwarp.MPARevision2 {
		f.Enhanced = true
	}
	b, err := udiwarp.AppendMPAFrame(nil, &f)
	if err != nil {
		return err
	}
	_, err = s.Write(b)
	return err
}

func (q *QP) checkFD(cfg *RCConfig) error {
	if q.typ != RC {
		return fmt.Errorf("%w: an RC connection on a %v QP", ErrInvalidAttr, q.typ)
	}
	if err := cfg.fill(); err != nil {
		return err
	}
	if cfg.CompleteOnAck {
		return fmt.Errorf("%w: CompleteOnAck needs the device's poller to read the connection; a descriptor's is read by Progress", ErrInvalidAttr)
	}
	if st := q.State(); st != StateInit {
		return fmt.Errorf("%w: an RC connection on a QP in %v (want INIT)", ErrQPState, st)
	}
	return nil
}

// Progress handles what an RC QP's descriptor holds (ConnectFD,
// AcceptFD): it reads the socket without waiting, places and completes
// every whole message, and retries a Send that waited for a receive
// (WaitForRecv); then it sends what the socket could not take before.
// On a QP the device reads itself it only does the sending.
func (q *QP) Progress() {
	c := q.rc.Load()
	if c == nil {
		return
	}
	if c.manual {
		c.onReadable()
	}
	c.onWritable() // what the socket held back, as the poller sends it
}

// PeerClosed reports whether the peer of an RC QP on the caller's
// descriptor has closed its sending side (TCP's FIN came): nothing more
// will arrive, and everything before it has been handled. Sending goes
// on until the caller shuts the descriptor down.
func (q *QP) PeerClosed() bool {
	c := q.rc.Load()
	return c != nil && c.eof.Load()
}

// RecvWaiting reports whether a Send waits for a receive on an RC QP
// with WaitForRecv: the next Progress after a PostRecv completes it.
// A caller that reposts a receive as it consumes one calls Progress then
// if this says so — nothing else will, since the Send's bytes have left
// the socket.
func (q *QP) RecvWaiting() bool {
	c := q.rc.Load()
	return c != nil && c.stalled.Load()
}

// SendQueued reports whether the QP holds Sends it has not finished
// with. An RC QP: FPDUs TCP has not taken yet (the socket's buffer is
// full), which the device's poller sends as room comes. An RD QP: WRs
// not yet complete — not every segment acknowledged by the peer, nor
// failed — whose frames the device's timer sends again, or that wait
// for the peer's handshake or window; a caller that closes the QP once
// this is false drops nothing it sent (the LD_PRELOAD engine's close and
// exit wait for it).
func (q *QP) SendQueued() bool {
	if q.rd != nil {
		return q.rd.unfinished()
	}
	c := q.rc.Load()
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.dead && (len(c.rest) > 0 || len(c.queue) > 0)
}

// fdStream reads and writes a TCP socket the caller owns, in whatever
// blocking mode it is, waiting in poll until deadline: MPA's exchange.
type fdStream struct {
	fd       int
	deadline time.Time
}

func (s fdStream) wait(events int16) error {
	for {
		left := time.Until(s.deadline)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		p := []unix.PollFd{{Fd: int32(s.fd), Events: events}}
		_, err := unix.Poll(p, int(left/time.Millisecond)+1)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

func (s fdStream) Read(b []byte) (int, error) {
	for {
		n, _, err := unix.Recvfrom(s.fd, b, unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN:
			if err := s.wait(unix.POLLIN); err != nil {
				return 0, err
			}
			continue
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (s fdStream) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, err := unix.SendmsgN(s.fd, b[done:], nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch {
		case err == unix.EAGAIN:
			if err := s.wait(unix.POLLOUT); err != nil {
				return done, err
			}
			continue
		case err == unix.EINTR:
			continue
		case err != nil:
			return done, err
		}
		done += n
	}
	return done, nil
}

// awaitRequest waits until a whole MPA Request is on the socket,
// reading nothing: with SO_RCVLOWAT at what it needs, poll wakes when
// all of it is there (or the peer ended), not at every byte. On a
// non-blocking descriptor it does not wait (ErrMPAIncomplete).
func (s fdStream) awaitRequest() error {
	fl, err := unix.FcntlInt(uintptr(s.fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	lowat := -1 // the socket's own, while ours is set
	defer func() {
		if lowat >= 0 {
			unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, lowat)
		}
	}()
	for {
		need, err := MPARequestNeed(s.fd)
		if err != nil || need == 0 {
			return err
		}
		if fl&unix.O_NONBLOCK != 0 {
			return ErrMPAIncomplete
		}
		if lowat < 0 {
			if lowat, err = unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT); err != nil {
				return err
			}
		}
		if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, need); err != nil {
			return err
		}
		ended, err := s.waitIn()
		if err != nil {
			return err
		}
		if ended {
			if need, err := MPARequestNeed(s.fd); err != nil || need == 0 {
				return err
			}
			return fmt.Errorf("qp: reading the MPA Request: %w", io.ErrUnexpectedEOF)
		}
	}
}

// waitIn waits until the socket is readable (as its SO_RCVLOWAT says) or
// the peer has ended its side (ended).
func (s fdStream) waitIn() (ended bool, err error) {
	for {
		left := time.Until(s.deadline)
		if left <= 0 {
			return false, os.ErrDeadlineExceeded
		}
		p := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		_, err := unix.Poll(p, int(left/time.Millisecond)+1)
		if err == unix.EINTR {
			continue
		}
		return p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0, err
	}
}

// SetFD moves an RC QP on the caller's descriptor to fd, another
// descriptor of the same socket (the caller duplicated it and is about
// to close the one the QP used).
func (q *QP) SetFD(fd int) error {
	c := q.rc.Load()
	if c == nil || !c.manual {
		return fmt.Errorf("%w: SetFD on a QP that is not an RC connection on the caller's descriptor", ErrInvalidAttr)
	}
	c.rxMu.Lock() // the receive side takes mu under rxMu: this order
	c.mu.Lock()
	c.q.dev.rc.move(c, fd)
	c.mu.Unlock()
	c.rxMu.Unlock()
	return nil
}
