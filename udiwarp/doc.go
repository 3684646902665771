// Package udiwarp is the wire format of datagram-iWARP: the DDP (RFC 5041)
// and RDMAP (RFC 5040, RFC 7306) headers, the datagram profile's
// Write-Record and QP-addressing extensions, the per-datagram CRC32c
// trailer, the frame-type rule of a udiwarp UDP socket, and MPA framing
// (RFC 5044, RFC 6581) for RC queue pairs over TCP.
//
// Headers are views over the caller's bytes (type DDPTagged []byte, ...):
// a parse checks the length once and reads fields in place, and an Encode
// writes every field at once. Nothing here does I/O, and neither parsing
// nor building allocates. docs/wire.md is the normative byte-by-byte
// description of every frame built here.
package udiwarp
