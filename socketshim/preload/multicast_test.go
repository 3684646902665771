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
// port (reuseaddr); socat sends a message to the group. Both receivers
// write whole copies of it and nothing else, and their engines count
// every byte they wrote: the datagrams went through udiwarp, not around
// it.
func TestSocatMulticast(t *testing.T) {
	need(t, "socat")
	dir := built(t)
	ns := netnstest.New(t, "link set lo up multicast on", "route add 224.0.0.0/4 dev lo")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const group = "239.7.7.9"
	port := 49000 + int(netnstest.Seq())
	var recvs []*proc
	for range 2 {
		recvs = append(recvs, receiver(t, ctx, dir, ns, fmt.Sprintf("UDP4-RECV:%d,ip-add-membership=%s:127.0.0.1,reuseaddr", port, group)))
	}
	msg := []byte(strings.Repeat("udiwarp multicast through an unmodified program\n", 20))
	sendUntilReceived(t, ctx, dir, ns, msg, fmt.Sprintf("UDP4-DATAGRAM:%s:%d,ip-multicast-loop=1", group, port), recvs)
}

// TestSocatMulticastNoLoop: IP_MULTICAST_LOOP and the other
// IP_MULTICAST_* options an owned socket takes go to the kernel socket
// the engine sends on, so the kernel honours them for the engine's
// datagrams: with ip-multicast-loop=0, a preloaded socat's group
// datagrams (sent through its engine out of a veth chosen with
// ip-multicast-if) do not come back to the receivers on the same host,
// while the same message with loop on does, as on the kernel path. The
// receivers are shown ready first, and the looped message sent after the
// unlooped ones comes through after them (loopback delivers in order):
// a receiver holding only copies of it never got an unlooped one.
func TestSocatMulticastNoLoop(t *testing.T) {
	need(t, "socat")
	dir := built(t)
	// The group is routed out of a veth (on loopback the datagram itself
	// comes back in, looped or not); the receivers join on its address,
	// so only the host's own loop copy can reach them.
	ns := netnstest.New(t, "link set lo up", "link add mc0 type veth peer name mc1", "link set mc0 up", "link set mc1 up",
		"addr add 10.9.3.1/24 dev mc0", "route add 224.0.0.0/4 dev mc0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const group = "239.7.7.10"
	port := 49200 + int(netnstest.Seq())
	var recvs []*proc
	for range 2 {
		recvs = append(recvs, receiver(t, ctx, dir, ns, fmt.Sprintf("UDP4-RECV:%d,ip-add-membership=%s:10.9.3.1,reuseaddr", port, group)))
	}
	looped := []byte("looped back\n")
	dst := fmt.Sprintf("UDP4-DATAGRAM:%s:%d,ip-multicast-if=10.9.3.1,ip-multicast-ttl=1", group, port)
	sendUntilReceived(t, ctx, dir, ns, looped, dst+",ip-multicast-loop=1", recvs) // both ready; stops them
	recvs = recvs[:0]
	for range 2 {
		recvs = append(recvs, receiver(t, ctx, dir, ns, fmt.Sprintf("UDP4-RECV:%d,ip-add-membership=%s:10.9.3.1,reuseaddr", port, group)))
	}
	// Ready again: each has a looped copy. Then three unlooped sends
	// through the engine, then looped ones until each has one more.
	file := filepath.Join(t.TempDir(), "msg")
	send := func(msg []byte, loop int) *proc {
		if err := os.WriteFile(file, msg, 0o644); err != nil {
			t.Fatal(err)
		}
		p := startIn(t, ctx, dir, ns, "socat", "-u", "OPEN:"+file, fmt.Sprintf("%s,ip-multicast-loop=%d", dst, loop))
		p.wait(t)
		return p
	}
	have := func(n int) bool {
		for _, r := range recvs {
			if got, _ := os.ReadFile(r.file); len(got) < n*len(looped) {
				return false
			}
		}
		return true
	}
	for end := time.Now().Add(20 * time.Second); !have(1); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the receivers never got a looped datagram")
		}
		send(looped, 1)
	}
	for range 3 {
		if ss := send([]byte("NOT LOOPED\n"), 0).readStats(t); ss.Sent != 1 {
			t.Fatalf("the unlooped datagram did not go through the engine: %+v", ss)
		}
	}
	before := make([]int, len(recvs))
	for i, r := range recvs {
		got, _ := os.ReadFile(r.file)
		before[i] = len(got)
	}
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		send(looped, 1)
		grown := true
		for i, r := range recvs {
			if got, _ := os.ReadFile(r.file); len(got) <= before[i] {
				grown = false
			}
		}
		if grown {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the looped datagram after the unlooped ones never arrived")
		}
	}
	for i, r := range recvs {
		r.stop(syscall.SIGINT)
		got, _ := os.ReadFile(r.file)
		if bytes.Contains(got, []byte("NOT LOOPED")) || len(got)%len(looped) != 0 || !bytes.Equal(got, bytes.Repeat(looped, len(got)/len(looped))) {
			t.Errorf("receiver %d got %q: an unlooped datagram came back, or a copy was cut", i, got)
		}
	}
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
	rcv := receiver(t, ctx, dir, ns, fmt.Sprintf("UDP4-RECV:%d", port))
	sendUntilReceived(t, ctx, dir, ns, []byte("to every host on the subnet\n"), fmt.Sprintf("UDP4-DATAGRAM:10.9.1.255:%d,broadcast", port), []*proc{rcv})
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

