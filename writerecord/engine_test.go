package writerecord

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/validitymap"
)

var t0 = time.Unix(1000, 0)

func src(i int) Source {
	return Source{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 4791), QPN: uint32(i%7 + 1)}
}

// segs cuts a message of length n at TO into segments of size seg.
func segs(s Source, stag, msn uint32, to uint64, n, seg uint32) []Segment {
	var out []Segment
	for off := uint32(0); off < n || (n == 0 && off == 0); off += seg {
		k := min(seg, n-off)
		out = append(out, Segment{Source: s, STag: stag, MSN: msn, MessageTO: to, Length: n, Offset: off, N: k})
		if n == 0 {
			break
		}
	}
	return out
}

// deliver runs one segment through Admit and Placed.
func deliver(e *Engine, s Segment, now time.Time) (Verdict, *Record) {
	v := e.Admit(&s, now)
	if v == Drop {
		return v, nil
	}
	if r, ok := e.Placed(&s); ok {
		return v, &r
	}
	return v, nil
}

func TestSingleSegment(t *testing.T) {
	e := New(Config{})
	s := segs(src(1), 0x100, 1, 4096, 1400, 64000)
	v, r := deliver(e, s[0], t0)
	if v != PlaceNew || r == nil || !r.Complete || r.MessageTO != 4096 || r.Length != 1400 || e.InProgress() != 0 {
		t.Fatalf("verdict %v record %+v in progress %d", v, r, e.InProgress())
	}
}

func TestCompleteWhateverWasLostOrReordered(t *testing.T) {
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}, {1, 1, 0, 3, 3, 2}} {
		e := New(Config{})
		ss := segs(src(1), 0x100, 7, 0, 4000, 1000)
		var recs []*Record
		for i, k := range order {
			v, r := deliver(e, ss[k], t0)
			if v == Drop {
				t.Fatalf("segment %d dropped", k)
			}
			if i == 0 && v != PlaceNew {
				t.Fatalf("first segment to arrive: %v, want PlaceNew", v)
			}
			if r != nil {
				recs = append(recs, r)
			}
		}
		if len(recs) != 1 || !recs[0].Complete || recs[0].MSN != 7 {
			t.Fatalf("order %v: records %+v", order, recs)
		}
		// A late duplicate of a segment is dropped, not a new message.
		if v, r := deliver(e, ss[0], t0); v != Drop || r != nil || e.Stats().Duplicate != 1 {
			t.Fatalf("late duplicate: %v %+v", v, r)
		}
		// The tombstone goes at the deadline, unrecorded.
		e.Expire(t0.Add(e.Config().Timeout), func(Record) { t.Fatal("a tombstone was recorded") })
		if e.InProgress() != 0 {
			t.Fatal("state left behind")
		}
	}
}

func TestTimeout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lost   int // index of the lost segment
		policy Policy
		want   []validitymap.Range
	}{
		{"first lost, discard", 0, Discard, nil},
		{"first lost, deliver partial", 0, DeliverPartial, []validitymap.Range{{Start: 1000 + 100, End: 1000 + 400}}},
		{"middle lost, deliver partial", 1, DeliverPartial, []validitymap.Range{{Start: 1000, End: 1100}, {Start: 1200, End: 1400}}},
		{"last lost, deliver partial", 3, DeliverPartial, []validitymap.Range{{Start: 1000, End: 1300}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(Config{Timeout: time.Millisecond, Policy: tc.policy})
			for i, s := range segs(src(2), 0x200, 3, 1000, 400, 100) {
				if i != tc.lost {
					if _, r := deliver(e, s, t0); r != nil {
						t.Fatal("incomplete message recorded")
					}
				}
			}
			if next := e.Expire(t0.Add(time.Millisecond/2), func(Record) { t.Fatal("expired early") }); !next.Equal(t0.Add(time.Millisecond)) {
				t.Fatalf("next deadline %v", next)
			}
			var got []Record
			e.Expire(t0.Add(time.Millisecond), func(r Record) { got = append(got, r) })
			if tc.want == nil {
				if len(got) != 0 || e.Stats().Expired != 1 {
					t.Fatalf("discard recorded %+v", got)
				}
				return
			}
			if len(got) != 1 || got[0].Complete || !slices.Equal(got[0].Valid, tc.want) || e.Stats().Partial != 1 {
				t.Fatalf("partial %+v, want %v", got, tc.want)
			}
		})
	}
}

