package preload_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// TCP over RC: UDIWARP_PRELOAD_TCP=rc runs a program's TCP sockets as
// RC QPs on the program's own descriptors (docs/preload.md, "TCP").

var rcEnv = []string{"UDIWARP_PRELOAD_TCP=rc"}

// waitTCP waits until something listens on the TCP port.
func waitTCP(t *testing.T, port int, p *proc) {
	t.Helper()
	waitBound(t, p, fmt.Sprintf("listened on TCP port %d", port), func() bool { return netnstest.TCPListening(0, port) })
}

// The behaviours a program relies on, both ends of each connection in
// one preloaded process (testdata/tcpcheck.c): bulk both ways at once
// with random sizes, readv and writev; non-blocking ends under level-
// and edge-triggered epoll; poll and select saying readable exactly
// when a receive finds data; MSG_PEEK, FIONREAD, MSG_WAITALL, MSG_OOB
// refused; half-close both ways and EPIPE after the peer's close; EINTR
// without SA_RESTART and a restarted receive with it; fork (the child
// cannot use the parent's streams, its own connection is plain TCP);
// exec (no stream inherited); closing every descriptor. Every byte goes
// through the engine: its stream counters match what the mode moves.
func TestTCPBehaviours(t *testing.T) {
	dir := built(t)
	for _, c := range []struct {
		mode  string
		bytes uint64 // the least each way the engine must have carried
	}{
		{"stream", 2 * 8 << 20}, {"nonblock", 2 * 4 << 20}, {"edge", 2 * 4 << 20}, {"poll", 50 * 10}, {"select", 50 * 10},
		{"peek", 11}, {"trickle", 3}, {"shutdown", 15}, {"eintr", 4}, {"fork", 5}, {"exec", 5}, {"closeall", 5},
	} {
		t.Run(c.mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			p := startEnv(t, ctx, dir, true, rcEnv, filepath.Join(dir, "tcpcheck"), c.mode)
			out := p.wait(t)
			if !strings.Contains(out, "ok "+c.mode) {
				t.Fatalf("output %q", out)
			}
			st := p.readStats(t)
			t.Logf("engine: %+v", st)
			// shutdown's last writes go to a peer that closed: sent, never read.
			lost := c.mode == "shutdown" && st.StreamSent > st.StreamReceived
			if st.Streams < 2 || st.StreamSent < c.bytes || st.StreamReceived < c.bytes || (st.StreamSent != st.StreamReceived && !lost) {
				t.Errorf("the engine carried %d streams, %d bytes sent and %d received: want both ends of each connection, at least %d bytes, every one received",
					st.Streams, st.StreamSent, st.StreamReceived, c.bytes)
			}
			if st.StreamsRefused != 0 || st.StreamsDropped != 0 {
				t.Errorf("refused %d, dropped %d", st.StreamsRefused, st.StreamsDropped)
			}
			if c.mode == "fork" && st.StreamsPlain != 1 {
				t.Errorf("the child's own connection: %d plain streams, want 1", st.StreamsPlain)
			}
		})
	}
}

// The peers the preload cannot carry: a plain TCP client of a preloaded
// server stays the kernel's, unread (its bytes arrive whole); a
// preloaded client of a plain server fails its connect with
// ECONNREFUSED, and its socket never carries plain bytes after.
func TestTCPPlainPeers(t *testing.T) {
	dir := built(t)
	t.Run("plain-client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		port := freePort(t)
		srv := startEnv(t, ctx, dir, true, rcEnv, filepath.Join(dir, "tcpcheck"), "echo", strconv.Itoa(port))
		waitTCP(t, port, srv)
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		msg := bytes.Repeat([]byte("plain tcp, not MPA. "), 5000)
		go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("echo over the kernel: %d of %d bytes, %v", len(got), len(msg), err)
		}
		srv.wait(t)
		st := srv.readStats(t)
		if st.StreamsPlain != 1 || st.Streams != 0 {
			t.Errorf("engine %+v: want the one connection plain, no stream", st)
		}
	})
	t.Run("plain-server", func(t *testing.T) {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Read(make([]byte, 64)) // the MPA Request, or some of it
				c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n"))
				c.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		p := startEnv(t, ctx, dir, true, rcEnv, filepath.Join(dir, "tcpcheck"), "refused", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
		if out := p.wait(t); !strings.Contains(out, "ok refused") {
			t.Fatalf("output %q", out)
		}
		if st := p.readStats(t); st.StreamsRefused != 1 || st.Streams != 0 {
			t.Errorf("engine %+v: want one refused exchange", st)
		}
	})
}

