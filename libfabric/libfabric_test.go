package libfabric_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	buildSkip string
)

// built compiles the provider, its engine and the test programs once per
// test binary, or skips the test saying what is missing.
func built(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if _, err := exec.LookPath("gcc"); err != nil {
			buildSkip = "gcc is not installed: the provider's front is C (apt-get install gcc)"
			return
		}
		if _, err := os.Stat("/usr/include/rdma/providers/fi_prov.h"); err != nil {
			buildSkip = "libfabric's headers are not installed (apt-get install libfabric-dev)"
			return
		}
		dir, err := os.MkdirTemp("", "udiwarp-libfabric-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		prov := filepath.Join(dir, "prov")
		if err := os.Mkdir(prov, 0o755); err != nil {
			buildErr = err
			return
		}
		steps := [][]string{
			{"gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden", "-o", filepath.Join(prov, "libudiwarp-fi.so"), "c/udiwarp_fi.c", "-ldl", "-lpthread"},
			{"go", "build", "-buildmode=c-shared", "-o", filepath.Join(prov, "libudiwarp_fi_engine.so"), "./engine"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "badinput"), "testdata/badinput.c", "-lfabric"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "mcast"), "testdata/mcast.c", "-lfabric"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "rdm"), "testdata/rdm.c", "-lfabric"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "msg"), "testdata/msg.c", "-lfabric"},
			{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "rma"), "testdata/rma.c", "-lfabric"},
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

// need skips the test unless every program is installed.
func need(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (Debian: apt-get install libfabric-bin)", p)
		}
	}
}

// native hides libfabric's utility providers, which list their layers
// over ours ("udiwarp;ofi_rxd") ahead of our own entries: a program that
// takes the first udiwarp entry then gets the native endpoint.
const native = "FI_PROVIDER=^ofi_rxd,ofi_rxm,ofi_mrail"

