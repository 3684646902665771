package preload_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/socketshim"
)

// stats is the engine's stats file (engine.Stats).
type stats struct {
	PID           int    `json:"pid"`
	QP            string `json:"qp"`
	Sockets       uint64 `json:"sockets"`
	Sent          uint64 `json:"sent"`
	Received      uint64 `json:"received"`
	SentBytes     uint64 `json:"sent_bytes"`
	ReceivedBytes uint64 `json:"received_bytes"`
	DeviceTx      uint64 `json:"device_tx_datagrams"`
	DeviceRx      uint64 `json:"device_rx_delivered"`
	Live          uint64 `json:"live"`
	Pool          int    `json:"pool_receives"`
	PoolFree      int    `json:"pool_free"`
	NoRecv        uint64 `json:"dropped_no_receive"`
	Overdraft     uint64 `json:"dropped_overdraft"`
	// TCP over RC (UDIWARP_PRELOAD_TCP=rc).
	Streams        uint64 `json:"streams"`
	StreamsLive    uint64 `json:"streams_live"`
	StreamsPlain   uint64 `json:"streams_plain"`
	StreamsRefused uint64 `json:"streams_refused"`
	StreamsDropped uint64 `json:"streams_dropped"`
	StreamSent     uint64 `json:"stream_sent_bytes"`
	StreamReceived uint64 `json:"stream_received_bytes"`
	// RD: closes, shutdowns and exits that gave up on unacknowledged Sends.
	RDDropped uint64 `json:"rd_dropped"`
	// Device is the device's non-zero counters by their qp.Stats names.
	Device map[string]uint64 `json:"device"`
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	buildSkip string
)

// built compiles the preload library, the engine and the survive test
// program once per test binary, or skips the test saying what is missing.
func built(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if _, err := exec.LookPath("gcc"); err != nil {
			buildSkip = "gcc is not installed: the preload library is C (apt-get install gcc)"
			return
		}
		dir, err := os.MkdirTemp("", "udiwarp-preload-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		steps := [][]string{
			{"gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", filepath.Join(dir, "libudiwarp_preload.so"), "c/preload.c", "-ldl", "-lpthread"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "survive"), "testdata/survive.c", "-lpthread"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "manysock"), "testdata/manysock.c"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "tcpcheck"), "testdata/tcpcheck.c", "-lpthread"},
			{"go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libudiwarp_engine.so"), "./engine"},
		}
		for _, s := range steps {
			cmd := exec.CommandContext(ctx, s[0], s[1:]...)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("%s: %v\n%s", strings.Join(s, " "), err, out)
				return
			}
		}
	})
	if buildSkip != "" {
		t.Skip(buildSkip)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// need skips the test unless every program is installed (on PATH, or in
// /usr/sbin, where Debian puts dnsmasq).
func need(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if lookPath(p) == "" {
			t.Skipf("%s is not installed (Debian: apt-get install sockperf dnsmasq-base bind9-dnsutils iperf iperf3 socat)", p)
		}
	}
}

func lookPath(p string) string {
	if path, err := exec.LookPath(p); err == nil {
		return path
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if path, err := exec.LookPath(filepath.Join(d, p)); err == nil {
			return path
		}
	}
	return ""
}

// proc is a program run with or without the preload, in its own process
// group, killed with its group when the test ends.
type proc struct {
	cmd   *exec.Cmd
	out   bytes.Buffer
	stats string
	file  string // what the program writes, where a test names it
	done  chan struct{}
	err   error
}

func start(t *testing.T, ctx context.Context, dir string, preload bool, name string, args ...string) *proc {
	t.Helper()
	return startEnv(t, ctx, dir, preload, nil, name, args...)
}

