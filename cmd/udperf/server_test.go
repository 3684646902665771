package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// startServer serves control connections on a loopback port until the
// test ends.
func startServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		done <- serveOn(context.Background(), ln, serverOptions{stdout: io.Discard, stderr: io.Discard})
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// clientRun runs `udperf client` against addr and returns its exit code
// and stderr, failing the test only if it hangs.
func clientRun(t *testing.T, addr string, mode string) (int, string) {
	t.Helper()
	type result struct {
		code   int
		stderr string
	}
	ch := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := run([]string{"client", "-addr", addr, "-mode", mode, "-test", "lat", "-s", "100", "-n", "20", "-w", "2", "-poll", "event", "-json"}, &out, &errb)
		ch <- result{code, errb.String()}
	}()
	select {
	case r := <-ch:
		return r.code, r.stderr
	case <-time.After(2 * time.Minute): // only a hung run gets here
		t.Fatal("the client run did not finish")
		return 0, ""
	}
}

// TestServerIdleControlConnection: a TCP connection to the control port
// that never sends its request does not stop another client's run, and the
// server closes it once the request deadline passes.
func TestServerIdleControlConnection(t *testing.T) {
	// Restored by a cleanup registered before the server's, so it runs
	// after the server's goroutines, which read it, are gone (a deferred
	// restore ran before them: a data race).
	old := requestTimeout
	t.Cleanup(func() { requestTimeout = old })
	requestTimeout = 500 * time.Millisecond
	addr := startServer(t)
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if code, stderr := clientRun(t, addr, "ud-send"); code != 0 {
		t.Fatalf("a client beside an idle control connection: exit %d: %s", code, stderr)
	}
	// The server gives up on the idle connection: it reads EOF.
	idle.SetReadDeadline(time.Now().Add(time.Minute)) // only a server that never closes gets here
	if n, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the idle connection: read %d, %v; want EOF from the server", n, err)
	}
}

// TestServerBusy: while one client's session is in progress (a run, or
// between its runs), another client is told at once that the server is
// busy; once the session ends, it is served.
func TestServerBusy(t *testing.T) {
	addr := startServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute)) // only a hung server gets here
	enc, dec := json.NewEncoder(c), json.NewDecoder(c)
	if err := enc.Encode(runRequest{Mode: "raw-udp", Test: "lat", Size: 10, From: "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	var rep runReply
	if err := dec.Decode(&rep); err != nil || rep.Error != "" || rep.Addr == "" {
		t.Fatalf("the first run: %+v %v", rep, err)
	}
	// The first run is in progress: a second client is turned away.
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 1 || !strings.Contains(stderr, "busy") {
		t.Fatalf("a second client during a run: exit %d, %q", code, stderr)
	}
	// ... with its error alone: no table header for rows that never come.
	var out, errb bytes.Buffer
	if code := run([]string{"client", "-addr", addr, "-mode", "raw-udp", "-s", "100", "-n", "20", "-poll", "event"}, &out, &errb); code != 1 || out.Len() != 0 || !strings.Contains(errb.String(), "busy") {
		t.Fatalf("a busy server's refusal, as a table: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	enc.Encode(struct{ Done bool }{true})
	if err := dec.Decode(&rep); err != nil {
		t.Fatal(err)
	}
	// Still the first client's session: the server stays its own.
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 1 || !strings.Contains(stderr, "busy") {
		t.Fatalf("a second client during the first's session: exit %d, %q", code, stderr)
	}
	// The session ends with its bye, answered once the server is free.
	enc.Encode(runRequest{Bye: true})
	if err := dec.Decode(&rep); err != nil || rep.Udperf != protocol {
		t.Fatalf("the bye's answer: %+v %v", rep, err)
	}
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 0 {
		t.Fatalf("a client after the run: exit %d: %s", code, stderr)
	}
}

// TestServerWaitsOutALongLatencyRun: a lat run lasts its round trips,
// not -D: the server waits for its end by the round trips the request
// names (runLimit), not by the duration a lat run does not have (it gave
// up on a long -n run runSlack after -D's 1 s, failing the client).
func TestServerWaitsOutALongLatencyRun(t *testing.T) {
	old := runSlack
	t.Cleanup(func() { runSlack = old })
	runSlack = 100 * time.Millisecond
	addr := startServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute)) // only a hung server gets here
	enc, dec := json.NewEncoder(c), json.NewDecoder(c)
	// A lat run of 1000 round trips whose -D (0 here) has long passed
	// when it ends: the client takes 3 runSlacks over it.
	if err := enc.Encode(runRequest{Mode: "raw-udp", Test: "lat", Size: 10, Poll: "event", Trips: 1000, From: "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	var rep runReply
	if err := dec.Decode(&rep); err != nil || rep.Error != "" || rep.Addr == "" {
		t.Fatalf("the run: %+v %v", rep, err)
	}
	time.Sleep(3 * runSlack)
	if err := enc.Encode(doneMsg{Done: true}); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(&rep); err != nil || rep.Error != "" {
		t.Fatalf("the run's figures after a long run: %+v %v (the server gave up on it)", rep, err)
	}
}
