package llp

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// The conformance tests every Link passes: the same batches, addresses,
// truncation, trains and close, over each implementation. A link kind
// joins by adding a maker to linkKinds (xdp_linux_test.go adds AF_XDP's
// over a veth pair of the test's own).

// linkMaker opens two links that reach each other, or skips.
type linkMaker struct {
	name string
	open func(t *testing.T) (a, b Link)
}

var linkKinds = []linkMaker{
	{"udp", func(t *testing.T) (Link, Link) {
		return openUDP(t, "127.0.0.1:0"), openUDP(t, "127.0.0.1:0")
	}},
	{"udp6", func(t *testing.T) (Link, Link) {
		return openUDP(t, "[::1]:0"), openUDP(t, "[::1]:0")
	}},
	{"impaired", func(t *testing.T) (Link, Link) {
		// A link with nothing to draw passes every datagram through the
		// impairment's copies and its reader's queue.
		wrap := func(u *UDP) Link {
			tx, rx := &Impairment{Seed: 1}, &Impairment{Seed: 2}
			if err := tx.Start(); err != nil {
				t.Fatal(err)
			}
			if err := rx.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tx.Stop(); rx.Stop() })
			return Impair(u, tx, rx, ImpairOptions{Batch: 32})
		}
		return wrap(openUDP(t, "127.0.0.1:0")), wrap(openUDP(t, "127.0.0.1:0"))
	}},
	{"mem", func(t *testing.T) (Link, Link) {
		n := NewMemNet()
		a, err := n.Open(netip.MustParseAddrPort("10.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := n.Open(netip.MustParseAddrPort("10.0.0.2:4791"))
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}},
}

func openUDP(t *testing.T, addr string) *UDP {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Skipf("no %s here: %v", addr, err)
	}
	u, err := NewUDP(c, 32, 4<<20, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func forEachLink(t *testing.T, f func(t *testing.T, a, b Link)) {
	for _, k := range linkKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := k.open(t)
			defer a.Close()
			defer b.Close()
			f(t, a, b)
		})
	}
}

// readN reads until n datagrams have arrived (a GRO read counts as the
// datagrams it holds), waiting in WaitReadable, and returns them with
// their Msgs. It fails after 10 s.
func readAll(t *testing.T, l Link, n, bufSize int) ([][]byte, []Msg) {
	t.Helper()
	var got [][]byte
	var msgs []Msg
	ms := make([]Msg, 8)
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n {
		if time.Now().After(deadline) {
			t.Fatalf("read %d of %d datagrams in 10 s", len(got), n)
		}
		for i := range ms {
			ms[i] = Msg{Bufs: [][]byte{make([]byte, bufSize)}}
		}
		k, err := l.Read(ms)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			waitReadable(t, l)
			continue
		}
		for _, m := range ms[:k] {
			b := m.Bufs[0][:m.N]
			seg := m.Segment
			if seg == 0 || m.Trunc {
				seg = len(b)
			}
			for {
				c := min(seg, len(b))
				got = append(got, b[:c])
				msgs = append(msgs, m)
				if b = b[c:]; len(b) == 0 {
					break
				}
			}
		}
	}
	return got, msgs
}

// waitReadable waits for l to be readable, for at most 10 s.
func waitReadable(t *testing.T, l Link) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- l.WaitReadable() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReadable did not return in 10 s")
	}
}

func confPayload(i, n int) []byte {
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(i*7 + k)
	}
	return b
}

// TestLinkBatches: a Write of 32 datagrams of several sizes, some of
// several buffers, arrives whole and in order, each with the sender's
// address as its source and the receiver's as its destination.
func TestLinkBatches(t *testing.T) {
	forEachLink(t, func(t *testing.T, a, b Link) {
		const n = 32
		max := min(a.Caps().MaxDatagram, 1400)
		ms := make([]Msg, n)
		want := make([][]byte, n)
		for i := range ms {
			want[i] = confPayload(i, (i*97)%max+1)
			p := want[i]
			if i%3 == 0 && len(p) > 2 { // gathered from three pieces
				ms[i].Bufs = [][]byte{p[:1], p[1 : len(p)/2], p[len(p)/2:]}
			} else {
				ms[i].Bufs = [][]byte{p}
			}
			ms[i].Addr = b.LocalAddr()
		}
		sent := 0
		for sent < n {
			k, err := a.Write(ms[sent:])
			sent += k
			if errors.Is(err, ErrWouldBlock) {
				if err := a.WaitWritable(); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for i := range ms {
			if ms[i].N != len(want[i]) {
				t.Fatalf("datagram %d: Write says %d bytes sent, want %d", i, ms[i].N, len(want[i]))
			}
		}
		got, msgs := readAll(t, b, n, 2048)
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("datagram %d: %d bytes, want %d", i, len(got[i]), len(want[i]))
			}
			m := msgs[i]
			if m.Addr != a.LocalAddr() || m.Trunc {
				t.Fatalf("datagram %d: from %v (trunc %v), want %v", i, m.Addr, m.Trunc, a.LocalAddr())
			}
			if dst, unicast, ok := m.Dst(); !ok || dst != b.LocalAddr().Addr() || !unicast {
				t.Fatalf("datagram %d: destination %v unicast %v known %v, want %v", i, dst, unicast, ok, b.LocalAddr().Addr())
			}
		}
	})
}

