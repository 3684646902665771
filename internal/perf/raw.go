package perf

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The plain-UDP baselines in one process: socket pairs on loopback, each
// end a UDPEnd (sock.go says which system calls each polling mode makes,
// and why they are the fastest plain Go).

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

// rawLatency is the plain-UDP ping-pong: cfg.QPs socket pairs at once,
// each a UDPEnd echoing and a UDPEnd timing (sock.go).
func rawLatency(cfg Config) (Result, error) {
	unconn := cfg.Mode == ModeRawUDPUnconnected
	pair2 := connectedPair
	if unconn {
		pair2 = udpPair
	}
	var stop atomic.Bool
	var servers, clients sync.WaitGroup
	samples := make([][]int64, cfg.QPs)
	errs := make([]error, cfg.QPs)
	var echoes []*net.UDPConn
	defer func() {
		stop.Store(true)
		for _, c := range echoes {
			c.Close()
		}
		servers.Wait()
	}()
	for i := range cfg.QPs {
		a, b, err := pair2()
		if err != nil {
			return Result{}, err
		}
		defer a.Close()
		echoes = append(echoes, b)
		srv := &UDPEnd{Conn: b, Poll: cfg.Poll, Unconnected: unconn, Stop: &stop, Shared: cfg.QPs > 1}
		cli := &UDPEnd{Conn: a, Poll: cfg.Poll, Unconnected: unconn, Peer: b.LocalAddr().(*net.UDPAddr).AddrPort(), Stop: &stop, Shared: cfg.QPs > 1}
		servers.Go(func() { srv.Echo() })
		clients.Go(func() { samples[i], errs[i] = cli.PingPong(cfg.Size, cfg.Warmup, cfg.Iters) })
	}
	clients.Wait()
	return pooledLatency(cfg, samples, errs)
}

// rawBandwidth is the plain-UDP stream: cfg.QPs socket pairs, each a
// UDPEnd blasting sendmmsg batches and a UDPEnd taking them in with
// recvmmsg, both with large socket buffers.
func rawBandwidth(cfg Config) (Result, error) {
	unconn := cfg.Mode == ModeRawUDPUnconnected
	pair2 := connectedPair
	if unconn {
		pair2 = udpPair
	}
	var sending, stop atomic.Bool
	var sent, received atomic.Uint64
	var first, last atomic.Int64
	var senders, sinks sync.WaitGroup
	sending.Store(true)
	var conns []*net.UDPConn
	defer func() {
		stop.Store(true)
		for _, c := range conns {
			c.Close()
		}
		senders.Wait()
		sinks.Wait()
	}()
	for range cfg.QPs {
		tx, rx, err := pair2()
		if err != nil {
			return Result{}, err
		}
		conns = append(conns, tx, rx)
		sink := &UDPEnd{Conn: rx, Poll: cfg.Poll, Unconnected: unconn, Stop: &stop, Shared: cfg.QPs > 1}
		src := &UDPEnd{Conn: tx, Poll: cfg.Poll, Unconnected: unconn, Peer: rx.LocalAddr().(*net.UDPAddr).AddrPort(), Stop: &stop, Shared: cfg.QPs > 1, Rate: cfg.FlowRate()}
		sinks.Go(func() {
			if rawSinkStart != nil {
				rawSinkStart()
			}
			sink.Sink(func(n, _ int) {
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				received.Add(uint64(n))
			})
		})
		senders.Go(func() {
			n, _ := src.Blast(cfg.Size, &sending, uint64(cfg.Messages))
			sent.Add(n)
		})
	}
	// UDP: what the kernel dropped is lost; what it holds in a receive
	// queue has arrived, and the sinks read it before the count (on a
	// loaded machine a sink may get the CPU only after the senders stop).
	var rxs []*net.UDPConn
	for i := 1; i < len(conns); i += 2 {
		rxs = append(rxs, conns[i])
	}
	start := finish(cfg, &sending, &stop, &senders, func() bool { return allRead(rxs) })
	for _, c := range conns {
		c.Close() // the sinks return (stop is set: a busy one first sees it)
	}
	sinks.Wait()
	return bwResult(cfg, start, sent.Load(), received.Load(), time.Unix(0, first.Load()), time.Unix(0, last.Load())), nil
}

// pooledLatency is the latency result of several pairs' ping-pongs: their
// samples pooled, or the first pair's error.
func pooledLatency(cfg Config, samples [][]int64, errs []error) (Result, error) {
	var all []int64
	for i, s := range samples {
		if errs[i] != nil {
			return Result{}, errs[i]
		}
		all = append(all, s...)
	}
	return latResult(cfg, all), nil
}

// rawSinkStart, when set (by tests), runs before each raw-UDP bandwidth
// sink starts reading: a sink the scheduler starts late.
var rawSinkStart func()

// allRead says whether every socket's receive queue is empty (SIOCINQ: the
// size of the next datagram waiting, 0 for none).
func allRead(cs []*net.UDPConn) bool {
	for _, c := range cs {
		rc, err := c.SyscallConn()
		if err != nil {
			return true // closed: nothing more to read
		}
		n := 0
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if n > 0 {
			return false
		}
	}
	return true
}
