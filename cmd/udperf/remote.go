package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/metrics"
	"github.com/udiwarp/udiwarp/protect"
	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/sys/unix"
)

// `udperf server` and `udperf client`: the two ends in two processes (or
// hosts, or network namespaces). The client opens one control connection
// (TCP) to the server's control port for its whole sweep, a session: it
// greets the server, then for each size asks for a run, learns the
// server's endpoint, runs it, says done, and gets the server's figures
// (bandwidth is measured where the data arrives, at the server). The
// request carries every setting the server's end applies (-loss, -seed,
// -partial, -deadline, -mtu, -poll), as udperf local applies them.
// Every mode (remoteqp.go has the queue-pair modes; this file the
// plain-socket ones, whose ends are internal/perf's UDPEnd and TCPEnd, as
// in udperf local: both processes poll as the client's -poll says).
//
// The protocol, one JSON value per message, each at most maxMessage
// bytes:
//
//	client: {"hello":"udperf/2"}            server: {"udperf":"udperf/2"}
//	client: runRequest                      server: runReply (its endpoint, or error)
//	client: doneMsg (what it sent, its figures)  server: runReply (its figures)
//	... a request and a done per size, then
//	client: {"bye":true}                    server: {"udperf":"udperf/2"}, and closes
//
// A client that goes away without its bye ends its session too.
//
// The data ports are open to anyone, so a request names the client's data
// end (From: its data socket's address, on the control connection's
// host; QPN in the UD and RD modes) and the server takes data only from
// it: a connected raw-udp socket connected to From, an unconnected one
// answering and counting only From's datagrams, raw-tcp and RC accepting
// only From's host, the queue-pair modes completing only From's QP. What
// came from elsewhere is dropped and counted (runReply.Foreign). A
// spoofer cannot steer a run or draw its echoes; it can still forge
// From's own address, which TCP (raw-tcp, RC) and RD's contact refuse
// and the UD modes cannot tell (docs/udperf.md).

const defaultControl = ":18515" // perftest's port

// protocol names the control protocol in the greeting and its answer.
const protocol = "udperf/2"

type runRequest struct {
	// Hello opens a session: the protocol the client speaks. A message
	// with Hello is a greeting, not a run.
	Hello string `json:"hello,omitempty"`
	// Bye ends a session: the server frees itself for the next client,
	// answers, and closes.
	Bye      bool          `json:"bye,omitempty"`
	Mode     perf.Mode     `json:"mode"`
	Test     string        `json:"test"` // lat, bw or rate (a bw run whose figure is the message rate)
	Size     int           `json:"size"`
	Poll     string        `json:"poll"`
	Duration time.Duration `json:"duration"`
	// Round trips of a lat run, warm-up included: with Duration, what
	// bounds how long the server waits for the run's end (runLimit).
	Trips int `json:"trips,omitempty"`
	// The settings the server's end applies, as udperf local does.
	Segment  int           `json:"segment,omitempty"` // segment payload (-mtu)
	Loss     float64       `json:"loss,omitempty"`
	Seed     uint64        `json:"seed,omitempty"`
	Partial  bool          `json:"partial,omitempty"`
	Deadline time.Duration `json:"deadline,omitempty"`
	// The client's region, for the server's Write-Records and Writes back.
	STag uint32 `json:"stag,omitempty"`
	TO   uint64 `json:"to,omitempty"`
	// The client's data end, the only source the server takes data from:
	// its socket's address (raw-tcp and RC: port 0, any port of the host),
	// which must be on the control connection's host, and (UD, RD) its QP.
	From string `json:"from"`
	QPN  uint32 `json:"qpn,omitempty"`
	// The lower layer of the server's end in the UD and RD modes (-llp:
	// "" or udp, xdp), and whether it may fall back to a kernel socket
	// (-llp-fallback). A server started with -llp uses its own.
	LLP         string `json:"llp,omitempty"`
	LLPFallback bool   `json:"llp_fallback,omitempty"`
	// Protect is the protection of the UD and RD modes' datagrams
	// (-protect: "" or none, auth, aead). The key is never sent: the
	// server's end uses the server's -psk (RD agrees keys in its
	// contact and needs none).
	Protect string `json:"protect,omitempty"`
	// PSK says the client's end has a pre-shared key (-psk): the
	// server's end then uses its own -psk (the same key, or nothing
	// opens), else none (an RD contact mixes a key into its keys when
	// either end has one: both must agree).
	PSK bool `json:"psk,omitempty"`
}

type runReply struct {
	// Udperf answers a greeting: the protocol the server speaks.
	Udperf string `json:"udperf,omitempty"`
	Error  string `json:"error,omitempty"`
	Addr   string `json:"addr,omitempty"` // the data endpoint
	QPN    uint32 `json:"qpn,omitempty"`
	// The server's region, and (rc-send) the receives it posted; ud-wr:
	// a region per message slot.
	STag    uint32        `json:"stag,omitempty"`
	TO      uint64        `json:"to,omitempty"`
	Credits int           `json:"credits,omitempty"`
	Slots   []perf.Region `json:"slots,omitempty"`
	// After a bandwidth run: what the server received (Received: whole
	// messages; Partial: Write-Records delivered partial; ValidBytes: the
	// bytes recorded valid, whole and partial).
	Received   uint64  `json:"received,omitempty"`
	Partial    uint64  `json:"partial,omitempty"`
	ValidBytes uint64  `json:"valid_bytes,omitempty"`
	Gbps       float64 `json:"gbps,omitempty"`
	Mpps       float64 `json:"mpps,omitempty"`
	// Foreign: datagrams, connections or completions the server dropped
	// for coming from elsewhere than the request's From.
	Foreign uint64 `json:"foreign,omitempty"`
	// Link is what the server's end runs on ("udp", "xdp", "tcp"), with
	// LinkDetail saying how (an AF_XDP link's mode and queue; a fallback's
	// reason), at most maxDetail bytes: in the endpoint's answer and the
	// figures.
	Link       string `json:"link,omitempty"`
	LinkDetail string `json:"link_detail,omitempty"`
}

// maxDetail bounds runReply.LinkDetail.
const maxDetail = 400

// clip cuts s to at most n bytes, on a character's boundary.
func clip(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "")
	}
	return s
}

