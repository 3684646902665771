package llp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"go.uber.org/goleak"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

func TestXDPProgramLoads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load a BPF program")
	}
	o, err := loadXDPProgram(4)
	if err != nil {
		t.Fatalf("%+v", err)
	}
	o.close()
}

var testNetSeq atomic.Int32

// testNet is a veth pair the test made: end a in the test's namespace
// with ipA, end b in namespace ns with ipB.
type testNet struct {
	ns         string
	a, b       string
	ipA, ipB   netip.Addr
	ip6A, ip6B netip.Addr
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newTestNet makes a veth pair and a namespace, removed at the test's
// end; it skips the test, saying why, when an XDP link cannot run.
func newTestNet(t *testing.T) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("XDP tests need root (network namespaces, AF_XDP, BPF)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("XDP tests need iproute2's ip")
	}
	n := testNetSeq.Add(1)
	pid := os.Getpid() % 100000
	tn := &testNet{
		ns: fmt.Sprintf("udwx%d_%d", pid, n),
		a:  fmt.Sprintf("udwx%d_%da", pid, n), b: fmt.Sprintf("udwx%d_%db", pid, n),
		ipA: netip.AddrFrom4([4]byte{10, byte(100 + pid%100), byte(n), 1}),
		ipB: netip.AddrFrom4([4]byte{10, byte(100 + pid%100), byte(n), 2}),
	}
	tn.ip6A = netip.MustParseAddr(fmt.Sprintf("fd00:%x:%x::1", pid, n))
	tn.ip6B = netip.MustParseAddr(fmt.Sprintf("fd00:%x:%x::2", pid, n))
	ipCmd(t, "netns", "add", tn.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", tn.ns).Run() })
	ipCmd(t, "link", "add", tn.a, "type", "veth", "peer", "name", tn.b, "netns", tn.ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", tn.a).Run() })
	ipCmd(t, "addr", "add", tn.ipA.String()+"/24", "dev", tn.a)
	ipCmd(t, "addr", "add", tn.ip6A.String()+"/64", "dev", tn.a, "nodad")
	ipCmd(t, "link", "set", tn.a, "up")
	ipCmd(t, "-n", tn.ns, "addr", "add", tn.ip6B.String()+"/64", "dev", tn.b, "nodad")
	ipCmd(t, "-n", tn.ns, "addr", "add", tn.ipB.String()+"/24", "dev", tn.b)
	ipCmd(t, "-n", tn.ns, "link", "set", tn.b, "up")
	ipCmd(t, "-n", tn.ns, "link", "set", "lo", "up")
	// A veth hands XDP the kernel's datagrams with their UDP checksum
	// not yet filled in (CHECKSUM_PARTIAL): the peer computes them.
	inNS(t, tn.ns, func() error { return netnstest.TxChecksumOff(tn.b) })
	if err := XDPAvailable(tn.a); err != nil {
		t.Skipf("XDP unavailable: %v", err)
	}
	return tn
}

// inNS runs fn on an OS thread in namespace ns; the sockets fn opens
// stay in ns whichever goroutine uses them later. The thread is thrown
// away afterwards.
func inNS(t *testing.T, ns string, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			done <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("setns: %w", err)
			return
		}
		done <- fn()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// peerUDP opens a kernel UDP socket on ipB in the namespace.
func (tn *testNet) peerUDP(t *testing.T) *net.UDPConn {
	var c *net.UDPConn
	inNS(t, tn.ns, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: tn.ipB.AsSlice()})
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func openTestXDP(t *testing.T, ifname string, ip netip.Addr) *XDP {
	t.Helper()
	x, err := OpenXDP(XDPConfig{Interface: ifname, Addr: netip.AddrPortFrom(ip, 0), Frames: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	t.Logf("%s: %s, max datagram %d", x.LocalAddr(), x.Caps().Detail, x.Caps().MaxDatagram)
	return x
}

// writeAll writes ms, retrying (bounded) while the next hop resolves or
// the ring is full.
func writeAll(t *testing.T, x *XDP, ms []Msg) {
	t.Helper()
	defer func() {
		// Datagrams waiting for their next hop leave with a later call on
		// the link: wait for them to go.
		for end := time.Now().Add(10 * time.Second); x.Waiting() > 0; {
			if time.Now().After(end) {
				t.Fatalf("%d datagrams still wait for their next hop after 10 s", x.Waiting())
			}
			if err := x.WaitWritable(); err != nil {
				t.Fatal(err)
			}
		}
	}()
	for i := 0; len(ms) > 0; i++ {
		n, err := x.Write(ms)
		ms = ms[n:]
		switch {
		case err == nil:
		case i > 200:
			t.Fatalf("write: %v", err)
		case errors.Is(err, ErrNoNeighbour):
			time.Sleep(10 * time.Millisecond)
		case errors.Is(err, ErrWouldBlock):
			if err := x.WaitWritable(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("write: %v", err)
		}
	}
}

// readN reads n datagrams (of at most size bytes) from x, parking in
// WaitReadable; a watchdog closes x if they do not come within 5s.
func readN(t *testing.T, x *XDP, n, size int) []Msg {
	t.Helper()
	watchdog := time.AfterFunc(5*time.Second, func() { x.Close() })
	defer watchdog.Stop()
	var got []Msg
	for len(got) < n {
		ms := make([]Msg, n-len(got))
		for i := range ms {
			ms[i].Bufs = [][]byte{make([]byte, size)}
		}
		k, err := x.Read(ms)
		if err != nil {
			t.Fatalf("read (%d of %d so far): %v", len(got), n, err)
		}
		got = append(got, ms[:k]...)
		if k == 0 {
			if err := x.WaitReadable(); err != nil {
				t.Fatalf("wait (%d of %d so far): %v; stats %+v", len(got), n, err, x.Stats())
			}
		}
	}
	return got
}

func payload(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed)
	}
	return b
}

func TestXDPKernelPeer(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	peer := c.LocalAddr().(*net.UDPAddr).AddrPort()
	maxDG := x.Caps().MaxDatagram
	if x.Caps().Kind != "xdp" || maxDG != 1500-20-8 {
		t.Fatalf("caps %+v", x.Caps())
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for _, size := range []int{0, 1, 64, 1400, maxDG} {
		// Kernel socket -> XDP.
		p := payload(size, 1)
		if _, err := c.WriteToUDPAddrPort(p, x.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		m := readN(t, x, 1, 2048)[0]
		if m.N != size || m.Trunc || !bytes.Equal(m.Bufs[0][:m.N], p) || m.Addr != peer || m.Segment != 0 {
			t.Fatalf("size %d: got N=%d trunc=%v from %v", size, m.N, m.Trunc, m.Addr)
		}
		if dst, uni, ok := m.Dst(); !ok || !uni || dst != tn.ipA {
			t.Fatalf("size %d: Dst %v %v %v", size, dst, uni, ok)
		}
		// XDP -> kernel socket, the payload in two buffers.
		q := payload(size, 2)
		writeAll(t, x, []Msg{{Bufs: [][]byte{q[:size/2], q[size/2:]}, Addr: peer}})
		buf := make([]byte, 2048)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil || n != size || !bytes.Equal(buf[:n], q) || from != x.LocalAddr() {
			t.Fatalf("size %d: kernel read %d from %v: %v", size, n, from, err)
		}
	}
	// Too big: refused, not fragmented.
	if _, err := x.Write([]Msg{{Bufs: [][]byte{make([]byte, maxDG+1)}, Addr: peer}}); err == nil {
		t.Fatal("a datagram over the MTU was taken")
	}
	// A batch of 32 in one Write, one kick.
	kicks := x.Stats().TxKicks
	batch := make([]Msg, 32)
	for i := range batch {
		batch[i] = Msg{Bufs: [][]byte{payload(100+i, i)}, Addr: peer}
	}
	writeAll(t, x, batch)
	if k := x.Stats().TxKicks - kicks; k != 1 {
		t.Errorf("a batch of 32 took %d kicks", k)
	}
	buf := make([]byte, 2048)
	for i := range 32 {
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:n], payload(100+i, i)) {
			t.Fatalf("batch datagram %d: %d bytes, %v", i, n, err)
		}
	}
	// A train: 3 full segments and a short one, each its own datagram.
	tr := payload(3*1000+500, 9)
	writeAll(t, x, []Msg{{Bufs: [][]byte{tr[:1234], tr[1234:1235], tr[1235:]}, Segment: 1000, Addr: peer}})
	for i := range 4 {
		n, _, err := c.ReadFromUDPAddrPort(buf)
		want := tr[i*1000 : min(len(tr), (i+1)*1000)]
		if err != nil || !bytes.Equal(buf[:n], want) {
			t.Fatalf("train datagram %d: %d bytes, %v", i, n, err)
		}
	}
	// A batch of 32 the other way, read in one go where they are queued.
	for i := range 32 {
		if _, err := c.WriteToUDPAddrPort(payload(i, i), x.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	got := readN(t, x, 32, 2048)
	for i, m := range got {
		if !bytes.Equal(m.Bufs[0][:m.N], payload(i, i)) {
			t.Fatalf("datagram %d of 32 differs", i)
		}
	}
	t.Logf("stats %+v", x.Stats())
}

func TestXDPToXDP(t *testing.T) {
	tn := newTestNet(t)
	xa := openTestXDP(t, tn.a, tn.ipA)
	var xb *XDP
	inNS(t, tn.ns, func() (err error) {
		xb, err = OpenXDP(XDPConfig{Interface: tn.b, Addr: netip.AddrPortFrom(tn.ipB, 0), Frames: 256, Busy: true})
		return err
	})
	t.Cleanup(func() { xb.Close() })
	t.Logf("peer: %s", xb.Caps().Detail)
	for _, size := range []int{0, 1, 64, 1400, xa.Caps().MaxDatagram} {
		p := payload(size, 3)
		writeAll(t, xa, []Msg{{Bufs: [][]byte{p}, Addr: xb.LocalAddr()}})
		m := readN(t, xb, 1, 2048)[0]
		if m.N != size || !bytes.Equal(m.Bufs[0][:m.N], p) || m.Addr != xa.LocalAddr() {
			t.Fatalf("a->b size %d: N=%d from %v", size, m.N, m.Addr)
		}
		writeAll(t, xb, []Msg{{Bufs: [][]byte{p}, Addr: xa.LocalAddr()}})
		m = readN(t, xa, 1, 2048)[0]
		if m.N != size || !bytes.Equal(m.Bufs[0][:m.N], p) || m.Addr != xb.LocalAddr() {
			t.Fatalf("b->a size %d: N=%d from %v", size, m.N, m.Addr)
		}
	}
	// A train arrives as separate datagrams.
	tr := payload(64*100, 5)
	writeAll(t, xa, []Msg{{Bufs: [][]byte{tr}, Segment: 100, Addr: xb.LocalAddr()}})
	got := readN(t, xb, 64, 2048)
	for i, m := range got {
		if !bytes.Equal(m.Bufs[0][:m.N], tr[i*100:(i+1)*100]) {
			t.Fatalf("train datagram %d differs", i)
		}
	}
	t.Logf("a %+v", xa.Stats())
	t.Logf("b %+v", xb.Stats())
}

func TestXDPTrunc(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	p := payload(1000, 4)
	if _, err := c.WriteToUDPAddrPort(p, x.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	watchdog := time.AfterFunc(5*time.Second, func() { x.Close() })
	defer watchdog.Stop()
	ms := []Msg{{Bufs: [][]byte{make([]byte, 100), make([]byte, 50)}}}
	for {
		n, err := x.Read(ms)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if err := x.WaitReadable(); err != nil {
			t.Fatal(err)
		}
	}
	m := ms[0]
	if !m.Trunc || m.N != 150 || !bytes.Equal(append(m.Bufs[0], m.Bufs[1]...), p[:150]) {
		t.Fatalf("N=%d Trunc=%v", m.N, m.Trunc)
	}
}

func TestXDPClose(t *testing.T) {
	tn := newTestNet(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, busy := range []bool{false, true} {
		x, err := OpenXDP(XDPConfig{Interface: tn.a, Addr: netip.AddrPortFrom(tn.ipA, 0), Frames: 128, Busy: busy})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- x.WaitReadable() }()
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		x.Close()
		select {
		case err := <-done:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("busy=%v: WaitReadable returned %v", busy, err)
			}
			t.Logf("busy=%v: WaitReadable returned %v after Close", busy, time.Since(start))
		case <-time.After(2 * time.Second):
			t.Fatalf("busy=%v: WaitReadable still parked after Close", busy)
		}
		if _, err := x.Read(make([]Msg, 1)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Read after Close: %v", err)
		}
		if _, err := x.Write([]Msg{{Addr: netip.AddrPortFrom(tn.ipB, 9)}}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Write after Close: %v", err)
		}
		if x.WaitWritable() != ErrClosed || x.WaitReadable() != ErrClosed || x.Close() != nil {
			t.Fatal("waits after Close")
		}
	}
}

func TestXDPOtherTrafficPasses(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	// A kernel socket on another port of the same address.
	k, err := net.ListenUDP("udp4", &net.UDPAddr{IP: tn.ipA.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	k.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.WriteToUDPAddrPort([]byte("for the kernel"), k.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	n, _, err := k.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "for the kernel" {
		t.Fatalf("kernel socket: %q %v", buf[:n], err)
	}
	// Ping the XDP side from the namespace.
	var pc *icmp.PacketConn
	inNS(t, tn.ns, func() (err error) {
		pc, err = icmp.ListenPacket("ip4:icmp", tn.ipB.String())
		return err
	})
	defer pc.Close()
	echo, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: 77, Seq: 1, Data: []byte("udiwarp")}}).Marshal(nil)
	if _, err := pc.WriteTo(echo, &net.IPAddr{IP: tn.ipA.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := 0; ; i++ {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("ping: %v", err)
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err == nil && m.Type == ipv4.ICMPTypeEchoReply && from.String() == tn.ipA.String() {
			break
		}
	}
	if s := x.Stats(); s.RxFrames != 0 || s.RxDropped != 0 {
		t.Fatalf("the link saw other traffic: %+v", s)
	}
}

func TestXDPMalformed(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	ifa, err := net.InterfaceByName(tn.a)
	if err != nil {
		t.Fatal(err)
	}
	var fd, ifindexB int
	var macB [6]byte
	inNS(t, tn.ns, func() error {
		ifb, err := net.InterfaceByName(tn.b)
		if err != nil {
			return err
		}
		ifindexB = ifb.Index
		copy(macB[:], ifb.HardwareAddr)
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	})
	defer unix.Close(fd)
	h := frameHdr{SrcMAC: macB, Src: netip.AddrPortFrom(tn.ipB, 5555), Dst: x.LocalAddr()}
	copy(h.DstMAC[:], ifa.HardwareAddr)
	good := func() []byte {
		b := make([]byte, 200)
		copy(b[frameHdrLen(false):], "payload")
		return b[:buildFrame(b, &h, 7)]
	}
	l3 := ethHdrLen
	bad := [][]byte{
		func() []byte { b := good(); b[l3+10] ^= 0x55; return b }(),                      // IP checksum
		func() []byte { b := good(); b[len(b)-1] ^= 1; return b }(),                      // UDP checksum
		func() []byte { b := good(); b[l3+ipv4HdrLen+5] += 2; return b }(),               // UDP length
		func() []byte { b := good(); b[l3+3] -= 2; fixIPv4Checksum(b[l3:]); return b }(), // IP length shorter than UDP's
	}
	sa := &unix.SockaddrLinklayer{Ifindex: ifindexB, Halen: 6}
	copy(sa.Addr[:], ifa.HardwareAddr)
	for _, b := range bad {
		if err := unix.Sendto(fd, b, 0, sa); err != nil {
			t.Fatal(err)
		}
	}
	// Then a good one by hand, and one from the kernel: both arrive.
	if err := unix.Sendto(fd, good(), 0, sa); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteToUDPAddrPort([]byte("after"), x.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	got := readN(t, x, 2, 100)
	if string(got[0].Bufs[0][:got[0].N]) != "payload" || string(got[1].Bufs[0][:got[1].N]) != "after" {
		t.Fatalf("got %q, %q", got[0].Bufs[0][:got[0].N], got[1].Bufs[0][:got[1].N])
	}
	s := x.Stats()
	if s.RxDropped != 4 || s.RxBadIPChecksum != 1 || s.RxBadUDPChecksum != 1 || s.RxBadUDPLength != 2 {
		t.Fatalf("drops: %+v", s)
	}
}

func TestXDPDetachAndStale(t *testing.T) {
	tn := newTestNet(t)
	ifa, err := net.InterfaceByName(tn.a)
	if err != nil {
		t.Fatal(err)
	}
	nl, err := openNetlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.close()
	attached := func() uint8 {
		a, _, err := nl.linkXDP(ifa.Index)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	x := openTestXDP(t, tn.a, tn.ipA)
	if a := attached(); a == xdpAttachedNone {
		t.Fatal("no program attached while the link is open")
	}
	if err := RemoveStaleXDP(tn.a); err == nil {
		t.Fatal("RemoveStaleXDP detached a live link's program")
	}
	x.Close()
	if a := attached(); a != xdpAttachedNone {
		t.Fatalf("program still attached (%d) after Close", a)
	}
	// A crashed run's program: attached through netlink, outliving its
	// maps' and program's descriptors.
	o, err := loadXDPProgram(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.setLinkXDP(ifa.Index, int32(o.prog.FD()), unix.XDP_FLAGS_DRV_MODE); err != nil {
		o.close()
		t.Fatal(err)
	}
	o.close()
	if a := attached(); a != xdpAttachedDrv {
		t.Fatalf("stale program not attached (%d)", a)
	}
	x = openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	if _, err := c.WriteToUDPAddrPort([]byte("hi"), x.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	readN(t, x, 1, 10)
	x.Close()
	if a := attached(); a != xdpAttachedNone {
		t.Fatalf("program still attached (%d) after Close", a)
	}
}

func TestXDPConcurrentWriters(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	peer := c.LocalAddr().(*net.UDPAddr).AddrPort()
	writeAll(t, x, []Msg{{Bufs: [][]byte{[]byte("first")}, Addr: peer}}) // resolves the neighbour
	const writers, each = 4, 50
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			var err error
			for i := 0; i < each && err == nil; i++ {
				for try := 0; try < 100; try++ {
					var n int
					n, err = x.Write([]Msg{{Bufs: [][]byte{payload(10, w)}, Addr: peer}})
					if n == 1 || !errors.Is(err, ErrWouldBlock) {
						break
					}
					err = x.WaitWritable()
				}
			}
			errs <- err
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	for i := range writers*each + 1 {
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
	}
}

func TestXDPKernelPeerIPv6(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ip6A)
	if x.Caps().MaxDatagram != 1500-40-8 {
		t.Fatalf("caps %+v", x.Caps())
	}
	var c *net.UDPConn
	inNS(t, tn.ns, func() (err error) {
		c, err = net.ListenUDP("udp6", &net.UDPAddr{IP: tn.ip6B.AsSlice()})
		return err
	})
	defer c.Close()
	peer := c.LocalAddr().(*net.UDPAddr).AddrPort()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2048)
	for _, size := range []int{0, 1, 1000, x.Caps().MaxDatagram} {
		p := payload(size, 6)
		if _, err := c.WriteToUDPAddrPort(p, x.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		m := readN(t, x, 1, 2048)[0]
		if m.N != size || !bytes.Equal(m.Bufs[0][:m.N], p) || m.Addr != peer {
			t.Fatalf("size %d: got N=%d from %v", size, m.N, m.Addr)
		}
		if dst, uni, ok := m.Dst(); !ok || !uni || dst != tn.ip6A {
			t.Fatalf("Dst %v %v %v", dst, uni, ok)
		}
		writeAll(t, x, []Msg{{Bufs: [][]byte{p}, Addr: peer}})
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil || n != size || !bytes.Equal(buf[:n], p) || from != x.LocalAddr() {
			t.Fatalf("size %d: kernel read %d from %v: %v", size, n, from, err)
		}
	}
}

func TestXDPModes(t *testing.T) {
	tn := newTestNet(t)
	if err := XDPAvailable("udwx-missing"); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("XDPAvailable on a missing interface: %v", err)
	}
	a := netip.AddrPortFrom(tn.ipA, 0)
	for _, bad := range []XDPConfig{
		{Interface: tn.a}, // no address
		{Interface: tn.a, Addr: netip.MustParseAddrPort("10.255.255.254:0")}, // not the interface's
		{Interface: tn.a, Addr: a, ZeroCopy: "sometimes"},
		{Interface: tn.a, Addr: a, Frames: 8},
	} {
		if x, err := OpenXDP(bad); err == nil {
			x.Close()
			t.Fatalf("OpenXDP(%+v) opened", bad)
		}
	}
	// veth has no zero-copy: "zerocopy" fails, "copy" and "auto" run in
	// copy mode.
	x, err := OpenXDP(XDPConfig{Interface: tn.a, Addr: a, Frames: 128, ZeroCopy: "zerocopy"})
	if err == nil {
		t.Logf("zero-copy on veth: %s", x.Caps().Detail)
		x.Close()
	} else {
		t.Logf("zerocopy refused: %v", err)
	}
	x, err = OpenXDP(XDPConfig{Interface: tn.a, Addr: a, Frames: 128, ZeroCopy: "copy", FrameSize: 2048})
	if err != nil {
		t.Fatal(err)
	}
	if d := x.Caps().Detail; !strings.Contains(d, "copy mode") || !strings.Contains(d, "native XDP") {
		t.Errorf("detail %q", d)
	}
	// A second link on the same interface: refused while the first holds it.
	if y, err := OpenXDP(XDPConfig{Interface: tn.a, Addr: a, Frames: 128}); err == nil {
		y.Close()
		t.Error("a second link opened on the same interface")
	} else {
		t.Logf("second link: %v", err)
	}
	x.Close()
}

func TestXDPGeneric(t *testing.T) {
	tn := newTestNet(t)
	xdpForceGeneric = true
	defer func() { xdpForceGeneric = false }()
	x := openTestXDP(t, tn.a, tn.ipA)
	if d := x.Caps().Detail; !strings.Contains(d, "generic XDP") {
		t.Fatalf("detail %q", d)
	}
	c := tn.peerUDP(t)
	peer := c.LocalAddr().(*net.UDPAddr).AddrPort()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	p := payload(1200, 8)
	if _, err := c.WriteToUDPAddrPort(p, x.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if m := readN(t, x, 1, 2048)[0]; !bytes.Equal(m.Bufs[0][:m.N], p) || m.Addr != peer {
		t.Fatalf("got %d bytes from %v", m.N, m.Addr)
	}
	writeAll(t, x, []Msg{{Bufs: [][]byte{p}, Addr: peer}})
	buf := make([]byte, 2048)
	if n, _, err := c.ReadFromUDPAddrPort(buf); err != nil || !bytes.Equal(buf[:n], p) {
		t.Fatalf("kernel read %d: %v", n, err)
	}
	if s := x.Stats(); s.RxKernel != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A datagram that comes in on a queue no socket serves reaches the
// port's kernel socket, and Read returns it all the same.
func TestXDPOtherQueueFallback(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	peer := c.LocalAddr().(*net.UDPAddr).AddrPort()
	// As if the NIC steered the flow elsewhere: no socket for queue 0.
	if err := x.objs.xsks.Delete(uint32(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteToUDPAddrPort([]byte("via the kernel"), x.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	m := readN(t, x, 1, 100)[0]
	if string(m.Bufs[0][:m.N]) != "via the kernel" || m.Addr != peer {
		t.Fatalf("got %q from %v", m.Bufs[0][:m.N], m.Addr)
	}
	if dst, uni, ok := m.Dst(); !ok || !uni || dst != tn.ipA {
		t.Fatalf("Dst %v %v %v", dst, uni, ok)
	}
	if s := x.Stats(); s.RxKernel != 1 || s.RxFrames != 0 {
		t.Fatalf("stats %+v", s)
	}
	if err := x.objs.xsks.Put(uint32(0), uint32(x.xsk)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteToUDPAddrPort([]byte("via XDP"), x.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	m = readN(t, x, 1, 100)[0]
	if string(m.Bufs[0][:m.N]) != "via XDP" || x.Stats().RxFrames != 1 {
		t.Fatalf("got %q, stats %+v", m.Bufs[0][:m.N], x.Stats())
	}
}

// TestXDPUnresolvedBounded: datagrams to next hops nobody answers for
// (what a spoofer's made-up sources draw) wait in the link, at most
// xdpUnresPerHop per destination and xdpUnresMax in all, and are
// dropped after xdpNeighWait; past the bound a Write says
// ErrNoNeighbour and probes no further; and a datagram to a known peer
// goes out at once meanwhile.
func TestXDPUnresolvedBounded(t *testing.T) {
	tn := newTestNet(t)
	x := openTestXDP(t, tn.a, tn.ipA)
	c := tn.peerUDP(t)
	to := func(host byte) netip.AddrPort {
		a := tn.ipA.As4()
		a[3] = host
		return netip.AddrPortFrom(netip.AddrFrom4(a), 9999)
	}
	msg := func(dst netip.AddrPort) Msg { return Msg{Bufs: [][]byte{[]byte("x")}, Addr: dst} }
	ms := []Msg{msg(to(50)), msg(to(50)), msg(to(50)), msg(to(50))}
	if n, err := x.Write(ms); n != xdpUnresPerHop || !errors.Is(err, ErrNoNeighbour) {
		t.Fatalf("four datagrams to one unknown next hop: %d taken, %v", n, err)
	}
	taken, refused := xdpUnresPerHop, 1
	for h := 60; h < 60+xdpUnresMax+6; h++ {
		switch _, err := x.Write([]Msg{msg(to(byte(h)))}); {
		case err == nil:
			taken++
		case errors.Is(err, ErrNoNeighbour):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if taken != xdpUnresMax || x.Waiting() != xdpUnresMax {
		t.Fatalf("%d datagrams taken, %d waiting; want the bound, %d", taken, x.Waiting(), xdpUnresMax)
	}
	st := x.Stats()
	if st.TxNeighProbes != uint64(xdpUnresMax-xdpUnresPerHop+1) {
		t.Fatalf("%d probes for %d next hops that could wait", st.TxNeighProbes, xdpUnresMax-xdpUnresPerHop+1)
	}
	// A datagram to the known peer is not held up behind them.
	peer := c.LocalAddr().(*net.UDPAddr).AddrPort()
	writeKnown := []Msg{msg(peer)}
	if _, err := c.WriteToUDPAddrPort([]byte("hi"), x.LocalAddr()); err != nil { // the kernel learns the peer
		t.Fatal(err)
	}
	readN(t, x, 1, 64)
	if n, err := x.Write(writeKnown); n != 1 || err != nil {
		t.Fatalf("a datagram to the known peer: %d, %v", n, err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64)
	if n, _, err := c.ReadFromUDPAddrPort(buf); err != nil || n != 1 {
		t.Fatalf("the known peer's datagram, behind %d waiting: %d, %v", x.Waiting(), n, err)
	}
	for end := time.Now().Add(10 * time.Second); x.Waiting() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d still wait 10 s later", x.Waiting())
		}
		if err := x.WaitWritable(); err != nil {
			t.Fatal(err)
		}
	}
	if st := x.Stats(); st.TxNoNeighbour != uint64(refused+xdpUnresMax) || st.TxFrames != 1 {
		t.Fatalf("%d dropped for no next hop (want %d), %d frames sent (want 1)", st.TxNoNeighbour, refused+xdpUnresMax, st.TxFrames)
	}
}

// TestXDPDeferredKick: on a busy link, Writes close together share a
// kick (a sender's run of messages), and a frame left owed goes out with
// no further call on the link: the timer kicks it.
func TestXDPDeferredKick(t *testing.T) {
	tn := newTestNet(t)
	x, err := OpenXDP(XDPConfig{Interface: tn.a, Addr: netip.AddrPortFrom(tn.ipA, 0), Frames: 1024, Busy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	c := tn.peerUDP(t)
	peer := c.LocalAddr().(*net.UDPAddr).AddrPort()
	writeAll(t, x, []Msg{{Bufs: [][]byte{[]byte("first")}, Addr: peer}}) // the next hop resolves
	buf := make([]byte, 64)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
		t.Fatal(err)
	}
	// Every Write is close to the last kick, and the timer waits (both
	// made long): only a full batch kicks while writing.
	xdpKickWindow, xdpKickTimer = time.Hour, time.Hour
	defer func() { xdpKickWindow, xdpKickTimer = xdpKickDefer, xdpKickDefer }()
	const n = 200
	before := x.Stats().TxKicks
	for i := range n {
		if _, err := x.Write([]Msg{{Bufs: [][]byte{{byte(i)}}, Addr: peer}}); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	kicks := x.Stats().TxKicks - before
	if o := x.owed.Load(); o != n%xdpKickBatch {
		t.Fatalf("%d frames owed a kick after the run, want %d", o, n%xdpKickBatch)
	}
	// Every datagram arrives with no further call on the link: the last
	// ones by the timer's kick (brought forward from its hour).
	x.txMu.Lock()
	armed := x.timerSet
	x.kickTimer.Reset(time.Millisecond)
	x.txMu.Unlock()
	if !armed {
		t.Fatal("frames owed a kick, and no timer armed to pay it")
	}
	for i := range n {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil || k != 1 || buf[0] != byte(i) {
			t.Fatalf("datagram %d: %d bytes (%d), %v; %d kicks", i, k, buf[0], err, x.Stats().TxKicks-before)
		}
	}
	if kicks != n/xdpKickBatch {
		t.Fatalf("%d kicks for %d Writes in a row, want one a batch of %d", kicks, n, xdpKickBatch)
	}
	t.Logf("%d Writes, %d kicks while writing, %d after", n, kicks, x.Stats().TxKicks-before-kicks)

	// An answer is never deferred: a Write after the link read a
	// datagram kicks at once. (The timer is long, so that only the Write
	// itself can have kicked.)
	x.Write([]Msg{{Bufs: [][]byte{{1}}, Addr: peer}})
	x.Write([]Msg{{Bufs: [][]byte{{2}}, Addr: peer}})
	if x.owed.Load() == 0 {
		t.Fatal("a Write right after another kicked at once: the deferral under test did not happen")
	}
	if _, err := c.WriteToUDPAddrPort([]byte("ping"), x.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	readN(t, x, 1, 64) // pays the owed kick too
	x.Write([]Msg{{Bufs: [][]byte{{3}}, Addr: peer}})
	if o := x.owed.Load(); o != 0 {
		t.Fatalf("the answer to a datagram read waits for a kick (%d owed)", o)
	}
	for want := byte(1); want <= 3; want++ {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if k, _, err := c.ReadFromUDPAddrPort(buf); err != nil || k != 1 || buf[0] != want {
			t.Fatalf("after the answer: %d bytes (%d), %v; want %d", k, buf[0], err, want)
		}
	}
}
