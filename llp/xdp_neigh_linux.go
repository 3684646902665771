package llp

// Route, neighbour and XDP-attachment queries over rtnetlink, for the XDP
// link: the link builds Ethernet headers itself, so it asks the kernel
// which next hop a destination goes through (RTM_GETROUTE) and that next
// hop's MAC address (RTM_GETNEIGH); and it finds and detaches a program a
// crashed run left on the interface (RTM_GETLINK / RTM_SETLINK, IFLA_XDP).
//
// A netlink socket belongs to the network namespace it was opened in: the
// link opens its own in OpenXDP and asks through it for its whole life,
// whichever thread calls.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nlConn is an rtnetlink socket making one request at a time.
type nlConn struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	buf []byte
}

func openNetlink() (*nlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	// Every request's answer comes within the timeout, or the request
	// fails: no wait without bound.
	tv := unix.NsecToTimeval(int64(time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink SO_RCVTIMEO: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &nlConn{fd: fd, buf: make([]byte, 1<<16)}, nil
}

func (c *nlConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// requestAttrs is request for an answer of type want (at least minLen bytes)
// whose attributes syscall.ParseNetlinkRouteAttr reads (a route, a link):
// fn gets them; other answers, and ones that do not parse, are skipped.
func (c *nlConn) requestAttrs(typ, want uint16, minLen int, body []byte, fn func([]syscall.NetlinkRouteAttr)) error {
	return c.request(typ, 0, body, func(t uint16, data []byte) {
		if t != want || len(data) < minLen {
			return
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: t}, Data: data})
		if err == nil {
			fn(attrs)
		}
	})
}

// request sends one message of type typ with body and calls fn with each
// answering message's type and data, until the answer ends (an error or
// acknowledgement, NLMSG_DONE, or a single reply to a non-dump request).
func (c *nlConn) request(typ, flags uint16, body []byte, fn func(typ uint16, data []byte)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return ErrClosed
	}
	c.seq++
	seq := c.seq
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	msg = append(msg, body...)
	h := (*unix.NlMsghdr)(unsafe.Pointer(&msg[0]))
	h.Len, h.Type, h.Flags, h.Seq = uint32(len(msg)), typ, unix.NLM_F_REQUEST|flags, seq
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	dump := flags&unix.NLM_F_DUMP == unix.NLM_F_DUMP
	ack := flags&unix.NLM_F_ACK != 0
	for range 1024 { // a dump of a big table; each read waits at most SO_RCVTIMEO
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(c.buf[:n])
		if err != nil {
			return fmt.Errorf("netlink parse: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue // an answer to an earlier request that timed out
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return errors.New("netlink: short error message")
				}
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return syscall.Errno(-e)
				}
				return nil
			}
			fn(m.Header.Type, m.Data)
			if !dump && !ack {
				return nil
			}
		}
	}
	return errors.New("netlink: answer too long")
}

// nlAttr appends a route attribute.
func nlAttr(b []byte, typ uint16, val []byte) []byte {
	l := unix.SizeofRtAttr + len(val)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func addrFamily(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func addrFromBytes(b []byte) (netip.Addr, bool) {
	switch len(b) {
	case 4:
		return netip.AddrFrom4([4]byte(b)), true
	case 16:
		return netip.AddrFrom16([16]byte(b)), true
	}
	return netip.Addr{}, false
}

// routeGet asks the kernel how it would send to dst: the output
// interface and the gateway (invalid when dst is on the link).
func (c *nlConn) routeGet(dst netip.Addr) (oif int, gw netip.Addr, err error) {
	body := make([]byte, unix.SizeofRtMsg)
	rt := (*unix.RtMsg)(unsafe.Pointer(&body[0]))
	rt.Family = addrFamily(dst)
	rt.Dst_len = uint8(dst.BitLen())
	body = nlAttr(body, unix.RTA_DST, dst.AsSlice())
	found := false
	err = c.requestAttrs(unix.RTM_GETROUTE, unix.RTM_NEWROUTE, unix.SizeofRtMsg, body, func(attrs []syscall.NetlinkRouteAttr) {
		found = true
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.RTA_OIF:
				if len(a.Value) >= 4 {
					oif = int(binary.NativeEndian.Uint32(a.Value))
				}
			case unix.RTA_GATEWAY:
				if g, ok := addrFromBytes(a.Value); ok {
					gw = g
				}
			}
		}
	})
	if err == nil && !found {
		err = errors.New("no route")
	}
	return oif, gw, err
}

// Neighbour states (include/uapi/linux/neighbour.h).
const (
	nudIncomplete = 0x01
	nudStale      = 0x04
	nudFailed     = 0x20
	nudNoARP      = 0x40
)

