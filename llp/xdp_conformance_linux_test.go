package llp

import (
	"net/netip"
	"testing"
)

// The AF_XDP link joins the conformance tests: end a on the test's veth
// end, end b on the other end in the test's namespace. A first datagram
// each way resolves the neighbours, so that the tests' Writes do not
// meet ErrNoNeighbour.
func init() {
	linkKinds = append(linkKinds, linkMaker{"xdp", func(t *testing.T) (Link, Link) {
		tn := newTestNet(t)
		a := openTestXDP(t, tn.a, tn.ipA)
		var b *XDP
		inNS(t, tn.ns, func() (err error) {
			b, err = OpenXDP(XDPConfig{Interface: tn.b, Addr: netip.AddrPortFrom(tn.ipB, 0), Frames: 1024})
			return err
		})
		t.Cleanup(func() { b.Close() })
		resolve(t, a, b)
		resolve(t, b, a)
		return a, b
	}})
}

// resolve sends one datagram from a to b, which waits in a for the next
// hop, and reads it at b.
func resolve(t *testing.T, a, b *XDP) {
	t.Helper()
	writeAll(t, a, []Msg{{Bufs: [][]byte{[]byte("hello")}, Addr: b.LocalAddr()}})
	if m := readN(t, b, 1, 64)[0]; m.N != 5 {
		t.Fatalf("the first datagram: %d bytes", m.N)
	}
}
