package preload_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// preloadRequest is the MPA Request a preloaded client sends (the
// engine's private data: "udiwarp-stream/1" and its receive size), so
// that a test's raw connection can finish what it began and be answered.
func preloadRequest(t *testing.T) []byte {
	t.Helper()
	pd := binary.BigEndian.AppendUint32([]byte("udiwarp-stream/1"), 64<<10)
	req, err := udiwarp.AppendMPAFrame(nil, &udiwarp.MPAFrameFields{Revision: udiwarp.MPARevision2, Enhanced: true, CRC: true,
		IRDORD: udiwarp.IRDORD{PeerToPeer: true, WriteRTR: true, IRD: 16, ORD: 16}, PrivateData: pd})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestTCPEventLoopHeld: connections that send part of an MPA Request,
// all of its key, all but its last byte, or nothing to a server that
// speaks first, and stop, hold no preloaded event-loop server (issue 30,
// item 3: a non-blocking poll(2) server stalled 50 ms per read of each
// partial key, forever, and waited out the exchange's timeout on a whole
// key, whatever O_NONBLOCK said; a server that speaks first waited 1 s
// in its first write to each silent client). The server (tcpcheck
// evloop) is single-threaded, non-blocking, with poll, select or
// level- or edge-triggered epoll; the exchange's wait is 10 minutes
// (UDIWARP_PRELOAD_TCP_WAIT), so an implementation that waits on any of
// these peers holds the real client far past the test's minute, where
// the server answers it at once: its 200 round trips must end within the
// minute while every attacker's connection is still open. Then each
// attacker finishes its Request and is answered (the exchange's state
// was kept), a bogus one is shut down at once, and a silent one is
// greeted as the plain client it is once its 1 s is over.
func TestTCPEventLoopHeld(t *testing.T) {
	dir := built(t)
	req := preloadRequest(t)
	bogus := append([]byte(nil), req[:udiwarp.MPAFrameHeaderSize]...)
	bogus[18], bogus[19] = 0xff, 0xff // PD_Length 65535: no Request has it
	type attack struct {
		name  string
		sent  []byte // what each attacker sends, then stops
		greet bool   // the server speaks first
		n     int    // attackers
	}
	attacks := []attack{
		{"one-byte", req[:1], false, 60},
		{"part-key", req[:9], false, 20},
		{"key", req[:16], false, 20},
		{"header", req[:udiwarp.MPAFrameHeaderSize], false, 20},
		{"all-but-one", req[:len(req)-1], false, 20},
		{"bogus", bogus, false, 20},
		{"greet-silent", nil, true, 100},
		{"greet-key", req[:16], true, 20},
	}
	for _, waiter := range []string{"poll", "select", "epoll", "epollet"} {
		for _, a := range attacks {
			if waiter != "poll" && a.name != "part-key" && a.name != "key" && a.name != "greet-silent" {
				continue
			}
			t.Run(waiter+"/"+a.name, func(t *testing.T) {
				eventLoopHeld(t, dir, waiter, a.sent, a.greet, a.n, req)
			})
		}
	}
}

func eventLoopHeld(t *testing.T, dir, waiter string, sent []byte, greet bool, n int, req []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := append([]string{"UDIWARP_PRELOAD_TCP_WAIT=600000"}, rcEnv...)
	port := freePort(t)
	count := filepath.Join(t.TempDir(), "accepted")
	g := "0"
	if greet {
		g = "1"
	}
	srv := startEnv(t, ctx, dir, true, env, filepath.Join(dir, "tcpcheck"), "evloop", strconv.Itoa(port), waiter, g, count)
	waitTCP(t, port, srv)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var attackers []net.Conn
	for range n {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(sent); err != nil {
			t.Fatal(err)
		}
		attackers = append(attackers, c)
	}
	// The real client connects after them all: the server accepts them
	// first (the kernel queues connections in order).
	cctx, ccancel := context.WithTimeout(ctx, time.Minute)
	defer ccancel()
	cli := startEnv(t, cctx, dir, true, env, filepath.Join(dir, "tcpcheck"), "pingpong", strconv.Itoa(port), "200", g)
	<-cli.done
	if cli.err != nil {
		t.Fatalf("the real client's 200 round trips, with %d attackers' connections open: %v (a minute is 200 round trips' time many times over)\n%s",
			n, cli.err, cli.out.String())
	}
	if got, _ := evCount(t, count); got < n+1 {
		t.Fatalf("the server accepted %d connections, want the %d attackers' and the client's", got, n)
	}
	cs := srv.statsWhen(t, func(s stats) bool { return s.Streams >= 1 })
	if cs.Streams != 1 {
		t.Fatalf("server engine %+v: want the client's stream alone", cs)
	}
	switch {
	case len(sent) > 0 && string(sent) == string(req[:len(sent)]):
		// Still open and undecided: each finishes its Request and is
		// answered over RC.
		for i, c := range attackers {
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if k, err := c.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("attacker %d's connection: %d bytes, %v, while its Request was unfinished", i, k, err)
			}
		}
		for i, c := range attackers {
			if _, err := c.Write(req[len(sent):]); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			rep := make([]byte, udiwarp.MPAFrameHeaderSize)
			if _, err := io.ReadFull(c, rep); err != nil || string(rep[:16]) != "MPA ID Rep Frame" || rep[16]&0x20 != 0 {
				t.Fatalf("attacker %d, its Request finished: %q, %v; want an MPA Reply\nserver engine %+v", i, rep, err, srv.readStats(t))
			}
		}
		srv.statsWhen(t, func(s stats) bool { return s.Streams == uint64(n+1) })
		if s := srv.readStats(t); s.Streams != uint64(n+1) {
			t.Fatalf("server engine %+v: want %d streams", s, n+1)
		}
	case len(sent) == 0:
		// Silent to a server that speaks first: a plain client, greeted
		// once its wait (1 s from the accept) is over.
		for i, c := range attackers {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			b := make([]byte, 6)
			if _, err := io.ReadFull(c, b); err != nil || string(b) != "hello\n" {
				t.Fatalf("silent client %d: %q, %v; want the server's greeting over the kernel", i, b, err)
			}
		}
		srv.statsWhen(t, func(s stats) bool { return s.StreamsPlain == uint64(n) })
		if s := srv.readStats(t); s.StreamsPlain != uint64(n) {
			t.Fatalf("server engine %+v: want %d plain streams", s, n)
		}
	default:
		// A bogus Request: shut down at once.
		for i, c := range attackers {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if b, err := io.ReadAll(c); err != nil {
				t.Fatalf("bogus attacker %d: %q, %v; want its connection ended", i, b, err)
			}
		}
		srv.statsWhen(t, func(s stats) bool { return s.StreamsRefused == uint64(n) })
		if s := srv.readStats(t); s.StreamsRefused != uint64(n) {
			t.Fatalf("server engine %+v: want %d refused", s, n)
		}
	}
	// Each wait had something to do (an accept, a greeting, a round trip,
	// an attacker's Request finished takes a few): none returned over
	// and over for a connection held undecided, a busy loop.
	if _, waits := evCount(t, count); waits > int64(10*(n+200)+1000) {
		t.Fatalf("the server waited %d times for %d connections and 200 round trips: a busy loop", waits, n+1)
	} else {
		t.Logf("the server waited %d times", waits)
	}
}

// evCount reads what tcpcheck evloop writes: the connections it
// accepted and the waits it made.
func evCount(t *testing.T, path string) (accepted int, waits int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(string(b), &accepted, &waits); err != nil {
		t.Fatalf("%s: %q", path, b)
	}
	return accepted, waits
}