// doneMsg ends a run: what the client sent (bw) and its figures, for the
// server's line (lat: p50 and average; the modes the client measures:
// Gb/s and Mpps).
type doneMsg struct {
	Done bool    `json:"done"`
	Sent uint64  `json:"sent"`
	P50  float64 `json:"p50_us,omitempty"`
	Avg  float64 `json:"avg_us,omitempty"`
	Gbps float64 `json:"gbps,omitempty"`
	Mpps float64 `json:"mpps,omitempty"`
}

// requestConfig is the run a request asks for, as a perf.Config: what
// both ends check (perf.Config.Check) and apply.
// (Its round trips are Iters, with no warm-up: the request's Trips.)
func requestConfig(req runRequest) perf.Config {
	test := perf.TestBW
	if req.Test == "lat" {
		test = perf.TestLat
	}
	prot := protect.None
	if req.Protect != "" {
		var err error
		if prot, err = protect.ParseMode(req.Protect); err != nil {
			prot = protect.Mode(255) // refused by perf.Config.Check, naming it
		}
	}
	return perf.Config{Mode: req.Mode, Test: test, Poll: pollOf(req.Poll), Size: req.Size, Duration: req.Duration, QPs: 1,
		Iters: req.Trips, Warmup: -1,
		Segment: req.Segment, Loss: req.Loss, Seed: req.Seed, Partial: req.Partial, Deadline: req.Deadline,
		LLP: req.LLP, LLPFallback: req.LLPFallback, Protect: prot}
}

// trips is the round trips of a lat run, warm-up included.
func trips(c perf.Config) int { return max(c.Warmup, 0) + c.Iters }

// The most a server/client run may ask for (remoteCheck): what bounds how
// long a run holds the server (runLimit), and how long it settles after
// its end (perf.Tally.Settle: twice the deadline).
const (
	maxRunDuration = time.Hour        // -D of a bw or rate run
	maxTrips       = 1_000_000        // -n plus -w of a lat run
	maxDeadline    = 10 * time.Second // -deadline (Write-Record's default)
	maxSegment     = 65535            // -mtu: no segment exceeds a datagram
)

// remoteCheck refuses what server/client cannot run as asked, at the
// client before it connects and at the server for each request:
// perf.Config.Check (the one home of what a mode ignores or cannot carry),
// then what only udperf local runs, then the bounds of a remote run (the
// server's one home for every size, count and duration a request names).
func remoteCheck(c perf.Config) error {
	if err := c.Check(); err != nil { // every mode runs over server/client too
		return err
	}
	switch {
	case c.QPs > 1:
		return errors.New("-qps: server/client runs one QP (or socket) pair")
	case c.Bidir:
		return errors.New("-bidir runs only in `udperf local` and `compare`")
	case c.Size > remoteMaxSize(c.Mode):
		return fmt.Errorf("-s %d: %s carries 1 to %d bytes over server/client", c.Size, c.Mode, remoteMaxSize(c.Mode))
	case c.Duration < 0 || c.Duration > maxRunDuration:
		return fmt.Errorf("-D %v: a server/client run lasts at most %v", c.Duration, maxRunDuration)
	case c.Iters < 0 || trips(c) < 0 || trips(c) > maxTrips:
		return fmt.Errorf("%d round trips (-n plus -w): a server/client lat run makes 0 to %d", trips(c), maxTrips)
	case c.Deadline > maxDeadline:
		return fmt.Errorf("-deadline %v: at most %v over server/client", c.Deadline, maxDeadline)
	case c.Segment > maxSegment:
		return fmt.Errorf("-mtu %d: at most %d (a datagram's length)", c.Segment, maxSegment)
	}
	return nil
}

func server(args []string, stdout, stderr io.Writer) int {
	cmd := newCommand("server", "udperf server [-addr :18515] [-once] [-llp udp|xdp] [-metrics HOST:PORT]",
		"The far end of `udperf client` runs (another process, host or namespace): a line on stdout per run served.\nSIGINT or SIGTERM stops it (exit 0).")
	fs := cmd.fs
	addr := fs.String("addr", defaultControl, "control address to listen on")
	once := fs.Bool("once", false, "serve one client session (a whole sweep), then exit")
	llpName := fs.String("llp", "", "lower layer of the server's end in the UD and RD modes, whatever the client asks: udp or xdp (AF_XDP on the interface holding the control address; default: as each client's -llp asks)")
	llpFallback := fs.Bool("llp-fallback", false, "with -llp xdp: an end that cannot open AF_XDP runs on a kernel UDP socket instead (said on stderr and in the client's server_link_detail)")
	var f benchFlags // for -metrics
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics of the server's devices at HOST:PORT/metrics")
	pskHex := fs.String("psk", "", "pre-shared key in hex (16 bytes or more) of the server's protected ends, when a client asks for -protect: UD and Write-Record need the client's -psk to be the same (RD agrees keys in its contact)")
	cmd.noDevice()
	if code, ok := cmd.parse(args, stdout, stderr); !ok {
		return code
	}
	switch {
	case *llpName != "" && *llpName != perf.LLPUDP && *llpName != perf.LLPXDP:
		fmt.Fprintf(stderr, "udperf server: -llp %q: want udp or xdp\n", *llpName)
		return 2
	case *llpFallback && *llpName != perf.LLPXDP:
		fmt.Fprintln(stderr, "udperf server: -llp-fallback falls back from -llp xdp: give both")
		return 2
	}
	var psk []byte
	if *pskHex != "" {
		var err error
		if psk, err = hex.DecodeString(*pskHex); err != nil || len(psk) < protect.MinPSK {
			fmt.Fprintf(stderr, "udperf server: -psk: want %d or more bytes in hex\n", protect.MinPSK)
			return 2
		}
	}
	stopMetrics, err := f.serveMetrics(stderr, "server")
	if err != nil {
		fmt.Fprintf(stderr, "udperf server: %v\n", err)
		return 2
	}
	defer stopMetrics()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "udperf server: %v\n", err)
		return 1
	}
	defer ln.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(stdout, "udperf server: control at %s\n", ln.Addr())
	if *llpName == perf.LLPXDP {
		// Said at once: a server that cannot open AF_XDP would refuse
		// every UD and RD run (or fall back on each).
		if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil && !ap.Addr().IsUnspecified() {
			if err := perf.XDPUsable(ap.Addr()); err != nil {
				if !*llpFallback {
					fmt.Fprintf(stderr, "udperf server: -llp xdp: %v (-llp-fallback serves over kernel sockets instead)\n", err)
					return 1
				}
				fmt.Fprintf(stderr, "udperf server: -llp xdp: %v: falling back to kernel UDP sockets\n", err)
			}
		}
	}
	return serveOn(ctx, ln, serverOptions{once: *once, stdout: stdout, stderr: stderr, metrics: f.collector, llp: *llpName, llpFallback: *llpFallback, psk: psk})
}

