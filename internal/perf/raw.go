package perf

import (
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// The baselines are the fastest plain-socket Go we know for each polling
// mode (../shared/design/PERF-BASELINES.md): busy polling spins on a
// connected socket with raw non-blocking system calls on a locked OS
// thread; event mode uses net.UDPConn and the netpoller; bandwidth uses
// sendmmsg/recvmmsg batches (x/net/ipv4) and a 32 MiB receive buffer.

func udpPair() (a, b *net.UDPConn, err error) {
	lo := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}
	if a, err = net.ListenUDP("udp4", lo); err != nil {
		return nil, nil, err
	}
	if b, err = net.ListenUDP("udp4", lo); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// connectedPair returns two UDP sockets connected to each other.
func connectedPair() (a, b *net.UDPConn, err error) {
	la, lb, err := udpPair()
	if err != nil {
		return nil, nil, err
	}
	aa, ba := la.LocalAddr().(*net.UDPAddr), lb.LocalAddr().(*net.UDPAddr)
	la.Close()
	lb.Close()
	if a, err = net.DialUDP("udp4", aa, ba); err != nil {
		return nil, nil, err
	}
	if b, err = net.DialUDP("udp4", ba, aa); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

func sockaddr(c *net.UDPConn) unix.RawSockaddrInet4 {
	ap := c.LocalAddr().(*net.UDPAddr).AddrPort()
	var sa unix.RawSockaddrInet4
	sa.Family = unix.AF_INET
	sa.Addr = ap.Addr().Unmap().As4()
	p := ap.Port()
	sa.Port = p<<8 | p>>8
	return sa
}

func rawFD(c *net.UDPConn) uintptr {
	rc, _ := c.SyscallConn()
	var fd uintptr
	rc.Control(func(f uintptr) { fd = f })
	return fd
}

// spinWrite and spinRead are non-blocking raw system calls retried until
// they go through: the busy-poll baseline. A loop that lives in
// RawSyscall cannot be preempted, so every 1024 empty tries it yields:
// with more spinners than cores the others must get to run.
func spinWrite(fd uintptr, b []byte, unconn bool, to *unix.RawSockaddrInet4, stop *atomic.Bool) bool {
	for k := 1; !stop.Load(); k++ {
		var e syscall.Errno
		if unconn {
			_, _, e = syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
				unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(to)), unix.SizeofSockaddrInet4)
		} else {
			_, _, e = syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		}
		if e == 0 {
			return true
		}
		if k%1024 == 0 {
			runtime.Gosched()
		}
	}
	return false
}

func spinRead(fd uintptr, b []byte, unconn bool, stop *atomic.Bool) (int, bool) {
	var from unix.RawSockaddrAny
	for k := 1; !stop.Load(); k++ {
		var n uintptr
		var e syscall.Errno
		if unconn {
			fl := uint32(unix.SizeofSockaddrAny)
			n, _, e = syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
				unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&from)), uintptr(unsafe.Pointer(&fl)))
		} else {
			n, _, e = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		}
		if e == 0 {
			return int(n), true
		}
		if k%1024 == 0 {
			runtime.Gosched()
		}
	}
	return 0, false
}

// lockThread pins a busy poller to its OS thread, as the fastest spinning
// code does, when there are no more spinners than one pair.
func lockThread(cfg Config) func() {
	if cfg.Poll != qp.PollBusy || cfg.QPs > 1 {
		return func() {}
	}
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}

