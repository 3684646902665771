package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/llp"
)

// TestServerClientXDP runs `udperf server` and `udperf client -llp xdp`
// in two network namespaces joined by a veth pair: raw-xdp (plain UDP on
// AF_XDP, no stack) and ud-send on AF_XDP at both ends, a ping-pong and
// a stream of 1400-byte messages (within the veth's 1500-byte MTU: an
// AF_XDP link takes no IP fragments). The server follows the client's
// -llp, and its figures say what its end ran on: xdp.
func TestServerClientXDP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds udperf and two namespaces")
	}
	const subnet = "10.212.9"
	srv, cli, va, vb := netnsPair(t, fmt.Sprintf("x%d", os.Getpid()%100000), subnet)
	// The kernel's datagrams leave a veth with their UDP checksum unfilled
	// unless tx offload is off; AF_XDP readers check it. Both ends (the
	// neighbour probes and the kernel-socket side of each link go through
	// the kernel).
	for _, e := range [][2]string{{srv, va}, {cli, vb}} {
		netnstest.In(t, e[0], func() {
			if err := netnstest.TxChecksumOff(e[1]); err != nil {
				t.Fatal(err)
			}
		})
	}
	netnstest.In(t, srv, func() {
		if err := llp.XDPAvailable(va); err != nil {
			t.Skipf("AF_XDP unavailable here: %v", err)
		}
	})
	bin := buildUdperf(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	control := subnet + ".1:18516"
	server := exec.CommandContext(ctx, "ip", "netns", "exec", srv, bin, "server", "-addr", control)
	var sout, serr lockedBuffer // the server process writes them while the test reads
	server.Stdout, server.Stderr = &sout, &serr
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	for _, tc := range []struct {
		mode, test, size, poll string
		args                   []string
	}{
		{"raw-xdp", "lat", "64", "busy", []string{"-n", "300", "-w", "20"}},
		{"raw-xdp", "bw", "1400", "event", []string{"-D", "200ms"}},
		{"ud-send", "lat", "64", "event", []string{"-n", "300", "-w", "20", "-llp", "xdp"}},
		{"ud-send", "bw", "1400", "busy", []string{"-D", "200ms", "-llp", "xdp"}},
	} {
		t.Run(tc.mode+"/"+tc.test+"/"+tc.poll, func(t *testing.T) {
			var out []byte
			var err error
			// The server may still be starting: the first client retries.
			for try := 0; try < 50; try++ {
				args := append([]string{"netns", "exec", cli, bin, "client", "-addr", control,
					"-mode", tc.mode, "-test", tc.test, "-s", tc.size, "-poll", tc.poll, "-json"}, tc.args...)
				if out, err = exec.CommandContext(ctx, "ip", args...).Output(); err == nil || !strings.Contains(string(errOut(err)), "refused") {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("client: %v: %s (server: %s%s)", err, errOut(err), sout.String(), serr.String())
			}
			var doc document
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if len(doc.Results) != 1 {
				t.Fatalf("%d rows: %s", len(doc.Results), out)
			}
			r := doc.Results[0]
			t.Logf("%s %s %s B: %.2f us, %.3f Gb/s, %.4f Mpps, client on %s (%s), server on %s (%s)",
				r.Mode, r.Test, tc.size, r.TTypical, r.BWAvg, r.MsgRate, r.Link, r.LinkDetail, r.ServerLink, r.ServerLinkDetail)
			if r.Mode != tc.mode || r.Test != tc.test || fmt.Sprint(r.Bytes) != tc.size || r.Poll != tc.poll {
				t.Errorf("the row is of another run: %+v", r)
			}
			switch tc.test {
			case "lat":
				if r.N != 300 || r.Iterations != 300 || r.TTypical <= 0 || r.TMin <= 0 || r.TMin > r.TTypical {
					t.Errorf("latency row: %+v", r)
				}
			case "bw":
				if r.Iterations == 0 || r.BWAvg <= 0 || r.MsgRate <= 0 || r.ValidBytes == nil || *r.ValidBytes != uint64(r.Iterations)*1400 {
					t.Errorf("bandwidth row: %+v", r)
				}
			}
			// Both ends really ran on AF_XDP: the client's own end, and the
			// server's as it reported it.
			if r.Link != "xdp" || r.ServerLink != "xdp" {
				t.Errorf("client on %q (%s), server on %q (%s): want xdp at both ends", r.Link, r.LinkDetail, r.ServerLink, r.ServerLinkDetail)
			}
			if tc.mode == "ud-send" && r.LLP != "xdp" {
				t.Errorf("llp %q, want xdp", r.LLP)
			}
		})
	}
	if !strings.Contains(sout.String(), "ud-send lat 64 B poll event on xdp") {
		t.Errorf("the server's lines do not say its end ran on xdp:\n%s", sout.String())
	}
}
