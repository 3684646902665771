package socketshim

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/reliability"
)

// readPolled reads the next datagram from c, which may be on a busy-poll
// device with no poller thread (its socket is read only while its reader
// polls): short reads, again and again, until deadline.
func readPolled(c *PacketConn, buf []byte, deadline time.Time) (int, error) {
	for {
		c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		n, _, err := c.ReadFrom(buf)
		if !os.IsTimeout(err) || time.Now().After(deadline) {
			return n, err
		}
	}
}

// blackhole is a UDP socket that nobody reads: a Reliable peer that never
// answers.
func blackhole(t *testing.T) *net.UDPAddr {
	t.Helper()
	h, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h.LocalAddr().(*net.UDPAddr)
}

// waitClosing waits until c's Close has begun (its reads and writes fail).
func waitClosing(t *testing.T, c *PacketConn) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !c.isClosed(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Close did not begin")
		}
	}
}

// TestReliablePacketConnCloseDelivers: a writer writes n datagrams to a
// Reliable peer and closes at once, while every one of them still waits
// for the peer's answer to its Hello (the peer's busy-poll device reads
// its socket only when it is read, which the test does only once the
// writer's Close has begun). Close waits for RD to deliver them: the peer
// gets all n, in order, and Close returns nil. The writer runs in both
// polling modes: on a busy-poll device nothing but Close's own wait reads
// the acknowledgements.
func TestReliablePacketConnCloseDelivers(t *testing.T) {
	for _, mode := range []qp.PollMode{qp.PollEvent, qp.PollBusy} {
		t.Run(mode.String(), func(t *testing.T) {
			b, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, Device: qp.DeviceConfig{Poll: qp.PollBusy}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			// Hellos resent for far longer than the test waits (up to 1 s
			// apart, 60 times): the handshake does not give up under load.
			rd := qp.RDConfig{Config: reliability.Config{MaxRetries: 60}}
			a, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, RD: rd, Linger: 30 * time.Second, Device: qp.DeviceConfig{Poll: mode}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.Close() })
			const n = 20
			for i := range n {
				msg := make([]byte, 1+i*97) // inline ones and a slot's
				msg[0] = byte(i)
				if _, err := a.WriteTo(msg, b.LocalAddr()); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			if !a.q.SendQueued() {
				t.Fatal("RD holds nothing at Close: the test does not reach the path")
			}
			closed := make(chan error, 1)
			go func() { closed <- a.Close() }()
			waitClosing(t, a)
			if got := b.Device().Stats().RxDatagrams.Load(); got != 0 {
				t.Fatalf("the peer read %d datagrams before the writer's Close began", got)
			}
			buf := make([]byte, 3000)
			deadline := time.Now().Add(30 * time.Second)
			for i := range n {
				k, err := readPolled(b, buf, deadline)
				if err != nil || k != 1+i*97 || buf[0] != byte(i) {
					t.Fatalf("datagram %d of %d: %d bytes, first %d, %v", i, n, k, buf[0], err)
				}
			}
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close after every datagram arrived: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not return")
			}
		})
	}
}

// TestReliablePacketConnCloseGivesUp: the peer never answers. Close waits
// for Options.Linger and no longer, and returns an error naming the n
// datagrams RD still held; a ReadFrom blocked in another goroutine
// returns at once, while Close waits.
func TestReliablePacketConnCloseGivesUp(t *testing.T) {
	hole := blackhole(t)
	const linger = 2 * time.Second
	// The handshake outlasts the linger: the datagrams stay pending.
	rd := qp.RDConfig{Config: reliability.Config{InitialRTT: 100 * time.Millisecond, MaxRetries: 60}}
	a, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, RD: rd, Linger: linger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	const n = 10
	for i := range n {
		if _, err := a.WriteTo([]byte{byte(i)}, hole); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	read := make(chan error, 1)
	go func() {
		_, _, err := a.ReadFrom(make([]byte, 10))
		read <- err
	}()
	for a.rmu.TryLock() { // until the reader is in ReadFrom
		a.rmu.Unlock()
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-read:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a read blocked at Close: %v", err)
		}
	case <-time.After(linger + 10*time.Second):
		t.Fatal("Close did not unblock ReadFrom")
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned before the blocked read did, or before the linger ran out: %v", err)
	default:
	}
	var cerr error
	select {
	case cerr = <-closed:
	case <-time.After(linger + 10*time.Second):
		t.Fatal("Close did not return")
	}
	el := time.Since(start)
	t.Logf("Close after %v: %v", el, cerr)
	if el < linger-100*time.Millisecond || el > linger+5*time.Second {
		t.Fatalf("Close returned after %v, linger %v", el, linger)
	}
	var ue *UndeliveredError
	var oe *net.OpError
	if !errors.As(cerr, &ue) || ue.Pending != n || ue.Failed != 0 || !errors.As(cerr, &oe) || oe.Op != "close" {
		t.Fatalf("Close with %d datagrams unanswered: %v (%#v)", n, cerr, ue)
	}
}

// TestReliablePacketConnCloseNoLinger: with a negative Linger, Close
// waits for nothing and drops what RD holds, and says how much.
func TestReliablePacketConnCloseNoLinger(t *testing.T) {
	hole := blackhole(t)
	a, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	const n = 5
	for i := range n {
		if _, err := a.WriteTo([]byte{byte(i)}, hole); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	start := time.Now()
	cerr := a.Close()
	el := time.Since(start)
	t.Logf("Close after %v: %v", el, cerr)
	if el > time.Second { // the default linger is 5 s
		t.Fatalf("Close with a negative Linger took %v", el)
	}
	var ue *UndeliveredError
	if !errors.As(cerr, &ue) || ue.Pending != n {
		t.Fatalf("Close dropping %d datagrams: %v (%#v)", n, cerr, ue)
	}
}

// TestReliablePacketConnCloseReportsFailures: datagrams RD gave up on
// (the peer never answered) and no WriteTo reported are reported by
// Close, with their destination and status, once RD is done with them
// (within the default linger).
func TestReliablePacketConnCloseReportsFailures(t *testing.T) {
	hole := blackhole(t)
	rd := qp.RDConfig{Config: reliability.Config{MaxRetries: 1, InitialRTT: time.Millisecond, MaxRTO: 5 * time.Millisecond}}
	a, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, RD: rd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	const n = 10
	reported := 0 // failures a WriteTo reported (RD may give up while the test writes)
	for i := 0; i < n; {
		_, err := a.WriteTo([]byte{byte(i)}, hole)
		var se *SendError
		switch {
		case errors.As(err, &se):
			reported += se.Count
		case err != nil:
			t.Fatalf("write %d: %v", i, err)
		default:
			i++
		}
	}
	start := time.Now()
	cerr := a.Close()
	t.Logf("Close after %v: %v (%d reported by WriteTo)", time.Since(start), cerr, reported)
	var ue *UndeliveredError
	var se *SendError
	if !errors.As(cerr, &ue) || ue.Pending != 0 || ue.Failed < 1 || ue.Failed+reported != n ||
		len(ue.SendErrors) != 1 || ue.SendErrors[0].Count != ue.Failed || ue.SendErrors[0].Status != qp.RetryExceededError ||
		ue.SendErrors[0].Addr.String() != hole.String() || !errors.As(cerr, &se) {
		t.Fatalf("Close after %d datagrams failed unreported: %v (%#v)", n-reported, cerr, ue)
	}
}
