package qp

import (
	"fmt"
	"net"

	"github.com/udiwarp/udiwarp/llp"
	"golang.org/x/sys/unix"
)

// BindConn makes conn, a bound UDP socket opened elsewhere, one of the
// device's sockets, as Bind does for the sockets it opens itself: its
// datagram QPs send and receive on it, and Close closes it. It is how
// the LD_PRELOAD engine (socketshim/preload) runs a QP over the very
// socket an unmodified program created and bound, so that peers reach it
// at the address the program chose. conn's socket options (buffer sizes,
// a connected peer) stay as they are, except the buffer sizes the device
// configuration sets.
func (d *Device) BindConn(conn *net.UDPConn) (*Socket, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: no connection", ErrInvalidAttr)
	}
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if _, ok := conn.LocalAddr().(*net.UDPAddr); !ok {
		return nil, fmt.Errorf("%w: the connection has no local UDP address", ErrInvalidAttr)
	}
	return d.adopt(conn)
}

// BindFD makes fd, a bound UDP socket's descriptor that stays its
// caller's, one of the device's sockets: a manual one. The device starts
// no goroutine to read it and changes none of its options; the caller
// reads it with Progress, typically when the descriptor polls readable,
// so the kernel's queue (bounded by the socket's own SO_RCVBUF) is the
// only receive buffering and readiness is the kernel's. Sends go out
// directly, a datamover goroutine starting only if one has to wait.
// The device never closes fd: Close leaves it to the caller, and SetFD
// follows it to a duplicate. It is how the LD_PRELOAD engine runs the
// sockets of an unmodified program at one descriptor each, with no
// memory per idle socket beyond its QP.
func (d *Device) BindFD(fd int) (*Socket, error) {
	if fd < 0 {
		return nil, fmt.Errorf("%w: descriptor %d", ErrInvalidAttr, fd)
	}
	if d.closed.Load() {
		return nil, ErrClosed
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, fmt.Errorf("qp: descriptor %d: %w", fd, err)
	}
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_DGRAM {
		return nil, fmt.Errorf("%w: descriptor %d is not a datagram socket", ErrInvalidAttr, fd)
	}
	if _, ok := sa.(*unix.SockaddrInet4); !ok {
		if _, ok := sa.(*unix.SockaddrInet6); !ok {
			return nil, fmt.Errorf("%w: descriptor %d is not a UDP socket", ErrInvalidAttr, fd)
		}
	}
	u, err := llp.NewUDPFD(fd, d.cfg.RecvBatch)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidAttr, err)
	}
	s := newLinkSocket(d, u, true)
	return s, d.addSocket(s)
}

// BindLink makes l, a lower layer opened elsewhere (an AF_XDP socket,
// llp.OpenXDP; an in-memory link, llp.MemNet), one of the device's
// sockets, as Bind does for the kernel UDP sockets it opens: its datagram
// QPs send and receive on it, and Close closes it. The wire is the same
// whatever the link: a peer on another kind of link talks to it.
func (d *Device) BindLink(l llp.Link) (*Socket, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: no link", ErrInvalidAttr)
	}
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if la := l.LocalAddr(); !la.IsValid() || la.Port() == 0 {
		return nil, fmt.Errorf("%w: the link has no local address", ErrInvalidAttr)
	}
	s := newLinkSocket(d, l, false)
	if err := d.addSocket(s); err != nil {
		return nil, err
	}
	return s, nil
}
