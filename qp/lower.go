package qp

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/udiwarp/udiwarp/llp"
)

// Lower names the lower layer Bind opens under a device's datagram QPs.
type Lower string

const (
	// LowerUDP is a kernel UDP socket (the default).
	LowerUDP Lower = "udp"
	// LowerXDP is an AF_XDP socket on one queue of the interface that
	// holds Bind's address: the stack builds and checks Ethernet, IP and
	// UDP itself, and the kernel's UDP path is out of the way
	// (docs/llp.md). It needs root (or CAP_NET_ADMIN and CAP_BPF) and an
	// interface the caller may take traffic from.
	LowerXDP Lower = "xdp"
)

// bindXDP opens Bind's socket on an AF_XDP link: the interface is the
// one that holds address's IP (a specific one: AF_XDP listens on one
// interface), the port as given (0: a free one). With LowerFallback, a
// link that cannot open gives a kernel UDP socket instead, whose
// Socket.Link says why; without it the reason is the error.
func (d *Device) bindXDP(network, address string, opts []BindOption) (*Socket, error) {
	ua, err := net.ResolveUDPAddr(network, address)
	if err != nil {
		return nil, err
	}
	ap := ua.AddrPort()
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	l, err := d.openXDP(ap)
	if err == nil {
		s := newLinkSocket(d, l, false)
		if err := d.addSocket(s); err != nil {
			return nil, err
		}
		return s, nil
	}
	if !d.cfg.LowerFallback {
		return nil, err
	}
	s, uerr := d.bindUDP(network, address, opts)
	if uerr != nil {
		return nil, fmt.Errorf("%w; the kernel UDP socket instead: %w", err, uerr)
	}
	s.fallback = err.Error()
	return s, nil
}

func (d *Device) openXDP(ap netip.AddrPort) (*llp.XDP, error) {
	if !ap.Addr().IsValid() || ap.Addr().IsUnspecified() {
		return nil, fmt.Errorf("%w: AF_XDP binds one interface's address, not %v", ErrInvalidAttr, ap.Addr())
	}
	cfg := d.cfg.XDP
	cfg.Addr = ap
	if cfg.Interface == "" {
		ifi, err := llp.InterfaceOf(ap.Addr())
		if err != nil {
			return nil, fmt.Errorf("qp: %w", err)
		}
		cfg.Interface = ifi
	}
	cfg.Busy = cfg.Busy || d.cfg.Poll == PollBusy
	l, err := llp.OpenXDP(cfg)
	if err != nil {
		return nil, fmt.Errorf("qp: AF_XDP on %s: %w", cfg.Interface, err)
	}
	return l, nil
}
