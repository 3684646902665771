// Command txoff turns a network interface's transmit checksum offload
// off, as `ethtool -K IFNAME tx off` does, for hosts without ethtool
// (experiments/xdp.sh runs it inside a namespace with `ip netns exec`):
// a veth hands its peer the kernel's datagrams with their UDP checksum
// unfilled, which an AF_XDP reader that checks checksums (llp's) drops.
package main

import (
	"fmt"
	"os"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: txoff IFNAME (ethtool -K IFNAME tx off, in the current network namespace)")
		os.Exit(2)
	}
	if err := netnstest.TxChecksumOff(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "txoff: %v\n", err)
		os.Exit(1)
	}
}
