package writerecord

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/validitymap"
)

func (rs *ranges) list() []validitymap.Range {
	var out []validitymap.Range
	rs.each(func(r validitymap.Range) { out = append(out, r) })
	return out
}

// naive is the obvious model of ranges: a byte map.
type naive map[uint64]bool

func (n naive) add(s, e uint64) uint64 {
	k := uint64(0)
	for i := s; i < e; i++ {
		if !n[i] {
			n[i] = true
			k++
		}
	}
	return k
}

func (n naive) runs() []validitymap.Range {
	var keys []uint64
	for k := range n {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []validitymap.Range
	for _, k := range keys {
		if l := len(out); l > 0 && out[l-1].End == k {
			out[l-1].End++
		} else {
			out = append(out, validitymap.Range{Start: k, End: k + 1})
		}
	}
	return out
}

// TestRangesModel checks the B-tree runs against a byte map on random
// insertions: new-byte counts, runs, and whether an insertion adds a run.
func TestRangesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		var rs ranges
		m := naive{}
		for range 1 + r.IntN(60) {
			s := uint64(r.IntN(300))
			e := s + uint64(r.IntN(12))
			before := len(m.runs())
			adds := rs.adds(s, e)
			if got, want := rs.add(s, e, nil), m.add(s, e); got != want {
				t.Fatalf("round %d: add(%d,%d) = %d new bytes, want %d", round, s, e, got, want)
			}
			if want := m.runs(); !slices.Equal(rs.list(), want) || rs.len() != len(want) {
				t.Fatalf("round %d: runs %v (len %d), want %v", round, rs.list(), rs.len(), want)
			}
			if grew := len(m.runs()) > before; adds != grew {
				t.Fatalf("round %d: adds(%d,%d) = %v, runs %d -> %d", round, s, e, adds, before, len(m.runs()))
			}
		}
		if f, ok := rs.first(); ok != (len(m) > 0) || ok && f != m.runs()[0] {
			t.Fatalf("first %v %v", f, ok)
		}
		rs.reset()
		if rs.len() != 0 || len(rs.list()) != 0 {
			t.Fatal("reset left runs")
		}
	}
}

// TestRangeCap sends 80 000 one-byte segments of a 160 000-byte message,
// none touching another, in random order. The message must end when it
// would hold more than MaxRanges runs — recorded partial with exactly the
// runs that arrived, or discarded, by its policy — and every later
// segment of it must be dropped at O(1), never placed nor recorded.
func TestRangeCap(t *testing.T) {
	const n, limit = 80_000, 1024
	order := rand.New(rand.NewPCG(5, 6)).Perm(n)
	for _, policy := range []Policy{DeliverPartial, Discard} {
		t.Run(policy.String(), func(t *testing.T) {
			e := New(Config{Policy: policy, MaxRanges: limit})
			var want []validitymap.Range
			placed, dropped := 0, 0
			var ended []Record
			for i, k := range order {
				s := Segment{Source: src(1), STag: 7, MSN: 1, MessageTO: 1 << 20, Length: 2 * n, Offset: uint32(2 * k), N: 1}
				v := e.Admit(&s, t0)
				if r, ok := e.Ended(); ok {
					ended = append(ended, r)
				}
				if v == Drop {
					dropped++
					continue
				}
				if i >= limit {
					t.Fatalf("segment %d placed beyond the cap", i)
				}
				placed++
				want = append(want, validitymap.Range{Start: 1<<20 + uint64(2*k), End: 1<<20 + uint64(2*k) + 1})
				if _, ok := e.Placed(&s); ok {
					t.Fatal("recorded complete")
				}
			}
			st := e.Stats()
			if placed != limit || dropped != n-limit || st.Fragmented != 1 || st.Duplicate != n-limit-1 {
				t.Fatalf("placed %d, dropped %d, stats %+v", placed, dropped, st)
			}
			slices.SortFunc(want, func(a, b validitymap.Range) int { return int(a.Start) - int(b.Start) })
			switch policy {
			case DeliverPartial:
				if len(ended) != 1 || ended[0].Complete || ended[0].MSN != 1 || !slices.Equal(ended[0].Valid, want) || st.Partial != 1 {
					t.Fatalf("partial record %d records, stats %+v", len(ended), st)
				}
			case Discard:
				if len(ended) != 0 || st.Partial != 0 {
					t.Fatalf("discard recorded %d", len(ended))
				}
			}
			// The message is a tombstone: nothing more of it is recorded,
			// and a newer message starts as usual.
			e.Expire(t0.Add(time.Hour), func(r Record) { t.Fatalf("recorded at expiry: %+v", r) })
			if e.InProgress() != 0 {
				t.Fatal("state left behind")
			}
		})
	}
}
