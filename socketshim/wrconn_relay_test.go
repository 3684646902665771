package socketshim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// The network between a Write-Record writer and its reader, under a
// test's control: it holds, drops, delays or repeats chosen datagrams,
// so that an interleaving that load produces once in a hundred runs is
// produced every time.

// wrRelay forwards between a writer a, which writes to x, and a reader
// b, which sees the writer as y. Each datagram goes through the
// direction's rule, in order, on the direction's own goroutine: the rule
// returns false to drop it, and may block (waitUntil) to hold it and
// every datagram after it.
type wrRelay struct {
	t     *testing.T
	x, y  *net.UDPConn
	a, b  netip.AddrPort
	toB   wrRule
	toA   wrRule
	done  chan struct{}
	wg    sync.WaitGroup
	held  atomic.Bool // a rule is waiting
	fails atomic.Value
}

// wrRule decides a datagram's fate on the relay: false drops it. It may
// hold it (and all after it in its direction) with r.waitUntil.
type wrRule func(r *wrRelay, p *relayed) bool

// relayed is one datagram on the relay, as parsed.
type relayed struct {
	b      []byte
	wr     bool   // a Write-Record segment
	record int    // its record's number (the writer's MSN - 1: one ring)
	mo     uint32 // its offset in the record
	last   bool   // the record's last segment
	kind   byte   // a control message's kind (0: not one)
	n      uint64 // a CREDIT's or PROBE's record number
}

func newWRRelay(t *testing.T, a, b *WRConn, toB, toA wrRule) *wrRelay {
	t.Helper()
	r := &wrRelay{t: t, a: addrPort(a.LocalAddr()), b: addrPort(b.LocalAddr()), toB: toB, toA: toA, done: make(chan struct{})}
	for _, c := range []**net.UDPConn{&r.x, &r.y} {
		var err error
		if *c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
			t.Fatal(err)
		}
		(*c).SetReadBuffer(8 << 20)
	}
	r.wg.Add(2)
	go r.run(r.x, r.y, r.a, r.b, r.toB)
	go r.run(r.y, r.x, r.b, r.a, r.toA)
	t.Cleanup(func() {
		close(r.done)
		r.x.Close()
		r.y.Close()
		r.wg.Wait()
		if e := r.fails.Load(); e != nil {
			t.Error(e)
		}
	})
	return r
}

func (r *wrRelay) run(in, out *net.UDPConn, from, to netip.AddrPort, rule wrRule) {
	defer r.wg.Done()
	buf := make([]byte, 1<<16)
	for {
		n, src, err := in.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if src != from {
			continue
		}
		p := parseRelayed(buf[:n])
		if rule != nil && !rule(r, p) {
			continue
		}
		out.WriteToUDPAddrPort(p.b, to)
	}
}

func parseRelayed(b []byte) *relayed {
	p := &relayed{b: b}
	seg, err := udiwarp.ParseUDFrame(b)
	switch {
	case err != nil:
	case seg.Control.Tagged() && seg.Control.WriteRecord():
		h := seg.WriteRecord()
		p.wr, p.record, p.mo, p.last = true, int(h.MSN())-1, h.MO(), seg.Control.Last()
	case len(seg.Payload) >= wrShortLen && binary.BigEndian.Uint32(seg.Payload) == wrMagic:
		p.kind = seg.Payload[4]
		if (p.kind == wrCredit || p.kind == wrProbe) && len(seg.Payload) >= wrNoteLen {
			p.n = binary.BigEndian.Uint64(seg.Payload[32:])
		}
	}
	return p
}

// waitUntil holds the relay's direction (a rule calls it) until cond
// holds; the bound only ends a hung test.
func (r *wrRelay) waitUntil(what string, cond func() bool) {
	r.held.Store(true)
	defer r.held.Store(false)
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		select {
		case <-r.done:
			return
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.fails.CompareAndSwap(nil, "the relay gave up waiting for "+what)
			return
		}
	}
}

// send forwards b to the reader now, as the writer's.
func (r *wrRelay) send(b []byte) {
	r.y.WriteToUDPAddrPort(b, r.b)
}

// writerAddr is the writer's address as the reader knows it; readerAddr
// the reader's as the writer knows it.
func (r *wrRelay) writerAddr() net.Addr { return r.y.LocalAddr() }
func (r *wrRelay) readerAddr() net.Addr { return r.x.LocalAddr() }

// wrRead reads the next record at b, whole or partial, within 10 s.
func wrRead(t *testing.T, b *WRConn, buf []byte) Record {
	t.Helper()
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	r, err := b.ReadRecord(buf)
	if err != nil {
		t.Fatalf("read: %v (reader %v)", err, statsOf(b))
	}
	return r
}

// wrWrite writes record i of size bytes from a to addr.
func wrWrite(t *testing.T, a *WRConn, i, size int, addr net.Addr) {
	t.Helper()
	a.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := a.WriteTo(record(i, size), addr); err != nil {
		t.Errorf("write %d: %v", i, err)
	}
}

