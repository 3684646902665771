// Package rds is the RDS zerocopy interface (rds-rdma(7), seed 001) over
// udiwarp's reliable datagram (RD) queue pairs: one participant (the
// client) maps some of its memory and passes the handle, the RDMA cookie,
// to the other (the server), which moves data to or from that memory with
// an RDMA Write or Read that is combined atomically with a message, the
// RDMA ACK: the client receives the ACK only if the RDMA succeeded, and
// never both the ACK and a failed RDMA.
//
// A Socket is one endpoint on its own device, with one RD QP, addressed
// by its UDP address. Control messages are Go values passed to SendMsg
// and returned by RecvMsg:
//
//	client: SendMsg(req, server, MapControl{Buf: buf, Flags: UseOnce, Cookie: &c})
//	server: n, from, ctrl, _ := RecvMsg(b)    // ctrl holds DestControl{Cookie: c}
//	server: SendMsg(ack, from, ArgsControl{Cookie: c, Remote: Range{0, 4096},
//	                Local: [][]byte{data}, Flags: ReadWrite | NotifyMe, Token: 7})
//	client: RecvMsg(b)                        // the ACK: buf holds data
//	server: RecvMsg(b)                        // StatusControl{Token: 7, Status: StatusSuccess}
//
// The socket options of rds-rdma(7) are methods: GetMR (RDS_GET_MR),
// FreeMR (RDS_FREE_MR), SetRecvErr and RecvErr (RDS_RECVERR). Cancel
// cancels operations whose ACK has not left yet (status CANCELED). The
// man page's limits are Options.MaxTransfer and Options.MaxMappings.
//
// # Design
//
// Cookie: the low 32 bits are the STag of the region registered for the
// mapping, the high 32 bits the offset of the mapped bytes in it, as
// Linux lays out rds_rdma_cookie_t (here always 0: a region is registered
// exactly over the mapped bytes, with no page alignment to make up for).
// An RDMA request (a message with a MapControl or DestControl) carries
// the region's base tagged offset (0: udiwarp regions are zero-based, the
// offset never reveals a buffer's address) and its length beside the
// cookie, and the server's socket remembers them per peer and cookie
// (Options.MaxPeerCookies; past it, the oldest of the hosts that hold the
// most is forgotten, so one host's requests never flush the cookies of a
// host that holds fewer). A cookie is usable by a server that received
// it in an RDMA request from that client, as the
// man page's exchange does; one a server got any other way, or forgot,
// fails its operation with StatusRemoteError without touching the wire.
//
// Atomicity: an operation's RDMA work requests are posted when SendMsg
// is called, and its ACK, a Send on the same RD QP, only once every one
// of them completed successfully; an RD work request completes when the
// peer acknowledged all of it, so the ACK reaches the client after the
// data was placed (a Write) or fetched (a Read). An RDMA that fails — a
// remote access error (bad, freed, invalidated or used cookie, range past
// the region), a peer that vanished, a cancel — sends no ACK at all.
// Every operation is therefore fenced; Fence is accepted and implied.
// Messages to one peer leave in SendMsg order, an ACK waiting for its
// RDMA holds back the messages sent after it.
//
// Notifications: one per operation at most, when the operation ends (its
// local buffers are then no longer used): always with NotifyMe, on
// failure with RECVERR on. An operation that may produce one reserves
// room when SendMsg admits it, so the queue (Options.MaxNotifications)
// never overflows; SendMsg fails with ErrNoBufs (ENOBUFS) when it is
// full, and RecvMsg returns queued notifications before messages.
//
// Invalidation: a released mapping (FreeMR, or the ACK of a UseOnce
// cookie) stays valid for RDMA until the released mappings are
// invalidated together — when Options.LazyFlush of them accumulate, when
// a new mapping needs room, or on FreeMR(0, Invalidate) — unless the
// mapping or the FreeMR call has Invalidate, which invalidates it at
// once, as rds-rdma(7) describes. Invalidating revokes remote access
// before FreeMR returns (qp.MR.Invalidate) even while a server's RDMA
// Read of the mapping is in flight: that Read fails (StatusRemoteError,
// no ACK) and every later RDMA with the cookie does too; the region is
// deregistered once the Read Responses already sent are acknowledged. A server also refuses to use a UseOnce
// cookie twice itself (StatusRemoteError), so the second use fails even
// before the client's ACK arrived.
package rds

