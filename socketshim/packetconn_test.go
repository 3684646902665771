package socketshim

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/udiwarp/udiwarp/internal/parked"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/reliability"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pair(t *testing.T) (a, b *PacketConn) {
	t.Helper()
	var err error
	if a, err = ListenPacket("udp4", "127.0.0.1:0", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if b, err = ListenPacket("udp4", "127.0.0.1:0", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

func TestPacketConnEcho(t *testing.T) {
	a, b := pair(t)
	buf := make([]byte, 70000)
	for _, n := range []int{0, 1, 100, 512, 513, 1400, 9000, 65000} {
		msg := bytes.Repeat([]byte{byte(n)}, n)
		if k, err := a.WriteTo(msg, b.LocalAddr()); err != nil || k != n {
			t.Fatalf("write %d: %d, %v", n, k, err)
		}
		b.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, from, err := b.ReadFrom(buf)
		if err != nil || k != n || !bytes.Equal(buf[:k], msg) {
			t.Fatalf("read %d: %d, %v", n, k, err)
		}
		if from.String() != a.LocalAddr().String() {
			t.Fatalf("source %v, want %v", from, a.LocalAddr())
		}
		// and back, to the address the read returned
		if _, err := b.WriteTo(msg, from); err != nil {
			t.Fatal(err)
		}
		a.SetReadDeadline(time.Now().Add(5 * time.Second))
		if k, _, err := a.ReadFrom(buf); err != nil || k != n {
			t.Fatalf("echo %d: %d, %v", n, k, err)
		}
	}
	// A datagram longer than the buffer is cut, as UDP does.
	a.WriteTo(bytes.Repeat([]byte{7}, 100), b.LocalAddr())
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	small := make([]byte, 10)
	if k, _, err := b.ReadFrom(small); err != nil || k != 10 {
		t.Fatalf("truncated read: %d, %v", k, err)
	}
	// Too long for a datagram: an error, nothing sent.
	if _, err := a.WriteTo(make([]byte, 70000), b.LocalAddr()); err == nil {
		t.Fatal("a 70000-byte datagram was accepted")
	}
	if a.Device().Stats().RxDatagrams.Load() == 0 || b.Device().Stats().TxDatagrams.Load() == 0 {
		t.Fatal("the traffic did not go through the stack")
	}
}

func TestPacketConnDeadlines(t *testing.T) {
	a, _ := pair(t)
	buf := make([]byte, 100)
	// An expired deadline fails at once with a timeout.
	a.SetReadDeadline(time.Now().Add(-time.Second))
	_, _, err := a.ReadFrom(buf)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !os.IsTimeout(err) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past deadline: %v", err)
	}
	// A future one times out when it passes.
	start := time.Now()
	a.SetReadDeadline(start.Add(50 * time.Millisecond))
	if _, _, err = a.ReadFrom(buf); !os.IsTimeout(err) {
		t.Fatalf("deadline: %v", err)
	}
	if el := time.Since(start); el < 45*time.Millisecond || el > 2*time.Second {
		t.Fatalf("timed out after %v", el)
	}
	// A deadline set in the past while a read is blocked interrupts it at
	// once (quic-go relies on this to unblock its reader).
	a.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, _, err := a.ReadFrom(buf)
		done <- err
	}()
	parked.Wait(t, "(*PacketConn).ReadFrom") // the read is blocked: what follows is tested on it
	a.SetReadDeadline(time.Now().Add(-time.Second))
	select {
	case err := <-done:
		if !os.IsTimeout(err) {
			t.Fatalf("interrupted read: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a deadline in the past did not interrupt the blocked read")
	}
	// A deadline moved later while blocked lets the read go on.
	a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	go func() {
		_, _, err := a.ReadFrom(buf)
		done <- err
	}()
	a.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	start = time.Now()
	if err := <-done; !os.IsTimeout(err) || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("moved deadline: %v after %v", err, time.Since(start))
	}
}

func TestPacketConnCloseUnblocks(t *testing.T) {
	a, err := ListenPacket("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var rerr error
	go func() {
		defer wg.Done()
		_, _, rerr = a.ReadFrom(make([]byte, 10))
	}()
	parked.Wait(t, "(*PacketConn).ReadFrom") // the read is blocked: what follows is tested on it
	a.Close()
	wg.Wait()
	if !errors.Is(rerr, net.ErrClosed) {
		t.Fatalf("read after close: %v", rerr)
	}
	if _, err := a.WriteTo([]byte("x"), a.LocalAddr()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if err := a.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}
}

// TestPacketConnMany sends more datagrams than the receive depth while
// the reader is slow: what exceeds it is dropped like a full socket
// buffer, the rest arrive intact.
func TestPacketConnMany(t *testing.T) {
	a, b := pair(t)
	const n = 1000
	for i := range n {
		msg := []byte{byte(i), byte(i >> 8)}
		if _, err := a.WriteTo(append(msg, make([]byte, 600)...), b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	// b has read every datagram (its socket's buffer holds them all) and
	// handled it: each took a receive, or found none posted past the
	// depth and was dropped (RxNoRecv). What it completed is in its CQ,
	// which reads that do not wait (a deadline passed already) take.
	st := b.Device().Stats()
	for end := time.Now().Add(30 * time.Second); st.RxDatagrams.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("b read %d of %d datagrams", st.RxDatagrams.Load(), n)
		}
	}
	b.sock.Progress(1) // once the batch in hand is handled
	buf := make([]byte, 2000)
	got := 0
	b.SetReadDeadline(time.Now().Add(-time.Second))
	for {
		k, _, err := b.ReadFrom(buf)
		if err != nil {
			if !os.IsTimeout(err) {
				t.Fatal(err)
			}
			break
		}
		if k != 602 {
			t.Fatalf("a %d-byte datagram", k)
		}
		got++
	}
	t.Logf("%d of %d read, %d dropped without a receive", got, n, st.RxNoRecv.Load())
	if got < 256 {
		t.Fatalf("only %d datagrams", got)
	}
	if got+int(st.RxNoRecv.Load()) != n {
		t.Fatalf("%d read, %d dropped without a receive: %d of %d datagrams", got, st.RxNoRecv.Load(), got+int(st.RxNoRecv.Load()), n)
	}
}

// TestReliablePacketConn runs the PacketConn over RD through 10 % loss
// both ways: every datagram arrives, once and in order.
func TestReliablePacketConn(t *testing.T) {
	mk := func(seed uint64) *PacketConn {
		c, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, Device: qp.DeviceConfig{Impair: &qp.Impairment{Seed: seed, Loss: 0.1}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := mk(1), mk(2)
	const n = 300
	go func() {
		for i := range n {
			msg := make([]byte, 1+i*7%1500)
			msg[0] = byte(i)
			if _, err := a.WriteTo(msg, b.LocalAddr()); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
	}()
	buf := make([]byte, 2000)
	for i := range n {
		b.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, _, err := b.ReadFrom(buf)
		if err != nil || k != 1+i*7%1500 || buf[0] != byte(i) {
			t.Fatalf("datagram %d: %d bytes, first %d, %v", i, k, buf[0], err)
		}
	}
	if a.Device().Stats().RDRetransmits.Load() == 0 {
		t.Fatal("nothing was retransmitted: the loss did not act")
	}
}

// TestReliablePacketConnSmallWrites sends many more small (inline)
// datagrams over RD than the send CQ holds: their completions, which come
// as the peer acknowledges, must be reaped as they come, or the CQ
// overflows and the QP stops.
func TestReliablePacketConnSmallWrites(t *testing.T) {
	mk := func() *PacketConn {
		c, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, SendSlots: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := mk(), mk()
	const n = 2000
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := a.WriteTo([]byte{byte(i), byte(i >> 8), 3, 4}, b.LocalAddr()); err != nil {
				errc <- fmt.Errorf("write %d: %w", i, err)
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 100)
	for i := range n {
		b.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, _, err := b.ReadFrom(buf)
		if err != nil || k != 4 || int(buf[0])|int(buf[1])<<8 != i&0xffff {
			t.Fatalf("datagram %d: %d bytes %x, %v", i, k, buf[:k], err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-a.Device().Events():
		t.Fatalf("sender's device raised %v", ev)
	default:
	}
}

// TestReliablePacketConnPeerGone: a Reliable PacketConn writing to a peer
// that went away (closed: nothing acknowledges, the retries run out) gets
// an error from a later WriteTo to it, naming the destination and the
// completion status, not nil for ever.
func TestReliablePacketConnPeerGone(t *testing.T) {
	mk := func() *PacketConn {
		// Few, short retries: the peer is given up on soon.
		rd := qp.RDConfig{Config: reliability.Config{MaxRetries: 2, InitialRTT: time.Millisecond, MaxRTO: 20 * time.Millisecond}}
		c, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, SendSlots: 8, RD: rd})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := mk(), mk()
	buf := make([]byte, 100)
	if _, err := a.WriteTo([]byte("hello"), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := b.ReadFrom(buf); err != nil {
		t.Fatal(err)
	}
	dst := b.LocalAddr()
	b.Close()
	deadline := time.Now().Add(60 * time.Second)
	var err error
	for i := 0; err == nil; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes to a closed peer, every one nil", i)
		}
		a.SetWriteDeadline(time.Now().Add(10 * time.Second))
		msg := []byte("x")
		if i%2 == 1 {
			msg = make([]byte, 1000) // a slot's send, not inline
		}
		_, err = a.WriteTo(msg, dst)
		if err == nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Logf("%v", err)
	var se *SendError
	var oe *net.OpError
	if !errors.As(err, &se) || se.Status == qp.Success || se.Status == qp.WRFlushError || se.Count < 1 || se.Addr.String() != dst.String() ||
		!errors.As(err, &oe) || oe.Addr == nil || oe.Addr.String() != dst.String() {
		t.Fatalf("a write to a closed peer: %v (%#v)", err, se)
	}
}
