package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer the server's goroutines may write while
// the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startServerOut serves control connections on a loopback port until the
// test ends; the server's lines go to the returned buffer.
func startServerOut(t *testing.T) (string, *lockedBuffer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	done := make(chan int, 1)
	go func() { done <- serveOn(context.Background(), ln, serverOptions{stdout: &out, stderr: &out}) }()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), &out
}

// TestClientRefusesBeforeConnecting: every setting the server cannot
// serve is refused by the client in one line, exit 2, before it connects
// (the listener accepts nothing).
func TestClientRefusesBeforeConnecting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted sync.WaitGroup
	var conns []string
	var mu sync.Mutex
	accepted.Add(1)
	go func() {
		defer accepted.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c.RemoteAddr().String())
			mu.Unlock()
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-qps", "2"}, "-qps does not apply to client"},
		{[]string{"-bidir", "-test", "bw"}, "-bidir does not apply to client"},
		{[]string{"-mode", "ud-send", "-loss", "0.1"}, "ping-pong would stop"},
		{[]string{"-mode", "rc-send", "-test", "bw", "-loss", "0.1"}, "no impairment layer"},
		{[]string{"-mode", "raw-udp", "-test", "bw", "-loss", "0.1"}, "no impairment layer"},
		{[]string{"-mode", "rd-send", "-partial"}, "only ud-wr delivers partial"},
		{[]string{"-mode", "ud-send", "-mtu", "1000"}, "sends each message whole"},
		{[]string{"-mode", "rc-write", "-poll", "event"}, "needs busy polling"},
		{[]string{"-mode", "ud-send", "-s", "65100"}, "-s 65100"},
		{[]string{"-mode", "ud-wr", "-s", "9000000"}, "-s 9000000: ud-wr carries 1 to"},
		{[]string{"-mode", "ud-wr", "-deadline", "1s"}, "-deadline is the deadline of -partial"},
		{[]string{"-mode", "rd-send", "-test", "bw", "-D", "2h"}, "-D 2h0m0s: a server/client run lasts at most 1h0m0s"},
		{[]string{"-mode", "raw-udp", "-n", "999999", "-w", "2"}, "1000001 round trips (-n plus -w): a server/client lat run makes 0 to 1000000"},
		{[]string{"-mode", "ud-wr", "-partial", "-deadline", "11s"}, "-deadline 11s: at most 10s"},
		{[]string{"-mode", "rd-write", "-mtu", "70000"}, "-mtu 70000: at most 65535"},
		{[]string{"-json", "-csv"}, "-json and -csv"},
		{[]string{"-test", "nope"}, "-test"},
		{[]string{"-metrics", "256.0.0.1:1"}, "-metrics"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"client", "-addr", addr}, tc.args...)
		code := run(args, &out, &errb)
		if code != 2 || out.Len() != 0 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line saying %q", args, code, out.String(), errb.String(), tc.says)
		}
	}
	ln.Close()
	accepted.Wait()
	if len(conns) > 0 {
		t.Fatalf("refused runs connected to the server: %v", conns)
	}
}

// runClient runs `udperf client -json` against addr and returns its rows.
func runClient(t *testing.T, addr string, args ...string) []row {
	t.Helper()
	var out, errb bytes.Buffer
	args = append([]string{"client", "-addr", addr, "-json"}, args...)
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("%q: exit %d: %s", args, code, errb.String())
	}
	var doc document
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil || len(doc.Results) == 0 {
		t.Fatalf("%q: %v: %s", args, err, out.String())
	}
	return doc.Results
}

