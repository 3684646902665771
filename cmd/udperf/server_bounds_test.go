package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"golang.org/x/sys/unix"
)

// greet opens a control connection to addr and greets the server.
func greet(t *testing.T, addr string) (net.Conn, *json.Encoder, *json.Decoder) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(2 * time.Minute)) // only a hung server gets here
	enc, dec := json.NewEncoder(c), json.NewDecoder(c)
	if err := enc.Encode(runRequest{Hello: protocol}); err != nil {
		t.Fatal(err)
	}
	var rep runReply
	if err := dec.Decode(&rep); err != nil || rep.Udperf != protocol || rep.Error != "" {
		t.Fatalf("the greeting's answer: %+v %v", rep, err)
	}
	return c, enc, dec
}

// waitEOF reads c until the server closes it, failing if it does not
// within c's deadline.
func waitEOF(t *testing.T, c net.Conn, what string) {
	t.Helper()
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: the server did not close the connection: %v", what, err)
		}
		return // EOF, or a reset: closed
	}
}

// TestServerRefusesUnboundedRequests: a request may not name a run the
// server would wait for without bound (issue 30, item 7: 10^12 round
// trips held the server for about 31 years). Each size, count and
// duration out of bounds is refused with an error naming the bound, the
// session goes on, and a silent run within bounds is given up after its
// runLimit, leaving the server to the next client.
func TestServerRefusesUnboundedRequests(t *testing.T) {
	old := runSlack
	t.Cleanup(func() { runSlack = old })
	runSlack = 200 * time.Millisecond
	addr := startServer(t)
	c, enc, dec := greet(t, addr)
	from := "127.0.0.1:9"
	for _, tc := range []struct {
		name string
		req  runRequest
		says string
	}{
		{"trips", runRequest{Mode: "raw-udp", Test: "lat", Size: 10, Trips: 1e12, From: from}, "1000000000000 round trips (-n plus -w): a server/client lat run makes 0 to 1000000"},
		{"trips past the bound", runRequest{Mode: "rd-send", Test: "lat", Size: 10, Trips: maxTrips + 1, From: from}, "1000001 round trips"},
		{"negative trips", runRequest{Mode: "raw-udp", Test: "lat", Size: 10, Trips: -1, From: from}, "-1 round trips"},
		{"duration", runRequest{Mode: "raw-udp", Test: "bw", Size: 10, Duration: 1 << 62, From: from}, "lasts at most 1h0m0s"},
		{"duration past the bound", runRequest{Mode: "raw-tcp", Test: "bw", Size: 10, Duration: maxRunDuration + 1, From: from}, "-D 1h0m0.000000001s"},
		{"negative duration", runRequest{Mode: "ud-send", Test: "rate", Size: 10, Duration: -time.Second, From: from}, "-D -1s"},
		{"deadline", runRequest{Mode: "ud-wr", Test: "bw", Size: 10, Duration: time.Second, Partial: true, Deadline: 1 << 62, From: from}, "at most 10s over server/client"},
		{"mtu", runRequest{Mode: "rd-write", Test: "bw", Size: 10, Duration: time.Second, Segment: 1 << 30, From: from}, "-mtu 1073741824: at most 65535"},
		{"size", runRequest{Mode: "rd-write", Test: "bw", Size: 1 << 30, Duration: time.Second, From: from}, "-s 1073741824"},
	} {
		if err := enc.Encode(tc.req); err != nil {
			t.Fatal(err)
		}
		var rep runReply
		if err := dec.Decode(&rep); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if rep.Error == "" || !strings.Contains(rep.Error, tc.says) {
			t.Fatalf("%s: %+v answered %+v; want a refusal saying %q", tc.name, tc.req, rep, tc.says)
		}
	}
	// The session went on: a run within bounds is served, and given up
	// once its client has said nothing for its runLimit (100 round trips:
	// 100 ms, plus runSlack), closing the session.
	start := time.Now() // before the server sets its deadline
	if err := enc.Encode(runRequest{Mode: "raw-udp", Test: "lat", Size: 10, Poll: "event", Trips: 100, From: from}); err != nil {
		t.Fatal(err)
	}
	var rep runReply
	if err := dec.Decode(&rep); err != nil || rep.Error != "" || rep.Addr == "" {
		t.Fatalf("a run within bounds after the refusals: %+v %v", rep, err)
	}
	waitEOF(t, c, "a silent run")
	if took := time.Since(start); took < runLimit("lat", 0, 100) {
		t.Fatalf("the silent run ended after %v, before its runLimit %v", took, runLimit("lat", 0, 100))
	}
	// The server is free: another client's run is served, not told busy
	// (by hand: a udperf client would wait only runSlack for its figures).
	_, enc, dec = greet(t, addr)
	if err := enc.Encode(runRequest{Mode: "raw-udp", Test: "lat", Size: 10, Poll: "event", Trips: 10, From: from}); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(&rep); err != nil || rep.Error != "" || rep.Addr == "" {
		t.Fatalf("another client after the silent run: %+v %v", rep, err)
	}
	if err := enc.Encode(doneMsg{Done: true}); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(&rep); err != nil || rep.Error != "" {
		t.Fatalf("another client's figures after the silent run: %+v %v", rep, err)
	}
}

