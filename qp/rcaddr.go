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

// RCParams is what an RC connection's MPA exchange settled (RFC 5044
// §7.1, RFC 6581).
type RCParams struct {
	CRC bool // FPDUs carry CRC32c, both ways (either side asked for it)
	// MarkersOut and MarkersIn: markers in the FPDUs this side sends and
	// in those it receives (each side asks for its own).
	MarkersOut, MarkersIn bool
	IRD, ORD              int // Read Requests served and issued at once
}

// RCParams returns what an RC QP's connection negotiated; ok is false
// before Connect or Accept attached one.
func (q *QP) RCParams() (p RCParams, ok bool) {
	c := q.rc.Load()
	if c == nil {
		return RCParams{}, false
	}
	n := c.neg
	return RCParams{CRC: n.crc, MarkersOut: n.markersOut, MarkersIn: n.markersIn, IRD: n.ird, ORD: n.ord}, true
}
