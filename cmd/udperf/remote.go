package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/qp"
)

// `udperf server` and `udperf client`: the two ends in two processes (or
// hosts, or network namespaces). The client connects to the server's
// control port (TCP), asks for a run, learns the server's endpoint, runs
// it, and prints the figures; bandwidth is measured where the data
// arrives, at the server, and sent back on the control connection.
// Modes: ud-send, rd-send, rc-send, raw-udp, raw-tcp.

const defaultControl = ":18515" // perftest's port

var remoteModes = map[perf.Mode]bool{perf.ModeUDSend: true, perf.ModeRDSend: true, perf.ModeRCSend: true,
	perf.ModeRawUDP: true, perf.ModeRawTCP: true}

type runRequest struct {
	Mode     perf.Mode     `json:"mode"`
	Test     string        `json:"test"`
	Size     int           `json:"size"`
	Poll     string        `json:"poll"`
	Duration time.Duration `json:"duration"`
}

type runReply struct {
	Error string `json:"error,omitempty"`
	Addr  string `json:"addr,omitempty"` // the data endpoint
	QPN   uint32 `json:"qpn,omitempty"`
	// After a bandwidth run: what the server received.
	Received uint64  `json:"received,omitempty"`
	Gbps     float64 `json:"gbps,omitempty"`
	Mpps     float64 `json:"mpps,omitempty"`
}

func server(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", defaultControl, "control address to listen on")
	once := fs.Bool("once", false, "serve one run, then exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "udperf server: %v\n", err)
		return 1
	}
	defer ln.Close()
	fmt.Fprintf(stdout, "udperf server: control at %s\n", ln.Addr())
	return serveOn(ln, *once, stderr)
}

// serveOn serves client runs, one at a time, from ln until it closes.
func serveOn(ln net.Listener, once bool, stderr io.Writer) int {
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintf(stderr, "udperf server: %v\n", err)
			return 1
		}
		if err := serveRun(c, stderr); err != nil {
			fmt.Fprintf(stderr, "udperf server: %v\n", err)
		}
		if once {
			return 0
		}
	}
}

// serveRun serves one client's run on control connection c.
func serveRun(c net.Conn, stderr io.Writer) error {
	defer c.Close()
	rd := bufio.NewReader(c)
	enc := json.NewEncoder(c)
	var req runRequest
	if err := json.NewDecoder(rd).Decode(&req); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	reply := func(r runReply) { enc.Encode(r) }
	if !remoteModes[req.Mode] || (req.Test != "lat" && req.Test != "bw") || req.Size < 0 || req.Size > 65000 {
		reply(runReply{Error: fmt.Sprintf("cannot serve mode %q test %q size %d (modes: ud-send, rd-send, rc-send, raw-udp, raw-tcp; lat or bw; at most 65000 bytes)", req.Mode, req.Test, req.Size)})
		return nil
	}
	host, _, _ := net.SplitHostPort(c.LocalAddr().String())
	ep, err := newEndpoint(req, host)
	if err != nil {
		reply(runReply{Error: err.Error()})
		return err
	}
	defer ep.close()
	reply(runReply{Addr: ep.addr, QPN: ep.qpn})
	// The run lasts until the client says done (or goes away).
	var done struct{ Done bool }
	json.NewDecoder(rd).Decode(&done)
	r := ep.stop()
	reply(r)
	return nil
}

// endpoint is the server's end of one run.
type endpoint struct {
	addr  string
	qpn   uint32
	stop  func() runReply
	close func()
}

