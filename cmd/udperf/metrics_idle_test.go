package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMetricsServerClosesIdleConnections: the -metrics server closes a
// keep-alive connection left idle after a request, so that idle
// connections from anyone cannot use up its descriptors. It fails
// without an IdleTimeout (net/http then keeps the connection with no
// deadline at all).
func TestMetricsServerClosesIdleConnections(t *testing.T) {
	old := metricsIdle
	t.Cleanup(func() { metricsIdle = old })
	metricsIdle = 200 * time.Millisecond
	var stderr strings.Builder // written before serveMetrics returns
	f := &benchFlags{metrics: "127.0.0.1:0"}
	stop, err := f.serveMetrics(&stderr, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	m := regexp.MustCompile(`http://([^/]+)/metrics`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no address in %q", stderr.String())
	}
	c, err := net.Dial("tcp", m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("status %d, close %v: want a kept-alive 200", resp.StatusCode, resp.Close)
	}
	// Idle from here: the server must close it (EOF) well before the
	// read deadline.
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle keep-alive connection: %v, want the server to close it", err)
	}
}