func TestSupersessionAndStragglers(t *testing.T) {
	e := New(Config{})
	old := segs(src(3), 0x300, 10, 0, 300, 100)
	deliver(e, old[0], t0)
	newer := segs(src(3), 0x300, 11, 0, 300, 100)
	if v, _ := deliver(e, newer[1], t0); v != PlaceNew {
		t.Fatalf("newer MSN: %v", v)
	}
	if e.Stats().Superseded != 1 {
		t.Fatal("older message not discarded")
	}
	if v, r := deliver(e, old[1], t0); v != Drop || r != nil || e.Stats().Stale != 1 {
		t.Fatalf("straggler: %v %+v", v, r)
	}
	deliver(e, newer[0], t0)
	if _, r := deliver(e, newer[2], t0); r == nil || r.MSN != 11 {
		t.Fatal("newer message did not complete")
	}
	// Another source writing the same STag is independent.
	other := segs(src(4), 0x300, 1, 0, 200, 100)
	deliver(e, other[0], t0)
	if _, r := deliver(e, other[1], t0); r == nil {
		t.Fatal("other source's message")
	}
}

func TestMSNWrap(t *testing.T) {
	e := New(Config{})
	a := segs(src(5), 1, 0xFFFFFFFF, 0, 200, 100)
	b := segs(src(5), 1, 0, 0, 200, 100)
	deliver(e, a[0], t0)
	if v, _ := deliver(e, b[0], t0); v != PlaceNew || e.Stats().Superseded != 1 {
		t.Fatal("MSN 0 must supersede 0xFFFFFFFF")
	}
	if v, _ := deliver(e, a[1], t0); v != Drop {
		t.Fatal("0xFFFFFFFF after 0 is a straggler")
	}
}

// TestFlood feeds a million first segments with distinct sources and MSNs:
// the table stays at its cap, and a legitimate message whose segments
// arrive among them still completes.
func TestFlood(t *testing.T) {
	e := New(Config{MaxMessages: 1024, MaxPerSource: 8})
	// The legitimate source numbers its messages as a source must: a
	// message with a number already seen is a duplicate.
	legitSrc := Source{Addr: netip.MustParseAddrPort("192.0.2.1:1"), QPN: 9}
	legit := segs(legitSrc, 0x999, 1, 0, 2000, 1000)
	completed := 0
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 1_000_000 {
		s := Segment{Source: src(i % 60000), STag: uint32(i), MSN: r.Uint32(), MessageTO: 0, Length: 2000, Offset: 0, N: 1000}
		deliver(e, s, t0)
		if e.InProgress() > 1024 {
			t.Fatalf("table at %d over its cap", e.InProgress())
		}
		if i%5000 == 100 {
			legit = segs(legitSrc, 0x999, uint32(i/5000+1), 0, 2000, 1000)
			deliver(e, legit[0], t0)
		}
		if i%5000 == 600 {
			if _, rec := deliver(e, legit[1], t0); rec != nil {
				completed++
			}
		}
	}
	if completed != 200 {
		t.Fatalf("legitimate messages completed: %d of 200", completed)
	}
	if e.Stats().Evicted == 0 {
		t.Fatal("nothing evicted")
	}
	// One source cannot take more than its share.
	e2 := New(Config{MaxMessages: 1024, MaxPerSource: 8})
	for i := range 100 {
		deliver(e2, Segment{Source: src(1), STag: uint32(i), MSN: 1, Length: 2, N: 1}, t0)
	}
	if e2.InProgress() != 8 {
		t.Fatalf("one source holds %d messages, cap 8", e2.InProgress())
	}
}

