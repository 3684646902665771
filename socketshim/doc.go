// Package socketshim lets datagram socket programs use udiwarp: a
// net.PacketConn and net.Conn over queue pairs, and an RDS-style zerocopy
// API that exposes one-sided RDMA through socket calls.
package socketshim