// serverOptions are serveOn's.
type serverOptions struct {
	once           bool      // serve one session that ran something, then return
	stdout, stderr io.Writer // a line per run; errors
	metrics        *metrics.Collector
	// llp, when set, is the lower layer of every UD and RD end served,
	// whatever the request asks (-llp), with llpFallback.
	llp         string
	llpFallback bool
	// psk is the pre-shared key of protected ends (-psk).
	psk []byte
}

// requestTimeout bounds how long a control connection may take to send
// its next message (its first, the greeting or a request; or the end of
// the session) and to take in each answer; runSlack how long past its
// expected length (runLimit) a run may wait for the client's "done" (as
// long as the client itself waits); maxConns how many control
// connections the server keeps open at once.
var (
	requestTimeout = 10 * time.Second
	runSlack       = 5 * time.Minute
	maxConns       = 32
)

// runLimit is how long a run may last before either end gives up on the
// other: its duration (bw, rate) or its round trips at a generous 1 ms
// each (lat; a loopback round trip takes microseconds), plus runSlack.
// remoteCheck bounds both, so no request holds the server longer than
// maxRunDuration (or maxTrips ms, less) plus runSlack without a word.
func runLimit(test string, dur time.Duration, trips int) time.Duration {
	if test == "lat" {
		return time.Duration(max(trips, 0))*time.Millisecond + runSlack
	}
	return max(dur, 0) + runSlack
}

// maxMessage bounds one control message, either way: the largest a
// udperf client or server sends (a reply offering ud-wr's 16 regions, or
// a request naming an IPv6 data address with a zone: 1.4 KiB at most) is
// under half of it (TestControlMessagesFit).
const maxMessage = 4096

// errTooLong ends a control connection whose message runs past maxMessage.
var errTooLong = fmt.Errorf("control message over %d bytes", maxMessage)

// msgReader reads one control message at a time: a JSON decoder over a
// reader that lets each message read at most maxMessage bytes from the
// connection, so the decoder buffers no more than that (and what it read
// ahead of the message before, within the last one's allowance).
type msgReader struct {
	dec  *json.Decoder
	left int // bytes the message being read may still take from r
	r    io.Reader
}

func newMsgReader(r io.Reader) *msgReader {
	m := &msgReader{r: r}
	m.dec = json.NewDecoder(m)
	return m
}

// Read is the decoder's: r, up to the message's allowance.
func (m *msgReader) Read(p []byte) (int, error) {
	if m.left <= 0 {
		return 0, errTooLong
	}
	if len(p) > m.left {
		p = p[:m.left]
	}
	n, err := m.r.Read(p)
	m.left -= n
	return n, err
}

// read decodes the next message into v.
func (m *msgReader) read(v any) error {
	m.left = maxMessage
	return m.dec.Decode(v)
}

// acceptRetry says an Accept error is the server's condition or the
// pending connection's, not the listener's end: out of descriptors,
// buffers or memory, or a network error accept(2) passes on from the new
// connection (its manual says to retry those). The server backs off and
// accepts again, as net/http's Server.Serve does.
func acceptRetry(err error) bool {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.EINTR, unix.EAGAIN,
		unix.ECONNABORTED, unix.ECONNRESET, unix.ETIMEDOUT, unix.EPROTO, unix.EPERM, unix.ENETDOWN, unix.ENOPROTOOPT,
		unix.EHOSTDOWN, unix.ENONET, unix.EHOSTUNREACH, unix.EOPNOTSUPP, unix.ENETUNREACH} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// busyError is the answer to a request that arrives during another
// client's session.
const busyError = "busy: another client's run is in progress; try again when it ends"

// serveOn serves control connections from ln until ctx ends or ln closes
// (or, with once, until one session that ran something has ended). Each
// connection has its own goroutine and must send each message within
// requestTimeout, so an idle or slow connection holds up nobody; a session
// holds the server from its first run to its end, and a request from
// another client meanwhile is answered at once with busyError. At most
// maxConns connections are open: the next one closes the oldest that does
// not hold the server. An Accept that fails for want of descriptors (or
// another temporary condition, acceptRetry) is tried again after 5 ms,
// doubling to 1 s. When ctx ends (SIGINT, SIGTERM) or ln closes, serveOn
// closes ln and every control connection, stops the run in progress
// without waiting for its drain, and returns once the connections'
// goroutines (and so their devices) are gone: 0 after ctx or once, 1
// after another end of ln or an Accept error that is not temporary.
func serveOn(ctx context.Context, ln net.Listener, o serverOptions) int {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // conns, stdout, stderr
		conns   = map[net.Conn]*session{}
		seq     uint64     // sessions accepted, in order
		running sync.Mutex // held by the session whose runs are in progress
		served  atomic.Bool
		closing atomic.Bool // the server stops: runs end without draining
		once    sync.Once
		stopped = make(chan struct{}) // closed by shut
	)
	logf := func(w io.Writer, format string, args ...any) {
		mu.Lock()
		fmt.Fprintf(w, format, args...)
		mu.Unlock()
	}
	shut := func() { once.Do(func() { closing.Store(true); close(stopped); ln.Close() }) }
	defer context.AfterFunc(ctx, shut)()
	defer func() {
		shut()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if served.Load() || ctx.Err() != nil {
				return 0
			}
			if !acceptRetry(err) {
				logf(o.stderr, "udperf server: %v\n", err)
				return 1
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			logf(o.stderr, "udperf server: %v; accepting again in %v\n", err, backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-stopped:
				t.Stop()
			}
			continue
		}
		backoff = 0
		s := &session{c: c, running: &running, closing: &closing, metrics: o.metrics, llp: o.llp, llpFallback: o.llpFallback, psk: o.psk,
			line: func(l string) { logf(o.stdout, "udperf server: %s %s\n", c.RemoteAddr(), l) }}
		mu.Lock()
		if closing.Load() { // shut between Accept and here
			mu.Unlock()
			c.Close()
			continue
		}
		if len(conns) >= maxConns {
			var oldest *session
			for _, o := range conns {
				if !o.holding.Load() && (oldest == nil || o.seq < oldest.seq) {
					oldest = o
				}
			}
			if oldest != nil {
				oldest.shed.Store(true)
				oldest.c.Close()
				delete(conns, oldest.c)
			}
		}
		seq++
		s.seq = seq
		conns[c] = s
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ran, err := s.serve()
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			switch {
			case s.shed.Load():
				logf(o.stderr, "udperf server: %v: closed, the oldest of %d control connections, for a new one\n", c.RemoteAddr(), maxConns)
			case err != nil && !closing.Load():
				logf(o.stderr, "udperf server: %v: %v\n", c.RemoteAddr(), err)
			}
			if ran && o.once {
				served.Store(true)
				shut()
			}
		}()
	}
}

