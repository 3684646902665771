package qp

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
)

// TestWaitBusyWithoutThread: on a busy-poll device without BusyPollThread
// nobody receives but the application, so CQ.Wait must drive the receive
// path itself. A datagram already in the socket, and one that arrives
// while Wait runs, both end the wait with their completion, long before
// the 30 s deadline (before the fix Wait parked until the deadline).
func TestWaitBusyWithoutThread(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{Poll: PollBusy}, "udp4", "127.0.0.1:0")
	ah := a.ah(b, b.qp)
	for i := range 2 {
		if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*100, 100)}}); err != nil {
			t.Fatal(err)
		}
	}
	wait := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return b.cq.Wait(ctx)
	}
	poll := func(id uint64) {
		t.Helper()
		var wc [1]WorkCompletion
		if n := b.cq.Poll(wc[:]); n != 1 || wc[0].ID != id || wc[0].Status != Success || string(b.buf[id*100:id*100+uint64(wc[0].Len)]) != "ready" {
			t.Fatalf("after Wait: %d completions, %+v", n, wc[0])
		}
	}

	// Ready: the datagram waits in b's socket before Wait is called. a's
	// send completion says it has left a's socket.
	if err := a.qp.PostSend(&SendWR{Flags: FlagSignaled, Inline: []byte("ready"), AH: ah}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq, 1)[0]; wc.Status != Success {
		t.Fatalf("send: %+v", wc)
	}
	if err := wait(); err != nil {
		t.Fatalf("Wait with a datagram ready: %v", err)
	}
	poll(0)

	// Arriving: the datagram is sent while Wait runs (or before it starts).
	done := make(chan error, 1)
	go func() { done <- wait() }()
	if err := a.qp.PostSend(&SendWR{Inline: []byte("ready"), AH: ah}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wait with a datagram arriving: %v", err)
	}
	poll(1)

	// A cancelled context still ends a busy Wait on an empty CQ.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.cq.Wait(ctx); err != context.Canceled {
		t.Fatalf("Wait on an empty CQ with a cancelled context: %v", err)
	}
}

// TestWriteRecordValidIsRegionOffsets checks what qp's docs say of
// WorkCompletion.Valid: it holds tagged offsets, and because regions are
// zero-based (MR.Addr() is 0) these are the region offsets the validity
// map holds — the same numbers, so a partial record's Valid is the map's
// content, and AggregateWriteRecords with base MR.Addr() builds the same
// map from CQ entries.
func TestWriteRecordValidIsRegionOffsets(t *testing.T) {
	b, region, q := wrTarget(t, writerecord.Config{Timeout: 20 * time.Millisecond, Policy: writerecord.DeliverPartial}, RecordBoth)
	if region.Addr() != 0 {
		t.Fatalf("MR.Addr() = %d, want 0 (zero-based regions)", region.Addr())
	}
	vm := region.TrackValidity(0)
	msg := make([]byte, 3000)
	fill(msg, 9)
	r := newRawWR(t, b, q)
	const off = 5000
	r.send(region.STag(), region.Addr()+off, 1, msg, 0, 1000) // the middle segment is lost
	r.send(region.STag(), region.Addr()+off, 1, msg, 2000, 1000)
	wc := waitWC(t, b.cq, 1)[0]
	want := []validitymap.Range{{Start: off, End: off + 1000}, {Start: off + 2000, End: off + 3000}}
	if !wc.Partial || wc.TO != off || !slices.Equal(wc.Valid, want) {
		t.Fatalf("completion: partial %v, TO %d, Valid %v; want Valid %v", wc.Partial, wc.TO, wc.Valid, want)
	}
	if got := vm.Snapshot(nil); !slices.Equal(got, wc.Valid) {
		t.Fatalf("validity map %v, WorkCompletion.Valid %v: not the same offsets", got, wc.Valid)
	}
	agg := validitymap.New(0)
	if n, err := AggregateWriteRecords([]WorkCompletion{wc}, region.STag(), region.Addr(), agg); n != 1 || err != nil {
		t.Fatalf("AggregateWriteRecords: %d, %v", n, err)
	}
	if got := agg.Snapshot(nil); !slices.Equal(got, want) {
		t.Fatalf("aggregated map %v, want %v", got, want)
	}
}

// TestMaxWriteRecordSegment checks the default Write-Record segment the
// docs give: the largest UDP payload (65 507 over IPv4, 65 527 over IPv6)
// less the 34-byte header and the 4-byte CRC.
func TestMaxWriteRecordSegment(t *testing.T) {
	v4 := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	v6 := newNode(t, DeviceConfig{}, "udp6", "[::1]:0")
	if got := v4.sock.MaxWriteRecordSegment(); got != 65469 {
		t.Errorf("IPv4: %d, want 65 469", got)
	}
	if got := v6.sock.MaxWriteRecordSegment(); got != 65489 {
		t.Errorf("IPv6: %d, want 65 489", got)
	}
	if got := v4.qp.segmentSize(v4.sock); got != 65469 {
		t.Errorf("a QP's default segment over IPv4: %d, want 65 469", got)
	}
}