// TestLinkScatterAndTruncation: a read scatters a datagram over the
// buffers it is given, in order; one longer than them fills them, is
// marked truncated, and the next datagram is whole.
func TestLinkScatterAndTruncation(t *testing.T) {
	forEachLink(t, func(t *testing.T, a, b Link) {
		big, small := confPayload(1, 1000), confPayload(2, 10)
		ms := []Msg{{Bufs: [][]byte{big}, Addr: b.LocalAddr()}, {Bufs: [][]byte{small}, Addr: b.LocalAddr()}}
		if k, err := a.Write(ms); k != 2 || err != nil {
			t.Fatalf("Write: %d, %v", k, err)
		}
		h, mid, tail := make([]byte, 18), make([]byte, 500), make([]byte, 100)
		var got []Msg
		deadline := time.Now().Add(10 * time.Second)
		for len(got) < 2 && time.Now().Before(deadline) {
			r := []Msg{{Bufs: [][]byte{h, mid, tail}}}
			if len(got) == 1 {
				r[0].Bufs = [][]byte{make([]byte, 5), make([]byte, 100)}
			}
			k, err := b.Read(r)
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				waitReadable(t, b)
				continue
			}
			got = append(got, r[0])
		}
		if len(got) < 2 {
			t.Fatal("two datagrams did not arrive in 10 s")
		}
		m := got[0]
		if !m.Trunc || m.N != 618 || !bytes.Equal(h, big[:18]) || !bytes.Equal(mid, big[18:518]) || !bytes.Equal(tail, big[518:618]) {
			t.Fatalf("the long datagram: N %d trunc %v, or its bytes scattered wrong", m.N, m.Trunc)
		}
		m = got[1]
		if m.Trunc || m.N != 10 || !bytes.Equal(m.Bufs[0], small[:5]) || !bytes.Equal(m.Bufs[1][:5], small[5:]) {
			t.Fatalf("the short datagram after it: N %d trunc %v", m.N, m.Trunc)
		}
	})
}

// TestLinkTrain: a Msg with Segment set arrives as its datagrams, each
// Segment bytes but the last.
func TestLinkTrain(t *testing.T) {
	forEachLink(t, func(t *testing.T, a, b Link) {
		if a.Caps().MaxTrain < 5 {
			t.Skipf("%s takes no trains", a.Caps().Kind)
		}
		const seg = 700
		p := confPayload(3, 4*seg+123)
		ms := []Msg{{Bufs: [][]byte{p[:100], p[100:]}, Segment: seg, Addr: b.LocalAddr()}}
		if k, err := a.Write(ms); k != 1 || err != nil {
			t.Fatalf("Write: %d, %v", k, err)
		}
		got, _ := readAll(t, b, 5, 4096)
		for i, g := range got {
			want := p[i*seg : min(len(p), (i+1)*seg)]
			if !bytes.Equal(g, want) {
				t.Fatalf("datagram %d of the train: %d bytes, want %d", i, len(g), len(want))
			}
		}
	})
}

// TestLinkClose: Close wakes a WaitReadable in flight with ErrClosed;
// afterwards Read, Write and the waits say ErrClosed, and a second Close
// does nothing. An empty Read before it returns 0 and no error.
func TestLinkClose(t *testing.T) {
	for _, k := range linkKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := k.open(t)
			defer b.Close()
			if n, err := a.Read(make([]Msg, 4)); n != 0 || err != nil {
				t.Fatalf("an empty Read: %d, %v", n, err)
			}
			done := make(chan error, 1)
			go func() { done <- a.WaitReadable() }()
			// Whether the goroutine parked before Close or not, it must
			// come back with ErrClosed.
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("WaitReadable across Close: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("WaitReadable still parked 10 s after Close")
			}
			ms := []Msg{{Bufs: [][]byte{make([]byte, 10)}, Addr: b.LocalAddr()}}
			if _, err := a.Read(ms); !errors.Is(err, ErrClosed) {
				t.Fatalf("Read after Close: %v", err)
			}
			if _, err := a.Write(ms); !errors.Is(err, ErrClosed) {
				t.Fatalf("Write after Close: %v", err)
			}
			if err := a.WaitReadable(); !errors.Is(err, ErrClosed) {
				t.Fatalf("WaitReadable after Close: %v", err)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("a second Close: %v", err)
			}
		})
	}
}
