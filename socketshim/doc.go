// Package socketshim lets datagram socket programs use udiwarp through
// the standard interfaces: ListenPacket gives a net.PacketConn over a UD
// queue pair (Options.Reliable: over RD, every datagram delivered once,
// in order per peer, or reported), Dial on "udp" a connected net.Conn,
// ListenWriteRecord a net.PacketConn whose writes are RDMA Write-Records
// (WRConn), and Dial/Listen on "tcp" a byte stream over RC (RCConn).
// Unmodified C programs get the same sockets through the LD_PRELOAD
// library (socketshim/preload), and the RDS zerocopy interface of seed
// 001 is socketshim/rds. docs/sockets.md describes each: deadlines,
// errors, the Write-Record handshake and credits, RC's flow control; the
// comment in wrconn.go is the Write-Record socket's full protocol.
package socketshim
