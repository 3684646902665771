package qp

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// MulticastQPN is the destination QP number of a datagram sent to a
// multicast group: every QP of the receiving socket that joined the group
// gets a copy (InfiniBand uses the same all-ones QPN).
const MulticastQPN = udiwarp.MaxQPN

// AH is an address handle: where a UD work request goes (seed 003). It
// holds the peer's IP:port and QP number, and numbers the messages sent
// through it.
type AH struct {
	pd   *PD
	addr netip.AddrPort
	qpn  uint32
	msn  atomic.Uint32
}

// CreateAH makes an address handle for the QP qpn at addr. For a
// multicast group address, qpn must be MulticastQPN.
func (pd *PD) CreateAH(addr netip.AddrPort, qpn uint32) (*AH, error) {
	if !addr.IsValid() || addr.Port() == 0 {
		return nil, fmt.Errorf("%w: address handle for %v", ErrInvalidAttr, addr)
	}
	if addr.Addr().IsMulticast() != (qpn == MulticastQPN) {
		return nil, fmt.Errorf("%w: address %v with QP number %#x: multicast groups take MulticastQPN and only they", ErrInvalidAttr, addr, qpn)
	}
	if qpn == 0 || qpn > udiwarp.MaxQPN {
		return nil, fmt.Errorf("%w: QP number %d, want 1..%d", ErrInvalidAttr, qpn, udiwarp.MaxQPN)
	}
	ah := &AH{pd: pd}
	ah.setAddr(addr, qpn)
	return ah, nil
}

// setAddr points ah at QP qpn at addr.
func (ah *AH) setAddr(addr netip.AddrPort, qpn uint32) {
	a := addr.Addr().Unmap()
	ah.addr, ah.qpn = netip.AddrPortFrom(a, addr.Port()), qpn
}

// Addr returns the peer's address.
func (ah *AH) Addr() netip.AddrPort { return ah.addr }

// QPN returns the peer's QP number.
func (ah *AH) QPN() uint32 { return ah.qpn }