// receiver runs socat, preloaded in ns, writing what address src
// receives to a file of its own (proc.file).
func receiver(t *testing.T, ctx context.Context, dir, ns, src string) *proc {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	p := startIn(t, ctx, dir, ns, "socat", "-u", src, "OPEN:"+out+",creat,trunc")
	p.file = out
	return p
}

// sendUntilReceived has socat send msg to dst (one datagram per run,
// preloaded, in ns) until every receiver has written it, then checks
// what they wrote and what their engines counted. It sends again rather
// than waiting for the receivers to be ready: nothing observable from
// outside says when a receiver's engine has its socket, and a datagram
// sent before it is lost, as on any UDP socket. Each receiver must hold
// whole copies of msg and nothing else, and its engine must have
// received (at least) every byte it wrote.
func sendUntilReceived(t *testing.T, ctx context.Context, dir, ns string, msg []byte, dst string, recvs []*proc) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "msg")
	if err := os.WriteFile(file, msg, 0o644); err != nil {
		t.Fatal(err)
	}
	var snd *proc
	for end := time.Now().Add(20 * time.Second); ; {
		all := true
		for _, r := range recvs {
			if got, _ := os.ReadFile(r.file); len(got) < len(msg) {
				all = false
			}
		}
		if all {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the receivers never got the datagram:\n%s", recvs[0].out.String())
		}
		snd = startIn(t, ctx, dir, ns, "socat", "-u", "OPEN:"+file, dst)
		snd.wait(t)
		time.Sleep(50 * time.Millisecond) // between attempts only: nothing is asserted on it
	}
	ss := snd.readStats(t)
	if ss.Sent != 1 || ss.SentBytes != uint64(len(msg)) {
		t.Errorf("the sender's engine sent %d datagrams, %d bytes; want 1, %d", ss.Sent, ss.SentBytes, len(msg))
	}
	for i, r := range recvs {
		r.stop(syscall.SIGINT)
		got, _ := os.ReadFile(r.file)
		if len(got) == 0 || len(got)%len(msg) != 0 || !bytes.Equal(got, bytes.Repeat(msg, len(got)/len(msg))) {
			t.Errorf("receiver %d wrote %d bytes that are not whole copies of the %d-byte message", i, len(got), len(msg))
		}
		rs := r.readStats(t)
		t.Logf("receiver %d engine %+v; last sender engine %+v", i, rs, ss)
		// At least what it wrote: a copy sent last may reach the engine
		// as the receiver is stopped, before socat writes it.
		if rs.ReceivedBytes < uint64(len(got)) || rs.Received < uint64(len(got)/len(msg)) || rs.DeviceRx < rs.Received {
			t.Errorf("receiver %d wrote %d bytes; its engine received %d datagrams, %d bytes (device %d): the data went around it",
				i, len(got), rs.Received, rs.ReceivedBytes, rs.DeviceRx)
		}
	}
}
