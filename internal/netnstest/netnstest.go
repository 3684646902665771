// Package netnstest gives tests hosts of their own: a network namespace
// per test, set up with ip commands and removed afterwards, and a way to
// open sockets inside it. Tests that need one skip, saying why, where
// namespaces cannot be made (not root, no iproute2); where they can, a
// setup command that fails fails the test.
package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

var seq atomic.Uint32

// Seq is the number of the namespace New made last in this process: a
// value to derive ports and interface names from.
func Seq() uint32 { return seq.Load() }

// New creates a network namespace for the test, runs the setup commands
// in it ("ip" commands, run as `ip -n NS ...`; "!" prefixes a command run
// verbatim with NS substituted), and removes it afterwards. The test is
// skipped where namespaces cannot be made (not root, no ip); as root with
// ip, a setup that fails fails the test.
func New(t testing.TB, setup ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network namespaces need iproute2's ip")
	}
	name := fmt.Sprintf("udiwarp-test-%d-%d", os.Getpid(), seq.Add(1))
	// Root, with ip: a namespace that cannot be made, or a setup command
	// that fails (a typo in a test's own script included), fails the test;
	// a skip here would pass CI without the test having run.
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	for _, c := range setup {
		var cmd *exec.Cmd
		if rest, ok := strings.CutPrefix(c, "!"); ok {
			f := strings.Fields(strings.ReplaceAll(rest, "NS", name))
			cmd = exec.Command(f[0], f[1:]...)
		} else {
			cmd = exec.Command("ip", append([]string{"-n", name}, strings.Fields(c)...)...)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("setting up the namespace: %v: %v: %s", cmd.Args, err, out)
		}
	}
	return name
}

// In runs f on an OS thread inside namespace ns; sockets f opens stay in
// it after f returns.
func In(t testing.TB, ns string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(orig)
	fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			panic(err) // the thread is in the wrong namespace; it must not be reused
		}
	}()
	f()
}

// UDPBound reports whether a UDP socket (IPv4 or IPv6) is bound to port
// in the network namespace of process pid (0: this process), by
// /proc/PID/net/udp and udp6, whose local_address column is ADDR:PORT in
// hex.
func UDPBound(pid, port int) bool { return inTable(pid, port, "udp", "") }

// TCPListening reports whether a TCP socket (IPv4 or IPv6) listens on
// port in the network namespace of process pid (0: this process), by
// /proc/PID/net/tcp and tcp6 (state 0A is LISTEN).
func TCPListening(pid, port int) bool { return inTable(pid, port, "tcp", "0A") }

// inTable reports whether /proc/PID/net/proto or proto6 has a socket at
// local port, in state (hex) if state is not empty.
func inTable(pid, port int, proto, state string) bool {
	dir := "/proc/self/net"
	if pid != 0 {
		dir = fmt.Sprintf("/proc/%d/net", pid)
	}
	suffix := fmt.Sprintf(":%04X", port)
	for _, f := range []string{proto, proto + "6"} {
		b, err := os.ReadFile(dir + "/" + f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			if fs := strings.Fields(l); len(fs) > 3 && strings.HasSuffix(fs[1], suffix) && (state == "" || fs[3] == state) {
				return true
			}
		}
	}
	return false
}

// TxChecksumOff is ethtool -K ifname tx off, for the namespace the
// calling thread is in: a veth hands its peer the kernel's datagrams
// with their UDP checksum not yet filled in (CHECKSUM_PARTIAL), which an
// AF_XDP reader that checks checksums (llp's) must refuse; with it off,
// the kernel computes them before they leave.
func TxChecksumOff(ifname string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const ethtoolSTxCsum = 0x17
	val := struct{ cmd, data uint32 }{ethtoolSTxCsum, 0}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&val)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return fmt.Errorf("ETHTOOL_STXCSUM %s: %w", ifname, e)
	}
	return nil
}
