package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
// Every mode (remoteqp.go has the queue-pair modes; this file the
// plain-socket ones, whose ends are internal/perf's UDPEnd and TCPEnd, as
// in udperf local: both processes poll as the client's -poll says).

const defaultControl = ":18515" // perftest's port

var remoteModes = map[perf.Mode]bool{perf.ModeUDSend: true, perf.ModeUDWriteRecord: true,
	perf.ModeRDSend: true, perf.ModeRDWrite: true, perf.ModeRDRead: true, perf.ModeRDWriteRecord: true,
	perf.ModeRCSend: true, perf.ModeRCWrite: true, perf.ModeRCRead: true,
	perf.ModeRawUDP: true, perf.ModeRawUDPUnconnected: true, perf.ModeRawTCP: true}

type runRequest struct {
	Mode     perf.Mode     `json:"mode"`
	Test     string        `json:"test"`
	Size     int           `json:"size"`
	Poll     string        `json:"poll"`
	Duration time.Duration `json:"duration"`
	Segment  int           `json:"segment,omitempty"` // Write-Record segment payload (-mtu)
	// The client's region, for the server's Write-Records and Writes back.
	STag uint32 `json:"stag,omitempty"`
	TO   uint64 `json:"to,omitempty"`
}

type runReply struct {
	Error string `json:"error,omitempty"`
	Addr  string `json:"addr,omitempty"` // the data endpoint
	QPN   uint32 `json:"qpn,omitempty"`
	// The server's region, and (rc-send) the receives it posted.
	STag    uint32 `json:"stag,omitempty"`
	TO      uint64 `json:"to,omitempty"`
	Credits int    `json:"credits,omitempty"`
	// After a bandwidth run: what the server received.
	Received uint64  `json:"received,omitempty"`
	Gbps     float64 `json:"gbps,omitempty"`
	Mpps     float64 `json:"mpps,omitempty"`
}

func server(args []string, stdout, stderr io.Writer) int {
	cmd := newCommand("server", "udperf server [-addr :18515] [-once]", "The far end of `udperf client` runs (another process, host or namespace).")
	fs := cmd.fs
	addr := fs.String("addr", defaultControl, "control address to listen on")
	once := fs.Bool("once", false, "serve one run, then exit")
	cmd.noDevice()
	if code, ok := cmd.parse(args, stdout, stderr); !ok {
		return code
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

// requestTimeout bounds how long a control connection may take to send
// its request; runSlack how long past its duration a run may wait for the
// client's "done" (as long as the client itself waits).
var (
	requestTimeout = 10 * time.Second
	runSlack       = 5 * time.Minute
)

// busyError is the answer to a request that arrives during another run.
const busyError = "busy: another client's run is in progress; try again when it ends"

// serveOn serves control connections from ln until it closes (or, with
// once, until one run has been served). Each connection has its own
// goroutine and must send its request within requestTimeout, so an idle
// or slow connection holds up nobody; runs are serialised, and a request
// that arrives during another client's run is answered at once with
// busyError. When ln closes, serveOn closes every control connection and
// returns once their goroutines have.
func serveOn(ln net.Listener, once bool, stderr io.Writer) int {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // conns, stderr
		conns   = map[net.Conn]struct{}{}
		running sync.Mutex // held for the length of a run
		served  atomic.Bool
		stop    sync.Once
	)
	logf := func(format string, args ...any) {
		mu.Lock()
		fmt.Fprintf(stderr, format, args...)
		mu.Unlock()
	}
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if served.Load() {
				return 0
			}
			logf("udperf server: %v\n", err)
			return 1
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ran, err := serveRun(c, &running)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			if err != nil {
				logf("udperf server: %v: %v\n", c.RemoteAddr(), err)
			}
			if ran && once {
				stop.Do(func() { served.Store(true); ln.Close() })
			}
		}()
	}
}

