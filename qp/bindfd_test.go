package qp

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// udpFD opens and binds a UDP socket with plain system calls, as a
// program (the LD_PRELOAD engine's host) would, with a small SO_RCVBUF.
func udpFD(t *testing.T) (int, netip.AddrPort) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 16384); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	a := sa.(*unix.SockaddrInet4)
	return fd, netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
}

// manualQP makes a UD QP with its own receive queue on a manual socket.
func manualQP(t *testing.T, d *Device, s *Socket) (*QP, *CQ, *MR) {
	t.Helper()
	pd := d.AllocPD()
	cq, err := d.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, Caps: QPCaps{MaxSendWR: 4, MaxRecvWR: 16, MaxInline: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Activate(s); err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegisterMemory(make([]byte, 16*2048), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if err := q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{mr.SGE(i*2048, 2048)}}); err != nil {
			t.Fatal(err)
		}
	}
	return q, cq, mr
}

// A manual socket (BindFD) over a program's descriptor: the device
// starts no reader and changes no option, reads only in Progress, never
// closes the descriptor, follows it to a duplicate (SetFD), and gives a
// second socket's QP the number its peers address (Alias).
func TestBindFD(t *testing.T) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fdA, addrA := udpFD(t)
	fdB, addrB := udpFD(t)
	sa, err := d.BindFD(fdA)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.BindFD(fdB)
	if err != nil {
		t.Fatal(err)
	}
	if sa.LocalAddr() != addrA || sb.LocalAddr() != addrB {
		t.Fatalf("addresses %v %v, want %v %v", sa.LocalAddr(), sb.LocalAddr(), addrA, addrB)
	}
	if v, _ := unix.GetsockoptInt(fdA, unix.SOL_SOCKET, unix.SO_RCVBUF); v != 2*16384 {
		t.Fatalf("SO_RCVBUF %d after BindFD: the program's 16384 (doubled by the kernel) must stay", v)
	}
	qa, cqa, mra := manualQP(t, d, sa)
	qb, cqb, mrb := manualQP(t, d, sb)
	if qa.QPN() == qb.QPN() {
		t.Fatal("two QPs share a number")
	}

	peer := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	send := func(to netip.AddrPort, qpn uint32, msg string) {
		t.Helper()
		ah, err := peer.pd.CreateAH(to, qpn)
		if err != nil {
			t.Fatal(err)
		}
		if err := peer.qp.PostSend(&SendWR{ID: 1, Inline: []byte(msg), AH: ah}); err != nil {
			t.Fatal(err)
		}
	}
	wc := make([]WorkCompletion, 1)
	// progress reads one datagram when it has come (the peer's send is
	// asynchronous) and returns the completion, if any.
	progress := func(s *Socket, cq *CQ) *WorkCompletion {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for s.Progress(1) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no datagram came")
			}
			time.Sleep(time.Millisecond)
		}
		if cq.Poll(wc) == 0 {
			return nil
		}
		return &wc[0]
	}

	// Without Progress nothing is read: the datagram waits in the kernel.
	send(addrA, qa.QPN(), "to A")
	eventually(t, "the datagram waiting in the kernel", func() bool {
		n, err := unix.IoctlGetInt(fdA, unix.SIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if cqa.Poll(wc) != 0 || d.stats.RxDatagrams.Load() != 0 {
		t.Fatal("a manual socket was read without Progress")
	}
	if w := progress(sa, cqa); w == nil || w.Status != Success || string(mra.Bytes()[w.ID*2048:][:w.Len]) != "to A" {
		t.Fatalf("A received %+v", w)
	}

	// B's QP has another number; its peers address qa's (say, the shims'
	// fixed one). Without an alias that is an unknown QP on B's socket.
	send(addrB, qa.QPN(), "unaliased")
	if w := progress(sb, cqb); w != nil {
		t.Fatalf("B received %+v for a QP that is not on its socket", w)
	}
	if d.stats.RxUnknownQP.Load() != 1 {
		t.Fatalf("unknown QP %d, want 1", d.stats.RxUnknownQP.Load())
	}
	if err := sb.Alias(qa.QPN(), qa); err == nil {
		t.Fatal("Alias took a QP of another socket")
	}
	if err := sb.Alias(qa.QPN(), qb); err != nil {
		t.Fatal(err)
	}
	send(addrB, qa.QPN(), "aliased")
	if w := progress(sb, cqb); w == nil || w.Status != Success || string(mrb.Bytes()[w.ID*2048:][:w.Len]) != "aliased" {
		t.Fatalf("B received %+v", w)
	}
	// The alias does not take A's own traffic.
	send(addrA, qa.QPN(), "still A")
	if w := progress(sa, cqa); w == nil || string(mra.Bytes()[w.ID*2048:][:w.Len]) != "still A" {
		t.Fatalf("A received %+v", w)
	}

	// SetFD: the program dups the descriptor and closes the first one.
	dup, err := unix.FcntlInt(uintptr(fdB), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	if err := sb.SetFD(dup); err != nil {
		t.Fatal(err)
	}
	unix.Close(fdB)
	send(addrB, qa.QPN(), "via the dup")
	if w := progress(sb, cqb); w == nil || string(mrb.Bytes()[w.ID*2048:][:w.Len]) != "via the dup" {
		t.Fatalf("B received %+v after SetFD", w)
	}
	ah, err := qb.pd.CreateAH(peer.sock.LocalAddr(), peer.qp.QPN())
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.qp.PostRecv(&RecvWR{ID: 9, SGL: []SGE{peer.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	if err := qb.PostSend(&SendWR{ID: 3, Inline: []byte("reply"), AH: ah, Flags: FlagSignaled}); err != nil {
		t.Fatal(err)
	}
	got := waitWC(t, peer.cq, 1)
	if got[0].Status != Success || string(peer.buf[:got[0].Len]) != "reply" || got[0].Source != addrB {
		t.Fatalf("the peer received %+v %q", got[0], peer.buf[:got[0].Len])
	}
	// The aliased QP's frames carry the alias as their source: the number
	// its peers address it by (RD keys its sessions by it).
	if got[0].SourceQPN != qa.QPN() {
		t.Fatalf("the reply came from QP %d, want the alias %d (the QP is %d)", got[0].SourceQPN, qa.QPN(), qb.QPN())
	}

	// Sends that went out directly started no datamover and made no
	// inline slot.
	sb.txMu.Lock()
	mover := sb.mover
	sb.txMu.Unlock()
	if mover {
		t.Fatal("a datamover started for direct sends")
	}
	for i := range qb.sq.buf {
		if qb.sq.buf[i].inline != nil {
			t.Fatal("an inline slot was made for a direct send")
		}
	}

	// Close: the socket alone; the descriptor stays the caller's.
	if err := qb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(dup), unix.F_GETFD, 0); err != nil {
		t.Fatalf("Close closed the caller's descriptor: %v", err)
	}
	if sb.Progress(1) != 0 {
		t.Fatal("a closed socket read")
	}
	if err := sb.SetFD(dup); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetFD on a closed socket: %v", err)
	}
	d.mu.Lock()
	n := len(d.sockets)
	d.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d sockets listed after one of two closed", n)
	}
	if l := d.socketList.Load(); l != nil && len(*l) != 0 {
		t.Fatalf("busy pollers list %d manual sockets", len(*l))
	}
	send(addrA, qa.QPN(), "A goes on")
	if w := progress(sa, cqa); w == nil || string(mra.Bytes()[w.ID*2048:][:w.Len]) != "A goes on" {
		t.Fatalf("A received %+v after B closed", w)
	}
}

func TestBindFDRefuses(t *testing.T) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	unbound, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unbound)
	tcp, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tcp)
	for name, fd := range map[string]int{"unbound": unbound, "TCP": tcp, "negative": -1, "not open": 1 << 20} {
		if _, err := d.BindFD(fd); err == nil {
			t.Errorf("BindFD took a %s descriptor", name)
		}
	}
	d.Close()
	fd, _ := udpFD(t)
	if _, err := d.BindFD(fd); !errors.Is(err, ErrClosed) {
		t.Fatalf("BindFD on a closed device: %v", err)
	}
}