// session is the server's side of one control connection.
type session struct {
	c       net.Conn
	seq     uint64 // its place in the order of accepting
	running *sync.Mutex
	holding atomic.Bool // this session holds running
	shed    atomic.Bool // closed for a newer connection (maxConns)
	closing *atomic.Bool
	metrics *metrics.Collector
	// llp: the server's -llp, which overrides the request's
	// (serverOptions.llp).
	llp         string
	llpFallback bool
	psk         []byte       // the server's -psk, for protected ends
	line        func(string) // prints a line about a run served
	msgs        *msgReader
	enc         *json.Encoder
}

// send sends a message to the client, which must take it within
// requestTimeout (a client that reads nothing holds no goroutine and, in
// its session, not the server).
func (s *session) send(v any) error {
	s.c.SetWriteDeadline(time.Now().Add(requestTimeout))
	return s.enc.Encode(v)
}

// serve serves the session's messages until the client ends it (closes
// the connection), goes quiet for requestTimeout (or, holding the server,
// starts no run within requestTimeout of its last run's end, whatever
// else it sends), sends a message over maxMessage, or the server stops.
// It reports whether it ran anything.
func (s *session) serve() (ran bool, err error) {
	defer s.c.Close()
	defer func() {
		if s.holding.Load() {
			s.running.Unlock()
		}
	}()
	s.msgs = newMsgReader(s.c)
	s.enc = json.NewEncoder(s.c)
	var runEnd time.Time // when the session's last run ended
	for {
		var req runRequest
		// A session that holds the server must start its next run within
		// requestTimeout of its last run's end: greetings and refused
		// requests keep the connection, not the server.
		deadline := time.Now().Add(requestTimeout)
		if s.holding.Load() {
			deadline = runEnd.Add(requestTimeout)
		}
		s.c.SetReadDeadline(deadline)
		if err := s.msgs.read(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return ran, nil // the session's end
			}
			if errors.Is(err, errTooLong) {
				s.send(runReply{Error: err.Error() + ": closing the connection"})
			}
			return ran, fmt.Errorf("request: %w", err)
		}
		if req.Bye {
			if s.holding.Load() {
				s.holding.Store(false)
				s.running.Unlock()
			}
			s.send(runReply{Udperf: protocol})
			return ran, nil
		}
		if req.Hello != "" {
			if req.Hello != protocol {
				s.send(runReply{Udperf: protocol, Error: fmt.Sprintf("this server speaks %s, not %s", protocol, req.Hello)})
				return ran, nil
			}
			if err := s.send(runReply{Udperf: protocol}); err != nil {
				return ran, err
			}
			continue
		}
		cfg := requestConfig(req)
		if req.PSK {
			cfg.PSK = s.psk
		}
		err := remoteCheck(cfg)
		if err == nil && req.PSK && cfg.PSK == nil {
			err = fmt.Errorf("-protect %v -psk: this server has no -psk", cfg.Protect)
		}
		if err == nil && cfg.Protect != protect.None && cfg.PSK == nil && !reliableMode(string(cfg.Mode)) {
			err = fmt.Errorf("-protect %v: %s needs -psk at both ends (RD modes agree keys in their contact)", cfg.Protect, cfg.Mode)
		}
		if err != nil || (req.Test != "lat" && req.Test != "bw" && req.Test != "rate") {
			if err == nil {
				err = fmt.Errorf("test %q: want lat, bw or rate", req.Test)
			}
			if err := s.send(runReply{Error: fmt.Sprintf("cannot serve %s %s %d B: %v", req.Mode, req.Test, req.Size, err)}); err != nil {
				return ran, err
			}
			continue
		}
		if !s.holding.Load() {
			s.holding.Store(true) // before taking running: never shed while it holds it
			if !s.running.TryLock() {
				s.holding.Store(false)
				if err := s.send(runReply{Error: busyError}); err != nil {
					return ran, err
				}
				continue
			}
		}
		ran = true
		if err := s.run(req, cfg); err != nil {
			return ran, err
		}
		runEnd = time.Now()
	}
}

