// Package socketshim lets datagram socket programs use udiwarp.
//
// ListenPacket returns a net.PacketConn backed by a UD queue pair on its
// own device (its QP is number ShimQPN, so peers are addressed by UDP
// address alone): WriteTo posts a Send to a cached address handle,
// ReadFrom returns the next completed receive with its source. Deadlines
// behave as net.UDPConn's — one in the past interrupts a blocked read at
// once, an expired one fails with os.ErrDeadlineExceeded — and Close
// unblocks everything. Dial on "udp" returns a connected net.Conn (*Conn)
// over it. quic-go (QUIC
// and HTTP/3) and miekg/dns run over them unchanged; see the tests.
//
// Options.Reliable runs it over an RD QP instead: every datagram
// delivered once, in order per peer, or reported: a datagram the stack
// could not deliver (retries or receiver-not-ready retries exhausted, the
// peer restarted) is reported by the next WriteTo to its destination,
// which sends nothing and returns a *net.OpError (Addr the destination)
// wrapping a *SendError (the completion status), as a connected UDP
// socket reports an ICMP error on its next call. Options.RD tunes the
// retries.
//
// Unmodified C programs get the same sockets through the LD_PRELOAD
// library in socketshim/preload (libudiwarp_preload.so in front of a Go
// engine built with -buildmode=c-shared): each UDP socket they open
// becomes a device with one UD QP, number ShimQPN, on the address they
// bound, so they talk to each other and to ListenPacket's PacketConns.
// sockperf, dnsmasq with dig, and iperf run over it in its tests.
//
// ListenWriteRecord returns the Write-Record mode of seed 003, a
// net.PacketConn (*WRConn) whose WriteTo is an RDMA Write-Record into the
// next slot of a ring the peer registered for this sender, and whose
// ReadFrom returns the next record that arrived whole (a record with a
// segment lost is never returned). Peers exchange their rings once, in a
// HELLO handshake of solicited Sends over the same UD QP (resent with
// back-off; ErrNoPeer after WROptions.HandshakeTimeout; a new session
// epoch marks a restarted peer). The handshake checks return
// routability first: a control message counts only if it echoes the
// cookie (a keyed hash of its source address) the receiver sent to that
// address; any other draws a CHALLENGE carrying the cookie, no larger
// than itself, and changes nothing. So a spoofed source creates no peer,
// registers no ring and cannot reset a flow. Peers quiet for
// WROptions.IdleTimeout are forgotten (their rings deregistered).
// Records are numbered, and the receiver returns slots
// as credits (a CREDIT message every quarter ring): a writer never
// rewrites an unread slot; a peer with more records than its credits
// allow is dropped, counted (WRStats.Overruns) and forgotten, and the
// receive CQ, sized by the credits and drained in the background, never
// overflows. A writer out of slots sends PROBEs; if the
// reader has nothing queued the records were lost, and it re-keys the
// ring; with no slot within WROptions.CreditWait the datagram is dropped,
// as a full UDP socket drops it. Small datagrams are copied (inline, or
// to a registered send slot), large ones sent from the caller's buffer
// (zero copy). Both ends must use ListenWriteRecord. The comment in
// wrconn.go is the full protocol.
//
// Dial and Listen on "tcp" (or DialRC and ListenRC, which take options)
// give a byte stream, net.Conn and net.Listener (*RCConn, *RCListener),
// over RC queue pairs (TCP + MPA), so UD and RC
// sockets compare like for like. Writes are cut into Sends of at most the
// peer's RCOptions.MessageSize; Read returns the bytes in order, a
// message over several Reads if need be. RC has no receiver-not-ready,
// so the receiver grants its posted receives as credits (piggybacked on
// its messages, or in credit-only messages), and a Write waits for one
// within its deadline. Close sends what was written and a FIN (the peer
// reads io.EOF); CloseWrite half-closes; CloseRead is not offered (the
// peer's writes would have nowhere to go but to fail its connection). A
// peer that vanishes gives ErrConnLost (ECONNRESET). It passes
// golang.org/x/net/nettest.TestConn. Both ends must be socketshim RC
// sockets (the MPA private data says so; other requests are rejected).
//
// The RDS zerocopy interface of seed 001 (rds-rdma(7)) is package
// socketshim/rds: over an RD QP, a client maps memory and passes its RDMA
// cookie (MapControl, DestControl, GetMR, FreeMR, UseOnce, Invalidate);
// the server moves data with an RDMA Write or Read combined atomically
// with a message (ArgsControl: the message arrives only after the RDMA
// succeeded, never when it failed) and is notified (NotifyMe, RECVERR),
// all through typed controls passed to SendMsg and returned by RecvMsg.
package socketshim
