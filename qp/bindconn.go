package qp

import (
	"fmt"
	"net"
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
