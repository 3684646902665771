package preload_test

import (
	"context"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// With UDIWARP_PRELOAD_QP=rd every socket runs over an RD QP: the same
// unmodified programs, now with RD's delivery. sockperf's ping-pong and
// SIPp's calls go through, and iperf -u, a pure sender (it reads only
// the server's final report), loses nothing: its acknowledgements reach
// the engine while it sends.
func TestRDMode(t *testing.T) {
	dir := built(t)
	t.Setenv("UDIWARP_PRELOAD_QP", "rd")
	rd := func(t *testing.T, who string, st stats) {
		t.Helper()
		if st.QP != "rd" {
			t.Fatalf("%s's engine ran %q QPs, want rd", who, st.QP)
		}
	}
	t.Run("sockperf", func(t *testing.T) {
		need(t, "sockperf")
		out, cli, srv := sockperfUDP(t, dir)
		recvMsgs := num(t, `ReceivedMessages=([0-9]+)`, out)
		if num(t, `# dropped messages = ([0-9]+)`, out) != 0 || recvMsgs < 1000 {
			t.Fatalf("sockperf over RD: %.0f round trips, dropped some:\n%s", recvMsgs, out)
		}
		ss := srv.statsWhen(t, func(ss stats) bool { return float64(ss.Received) >= recvMsgs })
		srv.stop(syscall.SIGINT)
		cs := cli.readStats(t)
		t.Logf("sockperf over RD: %.3f µs; client %+v; server %+v", num(t, `Latency is ([0-9.]+) usec`, out), cs, ss)
		rd(t, "the client", cs)
		rd(t, "the server", ss)
		if float64(cs.Received) < recvMsgs || float64(ss.Received) < recvMsgs {
			t.Errorf("the engines carried fewer than %.0f round trips: client %+v server %+v", recvMsgs, cs, ss)
		}
	})
	t.Run("iperf", func(t *testing.T) {
		need(t, "iperf")
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		port := freePort(t)
		srv := start(t, ctx, dir, true, "iperf", "-s", "-u", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
		waitUDP(t, port, srv)
		cli := start(t, ctx, dir, true, "iperf", "-c", "127.0.0.1", "-u", "-t", "1", "-b", "20M", "-p", strconv.Itoa(port))
		out := cli.wait(t)
		m := regexp.MustCompile(`(\d+)/(\d+) \(`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no server report:\n%s", out)
		}
		total, _ := strconv.Atoi(m[2])
		ss := srv.statsWhen(t, func(ss stats) bool { return ss.Received >= uint64(total) })
		srv.stop(syscall.SIGINT)
		cs := cli.readStats(t)
		t.Logf("iperf over RD: server report %s/%s lost; client %+v; server %+v", m[1], m[2], cs, ss)
		rd(t, "the client", cs)
		rd(t, "the server", ss)
		if m[1] != "0" || total < 1000 || ss.Received < uint64(total) {
			t.Errorf("RD lost %s of %s datagrams (server engine received %d)", m[1], m[2], ss.Received)
		}
	})
	t.Run("sipp", func(t *testing.T) {
		needSIPp(t)
		uac, uas := sippCalls(t, sippRun{transport: "un", calls: 50, reliable: true})
		rd(t, "the UAC", uac)
		rd(t, "the UAS", uas)
	})
}
