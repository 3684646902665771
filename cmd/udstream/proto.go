package main

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"

	"github.com/udiwarp/udiwarp/reliability"
)

// The datagram transports' framing: every datagram begins with a
// 16-byte header.
//
//	0  'U' 'S'   2  kind   3  flags   4  sequence number (big-endian)
//	8  tag: the stream's, drawn by the receiver (big-endian)
//
// flags bit 0 (tsFlag) on a data chunk: the stream is MPEG-TS, cut at
// packet boundaries.
//
// kind reqKind: a receiver asks for the stream (sent again every
// reqEvery until data comes); the tag is the one it drew for the stream,
// and 8 more bytes echo the sender's cookie for its address (0 until it
// has one). chalKind: the sender's answer to a request whose echo is not
// its cookie for the request's source: the request's tag, and 8 more
// bytes with the cookie. Only a receiver that gets what is sent to its
// address learns the cookie, so only one that proved its address gets
// the stream; the challenge is as long as a request, and one request
// draws at most one, so a forged request draws no more bytes to its
// victim than it carried (docs/wire.md §6.2's rule, for udstream).
// dataKind: chunk number seq of the stream follows. endKind: the stream
// ended after seq chunks, and 8 more bytes say its length in bytes (sent
// endRepeats times). Chunks and end carry the tag of the request that
// proved its address: the receiver drops (and counts) any that do not,
// so an off-path host, which never sees the tag, can neither end nor
// derail the stream. A Write-Record record whose first segment was lost
// has lost its header too: the receiver takes it for the next chunk, on
// the word of the Write-Record socket (it holds only records its peer
// wrote into the ring registered for it after the socket's own cookie
// exchange).
const (
	hdrSize  = 16
	reqKind  = 1
	dataKind = 2
	endKind  = 3
	chalKind = 4

	reqSize  = hdrSize + 8 // a request, a challenge
	endSize  = hdrSize + 8
	chalSize = reqSize

	endRepeats = 5

	tsFlag = 1
)

func putHeader(b []byte, kind, flags byte, seq uint32, tag uint64) {
	b[0], b[1], b[2], b[3] = 'U', 'S', kind, flags
	binary.BigEndian.PutUint32(b[4:], seq)
	binary.BigEndian.PutUint64(b[8:], tag)
}

// header parses b's header; false if b does not begin with one.
func header(b []byte) (kind, flags byte, seq uint32, tag uint64, ok bool) {
	if len(b) < hdrSize || b[0] != 'U' || b[1] != 'S' || b[3]&^tsFlag != 0 || b[2] < reqKind || b[2] > chalKind {
		return 0, 0, 0, 0, false
	}
	return b[2], b[3], binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint64(b[8:]), true
}

// newTag draws a stream's tag: random, never 0.
func newTag() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if t := binary.BigEndian.Uint64(b[:]); t != 0 {
			return t
		}
	}
}

// cookies are a sender's cookies: a keyed hash of a receiver's address
// and the tag it asked with (reliability.Tokens, under a secret drawn per
// sender), so the sender keeps no state for a source that has not proved
// its address.
type cookies struct{ t *reliability.Tokens }

func newCookies() cookies { return cookies{reliability.NewTokens()} }

func (c cookies) issue(ap netip.AddrPort, tag uint64) uint64 {
	return c.t.Issue(ap, 0, uint32(tag), 0, uint32(tag>>32))
}

func (c cookies) valid(cookie uint64, ap netip.AddrPort, tag uint64) bool {
	return c.t.Valid(cookie, ap, 0, uint32(tag), 0, uint32(tag>>32))
}

// seqDiff is b - a in serial-number arithmetic (RFC 1982): positive when
// b is after a, negative when before, whatever the wrap.
func seqDiff(a, b uint32) int32 { return int32(b - a) }

// chunkWindow bounds how far ahead of the chunk expected next a chunk
// may be taken (as the Write-Record engine's MSN window bounds a
// segment's): one further ahead is dropped and counted, unless it is the
// resyncRun-th of a run of consecutive chunks that far ahead — the
// sender's own stream after a gap longer than the window. So no single
// datagram moves the stream's position by more than the window.
const (
	chunkWindow = 1 << 14
	resyncRun   = 3
)
