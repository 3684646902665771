package perf

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// RC (TCP + MPA) against plain Go TCP doing the same ping-pong or stream.

// rcSide is one end of an RC run: a device, a region and a connected QP.
type rcSide struct {
	dev *qp.Device
	pd  *qp.PD
	buf []byte // mr's memory
	mr  *qp.MR
	q   *qp.QP
	cq  *qp.CQ
}

func newRCSide(cfg Config, size int) (*rcSide, error) {
	dev, err := openDevice(cfg, qp.DeviceConfig{Poll: cfg.Poll})
	if err != nil {
		return nil, err
	}
	s := &rcSide{dev: dev, pd: dev.AllocPD()}
	fail := func(err error) (*rcSide, error) { dev.Close(); return nil, err }
	s.buf = make([]byte, rcDepth(size)*max(size, 1))
	if s.mr, err = s.pd.RegisterMemory(s.buf, qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessRemoteRead); err != nil {
		return fail(err)
	}
	if s.cq, err = dev.CreateCQ(4 * recvDepth); err != nil {
		return fail(err)
	}
	if s.q, err = s.pd.CreateQP(qp.QPAttr{Type: qp.RC, SendCQ: s.cq, RecvCQ: s.cq, Caps: qp.QPCaps{MaxSendWR: 1024, MaxRecvWR: recvDepth}}); err != nil {
		return fail(err)
	}
	if err := s.q.Modify(qp.ModifyAttr{State: qp.StateInit}); err != nil {
		return fail(err)
	}
	return s, nil
}

// rcDepth is how many receives of size bytes an RC run keeps posted: as
// many as UD's, within 4 MiB. More than TCP holds in flight on loopback
// buys nothing, and a larger ring only moves the target's copies out of
// the cache: with 32 MiB of 512 KiB receives RC Send reached 0.48x of
// plain TCP, with 4 MiB 0.73-0.81x (BENCHMARKS.md).
func rcDepth(size int) int { return max(4, min(recvDepth, (4<<20)/max(size, 1))) }