func rawLatency(cfg Config) (Result, error) {
	busy := cfg.Poll == qp.PollBusy
	type pair struct{ a, b *net.UDPConn }
	pairs := make([]pair, cfg.QPs)
	unconn := cfg.Mode == ModeRawUDPUnconnected
	pair2 := connectedPair
	if unconn {
		pair2 = udpPair
	}
	for i := range pairs {
		a, b, err := pair2()
		if err != nil {
			return Result{}, err
		}
		defer a.Close()
		defer b.Close()
		pairs[i] = pair{a, b}
	}
	var stop atomic.Bool
	var servers, clients sync.WaitGroup
	samples := make([][]int64, cfg.QPs)
	size := max(cfg.Size, 1)
	for i, p := range pairs {
		servers.Add(1)
		clients.Add(1)
		go func() {
			defer servers.Done()
			buf := make([]byte, 65536)
			if busy {
				defer lockThread(cfg)()
				fd := rawFD(p.b)
				to := sockaddr(p.a)
				for {
					n, ok := spinRead(fd, buf, unconn, &stop)
					if !ok || !spinWrite(fd, buf[:n], unconn, &to, &stop) {
						return
					}
				}
			}
			to := p.a.LocalAddr().(*net.UDPAddr).AddrPort()
			for {
				var n int
				var err error
				if unconn {
					n, _, err = p.b.ReadFromUDPAddrPort(buf)
				} else {
					n, err = p.b.Read(buf)
				}
				if err != nil {
					return
				}
				if unconn {
					_, err = p.b.WriteToUDPAddrPort(buf[:n], to)
				} else {
					_, err = p.b.Write(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer clients.Done()
			msg, buf := make([]byte, size), make([]byte, 65536)
			ns := make([]int64, 0, cfg.Iters)
			var fd uintptr
			to := sockaddr(p.b)
			toAP := p.b.LocalAddr().(*net.UDPAddr).AddrPort()
			if busy {
				defer lockThread(cfg)()
				fd = rawFD(p.a)
			}
			for it := range cfg.Warmup + cfg.Iters {
				t0 := time.Now()
				switch {
				case busy:
					spinWrite(fd, msg, unconn, &to, &stop)
					spinRead(fd, buf, unconn, &stop)
				case unconn:
					p.a.WriteToUDPAddrPort(msg, toAP)
					p.a.ReadFromUDPAddrPort(buf)
				default:
					p.a.Write(msg)
					p.a.Read(buf)
				}
				if it >= cfg.Warmup {
					ns = append(ns, int64(time.Since(t0))/2)
				}
			}
			samples[i] = ns
		}()
	}
	clients.Wait()
	stop.Store(true)
	for _, p := range pairs {
		p.b.Close()
	}
	servers.Wait()
	var all []int64
	for _, s := range samples {
		all = append(all, s...)
	}
	return latResult(cfg, all), nil
}

func rawBandwidth(cfg Config) (Result, error) {
	const batch = 32
	var sending, stop atomic.Bool
	var sent, received atomic.Uint64
	var first, last atomic.Int64
	var wg sync.WaitGroup
	sending.Store(true)
	var conns []*net.UDPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range cfg.QPs {
		tx, rx, err := udpPair()
		if err != nil {
			return Result{}, err
		}
		conns = append(conns, tx, rx)
		rc, _ := rx.SyscallConn()
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20) })
		to := rx.LocalAddr()
		wg.Add(2)
		go func() {
			defer wg.Done()
			p := ipv4.NewPacketConn(rx)
			ms := make([]ipv4.Message, batch)
			for i := range ms {
				ms[i].Buffers = [][]byte{make([]byte, 65536)}
			}
			for !stop.Load() {
				rx.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				n, err := p.ReadBatch(ms, 0)
				if err != nil || n == 0 {
					continue
				}
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				received.Add(uint64(n))
			}
		}()
		go func() {
			defer wg.Done()
			p := ipv4.NewPacketConn(tx)
			msg := make([]byte, max(cfg.Size, 1))
			ms := make([]ipv4.Message, batch)
			for i := range ms {
				ms[i].Buffers = [][]byte{msg}
				ms[i].Addr = to
			}
			for sending.Load() {
				n, err := p.WriteBatch(ms, 0)
				if err != nil {
					continue
				}
				sent.Add(uint64(n))
			}
		}()
	}
	start := finish(cfg, &sending, &stop, &wg, nil) // UDP: what is not there 50 ms later is lost
	return bwResult(cfg, start, sent.Load(), received.Load(), time.Unix(0, first.Load()), time.Unix(0, last.Load())), nil
}