// run serves one run of the session.
func (s *session) run(req runRequest, cfg perf.Config) error {
	if s.metrics != nil {
		cfg.OnDevice = s.metrics.Adder("server")
	}
	if s.llp != "" && cfg.Mode.TakesLLP() {
		cfg.LLP, cfg.LLPFallback = s.llp, s.llpFallback
	}
	host, _, _ := net.SplitHostPort(s.c.LocalAddr().String())
	from, err := dataPeer(req.From, s.c.RemoteAddr())
	if err != nil {
		return s.send(runReply{Error: fmt.Sprintf("cannot serve %s %s %d B: %v", req.Mode, req.Test, req.Size, err)}) // the session goes on: the next request may be right
	}
	// AF_XDP that cannot open here (not root, loopback, ...) is refused in
	// one line, or, with the fallback, not tried: the end runs on a
	// kernel socket and says why.
	refused := ""
	if ha, err := netip.ParseAddr(host); err == nil && (cfg.Mode == perf.ModeRawXDP || cfg.XDP() && cfg.Mode.TakesLLP()) {
		if err := perf.XDPUsable(ha); err != nil {
			if cfg.Mode == perf.ModeRawXDP || !cfg.LLPFallback {
				return s.send(runReply{Error: fmt.Sprintf("cannot serve %s %s %d B on AF_XDP: %v", req.Mode, req.Test, req.Size, err)})
			}
			cfg.LLP, cfg.LLPFallback, refused = perf.LLPUDP, false, err.Error()
		}
	}
	ep, err := newEndpoint(req, cfg, host, from, s.closing.Load)
	if err != nil {
		s.send(runReply{Error: err.Error()})
		return err
	}
	if refused != "" {
		ep.link.Detail += " (AF_XDP refused: " + refused + ")"
	}
	release := sync.OnceFunc(ep.close)
	defer release()
	if err := s.send(runReply{Addr: ep.addr, QPN: ep.qpn, STag: ep.stag, TO: ep.to, Credits: ep.credits, Slots: ep.slots,
		Link: ep.link.Kind, LinkDetail: clip(ep.link.Detail, maxDetail)}); err != nil {
		return err
	}
	// The run lasts until the client says done (or goes away, or takes
	// longer than it would wait itself, or the server stops).
	s.c.SetReadDeadline(time.Now().Add(runLimit(req.Test, req.Duration, req.Trips)))
	var done doneMsg
	if err := s.msgs.read(&done); err != nil || !done.Done {
		if s.closing.Load() {
			return errors.New("stopped") // not reported: the server is going
		}
		return fmt.Errorf("%s %s %d B: the client's done: %v", req.Mode, req.Test, req.Size, err)
	}
	// What is still on its way arrives (a reliable mode: all of it,
	// however slowly, unless the server stops) before the count.
	r := ep.stop(done.Sent)
	r.Link, r.LinkDetail = ep.link.Kind, clip(ep.link.Detail, maxDetail)
	release()
	s.line(runLine(req, done, r))
	return s.send(r)
}

// dataPeer is the client's data end a request names (from), which must
// be on the host of the control connection (ctl): a client may point the
// server's data only at itself.
func dataPeer(from string, ctl net.Addr) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(from)
	if err != nil {
		return ap, fmt.Errorf("the request names no data address of the client (from %q; a udperf client older than %s?)", from, protocol)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	host := ctl.(*net.TCPAddr).AddrPort().Addr().Unmap()
	if ap.Addr() != host {
		return ap, fmt.Errorf("the data address %v is not on the control connection's host %v", ap, host)
	}
	return ap, nil
}

// runLine is the server's line about a run: what ran, and its figures
// (lat: the client's p50 and average; bw and rate: Gb/s and Mpps, the
// server's where it measured them, else the client's).
func runLine(req runRequest, done doneMsg, r runReply) string {
	l := fmt.Sprintf("%s %s %d B poll %s", req.Mode, req.Test, req.Size, req.Poll)
	if req.Loss > 0 {
		l += fmt.Sprintf(" loss %g seed %d", req.Loss, req.Seed)
	}
	if req.Partial {
		l += fmt.Sprintf(" partial %v", req.Deadline)
	}
	if req.Segment > 0 {
		l += fmt.Sprintf(" mtu %d", req.Segment)
	}
	switch {
	case r.Link == perf.LLPXDP:
		l += " on xdp"
	case req.LLP == perf.LLPXDP && req.Mode.TakesLLP():
		l += " on " + r.Link + " (" + r.LinkDetail + ")" // a fallback says why
	}
	elsewhere := ""
	if r.Foreign > 0 {
		elsewhere = fmt.Sprintf(", %d from elsewhere dropped", r.Foreign)
	}
	switch {
	case req.Test == "lat":
		return l + fmt.Sprintf(": p50 %.2f us, avg %.2f us", done.P50, done.Avg) + elsewhere
	case req.Mode.InitiatorMeasured():
		return l + fmt.Sprintf(": %.2f Gb/s, %.4f Mpps", done.Gbps, done.Mpps) + elsewhere
	}
	l += fmt.Sprintf(": %.2f Gb/s, %.4f Mpps, %d of %d messages received", r.Gbps, r.Mpps, r.Received, done.Sent)
	if r.Partial > 0 {
		l += fmt.Sprintf(", %d partial", r.Partial)
	}
	return l + elsewhere
}

// endpoint is the server's end of one run.
type endpoint struct {
	addr    string
	qpn     uint32
	stag    uint32
	to      uint64
	credits int
	slots   []perf.Region
	link    llp.Caps                   // what the end runs on
	stop    func(sent uint64) runReply // settle, then the figures
	close   func()
}