func newEndpoint(req runRequest, host string) (*endpoint, error) {
	slot := max(req.Size, 1)
	var stopFlag atomic.Bool
	var wg sync.WaitGroup
	var received, bytes atomic.Uint64
	var first, last atomic.Int64
	note := func(n int) {
		now := time.Now().UnixNano()
		first.CompareAndSwap(0, now)
		last.Store(now)
		received.Add(1)
		bytes.Add(uint64(n))
	}
	result := func() runReply {
		r := runReply{Received: received.Load()}
		if el := time.Duration(last.Load() - first.Load()).Seconds(); el > 0 && r.Received > 1 {
			r.Gbps = float64(bytes.Load()) * 8 / el / 1e9
			r.Mpps = float64(r.Received) / el / 1e6
		}
		return r
	}
	echo := req.Test == "lat"
	poll := qp.PollEvent
	if req.Poll == "busy" {
		poll = qp.PollBusy
	}
	ep := &endpoint{}
	switch req.Mode {
	case perf.ModeRawUDP:
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		ep.addr = pc.LocalAddr().String()
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65536)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				if echo {
					pc.WriteTo(buf[:n], from)
				} else {
					note(n)
				}
			}
		}()
		ep.close = func() { pc.Close(); wg.Wait() }
	case perf.ModeRawTCP:
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		ep.addr = ln.Addr().String()
		var conn atomic.Pointer[net.Conn]
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Store(&c)
			buf := make([]byte, max(slot, 1<<20))
			for {
				if echo {
					if _, err := io.ReadFull(c, buf[:slot]); err != nil {
						return
					}
					if _, err := c.Write(buf[:slot]); err != nil {
						return
					}
					continue
				}
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				bytes.Add(uint64(n))
				received.Store(bytes.Load() / uint64(slot))
			}
		}()
		ep.close = func() {
			ln.Close()
			if c := conn.Load(); c != nil {
				(*c).Close()
			}
			wg.Wait()
		}
	default: // ud-send, rd-send, rc-send: a QP that echoes or counts Sends
		dev, err := qp.Open(qp.DeviceConfig{Poll: poll, RecvBuffer: 32 << 20})
		if err != nil {
			return nil, err
		}
		pd := dev.AllocPD()
		depth := 256
		mr, err := pd.RegisterMemory(make([]byte, depth*slot), qp.AccessLocalWrite)
		if err != nil {
			dev.Close()
			return nil, err
		}
		cq, _ := dev.CreateCQ(4 * depth)
		typ := map[perf.Mode]qp.QPType{perf.ModeUDSend: qp.UD, perf.ModeRDSend: qp.RD, perf.ModeRCSend: qp.RC}[req.Mode]
		q, err := pd.CreateQP(qp.QPAttr{Type: typ, SendCQ: cq, RecvCQ: cq, Caps: qp.QPCaps{MaxSendWR: 1024, MaxRecvWR: depth}})
		if err != nil {
			dev.Close()
			return nil, err
		}
		var l *qp.RCListener
		if typ == qp.RC {
			q.Modify(qp.ModifyAttr{State: qp.StateInit})
			if l, err = dev.ListenRC(net.JoinHostPort(host, "0")); err != nil {
				dev.Close()
				return nil, err
			}
			ep.addr = l.Addr().String()
		} else {
			sock, err := dev.Bind("udp", net.JoinHostPort(host, "0"))
			if err != nil {
				dev.Close()
				return nil, err
			}
			for _, st := range []qp.ModifyAttr{{State: qp.StateInit, Socket: sock}, {State: qp.StateRTR}, {State: qp.StateRTS}} {
				q.Modify(st)
			}
			ep.addr, ep.qpn = sock.LocalAddr().String(), q.QPN()
		}
		for k := range depth {
			q.PostRecv(&qp.RecvWR{ID: uint64(k * slot), SGL: []qp.SGE{mr.SGE(k*slot, slot)}})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l != nil {
				r, err := l.Next(context.Background())
				if err != nil || r.Accept(q, qp.RCConfig{}) != nil {
					return
				}
			}
			ahs := map[netip.AddrPort]*qp.AH{}
			wcs := make([]qp.WorkCompletion, 64)
			for !stopFlag.Load() {
				n := cq.Poll(wcs)
				if n == 0 {
					if poll != qp.PollBusy {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
						cq.Wait(ctx)
						cancel()
					}
					continue
				}
				for _, wc := range wcs[:n] {
					if wc.Opcode != qp.WCRecv {
						continue
					}
					if wc.Status != qp.Success {
						if wc.Status == qp.WRFlushError {
							return
						}
						continue
					}
					q.PostRecv(&qp.RecvWR{ID: wc.ID, SGL: []qp.SGE{mr.SGE(int(wc.ID), slot)}})
					if !echo {
						note(int(wc.Len))
						continue
					}
					wr := qp.SendWR{SGL: []qp.SGE{mr.SGE(int(wc.ID), int(wc.Len))}}
					if typ != qp.RC {
						ah := ahs[wc.Source]
						if ah == nil {
							ah, _ = pd.CreateAH(wc.Source, wc.SourceQPN)
							ahs[wc.Source] = ah
						}
						wr.AH = ah
					}
					q.PostSend(&wr)
				}
			}
		}()
		ep.close = func() {
			stopFlag.Store(true)
			if l != nil {
				l.Close()
			}
			dev.Close()
			wg.Wait()
		}
	}
	ep.stop = func() runReply {
		time.Sleep(50 * time.Millisecond) // what is still on its way arrives
		return result()
	}
	return ep, nil
}

