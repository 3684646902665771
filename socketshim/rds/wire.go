package rds

import "encoding/binary"

// Every message is one RD Send whose payload starts with this header:
//
//	0      magic 0xD5
//	1      version 1
//	2      extensions: 1 an RDMA request follows, 2 an RDMA ACK follows
//	3      reserved, 0
//	[RDMA request, 32 bytes: cookie u64, region address u64, region
//	 length u64, map flags u32, reserved u32]
//	[RDMA ACK, 8 bytes: the cookie of the completed operation]
//	the application's message
//
// All fields big-endian. The request extension is RDS's RDMA destination
// extension header, with what udiwarp needs to address the region; the
// ACK extension is RDS's RDMA extension header, which releases a UseOnce
// mapping at the client.
const (
	hdrMagic   = 0xD5
	hdrVersion = 1
	extRequest = 1 << 0
	extAck     = 1 << 1
	hdrFixed   = 4
	reqExtSize = 32
	ackExtSize = 8
	hdrMax     = hdrFixed + reqExtSize + ackExtSize
)

// request is an RDMA request's extension: the client's region for cookie.
type request struct {
	cookie Cookie
	addr   uint64
	length uint64
	flags  MapFlags
}

// header is a parsed message header.
type header struct {
	hasReq, hasAck bool
	req            request
	ack            Cookie
	size           int // header bytes
}

// appendHeader writes the header into b (at least hdrMax bytes) and
// returns its length.
func putHeader(b []byte, req *request, ack Cookie) int {
	b[0], b[1], b[2], b[3] = hdrMagic, hdrVersion, 0, 0
	n := hdrFixed
	if req != nil {
		b[2] |= extRequest
		binary.BigEndian.PutUint64(b[n:], uint64(req.cookie))
		binary.BigEndian.PutUint64(b[n+8:], req.addr)
		binary.BigEndian.PutUint64(b[n+16:], req.length)
		binary.BigEndian.PutUint32(b[n+24:], uint32(req.flags))
		binary.BigEndian.PutUint32(b[n+28:], 0)
		n += reqExtSize
	}
	if ack != 0 {
		b[2] |= extAck
		binary.BigEndian.PutUint64(b[n:], uint64(ack))
		n += ackExtSize
	}
	return n
}

// parseHeader parses the header at the start of b.
func parseHeader(b []byte) (h header, ok bool) {
	if len(b) < hdrFixed || b[0] != hdrMagic || b[1] != hdrVersion || b[2]&^(extRequest|extAck) != 0 || b[3] != 0 {
		return h, false
	}
	n := hdrFixed
	if b[2]&extRequest != 0 {
		if len(b) < n+reqExtSize {
			return h, false
		}
		h.hasReq = true
		h.req = request{cookie: Cookie(binary.BigEndian.Uint64(b[n:])), addr: binary.BigEndian.Uint64(b[n+8:]),
			length: binary.BigEndian.Uint64(b[n+16:]), flags: MapFlags(binary.BigEndian.Uint32(b[n+24:]))}
		if h.req.cookie == 0 || h.req.length == 0 || h.req.flags&^(UseOnce|Invalidate) != 0 {
			return h, false
		}
		n += reqExtSize
	}
	if b[2]&extAck != 0 {
		if len(b) < n+ackExtSize {
			return h, false
		}
		h.hasAck = true
		h.ack = Cookie(binary.BigEndian.Uint64(b[n:]))
		n += ackExtSize
	}
	h.size = n
	return h, true
}