// recordOf says which record the bytes buf[lo:hi) of a datagram are
// from (record's pattern), or -1 if they are no record's.
func recordOf(buf []byte, lo, hi int) int {
	for i := range 256 {
		want := record(i, hi)
		if bytes.Equal(buf[max(lo, 8):hi], want[max(lo, 8):hi]) {
			return i
		}
	}
	return -1
}

// wrConsumed is the number of records the reader c consumed of the
// writer at ap (read, or passed over).
func wrConsumed(c *WRConn, ap netip.AddrPort) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peers[ap]
	if p == nil || p.rx == nil {
		return 0
	}
	return p.rx.consumed
}

// TestWRConnLateSegment: a segment of an old record that arrives after
// its writer's later records — delayed, or repeated, by the network —
// is never placed over the slot that now holds a newer record. The
// reader's QP forgot the writer's message numbers two deadlines after
// each message began, and took such a segment for a new message: placed
// over record 2, unread in the same slot, it made ReadFrom return record
// 2 whole with record 0's bytes in it; with partial delivery, recorded
// as a partial record with its header lost, it was returned as a record
// the writer never wrote (the slot named it the next one), and the
// writer's real records after it were then dropped as old. Now the QP
// keeps each writer's newest message number and drops the segment.
func TestWRConnLateSegment(t *testing.T) {
	const size = 2500 // 2508 with the header: segments at 0, 1000 and 2000
	for _, partial := range []bool{false, true} {
		name := map[bool]string{false: "whole", true: "partial"}[partial]
		t.Run(name, func(t *testing.T) {
			a, b := wrPair(t, &WROptions{Segment: 1000, Slots: 2, CreditWait: 10 * time.Second},
				&WROptions{Segment: 1000, Slots: 2, Partial: partial, Deadline: time.Second})
			var late atomic.Pointer[[]byte]
			r := newWRRelay(t, a, b, func(_ *wrRelay, p *relayed) bool {
				if p.wr && p.record == 0 && p.mo == 1000 && late.Load() == nil {
					c := bytes.Clone(p.b)
					late.Store(&c) // the network will deliver it again, late
				}
				return true
			}, nil)
			buf := make([]byte, 4096)
			last := 2
			if partial {
				last = 3 // records 0-2 read; record 3 written after the late segment
			}
			for i := range 3 {
				wrWrite(t, a, i, size, r.readerAddr())
				if i < 2 || partial {
					if rec := wrRead(t, b, buf); rec.N != size || rec.Partial || !bytes.Equal(buf[:size], record(i, size)) {
						t.Fatalf("record %d: %+v, record %d's bytes", i, rec, recordOf(buf, 0, size))
					}
				}
			}
			// Record 2 is whole at the reader, in record 0's slot (unread
			// unless partial). Once the reader's QP holds no message in
			// progress (record 2's deadline, 1 s — long, so that no record
			// of the test misses it under load — passed), the late copy of
			// record 0's middle segment arrives.
			waitFor(t, "the reader's QP to hold no message in progress", func() bool {
				_, n := b.Device().WriteRecordStats()
				return n == 0
			})
			st := b.Device().Stats()
			handled := st.RxWRPlaced.Load() + st.RxWRStale.Load()
			r.send(*late.Load())
			waitFor(t, "the late segment to be handled", func() bool { return st.RxWRPlaced.Load()+st.RxWRStale.Load() > handled })
			if partial {
				wrWrite(t, a, 3, size, r.readerAddr())
			}
			rec := wrRead(t, b, buf)
			got := recordOf(buf, 0, min(rec.N, size))
			if rec.N != size || rec.Partial || !bytes.Equal(buf[:size], record(last, size)) {
				t.Fatalf("want record %d whole, got %d bytes partial %v valid %v; its bytes 992-1992 are record %d's, the rest record %d's",
					last, rec.N, rec.Partial, rec.Valid, recordOf(buf, 992, 1992), got)
			}
			if st.RxWRStale.Load() == 0 {
				t.Fatal("the late segment was not dropped as stale")
			}
		})
	}
}

// wrSequence has the test read records from b and checks them against
// want: each record's number, and for a partial one its valid ranges.
func wrSequence(t *testing.T, b *WRConn, size int, want []int, partial map[int][]string) {
	t.Helper()
	buf := make([]byte, 4096)
	for k, i := range want {
		rec := wrRead(t, b, buf)
		valid := make([]string, len(rec.Valid))
		for j, v := range rec.Valid {
			valid[j] = v.String()
		}
		got := recordOf(buf, 0, min(rec.N, size))
		if rec.Partial {
			got = recordOf(buf, 0, int(rec.Valid[0].End))
		}
		wantValid, wantPartial := partial[i]
		if rec.N != size || got != i || rec.Partial != wantPartial || fmt.Sprint(valid) != fmt.Sprint(wantValid) {
			t.Fatalf("read %d: want record %d (partial %v %v), got record %d: %d bytes, partial %v, valid %v; records read before it %v; reader %v",
				k, i, wantPartial, wantValid, got, rec.N, rec.Partial, valid, want[:k], statsOf(b))
		}
		if !wantPartial && !bytes.Equal(buf[:size], record(i, size)) {
			t.Fatalf("record %d whole but not the writer's bytes", i)
		}
	}
}