import (
	"fmt"
	"net/netip"
	"syscall"
)

// Cookie is the RDMA cookie (rds_rdma_cookie_t): an opaque 64-bit handle
// for a mapped memory range of a client. The zero Cookie names nothing.
type Cookie uint64

// makeCookie lays out a cookie as Linux does: key low, offset high.
func makeCookie(stag, off uint32) Cookie { return Cookie(uint64(off)<<32 | uint64(stag)) }

// STag returns the steering tag (R_Key) of the cookie's region.
func (c Cookie) STag() uint32 { return uint32(c) }

// Offset returns the offset of the mapped bytes in the cookie's region.
func (c Cookie) Offset() uint32 { return uint32(c >> 32) }

func (c Cookie) String() string { return fmt.Sprintf("cookie %#08x+%d", c.STag(), c.Offset()) }

// MapFlags modify a mapping (rds_get_mr_args.flags, rds_free_mr_args.flags).
type MapFlags uint64

const (
	// Invalidate invalidates the mapping at once when it is released
	// (RDS_RDMA_INVALIDATE), instead of lazily.
	Invalidate MapFlags = 0x0004
	// UseOnce releases the mapping when the RDMA ACK for it arrives
	// (RDS_RDMA_USE_ONCE).
	UseOnce MapFlags = 0x0008
)

func (f MapFlags) String() string { return flagString(uint64(f), mapFlagNames) }

// ArgsFlags modify an RDMA operation (rds_rdma_args.flags).
type ArgsFlags uint64

const (
	// ReadWrite makes the operation an RDMA Write from the server's local
	// memory to the client's; without it, it is an RDMA Read of the
	// client's memory into the server's (RDS_RDMA_READWRITE).
	ReadWrite ArgsFlags = 0x0001
	// Fence fences the RDMA off the ACK (RDS_RDMA_FENCE). Every operation
	// here is fenced: the ACK leaves only after the RDMA completed.
	Fence ArgsFlags = 0x0002
	// NotifyMe asks for a notification when the operation ends, successful
	// or not, carrying the Token (RDS_RDMA_NOTIFY_ME).
	NotifyMe ArgsFlags = 0x0020
)

func (f ArgsFlags) String() string { return flagString(uint64(f), argsFlagNames) }

var (
	mapFlagNames  = []flagName{{uint64(Invalidate), "Invalidate"}, {uint64(UseOnce), "UseOnce"}}
	argsFlagNames = []flagName{{uint64(ReadWrite), "ReadWrite"}, {uint64(Fence), "Fence"}, {uint64(NotifyMe), "NotifyMe"}}
)

type flagName struct {
	bit  uint64
	name string
}

func flagString(v uint64, names []flagName) string {
	s := ""
	for _, n := range names {
		if v&n.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += n.name
			v &^= n.bit
		}
	}
	if v != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", v)
	}
	if s == "" {
		return "0"
	}
	return s
}

// Status is the outcome of an RDMA operation, as a notification reports
// it (rds_rdma_notify.status); the values are Linux's.
type Status int32

const (
	StatusSuccess     Status = 0 // RDS_RDMA_SUCCESS: the RDMA succeeded and its ACK was delivered
	StatusRemoteError Status = 1 // RDS_RDMA_REMOTE_ERROR: a remote access error (cookie, offset, size)
	StatusCanceled    Status = 2 // RDS_RDMA_CANCELED: canceled by the application (Cancel, Close)
	// StatusDropped (RDS_RDMA_DROPPED): the peer stopped answering or
	// restarted; the RDMA may have been carried out in part, or in full
	// with its ACK lost.
	StatusDropped    Status = 3
	StatusOtherError Status = 4 // RDS_RDMA_OTHER_ERROR: any other failure
)

func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusRemoteError:
		return "remote error"
	case StatusCanceled:
		return "canceled"
	case StatusDropped:
		return "dropped"
	case StatusOtherError:
		return "other error"
	}
	return fmt.Sprintf("status %d", int32(s))
}

// Control is a control message (ancillary data) of SendMsg or RecvMsg:
// MapControl, DestControl, ArgsControl, StatusControl.
type Control interface{ control() }

