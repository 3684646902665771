package writerecord

import (
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/validitymap"
)

// TestFarAheadMSN: a segment more than MSNWindow ahead of the message that
// holds its key — in progress or remembered complete — is dropped and
// counted and supersedes nothing; at the window's edge it supersedes.
func TestFarAheadMSN(t *testing.T) {
	for _, held := range []string{"in progress", "completed"} {
		t.Run(held, func(t *testing.T) {
			e := New(Config{MSNWindow: 100})
			cur := segs(src(1), 9, 5, 0, 300, 100)
			deliver(e, cur[0], t0)
			if held == "completed" {
				deliver(e, cur[1], t0)
				if _, r := deliver(e, cur[2], t0); r == nil {
					t.Fatal("message 5 did not complete")
				}
			}
			far := segs(src(1), 9, 5+101, 4096, 300, 100)
			for _, s := range far {
				if v, r := deliver(e, s, t0); v != Drop || r != nil {
					t.Fatalf("MSN 106 over 5 (window 100): %v %+v", v, r)
				}
			}
			if st := e.Stats(); st.FarAhead != 3 || st.Superseded != 0 {
				t.Fatalf("stats %+v", st)
			}
			// The flow goes on: 5 completes (or stays remembered), then 6.
			if held == "in progress" {
				deliver(e, cur[1], t0)
				if _, r := deliver(e, cur[2], t0); r == nil || r.MSN != 5 {
					t.Fatal("message 5 did not complete after the far-ahead segment")
				}
			}
			next := segs(src(1), 9, 6, 0, 300, 100)
			var rec *Record
			for _, s := range next {
				if _, r := deliver(e, s, t0); r != nil {
					rec = r
				}
			}
			if rec == nil || rec.MSN != 6 {
				t.Fatal("message 6 not recorded")
			}
			// At the window's edge a newer MSN supersedes as before.
			if v, _ := deliver(e, segs(src(1), 9, 6+100, 0, 300, 100)[0], t0); v != PlaceNew {
				t.Fatalf("MSN 106 over 6 (window 100): %v", v)
			}
		})
	}
}

// TestForgedHolderDisplaced: a forged segment that holds a key with no
// state to be measured against (any MSN), or a forged complete message
// that is remembered, or a near-ahead forged segment that supersedes the
// source's message: the source's own messages end it after two, and the
// flow is recorded again — never a deadline's wait.
func TestForgedHolderDisplaced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		forged []Segment
		seg    uint32 // the source's segment size
		first  uint32 // the source's first MSN recorded again
	}{
		{"in progress, multi-segment flow", segs(src(1), 9, 1<<30, 1<<16, 300, 100)[:1], 100, 3},
		{"in progress, single-segment flow", segs(src(1), 9, 1<<30, 1<<16, 300, 100)[:1], 300, 2},
		{"remembered complete", segs(src(1), 9, 1<<30, 1<<16, 2, 1), 100, 3},
		{"near ahead", segs(src(1), 9, 3, 1<<16, 300, 100)[1:2], 100, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(Config{Timeout: time.Hour})
			for _, s := range tc.forged {
				if v, _ := deliver(e, s, t0); v == Drop {
					t.Fatal("forged segment dropped: nothing to measure it against")
				}
			}
			recorded := map[uint32]bool{}
			for msn := uint32(1); msn <= 6; msn++ {
				for _, s := range segs(src(1), 9, msn, uint64(msn)*1000, 300, tc.seg) {
					if _, r := deliver(e, s, t0); r != nil {
						if !r.Complete || r.MSN != msn || r.MessageTO != uint64(msn)*1000 || r.Length != 300 {
							t.Fatalf("record %+v", r)
						}
						recorded[msn] = true
					}
				}
			}
			for msn := uint32(1); msn <= 6; msn++ {
				if want := msn >= tc.first; recorded[msn] != want {
					t.Fatalf("message %d recorded %v, want %v (records %v, stats %+v)", msn, recorded[msn], want, recorded, e.Stats())
				}
			}
			if e.Stats().Displaced != 1 {
				t.Fatalf("stats %+v", e.Stats())
			}
		})
	}
}

