package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
)

// TestWriteRecordRegionLimits gives one region its own short deadline and
// deliver-partial while the QP keeps the long default and discard.
func TestWriteRecordRegionLimits(t *testing.T) {
	b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
	r := newRawWR(t, b, q)
	plain, err := b.pd.RegisterMemory(make([]byte, 8000), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	region.SetWriteRecordLimits(&writerecord.Limits{Timeout: 20 * time.Millisecond, Policy: writerecord.DeliverPartial})
	msg := make([]byte, 3000)
	fill(msg, 5)
	r.send(region.STag(), region.Addr(), 1, msg, 0, 1000) // segment 1000-2000 lost
	r.send(region.STag(), region.Addr(), 1, msg, 2000, 1000)
	r.send(plain.STag(), plain.Addr(), 1, msg, 0, 1000) // the QP's policy: discard after 10 s
	start := time.Now()
	wc := waitWC(t, b.cq, 1)[0]
	if waited := time.Since(start); waited < 15*time.Millisecond {
		t.Fatalf("recorded after %v, before the region's deadline", waited)
	}
	want := []validitymap.Range{{Start: region.Addr(), End: region.Addr() + 1000}, {Start: region.Addr() + 2000, End: region.Addr() + 3000}}
	if !wc.Partial || wc.STag != region.STag() || len(wc.Valid) != 2 || wc.Valid[0] != want[0] || wc.Valid[1] != want[1] {
		t.Fatalf("%+v", wc)
	}
	if !bytes.Equal(region.Bytes()[:1000], msg[:1000]) || !bytes.Equal(region.Bytes()[2000:3000], msg[2000:]) {
		t.Fatal("recorded bytes differ")
	}
	// The other region's message waits for the QP's deadline (10 s): once
	// b has handled its segment, run the deadlines a second from now, and
	// it is still in progress, neither recorded nor discarded.
	eventually(t, "the three segments read", func() bool { return b.dev.Stats().RxDatagrams.Load() >= 3 })
	rxSettled(b.sock)
	if n := b.dev.Stats().RxWRPlaced.Load(); n != 3 {
		t.Fatalf("%d segments placed, want 3", n)
	}
	was, _ := b.dev.WriteRecordStats()
	q.wrExpire(time.Now().Add(time.Second))
	if st, _ := b.dev.WriteRecordStats(); st != was || st.Partial != 1 || st.Expired != 0 {
		t.Fatalf("a second on: %+v (was %+v): the other region's message ended", st, was)
	}
	noCompletion(t, b.cq)

	// Back to the QP's policy: an incomplete message is not recorded. Its
	// deadline is the QP's (10 s), not the region's 20 ms: run a second
	// from now, the deadlines leave it in progress; run at 11 s, they
	// discard it, and the other region's, unrecorded.
	region.SetWriteRecordLimits(nil)
	placed, before := b.dev.Stats().RxWRPlaced.Load(), func() writerecord.Stats { st, _ := b.dev.WriteRecordStats(); return st }()
	r.send(region.STag(), region.Addr()+4000, 2, msg, 0, 1000)
	eventually(t, "the segment placed", func() bool { return b.dev.Stats().RxWRPlaced.Load() > placed })
	q.wrExpire(time.Now().Add(time.Second))
	if st, _ := b.dev.WriteRecordStats(); st != before {
		t.Fatalf("a second on: %+v, want %+v: a message ended", st, before)
	}
	noCompletion(t, b.cq)
	q.wrExpire(time.Now().Add(11 * time.Second))
	if st, _ := b.dev.WriteRecordStats(); st.Expired != before.Expired+2 || st.Partial != before.Partial {
		t.Fatalf("past the QP's deadline: %+v; want both messages discarded", st)
	}
	noCompletion(t, b.cq)
}

// TestWriteRecordMSNWrap runs one source's MSNs across 2^32 at a target:
// 0 is newer than 0xffffffff, stragglers from before the wrap are
// dropped, and each complete message is recorded once.
func TestWriteRecordMSNWrap(t *testing.T) {
	b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
	r := newRawWR(t, b, q)
	msgs := map[uint32][]byte{}
	for i, msn := range []uint32{0xfffffffe, 0xffffffff, 0, 1} {
		msgs[msn] = make([]byte, 2000)
		fill(msgs[msn], 20+i)
	}
	to := region.Addr()
	r.send(region.STag(), to, 0xfffffffe, msgs[0xfffffffe], 0, 1000)
	r.send(region.STag(), to, 0xfffffffe, msgs[0xfffffffe], 1000, 1000)
	if wc := waitWC(t, b.cq, 1)[0]; wc.MSN != 0xfffffffe || wc.Partial || !bytes.Equal(region.Bytes()[:2000], msgs[0xfffffffe]) {
		t.Fatalf("%+v", wc)
	}
	r.send(region.STag(), to+4000, 0xffffffff, msgs[0xffffffff], 0, 1000) // never completed
	r.send(region.STag(), to+8000, 0, msgs[0], 0, 1000)                   // newer across the wrap: supersedes it
	r.send(region.STag(), to+4000, 0xffffffff, msgs[0xffffffff], 1000, 1000)
	r.send(region.STag(), to+8000, 0, msgs[0], 1000, 1000)
	if wc := waitWC(t, b.cq, 1)[0]; wc.MSN != 0 || wc.TO != to+8000 || wc.Partial || !bytes.Equal(region.Bytes()[8000:10000], msgs[0]) {
		t.Fatalf("%+v", wc)
	}
	r.send(region.STag(), to+12000, 1, msgs[1], 1000, 1000)
	r.send(region.STag(), to+12000, 1, msgs[1], 0, 1000)
	r.send(region.STag(), to, 0xfffffffe, msgs[0xfffffffe], 0, 1000) // a replay from before the wrap
	if wc := waitWC(t, b.cq, 1)[0]; wc.MSN != 1 || wc.Partial || !bytes.Equal(region.Bytes()[12000:14000], msgs[1]) {
		t.Fatalf("%+v", wc)
	}
	// Each complete message recorded once: b read and handled all nine
	// segments, the two stragglers dropped.
	quietUntil(t, b.cq, b.sock, "the nine segments read", func() bool { return b.dev.Stats().RxDatagrams.Load() >= 9 })
	if n := b.dev.Stats().RxWRStale.Load(); n != 2 {
		t.Fatalf("%d stragglers dropped, want 2", n)
	}
}

// TestWriteRecordImpairedLink sends Write-Records through the impairment
// layer (loss, corruption, duplication, reordering, jitter) to a target
// that delivers partial messages at a short deadline. Every record, whole
// or partial, and the validity map must match the bytes in memory.
func TestWriteRecordImpairedLink(t *testing.T) {
	imp := &Impairment{Seed: 11, Loss: 0.05, Corrupt: 0.02, Duplicate: 0.05, Reorder: 0.1, Jitter: 100 * time.Microsecond}
	a := newNode(t, DeviceConfig{Impair: imp}, "udp4", "127.0.0.1:0")
	src := a.newQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, WriteRecordSegment: 1000})
	// The deadline is long beside the impairment's jitter and reordering, so
	// what the test sees does not depend on the machine's speed: a message
	// is partial only because the impairment lost segments of it, and a late
	// duplicate never outlives the message's memory (2 x Timeout) to start
	// it again. With 30 ms under the race detector on a loaded machine, a
	// duplicate did, and the message's map was cleared under its record.
	b, region, q := wrTarget(t, writerecord.Config{Timeout: 3 * time.Second, Policy: writerecord.DeliverPartial}, RecordBoth)
	const msgs, size = 40, 16000
	// One region per message: messages to one STag from one source would
	// supersede each other.
	var slots []*MR
	maps := make([]*validitymap.Map, msgs)
	for i := range msgs {
		m, err := b.pd.RegisterMemory(region.Bytes()[i*size:(i+1)*size], AccessLocalWrite|AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		maps[i] = m.TrackValidity(0)
		slots = append(slots, m)
	}
	ah := a.ah(b, q)
	for i := range msgs {
		fill(a.buf[i*size:(i+1)*size], 100+i)
		if err := src.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(i*size, size)}, AH: ah,
			RemoteSTag: slots[i].STag(), RemoteTO: slots[i].Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	// Every message has its record by its deadline, unless all 16 of its
	// segments were lost (then it has none).
	var got []WorkCompletion
	wcs := make([]WorkCompletion, 64)
	for end := time.Now().Add(time.Minute); len(got) < msgs && time.Now().Before(end); {
		n := b.cq.Poll(wcs)
		got = append(got, wcs[:n]...)
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	seen := map[uint32]bool{}
	partial := 0
	for _, wc := range got {
		i := -1
		for k, m := range slots {
			if m.STag() == wc.STag {
				i = k
			}
		}
		if i < 0 || wc.Status != Success || wc.TO != slots[i].Addr() || wc.Len != size || seen[wc.STag] {
			t.Fatalf("record %+v", wc)
		}
		seen[wc.STag] = true
		want := a.buf[i*size : (i+1)*size]
		valid := []validitymap.Range{{Start: wc.TO, End: wc.TO + size}}
		if wc.Partial {
			partial++
			valid = wc.Valid
		}
		var n uint64
		for _, v := range valid {
			lo, hi := v.Start-wc.TO, v.End-wc.TO
			if !bytes.Equal(slots[i].Bytes()[lo:hi], want[lo:hi]) {
				t.Fatalf("message %d: recorded range [%d, %d) differs from what was sent", i, lo, hi)
			}
			if !maps[i].Valid(lo, hi-lo) {
				t.Fatalf("message %d: range [%d, %d) not in the map", i, lo, hi)
			}
			n += hi - lo
		}
		if maps[i].Bytes() != n {
			t.Fatalf("message %d: map holds %d bytes, records %d", i, maps[i].Bytes(), n)
		}
	}
	t.Logf("%d records, %d partial; impairment dropped %d, corrupted %d, duplicated %d, reordered %d",
		len(got), partial, imp.Dropped.Load(), imp.Corrupted.Load(), imp.Duplicated.Load(), imp.Reordered.Load())
	if len(got) < msgs-1 || partial == 0 || partial == len(got) {
		t.Fatalf("%d records, %d partial: the impairment did not act as configured", len(got), partial)
	}
}