// A client that connects and says nothing (a plain TCP client waiting for
// the server to speak, or an attacker's half-open flood) does not hold a
// preloaded server's accept: the stream is decided by its first bytes,
// when the server first reads or writes it. With the exchange's wait at
// 10 minutes, a preloaded client accepted after a silent one is served
// (a waiting accept would hold it the 10 minutes, far past the test's
// minute), and the silent one, speaking later, is echoed over the kernel.
func TestTCPSilentClient(t *testing.T) {
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env := append([]string{"UDIWARP_PRELOAD_TCP_WAIT=600000"}, rcEnv...)
	port := freePort(t)
	srv := startEnv(t, ctx, dir, true, env, filepath.Join(dir, "tcpcheck"), "serve2", strconv.Itoa(port))
	waitTCP(t, port, srv)
	silent, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	cli := startEnv(t, ctx, dir, true, env, filepath.Join(dir, "tcpcheck"), "client", strconv.Itoa(port))
	if out := cli.wait(t); !strings.Contains(out, "ok client") {
		t.Fatalf("client: %q", out)
	}
	if _, err := silent.Write([]byte("plain, at last")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 14)
	silent.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(silent, got); err != nil || string(got) != "plain, at last" {
		t.Fatalf("the silent client's echo: %q, %v", got, err)
	}
	silent.Close()
	srv.wait(t)
	if st := srv.readStats(t); st.Streams != 1 || st.StreamsPlain != 1 {
		t.Errorf("server engine %+v: want one stream over RC and one plain", st)
	}
}

