package main

import "encoding/binary"

// The datagram transports' framing: every datagram begins with an
// 8-byte header.
//
//	0  'U' 'S'   2  kind   3  flags   4  sequence number (big-endian)
//
// flags bit 0 (tsFlag) on a data chunk: the stream is MPEG-TS, cut at
// packet boundaries.
// kind reqKind: a receiver asks for the stream (sent again every
// reqEvery until data comes); dataKind: chunk number seq of the stream
// follows; endKind: the stream ended after seq chunks, and 8 more bytes
// say its length in bytes (sent endRepeats times). A Write-Record record
// whose first segment was lost has lost its header too: the receiver
// takes it for the next chunk.
const (
	hdrSize  = 8
	reqKind  = 1
	dataKind = 2
	endKind  = 3

	endRepeats = 5

	tsFlag = 1
)

func putHeader(b []byte, kind, flags byte, seq uint32) {
	b[0], b[1], b[2], b[3] = 'U', 'S', kind, flags
	binary.BigEndian.PutUint32(b[4:], seq)
}

// header parses b's header; false if b does not begin with one.
func header(b []byte) (kind, flags byte, seq uint32, ok bool) {
	if len(b) < hdrSize || b[0] != 'U' || b[1] != 'S' || b[3]&^tsFlag != 0 || b[2] < reqKind || b[2] > endKind {
		return 0, 0, 0, false
	}
	return b[2], b[3], binary.BigEndian.Uint32(b[4:]), true
}
