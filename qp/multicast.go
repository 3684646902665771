package qp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"

	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// JoinMulticast makes the QP a member of group on interface ifi (nil: the
// system's choice). Datagrams sent to the group with MulticastQPN reach
// every member QP of every socket that joined it; the QP's socket must be
// bound to the group's port (see ReuseAddr to bind several).
func (q *QP) JoinMulticast(group netip.Addr, ifi *net.Interface) error {
	s := q.sock.Load()
	if s == nil {
		return fmt.Errorf("%w: join %v: the QP has no socket", ErrQPState, group)
	}
	if !group.IsMulticast() {
		return fmt.Errorf("%w: %v is not a multicast group", ErrInvalidAttr, group)
	}
	if q.typ != UD {
		return fmt.Errorf("%w: join %v: a %v QP cannot join a group (multicast is unreliable datagrams: UD only)", ErrInvalidAttr, group, q.typ)
	}
	group = group.Unmap()
	s.mcastMu.Lock()
	defer s.mcastMu.Unlock()
	members := s.mcast[group]
	if slices.Contains(members, q) {
		return nil
	}
	if len(members) == 0 {
		if err := s.joinGroup(group, ifi); err != nil {
			return err
		}
	}
	s.mcast[group] = append(slices.Clip(members), q) // copy on write: readers hold old slices
	return nil
}

// LeaveMulticast ends the QP's membership of group.
func (q *QP) LeaveMulticast(group netip.Addr) error {
	s := q.sock.Load()
	if s == nil {
		return nil
	}
	group = group.Unmap()
	s.mcastMu.Lock()
	defer s.mcastMu.Unlock()
	members := s.mcast[group]
	i := slices.Index(members, q)
	if i < 0 {
		return fmt.Errorf("%w: QP %d is not in group %v", ErrNotFound, q.num, group)
	}
	members = slices.Concat(members[:i], members[i+1:])
	if len(members) == 0 {
		delete(s.mcast, group)
		return s.leaveGroup(group)
	}
	s.mcast[group] = members
	return nil
}

func (q *QP) leaveAllGroups() {
	s := q.sock.Load()
	if s == nil {
		return
	}
	s.mcastMu.RLock()
	var groups []netip.Addr
	for g, m := range s.mcast {
		if slices.Contains(m, q) {
			groups = append(groups, g)
		}
	}
	s.mcastMu.RUnlock()
	for _, g := range groups {
		_ = q.LeaveMulticast(g)
	}
}

func (s *Socket) joinGroup(group netip.Addr, ifi *net.Interface) error {
	ga := &net.UDPAddr{IP: group.AsSlice()}
	if s.udp == nil {
		return s.notSocket("joining " + group.String())
	}
	pc, done, err := s.udp.PacketConn()
	if err != nil {
		return fmt.Errorf("qp: joining %v: %w", group, err)
	}
	defer done()
	// EADDRINUSE: the socket is a member already, joined before the
	// device had it (BindConn; a preloaded program that joins before it
	// binds): the QP joins the kernel's membership.
	if s.v6 {
		p := ipv6.NewPacketConn(pc)
		if err = p.JoinGroup(ifi, ga); err == nil || errors.Is(err, syscall.EADDRINUSE) {
			err = p.SetControlMessage(ipv6.FlagDst, true)
		}
	} else {
		p := ipv4.NewPacketConn(pc)
		if err = p.JoinGroup(ifi, ga); err == nil || errors.Is(err, syscall.EADDRINUSE) {
			err = p.SetControlMessage(ipv4.FlagDst, true)
		}
	}
	if err != nil {
		return fmt.Errorf("qp: joining %v: %w", group, err)
	}
	s.udp.ReportDst()
	return nil
}

func (s *Socket) leaveGroup(group netip.Addr) error {
	ga := &net.UDPAddr{IP: group.AsSlice()}
	if s.udp == nil {
		return s.notSocket("leaving " + group.String())
	}
	pc, done, err := s.udp.PacketConn()
	if err != nil {
		return err
	}
	defer done()
	if s.v6 {
		return ipv6.NewPacketConn(pc).LeaveGroup(nil, ga)
	}
	return ipv4.NewPacketConn(pc).LeaveGroup(nil, ga)
}

// SetMulticastInterface chooses the interface multicast sends leave by.
func (s *Socket) SetMulticastInterface(ifi *net.Interface) error {
	if s.udp == nil {
		return s.notSocket("IP_MULTICAST_IF")
	}
	pc, done, err := s.udp.PacketConn()
	if err != nil {
		return err
	}
	defer done()
	if s.v6 {
		return ipv6.NewPacketConn(pc).SetMulticastInterface(ifi)
	}
	return ipv4.NewPacketConn(pc).SetMulticastInterface(ifi)
}

// deliverMulticast gives each member QP of the datagram's group a copy.
func (s *Socket) deliverMulticast(seg udiwarp.Segment, src netip.AddrPort) {
	st := &s.dev.stats
	dst, _, ok := s.rxDst()
	if !ok {
		st.RxUnknownQP.Add(1)
		return
	}
	s.mcastMu.RLock()
	members := s.mcast[dst]
	s.mcastMu.RUnlock()
	if len(members) == 0 {
		st.RxUnknownQP.Add(1)
		return
	}
	for _, q := range members {
		if q.eng.receiveUD(s, seg, src) {
			st.RxMulticast.Add(1)
		}
	}
}
