package llp

import (
	"fmt"
	"net"
	"net/netip"
)

// InterfaceOf names the interface that holds a, the one an AF_XDP link
// on a attaches to; loopback is refused (AF_XDP never attaches there:
// docs/llp.md).
func InterfaceOf(a netip.Addr) (string, error) {
	a = a.Unmap()
	if a.IsLoopback() {
		return "", fmt.Errorf("AF_XDP: %v is a loopback address, and AF_XDP never attaches to loopback (run the ends in two network namespaces or hosts)", a)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			if p, ok := x.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap() == a {
					if ifi.Flags&net.FlagLoopback != 0 {
						return "", fmt.Errorf("AF_XDP: %v is on %s, a loopback interface, where AF_XDP never attaches", a, ifi.Name)
					}
					return ifi.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("AF_XDP: no interface holds %v", a)
}