// MapControl (RDS_CMSG_RDMA_MAP) maps Buf for RDMA and sends the cookie
// with the message, which makes it an RDMA request. The cookie is stored
// in *Cookie if Cookie is not nil (cookie_addr). Buf must not be empty
// nor longer than Options.MaxTransfer; it stays in use by peers until the
// mapping is released and invalidated.
type MapControl struct {
	Buf    []byte
	Flags  MapFlags
	Cookie *Cookie
}

// DestControl (RDS_CMSG_RDMA_DEST) sends a cookie the client already has
// with the message, making it an RDMA request; RecvMsg returns one with
// every RDMA request it receives.
type DestControl struct {
	Cookie Cookie
}

// Range is a window of a mapped region: Offset bytes from its start, Len
// bytes long (rds_rdma_args.remote_vec).
type Range struct {
	Offset, Len uint64
}

// ArgsControl (RDS_CMSG_RDMA_ARGS) makes the message the RDMA ACK of an
// RDMA operation on the client's memory named by Cookie: Remote is the
// window in it, Local the server's buffers (at most MaxLocalVecs; their
// lengths must add up to Remote.Len). The buffers must not be touched
// until the operation ended (a NotifyMe notification says when).
type ArgsControl struct {
	Cookie Cookie
	Remote Range
	Local  [][]byte
	Flags  ArgsFlags
	Token  uint32
}

// StatusControl (RDS_CMSG_RDMA_STATUS) is a notification RecvMsg returns
// when an RDMA operation ended: the Token it was given, its Status, and
// the peer it was for.
type StatusControl struct {
	Token  uint32
	Status Status
	Peer   netip.AddrPort
}

func (MapControl) control()    {}
func (DestControl) control()   {}
func (ArgsControl) control()   {}
func (StatusControl) control() {}

// MaxLocalVecs is the most local buffers an ArgsControl may name.
const MaxLocalVecs = 16

// Error is an error of this package with the errno rds-rdma(7) gives it:
// errors.Is(err, syscall.EINVAL) holds for an Error whose Errno is EINVAL.
type Error struct {
	Msg   string
	Errno syscall.Errno
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the errno.
func (e *Error) Unwrap() error { return e.Errno }

// The errors of rds-rdma(7) and the package's own, each wrapping its
// errno; the returned errors wrap these, with details.
var (
	// ErrMappingLimit (EAGAIN): Options.MaxMappings mappings exist.
	ErrMappingLimit = &Error{"rds: mapping limit reached", syscall.EAGAIN}
	// ErrConflict (EINVAL): conflicting control messages (two maps, a map
	// and a dest, two dests, two args).
	ErrConflict = &Error{"rds: conflicting control messages", syscall.EINVAL}
	// ErrTooLarge (EINVAL): a mapping or an RDMA longer than
	// Options.MaxTransfer.
	ErrTooLarge = &Error{"rds: range larger than the maximum transfer", syscall.EINVAL}
	// ErrSizeMismatch (EINVAL): the local buffers of an ArgsControl do not
	// add up to the remote range's length.
	ErrSizeMismatch = &Error{"rds: local and remote sizes differ", syscall.EINVAL}
	// ErrBadCookie (EINVAL): a DestControl or FreeMR names no mapping of
	// this socket, or an ArgsControl the zero cookie.
	ErrBadCookie = &Error{"rds: no such mapping", syscall.EINVAL}
	// ErrInvalid (EINVAL): any other bad argument.
	ErrInvalid = &Error{"rds: invalid argument", syscall.EINVAL}
	// ErrNoMapping (EBUSY): the device could not register the memory (its
	// memory-region table is full).
	ErrNoMapping = &Error{"rds: cannot register the memory", syscall.EBUSY}
	// ErrNoBufs (ENOBUFS): the notification queue has no room for the
	// notification the operation may produce; read notifications first.
	ErrNoBufs = &Error{"rds: notification queue full", syscall.ENOBUFS}
	// ErrMessageTooLong (EMSGSIZE): a message longer than MaxMessage.
	ErrMessageTooLong = &Error{"rds: message too long", syscall.EMSGSIZE}
)

// errorf wraps sentinel with details.
func errorf(sentinel *Error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}