// newEndpoint opens the server's end of req's run on host, taking data
// from the client's data end (from) alone, and starts serving it: a
// plain socket's echo or sink (perf.UDPEnd, perf.TCPEnd), or a
// queue-pair mode's target half (perf.End.Serve). closing says the
// server is stopping.
func newEndpoint(req runRequest, cfg perf.Config, host string, from netip.AddrPort, closing func() bool) (*endpoint, error) {
	slot := max(req.Size, 1)
	tally := perf.NewTally()
	var wg sync.WaitGroup
	var stop atomic.Bool
	var foreign atomic.Uint64 // raw-tcp: connections from elsewhere
	foreignOf := foreign.Load // what the run dropped from elsewhere
	echo := req.Test == "lat"
	ep := &endpoint{}
	poll := cfg.Poll
	switch req.Mode {
	case perf.ModeRawUDP, perf.ModeRawUDPUnconnected:
		// raw-udp: a socket connected to the client's data socket (the
		// kernel takes no one else's datagrams); raw-udp-unconn: an
		// unconnected one that takes and answers only the client's.
		la, err := net.ResolveUDPAddr("udp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		unconn := req.Mode == perf.ModeRawUDPUnconnected
		var pc *net.UDPConn
		if unconn {
			pc, err = net.ListenUDP("udp", la)
		} else {
			pc, err = net.DialUDP("udp", la, net.UDPAddrFromAddrPort(from))
		}
		if err != nil {
			return nil, err
		}
		ep.addr = pc.LocalAddr().String()
		end := &perf.UDPEnd{Conn: pc, Poll: poll, Unconnected: unconn, Peer: from, From: from, Stop: &stop}
		foreignOf = end.Foreign
		wg.Go(func() { serveRaw(end, echo, tally.NoteN) })
		ep.close = func() { stop.Store(true); pc.Close(); wg.Wait() }
		ep.link = llp.Caps{Kind: "udp", Detail: "kernel UDP socket"}
	case perf.ModeRawXDP:
		// An AF_XDP socket on the interface holding host, answering and
		// counting only the client's data end.
		ha, err := netip.ParseAddr(host)
		if err != nil {
			return nil, err
		}
		l, err := perf.OpenXDPLink(netip.AddrPortFrom(ha, 0), poll)
		if err != nil {
			return nil, err
		}
		ep.addr, ep.link = l.LocalAddr().String(), l.Caps()
		end := &perf.LinkEnd{Link: l, Poll: poll, Peer: from, From: from, Stop: &stop}
		foreignOf = end.Foreign
		wg.Go(func() { serveRaw(end, echo, tally.NoteN) })
		ep.close = func() { stop.Store(true); l.Close(); wg.Wait() }
	case perf.ModeRawTCP:
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		ep.addr = ln.Addr().String()
		var conn atomic.Pointer[net.TCPConn]
		wg.Go(func() {
			var tc *net.TCPConn
			for tc == nil { // the client's host only
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap() != from.Addr() {
					foreign.Add(1)
					c.Close()
					continue
				}
				tc = c.(*net.TCPConn)
			}
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
			end.Sink(func(n int) { tally.NoteBytes(n, slot) })
		})
		ep.close = func() {
			stop.Store(true)
			ln.Close()
			if c := conn.Load(); c != nil {
				c.Close()
			}
			wg.Wait()
		}
		ep.link = llp.Caps{Kind: "tcp", Detail: "kernel TCP socket"}
	default: // a queue-pair mode: the target half
		network := "udp4"
		if a, err := netip.ParseAddr(host); err == nil && a.Is6() && !a.Is4In6() {
			network = "udp6"
		}
		e, err := perf.OpenEnd(cfg, true, network, net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		if err := e.Listen(host); err != nil {
			e.Close()
			return nil, err
		}
		o := e.Offer()
		ep.link = e.Link()
		ep.addr, ep.qpn, ep.stag, ep.to, ep.credits, ep.slots = o.Addr, o.QPN, o.Region.STag, o.Region.TO, o.Credits, o.Slots
		peer := perf.Peer{Addr: from, QPN: req.QPN, Region: perf.Region{STag: req.STag, TO: req.TO}}
		foreignOf = e.Foreign
		wg.Go(func() { e.Serve(peer, echo, tally, &stop) })
		ep.close = func() { stop.Store(true); e.Close(); wg.Wait() }
	}
	ep.stop = func(sent uint64) runReply {
		tally.Settle(cfg, sent, closing)
		r := runReply{Foreign: foreignOf()}
		r.Received, r.Partial, r.ValidBytes, r.Gbps, r.Mpps = tally.Figures()
		return r
	}
	return ep, nil
}

// remoteMaxSize is the largest message of a mode over server/client.
func remoteMaxSize(m perf.Mode) int {
	if m == perf.ModeUDSend || m == perf.ModeRawUDP || m == perf.ModeRawUDPUnconnected || m == perf.ModeRawXDP {
		return 65000 // raw-xdp: its link's MTU less the headers, checked by each end
	}
	return 8 << 20
}

func client(args []string, stdout, stderr io.Writer) int {
	cmd := newCommand("client", "udperf client -addr HOST:PORT [flags]",
		"A run (or, with -a, a sweep) against `udperf server`, over one control connection: every mode.\nThe server applies -loss, -seed, -partial, -deadline and -mtu to its end as udperf local does.\nJSON and CSV schema: docs/udperf.md.")
	fs := cmd.fs
	addr := fs.String("addr", "", "the server's control address (HOST:PORT)")
	var f benchFlags
	f.register(cmd, "client")
	if code, ok := cmd.parse(args, stdout, stderr); !ok {
		return code
	}
	fail := func(err error) int { fmt.Fprintf(stderr, "udperf client: %v\n", err); return 2 }
	m, err := parseMode(f.mode)
	if err != nil {
		return fail(err)
	}
	if *addr == "" {
		return fail(errors.New("-addr HOST:PORT of the server is required"))
	}
	cfgs, err := f.configs(m)
	if err != nil {
		return fail(err)
	}
	// Everything the server cannot run as asked is refused here, before
	// connecting; -a leaves out the sizes a mode cannot carry over
	// server/client.
	var runs []perf.Config
	for _, c := range cfgs {
		if f.all && c.Size > remoteMaxSize(m) {
			continue
		}
		if err := remoteCheck(c); err != nil {
			return fail(err)
		}
		runs = append(runs, c)
	}
	stopMetrics, err := f.serveMetrics(stderr, "client", runs) // the client's devices
	if err != nil {
		return fail(err)
	}
	defer stopMetrics()
	ctx, release := interruptible("client", stderr)
	defer release()
	sess, err := dialSession(*addr)
	if err != nil {
		fmt.Fprintf(stderr, "udperf client: %v\n", err)
		return 1
	}
	defer sess.close()
	sess.stderr = stderr
	out := &printer{out: newSink(stdout, f.format(), f.test, false, newDocument("client", &f)), bar: newBar(stderr, len(runs))}
	test := f.test
	if test == "throughput" {
		test = "bw" // each trial of the search is a bw run at the server
	}
	interrupted, runErr := sweep(ctx, out, f.test, runs, searching(f.test, func(cfg perf.Config) (perf.Result, error) { return sess.run(cfg, test) }))
	sess.close() // the session's end: the server frees itself for the next client
	return finish("client", stderr, out.out, interrupted, runErr)
}

// greetTimeout bounds the wait for the server's answer to the greeting:
// a peer that is not a udperf server may say nothing at all.
var greetTimeout = 3 * time.Second

// clientSession is the client's control connection: one for a sweep.
type clientSession struct {
	addr   string
	c      net.Conn
	msgs   *msgReader
	enc    *json.Encoder
	closed bool
	// stderr takes the lines about a fallback from -llp xdp, each said
	// once (warned).
	stderr io.Writer
	warned map[string]bool
}

// warn says line on stderr, once a session.
func (s *clientSession) warn(line string) {
	if s.stderr == nil || s.warned[line] {
		return
	}
	if s.warned == nil {
		s.warned = map[string]bool{}
	}
	s.warned[line] = true
	fmt.Fprintln(s.stderr, "udperf client: "+line)
}

// dialSession connects to the server at addr and greets it; a peer that
// answers anything but udperf's greeting (or closes, or says nothing
// within greetTimeout) is "not a udperf server at addr".
func dialSession(addr string) (*clientSession, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	s := &clientSession{addr: addr, c: c, msgs: newMsgReader(c), enc: json.NewEncoder(c)}
	notServer := func(why string) (*clientSession, error) {
		c.Close()
		return nil, fmt.Errorf("not a udperf server at %s (%s)", addr, why)
	}
	c.SetDeadline(time.Now().Add(greetTimeout))
	if err := s.enc.Encode(runRequest{Hello: protocol}); err != nil {
		return notServer(err.Error())
	}
	var rep runReply
	if err := s.msgs.read(&rep); err != nil {
		var ne net.Error
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
			return notServer("it closed the connection")
		case errors.As(err, &ne) && ne.Timeout():
			return notServer(fmt.Sprintf("no answer within %v", greetTimeout))
		}
		return notServer("it answered something else")
	}
	if rep.Udperf == "" {
		return notServer("it answered something else")
	}
	if rep.Error != "" {
		c.Close()
		return nil, errors.New("server: " + rep.Error)
	}
	c.SetDeadline(time.Time{})
	return s, nil
}

// close ends the session politely: a bye, whose answer says the server
// is free for the next client (a sweep run right after this one is not
// told it is busy); idempotent.
func (s *clientSession) close() {
	if s.closed {
		return
	}
	s.closed = true
	s.c.SetDeadline(time.Now().Add(greetTimeout))
	if s.enc.Encode(runRequest{Bye: true}) == nil {
		var rep runReply
		s.msgs.read(&rep)
	}
	s.c.Close()
}

// run runs cfg (test: lat, bw or rate) in the session.
func (s *clientSession) run(cfg perf.Config, test string) (perf.Result, error) {
	s.c.SetDeadline(time.Now().Add(runLimit(test, cfg.Duration, trips(cfg))))
	req := runRequest{Mode: cfg.Mode, Test: test, Size: cfg.Size, Poll: cfg.Poll.String(), Duration: cfg.Duration, Trips: trips(cfg),
		Segment: cfg.Segment, Loss: cfg.Loss, Seed: cfg.Seed, Partial: cfg.Partial, Deadline: cfg.Deadline,
		LLP: cfg.LLP, LLPFallback: cfg.LLPFallback}
	if cfg.Protect != protect.None {
		req.Protect, req.PSK = cfg.Protect.String(), cfg.PSK != nil
	}
	// The data end binds first, on the control connection's host, and the
	// request names it: the server takes data from it alone.
	host := s.c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	network := "udp4"
	if host.Is6() {
		network = "udp6"
	}
	anyPort := netip.AddrPortFrom(host, 0)
	req.From = anyPort.String()
	refused := ""
	if cfg.Mode == perf.ModeRawXDP || cfg.XDP() && cfg.Mode.TakesLLP() {
		// AF_XDP on the interface of the control connection's host:
		// refused in one line where it cannot open, unless -llp-fallback.
		if err := perf.XDPUsable(host); err != nil {
			switch {
			case cfg.Mode == perf.ModeRawXDP:
				return perf.Result{}, fmt.Errorf("raw-xdp: %w", err)
			case !cfg.LLPFallback:
				return perf.Result{}, fmt.Errorf("-llp xdp: %w (-llp-fallback runs over kernel sockets instead)", err)
			}
			s.warn(fmt.Sprintf("-llp xdp: %v: this end falls back to kernel UDP sockets", err))
			refused = err.Error()
		}
	}
	local := cfg // this end's: without AF_XDP where it cannot open
	if refused != "" {
		local.LLP, local.LLPFallback = perf.LLPUDP, false
	}
	var end *perf.End
	var data *net.UDPConn
	var link *llp.XDP
	switch {
	case cfg.Mode == perf.ModeRawXDP:
		var err error
		if link, err = perf.OpenXDPLink(anyPort, cfg.Poll); err != nil {
			return perf.Result{}, err
		}
		defer link.Close()
		req.From = link.LocalAddr().String()
	case cfg.Mode == perf.ModeRawUDP || cfg.Mode == perf.ModeRawUDPUnconnected:
		var err error
		if data, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(anyPort)); err != nil {
			return perf.Result{}, err
		}
		defer data.Close()
		req.From = data.LocalAddr().String()
	case !plainMode(cfg.Mode):
		var err error
		if end, err = perf.OpenEnd(local, false, network, anyPort.String()); err != nil {
			return perf.Result{}, err
		}
		defer end.Close()
		p := end.Peer(host)
		req.From, req.QPN, req.STag, req.TO = p.Addr.String(), p.QPN, p.Region.STag, p.Region.TO
		if c := end.Link(); local.XDP() && cfg.Mode.TakesLLP() && c.Kind != perf.LLPXDP {
			s.warn("-llp xdp: this end runs on " + c.Kind + ": " + c.Detail)
		}
	}
	if err := s.enc.Encode(req); err != nil {
		return perf.Result{}, err
	}
	var rep runReply
	if err := s.msgs.read(&rep); err != nil {
		return perf.Result{}, fmt.Errorf("the server's answer: %w", err)
	}
	if rep.Error != "" {
		return perf.Result{}, errors.New("server: " + rep.Error)
	}
	if cfg.XDP() && cfg.Mode.TakesLLP() && rep.Link != "" && rep.Link != perf.LLPXDP {
		s.warn("-llp xdp: the server's end runs on " + rep.Link + ": " + rep.LinkDetail)
	}
	var res perf.Result
	var err error
	switch {
	case link != nil:
		res, err = driveLink(link, cfg, test, rep)
	case end != nil:
		res, err = driveEnd(end, cfg, test, rep)
		// Keep driving a busy-polled device while the server settles
		// (an RD sender's last acks).
		var settled atomic.Bool
		var draining sync.WaitGroup
		defer draining.Wait()
		defer settled.Store(true)
		draining.Go(func() { end.Drain(&settled) })
	default:
		res, err = drive(cfg, test, rep, data, host)
	}
	switch {
	case link != nil:
		res.Link, res.LinkDetail = link.Caps().Kind, link.Caps().Detail
	case end != nil:
		res.Link, res.LinkDetail = end.Link().Kind, end.Link().Detail
		if refused != "" {
			res.LinkDetail += " (AF_XDP refused: " + refused + ")"
		}
	case cfg.Mode == perf.ModeRawTCP:
		res.Link = "tcp"
	default:
		res.Link = "udp"
	}
	done := doneMsg{Done: true, Sent: res.Sent, P50: res.Median, Avg: res.Avg, Gbps: res.Gbps, Mpps: res.Mpps}
	encErr := s.enc.Encode(done)
	if err == nil {
		err = encErr
	}
	if err != nil {
		return perf.Result{}, err
	}
	var fin runReply
	if err := s.msgs.read(&fin); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return perf.Result{}, errors.New("the server ended the session before sending its figures (was it stopped?)")
		}
		return perf.Result{}, fmt.Errorf("the server's figures: %w", err)
	}
	res.PeerLink, res.PeerLinkDetail = fin.Link, fin.LinkDetail
	if cfg.Test == perf.TestBW && !cfg.Mode.InitiatorMeasured() {
		res.Received, res.Partial, res.Gbps, res.Mpps = fin.Received, fin.Partial, fin.Gbps, fin.Mpps
		if res.Sent > res.Received {
			res.Lost = res.Sent - res.Received
		}
		res.ValidBytes = fin.ValidBytes
	}
	return res, nil
}

