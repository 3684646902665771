package qp

import (
	"bytes"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/llp"
)

// TestXDPInterop: a device on an AF_XDP link (DeviceConfig.Lower) and a
// device on a kernel UDP socket, in two namespaces joined by a veth
// pair, talk the same wire: UD Sends both ways, RD Sends and an RD
// Write both ways, and a Write-Record message. The socket peer keeps its
// segments within the veth's MTU (an AF_XDP reader takes no IP
// fragments: docs/llp.md).
func TestXDPInterop(t *testing.T) {
	nsA := newNetns(t, "link set lo up")
	nsB := newNetns(t, "link set lo up")
	veth := fmt.Sprintf("udx%d", netnstest.Seq())
	for _, c := range [][]string{
		{nsA, "!ip link add " + veth + "a netns " + nsA + " type veth peer name " + veth + "b netns " + nsB},
		{nsA, "addr add 10.213.0.1/24 dev " + veth + "a"}, {nsA, "link set " + veth + "a up"},
		{nsB, "addr add 10.213.0.2/24 dev " + veth + "b"}, {nsB, "link set " + veth + "b up"},
	} {
		runIn(t, c[0], c[1])
	}
	inNetns(t, nsB, func() {
		if err := netnstest.TxChecksumOff(veth + "b"); err != nil {
			t.Fatal(err)
		}
	})
	inNetns(t, nsA, func() {
		if err := llp.XDPAvailable(veth + "a"); err != nil {
			t.Skipf("AF_XDP unavailable here: %v", err)
		}
	})
	const seg = 1400
	rd := RDConfig{Segment: seg}
	var x, k *node // x on AF_XDP, k on a kernel socket
	inNetns(t, nsA, func() {
		x = newNode(t, DeviceConfig{Lower: LowerXDP, XDP: llp.XDPConfig{Frames: 2048}}, "udp4", "10.213.0.1:0")
	})
	inNetns(t, nsB, func() { k = newNode(t, DeviceConfig{}, "udp4", "10.213.0.2:0") })
	if c := x.sock.Link(); c.Kind != "xdp" {
		t.Fatalf("the AF_XDP device's socket runs on %s (%s)", c.Kind, c.Detail)
	}
	t.Logf("AF_XDP end: %s", x.sock.Link().Detail)

	// UD Sends both ways. The AF_XDP end's first one finds the kernel
	// not knowing the peer's MAC yet: it waits in the link for the
	// answer, as a socket's datagram waits in the kernel's queue, and
	// arrives.
	xl := x.sock.ll.(*llp.XDP)
	udExchange := func(from, to *node, size int, tag int) {
		t.Helper()
		ah := from.ah(to, to.qp)
		fill(from.buf[:size], tag)
		mustPost(t, to.qp.PostRecv(&RecvWR{ID: uint64(tag), SGL: []SGE{to.mr.SGE(0, 2048)}}))
		mustPost(t, from.qp.PostSend(&SendWR{ID: uint64(tag), Flags: FlagSignaled, SGL: []SGE{from.mr.SGE(0, size)}, AH: ah}))
		if wc := collect(t, from.cq, 1, 10*time.Second)[0]; wc.Status != Success {
			t.Fatalf("UD Send of %d bytes: %+v", size, wc)
		}
		if wc := collect(t, to.cq, 1, 10*time.Second)[0]; wc.ID != uint64(tag) || wc.Status != Success ||
			int(wc.Len) != size || !bytes.Equal(to.buf[:size], from.buf[:size]) {
			t.Fatalf("UD %d bytes: %+v", size, wc)
		}
	}

	for i, size := range []int{1, 64, 1400, x.sock.MaxMessage()} {
		udExchange(x, k, size, 10+i)
		if st := xl.Stats(); i == 0 && (st.TxNeighProbes == 0 || st.TxNoNeighbour != 0) {
			t.Fatalf("the first send did not wait for its next hop (the path under test): %+v", st)
		}
		udExchange(k, x, size, 20+i)
	}

	// RD both ways: Sends of every size up to several segments, and a
	// Write of 256 KiB.
	qx, cqx := rdQPOn(t, x, rd)
	qk, cqk := rdQPOn(t, k, rd)
	rdRun := func(from, to *node, qf, qt *QP, cqf, cqt *CQ) {
		t.Helper()
		region, err := to.pd.RegisterMemory(make([]byte, 256<<10), AccessLocalWrite|AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		ah := from.ah(to, qt)
		const n = 100
		const slot = 8000
		for i := range n {
			mustPost(t, qt.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{to.mr.SGE(i*slot, slot)}}))
		}
		fill(from.buf[:n*slot], 7)
		// The Write first: the Sends' receives complete after it is
		// placed (RD keeps a peer's order), so reading the region after
		// them is ordered after its placement.
		mustPost(t, qf.PostSend(&SendWR{ID: 999, Opcode: OpWrite, Flags: FlagSignaled, SGL: []SGE{from.mr.SGE(0, 256<<10)}, AH: ah,
			RemoteSTag: region.STag(), RemoteTO: region.Addr()}))
		for i := range n {
			size := 1 + (i*797)%slot
			mustPost(t, qf.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{from.mr.SGE(i*slot, size)}, AH: ah}))
		}
		for i, wc := range collect(t, cqt, n, 30*time.Second) {
			size := 1 + (i*797)%slot
			if wc.ID != uint64(i) || wc.Status != Success || int(wc.Len) != size || !bytes.Equal(to.buf[i*slot:i*slot+size], from.buf[i*slot:i*slot+size]) {
				t.Fatalf("RD receive %d: %+v", i, wc)
			}
		}
		for _, wc := range collect(t, cqf, n+1, 30*time.Second) {
			if wc.Status != Success {
				t.Fatalf("RD send: %+v", wc)
			}
		}
		if !bytes.Equal(region.Bytes(), from.buf[:256<<10]) {
			t.Fatal("the RD Write's bytes differ")
		}
	}
	rdRun(x, k, qx, qk, cqx, cqk)
	rdRun(k, x, qk, qx, cqk, cqx)

	// Write-Record from the socket end to the AF_XDP end, in MTU-sized
	// segments.
	wx := x.newQP(QPAttr{Type: UD, SendCQ: x.cq, RecvCQ: x.cq, Caps: QPCaps{MaxSendWR: 64, MaxRecvWR: 64}})
	wk := k.newQP(QPAttr{Type: UD, SendCQ: k.cq, RecvCQ: k.cq, WriteRecordSegment: seg, Caps: QPCaps{MaxSendWR: 64, MaxRecvWR: 64}})
	region, err := x.pd.RegisterMemory(make([]byte, 64<<10), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	fill(k.buf[:64<<10], 9)
	ah := k.ah(x, wx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mustPost(t, wk.PostSend(&SendWR{ID: 1, Opcode: OpWriteRecord, Flags: FlagSignaled, SGL: []SGE{k.mr.SGE(0, 64<<10)}, AH: ah,
			RemoteSTag: region.STag(), RemoteTO: region.Addr()}))
		waitWC(t, k.cq, 1)
		wcs := make([]WorkCompletion, 1)
		end := time.Now().Add(100 * time.Millisecond)
		for time.Now().Before(end) && x.cq.Poll(wcs) == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		if wcs[0].Status == Success && wcs[0].Opcode == WCWriteRecord {
			if wcs[0].Len != 64<<10 || !bytes.Equal(region.Bytes(), k.buf[:64<<10]) {
				t.Fatalf("Write-Record: %+v", wcs[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Write-Record message never arrived whole")
		}
	}
	st := x.dev.Stats()
	if st.RxDatagrams.Load() == 0 || st.TxDatagrams.Load() == 0 {
		t.Fatalf("the AF_XDP device moved nothing: %+v", st.Snapshot())
	}

	// A UD Send to a host nobody answers for completes as on a socket
	// (the datagram waits for its next hop, then is dropped), and does
	// not hold up a Send to the known peer behind it.
	nobody, err := x.pd.CreateAH(netip.MustParseAddrPort("10.213.0.99:4791"), 5)
	if err != nil {
		t.Fatal(err)
	}
	mustPost(t, x.qp.PostSend(&SendWR{ID: 77, Flags: FlagSignaled, SGL: []SGE{x.mr.SGE(0, 64)}, AH: nobody}))
	if wc := collect(t, x.cq, 1, 10*time.Second)[0]; wc.ID != 77 || wc.Status != Success {
		t.Fatalf("a send to a next hop being resolved: %+v", wc)
	}
	if xl.Waiting() != 1 {
		t.Fatalf("%d datagrams wait for a next hop, want the one to nobody", xl.Waiting())
	}
	udExchange(x, k, 64, 30)
	for end := time.Now().Add(10 * time.Second); xl.Waiting() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the datagram to nobody still waits after 10 s")
		}
	}
	if st := xl.Stats(); st.TxNoNeighbour != 1 {
		t.Fatalf("the datagram to nobody was not dropped: %+v", st)
	}
}

// BenchmarkXDPRoundTrip is BenchmarkRoundTripCPU's UD ping-pong between
// two devices on AF_XDP links in two namespaces joined by a veth pair,
// busy polling, in one goroutine: the stack and the AF_XDP path, for
// its CPU profile (the figures are experiments/xdp.sh's, two processes
// on two cores).
func BenchmarkXDPRoundTrip(b *testing.B) {
	nsA := netnstest.New(b, "link set lo up")
	nsB := netnstest.New(b, "link set lo up")
	veth := fmt.Sprintf("udb%d", netnstest.Seq())
	for _, c := range []struct{ ns, cmd string }{
		{nsA, "link add " + veth + "a type veth peer name " + veth + "b netns " + nsB},
		{nsA, "addr add 10.216.0.1/24 dev " + veth + "a"}, {nsA, "link set " + veth + "a up"},
		{nsB, "addr add 10.216.0.2/24 dev " + veth + "b"}, {nsB, "link set " + veth + "b up"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", c.ns}, strings.Fields(c.cmd)...)...).CombinedOutput(); err != nil {
			b.Fatalf("ip %s: %v: %s", c.cmd, err, out)
		}
	}
	var x, y *node
	cfg := DeviceConfig{Poll: PollBusy, Lower: LowerXDP, XDP: llp.XDPConfig{Frames: 1024}}
	netnstest.In(b, nsA, func() {
		if err := llp.XDPAvailable(veth + "a"); err != nil {
			b.Skipf("AF_XDP unavailable here: %v", err)
		}
		x = newNode(b, cfg, "udp4", "10.216.0.1:0")
	})
	netnstest.In(b, nsB, func() { y = newNode(b, cfg, "udp4", "10.216.0.2:0") })
	// Each end learns the other's MAC first: a datagram waiting for its
	// next hop leaves with a later call on its link, and the ping-pong
	// polls only the far end while it waits.
	for _, p := range [][2]*node{{x, y}, {y, x}} {
		l := p[0].sock.ll.(*llp.XDP)
		if _, err := l.Write([]llp.Msg{{Bufs: [][]byte{{0}}, Addr: p[1].sock.LocalAddr()}}); err != nil {
			b.Fatal(err)
		}
		for end := time.Now().Add(10 * time.Second); l.Waiting() > 0; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(end) {
				b.Fatal("a next hop did not resolve in 10 s")
			}
			l.WaitWritable()
		}
	}
	udRoundTrip(b, 64, x, y)
}
