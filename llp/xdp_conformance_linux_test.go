package llp

import (
	"errors"
	"net/netip"
	"testing"
	"time"
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

// resolve sends from a to b until one datagram arrives, and reads it.
func resolve(t *testing.T, a, b *XDP) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	ms := []Msg{{Bufs: [][]byte{make([]byte, 64)}}}
	for time.Now().Before(deadline) {
		_, err := a.Write([]Msg{{Bufs: [][]byte{[]byte("hello")}, Addr: b.LocalAddr()}})
		if err != nil && !errors.Is(err, ErrNoNeighbour) && !errors.Is(err, ErrWouldBlock) {
			t.Fatal(err)
		}
		for range 100 {
			if n, err := b.Read(ms); err != nil {
				t.Fatal(err)
			} else if n == 1 {
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	t.Fatalf("%v never reached %v", a.LocalAddr(), b.LocalAddr())
}