func TestRangesAdd(t *testing.T) {
	var r ranges
	for _, c := range []struct{ s, e, new uint64 }{
		{10, 20, 10}, {30, 40, 10}, {15, 35, 10}, {0, 5, 5}, {0, 50, 15}, {50, 50, 0}, {60, 70, 10}, {55, 65, 5},
	} {
		if got := r.add(c.s, c.e, nil); got != c.new {
			t.Fatalf("add(%d,%d) new %d, want %d (ranges %v)", c.s, c.e, got, c.new, r.list())
		}
	}
	if want := []validitymap.Range{{Start: 0, End: 50}, {Start: 55, End: 70}}; !slices.Equal(r.list(), want) {
		t.Fatalf("%v, want %v", r.list(), want)
	}
}

func BenchmarkSingleSegment(b *testing.B) {
	e := New(Config{})
	s := segs(src(1), 1, 1, 0, 1024, 64000)[0]
	b.ReportAllocs()
	for b.Loop() {
		s.MSN++
		e.Admit(&s, t0)
		e.Placed(&s)
	}
}

// BenchmarkMemoryPerMessage reports the heap one message in progress
// costs (its map entry, list element and range slice).
func BenchmarkMemoryPerMessage(b *testing.B) {
	const n = 4096
	var before, after runtime.MemStats
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&before)
		e := New(Config{MaxMessages: n, MaxPerSource: n})
		for i := range n {
			s := Segment{Source: src(i), STag: uint32(i), MSN: 1, Length: 2000, Offset: 1000, N: 1000}
			e.Admit(&s, t0)
			e.Placed(&s)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/message")
		runtime.KeepAlive(e)
	}
}

// TestStragglerAfterDeadline: once a message was recorded partial (or
// discarded) at its deadline, a late segment of the same MSN is dropped;
// it does not start the message again.
func TestStragglerAfterDeadline(t *testing.T) {
	for _, policy := range []Policy{DeliverPartial, Discard} {
		e := New(Config{Timeout: time.Millisecond, Policy: policy})
		a := Segment{Source: src(1), STag: 9, MSN: 4, Length: 2000, Offset: 0, N: 1000}
		if e.Admit(&a, t0) != PlaceNew {
			t.Fatal("first segment")
		}
		e.Placed(&a)
		records := 0
		e.Expire(t0.Add(2*time.Millisecond), func(Record) { records++ })
		if want := map[Policy]int{DeliverPartial: 1, Discard: 0}[policy]; records != want {
			t.Fatalf("%v: %d records", policy, records)
		}
		late := Segment{Source: src(1), STag: 9, MSN: 4, Length: 2000, Offset: 1000, N: 1000}
		if v := e.Admit(&late, t0.Add(3*time.Millisecond)); v != Drop {
			t.Fatalf("%v: a straggler after the deadline got %v", policy, v)
		}
		dup := a
		if v := e.Admit(&dup, t0.Add(3*time.Millisecond)); v != Drop {
			t.Fatalf("%v: a duplicate after the deadline got %v", policy, v)
		}
		// A newer MSN still starts a message.
		next := Segment{Source: src(1), STag: 9, MSN: 5, Length: 2000, Offset: 0, N: 1000}
		if v := e.Admit(&next, t0.Add(3*time.Millisecond)); v != PlaceNew {
			t.Fatalf("%v: the next message got %v", policy, v)
		}
	}
}