// rcPair connects a client QP to a server QP over loopback.
func rcPair(cfg Config, size int) (cli, srv *rcSide, err error) {
	if srv, err = newRCSide(cfg, size); err != nil {
		return nil, nil, err
	}
	if cli, err = newRCSide(cfg, size); err != nil {
		srv.dev.Close()
		return nil, nil, err
	}
	fail := func(err error) (*rcSide, *rcSide, error) { cli.dev.Close(); srv.dev.Close(); return nil, nil, err }
	l, err := srv.dev.ListenRC("127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	defer l.Close()
	rc := qp.RCConfig{NoCRC: cfg.NoCRC}
	acc := make(chan error, 1)
	go func() {
		r, err := l.Next(context.Background())
		if err == nil {
			err = r.Accept(srv.q, rc)
		}
		acc <- err
	}()
	if _, err := cli.q.Connect(context.Background(), l.Addr().String(), rc); err != nil {
		return fail(err)
	}
	if err := <-acc; err != nil {
		return fail(err)
	}
	return cli, srv, nil
}

// rcLatency: rc-send is a Send/Recv ping-pong; rc-read posts a Read and
// waits for it (the request one way, the response the other); rc-write is
// a Write ping-pong (rcWriteLatency).
func rcLatency(cfg Config) (Result, error) {
	if cfg.Mode == ModeRCWrite {
		return rcWriteLatency(cfg)
	}
	slot := max(cfg.Size, 1)
	cli, srv, err := rcPair(cfg, slot)
	if err != nil {
		return Result{}, err
	}
	defer cli.dev.Close()
	defer srv.dev.Close()
	busy := cfg.Poll == qp.PollBusy
	var stop atomic.Bool
	var wg sync.WaitGroup
	if cfg.Mode == ModeRCSend {
		for _, s := range []*rcSide{cli, srv} {
			for k := range rcDepth(slot) {
				s.q.PostRecv(&qp.RecvWR{ID: uint64(k * slot), SGL: []qp.SGE{s.mr.SGE(k*slot, slot)}})
			}
		}
	}
	// The server echoes Sends, and drives its device in busy mode.
	wg.Add(1)
	go func() {
		defer wg.Done()
		wc := make([]qp.WorkCompletion, 1)
		send := qp.SendWR{SGL: []qp.SGE{srv.mr.SGE(0, cfg.Size)}}
		recv := qp.RecvWR{SGL: make([]qp.SGE, 1)}
		for next(srv.cq, busy, wc, &stop) {
			if wc[0].Status != qp.Success {
				return // flushed: the run is over
			}
			if wc[0].Opcode != qp.WCRecv {
				continue
			}
			recv.ID = wc[0].ID
			recv.SGL[0] = srv.mr.SGE(int(wc[0].ID), slot)
			srv.q.PostRecv(&recv)
			srv.q.PostSend(&send)
		}
	}()
	defer func() { stop.Store(true); cli.dev.Close(); srv.dev.Close(); wg.Wait() }()
	defer lockThread(cfg)()
	wr := qp.SendWR{SGL: []qp.SGE{cli.mr.SGE(0, cfg.Size)}}
	if cfg.Mode == ModeRCRead {
		wr.Opcode, wr.Flags, wr.RemoteSTag, wr.RemoteTO = qp.OpRead, qp.FlagSignaled, srv.mr.STag(), srv.mr.Addr()
	}
	want := map[Mode]qp.WCOpcode{ModeRCSend: qp.WCRecv, ModeRCRead: qp.WCRDMARead}[cfg.Mode]
	wc := make([]qp.WorkCompletion, 1)
	recv := qp.RecvWR{SGL: make([]qp.SGE, 1)}
	ns := make([]int64, 0, cfg.Iters)
	for it := range cfg.Warmup + cfg.Iters {
		t0 := time.Now()
		if err := cli.q.PostSend(&wr); err != nil {
			return Result{}, err
		}
		for {
			if !next(cli.cq, busy, wc, &stop) {
				return Result{}, errStopped
			}
			if wc[0].Status != qp.Success {
				return Result{}, errors.New("perf: RC completion " + wc[0].Status.String())
			}
			if wc[0].Opcode == want {
				break
			}
		}
		if it >= cfg.Warmup {
			ns = append(ns, int64(time.Since(t0))/2)
		}
		if cfg.Mode == ModeRCSend {
			recv.ID = wc[0].ID
			recv.SGL[0] = cli.mr.SGE(int(wc[0].ID), slot)
			cli.q.PostRecv(&recv)
		}
	}
	return latResult(cfg, ns), nil
}

// rcWriteLatency is perftest's ib_write_lat over RC: each side RDMA
// Writes its message into the other's region and learns that the other's
// Write arrived by watching the last byte of its own region change, as an
// RDMA application with no receive posted does. That needs busy polling:
// a software stack places data only when something drives it, which here
// is the CQ.Poll of the watching loop (ib_write_lat has no event mode
// either).
func rcWriteLatency(cfg Config) (Result, error) {
	cli, srv, err := rcPair(cfg, cfg.Size)
	if err != nil {
		return Result{}, err
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait(); cli.dev.Close(); srv.dev.Close() }()
	// Each region holds the outgoing message at 0 and the incoming one at
	// cfg.Size (the region has room for at least four).
	in := cfg.Size
	last := cfg.Size - 1
	// await drives s's device until the last byte of its incoming message
	// is mark.
	await := func(s *rcSide, mark byte, wcs []qp.WorkCompletion) bool {
		for k := 1; s.buf[in+last] != mark; k++ {
			for _, wc := range wcs[:s.cq.Poll(wcs)] {
				if wc.Status != qp.Success {
					return false
				}
			}
			if k%1024 == 0 {
				runtime.Gosched()
				if stop.Load() {
					return false
				}
			}
		}
		return true
	}
	write := func(from, to *rcSide, mark byte) error {
		from.buf[last] = mark
		return from.q.PostSend(&qp.SendWR{Opcode: qp.OpWrite, SGL: []qp.SGE{from.mr.SGE(0, cfg.Size)}, RemoteSTag: to.mr.STag(), RemoteTO: to.mr.Addr() + uint64(in)})
	}
	wg.Add(1)
	go func() { // the server writes each message back once it has arrived
		defer wg.Done()
		defer lockThread(cfg)()
		wcs := make([]qp.WorkCompletion, 16)
		for it := 0; await(srv, WriteMark(it), wcs) && write(srv, cli, WriteMark(it)) == nil; it++ {
		}
	}()
	defer lockThread(cfg)()
	wcs := make([]qp.WorkCompletion, 16)
	ns := make([]int64, 0, cfg.Iters)
	for it := range cfg.Warmup + cfg.Iters {
		t0 := time.Now()
		if err := write(cli, srv, WriteMark(it)); err != nil {
			return Result{}, err
		}
		if !await(cli, WriteMark(it), wcs) {
			return Result{}, errors.New("perf: rc-write ping-pong failed")
		}
		if it >= cfg.Warmup {
			ns = append(ns, int64(time.Since(t0))/2)
		}
	}
	return latResult(cfg, ns), nil
}

// WriteMark is the last byte of the it-th message of a Write ping-pong
// (never zero, so a fresh region does not look written).
func WriteMark(it int) byte { return byte(it%255 + 1) }

// rcBandwidth streams messages of cfg.Size: Sends counted at the
// receiver, Writes and Reads by the source's completions (TCP delivers
// what it took, in order; a Read completes when its data is placed).
func rcBandwidth(cfg Config) (Result, error) {
	slot := max(cfg.Size, 1)
	cli, srv, err := rcPair(cfg, slot)
	if err != nil {
		return Result{}, err
	}
	defer cli.dev.Close()
	defer srv.dev.Close()
	busy := cfg.Poll == qp.PollBusy
	var sending, stop atomic.Bool
	var sent, done atomic.Uint64
	var first, last atomic.Int64
	var wg sync.WaitGroup
	sending.Store(true)
	credit := make(chan struct{}, 1)
	mark := func(n int) {
		now := time.Now().UnixNano()
		first.CompareAndSwap(0, now)
		last.Store(now)
		done.Add(uint64(n))
		select {
		case credit <- struct{}{}:
		default:
		}
	}
	if cfg.Mode == ModeRCSend {
		for k := range rcDepth(slot) {
			srv.q.PostRecv(&qp.RecvWR{ID: uint64(k * slot), SGL: []qp.SGE{srv.mr.SGE(k*slot, slot)}})
		}
	}
	wg.Add(1)
	go func() { // the target: reposts receives, and drives its device in busy mode
		defer wg.Done()
		wcs := make([]qp.WorkCompletion, 64)
		recv := qp.RecvWR{SGL: make([]qp.SGE, 1)}
		for !stop.Load() {
			n := srv.cq.Poll(wcs)
			if n == 0 {
				if !busy {
					waitBriefly(srv.cq)
				}
				continue
			}
			k := 0
			for _, wc := range wcs[:n] {
				if wc.Status == qp.WRFlushError {
					return
				}
				if wc.Opcode == qp.WCRecv && wc.Status == qp.Success {
					k++
					recv.ID = wc.ID
					recv.SGL[0] = srv.mr.SGE(int(wc.ID), slot)
					srv.q.PostRecv(&recv)
				}
			}
			if k > 0 {
				mark(k)
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		wr := qp.SendWR{SGL: []qp.SGE{cli.mr.SGE(0, cfg.Size)}}
		switch cfg.Mode {
		case ModeRCSend:
			wr.Flags = qp.FlagSignaled
		case ModeRCWrite:
			wr.Opcode, wr.Flags, wr.RemoteSTag, wr.RemoteTO = qp.OpWrite, qp.FlagSignaled, srv.mr.STag(), srv.mr.Addr()
		case ModeRCRead:
			wr.Opcode, wr.Flags, wr.RemoteSTag, wr.RemoteTO = qp.OpRead, qp.FlagSignaled, srv.mr.STag(), srv.mr.Addr()
		}
		depth := 64
		if cfg.Mode == ModeRCRead {
			depth = 16 // ORD
		}
		// Sends need a receive posted at the target (RC has no
		// receiver-not-ready: a Send without one ends the connection), and
		// TCP completes them long before they are received: the sender
		// keeps within the receives the target has posted (a credit count
		// the harness shares in memory, as an application would carry it
		// in its messages).
		credits := rcDepth(slot) - 2
		wcs := make([]qp.WorkCompletion, 64)
		out := 0
		for !stop.Load() {
			for sending.Load() && out < depth && (cfg.Mode != ModeRCSend || int(sent.Load()-done.Load()) < credits) {
				if cli.q.PostSend(&wr) != nil {
					break
				}
				out++
				sent.Add(1)
			}
			n := cli.cq.Poll(wcs)
			if n == 0 {
				if out == 0 || (cfg.Mode == ModeRCSend && int(sent.Load()-done.Load()) >= credits) {
					select { // waiting for credits, not for a completion
					case <-credit:
					case <-time.After(10 * time.Millisecond):
					}
				} else if !busy {
					waitBriefly(cli.cq)
				}
				continue
			}
			out -= n
			if cfg.Mode != ModeRCSend {
				mark(n)
			}
		}
	}()
	start := finish(cfg, &sending, &stop, &wg, func() bool { return done.Load() >= sent.Load() })
	return bwResult(cfg, start, sent.Load(), done.Load(), time.Unix(0, first.Load()), time.Unix(0, last.Load())), nil
}

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
			n, _ := src.Stream(cfg.Size, &sending)
			sent.Add(n)
		})
	}
	// The senders stop after cfg.Duration; the run then waits for every
	// byte sent to arrive (TCP loses nothing), within DrainLimit.
	start := time.Now()
	time.Sleep(cfg.Duration)
	sending.Store(false)
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
