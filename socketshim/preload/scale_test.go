package preload_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/memstat"
	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// The documented bound (docs/preload.md, "Memory"): the engine's fixed
// cost (Go runtime, the QP table, the receive pool) plus a few KiB per
// socket, over what the same program costs on the kernel.
const (
	fixedBound     = 24 << 20
	perSocketBound = 12 << 10
)

// manysock runs testdata/manysock.c with n sockets, with or without the
// preload, and returns its resident set and descriptor count once every
// socket has sent and received, the engine's stats, and the stray
// datagrams the program skipped. With ns, it runs in that network
// namespace, and every UDP port there gets a stray datagram once the
// program's sockets are bound, before their exchange.
func manysock(t *testing.T, dir string, preload bool, n int, ns string, extra ...string) (rss int64, fds int, st stats, strays int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prog := filepath.Join(dir, "manysock")
	statsFile := filepath.Join(t.TempDir(), "stats.json")
	var env []string
	if preload {
		env = []string{"LD_PRELOAD=" + filepath.Join(dir, "libudiwarp_preload.so"),
			"UDIWARP_ENGINE=" + filepath.Join(dir, "libudiwarp_engine.so"), "UDIWARP_PRELOAD_STATS=" + statsFile}
		env = append(env, extra...)
	}
	cmd := exec.CommandContext(ctx, prog, fmt.Sprint(n))
	cmd.Env = append(os.Environ(), env...)
	if ns != "" { // ip and env exec the program: one process, the program's pid
		cmd = exec.CommandContext(ctx, "ip", append(append([]string{"netns", "exec", ns, "env"}, env...), prog, fmt.Sprint(n))...)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// The program's standard error is read only after Wait: exec's copier
	// writes it until then.
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waited sync.Once
	wait := func() string {
		waited.Do(func() {
			stdin.Close()
			cmd.Wait()
		})
		return stderr.String()
	}
	defer func() {
		if e := wait(); e != "" {
			if l := strings.SplitAfter(e, "\n"); len(l) > 20 {
				e = strings.Join(l[:20], "") + fmt.Sprintf("(and %d lines more)\n", len(l)-20)
			}
			t.Logf("manysock %d (preload %v) said:\n%s", n, preload, e)
		}
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		cancel() // the program may wait for its standard input yet
		wait()   // what the program said, the deferred log shows
		t.Fatalf("manysock %d (preload %v): %s", n, preload, fmt.Sprintf(format, args...))
	}
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); err != nil || line != fmt.Sprintf("bound %d\n", n) {
		fail("%q %v", line, err)
	}
	if ns != "" {
		if sent := sweep(t, ns); sent == 0 {
			fail("no stray sent")
		}
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		fail("%v", err)
	}
	line, err := r.ReadString('\n')
	var got int
	if _, serr := fmt.Sscanf(line, "ready %d strays %d\n", &got, &strays); err != nil || serr != nil || got != n {
		fail("%q %v", line, err)
	}
	pid := cmd.Process.Pid
	if ns != "" {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || string(b) != "manysock\n" {
			fail("process %d is %q (%v), not manysock", pid, b, err)
		}
	}
	if rss, err = memstat.RSS(pid); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	if preload {
		p := &proc{stats: statsFile, cmd: cmd}
		st = p.statsWhen(t, func(st stats) bool {
			return st.Received == uint64(2*(n-1)) && st.Sent == uint64(2*(n-1)) && st.PoolFree == st.Pool
		})
	}
	go io.Copy(io.Discard, out)
	return rss, len(ents), st, strays
}

// sweep sends one stray datagram (not a udiwarp frame) from a socket of
// its own in namespace ns to every UDP port bound there on 127.0.0.1 or
// the wildcard, as other programs on a host's loopback may, and returns
// how many it sent.
func sweep(t *testing.T, ns string) (sent int) {
	t.Helper()
	netnstest.In(t, ns, func() {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		self := c.LocalAddr().(*net.UDPAddr).Port
		b, err := os.ReadFile("/proc/thread-self/net/udp")
		if err != nil {
			t.Fatal(err)
		}
		junk := []byte{0, 0, 0, 0, 0, 0, 0, 0, 's', 't', 'r', 'a', 'y'}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			addr, port, ok := strings.Cut(f[1], ":")
			p, err := strconv.ParseUint(port, 16, 16)
			if !ok || err != nil || int(p) == self || (addr != "0100007F" && addr != "00000000") {
				continue
			}
			if _, err := c.WriteTo(junk, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(p)}); err != nil {
				t.Fatal(err)
			}
			sent++
		}
	})
	return sent
}

