package socketshim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"github.com/udiwarp/udiwarp/internal/parked"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

func wrPair(t *testing.T, ao, bo *WROptions) (a, b *WRConn) {
	t.Helper()
	var err error
	if a, err = ListenWriteRecord("udp4", "127.0.0.1:0", ao); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if b, err = ListenWriteRecord("udp4", "127.0.0.1:0", bo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

// record is a datagram whose bytes say its number and length.
func record(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*31 + j*7)
	}
	if n >= 8 {
		binary.BigEndian.PutUint32(b, uint32(i))
		binary.BigEndian.PutUint32(b[4:], uint32(n))
	}
	return b
}

func checkRecord(b []byte) (int, bool) {
	if len(b) < 8 || int(binary.BigEndian.Uint32(b[4:])) != len(b) {
		return 0, false
	}
	i := int(binary.BigEndian.Uint32(b))
	return i, bytes.Equal(b, record(i, len(b)))
}

// TestWRConnEcho sends every size class (inline, copied, zero copy, the
// largest) each way and checks bytes and source, and that they went as
// Write-Records.
func TestWRConnEcho(t *testing.T) {
	a, b := wrPair(t, nil, nil)
	buf := make([]byte, 70000)
	for i, n := range []int{0, 1, 100, 504, 505, 1400, 9000, 16384, 16385, 65000, 65528} {
		msg := record(i, n)
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
		if _, err := b.WriteTo(msg, from); err != nil {
			t.Fatal(err)
		}
		a.SetReadDeadline(time.Now().Add(5 * time.Second))
		if k, _, err := a.ReadFrom(buf); err != nil || k != n || !bytes.Equal(buf[:k], msg) {
			t.Fatalf("echo %d: %d, %v", n, k, err)
		}
	}
	// Cut to the reader's buffer, as UDP does.
	a.WriteTo(record(1, 100), b.LocalAddr())
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if k, _, err := b.ReadFrom(buf[:10]); err != nil || k != 10 {
		t.Fatalf("truncated read: %d, %v", k, err)
	}
	// Too long for a slot: an error, nothing sent.
	if _, err := a.WriteTo(make([]byte, 65529), b.LocalAddr()); !errors.Is(err, errMessageTooLong) {
		t.Fatalf("a 65529-byte datagram: %v", err)
	}
	if b.Device().Stats().RxWRComplete.Load() < 12 || b.Device().Stats().RxDelivered.Load() > 10 {
		t.Fatalf("records %d, Sends %d: not Write-Records", b.Device().Stats().RxWRComplete.Load(), b.Device().Stats().RxDelivered.Load())
	}
}