// startEnv is start with env added to the program's environment.
func startEnv(t *testing.T, ctx context.Context, dir string, preload bool, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, name, args...)
	p.cmd.Env = append(os.Environ(), env...)
	if preload {
		p.stats = filepath.Join(t.TempDir(), "stats.json")
		p.cmd.Env = append(p.cmd.Env, "LD_PRELOAD="+filepath.Join(dir, "libudiwarp_preload.so"),
			"UDIWARP_ENGINE="+filepath.Join(dir, "libudiwarp_engine.so"), "UDIWARP_PRELOAD_STATS="+p.stats)
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	// Its own process group, killed whole in Cleanup; and killed by the
	// kernel if this test process dies without running Cleanup (a
	// -timeout, a signal, CI's limit), which left an iperf server running
	// for an hour (TestChildDiesWithTheTest).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.Cancel = func() error { return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }
	p.cmd.WaitDelay = 2 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

// wait waits for the program to exit on its own (bounded by its context).
func (p *proc) wait(t *testing.T) string {
	t.Helper()
	<-p.done
	if p.err != nil {
		t.Fatalf("%s: %v\n%s", p.cmd.Path, p.err, p.out.String())
	}
	return p.out.String()
}

// stop asks a server to exit (sig), and kills it if it does not within 3 s.
func (p *proc) stop(sig syscall.Signal) {
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) readStats(t *testing.T) stats {
	t.Helper()
	b, err := os.ReadFile(p.stats)
	if err != nil {
		t.Fatalf("%s wrote no engine stats (did the preload load?): %v\n%s", p.cmd.Path, err, p.out.String())
	}
	var s stats
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("stats %q: %v", b, err)
	}
	return s
}

// statsWhen reads p's engine stats until ok holds of them, for at most
// 20 s, and returns the last read (the caller's assertions then say what
// is missing). The engine rewrites the file every 200 ms and at exit, so
// a count the program has reached shows there soon:
// waiting for the count, not for a time, keeps a slow machine from
// failing a test whose program did its work.
func (p *proc) statsWhen(t *testing.T, ok func(stats) bool) stats {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(p.stats); err == nil {
			var s stats
			if json.Unmarshal(b, &s) == nil && (ok(s) || time.Now().After(deadline)) {
				return s
			}
		} else if time.Now().After(deadline) {
			return p.readStats(t) // fails, saying why
		}
	}
}

// sockperfUDP runs sockperf's UDP ping-pong for 2 s between a preloaded
// server and client, and returns the client's output with both processes
// (the client done, the server still serving).
func sockperfUDP(t *testing.T, dir string) (out string, cli, srv *proc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	port := freePort(t)
	srv = start(t, ctx, dir, true, "sockperf", "server", "-i", "127.0.0.1", "-p", strconv.Itoa(port))
	waitUDP(t, port, srv)
	cli = start(t, ctx, dir, true, "sockperf", "ping-pong", "-i", "127.0.0.1", "-p", strconv.Itoa(port), "-t", "2")
	return cli.wait(t), cli, srv
}

// freePort returns a loopback port free for both UDP and TCP now.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		u, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// waitUDP waits until something is bound to the UDP port (the server is
// up). It reads the kernel's socket tables rather than trying to bind the
// port itself: a probe that binds holds the port for a moment, and a
// server binding it in that moment fails with EADDRINUSE (sockperf did,
// on a loaded machine).
func waitUDP(t *testing.T, port int, p *proc) {
	t.Helper()
	waitBound(t, p, fmt.Sprintf("bound UDP port %d", port), func() bool { return netnstest.UDPBound(0, port) })
}