// TestClientSettingsApplied: -loss, -seed, -mtu, -partial and -deadline
// act over server/client as in local (the client's end drops what a
// ud-wr sender drops; the server's end delivers partial records), -test
// rate is served, and the server prints a line per run.
func TestClientSettingsApplied(t *testing.T) {
	addr, srvOut := startServerOut(t)
	const size = 100000
	common := []string{"-mode", "ud-wr", "-test", "bw", "-s", strconv.Itoa(size), "-mtu", "10000", "-D", "300ms", "-poll", "event"}
	// Without loss: every message whole.
	r := runClient(t, addr, common...)[0]
	if r.Iterations == 0 || *r.ValidBytes != uint64(r.Iterations)*size {
		t.Fatalf("no loss: %+v", r)
	}
	// -loss 0.2: one segment in five dropped at the sender, so most
	// messages of ten segments are lost, and what is valid is the whole
	// messages (discarded when incomplete, the default).
	r = runClient(t, addr, append(common, "-loss", "0.2", "-seed", "1")...)[0]
	if *r.Lost == 0 || *r.ValidBytes != uint64(r.Iterations)*size || r.Loss != 0.2 || r.Seed != 1 {
		t.Fatalf("-loss 0.2: %+v", r)
	}
	// -partial: the incomplete messages are delivered at the deadline, so
	// more bytes are valid than the whole messages hold.
	r = runClient(t, addr, append(common, "-loss", "0.2", "-seed", "1", "-partial", "-deadline", "5ms")...)[0]
	if *r.Lost == 0 || *r.ValidBytes <= uint64(r.Iterations)*size || !r.Partial {
		t.Fatalf("-partial: %+v", r)
	}
	// RD: both ends drop, the transport makes up for it.
	r = runClient(t, addr, "-mode", "rd-send", "-test", "bw", "-s", "1000", "-D", "300ms", "-poll", "event", "-loss", "0.05", "-seed", "3")[0]
	if r.Iterations == 0 || *r.Lost != 0 {
		t.Fatalf("rd-send -loss: %+v", r)
	}
	// -test rate: bw with the message rate as its figure.
	r = runClient(t, addr, "-mode", "ud-send", "-test", "rate", "-s", "64", "-D", "200ms", "-poll", "event")[0]
	if r.Test != "rate" || r.MsgRate <= 0 || r.Iterations == 0 {
		t.Fatalf("rate: %+v", r)
	}
	lines := srvOut.String()
	for _, want := range []string{
		"ud-wr bw 100000 B poll event mtu 10000: ",
		"ud-wr bw 100000 B poll event loss 0.2 seed 1 mtu 10000: ",
		"ud-wr bw 100000 B poll event loss 0.2 seed 1 partial 5ms mtu 10000: ",
		"partial\n",
		"rd-send bw 1000 B poll event loss 0.05 seed 3: ",
		"ud-send rate 64 B poll event: ",
		" Gb/s, ",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("the server's lines lack %q:\n%s", want, lines)
		}
	}
	if strings.Count(lines, "\n") != 5 {
		t.Errorf("want a line per run (5):\n%s", lines)
	}
}

// TestClientNotAServer: a control peer that is not a udperf server
// (garbage, an HTTP server, an echo, one that closes at once, one that
// says nothing) is named so in one line, exit 1, without hanging.
func TestClientNotAServer(t *testing.T) {
	old := greetTimeout
	t.Cleanup(func() { greetTimeout = old })
	greetTimeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		peer func(c net.Conn)
		why  string
	}{
		{"garbage", func(c net.Conn) { c.Write([]byte("\x00\xffgarbage\n")) }, "it answered something else"},
		{"http", func(c net.Conn) {
			bufio.NewReader(c).ReadString('\n')
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
		}, "it answered something else"},
		{"echo", func(c net.Conn) { io.Copy(c, c) }, "it answered something else"},
		{"closes", func(c net.Conn) {}, "it closed the connection"},
		{"silent", func(c net.Conn) { io.Copy(io.Discard, c) }, "no answer within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			defer func() { ln.Close(); wg.Wait() }()
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				tc.peer(c)
			}()
			var out, errb bytes.Buffer
			addr := ln.Addr().String()
			code := run([]string{"client", "-addr", addr, "-mode", "ud-send", "-n", "10"}, &out, &errb)
			want := "udperf client: not a udperf server at " + addr + " (" + tc.why
			if code != 1 || strings.Count(errb.String(), "\n") != 1 || !strings.HasPrefix(errb.String(), want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 and %q", code, errb.String(), want)
			}
		})
	}
}

// buildUdperf builds the command into the test's TempDir.
func buildUdperf(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "udperf")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	return bin
}

// startServerProcess starts `udperf server` (built at bin) on a loopback
// port with args; it returns the process, its control address, and its
// stdout lines after the first.
func startServerProcess(t *testing.T, bin string, args ...string) (*exec.Cmd, string, <-chan string, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"server", "-addr", "127.0.0.1:0"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test process
	var errb lockedBuffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	select {
	case l := <-lines:
		addr, ok := strings.CutPrefix(l, "udperf server: control at ")
		if !ok {
			t.Fatalf("the server's first line %q", l)
		}
		return cmd, addr, lines, &errb
	case <-time.After(time.Minute): // only a hung server gets here
		t.Fatalf("the server did not start: %s", errb.String())
	}
	return nil, "", nil, nil
}

// waitExit waits for cmd to exit, failing only a hung process.
func waitExit(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(2 * time.Minute):
		t.Fatal("the process did not exit")
		return 0
	}
}