// A peer that speaks MPA but is no preloaded program (an MPA Request
// whose private data is not udiwarp's) gets its connection shut down —
// the server's read of it fails with ENOTCONN, never plain bytes — and
// the next client is served.
func TestTCPBogusMPA(t *testing.T) {
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := freePort(t)
	srv := startEnv(t, ctx, dir, true, rcEnv, filepath.Join(dir, "tcpcheck"), "serve2", strconv.Itoa(port))
	waitTCP(t, port, srv)
	bogus, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer bogus.Close()
	req, err := udiwarp.AppendMPAFrame(nil, &udiwarp.MPAFrameFields{Revision: udiwarp.MPARevision2, Enhanced: true, CRC: true,
		IRDORD: udiwarp.IRDORD{PeerToPeer: true, WriteRTR: true, IRD: 16, ORD: 16}, PrivateData: []byte("not udiwarp")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bogus.Write(req); err != nil {
		t.Fatal(err)
	}
	bogus.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadAll(bogus); err != nil { // its Reply, then the end
		t.Fatalf("the bogus peer's connection did not end: %v", err)
	}
	cli := startEnv(t, ctx, dir, true, rcEnv, filepath.Join(dir, "tcpcheck"), "client", strconv.Itoa(port))
	if out := cli.wait(t); !strings.Contains(out, "ok client") {
		t.Fatalf("client: %q", out)
	}
	out := srv.wait(t)
	if !strings.Contains(out, fmt.Sprintf("conn error %d", syscall.ENOTCONN)) {
		t.Errorf("the server's read of the bogus stream: %q, want ENOTCONN", out)
	}
	if st := srv.readStats(t); st.Streams != 1 || st.StreamsRefused != 1 {
		t.Errorf("server engine %+v: want one stream over RC and one refused", st)
	}
}

// iperf3 over TCP, unmodified, both ends preloaded: its control
// connection and its data streams (two at once, then reversed) are RC
// QPs, and the bytes iperf3 counts are the bytes the engines carried.
func TestIperf3TCP(t *testing.T) {
	need(t, "iperf3")
	dir := built(t)
	for _, extra := range [][]string{{"-P", "2"}, {"-R"}} {
		t.Run(strings.Join(extra, ""), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			port := freePort(t)
			srv := startEnv(t, ctx, dir, true, rcEnv, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
			waitTCP(t, port, srv)
			args := append([]string{"-c", "127.0.0.1", "-p", strconv.Itoa(port), "-t", "2", "-J"}, extra...)
			cli := startEnv(t, ctx, dir, true, rcEnv, "iperf3", args...)
			out := cli.wait(t)
			srv.wait(t)
			var rep struct {
				End struct {
					SumSent     struct{ Bytes float64 } `json:"sum_sent"`
					SumReceived struct {
						Bytes         float64
						BitsPerSecond float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
			}
			if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rep); err != nil {
				t.Fatalf("iperf3 -J: %v\n%s", err, out)
			}
			cs, ss := cli.readStats(t), srv.readStats(t)
			t.Logf("iperf3 %v: %.0f bytes received, %.2f Gb/s; client engine %+v; server engine %+v", extra,
				rep.End.SumReceived.Bytes, rep.End.SumReceived.BitsPerSecond/1e9, cs, ss)
			streams := uint64(2) // the control connection and at least one data stream
			if extra[0] == "-P" {
				streams = 3
			}
			if cs.Streams < streams || ss.Streams < streams || cs.StreamsPlain+ss.StreamsPlain+cs.StreamsRefused+ss.StreamsRefused != 0 {
				t.Errorf("streams: client %d, server %d (want %d each, none plain or refused)", cs.Streams, ss.Streams, streams)
			}
			data := uint64(rep.End.SumReceived.Bytes)
			if data == 0 {
				t.Fatal("iperf3 moved nothing")
			}
			from, to := cs.StreamSent, ss.StreamReceived
			if extra[0] == "-R" {
				from, to = ss.StreamSent, cs.StreamReceived
			}
			if from < data || to < data {
				t.Errorf("iperf3 received %d bytes; the engines carried %d out and %d in", data, from, to)
			}
		})
	}
}

// sockperf's TCP ping-pong, unmodified, both ends preloaded: its
// latency figures come from messages the engines carried.
func TestSockperfTCP(t *testing.T) {
	need(t, "sockperf")
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := freePort(t)
	srv := startEnv(t, ctx, dir, true, rcEnv, "sockperf", "server", "--tcp", "-i", "127.0.0.1", "-p", strconv.Itoa(port))
	waitTCP(t, port, srv)
	cli := startEnv(t, ctx, dir, true, rcEnv, "sockperf", "ping-pong", "--tcp", "-i", "127.0.0.1", "-p", strconv.Itoa(port), "-t", "2", "-m", "64")
	out := cli.wait(t)
	lat := num(t, `avg-latency=([0-9.]+)`, out)
	sent := num(t, `SentMessages=([0-9]+)`, out)
	ss := srv.statsWhen(t, func(ss stats) bool { return ss.Streams >= 1 && float64(ss.StreamReceived) >= 64*sent })
	srv.stop(syscall.SIGINT)
	cs := cli.readStats(t)
	t.Logf("sockperf TCP over RC: avg latency %.3f us, %.0f messages; client engine %+v; server engine %+v", lat, sent, cs, ss)
	if cs.Streams < 1 || ss.Streams < 1 {
		t.Fatalf("streams: client %d, server %d", cs.Streams, ss.Streams)
	}
	if float64(cs.StreamSent) < 64*sent || float64(ss.StreamReceived) < 64*sent {
		t.Errorf("sockperf sent %.0f messages of 64 B; the engines carried %d out, %d in", sent, cs.StreamSent, ss.StreamReceived)
	}
}