// A manual socket's Progress lends its read as many pooled buffers as the
// last read needed, doubling while reads fill them: a poll of an idle
// socket lends one (not limit: a spinning program's poll would cost a
// pool round trip per slot), a burst is read in growing batches with
// nothing lost, and an idle poll brings it back to one.
func TestManualProgressLends(t *testing.T) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fd, addr := udpFD(t)
	s, err := d.BindFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.Progress(64); n != 0 || s.rx.lendN != 1 {
		t.Fatalf("an idle poll read %d and lends %d next", n, s.rx.lendN)
	}
	out, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(out)
	to := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	const burst = 12
	for range burst {
		if err := unix.Sendto(out, []byte("not a DDP segment"), 0, to); err != nil {
			t.Fatal(err)
		}
	}
	var reads []int
	total := 0
	for end := time.Now().Add(5 * time.Second); total < burst; {
		if time.Now().After(end) {
			t.Fatalf("read %d of %d datagrams: %v", total, burst, reads)
		}
		lend := max(s.rx.lendN, 1)
		n := s.Progress(64)
		if n > lend {
			t.Fatalf("a read of %d datagrams with %d buffers lent", n, lend)
		}
		if n > 0 {
			reads = append(reads, n)
			total += n
		}
	}
	if reads[0] != 1 || len(reads) < 3 {
		t.Fatalf("the burst was read %v: want 1 first, then growing batches", reads)
	}
	if n := s.Progress(64); n != 0 || s.rx.lendN != 1 {
		t.Fatalf("an idle poll after the burst read %d and lends %d next", n, s.rx.lendN)
	}
}

// A manual socket that was read keeps its first slot's buffer between
// reads (no pool round trip per poll), within the process's budget, and
// lets it go when it closes, by its own Close or its device's.
func TestManualProgressKeepsFirstBuffer(t *testing.T) {
	before := firstBufs.Load()
	for _, byDevice := range []bool{false, true} {
		d, err := Open(DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		fd, _ := udpFD(t)
		s, err := d.BindFD(fd)
		if err != nil {
			t.Fatal(err)
		}
		s.Progress(8)
		kept := s.rx.first
		if kept == nil || firstBufs.Load() != before+1 {
			t.Fatalf("after a poll: kept %v, %d kept in the process (%d before)", kept != nil, firstBufs.Load(), before)
		}
		s.Progress(8)
		if s.rx.first != kept {
			t.Fatal("a second poll changed the kept buffer")
		}
		if byDevice {
			d.Close()
		} else {
			s.Close()
			d.Close()
		}
		if s.rx.first != nil || firstBufs.Load() != before {
			t.Fatalf("closed (by its device: %v): %d kept in the process (%d before)", byDevice, firstBufs.Load(), before)
		}
	}
}