// neighGet asks the kernel's neighbour table for ip on interface ifindex:
// its MAC and state; ok is false when the kernel knows no usable MAC.
func (c *nlConn) neighGet(ifindex int, ip netip.Addr) (mac [6]byte, state uint16, ok bool, err error) {
	body := make([]byte, unix.SizeofNdMsg)
	nd := (*unix.NdMsg)(unsafe.Pointer(&body[0]))
	nd.Family = addrFamily(ip)
	nd.Ifindex = int32(ifindex)
	body = nlAttr(body, unix.NDA_DST, ip.AsSlice())
	err = c.request(unix.RTM_GETNEIGH, 0, body, func(typ uint16, data []byte) {
		if typ != unix.RTM_NEWNEIGH || len(data) < unix.SizeofNdMsg {
			return
		}
		nd := (*unix.NdMsg)(unsafe.Pointer(&data[0]))
		state = nd.State
		for rest := data[unix.SizeofNdMsg:]; len(rest) >= unix.SizeofRtAttr; {
			l := int(binary.NativeEndian.Uint16(rest[0:2]))
			t := binary.NativeEndian.Uint16(rest[2:4])
			if l < unix.SizeofRtAttr || l > len(rest) {
				break
			}
			if t == unix.NDA_LLADDR && l-unix.SizeofRtAttr == 6 {
				copy(mac[:], rest[unix.SizeofRtAttr:l])
				ok = true
			}
			l = (l + 3) &^ 3
			if l > len(rest) {
				break
			}
			rest = rest[l:]
		}
	})
	if errors.Is(err, unix.ENOENT) {
		return mac, 0, false, nil
	}
	if state&(nudIncomplete|nudFailed) != 0 {
		ok = false
	}
	return mac, state, ok, err
}

// XDP attachment as rtnetlink reports it (IFLA_XDP_ATTACHED).
const (
	xdpAttachedNone  = 0
	xdpAttachedDrv   = 1
	xdpAttachedSKB   = 2
	xdpAttachedHW    = 3
	xdpAttachedMulti = 4
)

// linkXDP reports the XDP program attached to interface ifindex: how
// (xdpAttached*) and its id (of the first mode when several).
func (c *nlConn) linkXDP(ifindex int) (attached uint8, progID uint32, err error) {
	body := make([]byte, unix.SizeofIfInfomsg)
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&body[0]))
	ifi.Family = unix.AF_UNSPEC
	ifi.Index = int32(ifindex)
	found := false
	err = c.requestAttrs(unix.RTM_GETLINK, unix.RTM_NEWLINK, 0, body, func(attrs []syscall.NetlinkRouteAttr) {
		found = true
		for _, a := range attrs {
			if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_XDP {
				continue
			}
			var ids [8]uint32
			for rest := a.Value; len(rest) >= unix.SizeofRtAttr; {
				l := int(binary.NativeEndian.Uint16(rest[0:2]))
				t := binary.NativeEndian.Uint16(rest[2:4])
				if l < unix.SizeofRtAttr || l > len(rest) {
					break
				}
				v := rest[unix.SizeofRtAttr:l]
				switch {
				case t == unix.IFLA_XDP_ATTACHED && len(v) >= 1:
					attached = v[0]
				case int(t) < len(ids) && len(v) >= 4:
					ids[t] = binary.NativeEndian.Uint32(v)
				}
				l = (l + 3) &^ 3
				if l > len(rest) {
					break
				}
				rest = rest[l:]
			}
			progID = ids[unix.IFLA_XDP_PROG_ID]
			for _, t := range []int{unix.IFLA_XDP_DRV_PROG_ID, unix.IFLA_XDP_SKB_PROG_ID, unix.IFLA_XDP_HW_PROG_ID} {
				if progID == 0 {
					progID = ids[t]
				}
			}
		}
	})
	if err == nil && !found {
		err = errors.New("no such interface")
	}
	return attached, progID, err
}

// setLinkXDP attaches the program fd to interface ifindex the old way
// (netlink, outliving the process), or detaches with fd -1; flags give
// the mode (unix.XDP_FLAGS_*).
func (c *nlConn) setLinkXDP(ifindex int, fd int32, flags uint32) error {
	body := make([]byte, unix.SizeofIfInfomsg)
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&body[0]))
	ifi.Family = unix.AF_UNSPEC
	ifi.Index = int32(ifindex)
	var nest []byte
	nest = nlAttr(nest, unix.IFLA_XDP_FD, binary.NativeEndian.AppendUint32(nil, uint32(fd)))
	nest = nlAttr(nest, unix.IFLA_XDP_FLAGS, binary.NativeEndian.AppendUint32(nil, flags))
	body = nlAttr(body, unix.IFLA_XDP|unix.NLA_F_NESTED, nest)
	return c.request(unix.RTM_SETLINK, unix.NLM_F_ACK, body, func(uint16, []byte) {})
}