// TestWRConnProbeKeepsRecordInProgress: a writer out of credits probes
// while its last record is still in progress at the reader's QP (its last
// segment lost; with partial delivery the QP would deliver it at its
// deadline). The reader re-keyed its ring when the deadline had passed
// since the last record *arrived*, which says nothing of when this one
// began: the record, delivered for the old ring, was dropped, and the
// writer, numbering the new ring from 0, had its next record read in the
// lost one's place ("whole record 191: not the writer's bytes" in
// TestWRConnPartial under load). Now the reader has its QP end the
// record in progress at once (QP.EndWriteRecord): it is read, partial,
// and nothing is re-keyed.
func TestWRConnProbeKeepsRecordInProgress(t *testing.T) {
	const size, deadline = 2500, time.Second // long, so that no record of the test misses it under load
	a, b := wrPair(t, &WROptions{Segment: 1000, Slots: 4, CreditWait: 10 * time.Second},
		&WROptions{Segment: 1000, Slots: 4, Partial: true, Deadline: deadline})
	var probes atomic.Int32
	r := newWRRelay(t, a, b, func(r *wrRelay, p *relayed) bool {
		switch {
		case p.wr && p.record == 4 && p.mo == 0:
			// Record 4 begins once the reader's last record is older
			// than the deadline (a writer descheduled that long).
			var read3 time.Time
			r.waitUntil("record 3 to be read a deadline ago", func() bool {
				if read3.IsZero() && wrConsumed(b, addrPort(r.writerAddr())) >= 4 {
					read3 = time.Now()
				}
				return !read3.IsZero() && time.Since(read3) > deadline
			})
		case p.wr && p.record == 4:
			return !p.last // its last segment is lost
		case p.wr && p.record >= 5 && p.record <= 7:
			return false // lost whole: the writer runs out of credits
		case p.kind == wrProbe && p.n == 8:
			probes.Add(1)
		}
		return true
	}, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 9 {
			wrWrite(t, a, i, size, r.readerAddr())
		}
	}()
	wrSequence(t, b, size, []int{0, 1, 2, 3, 4, 8}, map[int][]string{4: {"[0, 1992)"}})
	<-done
	if probes.Load() == 0 || b.Stats().Rekeys.Load() != 0 {
		t.Fatalf("probes for record 8 %d, re-keys %d", probes.Load(), b.Stats().Rekeys.Load())
	}
}

// TestWRConnProbeCrossesCredit: records the writer sends after a credit
// that crossed its probe are not lost. The writer probed (records 6 and 7
// lost) before the reader's credit for the records the reader had read
// reached it; the reader, nothing left to read, re-keyed its ring at the
// probe; the writer, given the credit, wrote two more records into the
// old ring, which the reader's QP refused, and then took the new ring.
// Now the reader re-keys only when its last credit has reached the
// writer (the probe's number shows it), and otherwise sends the credit
// again.
func TestWRConnProbeCrossesCredit(t *testing.T) {
	const size = 2500
	a, b := wrPair(t, &WROptions{Segment: 1000, Slots: 4, CreditWait: 10 * time.Second},
		&WROptions{Segment: 1000, Slots: 4})
	var probed, sent9 atomic.Bool
	r := newWRRelay(t, a, b, func(r *wrRelay, p *relayed) bool {
		switch {
		case p.wr && (p.record == 6 || p.record == 7):
			return false
		case p.kind == wrProbe && p.n == 8 && !probed.Load():
			// The probe reaches the reader after it read record 5 and
			// credited it.
			r.waitUntil("the reader to read record 5", func() bool {
				return wrConsumed(b, addrPort(r.writerAddr())) >= 6
			})
			probed.Store(true)
		case p.wr && p.record == 9 && p.last:
			sent9.Store(true)
		}
		return true
	}, func(r *wrRelay, p *relayed) bool {
		switch {
		case p.kind == wrCredit && p.n >= 5:
			r.waitUntil("the writer's probe for record 8 to pass", probed.Load)
		case p.kind == wrHello && probed.Load():
			r.waitUntil("records 8 and 9 to pass", sent9.Load)
		}
		return true
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 12 {
			wrWrite(t, a, i, size, r.readerAddr())
		}
	}()
	wrSequence(t, b, size, []int{0, 1, 2, 3, 4, 5, 8, 9, 10, 11}, nil)
	<-done
	if !probed.Load() || b.Stats().Rekeys.Load() != 0 {
		t.Fatalf("probe passed %v, re-keys %d", probed.Load(), b.Stats().Rekeys.Load())
	}
}
