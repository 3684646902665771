package socketshim

import (
	"bytes"
	"context"
	"errors"
	"github.com/udiwarp/udiwarp/internal/parked"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"
)

// rcPipe connects two RC stream sockets over loopback.
func rcPipe(network, addr string, lo, do *RCOptions) (c1, c2 *RCConn, stop func(), err error) {
	l, err := ListenRC(network, addr, lo)
	if err != nil {
		return nil, nil, nil, err
	}
	defer l.Close()
	type res struct {
		c   *RCConn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.AcceptRC()
		ch <- res{c, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := DialRC(ctx, network, l.Addr().String(), do)
	r := <-ch
	if err != nil || r.err != nil {
		if d != nil {
			d.Close()
		}
		if r.c != nil {
			r.c.Close()
		}
		return nil, nil, nil, errors.Join(err, r.err)
	}
	return d, r.c, func() { d.Close(); r.c.Close() }, nil
}

func rcPair(t *testing.T, lo, do *RCOptions) (a, b *RCConn) {
	t.Helper()
	a, b, stop, err := rcPipe("tcp4", "127.0.0.1:0", lo, do)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return a, b
}

// TestRCConnNettest is golang.org/x/net/nettest's conformance suite for
// a net.Conn: basic I/O, ping-pong, racy reads and writes, every kind of
// deadline, Close while blocked, concurrent methods.
func TestRCConnNettest(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b, stop, err := rcPipe("tcp4", "127.0.0.1:0", nil, nil)
		if err != nil {
			return nil, nil, nil, err
		}
		return a, b, stop, nil
	})
}

// A small message size and depth make the credits and segmentation work
// hard: the suite again.
func TestRCConnNettestSmall(t *testing.T) {
	o := &RCOptions{RecvDepth: 4, MessageSize: 256}
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b, stop, err := rcPipe("tcp4", "127.0.0.1:0", o, o)
		if err != nil {
			return nil, nil, nil, err
		}
		return a, b, stop, nil
	})
}

// TestRCConnLarge streams 8 MiB each way at once in uneven writes and
// reads (two writers, each also the other's reader: the credits of one
// direction must not wait on the other's), then half-closes.
func TestRCConnLarge(t *testing.T) {
	a, b := rcPair(t, nil, nil)
	const size = 8 << 20
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 7 / 3)
	}
	var wg sync.WaitGroup
	send := func(c *RCConn) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for off := 0; off < size; {
			n := min(size-off, 1+rng.IntN(300000))
			if k, err := c.Write(src[off : off+n]); err != nil || k != n {
				t.Errorf("write: %d of %d, %v", k, n, err)
				return
			}
			off += n
		}
		if err := c.CloseWrite(); err != nil {
			t.Errorf("CloseWrite: %v", err)
		}
	}
	recv := func(c *RCConn, got *[]byte) {
		defer wg.Done()
		buf := make([]byte, 100000)
		for {
			n, err := c.Read(buf[:1+len(*got)%len(buf)])
			*got = append(*got, buf[:n]...)
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Errorf("read: %v", err)
				return
			}
		}
	}
	var ga, gb []byte
	wg.Add(4)
	a.SetDeadline(time.Now().Add(60 * time.Second))
	b.SetDeadline(time.Now().Add(60 * time.Second))
	go send(a)
	go send(b)
	go recv(a, &ga)
	go recv(b, &gb)
	wg.Wait()
	if !bytes.Equal(ga, src) || !bytes.Equal(gb, src) {
		t.Fatalf("stream differs: %d and %d bytes", len(ga), len(gb))
	}
	// After CloseWrite, writing fails with EPIPE.
	if _, err := a.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	if a.Device().Stats().RCFPDUsReceived.Load() == 0 {
		t.Fatal("the stream did not go through the RC stack")
	}
}

// TestRCConnManySmall sends 20000 one-to-nine-byte writes while the
// reader is slow to start: the writer waits for credits, nothing is lost
// or reordered.
func TestRCConnManySmall(t *testing.T) {
	a, b := rcPair(t, &RCOptions{RecvDepth: 8}, &RCOptions{RecvDepth: 8})
	const n = 20000
	var want bytes.Buffer
	go func() {
		for i := range n {
			msg := bytes.Repeat([]byte{byte(i)}, 1+i%9)
			if _, err := a.Write(msg); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
		a.CloseWrite()
	}()
	for i := range n {
		want.Write(bytes.Repeat([]byte{byte(i)}, 1+i%9))
	}
	waitFor(t, "the writer to run out of credits", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.credits == 0 })
	b.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(b)
	if err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("read %d of %d bytes: %v", len(got), want.Len(), err)
	}
}

