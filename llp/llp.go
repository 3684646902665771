// Package llp is udiwarp's lower layer: what the datagram engines (UD,
// RD, Write-Record) need of a network, and nothing else. A Link moves
// batches of UDP datagrams between buffers its caller owns and the
// network, each datagram with its address; it never waits in Read or
// Write, and parks only in WaitReadable and WaitWritable.
//
// Three links implement it:
//
//   - UDP (udp_linux.go): a kernel UDP socket, with recvmmsg batches,
//     GSO trains (UDP_SEGMENT), GRO reads and IP_PKTINFO;
//   - XDP (xdp_linux.go): an AF_XDP socket on one queue of an interface,
//     with the stack building and checking Ethernet, IP and UDP itself;
//   - Mem (mem.go): an in-memory network, for tests and simulations.
//
// Impaired (impair.go) wraps any of them with a seeded lossy link.
//
// The shape of the interface follows wireguard-go's conn.Bind: batches of
// caller-owned buffers, so that placing a datagram directly in a posted
// receive (qp's landing) is only a choice of buffers made above it.
package llp

import (
	"errors"
	"net/netip"
)

// Link is a lower layer: a UDP endpoint that reads and writes batches of
// datagrams. Read and Write may run in different goroutines at once;
// several goroutines may Write at once; one goroutine Reads at a time.
type Link interface {
	// Read reads up to len(ms) datagrams without waiting, each into the
	// Bufs of its Msg in order, and fills in N, Trunc, Segment, Addr and
	// the destination (Msg.Dst). It returns how many it read (0 when none
	// is queued), and ErrClosed once the link is closed.
	Read(ms []Msg) (int, error)
	// Write sends ms in order without waiting: each Msg is one datagram,
	// the concatenation of its Bufs, or, with Segment > 0, a train of
	// datagrams of Segment bytes each (the last may be shorter), to Addr.
	// The buffers are free again when Write returns. It returns how many
	// it sent, with ErrWouldBlock when the link could take no more now,
	// ErrClosed once closed, ErrTrains or ErrTrainTooBig when it refused a
	// train (send its datagrams one by one), or another error for the
	// first Msg it could not send (which a caller drops).
	Write(ms []Msg) (int, error)
	// WaitReadable and WaitWritable park until a Read or a Write may make
	// progress; they return ErrClosed once the link is closed.
	WaitReadable() error
	WaitWritable() error
	// LocalAddr is the address and port the link receives on.
	LocalAddr() netip.AddrPort
	// Caps says what the link can do.
	Caps() Caps
	// Close closes the link: reads, writes and waits in flight return
	// ErrClosed. Closing twice does nothing.
	Close() error
}

// Caps describes a link.
type Caps struct {
	// Kind names the implementation: "udp", "xdp" or "mem".
	Kind string
	// MaxDatagram is the largest UDP payload one datagram may carry.
	MaxDatagram int
	// MaxTrain is the most datagrams one Msg with Segment > 0 may hold
	// (1: the link takes no trains).
	MaxTrain int
	// GRO: a Read may return several datagrams merged in one Msg, each
	// of Segment bytes (the last may be shorter).
	GRO bool
	// Detail is one line on how the link runs (an XDP link's mode, queue
	// and whether it is zero-copy).
	Detail string
}

// Msg is one datagram (or train, or GRO read) of a batch.
type Msg struct {
	// Bufs are the caller's buffers: filled in order by Read, sent
	// concatenated by Write.
	Bufs [][]byte
	// N is how many bytes Read placed in Bufs, or Write sent.
	N int
	// Trunc: the datagram was longer than Bufs (Read).
	Trunc bool
	// Segment is the size of each datagram of a train (Write) or of a
	// GRO read (Read); 0 for a single datagram.
	Segment int
	// Addr is the source (Read) or the destination (Write).
	Addr netip.AddrPort

	// The datagram's destination as the link saw it (Dst): set by the
	// link that read it, or parsed on demand from ctl, the socket's
	// control messages.
	dst     netip.Addr
	unicast bool
	dstOK   bool
	ctl     []byte
}

// Dst returns the address the datagram was sent to, whether that was a
// unicast address of this host (not multicast or broadcast), and false
// when the link cannot tell.
func (m *Msg) Dst() (dst netip.Addr, unicast, ok bool) {
	if m.ctl != nil {
		return pktinfoDst(m.ctl)
	}
	return m.dst, m.unicast, m.dstOK
}

// SetDst records a datagram's destination, for a link or a test that
// builds Msgs itself.
func (m *Msg) SetDst(dst netip.Addr, unicast bool) {
	m.ctl = nil
	m.dst, m.unicast, m.dstOK = dst, unicast, dst.IsValid()
}

// SetDstFrom gives m the destination o has (Dst), as o has it: parsed
// on demand from o's control messages, which stay o's link's until its
// next Read. A link that wraps another (package protect) hands its
// reads' destinations up this way without parsing them.
func (m *Msg) SetDstFrom(o *Msg) {
	m.ctl, m.dst, m.unicast, m.dstOK = o.ctl, o.dst, o.unicast, o.dstOK
}

// Len is the sum of the lengths of Bufs.
func (m *Msg) Len() int {
	n := 0
	for _, b := range m.Bufs {
		n += len(b)
	}
	return n
}

var (
	// ErrClosed is returned once a link is closed.
	ErrClosed = errors.New("llp: link closed")
	// ErrWouldBlock: the link cannot take a datagram now; WaitWritable.
	ErrWouldBlock = errors.New("llp: link full")
	// ErrTrains: the link takes no trains (the kernel refused
	// UDP_SEGMENT); send each datagram alone from now on.
	ErrTrains = errors.New("llp: trains not supported")
	// ErrTrainTooBig: a train's datagrams are larger than the path takes
	// in a train (the route's MTU; a datagram sent alone may be
	// fragmented where a train's is not): send datagrams this large
	// alone.
	ErrTrainTooBig = errors.New("llp: train segments exceed the path MTU")
	// ErrUnsupported: the link cannot do what was asked (an option of
	// another kind of link).
	ErrUnsupported = errors.New("llp: not supported by this link")
)

// Scatter copies b into bufs in order and returns how much fit: what a
// link's Read does with a datagram it holds in a buffer of its own (a
// link that wraps another, package protect, too).
func Scatter(bufs [][]byte, b []byte) int {
	n := 0
	for _, d := range bufs {
		if len(b) == 0 {
			break
		}
		k := copy(d, b)
		b = b[k:]
		n += k
	}
	return n
}

// gather appends the concatenation of bufs to dst.
func gather(dst []byte, bufs [][]byte) []byte {
	for _, b := range bufs {
		dst = append(dst, b...)
	}
	return dst
}