// Ten thousand preloaded UDP sockets in one process (a server with a
// socket per client, as SIPp's -t un) each send and receive through
// udiwarp, cost one descriptor each, and stay within the documented
// memory bound over the same program on the kernel.
func TestTenThousandSockets(t *testing.T) {
	dir := built(t)
	const n = 10000
	krss, kfds, _, _ := manysock(t, dir, false, n, "")
	prss, pfds, st, _ := manysock(t, dir, true, n, "")
	t.Logf("%d sockets: RSS %d KiB on the kernel, %d KiB preloaded (%d B per socket over the kernel); descriptors %d and %d",
		n, krss>>10, prss>>10, (prss-krss)/n, kfds, pfds)
	if st.Sockets != n || st.Live != n || st.Received != 2*(n-1) || st.Sent != 2*(n-1) {
		t.Fatalf("the engine carried %+v, want %d sockets and %d datagrams each way", st, n, 2*(n-1))
	}
	if pfds > kfds+16 {
		t.Fatalf("%d descriptors preloaded, %d on the kernel: a socket must cost one", pfds, kfds)
	}
	if bound := krss + fixedBound + n*perSocketBound; prss > bound {
		t.Fatalf("RSS %d KiB preloaded, over the bound of %d KiB (kernel %d KiB + %d MiB + %d KiB per socket)",
			prss>>10, bound>>10, krss>>10, fixedBound>>20, perSocketBound>>10)
	}
	if st.Pool == 0 || st.PoolFree != st.Pool || st.NoRecv != 0 {
		t.Fatalf("receive pool %d, %d free, %d drops: every receive must be back", st.Pool, st.PoolFree, st.NoRecv)
	}
}

// A socket's receive queue is the kernel's, bounded by the program's
// SO_RCVBUF in bytes: a burst to a socket that reads nothing meanwhile
// leaves as many datagrams queued under the preload as on the kernel
// (not a fixed count of posted receives).
func TestReceiveBufferIsTheKernels(t *testing.T) {
	dir := built(t)
	burst := func(preload bool, rcvbuf int) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p := start(t, ctx, dir, preload, filepath.Join(dir, "manysock"), "burst", "400", fmt.Sprint(rcvbuf))
		out := p.wait(t)
		var got, of int
		if _, err := fmt.Sscanf(out, "received %d of %d", &got, &of); err != nil {
			t.Fatalf("manysock burst: %q", out)
		}
		if preload && p.readStats(t).Received != uint64(got) {
			t.Fatalf("the engine delivered %d, the program read %d", p.readStats(t).Received, got)
		}
		return got
	}
	for _, rcvbuf := range []int{1 << 18, 1 << 19} {
		k, p := burst(false, rcvbuf), burst(true, rcvbuf)
		t.Logf("SO_RCVBUF %d: %d of 400 queued on the kernel, %d preloaded", rcvbuf, k, p)
		if p < k*9/10 || p > k*11/10 || p == 128 {
			t.Errorf("SO_RCVBUF %d: %d of 400 queued preloaded, %d on the kernel", rcvbuf, p, k)
		}
	}
}

// Datagrams of every size, small and large interleaved and across the
// classes' edges, arrive whole through the engine's two receive classes
// (2 KiB and 64 KiB: where each receive lies in the pool), and every
// receive goes back.
func TestReceiveSizeClasses(t *testing.T) {
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := start(t, ctx, dir, true, filepath.Join(dir, "manysock"), "sizes")
	if out := p.wait(t); out != "sizes ok\n" {
		t.Fatalf("manysock sizes: %q", out)
	}
	if st := p.readStats(t); st.Received != 30 || st.PoolFree != st.Pool || st.NoRecv != 0 {
		t.Fatalf("the engine delivered %d of 30, pool %d with %d free, %d dropped", st.Received, st.Pool, st.PoolFree, st.NoRecv)
	}
}

