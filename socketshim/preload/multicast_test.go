package preload_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// TestSocatMulticast: unmodified socat over the preload library, in a
// network namespace whose loopback carries multicast. Two receivers join
// a group with IP_ADD_MEMBERSHIP (socat's ip-add-membership) on the same
// port (reuseaddr); a third socat sends a file to the group. Both
// receivers write exactly the file, and their engines count what they
// received: the datagrams went through udiwarp, not around it.
func TestSocatMulticast(t *testing.T) {
	need(t, "socat")
	dir := built(t)
	ns := netnstest.New(t, "link set lo up multicast on", "route add 224.0.0.0/4 dev lo")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const group = "239.7.7.9"
	port := 49000 + int(netnstest.Seq())
	work := t.TempDir()
	in := func(name string, args ...string) *proc { return startIn(t, ctx, dir, ns, name, args...) }
	var recvs []*proc
	var outs []string
	for i := range 2 {
		out := filepath.Join(work, fmt.Sprintf("recv%d", i))
		outs = append(outs, out)
		recvs = append(recvs, in("socat", "-u",
			fmt.Sprintf("UDP4-RECV:%d,ip-add-membership=%s:127.0.0.1,reuseaddr", port, group), "OPEN:"+out+",creat,trunc"))
	}
	// Wait until both have joined: the group in their namespace's
	// /proc/PID/net/igmp (239.7.7.9 is 090707EF there).
	for _, r := range recvs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/igmp", r.cmd.Process.Pid))
			if bytes.Contains(b, []byte("090707EF")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("socat never joined %s:\n%s", group, r.out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond) // both joined: the second too
	msg := []byte(strings.Repeat("udiwarp multicast through an unmodified program\n", 20))
	file := filepath.Join(work, "msg")
	if err := os.WriteFile(file, msg, 0o644); err != nil {
		t.Fatal(err)
	}
	snd := in("socat", "-u", "OPEN:"+file, fmt.Sprintf("UDP4-DATAGRAM:%s:%d,ip-multicast-loop=1", group, port))
	snd.wait(t)
	for i, out := range outs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, _ := os.ReadFile(out)
			if bytes.Equal(got, msg) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("receiver %d wrote %d bytes, want the %d sent\n%s", i, len(got), len(msg), recvs[i].out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ss := snd.readStats(t)
	for i, r := range recvs {
		r.stop(syscall.SIGINT)
		rs := r.readStats(t)
		t.Logf("receiver %d engine %+v; sender engine %+v", i, rs, ss)
		if rs.Received < 1 || rs.ReceivedBytes < uint64(len(msg)) || rs.DeviceRx < rs.Received {
			t.Errorf("receiver %d's engine received %d datagrams, %d bytes (device %d): the group's data went around it", i, rs.Received, rs.ReceivedBytes, rs.DeviceRx)
		}
	}
	if ss.Sent < 1 || ss.SentBytes < uint64(len(msg)) {
		t.Errorf("the sender's engine sent %d datagrams, %d bytes", ss.Sent, ss.SentBytes)
	}
}

// startIn runs a program preloaded inside network namespace ns.
func startIn(t *testing.T, ctx context.Context, dir, ns, name string, args ...string) *proc {
	t.Helper()
	stats := filepath.Join(t.TempDir(), "stats.json")
	p := start(t, ctx, dir, false, "ip", append([]string{"netns", "exec", ns, "env",
		"LD_PRELOAD=" + filepath.Join(dir, "libudiwarp_preload.so"), "UDIWARP_ENGINE=" + filepath.Join(dir, "libudiwarp_engine.so"),
		"UDIWARP_PRELOAD_STATS=" + stats, name}, args...)...)
	p.stats = stats
	return p
}

// TestSocatBroadcast: unmodified socat, preloaded, sends to a subnet's
// broadcast address with SO_BROADCAST (socat's broadcast option, set on
// the kernel socket the engine sends on), and a preloaded socat bound to
// the port receives it through its engine (a veth pair in a namespace).
func TestSocatBroadcast(t *testing.T) {
	need(t, "socat")
	dir := built(t)
	ns := netnstest.New(t, "link set lo up", "link add bc0 type veth peer name bc1", "link set bc0 up", "link set bc1 up",
		"addr add 10.9.1.1/24 brd 10.9.1.255 dev bc0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := 49500 + int(netnstest.Seq())
	out := filepath.Join(t.TempDir(), "recv")
	rcv := startIn(t, ctx, dir, ns, "socat", "-u", fmt.Sprintf("UDP4-RECV:%d", port), "OPEN:"+out+",creat,trunc")
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/udp", rcv.cmd.Process.Pid))
		if bytes.Contains(b, []byte(fmt.Sprintf(":%04X ", port))) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socat never bound port %d:\n%s", port, rcv.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	msg := []byte("to every host on the subnet\n")
	file := filepath.Join(t.TempDir(), "msg")
	if err := os.WriteFile(file, msg, 0o644); err != nil {
		t.Fatal(err)
	}
	snd := startIn(t, ctx, dir, ns, "socat", "-u", "OPEN:"+file, fmt.Sprintf("UDP4-DATAGRAM:10.9.1.255:%d,broadcast", port))
	snd.wait(t)
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, _ := os.ReadFile(out)
		if bytes.Equal(got, msg) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver wrote %q\n%s", got, rcv.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	rcv.stop(syscall.SIGINT)
	rs, ss := rcv.readStats(t), snd.readStats(t)
	if rs.Received < 1 || rs.ReceivedBytes < uint64(len(msg)) || ss.Sent < 1 {
		t.Errorf("the engines carried nothing: receiver %+v, sender %+v", rs, ss)
	}
}
