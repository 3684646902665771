package main

import (
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// TestServerSessionHoldsForever (a reproducer, not fixed: run with
// UDIWARP_ATTACK_REPRO=1): a client that ran one run keeps the server
// for as long as it sends any message within requestTimeout — a greeting
// every so often is enough, with no run in progress. Every other client
// is told "busy" without bound; what should bound it is the time since
// the session's last run (or the session's whole length), not since its
// last message.
func TestServerSessionHoldsForever(t *testing.T) {
	if os.Getenv("UDIWARP_ATTACK_REPRO") == "" {
		t.Skip("a reproducer of an open defect: UDIWARP_ATTACK_REPRO=1 runs it")
	}
	old := requestTimeout
	t.Cleanup(func() { requestTimeout = old })
	requestTimeout = 300 * time.Millisecond
	addr := startServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	enc, dec := json.NewEncoder(c), json.NewDecoder(c)
	enc.Encode(runRequest{Mode: "raw-udp", Test: "lat", Size: 10, From: "127.0.0.1:9"})
	var rep runReply
	if err := dec.Decode(&rep); err != nil || rep.Error != "" {
		t.Fatalf("the run: %+v %v", rep, err)
	}
	enc.Encode(doneMsg{Done: true})
	if err := dec.Decode(&rep); err != nil {
		t.Fatal(err)
	}
	// No run from here on: a greeting every 100 ms, for 20 request timeouts.
	for end := time.Now().Add(20 * requestTimeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if err := enc.Encode(runRequest{Hello: protocol}); err != nil {
			t.Fatal(err)
		}
		if err := dec.Decode(&rep); err != nil {
			t.Fatal(err)
		}
	}
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 0 {
		t.Fatalf("after %v without a run, another client: exit %d, %q (busy: %v)", 20*requestTimeout, code, stderr, strings.Contains(stderr, "busy"))
	}
}