// Stray datagrams on the loopback (another program's, to a port it used
// a moment ago, or to any port) reach whatever socket holds that port
// now: manysock, whose sockets hold a third of the ephemeral ports, skips
// them on the kernel instead of failing (socket 0 answered a stray, and a
// socket took one for its answer), and under the preload the engine
// drops them (they are not udiwarp frames) while every socket's
// datagrams still go through it. Every socket gets a stray, in a
// namespace of the test's own, before the exchange.
func TestManySocketsAmidStrays(t *testing.T) {
	dir := built(t)
	ns := netnstest.New(t, "link set lo up")
	const n = 1000
	if _, _, _, strays := manysock(t, dir, false, n, ns); strays != n {
		t.Fatalf("on the kernel, manysock skipped %d strays, want one for each of its %d sockets", strays, n)
	}
	_, _, st, strays := manysock(t, dir, true, n, ns)
	t.Logf("preloaded: %+v", st)
	if strays != 0 {
		t.Fatalf("preloaded, manysock was given %d strays: the engine must drop what is not a udiwarp frame", strays)
	}
	if st.Sockets != n || st.Received != 2*(n-1) || st.Sent != 2*(n-1) || st.PoolFree != st.Pool {
		t.Fatalf("the engine carried %+v, want %d sockets and %d datagrams each way", st, n, 2*(n-1))
	}
	if st.Device["RxBadVersion"] != n {
		t.Fatalf("the engine dropped %d strays as no udiwarp frame, want %d (one for each socket)", st.Device["RxBadVersion"], n)
	}
}

// A poll, select or epoll over many sockets with datagrams waiting does
// not drop them. The C side asks the engine, for each descriptor the
// kernel calls readable, whether a datagram for the program is there
// (udw_ready), and the engine reads one into the process's receive pool
// to tell; a SIPp UAC's epoll_wait names up to 1,000 sockets at once, so
// the probes took every receive of the pool (560 by default) and the
// device dropped the rest as they were read (dropped_no_receive): a SIP
// message lost, sent again 500 ms later. manysock epoll has 200 sockets
// with a datagram each and one epoll_wait that names them all, over a
// pool of 16 receives.
func TestReadyProbeKeepsDatagrams(t *testing.T) {
	dir := built(t)
	const n = 200
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startEnv(t, ctx, dir, true, []string{"UDIWARP_PRELOAD_POOL=65536"}, filepath.Join(dir, "manysock"), "epoll", strconv.Itoa(n))
	out := p.wait(t)
	var got, of, most int
	if _, err := fmt.Sscanf(out, "epoll got %d of %d, most %d at once\n", &got, &of, &most); err != nil {
		t.Fatalf("manysock epoll: %q: %v", out, err)
	}
	st := p.readStats(t)
	t.Logf("read %d of %d, at most %d events at once; pool %d, dropped %d", got, n, most, st.Pool, st.NoRecv)
	if st.Pool >= n {
		t.Fatalf("the pool has %d receives, enough for the %d datagrams: the test does not reach its limit", st.Pool, n)
	}
	if got != n || st.NoRecv != 0 || st.Received != n {
		t.Fatalf("the program read %d of %d datagrams, the engine delivered %d and dropped %d for want of a receive (pool %d)", got, n, st.Received, st.NoRecv, st.Pool)
	}
}

// An RD socket that answers many peers reads, as it sends, no more of
// their frames than it may hold. A send reads the socket for RD's
// acknowledgements (a sender that never receives sees them so), and a
// Data frame it read waits in the socket's CQ for the program; a SIP
// server's one socket, which reads one request per wait and answers
// each with two datagrams (180 and 200), so filled the socket's share of
// the pool (4 receives), and every Data frame read after was refused,
// receiver not ready, for its peer to send again later: 3,351 at 30,000
// clients, whose peers' retries ran out. manysock answer has a server
// socket answer 100 clients' requests so, over RD, twice (the second
// time every session is open, so the requests queue at once).
func TestRDSendReadsWhatItMayHold(t *testing.T) {
	dir := built(t)
	const n = 100
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startEnv(t, ctx, dir, true, rdEnv(), filepath.Join(dir, "manysock"), "answer", strconv.Itoa(n))
	if out := p.wait(t); out != fmt.Sprintf("answered %d\n", 4*n) {
		t.Fatalf("manysock answer: %q", out)
	}
	st := p.readStats(t)
	t.Logf("preloaded over RD: %+v", st)
	if st.QP != "rd" || st.Received != 6*n {
		t.Fatalf("the engine delivered %d datagrams over %q, want %d over rd", st.Received, st.QP, 6*n)
	}
	if st.Overdraft != 0 || st.Device["RDNotReady"] != 0 {
		t.Fatalf("the engine refused %d Data frames over a socket's share of the pool (%d receivers not ready): a send read more than its socket may hold",
			st.Overdraft, st.Device["RDNotReady"])
	}
}