// TestServerOnceSession: with -once the server serves one client session,
// a whole -a sweep over one control connection (a line per run), and
// exits 0 once it ends.
func TestServerOnceSession(t *testing.T) {
	bin := buildUdperf(t)
	srv, addr, lines, srvErr := startServerProcess(t, bin, "-once")
	// Rows on stdout; stderr, a pipe, has the sweep's progress lines.
	cli := exec.Command(bin, "client", "-addr", addr, "-a", "-mode", "ud-send", "-n", "20", "-w", "2", "-poll", "event", "-csv")
	var cliErr bytes.Buffer
	cli.Stderr = &cliErr
	out, err := cli.Output()
	if err != nil {
		t.Fatalf("client: %v: %s%s", err, out, cliErr.Bytes())
	}
	rows := strings.Split(strings.TrimSpace(string(out)), "\n")[1:]
	if code := waitExit(t, srv); code != 0 {
		t.Fatalf("server -once: exit %d: %s", code, srvErr.String())
	}
	var served []string
	for l := range lines {
		served = append(served, l)
	}
	// -a: 2 B to 32 KiB, 15 sizes; a row and a server line for each, all
	// from one client address (one control connection).
	if len(rows) != 15 || len(served) != 15 {
		t.Fatalf("%d rows, %d server lines:\n%s\n%s", len(rows), len(served), out, strings.Join(served, "\n"))
	}
	re := regexp.MustCompile(`^udperf server: (\S+) ud-send lat (\d+) B poll event: p50 [0-9.]+ us, avg [0-9.]+ us$`)
	from := ""
	for i, l := range served {
		m := re.FindStringSubmatch(l)
		if m == nil || m[2] != strconv.Itoa(2<<i) || (from != "" && m[1] != from) {
			t.Fatalf("server line %d %q (the session's first came from %s)", i, l, from)
		}
		from = m[1]
	}
}

// TestServerSignals: SIGTERM and SIGINT stop the server, idle or with a
// run in progress (its device open, a client waiting), and it exits 0 at
// once, waiting for no timeout (a request's 10 s, a run's slack). How fast
// is TestServerSignalsWithin100ms's.
func TestServerSignals(t *testing.T) {
	took := serverSignalRounds(t)
	for sig, ds := range took {
		t.Logf("%v to exit: %v", sig, ds)
		for _, d := range ds {
			// Not a figure: only a server that waited for something gets here.
			if d >= 5*time.Second {
				t.Fatalf("%v to exit: %v (rounds %v): the server waited for something", sig, d, ds)
			}
		}
	}
}

// TestServerSignalsWithin100ms: the figure the issue asks, the server out
// within 100 ms of SIGTERM or SIGINT: the median of six rounds (half of
// them with a run in progress), each under 1 s. Process scheduling on a
// loaded machine is in what it measures, so it skips under the race
// detector (the suite as run beside other work) and .ci/run runs it again
// without it, alone.
func TestServerSignalsWithin100ms(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("a figure check (process exit within 100 ms): not under -short or -race; .ci/run runs it without -race")
	}
	for sig, took := range serverSignalRounds(t) {
		sorted := slices.Clone(took)
		slices.Sort(sorted)
		t.Logf("%v to exit: %v", sig, took)
		if med := sorted[len(sorted)/2]; med > 100*time.Millisecond || sorted[len(sorted)-1] >= time.Second {
			t.Errorf("%v to exit: median %v (want <= 100ms), rounds %v (each under 1s)", sig, med, took)
		}
	}
}

// serverSignalRounds stops six server processes with each of SIGTERM and
// SIGINT, every other one with a run in progress, checks each exits 0
// with nothing on stderr, and returns how long each took from the signal
// to its exit.
func serverSignalRounds(t *testing.T) map[syscall.Signal][]time.Duration {
	bin := buildUdperf(t)
	out := map[syscall.Signal][]time.Duration{}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		{
			var took []time.Duration
			for round := range 6 {
				srv, addr, _, srvErr := startServerProcess(t, bin)
				if round%2 == 1 {
					// A run in progress: a session's rd-send bandwidth run,
					// its endpoint open and waiting for the client's done.
					c, err := net.Dial("tcp", addr)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(time.Minute))
					enc, dec := json.NewEncoder(c), json.NewDecoder(c)
					enc.Encode(runRequest{Hello: protocol})
					var rep runReply
					if err := dec.Decode(&rep); err != nil || rep.Udperf != protocol {
						t.Fatalf("hello: %+v %v", rep, err)
					}
					enc.Encode(runRequest{Mode: "rd-send", Test: "bw", Size: 1000, Poll: "event", Duration: time.Minute, From: "127.0.0.1:9", QPN: 2})
					if err := dec.Decode(&rep); err != nil || rep.Addr == "" {
						t.Fatalf("run: %+v %v", rep, err)
					}
				}
				t0 := time.Now()
				if err := srv.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				code := waitExit(t, srv)
				took = append(took, time.Since(t0))
				if code != 0 {
					t.Fatalf("%v, round %d: exit %d: %s", sig, round, code, srvErr.String())
				}
				if s := srvErr.String(); s != "" {
					t.Fatalf("%v, round %d: stderr %q", sig, round, s)
				}
			}
			out[sig] = took
		}
	}
	return out
}