func client(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "the server's control address (HOST:PORT)")
	var f benchFlags
	f.register(fs, false)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	m, err := parseMode(f.mode)
	if err == nil && !remoteModes[m] {
		err = fmt.Errorf("mode %s runs only in `udperf local` for now (server/client: ud-send, rd-send, rc-send, raw-udp, raw-tcp)", m)
	}
	if err == nil && *addr == "" {
		err = errors.New("-addr HOST:PORT of the server is required")
	}
	if err == nil && f.all {
		err = errors.New("-a is not available with client yet; give -s")
	}
	if err == nil && m == perf.ModeRCSend && f.test != "lat" {
		// RC has no receiver-not-ready: a stream of Sends needs credits
		// from the receiver, which the control protocol does not carry yet.
		err = errors.New("rc-send runs only -test lat over server/client (bandwidth: udperf local)")
	}
	var cfgs []perf.Config
	if err == nil {
		cfgs, err = f.configs(m)
	}
	if err != nil {
		fmt.Fprintf(stderr, "udperf client: %v\n", err)
		return 2
	}
	cfg := cfgs[0]
	if cfg.Size > 65000 {
		fmt.Fprintln(stderr, "udperf client: -s at most 65000 over server/client")
		return 2
	}
	r, err := runRemote(*addr, cfg, f.test, f.poll)
	if err != nil {
		fmt.Fprintf(stderr, "udperf client: %v\n", err)
		return 1
	}
	return emit(stdout, stderr, "client", fs, &f, []row{rowOf(f.test, r)})
}

// runRemote runs cfg against the server at addr.
func runRemote(addr string, cfg perf.Config, test, pollName string) (perf.Result, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return perf.Result{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(cfg.Duration + 5*time.Minute))
	dec := json.NewDecoder(c)
	enc := json.NewEncoder(c)
	if err := enc.Encode(runRequest{Mode: cfg.Mode, Test: test, Size: cfg.Size, Poll: pollName, Duration: cfg.Duration}); err != nil {
		return perf.Result{}, err
	}
	var rep runReply
	if err := dec.Decode(&rep); err != nil {
		return perf.Result{}, fmt.Errorf("the server's answer: %w", err)
	}
	if rep.Error != "" {
		return perf.Result{}, errors.New("server: " + rep.Error)
	}
	res, err := drive(cfg, test, rep)
	enc.Encode(struct{ Done bool }{true})
	if err != nil {
		return perf.Result{}, err
	}
	var fin runReply
	if err := dec.Decode(&fin); err != nil {
		return perf.Result{}, fmt.Errorf("the server's figures: %w", err)
	}
	if test == "bw" {
		res.Received, res.Gbps, res.Mpps = fin.Received, fin.Gbps, fin.Mpps
		if res.Sent > res.Received {
			res.Lost = res.Sent - res.Received
		}
		res.ValidBytes = res.Received * uint64(cfg.Size)
	}
	return res, nil
}

