package qp

import (
	"net"
	"syscall"
	"testing"
	"unsafe"

	"github.com/udiwarp/udiwarp/protect"

	"github.com/udiwarp/udiwarp/llp"
	"golang.org/x/sys/unix"
)

// BenchmarkPostSend measures the direct send path: header, CRC, sendmsg
// from the registered buffer, unsignaled. It must not allocate.
func BenchmarkPostSend(b *testing.B) {
	for _, size := range []int{64, 1024} {
		b.Run(itoa(size), func(b *testing.B) {
			a := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
			dst := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0") // receives nothing: the datagrams are dropped
			wr := SendWR{SGL: []SGE{a.mr.SGE(0, size)}, AH: a.ah(dst, dst.qp)}
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if err := a.qp.PostSend(&wr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPoll measures polling a CQ that holds completions, and an
// empty one. Neither may allocate.
func BenchmarkPoll(b *testing.B) {
	d, _ := Open(DeviceConfig{})
	defer d.Close()
	cq, _ := d.CreateCQ(1024)
	wcs := make([]WorkCompletion, 16)
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		wc := WorkCompletion{ID: 1, Len: 64}
		for b.Loop() {
			for range 16 {
				cq.push(&wc)
			}
			if cq.Poll(wcs) != 16 {
				b.Fatal("poll")
			}
		}
	})
	b.Run("empty", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if cq.Poll(wcs) != 0 {
				b.Fatal("poll")
			}
		}
	})
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// BenchmarkReceivePath measures the user-space receive path of one
// datagram: parse, CRC, QP lookup, placement, completion, poll, repost.
func BenchmarkReceivePath(b *testing.B) {
	for _, size := range []int{64, 1024} {
		b.Run(itoa(size), func(b *testing.B) {
			a := newNode(b, DeviceConfig{Poll: PollBusy}, "udp4", "127.0.0.1:0")
			dg := udiwarpSend(a.qp.QPN(), 7, make([]byte, size))
			wr := RecvWR{SGL: []SGE{a.mr.SGE(0, 4096)}}
			mustPost(b, a.qp.PostRecv(&wr))
			wcs := make([]WorkCompletion, 1)
			src := a.sock.LocalAddr()
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				a.dev.deliver(a.sock, dg, false, src)
				if a.cq.Poll(wcs) != 1 || wcs[0].Status != Success {
					b.Fatal("no completion")
				}
				mustPost(b, a.qp.PostRecv(&wr))
			}
		})
	}
}

// BenchmarkRoundTripCPU measures the CPU cost of one ping-pong round trip
// with both ends in one goroutine, so that no wake-up or poll-detection
// delay enters the figure: A sends, B receives and answers, A receives. On
// loopback the kernel delivers a datagram during the sender's system call,
// so each receive finds it queued. Beside UD Send/Recv, the same round trip
// over plain UDP sockets: connected read/write, and unconnected
// sendto/recvfrom (as a UD QP's socket must be). The difference between
// them is exactly what the stack adds to busy-poll latency, twice.
func BenchmarkRoundTripCPU(b *testing.B) {
	for _, size := range []int{64, 96, 1024} {
		b.Run("size="+itoa(size)+"/mode=raw-udp", func(b *testing.B) { rawRoundTrip(b, size, true) })
		b.Run("size="+itoa(size)+"/mode=raw-udp-unconn", func(b *testing.B) { rawRoundTrip(b, size, false) })
		b.Run("size="+itoa(size)+"/mode=ud-send", func(b *testing.B) {
			cfg := DeviceConfig{Poll: PollBusy}
			udRoundTrip(b, size, newNode(b, cfg, "udp4", "127.0.0.1:0"), newNode(b, cfg, "udp4", "127.0.0.1:0"))
		})
		// The stack alone: the same round trip over the in-memory link,
		// no system call (issue 35's CPU target).
		b.Run("size="+itoa(size)+"/mode=ud-send-mem", func(b *testing.B) {
			cfg := DeviceConfig{Poll: PollBusy}
			net := llp.NewMemNet()
			udRoundTrip(b, size, newMemNode(b, cfg, net, "10.0.0.1:4791"), newMemNode(b, cfg, net, "10.0.0.2:4791"))
		})
		// Protected (issue 36's cost): the same over the in-memory link
		// and over sockets, with a pre-shared key.
		for _, m := range []protect.Mode{protect.Auth, protect.AEAD} {
			cfg := DeviceConfig{Poll: PollBusy, Protect: protect.Config{Mode: m, PSK: make([]byte, 16)}}
			b.Run("size="+itoa(size)+"/mode=ud-send-mem+"+m.String(), func(b *testing.B) {
				net := llp.NewMemNet()
				udRoundTrip(b, size, newMemNode(b, cfg, net, "10.0.0.1:4791"), newMemNode(b, cfg, net, "10.0.0.2:4791"))
			})
			b.Run("size="+itoa(size)+"/mode=ud-send+"+m.String(), func(b *testing.B) {
				udRoundTrip(b, size, newNode(b, cfg, "udp4", "127.0.0.1:0"), newNode(b, cfg, "udp4", "127.0.0.1:0"))
			})
		}
	}
}

// udRoundTrip is BenchmarkRoundTripCPU's UD ping-pong between x and y.
func udRoundTrip(b *testing.B, size int, x, y *node) {
	const depth = 64
	for i := range depth {
		mustPost(b, x.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{x.mr.SGE(4096*i, 4096)}}))
		mustPost(b, y.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{y.mr.SGE(4096*i, 4096)}}))
	}
	toY := SendWR{SGL: []SGE{x.mr.SGE(1<<19, size)}, AH: x.ah(y, y.qp)}
	toX := SendWR{SGL: []SGE{y.mr.SGE(1<<19, size)}, AH: y.ah(x, x.qp)}
	wc := make([]WorkCompletion, 1)
	recv := RecvWR{SGL: make([]SGE, 1)}
	await := func(n *node) {
		for k := 0; n.cq.Poll(wc) == 0; k++ {
			if k > 1e6 {
				b.Fatal("no completion")
			}
		}
		if wc[0].Status != Success || int(wc[0].Len) != size {
			b.Fatalf("%+v", wc[0])
		}
		recv.ID = wc[0].ID
		recv.SGL[0] = n.mr.SGE(4096*int(wc[0].ID), 4096)
		if err := n.qp.PostRecv(&recv); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := x.qp.PostSend(&toY); err != nil {
			b.Fatal(err)
		}
		await(y)
		if err := y.qp.PostSend(&toX); err != nil {
			b.Fatal(err)
		}
		await(x)
	}
}

