package qp

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// TestLowerXDPUnprivileged: a program without root asks for AF_XDP on
// an interface that could run it (a veth pair this test makes): Bind
// fails with the reason in one line, and with LowerFallback gives a
// kernel socket that says why and carries a Send. The program is this
// test binary, run as nobody with no capabilities (setpriv), in
// TestLowerXDPUnprivilegedChild.
func TestLowerXDPUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make the veth pair and to drop to nobody")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs util-linux's setpriv to run a child without privileges")
	}
	ns := netnstest.New(t, "link set lo up")
	veth := fmt.Sprintf("udp%d", netnstest.Seq())
	addr := fmt.Sprintf("10.218.%d.1", netnstest.Seq()%250)
	for _, c := range [][]string{
		{"link", "add", veth + "a", "type", "veth", "peer", "name", veth + "b", "netns", ns},
		{"addr", "add", addr + "/24", "dev", veth + "a"},
		{"link", "set", veth + "a", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", veth+"a").Run() })
	// The binary where nobody may run it.
	dir, err := os.MkdirTemp("", "udiwarp-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "qp.test")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err == nil {
		_, err = io.Copy(dst, src)
		dst.Close()
	}
	src.Close()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
		bin, "-test.run", "^TestLowerXDPUnprivilegedChild$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "UDIWARP_UNPRIV_ADDR="+addr)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestLowerXDPUnprivilegedChild") {
		t.Fatalf("the unprivileged child: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestLowerXDPUnprivilegedChild is TestLowerXDPUnprivileged's child,
// run as nobody; alone it skips.
func TestLowerXDPUnprivilegedChild(t *testing.T) {
	addr := os.Getenv("UDIWARP_UNPRIV_ADDR")
	if addr == "" {
		t.Skip("TestLowerXDPUnprivileged's child: runs only under it")
	}
	if os.Geteuid() == 0 {
		t.Fatal("the child runs as root: the privileges were not dropped")
	}
	d, err := Open(DeviceConfig{Lower: LowerXDP})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = d.Bind("udp4", addr+":0")
	if err == nil {
		t.Fatal("AF_XDP opened without privileges")
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "AF_XDP") ||
		!(strings.Contains(msg, "root") || strings.Contains(msg, "CAP_")) {
		t.Fatalf("the reason is not one line naming what is missing: %q", msg)
	}
	t.Logf("refused: %v", err)

	f := newNode(t, DeviceConfig{Lower: LowerXDP, LowerFallback: true}, "udp4", addr+":0")
	c := f.sock.Link()
	if c.Kind != "udp" || !strings.Contains(c.Detail, "AF_XDP refused") || !strings.Contains(c.Detail, err.Error()[len("qp: "):]) {
		t.Fatalf("the fallback socket: %+v", c)
	}
	g := newNode(t, DeviceConfig{}, "udp4", addr+":0")
	mustPost(t, g.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{g.mr.SGE(0, 100)}}))
	mustPost(t, f.qp.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, SGL: []SGE{f.mr.SGE(0, 10)}, AH: f.ah(g, g.qp)}))
	if wc := waitWC(t, g.cq, 1)[0]; wc.Status != Success || wc.Len != 10 {
		t.Fatalf("a Send over the fallback socket: %+v", wc)
	}
	t.Logf("fell back: %s", c.Detail)
}