// TestStragglersDoNotDisplace: a reordered straggler of an older message
// — even its last segment, even twice — does not end the newer message
// that makes progress between them.
func TestStragglersDoNotDisplace(t *testing.T) {
	e := New(Config{})
	y1 := segs(src(1), 9, 1, 0, 300, 100)
	y2 := segs(src(1), 9, 2, 0, 300, 100)
	x := segs(src(1), 9, 3, 0, 400, 100)
	deliver(e, y1[0], t0)
	deliver(e, y2[0], t0) // supersedes 1
	deliver(e, x[0], t0)  // supersedes 2
	deliver(e, y1[2], t0) // 1's last segment: a straggler
	deliver(e, y1[2], t0) // its duplicate counts once
	deliver(e, x[1], t0)  // progress
	deliver(e, y2[2], t0) // 2's last segment: a straggler
	deliver(e, x[2], t0)
	if _, r := deliver(e, x[3], t0); r == nil || r.MSN != 3 {
		t.Fatalf("message 3 lost to stragglers: stats %+v", e.Stats())
	}
	if st := e.Stats(); st.Displaced != 0 || st.Stale != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSameMSNOtherExtent: a segment with the MSN of the message in
// progress but another base or length is another message (one of the two
// forged); its bytes must not count towards the first, which before made
// the engine record a message complete of which one segment was placed.
func TestSameMSNOtherExtent(t *testing.T) {
	e := New(Config{})
	forged := Segment{Source: src(1), STag: 9, MSN: 7, MessageTO: 1 << 16, Length: 2, Offset: 0, N: 1}
	deliver(e, forged, t0)
	real := segs(src(1), 9, 7, 0, 1000, 100)
	for i, s := range real {
		if v, r := deliver(e, s, t0); v != Drop || r != nil {
			t.Fatalf("segment %d of the other extent: %v, record %+v", i, v, r)
		}
	}
	if st := e.Stats(); st.Mismatch != 10 || st.Completed != 0 {
		t.Fatalf("stats %+v", st)
	}
	// The next messages are recorded.
	var rec *Record
	for _, s := range segs(src(1), 9, 8, 0, 1000, 100) {
		if _, r := deliver(e, s, t0); r != nil {
			rec = r
		}
	}
	if rec == nil || rec.MSN != 8 {
		t.Fatal("message 8 not recorded")
	}
}

// TestSourceRestart: a source whose numbering starts again at 1 (a new QP
// with the old number) is recorded again after two messages, instead of
// being dropped as stale until the old state's deadlines pass.
func TestSourceRestart(t *testing.T) {
	e := New(Config{Timeout: time.Hour})
	for msn := uint32(5000); msn < 5003; msn++ {
		for _, s := range segs(src(1), 9, msn, 0, 300, 100) {
			deliver(e, s, t0)
		}
	}
	n := 0
	for msn := uint32(1); msn <= 4; msn++ {
		for _, s := range segs(src(1), 9, msn, 0, 300, 100) {
			if _, r := deliver(e, s, t0); r != nil {
				n++
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d of 4 messages after the restart recorded, want the last 2 (stats %+v)", n, e.Stats())
	}
}

// TestRememberedPastDeadlines: a key's newest MSN outlives the message's
// tombstone. A source that stalls mid-message for longer than two
// deadlines, or a segment the network delivers again that late, used to
// find the key free and start the message again — its bytes placed over
// whatever the region held by then (a newer message to the same place,
// recorded whole). Now any segment of that message, or of an older one,
// is dropped however late; a newer message starts as always.
func TestRememberedPastDeadlines(t *testing.T) {
	for _, policy := range []Policy{DeliverPartial, Discard} {
		e := New(Config{Timeout: time.Millisecond, Policy: policy})
		m4 := segs(src(1), 9, 4, 0, 300, 100)
		deliver(e, m4[0], t0)
		deliver(e, m4[1], t0) // m4[2] comes late
		e.Expire(t0.Add(time.Millisecond), func(Record) {})
		e.Expire(t0.Add(time.Hour), func(Record) { t.Fatal("a tombstone was recorded") })
		if e.InProgress() != 0 || e.Remembered() != 1 {
			t.Fatalf("%v: in progress %d, remembered %d", policy, e.InProgress(), e.Remembered())
		}
		for _, s := range []Segment{m4[2], m4[0], segs(src(1), 9, 3, 0, 300, 100)[1]} {
			if v, r := deliver(e, s, t0.Add(time.Hour)); v != Drop || r != nil {
				t.Fatalf("%v: a segment of MSN %d at %d, an hour on: %v %+v", policy, s.MSN, s.Offset, v, r)
			}
		}
		if st := e.Stats(); st.Duplicate != 3 { // an older MSN than a remembered one's counts as one too
			t.Fatalf("%v: stats %+v", policy, st)
		}
		var rec *Record
		for _, s := range segs(src(1), 9, 5, 0, 300, 100) {
			if _, r := deliver(e, s, t0.Add(time.Hour)); r != nil {
				rec = r
			}
		}
		if rec == nil || rec.MSN != 5 || !rec.Complete || e.Remembered() != 0 {
			t.Fatalf("%v: message 5: %+v, remembered %d", policy, rec, e.Remembered())
		}
	}
}

// TestOneSegmentRemembered: a one-segment message keeps no state but its
// number: a copy of it that comes again, or an older one, is dropped, not
// recorded (and placed) a second time; a source whose numbering starts
// again is recorded after two messages, as for longer messages.
func TestOneSegmentRemembered(t *testing.T) {
	e := New(Config{})
	one := func(msn uint32) Segment { return segs(src(1), 9, msn, uint64(msn%4)*100, 100, 100)[0] }
	for msn := uint32(10); msn < 20; msn++ {
		if v, r := deliver(e, one(msn), t0); v != PlaceNew || r == nil || r.MSN != msn {
			t.Fatalf("message %d: %v %+v", msn, v, r)
		}
	}
	if e.InProgress() != 0 || e.Remembered() != 1 {
		t.Fatalf("in progress %d, remembered %d", e.InProgress(), e.Remembered())
	}
	for _, msn := range []uint32{19, 15} {
		if v, r := deliver(e, one(msn), t0); v != Drop || r != nil {
			t.Fatalf("message %d again: %v %+v", msn, v, r)
		}
	}
	if st := e.Stats(); st.Duplicate != 2 || st.Completed != 10 {
		t.Fatalf("stats %+v", st)
	}
	// Restarted at 1: 1 is the second strike (15 was the first) and is
	// admitted; 2 follows.
	for _, msn := range []uint32{1, 2} {
		if v, r := deliver(e, one(msn), t0); v != PlaceNew || r == nil {
			t.Fatalf("restarted message %d: %v %+v (stats %+v)", msn, v, r, e.Stats())
		}
	}
}

// TestEnd: End ends the message in progress of a key now, as its
// deadline would, and its later segments are dropped.
func TestEnd(t *testing.T) {
	for _, policy := range []Policy{DeliverPartial, Discard} {
		e := New(Config{Policy: policy})
		if _, ok := e.End(src(1), 9, t0); ok {
			t.Fatal("ended a message that does not exist")
		}
		m := segs(src(1), 9, 3, 1000, 300, 100)
		deliver(e, m[0], t0)
		deliver(e, m[1], t0)
		rec, ok := e.End(src(1), 9, t0)
		if want := policy == DeliverPartial; ok != want {
			t.Fatalf("%v: ended with a record %v", policy, ok)
		}
		if ok && (rec.Complete || rec.MSN != 3 || len(rec.Valid) != 1 || rec.Valid[0] != (validitymap.Range{Start: 1000, End: 1200})) {
			t.Fatalf("%v: record %+v", policy, rec)
		}
		if v, r := deliver(e, m[2], t0); v != Drop || r != nil {
			t.Fatalf("%v: its last segment after End: %v %+v", policy, v, r)
		}
		if _, ok := e.End(src(1), 9, t0); ok {
			t.Fatalf("%v: ended twice", policy)
		}
	}
}

// TestMaxRemembered: the keys remembered are capped; the one remembered
// longest ago goes first, counted. EndSource forgets a source's.
func TestMaxRemembered(t *testing.T) {
	e := New(Config{MaxRemembered: 8})
	for i := range 20 {
		deliver(e, Segment{Source: src(i), STag: 9, MSN: 7, Length: 10, N: 10}, t0)
	}
	if e.Remembered() != 8 || e.Stats().Forgotten != 12 {
		t.Fatalf("remembered %d, forgotten %d", e.Remembered(), e.Stats().Forgotten)
	}
	old := Segment{Source: src(19), STag: 9, MSN: 6, Length: 10, N: 10}
	if v := e.Admit(&old, t0); v != Drop {
		t.Fatalf("an older message of a key remembered: %v", v)
	}
	if v := e.Admit(&Segment{Source: src(0), STag: 9, MSN: 6, Length: 10, N: 10}, t0); v != PlaceNew {
		t.Fatalf("a key forgotten: %v", v)
	}
	e.EndSource(src(19), func(Record) {})
	if v := e.Admit(&old, t0); v != PlaceNew {
		t.Fatalf("after EndSource: %v", v)
	}
}
