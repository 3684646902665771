package perf

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// RC's figures come from the queue-pair halves (end.go); what is left
// here is its depth rule, the Write ping-pong's mark, and the plain-TCP
// baseline it is compared with.

// rcDepth is how many receives of size bytes an RC end keeps posted: as
// many as UD's, within 4 MiB. More than TCP holds in flight on loopback
// buys nothing, and a larger ring only moves the target's copies out of
// the cache: with 32 MiB of 512 KiB receives RC Send reached 0.48x of
// plain TCP, with 4 MiB 0.73-0.81x (BENCHMARKS.md).
func rcDepth(size int) int { return max(4, min(recvDepth, (4<<20)/max(size, 1))) }

// creditsPer is how many reposted receives one credit message returns
// (creditBatch, or half the receives when fewer are posted: a batch
// larger than what the sender was first given would never come back).
// Both ends compute it from the message size.
func creditsPer(slot int) int { return max(1, min(creditBatch, rcDepth(slot)/2)) }

// recvDepth bounds the receives a Send mode's end keeps posted.
const recvDepth = 256

// WriteMark is the last byte of the it-th message of a Write ping-pong
// (never zero, so a fresh region does not look written).
func WriteMark(it int) byte { return byte(it%255 + 1) }

// The plain-TCP baseline (raw-tcp): cfg.QPs connections, each a TCPEnd
// at either end (sock.go): busy, raw non-blocking read and write system
// calls spinning on a locked OS thread; event, net.TCPConn in the
// netpoller; TCP_NODELAY, as RC sets it, and large socket buffers; no
// deadlines.

func tcpPair() (a, b *net.TCPConn, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		<-acc
		return nil, nil, err
	}
	s := <-acc
	if s == nil {
		c.Close()
		return nil, nil, errors.New("perf: accept failed")
	}
	a, b = c.(*net.TCPConn), s.(*net.TCPConn)
	TuneTCP(a)
	TuneTCP(b)
	return a, b, nil
}

// tcpPairs opens n connections; close closes them all.
func tcpPairs(n int) (as, bs []*net.TCPConn, err error) {
	for range n {
		a, b, err := tcpPair()
		if err != nil {
			closeTCP(as, bs)
			return nil, nil, err
		}
		as, bs = append(as, a), append(bs, b)
	}
	return as, bs, nil
}

func closeTCP(cs ...[]*net.TCPConn) {
	for _, l := range cs {
		for _, c := range l {
			c.Close()
		}
	}
}

func rawTCPLatency(cfg Config) (Result, error) {
	as, bs, err := tcpPairs(cfg.QPs)
	if err != nil {
		return Result{}, err
	}
	var stop atomic.Bool
	var servers, clients sync.WaitGroup
	defer func() { stop.Store(true); closeTCP(as, bs); servers.Wait() }()
	samples := make([][]int64, cfg.QPs)
	errs := make([]error, cfg.QPs)
	for i := range cfg.QPs {
		srv := &TCPEnd{Conn: bs[i], Poll: cfg.Poll, Stop: &stop, Shared: cfg.QPs > 1}
		cli := &TCPEnd{Conn: as[i], Poll: cfg.Poll, Stop: &stop, Shared: cfg.QPs > 1}
		servers.Go(func() { srv.Echo(cfg.Size) })
		clients.Go(func() { samples[i], errs[i] = cli.PingPong(cfg.Size, cfg.Warmup, cfg.Iters) })
	}
	clients.Wait()
	return pooledLatency(cfg, samples, errs)
}

// rawTCPBandwidth streams cfg.Size-byte writes on cfg.QPs connections;
// the receivers count bytes.
func rawTCPBandwidth(cfg Config) (Result, error) {
	as, bs, err := tcpPairs(cfg.QPs)
	if err != nil {
		return Result{}, err
	}
	var sending, stop atomic.Bool
	var sent, got atomic.Uint64
	var first, last atomic.Int64
	var senders, sinks sync.WaitGroup
	defer func() { stop.Store(true); closeTCP(as, bs); senders.Wait(); sinks.Wait() }()
	sending.Store(true)
	for i := range cfg.QPs {
		sink := &TCPEnd{Conn: bs[i], Poll: cfg.Poll, Stop: &stop, Shared: cfg.QPs > 1}
		src := &TCPEnd{Conn: as[i], Poll: cfg.Poll, Stop: &stop, Shared: cfg.QPs > 1}
		sinks.Go(func() {
			sink.Sink(func(n int) {
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				got.Add(uint64(n))
			})
		})
		senders.Go(func() {
			// Bytes, not messages: a write cut short still sent what it
			// wrote.
			n, _ := src.Stream(cfg.Size, &sending, uint64(cfg.Messages))
			sent.Add(n)
		})
	}
	// The senders stop after cfg.Duration (or their cfg.Messages); the run
	// then waits for every byte sent to arrive (TCP loses nothing), within
	// DrainLimit.
	start := time.Now()
	if cfg.Messages == 0 {
		time.Sleep(cfg.Duration)
		sending.Store(false)
	}
	senders.Wait()
	WaitUntil(DrainLimit, func() bool { return got.Load() >= sent.Load() })
	stop.Store(true)
	closeTCP(as, bs)
	sinks.Wait()
	size := uint64(max(cfg.Size, 1))
	r := Result{Config: cfg, Sent: sent.Load() / size, Received: got.Load() / size}
	el := time.Duration(last.Load() - first.Load()).Seconds()
	if el <= 0 { // all of it in one read: the run's span stands in (bwResult)
		el = time.Unix(0, last.Load()).Sub(start).Seconds()
	}
	if el > 0 {
		r.Gbps = float64(got.Load()) * 8 / el / 1e9
		r.Mpps = float64(r.Received) / el / 1e6
	}
	return r, nil
}