// TestServerBoundsControlMessage: a control message is read up to its
// bound, not buffered whole (issue 30, item 8: 256 MiB on one connection,
// no greeting needed, grew the heap by 767-896 MiB). 32 MiB without a
// newline: the server closes that connection saying why, its heap does
// not grow by the message, and it serves the next client.
func TestServerBoundsControlMessage(t *testing.T) {
	addr, out := startServerOut(t)
	const size = 32 << 20
	msg := bytes.Repeat([]byte("a"), size)
	copy(msg, `{"hello":"`)
	buf := make([]byte, 4096)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute)) // only a server that never closes gets here
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		wrote <- err
	}()
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the server did not close the connection: %v", err)
		}
		break
	}
	<-wrote // an error: the server closed with the rest unread
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1000*maxMessage {
		t.Fatalf("a %d MiB control message: the process allocated %d KiB meanwhile (the server buffered it)", size>>20, grew>>10)
	}
	waitFor(t, func() bool { return strings.Contains(out.String(), errTooLong.Error()) }, "the server's line about the message")
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 0 {
		t.Fatalf("a client after the oversized message: exit %d: %s", code, stderr)
	}
}

// waitFor polls cond until it holds, failing after a minute.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// TestServerSurvivesEMFILE: a server out of file descriptors (here: its
// RLIMIT_NOFILE lowered until a few idle control connections exhaust it)
// backs off and accepts again once they go, instead of exiting (issue 30,
// item 9: any Accept error ended it for good).
func TestServerSurvivesEMFILE(t *testing.T) {
	bin := buildUdperf(t)
	srv, addr, _, srvErr := startServerProcess(t, bin)
	pid := srv.Process.Pid
	fds := func() int {
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	base := fds()
	lim := unix.Rlimit{Cur: uint64(base + 3), Max: uint64(base + 3)}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	// Three connections take the descriptors left; the fourth's Accept
	// fails with EMFILE.
	var idle []net.Conn
	for i := range 6 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v (server stderr %q)", i, err, srvErr.String())
		}
		idle = append(idle, c)
	}
	waitFor(t, func() bool { return strings.Contains(srvErr.String(), "too many open files") }, "the server's EMFILE")
	for _, c := range idle {
		c.Close()
	}
	// The condition cleared: the server answers a greeting, and serves a run.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the server after EMFILE: %v (stderr %q)", err, srvErr.String())
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	json.NewEncoder(c).Encode(runRequest{Hello: protocol})
	var rep runReply
	if err := json.NewDecoder(c).Decode(&rep); err != nil || rep.Udperf != protocol {
		t.Fatalf("the server after EMFILE: greeting answered %+v, %v (stderr %q)", rep, err, srvErr.String())
	}
	c.Close()
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 0 {
		t.Fatalf("a client after EMFILE: exit %d: %s (server stderr %q)", code, stderr, srvErr.String())
	}
	if !strings.Contains(srvErr.String(), "too many open files; accepting again in 5ms") {
		t.Fatalf("the server's stderr %q: no back-off", srvErr.String())
	}
}

// TestServerShedsOldestIdleConnection: control connections are capped
// (issue 30, item 9: enough idle ones exhausted the server's
// descriptors); past the cap the oldest that does not hold the server is
// closed for the newest, so idle connections cannot lock clients out.
func TestServerShedsOldestIdleConnection(t *testing.T) {
	old := requestTimeout
	t.Cleanup(func() { requestTimeout = old })
	requestTimeout = 2 * time.Minute // no connection here is closed for being slow
	addr, out := startServerOut(t)
	first, _, _ := greet(t, addr)
	for range 40 { // more than the cap
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first.SetDeadline(time.Now().Add(30 * time.Second))
	waitEOF(t, first, "the oldest idle connection, 40 newer ones open")
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 0 {
		t.Fatalf("a client beside 40 idle connections: exit %d: %s", code, stderr)
	}
	waitFor(t, func() bool {
		return strings.Contains(out.String(), fmt.Sprintf("closed, the oldest of %d control connections, for a new one", maxConns))
	}, "the server's line about the connection it shed")
}

// TestControlMessagesFit: maxMessage holds the largest control message a
// udperf client or server sends (every field at its longest) twice
// over.
func TestControlMessagesFit(t *testing.T) {
	from := "[fe80::ffff:ffff:ffff:ffff%" + strings.Repeat("z", 15) + "]:65535" // IFNAMSIZ-1
	req := runRequest{Hello: protocol, Bye: true, Mode: perf.ModeRDWriteRecord, Test: "rate", Size: 8 << 20, Poll: "event",
		Duration: maxRunDuration, Trips: maxTrips, Segment: maxSegment, Loss: math.Nextafter(1, 0), Seed: math.MaxUint64,
		Partial: true, Deadline: maxDeadline, STag: math.MaxUint32, TO: math.MaxUint64, From: from, QPN: math.MaxUint32,
		LLP: "xdp", LLPFallback: true}
	for _, m := range perf.Modes() {
		if len(m) > len(req.Mode) {
			req.Mode = m
		}
	}
	big := math.Nextafter(math.MaxFloat64, 0) / 3
	slots := make([]perf.Region, 16) // ud-wr's
	for i := range slots {
		slots[i] = perf.Region{STag: math.MaxUint32, TO: math.MaxUint64}
	}
	rep := runReply{Udperf: protocol, Error: strings.Repeat("e", 300), Addr: from, QPN: math.MaxUint32, STag: math.MaxUint32, TO: math.MaxUint64,
		Credits: math.MaxInt, Slots: slots, Received: math.MaxUint64, Partial: math.MaxUint64, ValidBytes: math.MaxUint64,
		Gbps: big, Mpps: big, Foreign: math.MaxUint64, Link: "xdp", LinkDetail: clip(strings.Repeat("\u00e9", maxDetail), maxDetail)}
	done := doneMsg{Done: true, Sent: math.MaxUint64, P50: big, Avg: big, Gbps: big, Mpps: big}
	for _, v := range []any{req, rep, done} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if len(b)+1 > maxMessage/2 {
			t.Errorf("%d bytes, over half of maxMessage (%d): %s", len(b)+1, maxMessage, b)
		}
	}
}