// TestWRConnLargeSlots: datagrams larger than UDP's, each several
// Write-Record segments, into 1 MiB slots; the peer's slots bound what
// may be sent to it.
func TestWRConnLargeSlots(t *testing.T) {
	big := &WROptions{SlotSize: 1<<20 + 8, Slots: 4}
	a, b := wrPair(t, big, big)
	buf := make([]byte, 1<<20)
	for i, n := range []int{100000, 1 << 20} {
		msg := record(i, n)
		if _, err := a.WriteTo(msg, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		b.SetReadDeadline(time.Now().Add(5 * time.Second))
		if k, _, err := b.ReadFrom(buf); err != nil || !bytes.Equal(buf[:k], msg) {
			t.Fatalf("read %d: %d, %v", n, k, err)
		}
	}
	// A peer with smaller slots: refused with ErrPeerSlots.
	small, err := ListenWriteRecord("udp4", "127.0.0.1:0", &WROptions{SlotSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	a.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := a.WriteTo(make([]byte, 5000), small.LocalAddr()); !errors.Is(err, ErrPeerSlots) {
		t.Fatalf("too large for the peer: %v", err)
	}
	if _, err := a.WriteTo(make([]byte, 4000), small.LocalAddr()); err != nil {
		t.Fatal(err)
	}
}

// TestWRConnFastWriter: a writer far faster than its reader, through a
// ring of 4 slots and every size path. The credits hold it back: every
// record arrives, in order, intact — no slot rewritten before it was read.
func TestWRConnFastWriter(t *testing.T) {
	a, b := wrPair(t, &WROptions{CreditWait: 20 * time.Second}, &WROptions{Slots: 4})
	const n = 3000
	sizes := []int{8, 600, 20000, 40000}
	go func() {
		for i := range n {
			if _, err := a.WriteTo(record(i, sizes[i%len(sizes)]), b.LocalAddr()); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
	}()
	buf := make([]byte, 70000)
	waitFor(t, "the writer to fill the ring and wait", func() bool { return a.Stats().Probes.Load() > 0 }) // it probes as it begins to wait
	for i := range n {
		if i%500 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		b.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, _, err := b.ReadFrom(buf)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if j, ok := checkRecord(buf[:k]); !ok || j != i {
			t.Fatalf("record %d: got #%d (%d bytes, intact %v)", i, j, k, ok)
		}
	}
	if a.Stats().Dropped.Load() != 0 || b.Stats().Discarded.Load() != 0 {
		t.Fatalf("dropped %d, discarded %d", a.Stats().Dropped.Load(), b.Stats().Discarded.Load())
	}
}

// TestWRConnLoss runs 4-segment records through 10 % loss of every
// datagram the writer sends (records, HELLOs, PROBEs): records with a
// segment lost are never returned; what is returned is whole and in
// order; the writer never hangs (lost records are recovered from by
// probes and re-keyed rings).
func TestWRConnLoss(t *testing.T) {
	wo := &WROptions{SlotSize: 1 << 18, Slots: 4, CreditWait: 5 * time.Second,
		Device: qp.DeviceConfig{Impair: &qp.Impairment{Seed: 7, Loss: 0.1}}}
	a, b := wrPair(t, wo, &WROptions{SlotSize: 1 << 18, Slots: 4})
	const n = 400
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			a.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := a.WriteTo(record(i, 200000), b.LocalAddr()); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
	}()
	buf := make([]byte, 1<<18)
	got, last := 0, -1
	read := func() error {
		k, _, err := b.ReadFrom(buf)
		if err != nil {
			return err
		}
		j, ok := checkRecord(buf[:k])
		if !ok || j <= last {
			t.Fatalf("record #%d after #%d, %d bytes, intact %v", j, last, k, ok)
		}
		last = j
		got++
		return nil
	}
	// The reads (which give the writer its credits) end once the writer
	// is done and b has handled all it sent: the last write returned when
	// its send completed, after every earlier one's (the writer's loss
	// drops datagrams at once, and loopback queues the others at b as
	// they are sent), and b's socket has nothing left to read. The bound
	// only ends a hung test.
	b.SetReadDeadline(time.Now().Add(60 * time.Second))
	stop, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		select {
		case <-done:
		case <-stop:
			return
		}
		for b.pc.sock.Progress(64) > 0 {
		}
		b.SetReadDeadline(time.Now().Add(-time.Second))
	}()
	for read() == nil {
	}
	close(stop)
	<-ended
	<-done
	// Then the whole records b has queued, none of which the deadline
	// let the reads take.
	b.poll()
	b.mu.Lock()
	left := len(b.rq) - b.rqHead
	b.mu.Unlock()
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	for range left {
		if err := read(); err != nil {
			t.Fatalf("a queued record: %v", err)
		}
	}
	t.Logf("%d of %d records whole; writer: %d dropped, %d probes; reader: %d re-keys, %d discarded, stack partial/complete %d/%d",
		got, n, a.Stats().Dropped.Load(), a.Stats().Probes.Load(), b.Stats().Rekeys.Load(), b.Stats().Discarded.Load(),
		b.Device().Stats().RxWRPartial.Load(), b.Device().Stats().RxWRComplete.Load())
	if got < n/10 || got == n {
		t.Fatalf("%d of %d records arrived: the loss did not act, or nothing got through", got, n)
	}
}

func TestWRConnDeadlinesAndClose(t *testing.T) {
	a, _ := wrPair(t, nil, nil)
	buf := make([]byte, 100)
	a.SetReadDeadline(time.Now().Add(-time.Second))
	var ne net.Error
	if _, _, err := a.ReadFrom(buf); !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past deadline: %v", err)
	}
	start := time.Now()
	a.SetReadDeadline(start.Add(50 * time.Millisecond))
	if _, _, err := a.ReadFrom(buf); !os.IsTimeout(err) || time.Since(start) < 45*time.Millisecond {
		t.Fatalf("deadline: %v after %v", err, time.Since(start))
	}
	// A deadline set in the past interrupts a blocked read at once.
	a.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, _, err := a.ReadFrom(buf)
		done <- err
	}()
	parked.Wait(t, "(*WRConn).ReadFrom") // the read is blocked: what follows is tested on it
	start = time.Now()
	a.SetReadDeadline(time.Now().Add(-time.Second))
	if err := <-done; !os.IsTimeout(err) || time.Since(start) > time.Second {
		t.Fatalf("interrupted read: %v after %v", err, time.Since(start))
	}
	// A write waiting for a handshake no one answers: its deadline.
	silent, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	defer silent.Close()
	a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := a.WriteTo([]byte("x"), silent.LocalAddr()); !os.IsTimeout(err) {
		t.Fatalf("write to a silent peer, deadline: %v", err)
	}
	// Close unblocks a read and a write waiting for a handshake.
	a.SetDeadline(time.Time{})
	var wg sync.WaitGroup
	var rerr, werr error
	wg.Add(2)
	go func() { defer wg.Done(); _, _, rerr = a.ReadFrom(buf) }()
	go func() { defer wg.Done(); _, werr = a.WriteTo([]byte("x"), silent.LocalAddr()) }()
	parked.Wait(t, "(*WRConn).ReadFrom") // both blocked: Close is tested on them
	parked.Wait(t, "(*WRConn).WriteToUDPAddrPort")
	start = time.Now()
	a.Close()
	wg.Wait()
	if !errors.Is(rerr, net.ErrClosed) || !errors.Is(werr, net.ErrClosed) || time.Since(start) > time.Second {
		t.Fatalf("after Close: read %v, write %v, %v", rerr, werr, time.Since(start))
	}
	if err := a.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}
}

