package preload_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rdEnv runs a preloaded program over RD QPs, with env added.
func rdEnv(env ...string) []string { return append([]string{"UDIWARP_PRELOAD_QP=rd"}, env...) }

// rdReceiver runs socat, preloaded over RD, writing what it receives on
// UDP port to a file of its own (proc.file).
func rdReceiver(t *testing.T, ctx context.Context, dir string, port int) *proc {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	p := startEnv(t, ctx, dir, true, rdEnv(), "socat", "-u", fmt.Sprintf("UDP-RECV:%d", port), "OPEN:"+out+",creat,trunc")
	p.file = out
	waitUDP(t, port, p)
	return p
}

// fileWhen reads file until it holds want, for at most 20 s, and returns
// what it last held.
func fileWhen(file, want string) string {
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(file)
		if string(b) == want || time.Now().After(deadline) {
			return string(b)
		}
	}
}

// An RD datagram sent just before its sender shuts down and exits
// reaches its peer: the sender's shutdown and exit wait (at most
// UDIWARP_PRELOAD_RD_LINGER) until RD has it acknowledged. socat sends
// the lines it reads in one datagram, to a peer it has not spoken to, so
// the datagram waits for RD's handshake when socat, at the end of its
// input, shuts the socket down and exits without closing it.
//
// "sendto": socat -u to UDP-SENDTO reads nothing from the socket, so
// nothing of the handshake is read before its shutdown (SHUT_WR, which
// fails with ENOTCONN on the unconnected socket and shuts its sending
// down all the same). "connected": socat -t 1 on a connected socket,
// whose SHUT_WR the kernel takes; it reads the socket, so the receiver
// is held stopped until the sender's Hello has gone again (socat shut
// the socket down just after sending it): the handshake then completes,
// and the Data frame goes, after the shutdown. The program's SHUT_WR must
// not stop the engine's own sends on the socket (the Data frame,
// retransmissions, acknowledgements), which failed with EPIPE
// (TxErrors). "exit": a program (testdata/survive.c, sendexit) sends
// one datagram and exits at once, its socket open: the exit waits.
func TestRDLinger(t *testing.T) {
	need(t, "socat")
	dir := built(t)
	socat := func(args string) func(int) []string {
		return func(port int) []string {
			return []string{"sh", "-c", "seq 1 5 | exec socat " + fmt.Sprintf(args, port)}
		}
	}
	for _, c := range []struct {
		name string
		cmd  func(port int) []string
		want string
		hold bool // the receiver stopped until the sender's Hello went again
	}{
		{"sendto", socat("-u - UDP-SENDTO:127.0.0.1:%d"), "1\n2\n3\n4\n5\n", false},
		{"connected", socat("-t 1 - UDP:127.0.0.1:%d"), "1\n2\n3\n4\n5\n", true},
		{"exit", func(port int) []string {
			return []string{filepath.Join(dir, "survive"), "sendexit", strconv.Itoa(port)}
		}, "exit\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			port := freePort(t)
			rcv := rdReceiver(t, ctx, dir, port)
			if c.hold {
				stopProc(t, rcv)
			}
			cmd := c.cmd(port)
			snd := startEnv(t, ctx, dir, true, rdEnv(), cmd[0], cmd[1:]...)
			if c.hold {
				hello := func(ss stats) bool { return ss.Device["RDControlSent"]+ss.Device["TxErrors"] >= 2 }
				if ss := snd.statsWhen(t, hello); !hello(ss) {
					t.Fatalf("the sender's Hello never went again: %+v", ss)
				}
				contProc(t, rcv)
			}
			snd.wait(t)
			want := c.want
			got := fileWhen(rcv.file, want)
			ss := snd.readStats(t)
			rs := rcv.statsWhen(t, func(rs stats) bool { return rs.Received >= 1 })
			t.Logf("sender %+v; receiver %+v", ss, rs)
			if ss.QP != "rd" || ss.Sent != 1 {
				t.Fatalf("the sender's engine sent %d datagrams over %q, want 1 over rd", ss.Sent, ss.QP)
			}
			if got != want {
				t.Errorf("the receiver got %q, want %q: the datagram sent before the sender shut down and exited was lost", got, want)
			}
			if ss.RDDropped != 0 || ss.Device["TxErrors"] != 0 {
				t.Errorf("the sender's engine gave up on RD Sends %d times and failed %d sends", ss.RDDropped, ss.Device["TxErrors"])
			}
			if rs.Received != 1 {
				t.Errorf("the receiver's engine delivered %d datagrams, want 1", rs.Received)
			}
		})
	}
}