// rawStreamCPU is BenchmarkStreamCPU's baseline: the same stream over
// two plain UDP sockets in one goroutine, sendto(2) for each datagram and
// recvfrom(2) for each, as raw system calls (the stack's own sockets are
// unconnected too, and take 8 MiB receive buffers, as these do).
func rawStreamCPU(b *testing.B, size, batch int) {
	open := func() (int, unix.RawSockaddrInet4) {
		fd, a := openRawUDP(b)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
		}
		return fd, unix.RawSockaddrInet4{Family: unix.AF_INET, Port: uint16(a.Port>>8) | uint16(a.Port&0xff)<<8, Addr: a.Addr}
	}
	x, _ := open()
	y, ya := open()
	msg, buf := make([]byte, size), make([]byte, 65536)
	var from unix.RawSockaddrAny
	b.SetBytes(int64(size))
	b.ReportAllocs()
	sent, got := 0, 0
	for b.Loop() {
		if _, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(x), uintptr(unsafe.Pointer(&msg[0])), uintptr(size),
			0, uintptr(unsafe.Pointer(&ya)), unix.SizeofSockaddrInet4); e != 0 {
			b.Fatal(e)
		}
		if sent++; sent-got < batch {
			continue
		}
		for got < sent {
			fl := uintptr(unix.SizeofSockaddrAny)
			n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(y), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
				unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&from)), uintptr(unsafe.Pointer(&fl)))
			if e != 0 || int(n) != size {
				b.Fatalf("received %d: %v (%d of %d)", n, e, got, sent)
			}
			got++
		}
	}
}

// openRawUDP opens a loopback UDP socket for the raw baselines and
// returns its descriptor and address: a net.UDPConn, as udperf's
// baselines and the device's own sockets are, registered with the
// netpoller, whose wake-up callback every arriving datagram runs.
func openRawUDP(b *testing.B) (int, *unix.SockaddrInet4) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	var fd int
	rc, _ := c.SyscallConn()
	rc.Control(func(f uintptr) { fd = int(f) })
	sa, _ := unix.Getsockname(fd)
	return fd, sa.(*unix.SockaddrInet4)
}

func rawRoundTrip(b *testing.B, size int, connected bool) {
	x, xa := openRawUDP(b)
	y, ya := openRawUDP(b)
	if connected {
		unix.Connect(x, ya)
		unix.Connect(y, xa)
	}
	buf := make([]byte, 65536)
	msg := make([]byte, size)
	// Raw system calls, as the fastest busy-polling code makes them: no
	// scheduler hand-off, no sockaddr conversion or allocation.
	send := func(fd int, to *unix.SockaddrInet4) {
		var e syscall.Errno
		if connected {
			_, _, e = syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&msg[0])), uintptr(size))
		} else {
			sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Port: uint16(to.Port>>8) | uint16(to.Port&0xff)<<8, Addr: to.Addr}
			_, _, e = syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&msg[0])), uintptr(size),
				0, uintptr(unsafe.Pointer(&sa)), unix.SizeofSockaddrInet4)
		}
		if e != 0 {
			b.Fatal(e)
		}
	}
	var from unix.RawSockaddrAny
	recv := func(fd int) {
		for k := 0; ; k++ {
			var n uintptr
			var e syscall.Errno
			if connected {
				n, _, e = syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			} else {
				fl := uint32(unix.SizeofSockaddrAny)
				n, _, e = syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
					0, uintptr(unsafe.Pointer(&from)), uintptr(unsafe.Pointer(&fl)))
			}
			if e == 0 && int(n) == size {
				return
			}
			if k > 1e6 {
				b.Fatal("no datagram", e)
			}
		}
	}
	for b.Loop() {
		send(x, ya)
		recv(y)
		send(y, xa)
		recv(x)
	}
}