// waitBound waits (10 s at most) until bound says the server p is up.
func waitBound(t *testing.T, p *proc, what string, bound func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if bound() {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.cmd.Path, p.err, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s never %s\n%s", p.cmd.Path, what, p.out.String())
}

func num(t *testing.T, re, s string) float64 {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %q in:\n%s", re, s)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sockperf UDP ping-pong between two preloaded processes: every message
// sockperf counts went through both engines (the client's sends and
// receives, the server's receives and sends), with none dropped.
func TestSockperf(t *testing.T) {
	need(t, "sockperf")
	out, cli, srv := sockperfUDP(t, built(t))
	lat := num(t, `Latency is ([0-9.]+) usec`, out)
	sentMsgs := num(t, `SentMessages=([0-9]+)`, out)
	recvMsgs := num(t, `ReceivedMessages=([0-9]+)`, out)
	if num(t, `# dropped messages = ([0-9]+)`, out) != 0 {
		t.Errorf("sockperf dropped messages:\n%s", out)
	}
	ss := srv.statsWhen(t, func(ss stats) bool { return float64(ss.Received) >= recvMsgs && float64(ss.Sent) >= recvMsgs })
	srv.stop(syscall.SIGINT)
	cs := cli.readStats(t)
	t.Logf("sockperf over the preload: %.3f µs; SentMessages=%.0f ReceivedMessages=%.0f; client %+v; server %+v", lat, sentMsgs, recvMsgs, cs, ss)
	if recvMsgs < 1000 {
		t.Fatalf("only %.0f round trips", recvMsgs)
	}
	// sockperf's counters cover the measured run; its warm-up adds a few.
	if float64(cs.Sent) < sentMsgs || float64(cs.Received) < recvMsgs {
		t.Errorf("client engine sent %d, received %d; sockperf sent %.0f, received %.0f", cs.Sent, cs.Received, sentMsgs, recvMsgs)
	}
	if float64(ss.Received) < recvMsgs || float64(ss.Sent) < recvMsgs {
		t.Errorf("server engine received %d, sent %d; sockperf's client received %.0f replies", ss.Received, ss.Sent, recvMsgs)
	}
	if cs.DeviceTx < cs.Sent || ss.DeviceRx < ss.Received {
		t.Errorf("the devices framed fewer datagrams than the engines counted: client %+v server %+v", cs, ss)
	}
}

// dnsmasq answering dig, both preloaded: the answer is right and both
// engines carried every query and answer. A dig without the preload gets
// no answer from the same dnsmasq: the wire is udiwarp's, not plain UDP.
func TestDnsmasqDig(t *testing.T) {
	need(t, "dnsmasq", "dig")
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := freePort(t)
	srv := start(t, ctx, dir, true, lookPath("dnsmasq"), "--no-daemon", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--port="+strconv.Itoa(port), "--listen-address=127.0.0.1", "--bind-interfaces",
		"--address=/test/1.2.3.4", "--pid-file=", "--user="+currentUser())
	waitUDP(t, port, srv)
	const queries = 3
	for i := range queries {
		dig := start(t, ctx, dir, true, "dig", "@127.0.0.1", "-p", strconv.Itoa(port), "+tries=1", "+time=3", "+short",
			fmt.Sprintf("host%d.test", i), "A")
		out := dig.wait(t)
		if strings.TrimSpace(out) != "1.2.3.4" {
			t.Fatalf("dig answered %q", out)
		}
		ds := dig.readStats(t)
		if ds.Sent < 1 || ds.Received < 1 {
			t.Fatalf("dig's engine carried nothing: %+v", ds)
		}
	}
	plain := start(t, ctx, dir, false, "dig", "@127.0.0.1", "-p", strconv.Itoa(port), "+tries=1", "+time=1", "+short", "plain.test", "A")
	<-plain.done
	if strings.Contains(plain.out.String(), "1.2.3.4") {
		t.Errorf("a dig without the preload got an answer: the traffic went around udiwarp\n%s", plain.out.String())
	}
	srv.stop(syscall.SIGTERM)
	ss := srv.readStats(t)
	t.Logf("dnsmasq engine: %+v", ss)
	if ss.Received != queries || ss.Sent != queries {
		t.Errorf("dnsmasq's engine received %d and sent %d datagrams; want %d each", ss.Received, ss.Sent, queries)
	}
}

func currentUser() string {
	if os.Getuid() == 0 {
		return "root" // stay root: no change of user (and the stats file stays writable)
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return strconv.Itoa(os.Getuid())
}

// iperf 2 UDP, both ends preloaded: the client sends with write() on a
// connected socket, the server receives on a socket of its own per
// client; every datagram the server's report counts went through both.
func TestIperfUDP(t *testing.T) {
	need(t, "iperf")
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := freePort(t)
	srv := start(t, ctx, dir, true, "iperf", "-s", "-u", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
	waitUDP(t, port, srv)
	cli := start(t, ctx, dir, true, "iperf", "-c", "127.0.0.1", "-u", "-t", "1", "-p", strconv.Itoa(port))
	out := cli.wait(t)
	sentDgrams := num(t, `Sent ([0-9]+) datagrams`, out)
	m := regexp.MustCompile(`(\d+)/(\d+) \(`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no server report (the server's answer did not come back):\n%s", out)
	}
	lost, _ := strconv.Atoi(m[1])
	total, _ := strconv.Atoi(m[2])
	// The client has the server's report, so the server sent it: wait for
	// its engine's stats to show that too (a snapshot taken once the
	// datagrams were in, before the report went, read "server sent 0"
	// under CI's load). An engine that never carried the report still
	// fails below, at statsWhen's deadline.
	ss := srv.statsWhen(t, func(ss stats) bool { return ss.Received >= uint64(total-lost) && ss.Sent >= 1 })
	srv.stop(syscall.SIGINT)
	cs := cli.readStats(t)
	t.Logf("iperf: client sent %.0f datagrams; server report %d lost of %d; client engine %+v; server engine %+v", sentDgrams, lost, total, cs, ss)
	// UD is unreliable: on a loaded machine the kernel may drop a few
	// datagrams (a receive queue that overflowed while its reader waited
	// for a CPU). What the engines must show is that they carried every
	// datagram iperf sent and every one it received, and that whatever
	// iperf lost never reached the server's device: lost below the shim.
	if total < 50 || lost > total/2 {
		t.Errorf("server report: %d lost of %d", lost, total)
	}
	if cs.Sent < uint64(total) || ss.Received < uint64(total-lost) {
		t.Errorf("engines carried fewer datagrams than iperf's report (%d, %d lost): client sent %d, server received %d", total, lost, cs.Sent, ss.Received)
	}
	if lost > 0 && ss.DeviceRx >= cs.DeviceTx {
		t.Errorf("iperf lost %d datagrams the server's device received (client device sent %d, server device received %d): the shim lost them", lost, cs.DeviceTx, ss.DeviceRx)
	}
	if ss.Sent < 1 || cs.Received < 1 {
		t.Errorf("the server report did not go through the engines: server sent %d, client received %d", ss.Sent, cs.Received)
	}
}

// What real programs do to a preloaded process, each in a test program
// (testdata/survive.c) run under the preload: fork while other threads
// are in the shim, close every descriptor, signals with and without
// SA_RESTART, handlers installed without SA_ONSTACK while a thread is
// inside the engine (sigstack: sockperf's client crashed at exit when its
// SIGALRM handler ran on a goroutine stack), errno on bad input,
// readiness through poll/select/epoll, and many more threads than the
// engine's Ps.
func TestSurvive(t *testing.T) {
	dir := built(t)
	for _, mode := range [][]string{{"errno"}, {"poll"}, {"eintr"}, {"sigstack"}, {"closeall"}, {"fork"}, {"threads", "48"}} {
		t.Run(mode[0], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p := start(t, ctx, dir, true, filepath.Join(dir, "survive"), mode...)
			out := p.wait(t)
			if !strings.HasPrefix(out, "ok "+mode[0]) {
				t.Fatalf("output %q", out)
			}
			st := p.readStats(t)
			t.Logf("%s engine: %+v", strings.TrimSpace(out), st)
			if st.Sent == 0 || st.Received != st.Sent {
				t.Errorf("engine sent %d and received %d datagrams: every datagram must go through it", st.Sent, st.Received)
			}
		})
	}
}

// A preloaded dig asks a miekg/dns server running on a Go
// socketshim.PacketConn in this process: the preload's mapping (one UD
// QP, number socketshim.ShimQPN, at the socket's address) is the Go
// shim's, so the two interoperate.
func TestDigToSocketshim(t *testing.T) {
	need(t, "dig")
	dir := built(t)
	pc, err := socketshim.ListenPacket("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) },
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 192.0.2.9")
			m.Answer = append(m.Answer, rr)
			w.WriteMsg(m)
		})}
	done := make(chan error, 1)
	go func() { done <- srv.ActivateAndServe() }()
	<-started
	defer func() { srv.Shutdown(); <-done; pc.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	port := pc.LocalAddr().(*net.UDPAddr).Port
	dig := start(t, ctx, dir, true, "dig", "@127.0.0.1", "-p", strconv.Itoa(port), "+tries=1", "+time=3", "+short", "shim.example", "A")
	if out := strings.TrimSpace(dig.wait(t)); out != "192.0.2.9" {
		t.Fatalf("dig answered %q", out)
	}
	if ds := dig.readStats(t); ds.Sent < 1 || ds.Received < 1 {
		t.Fatalf("dig's engine carried nothing: %+v", ds)
	}
	if pc.Device().Stats().RxDelivered.Load() == 0 {
		t.Fatal("the query did not reach the Go shim's QP")
	}
}
