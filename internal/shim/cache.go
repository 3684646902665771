package shim

import (
	"net/netip"

	"github.com/udiwarp/udiwarp/qp"
)

// AHCache keeps the address handles a socket sends with, one per peer
// address, at most Max (the oldest made goes first; the sends in flight
// keep theirs). Not safe for concurrent use: the socket's lock guards it.
type AHCache struct {
	PD  *qp.PD
	QPN uint32 // every peer's QP number (the shims' fixed one)
	Max int

	m     map[netip.AddrPort]*qp.AH
	order []netip.AddrPort // a ring of the cached addresses, oldest at head
	head  int
}

// Get returns the address handle for ap (an IPv4-mapped address taken as
// IPv4), making it if needed: to the shims' QP at ap, or to every member
// of the group when ap is a multicast address.
func (c *AHCache) Get(ap netip.AddrPort) (*qp.AH, error) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if ah := c.m[ap]; ah != nil {
		return ah, nil
	}
	qpn := c.QPN
	if ap.Addr().IsMulticast() { // a group: every member QP (qp.JoinMulticast)
		qpn = qp.MulticastQPN
	}
	ah, err := c.PD.CreateAH(ap, qpn)
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[netip.AddrPort]*qp.AH{}
	}
	if len(c.order) < max(c.Max, 1) {
		c.order = append(c.order, ap)
	} else { // full: the oldest goes
		delete(c.m, c.order[c.head])
		c.order[c.head] = ap
		c.head = (c.head + 1) % len(c.order)
	}
	c.m[ap] = ah
	return ah, nil
}

// Len is how many handles the cache holds.
func (c *AHCache) Len() int { return len(c.m) }

// Slots is a free list of send-slot indexes.
type Slots struct{ free []int }

// NewSlots is a free list of slots 0 to n-1, all free.
func NewSlots(n int) Slots {
	s := Slots{free: make([]int, 0, n)}
	for i := range n {
		s.free = append(s.free, i)
	}
	return s
}

// Take takes a free slot; false if none is free.
func (s *Slots) Take() (int, bool) {
	n := len(s.free)
	if n == 0 {
		return 0, false
	}
	i := s.free[n-1]
	s.free = s.free[:n-1]
	return i, true
}

// Put gives slot i back.
func (s *Slots) Put(i int) { s.free = append(s.free, i) }

// Free is how many slots are free.
func (s *Slots) Free() int { return len(s.free) }
