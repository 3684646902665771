package main

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
)

// TestServerSessionHoldsForever: a client that ran one run and then
// sends only greetings, each within requestTimeout, does not keep the
// server: a session holding it must start its next run within
// requestTimeout of its last run's end, and the server then ends the
// session and serves another client. It fails when any message renews the
// hold (the session was kept for 20 request timeouts and every other
// client told "busy").
func TestServerSessionHoldsForever(t *testing.T) {
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
	// No run from here on: a greeting every 100 ms, until the server ends
	// the session (at most 20 request timeouts).
	ended := false
	for end := time.Now().Add(20 * requestTimeout); !ended && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if enc.Encode(runRequest{Hello: protocol}) != nil || dec.Decode(&rep) != nil {
			ended = true
		}
	}
	if !ended {
		t.Fatalf("a session greeting every 100 ms kept the server for %v after its run", 20*requestTimeout)
	}
	if code, stderr := clientRun(t, addr, "raw-udp"); code != 0 {
		t.Fatalf("after the greeting session ended, another client: exit %d, %q (busy: %v)", code, stderr, strings.Contains(stderr, "busy"))
	}
}