// serveRun serves one client's run on control connection c, if no other
// run holds running. It reports whether it ran one.
func serveRun(c net.Conn, running *sync.Mutex) (ran bool, err error) {
	defer c.Close()
	rd := bufio.NewReader(c)
	enc := json.NewEncoder(c)
	var req runRequest
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	if err := json.NewDecoder(rd).Decode(&req); err != nil {
		return false, fmt.Errorf("request: %w", err)
	}
	reply := func(r runReply) { enc.Encode(r) }
	if !remoteModes[req.Mode] || (req.Test != "lat" && req.Test != "bw") || req.Size < 0 || req.Size > remoteMaxSize(req.Mode) {
		reply(runReply{Error: fmt.Sprintf("cannot serve mode %q test %q size %d (lat or bw; at most %d bytes)", req.Mode, req.Test, req.Size, remoteMaxSize(req.Mode))})
		return false, nil
	}
	if !running.TryLock() {
		reply(runReply{Error: busyError})
		return false, nil
	}
	host, _, _ := net.SplitHostPort(c.LocalAddr().String())
	ep, err := newEndpoint(req, host)
	if err != nil {
		running.Unlock()
		reply(runReply{Error: err.Error()})
		return true, err
	}
	reply(runReply{Addr: ep.addr, QPN: ep.qpn, STag: ep.stag, TO: ep.to, Credits: ep.credits})
	// The run lasts until the client says done (or goes away, or takes
	// longer than it would wait itself).
	c.SetReadDeadline(time.Now().Add(max(req.Duration, 0) + runSlack))
	var done struct {
		Done bool
		Sent uint64 // messages the client sent (bw)
	}
	json.NewDecoder(rd).Decode(&done)
	if req.Test == "bw" && reliableMode(string(req.Mode)) && !clientMeasured(req.Mode) {
		// A reliable transport loses nothing: take in what is still on
		// its way, however slowly, before counting, so that the client's
		// Lost is what was really lost.
		want := done.Sent * uint64(max(req.Size, 1))
		perf.WaitUntil(perf.DrainLimit, func() bool { return ep.bytes() >= want })
	}
	r := ep.stop()
	// Free before the figures go out: a client that starts its next run
	// once it has them is not told the server is busy.
	ep.close()
	running.Unlock()
	reply(r)
	return true, nil
}

// endpoint is the server's end of one run.
type endpoint struct {
	addr    string
	qpn     uint32
	stag    uint32
	to      uint64
	credits int
	stop    func() runReply
	close   func()
	bytes   func() uint64 // received so far
}

func newEndpoint(req runRequest, host string) (*endpoint, error) {
	slot := max(req.Size, 1)
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
	start := time.Now()
	result := func() runReply {
		r := runReply{Received: received.Load()}
		el := time.Duration(last.Load() - first.Load()).Seconds()
		if el <= 0 || r.Received <= 1 {
			// All of it at once: the run's span stands in (a lower
			// bound, never a zero for data that arrived).
			el = time.Unix(0, last.Load()).Sub(start).Seconds()
		}
		if el > 0 && r.Received > 0 {
			r.Gbps = float64(bytes.Load()) * 8 / el / 1e9
			r.Mpps = float64(r.Received) / el / 1e6
		}
		return r
	}
	echo := req.Test == "lat"
	ep := &endpoint{bytes: bytes.Load}
	poll := pollOf(req.Poll)
	var stop atomic.Bool
	switch req.Mode {
	case perf.ModeRawUDP, perf.ModeRawUDPUnconnected:
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		ep.addr = pc.LocalAddr().String()
		// raw-udp: the socket connects to the client's first datagram.
		end := &perf.UDPEnd{Conn: pc.(*net.UDPConn), Poll: poll, Unconnected: req.Mode == perf.ModeRawUDPUnconnected, Stop: &stop}
		wg.Go(func() {
			if echo {
				end.Echo()
				return
			}
			end.Sink(func(k, n int) {
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				received.Add(uint64(k))
				bytes.Add(uint64(n))
			})
		})
		ep.close = func() { stop.Store(true); pc.Close(); wg.Wait() }
	case perf.ModeRawTCP:
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		ep.addr = ln.Addr().String()
		var conn atomic.Pointer[net.TCPConn]
		wg.Go(func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*net.TCPConn)
			conn.Store(tc)
			if stop.Load() { // closed while accepting
				tc.Close()
				return
			}
			perf.TuneTCP(tc)
			end := &perf.TCPEnd{Conn: tc, Poll: poll, Stop: &stop}
			if echo {
				end.Echo(slot)
				return
			}
			end.Sink(func(n int) {
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				received.Store(bytes.Add(uint64(n)) / uint64(slot))
			})
		})
		ep.close = func() {
			stop.Store(true)
			ln.Close()
			if c := conn.Load(); c != nil {
				c.Close()
			}
			wg.Wait()
		}
	default:
		qep, err := newQPEndpoint(req, host, note, result)
		if qep != nil {
			qep.bytes = bytes.Load
		}
		return qep, err
	}
	ep.stop = func() runReply {
		time.Sleep(50 * time.Millisecond) // what is still on its way arrives
		return result()
	}
	return ep, nil
}