// stopProc stops p (SIGSTOP) and waits until it is stopped.
func stopProc(t *testing.T, p *proc) {
	t.Helper()
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); procState(pid) != "T"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not stop (state %q)", p.cmd.Path, procState(pid))
		}
	}
}

// contProc continues p, stopped by stopProc.
func contProc(t *testing.T, p *proc) {
	t.Helper()
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// With UDIWARP_PRELOAD_RD_LINGER=0 nothing waits: a sender that exits
// right after sending loses what its peer has not acknowledged — its
// first datagram to a peer always, since it waits for RD's handshake —
// and its stats count each socket that gave up (rd_dropped). The
// receiver is stopped (SIGSTOP) while socat sends and exits, so the
// handshake cannot be answered in time; continued, it answers the Hello
// and gets nothing more.
func TestRDLingerZero(t *testing.T) {
	need(t, "socat")
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := freePort(t)
	rcv := rdReceiver(t, ctx, dir, port)
	stopProc(t, rcv)
	snd := startEnv(t, ctx, dir, true, rdEnv("UDIWARP_PRELOAD_RD_LINGER=0"), "sh", "-c",
		fmt.Sprintf("seq 1 5 | exec socat -u - UDP-SENDTO:127.0.0.1:%d", port))
	snd.wait(t)
	ss := snd.readStats(t)
	contProc(t, rcv)
	// The receiver's engine answers the sender's Hello (a Challenge)
	// once it reads it: from then on nothing more can come.
	rs := rcv.statsWhen(t, func(rs stats) bool { return rs.Device["RDChallenges"] >= 1 })
	b, _ := os.ReadFile(rcv.file)
	t.Logf("sender %+v; receiver %+v", ss, rs)
	if ss.QP != "rd" || ss.Sent != 1 {
		t.Fatalf("the sender's engine sent %d datagrams over %q, want 1 over rd", ss.Sent, ss.QP)
	}
	if ss.RDDropped < 1 {
		t.Errorf("the sender's stats count %d sockets that gave up on unacknowledged Sends, want at least 1 (rd_dropped)", ss.RDDropped)
	}
	if rs.Device["RDChallenges"] < 1 {
		t.Fatalf("the receiver's engine never read the sender's Hello: %+v", rs)
	}
	if rs.Received != 0 || len(b) != 0 {
		t.Errorf("the receiver got %q (%d datagrams): with no linger the datagram waiting for the handshake is lost", b, rs.Received)
	}
}

// procState is the state letter /proc gives process pid ("T": stopped).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+3 <= len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

// shutdown(SHUT_WR) of a datagram socket the engine carries stops the
// program's sends (EPIPE) but not the engine's on the same kernel
// socket: under RD the shut socket's acknowledgements of what it still
// receives, and its Sends' Data frames after the handshake, go out, and
// the shutdown waits for its Sends to be acknowledged
// (testdata/survive.c, mode shutwr). A datagram sent just before close
// reaches its peer: under RD the close waits for its acknowledgement
// (closewait). UD runs the same programs as their control.
func TestDatagramShutdown(t *testing.T) {
	dir := built(t)
	for _, m := range []struct {
		mode string
		n    uint64 // datagrams sent, and received, in the process
	}{{"shutwr", 6}, {"closewait", 1}} {
		for _, q := range []string{"rd", "ud"} {
			t.Run(m.mode+"/"+q, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				p := startEnv(t, ctx, dir, true, []string{"UDIWARP_PRELOAD_QP=" + q}, filepath.Join(dir, "survive"), m.mode)
				out := p.wait(t)
				st := p.readStats(t)
				t.Logf("%s engine: %+v", strings.TrimSpace(out), st)
				if !strings.HasPrefix(out, "ok "+m.mode) {
					t.Fatalf("output %q", out)
				}
				if st.QP != q || st.Sent != m.n || st.Received != m.n {
					t.Errorf("the %q engine sent %d and received %d datagrams, want %d each over %s", st.QP, st.Sent, st.Received, m.n, q)
				}
				if st.Device["TxErrors"] != 0 || st.RDDropped != 0 {
					t.Errorf("%d of the engine's sends failed and it gave up on RD Sends %d times", st.Device["TxErrors"], st.RDDropped)
				}
			})
		}
	}
}
