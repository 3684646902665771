package qp

import "net/netip"

// RCAddrs returns the local and remote TCP addresses of an RC QP's
// connection; ok is false before Connect or Accept attached one.
func (q *QP) RCAddrs() (local, remote netip.AddrPort, ok bool) {
	c := q.rc.Load()
	if c == nil {
		return netip.AddrPort{}, netip.AddrPort{}, false
	}
	local, remote = c.addrs()
	return local, remote, true
}