// driveEnd runs the initiator half of a queue-pair mode against the
// target the server offered in rep.
func driveEnd(e *perf.End, cfg perf.Config, test string, rep runReply) (perf.Result, error) {
	o := perf.Offer{Addr: rep.Addr, QPN: rep.QPN, Region: perf.Region{STag: rep.STag, TO: rep.TO}, Credits: rep.Credits, Slots: rep.Slots}
	if test == "lat" {
		ns, err := e.DriveLatency(cfg, o)
		if err != nil {
			return perf.Result{Config: cfg}, err
		}
		return perf.Summarize(cfg, ns), nil
	}
	return e.DriveBandwidth(cfg, o)
}

// driveLink runs the client's end of raw-xdp over l against the
// server's link at rep.Addr: a ping-pong (lat) or a blast (bw).
func driveLink(l *llp.XDP, cfg perf.Config, test string, rep runReply) (perf.Result, error) {
	res := perf.Result{Config: cfg}
	to, err := netip.ParseAddrPort(rep.Addr)
	if err != nil {
		return res, err
	}
	var stop, sending atomic.Bool
	end := &perf.LinkEnd{Link: l, Poll: cfg.Poll, Peer: to, From: to, Stop: &stop, Rate: cfg.FlowRate()}
	if test == "lat" {
		ns, err := end.PingPong(cfg.Size, max(cfg.Warmup, 0), cfg.Iters)
		if err != nil {
			return res, fmt.Errorf("round trip %d: %w", len(ns)+max(cfg.Warmup, 0), err)
		}
		return perf.Summarize(cfg, ns), nil
	}
	sending.Store(true)
	t := time.AfterFunc(cfg.Duration, func() { sending.Store(false) })
	defer t.Stop()
	res.Sent, err = end.Blast(cfg.Size, &sending, 0)
	return res, err
}