// BenchmarkStreamCPU measures the CPU cost of a one-way stream of
// 64000-byte Sends with both ends in one goroutine (busy-polled devices,
// so nothing waits on a wake-up): post a batch of Sends, poll the
// receiver until it completed them and repost, poll the sender's
// completions (on RD: the acknowledgements). ns/op is one message's cost,
// sender, kernel and receiver together: goodput on a machine whose
// other core is idle would be bounded by it, and unlike a goodput run it
// does not depend on how the two cores are scheduled. UD and RD Send side
// by side, so that their ratio is of one sitting.
func BenchmarkStreamCPU(b *testing.B) {
	const size, batch = 64000, 16
	b.Run("mode=raw-udp-unconn", func(b *testing.B) { rawStreamCPU(b, size, batch) })
	for _, typ := range []QPType{UD, RD} {
		b.Run("mode="+map[QPType]string{UD: "ud-send", RD: "rd-send"}[typ], func(b *testing.B) {
			cfg := DeviceConfig{Poll: PollBusy}
			x := newNode(b, cfg, "udp4", "127.0.0.1:0")
			y := newNode(b, cfg, "udp4", "127.0.0.1:0")
			tx, rx := x.qp, y.qp
			if typ == RD {
				tx = x.newQP(QPAttr{Type: RD, SendCQ: x.cq, RecvCQ: x.cq, Caps: QPCaps{MaxSendWR: 256, MaxRecvWR: 256}})
				rx = y.newQP(QPAttr{Type: RD, SendCQ: y.cq, RecvCQ: y.cq, Caps: QPCaps{MaxSendWR: 256, MaxRecvWR: 256}})
			}
			for i := range batch {
				mustPost(b, rx.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{y.mr.SGE(65536*i, 65536)}}))
			}
			wr := SendWR{Flags: FlagSignaled, SGL: []SGE{x.mr.SGE(0, size)}, AH: x.ah(y, rx)}
			wcs := make([]WorkCompletion, batch)
			recv := RecvWR{SGL: make([]SGE, 1)}
			b.SetBytes(size)
			b.ReportAllocs()
			sent, got, acked := 0, 0, 0
			for b.Loop() {
				if sent-got < batch {
					if err := tx.PostSend(&wr); err != nil {
						b.Fatal(err)
					}
					sent++
					if sent-got < batch {
						continue
					}
				}
				for k := 0; got < sent; k++ {
					for _, wc := range wcs[:y.cq.Poll(wcs)] {
						if wc.Status != Success || wc.Len != size {
							b.Fatalf("%+v", wc)
						}
						recv.ID, recv.SGL[0] = wc.ID, y.mr.SGE(65536*int(wc.ID), 65536)
						mustPost(b, rx.PostRecv(&recv))
						got++
					}
					acked += x.cq.Poll(wcs)
					if k > 1e7 {
						b.Fatalf("%d of %d received", got, sent)
					}
				}
			}
			for k := 0; acked < sent && k < 1e7; k++ {
				y.cq.Poll(wcs[:0])
				acked += x.cq.Poll(wcs)
			}
			if testing.Verbose() {
				xs, ys := x.dev.Stats(), y.dev.Stats()
				b.Logf("%d msgs: x tx %d rx %d retrans %d timers %d; y tx %d rx %d landed %d timers %d", sent, xs.TxDatagrams.Load(), xs.RxDatagrams.Load(), xs.RDRetransmits.Load(), xs.Timers.Load(), ys.TxDatagrams.Load(), ys.RxDatagrams.Load(), ys.RxLanded.Load(), ys.Timers.Load())
			}
		})
	}
}

// BenchmarkDestroyAmongManyQPs measures creating and destroying a QP on
// an SRQ that serves many others, as the LD_PRELOAD engine does for
// every socket a program opens and closes (a QP per socket, all on one
// SRQ; a SIPp UAC closes thousands a second among 16,000 open): neither
// may cost in proportion to the QPs the SRQ serves.
func BenchmarkDestroyAmongManyQPs(b *testing.B) {
	for _, n := range []int{100, 20000} {
		b.Run(itoa(n), func(b *testing.B) {
			d, err := Open(DeviceConfig{MaxQP: n + 16})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			pd := d.AllocPD()
			cq, err := d.CreateCQ(64)
			if err != nil {
				b.Fatal(err)
			}
			srq, err := pd.CreateSRQ(64, 1)
			if err != nil {
				b.Fatal(err)
			}
			attr := QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, SRQ: srq, SRQLimit: 4, Caps: QPCaps{MaxSendWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}
			for range n {
				if _, err := pd.CreateQP(attr); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				q, err := pd.CreateQP(attr)
				if err != nil {
					b.Fatal(err)
				}
				q.Destroy()
			}
		})
	}
}