func client(args []string, stdout, stderr io.Writer) int {
	cmd := newCommand("client", "udperf client -addr HOST:PORT [flags]", "A run against `udperf server`: every mode but raw-udp-unconn. JSON and CSV schema: docs/udperf.md.")
	fs := cmd.fs
	addr := fs.String("addr", "", "the server's control address (HOST:PORT)")
	var f benchFlags
	f.register(cmd, "client")
	if code, ok := cmd.parse(args, stdout, stderr); !ok {
		return code
	}
	m, err := parseMode(f.mode)
	if err == nil && !remoteModes[m] {
		err = fmt.Errorf("mode %s runs only in `udperf local`", m)
	}
	if err == nil && *addr == "" {
		err = errors.New("-addr HOST:PORT of the server is required")
	}
	var cfgs []perf.Config
	if err == nil {
		cfgs, err = f.configs(m)
	}
	if err == nil && m == perf.ModeRCWrite && f.test == "lat" && f.poll != "busy" {
		err = errors.New("rc-write lat watches memory for the peer's Write, as ib_write_lat does: it needs -poll busy")
	}
	if err != nil {
		fmt.Fprintf(stderr, "udperf client: %v\n", err)
		return 2
	}
	var rows []row
	for _, cfg := range cfgs {
		if cfg.Size > remoteMaxSize(m) || (m == perf.ModeRCWrite && f.test == "lat" && cfg.Size < 1) {
			if f.all {
				continue
			}
			fmt.Fprintf(stderr, "udperf client: -s %d: %s carries 1 to %d bytes over server/client\n", cfg.Size, m, remoteMaxSize(m))
			return 2
		}
		r, err := runRemote(*addr, cfg, f.test, f.poll)
		if err != nil {
			fmt.Fprintf(stderr, "udperf client: %s %d B: %v\n", m, cfg.Size, err)
			return 1
		}
		rows = append(rows, rowOf(f.test, r))
	}
	return emit(stdout, stderr, "client", fs, &f, rows)
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
	req := runRequest{Mode: cfg.Mode, Test: test, Size: cfg.Size, Poll: pollName, Duration: cfg.Duration, Segment: cfg.Segment}
	var end *qpEnd
	if !plainMode(cfg.Mode) {
		network, local := clientNetwork(addr)
		if end, err = openQPEnd(cfg.Mode, cfg.Size, cfg.Poll, cfg.Segment, network, local); err != nil {
			return perf.Result{}, err
		}
		defer end.dev.Close()
		req.STag, req.TO = end.mr.STag(), end.mr.Addr()
	}
	if err := enc.Encode(req); err != nil {
		return perf.Result{}, err
	}
	var rep runReply
	if err := dec.Decode(&rep); err != nil {
		return perf.Result{}, fmt.Errorf("the server's answer: %w", err)
	}
	if rep.Error != "" {
		return perf.Result{}, errors.New("server: " + rep.Error)
	}
	var res perf.Result
	if end != nil {
		res, err = end.driveQP(cfg, test, rep)
	} else {
		res, err = drive(cfg, test, rep)
	}
	enc.Encode(struct {
		Done bool
		Sent uint64
	}{true, res.Sent})
	if err != nil {
		return perf.Result{}, err
	}
	var fin runReply
	if err := dec.Decode(&fin); err != nil {
		return perf.Result{}, fmt.Errorf("the server's figures: %w", err)
	}
	if test == "bw" && !clientMeasured(cfg.Mode) {
		res.Received, res.Gbps, res.Mpps = fin.Received, fin.Gbps, fin.Mpps
		if res.Sent > res.Received {
			res.Lost = res.Sent - res.Received
		}
		res.ValidBytes = res.Received * uint64(cfg.Size)
	}
	return res, nil
}