// connectUDP connects c, a bound UDP socket, to the server's data end:
// the request named c's address before the server had one.
func connectUDP(c *net.UDPConn, to netip.AddrPort) error {
	var sa unix.Sockaddr
	if a := to.Addr(); a.Is4() || a.Is4In6() && c.LocalAddr().(*net.UDPAddr).IP.To4() != nil {
		sa = &unix.SockaddrInet4{Port: int(to.Port()), Addr: a.Unmap().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(to.Port()), Addr: a.As16()}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) { cerr = unix.Connect(int(fd), sa) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("connect to %v: %w", to, cerr)
	}
	return nil
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
// and polling) as udperf local and the server. data is the UDP socket
// the request named (raw-udp, raw-udp-unconn); host is the control
// connection's local address, which raw-tcp dials from.
func drive(cfg perf.Config, test string, rep runReply, data *net.UDPConn, host netip.Addr) (perf.Result, error) {
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
		end := &perf.UDPEnd{Conn: data, Poll: cfg.Poll, Stop: &stop, Unconnected: cfg.Mode == perf.ModeRawUDPUnconnected, Peer: to.AddrPort(), Rate: cfg.FlowRate()}
		if !end.Unconnected { // raw-udp: connected, read and write
			if err := connectUDP(data, to.AddrPort()); err != nil {
				return res, err
			}
		}
		defer func() { stop.Store(true); end.Conn.Close() }()
		ping = func() ([]int64, error) { return end.PingPong(cfg.Size, max(cfg.Warmup, 0), cfg.Iters) }
		push = func() (uint64, error) { return end.Blast(cfg.Size, &sending, 0) }
	case perf.ModeRawTCP:
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(host, 0))} // the host the request named
		c, err := d.Dial("tcp", rep.Addr)
		if err != nil {
			return res, err
		}
		tc := c.(*net.TCPConn)
		perf.TuneTCP(tc)
		end := &perf.TCPEnd{Conn: tc, Poll: cfg.Poll, Stop: &stop}
		defer func() { stop.Store(true); tc.Close() }()
		ping = func() ([]int64, error) { return end.PingPong(cfg.Size, max(cfg.Warmup, 0), cfg.Iters) }
		push = func() (uint64, error) {
			n, err := end.Stream(cfg.Size, &sending, 0)
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

// rawEnd is a plain baseline's end, over a socket (perf.UDPEnd) or an
// AF_XDP link (perf.LinkEnd).
type rawEnd interface {
	Echo() error
	Sink(got func(datagrams, bytes int)) error
}

// serveRaw runs the server's side of a raw run: it echoes (lat) or counts
// what arrives (bw), until its end is stopped.
func serveRaw(end rawEnd, echo bool, got func(datagrams, bytes int)) {
	if echo {
		end.Echo()
		return
	}
	end.Sink(got)
}