// drive runs the client's end: a ping-pong (lat) or a stream (bw).
func drive(cfg perf.Config, test string, rep runReply) (perf.Result, error) {
	size := max(cfg.Size, 1)
	res := perf.Result{Config: cfg}
	var ping func() error // one round trip
	var push func() bool  // one message of a stream
	var closeAll func()
	switch cfg.Mode {
	case perf.ModeRawUDP:
		c, err := net.Dial("udp", rep.Addr)
		if err != nil {
			return res, err
		}
		closeAll = func() { c.Close() }
		buf := make([]byte, 65536)
		msg := make([]byte, size)
		ping = func() error {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write(msg); err != nil {
				return err
			}
			_, err := c.Read(buf)
			return err
		}
		push = func() bool { _, err := c.Write(msg); return err == nil }
	case perf.ModeRawTCP:
		c, err := net.Dial("tcp", rep.Addr)
		if err != nil {
			return res, err
		}
		c.(*net.TCPConn).SetNoDelay(true)
		closeAll = func() { c.Close() }
		buf := make([]byte, size)
		msg := make([]byte, size)
		ping = func() error {
			if _, err := c.Write(msg); err != nil {
				return err
			}
			_, err := io.ReadFull(c, buf)
			return err
		}
		push = func() bool { _, err := c.Write(msg); return err == nil }
	default:
		dev, err := qp.Open(qp.DeviceConfig{Poll: cfg.Poll, RecvBuffer: 32 << 20})
		if err != nil {
			return res, err
		}
		closeAll = func() { dev.Close() }
		pd := dev.AllocPD()
		mr, _ := pd.RegisterMemory(make([]byte, 64*size), qp.AccessLocalWrite)
		cq, _ := dev.CreateCQ(4096)
		typ := map[perf.Mode]qp.QPType{perf.ModeUDSend: qp.UD, perf.ModeRDSend: qp.RD, perf.ModeRCSend: qp.RC}[cfg.Mode]
		q, err := pd.CreateQP(qp.QPAttr{Type: typ, SendCQ: cq, RecvCQ: cq, Caps: qp.QPCaps{MaxSendWR: 1024, MaxRecvWR: 64}})
		if err != nil {
			dev.Close()
			return res, err
		}
		wr := qp.SendWR{SGL: []qp.SGE{mr.SGE(0, cfg.Size)}}
		if typ == qp.RC {
			q.Modify(qp.ModifyAttr{State: qp.StateInit})
			if _, err := q.Connect(context.Background(), rep.Addr, qp.RCConfig{}); err != nil {
				dev.Close()
				return res, err
			}
		} else {
			to, err := netip.ParseAddrPort(rep.Addr)
			if err != nil {
				dev.Close()
				return res, err
			}
			network, local := "udp4", "0.0.0.0:0"
			if to.Addr().Is6() && !to.Addr().Is4In6() {
				network, local = "udp6", "[::]:0"
			}
			sock, err := dev.Bind(network, local)
			if err != nil {
				dev.Close()
				return res, err
			}
			for _, st := range []qp.ModifyAttr{{State: qp.StateInit, Socket: sock}, {State: qp.StateRTR}, {State: qp.StateRTS}} {
				q.Modify(st)
			}
			if wr.AH, err = pd.CreateAH(to, rep.QPN); err != nil {
				dev.Close()
				return res, err
			}
		}
		for k := 1; k < 64; k++ {
			q.PostRecv(&qp.RecvWR{ID: uint64(k * size), SGL: []qp.SGE{mr.SGE(k*size, size)}})
		}
		wc := make([]qp.WorkCompletion, 16)
		busy := cfg.Poll == qp.PollBusy
		ping = func() error {
			if err := q.PostSend(&wr); err != nil {
				return err
			}
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
				n := cq.Poll(wc[:1])
				if n == 0 {
					if !busy {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
						cq.Wait(ctx)
						cancel()
					}
					continue
				}
				if wc[0].Opcode == qp.WCRecv {
					q.PostRecv(&qp.RecvWR{ID: wc[0].ID, SGL: []qp.SGE{mr.SGE(int(wc[0].ID), size)}})
					if wc[0].Status != qp.Success {
						return errors.New(wc[0].Status.String())
					}
					return nil
				}
			}
			return os.ErrDeadlineExceeded
		}
		push = func() bool {
			cq.Poll(wc) // reap send completions, if any
			return q.PostSend(&wr) == nil
		}
	}
	defer closeAll()
	if test == "lat" {
		ns := make([]int64, 0, cfg.Iters)
		for it := range max(cfg.Warmup, 0) + cfg.Iters {
			t0 := time.Now()
			if err := ping(); err != nil {
				return res, fmt.Errorf("round trip %d: %w", it, err)
			}
			if it >= cfg.Warmup {
				ns = append(ns, int64(time.Since(t0))/2)
			}
		}
		return perf.Summarize(cfg, ns), nil
	}
	for end := time.Now().Add(cfg.Duration); time.Now().Before(end); {
		if push() {
			res.Sent++
		}
	}
	return res, nil
}
