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
// Unmodified C programs get the same sockets through the LD_PRELOAD
// library in socketshim/preload (libudiwarp_preload.so in front of a Go
// engine built with -buildmode=c-shared): each UDP socket they open
// becomes a device with one UD QP, number ShimQPN, on the address they
// bound, so they talk to each other and to ListenPacket's PacketConns.
// sockperf, dnsmasq with dig, and iperf run over it in its tests.
//
// Not built yet (issue 8): a Write-Record mode, RC sockets
// (net.Conn over RC QPs), and the RDS-style zerocopy API of seed 001.
package socketshim