// fabric runs a libfabric program with the provider on its path (in
// namespace ns when not empty), killed with the test process. An
// argument of the form NAME=VALUE before the program is an environment
// variable.
func fabric(ctx context.Context, dir, ns string, args ...string) *exec.Cmd {
	env := append(os.Environ(), "FI_PROVIDER_PATH="+filepath.Join(dir, "prov"))
	for len(args) > 0 && strings.Contains(args[0], "=") {
		env = append(env, args[0])
		args = args[1:]
	}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// TestInfo: fi_info lists the provider's RDM and DGRAM endpoints with
// their capabilities, at each address of the interfaces that are up,
// loopback only when asked for by name (-d lo) or when it is the only
// one up (a namespace of its own); and libfabric's reliability layer over
// the DGRAM endpoint as another RDM endpoint.
func TestInfo(t *testing.T) {
	dir := built(t)
	need(t, "fi_info")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info := func(ns string, args ...string) string {
		t.Helper()
		out, err := fabric(ctx, dir, ns, append([]string{"fi_info"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("fi_info %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	s := info("", "-p", "udiwarp", "-d", "lo", "-v")
	for _, want := range []string{"prov_name: udiwarp", "type: FI_EP_DGRAM", "type: FI_EP_RDM", "FI_MSG", "FI_TAGGED", "FI_DIRECTED_RECV",
		"FI_SOURCE", "FI_MULTICAST", "name: lo", "FI_SOCKADDR_IN", "max_msg_size: 65485", "max_msg_size: 8388608",
		"protocol: FI_PROTO_IWARP_RDM", "data_progress: FI_PROGRESS_MANUAL", "cq_data_size: 8"} {
		if !strings.Contains(s, want) {
			t.Errorf("fi_info -p udiwarp -d lo -v lacks %q:\n%s", want, s)
		}
	}
	// RMA and atomics, with provider keys (fi_info's hints take them).
	for _, want := range []string{"FI_RMA", "FI_ATOMIC", "FI_REMOTE_WRITE", "mr_mode: [ FI_MR_PROV_KEY ]", "mr_key_size: 4", "rma_iov_limit: 1"} {
		if !strings.Contains(s, want) {
			t.Errorf("fi_info -p udiwarp -d lo -v lacks %q", want)
		}
	}
	// MSG endpoints: RC, RMA without atomics (ofi_rxm carries its own).
	m := info("", "-p", "udiwarp", "-d", "lo", "-t", "FI_EP_MSG", "-v")
	for _, want := range []string{"type: FI_EP_MSG", "protocol: FI_PROTO_IWARP", "FI_RMA", "FI_REMOTE_READ", "inject_size: 16384"} {
		if !strings.Contains(m, want) {
			t.Errorf("fi_info -p udiwarp -t FI_EP_MSG lacks %q:\n%s", want, m)
		}
	}
	if strings.Contains(m, "FI_ATOMIC") || strings.Contains(m, "FI_EP_RDM") {
		t.Errorf("fi_info -p udiwarp -t FI_EP_MSG lists atomics or RDM:\n%s", m)
	}
	for _, p := range []string{"udiwarp;ofi_rxd", "udiwarp;ofi_rxm"} {
		if s := info("", "-p", p); !strings.Contains(s, "type: FI_EP_RDM") {
			t.Errorf("fi_info -p %q:\n%s", p, s)
		}
	}
	// A host with another interface up: loopback is not listed.
	n := netnstest.New(t, "link set lo up", "link add uid0 type veth peer name uid1", "addr add 10.80.0.1/24 dev uid0",
		"link set uid0 up", "link set uid1 up")
	if s := info(n, "-p", "udiwarp"); !strings.Contains(s, "domain: uid0") || strings.Contains(s, "domain: lo") {
		t.Errorf("a namespace with uid0 up lists:\n%s", s)
	}
	// Loopback alone: listed.
	if s := info(netnstest.New(t, "link set lo up"), "-p", "udiwarp"); !strings.Contains(s, "domain: lo") {
		t.Errorf("a namespace with only loopback up lists:\n%s", s)
	}
}

var port atomic.Int32

func init() { port.Store(int32(47000 + os.Getpid()%1000)) }

// pingpong runs fi_pingpong's server (in ns server, or here) and client
// (in ns client, to host) with args, checking every byte (-c), and
// returns the client's rows by size.
func pingpong(t *testing.T, dir, serverNS, clientNS, host string, args ...string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := fmt.Sprint(port.Add(1))
	var env []string
	for len(args) > 0 && strings.Contains(args[0], "=") {
		env = append(env, args[0])
		args = args[1:]
	}
	srvArgs := append(append(slices.Clone(env), "fi_pingpong", "-c", "-B", p), args...)
	srv := fabric(ctx, dir, serverNS, srvArgs...)
	var srvOut bytes.Buffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Wait()
	// The client retries its control connection until the server listens.
	var out []byte
	var err error
	for range 50 {
		cliArgs := append(append(append(slices.Clone(env), "fi_pingpong", "-c", "-P", p), args...), host)
		out, err = fabric(ctx, dir, clientNS, cliArgs...).CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte("connect")) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the server is not listening yet
	}
	if err != nil {
		t.Fatalf("fi_pingpong %v: %v\n%s\nserver:\n%s", args, err, out, srvOut.String())
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("fi_pingpong server %v: %v\n%s", args, err, srvOut.String())
	}
	rows := map[string]string{}
	row := regexp.MustCompile(`(?m)^(\d+[km]?)\s+(\S+)\s+=(\S+)\s.*$`)
	for _, m := range row.FindAllStringSubmatch(string(out), -1) {
		if m[2] != m[3] {
			t.Errorf("size %s: %s sent, %s acknowledged", m[1], m[2], m[3])
		}
		rows[m[1]] = m[0]
	}
	t.Logf("fi_pingpong %v:\n%s", args, out)
	return rows
}

// TestPingpong: fi_pingpong runs unmodified over the provider at every
// size it takes, checking every byte it receives: DGRAM endpoints (64 B
// to 4 KiB: fi_pingpong's next size, 64 KiB, is over one datagram); the
// native RDM endpoints, untagged and tagged (64 B to 1 MiB: eager copies
// to 64 KiB, the caller's registered buffer above); and RDM endpoints of
// libfabric's reliability layer over the DGRAM ones (to 1 MiB). The
// native runs hide libfabric's utility providers (native): the only RDM
// endpoint left is ours. (fi_pingpong's -v would say which ran, but it
// also prints in its polling loops, gigabytes a run.)
func TestPingpong(t *testing.T) {
	dir := built(t)
	need(t, "fi_pingpong")
	for _, tc := range []struct {
		name  string
		args  []string
		sizes []string
	}{
		{"dgram", []string{"-p", "udiwarp", "-e", "dgram", "-I", "100"}, []string{"64", "256", "1k", "4k"}},
		{"rdm", []string{native, "-p", "udiwarp", "-e", "rdm", "-I", "20"}, []string{"64", "256", "1k", "4k", "64k", "1m"}},
		{"rdm-tagged", []string{native, "-p", "udiwarp", "-e", "rdm", "-m", "tagged", "-I", "20"}, []string{"64", "256", "1k", "4k", "64k", "1m"}},
		{"rxd", []string{"-p", "udiwarp;ofi_rxd", "-e", "rdm", "-I", "20"}, []string{"64", "256", "1k", "4k", "64k", "1m"}},
		// MSG endpoints: RC over TCP and MPA, connected with fi_connect
		// and fi_accept; and ofi_rxm's RDM over them (its rendezvous,
		// over 128 KiB, is an RDMA Read on the connection).
		{"msg", []string{"-p", "udiwarp", "-e", "msg", "-I", "20"}, []string{"64", "256", "1k", "4k", "64k", "1m"}},
		{"rxm", []string{"-p", "udiwarp;ofi_rxm", "-e", "rdm", "-I", "20"}, []string{"64", "256", "1k", "4k", "64k", "1m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := pingpong(t, dir, "", "", "127.0.0.1", tc.args...)
			for _, s := range tc.sizes {
				if rows[s] == "" {
					t.Errorf("no row for %s bytes: %v", s, rows)
				}
			}
		})
	}
}

// TestPingpongNamespaces: the server and the client are two hosts, two
// network namespaces joined by a veth pair: each endpoint binds its
// interface's address, which fi_getname returns and the other end's AV
// takes.
func TestPingpongNamespaces(t *testing.T) {
	dir := built(t)
	need(t, "fi_pingpong")
	a := netnstest.New(t, "link set lo up")
	n := netnstest.Seq()
	va, vb := fmt.Sprintf("ufa%d", n), fmt.Sprintf("ufb%d", n)
	b := netnstest.New(t, "link set lo up",
		fmt.Sprintf("!ip link add %s netns NS type veth peer name %s netns %s", vb, va, a),
		fmt.Sprintf("addr add 10.77.%d.2/24 dev %s", n%250, vb), fmt.Sprintf("link set %s up", vb),
		fmt.Sprintf("!ip -n %s addr add 10.77.%d.1/24 dev %s", a, n%250, va), fmt.Sprintf("!ip -n %s link set %s up", a, va))
	for _, ep := range []string{"dgram", "msg"} {
		rows := pingpong(t, dir, a, b, fmt.Sprintf("10.77.%d.1", n%250), "-p", "udiwarp", "-e", ep, "-I", "100")
		if rows["1k"] == "" {
			t.Errorf("%s: no 1 KiB row: %v", ep, rows)
		}
	}
}

// TestBadInput: what a program gets wrong comes back as the libfabric
// error a user expects, and the endpoint keeps working (testdata/
// badinput.c: a send to an address not in the AV, over the largest
// message, with a NULL buffer; a receive too small for what arrives,
// FI_ETRUNC with the bytes cut; a send before fi_enable; then a message
// that goes through).
func TestBadInput(t *testing.T) {
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := fabric(ctx, dir, "", filepath.Join(dir, "badinput")).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("badinput: %v", err)
	}
	if !bytes.Contains(out, []byte("ok: all checks passed")) {
		t.Fatal("badinput did not finish its checks")
	}
}

// TestMulticast: fi_join on DGRAM endpoints (testdata/mcast.c), in a
// namespace whose loopback routes multicast: two members receive what a
// third endpoint sends to the group, named by FI_SOURCE, and one that
// left receives no more.
func TestMulticast(t *testing.T) {
	dir := built(t)
	ns := netnstest.New(t, "link set lo up multicast on", "route add 224.0.0.0/4 dev lo")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := fabric(ctx, dir, ns, filepath.Join(dir, "mcast"), fmt.Sprint(port.Add(1))).CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !bytes.Contains(out, []byte("ok: multicast")) {
		t.Fatalf("mcast: %v", err)
	}
}

// TestMSG: what the MSG endpoints promise (testdata/msg.c): connection
// data both ways, FI_CONNREQ/FI_CONNECTED/FI_SHUTDOWN, fi_reject's data
// in the initiator's error entry, FI_ECONNREFUSED, sends before the
// connection refused, messages to 1 MiB and RDMA Write and Read with
// every byte checked, an endpoint's unread events gone with it, and a
// listener that strangers (bytes that are no MPA Request, more idle
// connections than it keeps) do not stop.
func TestMSG(t *testing.T) {
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := fabric(ctx, dir, "", filepath.Join(dir, "msg")).CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !bytes.Contains(out, []byte("ok: msg")) {
		t.Fatalf("msg: %v", err)
	}
}

// TestRDM: what the native RDM endpoint promises, from libfabric's side
// (testdata/rdm.c): tag matching of unexpected and posted receives under
// ignore bits, untagged and tagged kept apart, FI_DIRECTED_RECV,
// FI_REMOTE_CQ_DATA, FI_SOURCE, FI_ETRUNC, fi_cancel, bad addresses and
// sizes refused, and more unexpected messages than receive slots: the
// sender held back, nothing lost, every message in order.
func TestRDM(t *testing.T) {
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := fabric(ctx, dir, "", native, filepath.Join(dir, "rdm")).CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !bytes.Contains(out, []byte("ok: rdm")) {
		t.Fatalf("rdm: %v", err)
	}
}

// TestRMA: RMA and atomics on the native RDM endpoint, from libfabric's
// side, between two processes (testdata/rma.c): what fi_getinfo offers
// for each mr_mode; fi_write and fi_read back, 64 B and 1 MiB, every
// byte compared; fi_inject_write; fi_writedata and fi_inject_writedata,
// their data in the target's completions; FetchAdd and CmpSwap as
// fi_fetch_atomic, fi_atomic and fi_compare_atomic (FI_SUM,
// FI_ATOMIC_READ, FI_CSWAP, 64-bit words), checked at both ends;
// fi_query_atomic and the valid calls; a wrong key, an offset past the
// region and a read-only region as error completions (FI_EACCES), bad
// arguments refused at the call, and operations that work after them.
func TestRMA(t *testing.T) {
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := fabric(ctx, dir, "", native, filepath.Join(dir, "rma")).CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !bytes.Contains(out, []byte("ok: rma\n")) || !bytes.Contains(out, []byte("ok: rma target")) {
		t.Fatalf("rma: %v", err)
	}
}

// mpirun runs Open MPI's mpirun (in namespace ns when not empty) with the
// ofi MTL over the native udiwarp RDM endpoint, verbose enough to name
// the provider it chose, and returns its output.
func mpirun(t *testing.T, dir, ns string, args ...string) string {
	t.Helper()
	return mpirunOver(t, dir, ns, "udiwarp", native, args...)
}

// mpirunOver runs mpirun as mpirun does, over provider prov (its
// libfabric name, as mtl_ofi_verbose prints it) with hide, the
// FI_PROVIDER setting that leaves it the first match.
func mpirunOver(t *testing.T, dir, ns, prov, hide string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	full := append([]string{"mpirun", "--allow-run-as-root", "--oversubscribe",
		"--mca", "pml", "cm", "--mca", "mtl", "ofi",
		"--mca", "mtl_ofi_provider_include", prov, "--mca", "opal_common_ofi_provider_include", prov,
		"--mca", "mtl_ofi_verbose", "10",
		"-x", "FI_PROVIDER_PATH=" + filepath.Join(dir, "prov"), "-x", hide}, args...)
	out, err := fabric(ctx, dir, ns, full...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", full, err, out)
	}
	if !strings.Contains(string(out), "mtl:ofi:prov: "+prov+"\n") {
		t.Fatalf("Open MPI did not run over %s:\n%s", prov, out)
	}
	return string(out)
}

// netpipe runs NPopenmpi's ping-pong from 1 byte to 1 MiB between two
// ranks through run (an mpirun) and checks that it reached 1 MiB.
func netpipe(t *testing.T, run func(args ...string)) {
	t.Helper()
	np := filepath.Join(t.TempDir(), "np.out")
	run("-np", "2", "NPopenmpi", "-u", "1048576", "-p", "0", "-n", "20", "-o", np)
	b, err := os.ReadFile(np)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if last := strings.Fields(lines[len(lines)-1]); len(lines) < 20 || len(last) < 3 || last[0] != "1048576" {
		t.Fatalf("NetPIPE's output ends %q after %d sizes:\n%s", lines[len(lines)-1], len(lines), b)
	}
}

// needMPI skips the test unless Open MPI, NetPIPE and mpi4py are here.
func needMPI(t *testing.T) {
	t.Helper()
	for _, p := range []string{"mpirun", "NPopenmpi"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (Debian: apt-get install openmpi-bin netpipe-openmpi python3-mpi4py)", p)
		}
	}
	if exec.Command("/usr/bin/python3", "-c", "import mpi4py").Run() != nil {
		t.Skip("mpi4py is not installed for /usr/bin/python3 (Debian: apt-get install python3-mpi4py)")
	}
}

// TestOpenMPI: unmodified MPI programs over the native RDM endpoint, with
// Open MPI's cm PML and ofi MTL (which chose udiwarp, its verbose output
// says): NetPIPE's ping-pong from 1 byte to 1 MiB between two ranks, and
// a python3-mpi4py program (point-to-point objects and buffers to 4 MiB,
// a probe, collectives, reductions checked for their results) with two
// ranks. (Four ranks run across two namespaces, TestOpenMPINamespaces;
// four on this host's two cores, every rank spinning, hung once in CI
// beside the other packages' tests, unexplained: see the closing note.)
func TestOpenMPI(t *testing.T) {
	dir := built(t)
	needMPI(t)
	t.Run("netpipe", func(t *testing.T) {
		netpipe(t, func(args ...string) { mpirun(t, dir, "", args...) })
	})
	t.Run("mpi4py", func(t *testing.T) {
		out := mpirun(t, dir, "", "-np", "2", "/usr/bin/python3", "testdata/mpi_check.py")
		if !strings.Contains(out, "ok: 2 ranks") {
			t.Fatalf("mpi_check.py:\n%s", out)
		}
	})
	// The connection-oriented side of seed 003's comparison: ofi_rxm's
	// RDM over the MSG endpoints (RC), one connection per peer.
	t.Run("rxm", func(t *testing.T) {
		rxm := "FI_PROVIDER=^ofi_rxd,ofi_mrail"
		netpipe(t, func(args ...string) { mpirunOver(t, dir, "", "udiwarp;ofi_rxm", rxm, args...) })
		out := mpirunOver(t, dir, "", "udiwarp;ofi_rxm", rxm, "-np", "2", "/usr/bin/python3", "testdata/mpi_check.py")
		if !strings.Contains(out, "ok: 2 ranks") {
			t.Fatalf("mpi_check.py:\n%s", out)
		}
	})
}

// TestOpenMPINamespaces: four ranks on two hosts, two network namespaces
// joined by a veth pair, two ranks each: mpirun in the first starts its
// daemons through testdata/nsrsh.sh (the namespaces' ssh), and each
// rank's endpoint binds its namespace's veth address, the one entry
// fi_getinfo lists there (loopback is left out where another interface
// is up: Open MPI spreads ranks over a provider's entries, and one bound
// to 127.0.0.1 could not be reached from the other host).
func TestOpenMPINamespaces(t *testing.T) {
	dir := built(t)
	needMPI(t)
	a := netnstest.New(t, "link set lo up")
	n := netnstest.Seq()
	va, vb := fmt.Sprintf("uma%d", n), fmt.Sprintf("umb%d", n)
	b := netnstest.New(t, "link set lo up",
		fmt.Sprintf("!ip link add %s netns NS type veth peer name %s netns %s", vb, va, a),
		fmt.Sprintf("addr add 10.79.%d.2/24 dev %s", n%250, vb), fmt.Sprintf("link set %s up", vb),
		fmt.Sprintf("!ip -n %s addr add 10.79.%d.1/24 dev %s", a, n%250, va), fmt.Sprintf("!ip -n %s link set %s up", a, va))
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte(a+" slots=2\n"+b+" slots=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	agent, err := filepath.Abs("testdata/nsrsh.sh")
	if err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("testdata/mpi_check.py")
	if err != nil {
		t.Fatal(err)
	}
	// rtc ^hwloc: the daemons would share mpirun's hardware topology through
	// memory mapped at an address of mpirun's, which a daemon's own layout
	// may already hold (hwloc_shmem_topology_write crashed orted in a CI
	// run); each daemon reads its own instead.
	out := mpirun(t, dir, a, "--hostfile", hosts, "-np", "4", "--mca", "plm_rsh_agent", agent, "--mca", "rtc", "^hwloc",
		"/usr/bin/python3", script)
	if !strings.Contains(out, "ok: 4 ranks") {
		t.Fatalf("mpi_check.py:\n%s", out)
	}
}