// TestSupersededDeliverPartial: with deliver-partial, a message that a
// newer one of its source to the same STag supersedes is recorded at
// once with exactly the runs that arrived (Ended), as at its deadline; a
// straggler of it afterwards is dropped; with discard it is recorded
// nothing. Back-to-back messages to one region (a stream's ring) keep
// what arrived of each.
func TestSupersededDeliverPartial(t *testing.T) {
	for _, p := range []Policy{DeliverPartial, Discard} {
		e := New(Config{Policy: p})
		old := segs(src(3), 0x300, 10, 1000, 300, 100)
		deliver(e, old[0], t0)
		deliver(e, old[2], t0) // old[1] lost
		if _, ok := e.Ended(); ok {
			t.Fatalf("%v: ended before anything superseded it", p)
		}
		newer := segs(src(3), 0x300, 11, 2000, 300, 100)
		if v, _ := deliver(e, newer[0], t0); v != PlaceNew {
			t.Fatalf("%v: newer MSN: %v", p, v)
		}
		rec, ok := e.Ended()
		st := e.Stats()
		if p == Discard {
			if ok || st.Superseded != 1 || st.Partial != 0 {
				t.Fatalf("discard: ended %v %+v, stats %+v", ok, rec, st)
			}
			continue
		}
		want := []validitymap.Range{{Start: 1000, End: 1100}, {Start: 1200, End: 1300}}
		if !ok || rec.Complete || rec.MSN != 10 || rec.MessageTO != 1000 || rec.Length != 300 || len(rec.Valid) != 2 ||
			rec.Valid[0] != want[0] || rec.Valid[1] != want[1] || st.Superseded != 1 || st.Partial != 1 {
			t.Fatalf("deliver-partial: ended %v %+v, stats %+v; want the runs %v", ok, rec, st, want)
		}
		if v, _ := deliver(e, old[1], t0); v != Drop {
			t.Fatalf("the straggler of the superseded message: %v", v)
		}
		if _, ok := e.Ended(); ok {
			t.Fatal("the straggler ended something")
		}
	}
}

// TestReliableNoDeadline: a Reliable engine (an RD QP's) lets a message
// in progress outlive its deadline — the QP's or its region's — and
// records it whole when its last segment comes; its timer is not asked
// to run for it; the completed message is remembered until the deadline
// its start set, as on UD; and EndSource still ends a message in
// progress by its policy.
func TestReliableNoDeadline(t *testing.T) {
	for _, lim := range []*Limits{nil, {Timeout: time.Millisecond, Policy: DeliverPartial}} {
		e := New(Config{Timeout: time.Millisecond, Reliable: true})
		ss := segs(src(1), 0x100, 1, 0, 4000, 1000)
		for i := range ss {
			ss[i].Limits = lim
		}
		deliver(e, ss[0], t0)
		late := t0.Add(time.Hour)
		if next := e.Expire(late, func(r Record) { t.Fatalf("limits %+v: recorded at the deadline: %+v", lim, r) }); !next.IsZero() {
			t.Fatalf("limits %+v: timer asked for %v with only a message in progress", lim, next)
		}
		var rec *Record
		for _, s := range ss[1:] {
			if v, r := deliver(e, s, late); v != Place {
				t.Fatalf("limits %+v: segment at %d: %v", lim, s.Offset, v)
			} else if r != nil {
				rec = r
			}
		}
		if st := e.Stats(); rec == nil || !rec.Complete || st.Completed != 1 || st.Expired+st.Partial != 0 {
			t.Fatalf("limits %+v: record %+v, stats %+v", lim, rec, st)
		}
		if v, _ := deliver(e, ss[3], late); v != Drop || e.Stats().Duplicate != 1 {
			t.Fatalf("limits %+v: a duplicate while remembered: %v", lim, v)
		}
		e.Expire(late, func(Record) { t.Fatal("a tombstone was recorded") })
		if e.InProgress() != 0 {
			t.Fatalf("limits %+v: %d remembered past the deadline", lim, e.InProgress())
		}
	}
	e := New(Config{Timeout: time.Millisecond, Policy: DeliverPartial, Reliable: true})
	ss := segs(src(2), 0x200, 1, 0, 4000, 1000)
	deliver(e, ss[0], t0)
	var got []Record
	e.EndSource(src(2), func(r Record) { got = append(got, r) })
	if len(got) != 1 || got[0].Complete || !slices.Equal(got[0].Valid, []validitymap.Range{{Start: 0, End: 1000}}) || e.InProgress() != 0 {
		t.Fatalf("EndSource: %+v, %d in progress", got, e.InProgress())
	}
}
