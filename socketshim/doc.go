// Package socketshim lets datagram socket programs use udiwarp.
//
// ListenPacket returns a net.PacketConn backed by a UD queue pair on its
// own device (its QP is number ShimQPN, so peers are addressed by UDP
// address alone): WriteTo posts a Send to a cached address handle,
// ReadFrom returns the next completed receive with its source. Deadlines
// behave as net.UDPConn's — one in the past interrupts a blocked read at
// once, an expired one fails with os.ErrDeadlineExceeded — and Close
// unblocks everything. Dial returns a connected net.Conn. quic-go (QUIC
// and HTTP/3) and miekg/dns run over them unchanged; see the tests.
//
// Options.Reliable runs it over an RD QP instead: every datagram
// delivered once, in order per peer.
//
// Not built yet (issue 8): a Write-Record mode, RC sockets
// (net.Conn over RC QPs), the RDS-style zerocopy API of seed 001, and the
// LD_PRELOAD library for unmodified programs.
package socketshim