func TestRCConnDeadlinesAndClose(t *testing.T) {
	a, b := rcPair(t, nil, &RCOptions{RecvDepth: 4, MessageSize: 1024}) // a grants b little
	buf := make([]byte, 10)
	// Past deadline: at once, even for a blocked read.
	a.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := a.Read(buf); !os.IsTimeout(err) {
		t.Fatalf("past deadline: %v", err)
	}
	a.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := a.Read(buf)
		done <- err
	}()
	parked.Wait(t, "(*RCConn).Read") // the read is blocked: what follows is tested on it
	start := time.Now()
	a.SetReadDeadline(time.Now().Add(-time.Second))
	if err := <-done; !os.IsTimeout(err) || time.Since(start) > time.Second {
		t.Fatalf("interrupted read: %v after %v", err, time.Since(start))
	}
	// A write blocked on credits (b does not read) times out, having sent
	// what the credits allowed.
	b.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := b.Write(make([]byte, 1<<20))
	if !os.IsTimeout(err) || n == 0 || n >= 1<<20 {
		t.Fatalf("blocked write: %d, %v", n, err)
	}
	// Close while a read and a write are blocked unblocks both.
	b.SetWriteDeadline(time.Time{})
	a.SetReadDeadline(time.Time{})
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, werr = b.Write(make([]byte, 1<<20))
	}()
	parked.Wait(t, "(*RCConn).Write") // blocked on credits: Close is tested on it
	start = time.Now()
	b.Close()
	wg.Wait()
	if !errors.Is(werr, net.ErrClosed) || time.Since(start) > 3*time.Second {
		t.Fatalf("write blocked at close: %v after %v", werr, time.Since(start))
	}
	if _, err := b.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := b.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}
	// The peer reads what b sent, then io.EOF.
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(a)
	if err != nil || n > len(got) {
		t.Fatalf("the peer read %d bytes (%d sent before the timeout), then %v", len(got), n, err)
	}
}

// TestRCConnPeerVanishes: the peer's device closes under it (no FIN):
// reads and writes fail with ErrConnLost (ECONNRESET), not hang.
func TestRCConnPeerVanishes(t *testing.T) {
	a, b := rcPair(t, nil, nil)
	if _, err := a.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b.dev.Close() // as a crashed process: TCP ends, no FIN message
	a.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 10)
	_, err := a.Read(buf)
	if !errors.Is(err, syscall.ECONNRESET) || !errors.Is(err, ErrConnLost) {
		t.Fatalf("read from a vanished peer: %v", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, ErrConnLost) {
		t.Fatalf("write to a vanished peer: %v", err)
	}
}

func TestRCConnAddrsAndIPv6(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}, {"tcp", "localhost:0"}} {
		a, b, stop, err := rcPipe(tc.network, tc.addr, nil, nil)
		if err != nil {
			if tc.network == "tcp6" && !nettest.SupportsIPv6() {
				continue
			}
			t.Fatalf("%s: %v", tc.network, err)
		}
		if a.LocalAddr().String() != b.RemoteAddr().String() || a.RemoteAddr().String() != b.LocalAddr().String() {
			t.Errorf("%s: a %v -> %v, b %v -> %v", tc.network, a.LocalAddr(), a.RemoteAddr(), b.LocalAddr(), b.RemoteAddr())
		}
		if _, err := a.Write([]byte("ping")); err != nil {
			t.Error(err)
		}
		buf := make([]byte, 4)
		b.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "ping" {
			t.Errorf("%s: %q %v", tc.network, buf, err)
		}
		stop()
	}
}

func TestRCConnBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tc := range []struct {
		network, addr string
		o             *RCOptions
	}{
		{"udp", "127.0.0.1:1", nil},
		{"tcp4", "[::1]:1", nil},
		{"tcp", "no port", nil},
		{"tcp", "127.0.0.1:1", &RCOptions{RecvDepth: 2}},
		{"tcp", "127.0.0.1:1", &RCOptions{MessageSize: 100000}},
		{"tcp", "127.0.0.1:1", &RCOptions{RecvDepth: -1}},
	} {
		if c, err := DialRC(ctx, tc.network, tc.addr, tc.o); err == nil {
			c.Close()
			t.Errorf("DialRC(%q, %q, %+v) succeeded", tc.network, tc.addr, tc.o)
		} else {
			t.Logf("DialRC(%q, %q): %v", tc.network, tc.addr, err)
		}
		if l, err := ListenRC(tc.network, tc.addr, tc.o); err == nil && tc.network != "tcp" {
			l.Close()
			t.Errorf("ListenRC(%q, %q) succeeded", tc.network, tc.addr)
		} else if err == nil {
			l.Close()
		}
	}
	// Nothing listening: refused at once.
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if _, err := DialRC(ctx, "tcp4", addr, nil); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial to nothing: %v", err)
	}
	// A TCP server that never answers the MPA Request: the dial's context
	// ends it.
	ln, _ = net.Listen("tcp4", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	start := time.Now()
	if _, err := DialRC(short, "tcp4", ln.Addr().String(), nil); err == nil || time.Since(start) > 3*time.Second {
		t.Errorf("dial to a silent server: %v after %v", err, time.Since(start))
	}
	// A listener closed while Accept waits: Accept returns ErrClosed.
	l, err := ListenRC("tcp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		errc <- err
	}()
	parked.Wait(t, "(*RCListener).AcceptRC") // blocked: Close is tested on it
	l.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
}

// TestDialListen goes through the net-style entry points: Listen and
// Dial on "tcp" give an RC stream, Dial on "udp4" a connected datagram
// socket, and networks without a udiwarp meaning a clear error.
func TestDialListen(t *testing.T) {
	l, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*RCConn); !ok {
		t.Fatalf("Dial(tcp) gave %T, not *RCConn", c)
	}
	msg := bytes.Repeat([]byte("udiwarp "), 1000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %v", err)
	}

	pc, err := ListenPacket("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	u, err := Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, ok := u.(*Conn); !ok {
		t.Fatalf("Dial(udp4) gave %T, not *Conn", u)
	}
	if _, err := u.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, from, err := pc.ReadFrom(buf); err != nil || string(buf[:n]) != "ping" || from.String() != u.LocalAddr().String() {
		t.Fatalf("datagram %q from %v: %v", buf[:n], from, err)
	}

	var unknown net.UnknownNetworkError
	if _, err := Listen("udp", "127.0.0.1:0"); !errors.As(err, &unknown) {
		t.Fatalf("Listen(udp): %v", err)
	}
	if _, err := Dial("unix", "/tmp/x"); !errors.As(err, &unknown) {
		t.Fatalf("Dial(unix): %v", err)
	}
}

// TestRCConnCloseAfterCloseWrite: a writer that writes, calls CloseWrite
// and then Close at once (udstream's sender does) loses nothing: the
// reader, slow to read, gets every byte and then io.EOF. Close waited
// for the FIN only when Close itself sent it; after CloseWrite it closed
// the device with data still queued behind TCP, and the reader saw a
// short stream and a reset.
func TestRCConnCloseAfterCloseWrite(t *testing.T) {
	for round := range 3 {
		// Credits for 512 messages of 64 KiB: more than TCP's buffers
		// hold, so the rest waits in the stack's queue.
		o := &RCOptions{RecvDepth: 512}
		a, b := rcPair(t, o, o)
		const size = 32 << 20
		src := make([]byte, size)
		for i := range src {
			src[i] = byte(i*13 + round)
		}
		done := make(chan error, 1)
		go func() {
			for off := 0; off < size; off += 64 << 10 {
				if _, err := a.Write(src[off : off+64<<10]); err != nil {
					done <- err
					return
				}
			}
			if err := a.CloseWrite(); err != nil {
				done <- err
				return
			}
			done <- a.Close()
		}()
		var got []byte
		buf := make([]byte, 32<<10)
		var rerr error
		for {
			// A hang guard, not a speed limit: 30 s without a byte
			// (a loaded machine under -race moved 27 MiB in 30 s).
			b.SetReadDeadline(time.Now().Add(30 * time.Second))
			n, err := b.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				rerr = err
				break
			}
			if len(got)%(1<<20) < len(buf) {
				time.Sleep(5 * time.Millisecond) // a slow reader: the writer's data waits in the stack
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: the writer: %v", round, err)
		}
		if rerr != io.EOF || !bytes.Equal(got, src) {
			t.Fatalf("round %d: read %d of %d bytes, then %v", round, len(got), size, rerr)
		}
	}
}
