package socketshim

import (
	"bytes"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/shim"
	"github.com/udiwarp/udiwarp/qp"
)

// busyWithin bounds how long a busy-poll call may take to see what
// arrived once it waits: generous, for a loaded machine.
const busyWithin = 10 * time.Second

// waitParked waits until a wait of shim.Park begun after the count
// before has gone on past its spin: the call the test started waits.
func waitParked(t *testing.T, before int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); shim.Parks() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call never went on waiting past its spin")
		}
	}
}

// TestBusyPacketConnReadFromWakes: a ReadFrom with no deadline on a
// busy-poll PacketConn (no BusyPollThread: nothing but its callers reads
// its socket) waits past its spin, and only then does a peer send. The
// wait itself must read the socket: the datagram is returned. UD and
// Reliable (on RD the wait also answers the peer's handshake).
func TestBusyPacketConnReadFromWakes(t *testing.T) {
	for _, reliable := range []bool{false, true} {
		name := "UD"
		if reliable {
			name = "RD"
		}
		t.Run(name, func(t *testing.T) {
			r, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: reliable, Linger: -1, Device: qp.DeviceConfig{Poll: qp.PollBusy}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() }) // wakes a reader that never saw it (Close waits for it)
			s, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: reliable, Linger: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			type result struct {
				n    int
				from string
				err  error
			}
			got := make(chan result, 1)
			buf := make([]byte, 100)
			before := shim.Parks()
			go func() {
				n, from, err := r.ReadFrom(buf)
				res := result{n: n, err: err}
				if from != nil {
					res.from = from.String()
				}
				got <- res
			}()
			waitParked(t, before)
			if k := r.Device().Stats().RxDatagrams.Load(); k != 0 {
				t.Fatalf("the reader read %d datagrams before the peer sent", k)
			}
			msg := []byte("sent once the reader waits")
			if _, err := s.WriteTo(msg, r.LocalAddr()); err != nil {
				t.Fatal(err)
			}
			select {
			case res := <-got:
				if res.err != nil || !bytes.Equal(buf[:res.n], msg) || res.from != s.LocalAddr().String() {
					t.Fatalf("ReadFrom: %d bytes %q from %s, %v", res.n, buf[:res.n], res.from, res.err)
				}
			case <-time.After(busyWithin):
				t.Fatalf("a busy-poll ReadFrom with no deadline did not see a datagram sent after it began to wait, in %v (the reader's device read %d datagrams)",
					busyWithin, r.Device().Stats().RxDatagrams.Load())
			}
		})
	}
}

// TestBusyPacketConnWriteToWaitsForSlot: a WriteTo on a busy-poll
// Reliable PacketConn with one send slot waits for the slot its first
// datagram holds until the peer acknowledges it; the peer (busy-poll
// too) reads nothing until the writer waits past its spin. The writer's
// wait must read the peer's handshake and acknowledgement: both
// datagrams arrive, in order, and the WriteTo returns.
func TestBusyPacketConnWriteToWaitsForSlot(t *testing.T) {
	busy := qp.DeviceConfig{Poll: qp.PollBusy}
	b, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, Linger: -1, Device: busy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	a, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: true, SendSlots: 1, Linger: -1, Device: busy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() }) // wakes a writer that never got its slot
	if _, err := a.WriteTo([]byte{1}, b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	before := shim.Parks()
	wrote := make(chan error, 1)
	go func() {
		_, err := a.WriteTo([]byte{2}, b.LocalAddr())
		wrote <- err
	}()
	waitParked(t, before)
	if k := b.Device().Stats().RxDatagrams.Load(); k != 0 {
		t.Fatalf("the peer read %d datagrams before the writer waited", k)
	}
	buf := make([]byte, 10)
	deadline := time.Now().Add(busyWithin)
	for i := byte(1); i <= 2; i++ {
		if n, err := readPolled(b, buf, deadline); err != nil || n != 1 || buf[0] != i {
			t.Fatalf("datagram %d at the peer: %d bytes, first %d, %v (the writer's device read %d datagrams)",
				i, n, buf[0], err, a.Device().Stats().RxDatagrams.Load())
		}
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the WriteTo that waited for a slot: %v", err)
		}
	case <-time.After(busyWithin):
		t.Fatal("the WriteTo that waited for a slot did not return")
	}
}

// readAfterParked starts read, waits until it waits past its spin, then
// runs write (in a goroutine: it may wait for the reader's answers), and
// fails unless read returns want within busyWithin. read's side is a
// busy-poll device without BusyPollThread: only read's wait reads it.
func readAfterParked(t *testing.T, dev *qp.Device, read func([]byte) (int, error), write func() error, want []byte) {
	t.Helper()
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	buf := make([]byte, 100)
	before := shim.Parks()
	go func() {
		n, err := read(buf)
		got <- result{n, err}
	}()
	waitParked(t, before)
	rx := dev.Stats().RxDatagrams.Load()
	wrote := make(chan error, 1)
	go func() { wrote <- write() }()
	select {
	case res := <-got:
		if res.err != nil || !bytes.Equal(buf[:res.n], want) {
			t.Fatalf("read: %d bytes %q, %v", res.n, buf[:res.n], res.err)
		}
	case <-time.After(busyWithin):
		t.Fatalf("a busy-poll read with no deadline did not see what was written after it began to wait, in %v (its device read %d datagrams meanwhile)",
			busyWithin, dev.Stats().RxDatagrams.Load()-rx)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("write: %v", err)
		}
	case <-time.After(busyWithin):
		t.Fatal("the write did not return")
	}
}

// TestBusyRCConnReadWakes: a Read with no deadline on a busy-poll RC
// stream waits past its spin before the peer writes; its wait reads the
// connection: the bytes are returned.
func TestBusyRCConnReadWakes(t *testing.T) {
	a, b := rcPair(t, nil, &RCOptions{Device: qp.DeviceConfig{Poll: qp.PollBusy}})
	msg := []byte("written once the reader waits")
	readAfterParked(t, a.Device(), a.Read, func() error { _, err := b.Write(msg); return err }, msg)
}

// TestBusyWRConnReadFromWakes: a ReadFrom with no deadline on a
// busy-poll Write-Record socket waits past its spin before the peer
// writes; its wait answers the peer's handshake and reads the record.
func TestBusyWRConnReadFromWakes(t *testing.T) {
	a, b := wrPair(t, &WROptions{Device: qp.DeviceConfig{Poll: qp.PollBusy}}, nil)
	msg := []byte("written once the reader waits")
	read := func(buf []byte) (int, error) { n, _, err := a.ReadFrom(buf); return n, err }
	readAfterParked(t, a.Device(), read, func() error { _, err := b.WriteTo(msg, a.LocalAddr()); return err }, msg)
}