// plainMode says m runs over plain sockets (drive), not queue pairs.
func plainMode(m perf.Mode) bool {
	return m == perf.ModeRawUDP || m == perf.ModeRawUDPUnconnected || m == perf.ModeRawTCP
}

// pollOf is the polling mode a request names (the client's -poll).
func pollOf(name string) qp.PollMode {
	if name == "busy" {
		return qp.PollBusy
	}
	return qp.PollEvent
}

// drive runs the client's end of a plain-socket mode: a ping-pong (lat)
// or a stream (bw), with the same perf ends (and so the same system calls
// and polling) as udperf local and the server.
func drive(cfg perf.Config, test string, rep runReply) (perf.Result, error) {
	res := perf.Result{Config: cfg}
	var stop, sending atomic.Bool
	var ping func() ([]int64, error)
	var push func() (uint64, error) // messages sent
	switch cfg.Mode {
	case perf.ModeRawUDP, perf.ModeRawUDPUnconnected:
		to, err := net.ResolveUDPAddr("udp", rep.Addr)
		if err != nil {
			return res, err
		}
		end := &perf.UDPEnd{Poll: cfg.Poll, Stop: &stop, Unconnected: cfg.Mode == perf.ModeRawUDPUnconnected, Peer: to.AddrPort()}
		if end.Unconnected {
			network, local := clientNetwork(rep.Addr)
			var la *net.UDPAddr
			if la, err = net.ResolveUDPAddr(network, local); err == nil {
				end.Conn, err = net.ListenUDP(network, la)
			}
		} else {
			end.Conn, err = net.DialUDP("udp", nil, to)
		}
		if err != nil {
			return res, err
		}
		defer func() { stop.Store(true); end.Conn.Close() }()
		ping = func() ([]int64, error) { return end.PingPong(cfg.Size, max(cfg.Warmup, 0), cfg.Iters) }
		push = func() (uint64, error) { return end.Blast(cfg.Size, &sending) }
	case perf.ModeRawTCP:
		c, err := net.Dial("tcp", rep.Addr)
		if err != nil {
			return res, err
		}
		tc := c.(*net.TCPConn)
		perf.TuneTCP(tc)
		end := &perf.TCPEnd{Conn: tc, Poll: cfg.Poll, Stop: &stop}
		defer func() { stop.Store(true); tc.Close() }()
		ping = func() ([]int64, error) { return end.PingPong(cfg.Size, max(cfg.Warmup, 0), cfg.Iters) }
		push = func() (uint64, error) {
			n, err := end.Stream(cfg.Size, &sending)
			return n / uint64(max(cfg.Size, 1)), err
		}
	default:
		return res, fmt.Errorf("mode %s is not a plain-socket mode", cfg.Mode)
	}
	if test == "lat" {
		ns, err := ping()
		if err != nil {
			return res, fmt.Errorf("round trip %d: %w", len(ns)+max(cfg.Warmup, 0), err)
		}
		return perf.Summarize(cfg, ns), nil
	}
	sending.Store(true)
	t := time.AfterFunc(cfg.Duration, func() { sending.Store(false) })
	defer t.Stop()
	n, err := push()
	res.Sent = n
	return res, err
}