// TestServerMetrics: `udperf server -metrics` serves its devices' counts
// over HTTP while a run goes on (a bandwidth run scraped before it ends)
// and after it; an RFC 7306 run (rd-atomic) shows in the atomics the
// server carried out.
func TestServerMetrics(t *testing.T) {
	bin := buildUdperf(t)
	_, addr, lines, srvErr := startServerProcess(t, bin, "-metrics", "127.0.0.1:0")
	scrape := func(url, series string) int {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := regexp.MustCompile(regexp.QuoteMeta(series) + ` (\d+)`).FindSubmatch(body)
		if m == nil {
			return -1
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	url := func() string {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if m := regexp.MustCompile(`metrics at (http://\S+/metrics)`).FindStringSubmatch(srvErr.String()); m != nil {
				return m[1]
			}
		}
		t.Fatalf("no metrics address on stderr: %q", srvErr.String())
		return ""
	}()
	in := `udiwarp_datagrams_total{device="server",direction="in"}`
	done := make(chan int, 1)
	go func() {
		var out, errb bytes.Buffer
		done <- run([]string{"client", "-addr", addr, "-mode", "ud-send", "-test", "bw", "-s", "1000", "-D", "3s", "-poll", "event"}, &out, &errb)
	}()
	during := false
	for !during {
		select {
		case code := <-done:
			t.Fatalf("the run ended (exit %d) before a scrape saw its datagrams", code)
		case <-time.After(50 * time.Millisecond):
			during = scrape(url, in) > 0
		}
	}
	if code := <-done; code != 0 {
		t.Fatalf("client: exit %d", code)
	}
	<-lines
	var out, errb bytes.Buffer
	if code := run([]string{"client", "-addr", addr, "-mode", "rd-atomic", "-n", "100", "-w", "5", "-poll", "event"}, &out, &errb); code != 0 {
		t.Fatalf("client rd-atomic: exit %d: %s", code, errb.String())
	}
	<-lines
	if n := scrape(url, `udiwarp_rfc7306_operations_total{device="server",operation="atomic"}`); n != 105 {
		t.Fatalf("the server carried out %d atomics, want the client's 105", n)
	}
}

// TestClientInterrupt: SIGINT in the middle of a client's sweep ends it
// after the run in progress: the rows measured are printed, the session
// ends politely (the server is free for the next client at once), and
// the exit code is 130.
func TestClientInterrupt(t *testing.T) {
	bin := buildUdperf(t)
	addr, _ := startServerOut(t)
	cmd := exec.Command(bin, "client", "-addr", addr, "-a", "-mode", "raw-udp", "-n", "2000", "-poll", "event")
	var errb lockedBuffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	var all bytes.Buffer
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			all.WriteString(sc.Text() + "\n")
			lines <- sc.Text()
		}
	}()
	for n := 0; n < 2; n++ { // the header and a row
		select {
		case _, ok := <-lines:
			if !ok {
				t.Fatalf("stdout ended early: %s", errb.String())
			}
		case <-time.After(2 * time.Minute): // only a hung run gets here
			t.Fatal("no row")
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	if code := waitExit(t, cmd); code != exitInterrupted {
		t.Fatalf("exit %d, want 130; stderr %q, stdout:\n%s", code, errb.String(), all.String())
	}
	ls := strings.Split(strings.TrimSuffix(all.String(), "\n"), "\n")
	if len(ls) < 2 || len(ls) >= 16 || !strings.Contains(errb.String(), "interrupted") {
		t.Fatalf("stderr %q, stdout:\n%s", errb.String(), all.String())
	}
	for i, l := range ls[1:] {
		f := strings.Fields(l)
		if len(f) != 9 || f[0] != strconv.Itoa(2<<i) || f[1] != "2000" {
			t.Fatalf("row %d %q", i+1, l)
		}
	}
	// The session ended with its bye: another client is served at once.
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 0 {
		t.Fatalf("a client right after the interrupted one: exit %d: %s", code, stderr)
	}
}