// TestWRConnPeerGone: a peer that never answers fails the handshake
// (ErrNoPeer within HandshakeTimeout); a peer that vanishes after it
// costs the writer CreditWait per datagram once its slots are used, then
// the datagram is dropped, as to a full UDP socket; the peer restarting
// on its address is found again.
func TestWRConnPeerGone(t *testing.T) {
	a, err := ListenWriteRecord("udp4", "127.0.0.1:0", &WROptions{HandshakeTimeout: 200 * time.Millisecond, CreditWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	silent, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	defer silent.Close()
	start := time.Now()
	_, err = a.WriteTo([]byte("x"), silent.LocalAddr())
	if !errors.Is(err, ErrNoPeer) || time.Since(start) > 2*time.Second {
		t.Fatalf("silent peer: %v after %v", err, time.Since(start))
	}
	// It reads as a sentence: who did not answer, and within what.
	if want := silent.LocalAddr().String() + " sent no answer within"; !strings.Contains(err.Error(), want) {
		t.Fatalf("%q does not say %q", err, want)
	}

	b, err := ListenWriteRecord("udp4", "127.0.0.1:0", &WROptions{Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	addr := b.LocalAddr().String()
	if _, err := a.WriteTo([]byte("hello"), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	b.Close()
	for i := range 6 {
		start := time.Now()
		if _, err := a.WriteTo(record(i, 100), b.LocalAddr()); err != nil || time.Since(start) > 2*time.Second {
			t.Fatalf("write %d to a vanished peer: %v after %v", i, err, time.Since(start))
		}
	}
	if a.Stats().Dropped.Load() == 0 {
		t.Fatal("nothing dropped")
	}
	// The peer comes back on its address: a new epoch, a new ring.
	b2, err := ListenWriteRecord("udp4", addr, &WROptions{Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 200)
		b2.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, _, err := b2.ReadFrom(buf)
		if err != nil {
			got <- -1
			return
		}
		j, _ := checkRecord(buf[:k])
		got <- j
	}()
	deadline := time.Now().Add(10 * time.Second)
	for i := 100; ; i++ {
		if _, err := a.WriteTo(record(i, 100), b2.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		select {
		case j := <-got:
			if j < 100 {
				t.Fatalf("the restarted peer read %d", j)
			}
			return
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted peer never got a record")
		}
	}
}

func TestWRConnBadInput(t *testing.T) {
	for _, tc := range []struct {
		network, addr string
		o             *WROptions
	}{
		{"tcp", "127.0.0.1:0", nil},
		{"udp4", "[::1]:0", nil},
		{"udp4", "127.0.0.1:0", &WROptions{Slots: 1}},
		{"udp4", "127.0.0.1:0", &WROptions{SlotSize: 32}},
		{"udp4", "127.0.0.1:0", &WROptions{SlotSize: 32 << 20}},
		{"udp4", "127.0.0.1:0", &WROptions{MaxPeers: -1}},
		{"udp4", "127.0.0.1:0", &WROptions{ZeroCopy: -5}},
	} {
		if c, err := ListenWriteRecord(tc.network, tc.addr, tc.o); err == nil {
			c.Close()
			t.Errorf("ListenWriteRecord(%q, %q, %+v) succeeded", tc.network, tc.addr, tc.o)
		} else {
			t.Logf("%v", err)
		}
	}
	a, b := wrPair(t, &WROptions{MaxPeers: 1}, nil)
	if _, err := a.WriteTo([]byte("x"), &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err == nil {
		t.Error("a write to port 0 succeeded")
	}
	if _, err := a.WriteTo([]byte("x"), &net.IPAddr{IP: net.IPv4(127, 0, 0, 1)}); err == nil {
		t.Error("a write to an IPAddr succeeded")
	}
	// MaxPeers: a second peer is refused at once.
	if _, err := a.WriteTo([]byte("x"), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteTo([]byte("x"), &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}); err == nil {
		t.Error("MaxPeers 1 took two peers")
	}
}

// wrLossyPair: a writer whose device drops 5 % of what it sends, cutting
// records into 1000-byte segments, and a reader with partial delivery.
func wrLossyPair(t *testing.T) (a, b *WRConn) {
	return wrPair(t,
		&WROptions{Segment: 1000, SlotSize: 1 << 16, Slots: 8, CreditWait: 5 * time.Second,
			Device: qp.DeviceConfig{Impair: &qp.Impairment{Seed: 11, Loss: 0.05}}},
		&WROptions{Segment: 1000, SlotSize: 1 << 16, Slots: 8, Partial: true, Deadline: 20 * time.Millisecond})
}

// writeRecords writes n records of size bytes from a to b in the
// background; the returned channel closes when it is done.
func writeRecords(t *testing.T, a, b *WRConn, n, size int) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			a.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := a.WriteTo(record(i, size), b.LocalAddr()); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
	}()
	return done
}

// TestWRConnPartial: with WROptions.Partial, ReadRecord returns every
// record, in order — whole, or partial with exactly the byte ranges that
// arrived (each range's bytes the writer's, the gaps zero) — so a lossy
// link costs the bytes lost, not the records they were in.
func TestWRConnPartial(t *testing.T) {
	a, b := wrLossyPair(t)
	const n, size = 200, 20000 // 20 segments a record
	done := writeRecords(t, a, b, n, size)
	buf := make([]byte, 1<<16)
	whole, partial := 0, 0
	var valid uint64
	for i := 0; i < n; i++ {
		b.SetReadDeadline(time.Now().Add(10 * time.Second))
		r, err := b.ReadRecord(buf)
		if err != nil {
			t.Fatalf("record %d: %v (whole %d, partial %d so far)", i, err, whole, partial)
		}
		if r.N != size || r.Addr != a.LocalAddr().(*net.UDPAddr).AddrPort() {
			t.Fatalf("record %d: %d bytes from %v", i, r.N, r.Addr)
		}
		want := record(i, size)
		if !r.Partial {
			if r.Valid != nil || !bytes.Equal(buf[:size], want) {
				t.Fatalf("whole record %d: not the writer's bytes (valid %v)", i, r.Valid)
			}
			whole++
			valid += size
			continue
		}
		partial++
		at := uint64(0)
		for _, v := range r.Valid {
			if v.Start < at || v.End <= v.Start || v.End > size {
				t.Fatalf("record %d: ranges %v not in order, disjoint and inside it", i, r.Valid)
			}
			if !bytes.Equal(buf[v.Start:v.End], want[v.Start:v.End]) || !allZero(buf[at:v.Start]) {
				t.Fatalf("record %d: range %v is not the writer's bytes, or the gap before it is not zero", i, v)
			}
			at = v.End
			valid += v.Len()
		}
		if !allZero(buf[at:size]) || valid == 0 {
			t.Fatalf("record %d: the tail after %d is not zero", i, at)
		}
	}
	<-done
	t.Logf("%d whole, %d partial; %.1f %% of the bytes valid; writer dropped %d", whole, partial, 100*float64(valid)/float64(n*size), a.Stats().Dropped.Load())
	if whole == 0 || partial == 0 || valid < n*size*8/10 {
		t.Fatalf("%d whole, %d partial, %d of %d bytes valid: the loss did not act, or partial delivery lost more than it should", whole, partial, valid, n*size)
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TestWRConnPartialReadFrom: ReadFrom returns whole datagrams only; the
// partial records a Partial socket receives are passed over and counted.
func TestWRConnPartialReadFrom(t *testing.T) {
	a, b := wrLossyPair(t)
	const n, size = 100, 20000
	done := writeRecords(t, a, b, n, size)
	buf := make([]byte, 1<<16)
	// The reads end once every record is accounted for, returned whole or
	// passed over and counted (each of the 20 segments of a record is lost
	// alone, never all); the bound only ends a hung test.
	var whole atomic.Uint64
	b.SetReadDeadline(time.Now().Add(30 * time.Second))
	stop, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		for whole.Load()+b.Stats().Discarded.Load() < n {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
		b.SetReadDeadline(time.Now().Add(-time.Second))
	}()
	for {
		k, _, err := b.ReadFrom(buf)
		if err != nil {
			break
		}
		if _, ok := checkRecord(buf[:k]); !ok || k != size {
			t.Fatalf("ReadFrom returned %d bytes that are not a whole record", k)
		}
		whole.Add(1)
	}
	close(stop)
	<-ended
	<-done
	if got, d := int(whole.Load()), b.Stats().Discarded.Load(); got == 0 || got == n || uint64(got)+d < n {
		t.Fatalf("%d whole of %d, %d discarded; reader %+v; device partial %d complete %d superseded-or-stale %d", got, n, d, statsOf(b), b.Device().Stats().RxWRPartial.Load(), b.Device().Stats().RxWRComplete.Load(), b.Device().Stats().RxWRStale.Load())
	}
}

func statsOf(c *WRConn) map[string]uint64 {
	s := c.Stats()
	return map[string]uint64{"dropped": s.Dropped.Load(), "discarded": s.Discarded.Load(), "overruns": s.Overruns.Load(),
		"rekeys": s.Rekeys.Load(), "probes": s.Probes.Load(), "credits": s.Credits.Load()}
}

// TestWRConnReliable: over RD (WROptions.Reliable) every size class
// arrives whole, in order, both ways, through a link that drops 5 % of
// each device's datagrams.
func TestWRConnReliable(t *testing.T) {
	lossy := func(seed uint64) *WROptions {
		return &WROptions{Reliable: true, Segment: 4000, CreditWait: 5 * time.Second,
			Device: qp.DeviceConfig{Impair: &qp.Impairment{Seed: seed, Loss: 0.05}}}
	}
	a, b := wrPair(t, lossy(1), lossy(2))
	buf := make([]byte, 70000)
	for round := range 3 {
		for i, n := range []int{0, 1, 100, 504, 505, 1400, 9000, 16384, 16385, 65000, 65528} {
			id := round*100 + i
			for _, dir := range [][2]*WRConn{{a, b}, {b, a}} {
				dir[0].SetWriteDeadline(time.Now().Add(10 * time.Second))
				if k, err := dir[0].WriteTo(record(id, n), dir[1].LocalAddr()); err != nil || k != n {
					t.Fatalf("write %d: %d, %v", n, k, err)
				}
				dir[1].SetReadDeadline(time.Now().Add(10 * time.Second))
				k, from, err := dir[1].ReadFrom(buf)
				if err != nil || k != n || from.String() != dir[0].LocalAddr().String() {
					t.Fatalf("read %d: %d from %v, %v", n, k, from, err)
				}
				if n >= 8 {
					if j, ok := checkRecord(buf[:k]); !ok || j != id {
						t.Fatalf("record %d of %d bytes: got #%d intact %v", id, n, j, ok)
					}
				}
			}
		}
	}
	if a.Device().Stats().RxRDFrames.Load() == 0 {
		t.Fatal("no RD frames: not over RD")
	}
}
