package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestNetnsNftablesLoss streams between two network namespaces joined by
// a veth pair, each dropping a random share of the UDP and TCP packets it
// receives with nftables (numgen random: this kernel has no netem), as
// two hosts on a lossy link: the kernel drops, not udstream. At 1 % and
// 5 %: every transport's output decodes; RC and Write-Record over RD
// arrive whole; Write-Record with partial delivery decodes more frames
// than whole-message delivery (strictly at 5 %; at 1 % the random drops
// may miss both runs).
func TestNetnsNftablesLoss(t *testing.T) {
	needTS(t)
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (iproute2, nftables; .ci/run installs them)", tool)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "udstream")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	id := os.Getpid() % 100000
	nsA, nsB := fmt.Sprintf("udsA%d", id), fmt.Sprintf("udsB%d", id)
	veth := fmt.Sprintf("uds%d", id)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("setting up the link: %v: %v: %s", args, err, out) // as root with the tools: a setup that fails fails
		}
	}
	sh("ip", "netns", "add", nsA)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", nsA).Run() })
	sh("ip", "netns", "add", nsB)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", nsB).Run() })
	sh("ip", "link", "add", veth+"a", "netns", nsA, "type", "veth", "peer", "name", veth+"b", "netns", nsB)
	sh("ip", "-n", nsA, "addr", "add", "10.213.0.1/24", "dev", veth+"a")
	sh("ip", "-n", nsB, "addr", "add", "10.213.0.2/24", "dev", veth+"b")
	for _, ns := range []string{nsA, nsB} {
		sh("ip", "-n", ns, "link", "set", "lo", "up")
	}
	sh("ip", "-n", nsA, "link", "set", veth+"a", "up")
	sh("ip", "-n", nsB, "link", "set", veth+"b", "up")
	loss := func(permille int) {
		for _, ns := range []string{nsA, nsB} {
			cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(fmt.Sprintf(`flush ruleset
table inet loss {
  chain in {
    type filter hook input priority 0; policy accept;
    meta l4proto { udp, tcp } numgen random mod 1000 < %d drop
  }
}
`, permille))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft: %v: %s", err, out) // the test's own script: a typo in it fails
			}
		}
	}
	in, _ := os.ReadFile(tsIn)
	stream := func(t *testing.T, transport string, extra ...string) (recvStats, []byte, int) {
		t.Helper()
		out := filepath.Join(dir, "out-"+transport+".ts")
		var wg sync.WaitGroup
		var sout []byte
		var serr error
		wg.Go(func() {
			send := exec.Command("ip", "netns", "exec", nsA, bin, "send", "-t", transport, "-listen", "10.213.0.1:5004",
				"-i", tsIn, "-speed", "8", "-q", "-wait", "20s")
			send.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test process
			sout, serr = send.CombinedOutput()
		})
		rcmd := exec.Command("ip", append([]string{"netns", "exec", nsB, bin, "recv", "-t", transport, "-from", "10.213.0.1:5004",
			"-bind", "10.213.0.2:0", "-o", out, "-json", "-q", "-wait", "20s"}, extra...)...)
		var rerr bytes.Buffer
		rcmd.Stderr = &rerr
		rcmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		rout, err := rcmd.Output()
		wg.Wait()
		if serr != nil || err != nil {
			t.Fatalf("%s %v: send %v %s; recv %v %s", transport, extra, serr, sout, err, rerr.String())
		}
		var rs recvStats
		if err := json.Unmarshal(rout, &rs); err != nil {
			t.Fatalf("%s: the receiver's JSON %q: %v", transport, rout, err)
		}
		got, _ := os.ReadFile(out)
		n, _ := frames(out)
		return rs, got, n
	}
	for _, pm := range []int{10, 50} {
		loss(pm)
		t.Run(fmt.Sprintf("loss=%d‰", pm), func(t *testing.T) {
			_, _, pf := stream(t, tWRUD)
			_, _, wf := stream(t, tWRUD, "-discard")
			t.Logf("wr-ud: partial %d frames, whole %d, of %d", pf, wf, inFrames)
			// Two runs, each losing its own random packets: at 1 % a run of
			// whole-message delivery may lose none where the partial run
			// loses a frame's worth (99 against 100 in one CI run), so at
			// 1 % partial delivery must only come within 2 frames of it; at
			// 5 % it must do better, as the figures show it does by far.
			if pf == 0 || pf+2 < wf || (pm >= 50 && pf <= wf) {
				t.Fatalf("partial delivery %d frames against whole-message %d", pf, wf)
			}
			for _, tr := range []string{tWRRD, tRC} {
				rs, got, n := stream(t, tr)
				if !bytes.Equal(got, in) || n != inFrames {
					t.Fatalf("%s: %d of %d bytes, %d frames, through a lossy link (%+v)", tr, len(got), len(in), n, rs)
				}
			}
			for _, tr := range []string{tSendUD, tUDP} {
				rs, _, n := stream(t, tr)
				if n == 0 {
					t.Fatalf("%s: nothing decodes (%+v)", tr, rs)
				}
				t.Logf("%s: %d frames, %d chunks lost", tr, n, rs.ChunksLost)
			}
		})
	}
}
