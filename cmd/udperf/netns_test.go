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
)

// TestServerClientNetns runs `udperf server` and `udperf client` as two
// processes in two network namespaces joined by a veth pair, as on two
// hosts: the modes cross a real (virtual) link, not loopback.
func TestServerClientNetns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds udperf and two namespaces")
	}
	srv, cli, _, _ := netnsPair(t, fmt.Sprintf("udp%d", os.Getpid()%100000), "10.211.7")
	bin := buildUdperf(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	server := exec.CommandContext(ctx, "ip", "netns", "exec", srv, bin, "server", "-addr", "10.211.7.1:18515")
	var serr strings.Builder
	server.Stderr = &serr
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	for _, tc := range []struct{ mode, test, size, poll string }{
		{"ud-send", "lat", "64", "event"},
		{"ud-wr", "bw", "200000", "event"},
		{"rd-write", "bw", "65536", "event"},
		{"rd-read", "lat", "1024", "event"},
		{"rc-send", "bw", "65536", "event"},
		{"rc-write", "lat", "64", "busy"},
	} {
		t.Run(tc.mode+"/"+tc.test, func(t *testing.T) {
			var out []byte
			var err error
			// The server may still be starting: the first client retries.
			for try := 0; try < 50; try++ {
				args := append([]string{"netns", "exec", cli, bin, "client", "-addr", "10.211.7.1:18515",
					"-mode", tc.mode, "-test", tc.test, "-s", tc.size, "-poll", tc.poll, "-json"}, runLength(tc.test, 200, 20, "200ms")...)
				if tc.mode == "ud-wr" || tc.mode == "rd-write" || tc.mode == "rd-read" { // the modes that segment (-mtu elsewhere is refused)
					args = append(args, "-mtu", "1400")
				}
				c := exec.CommandContext(ctx, "ip", args...)
				if out, err = c.Output(); err == nil || !strings.Contains(string(errOut(err)), "refused") {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("client: %v: %s (server: %s)", err, errOut(err), serr.String())
			}
			var doc document
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			r := doc.Results[0]
			if r.Mode != tc.mode || r.Iterations == 0 || (tc.test == "lat" && r.TTypical <= 0) || (tc.test == "bw" && r.BWAvg <= 0) {
				t.Fatalf("%+v", r)
			}
			if tc.test == "bw" && reliableMode(tc.mode) && *r.Lost != 0 {
				t.Fatalf("a reliable mode lost %d", *r.Lost)
			}
		})
	}
}

// netnsPair makes two network namespaces joined by a veth pair, as two
// hosts: the server's (srv, its end va holding NET.1/24) and the
// client's (cli, vb with NET.2/24), named after tag; they are removed
// when the test ends. It skips where namespaces cannot be made (not
// root, no ip).
func netnsPair(t *testing.T, tag, subnet string) (srv, cli, va, vb string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network namespaces need iproute2's ip")
	}
	srv, cli = "udperf-s-"+tag, "udperf-c-"+tag
	ipcmd := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	for _, ns := range []string{srv, cli} {
		if err := ipcmd("netns", "add", ns); err != nil {
			t.Fatal(err) // as root with ip: a namespace that cannot be made fails
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	va, vb = "va"+tag, "vb"+tag
	for _, c := range [][]string{
		{"link", "add", va, "netns", srv, "type", "veth", "peer", "name", vb, "netns", cli},
		{"-n", srv, "addr", "add", subnet + ".1/24", "dev", va},
		{"-n", cli, "addr", "add", subnet + ".2/24", "dev", vb},
		{"-n", srv, "link", "set", va, "up"},
		{"-n", cli, "link", "set", vb, "up"},
		{"-n", srv, "link", "set", "lo", "up"},
		{"-n", cli, "link", "set", "lo", "up"},
	} {
		if err := ipcmd(c...); err != nil {
			t.Fatalf("building the link: %v", err)
		}
	}
	return srv, cli, va, vb
}

func errOut(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return []byte(err.Error())
}
