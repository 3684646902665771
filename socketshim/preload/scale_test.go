package preload_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/memstat"
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
// socket has sent and received, and the engine's stats.
func manysock(t *testing.T, dir string, preload bool, n int) (rss int64, fds int, st stats) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "manysock"), fmt.Sprint(n))
	cmd.Env = os.Environ()
	statsFile := filepath.Join(t.TempDir(), "stats.json")
	if preload {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+filepath.Join(dir, "libudiwarp_preload.so"),
			"UDIWARP_ENGINE="+filepath.Join(dir, "libudiwarp_engine.so"), "UDIWARP_PRELOAD_STATS="+statsFile)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != fmt.Sprintf("ready %d\n", n) {
		t.Fatalf("manysock %d (preload %v): %q %v\n%s", n, preload, line, err, stderr.String())
	}
	pid := cmd.Process.Pid
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
	return rss, len(ents), st
}

// Ten thousand preloaded UDP sockets in one process (a server with a
// socket per client, as SIPp's -t un) each send and receive through
// udiwarp, cost one descriptor each, and stay within the documented
// memory bound over the same program on the kernel.
func TestTenThousandSockets(t *testing.T) {
	dir := built(t)
	const n = 10000
	krss, kfds, _ := manysock(t, dir, false, n)
	prss, pfds, st := manysock(t, dir, true, n)
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
