package writerecord

import (
	"github.com/google/btree"
	"github.com/udiwarp/udiwarp/validitymap"
)

// ranges is the sorted, disjoint set of byte runs a message in progress
// has received, relative to the message's start; runs that touch are
// merged. Most messages arrive as one run, kept inline at no allocation.
// Once loss or reordering splits it, the runs move to a B-tree keyed by
// start, so that adding a segment costs O(log n) whatever the order of
// arrival — a sorted slice costs a copy of O(n) runs per insertion, and
// 80 000 one-byte segments in descending order copied 51 GB. Each run
// merged away is deleted once, so merging is amortised in the insertions
// that made the runs. The engine caps n per message (Config.MaxRanges).
type ranges struct {
	one validitymap.Range // the only run, while t is nil and n == 1
	n   int
	t   *rtree
}

// rtree holds a split message's runs, with scratch for the tree's
// iterators, bound once per tree so that an insertion allocates nothing.
type rtree struct {
	bt    *btree.BTreeG[validitymap.Range]
	found validitymap.Range
	ok    bool
	first btree.ItemIteratorG[validitymap.Range] // keeps the first item visited
}

const rangesDegree = 8

func rangeLess(a, b validitymap.Range) bool { return a.Start < b.Start }

// len returns the number of disjoint runs.
func (rs *ranges) len() int { return rs.n }

// first returns the lowest run.
func (rs *ranges) first() (validitymap.Range, bool) {
	switch {
	case rs.n == 0:
		return validitymap.Range{}, false
	case rs.t == nil:
		return rs.one, true
	}
	return rs.t.bt.Min()
}

// each calls f for every run in order.
func (rs *ranges) each(f func(validitymap.Range)) {
	switch {
	case rs.n == 0:
	case rs.t == nil:
		f(rs.one)
	default:
		rs.t.bt.Ascend(func(r validitymap.Range) bool { f(r); return true })
	}
}

// reset empties the set, returning a tree's nodes to its free list.
func (rs *ranges) reset() {
	if rs.t != nil {
		rs.t.bt.Clear(true)
	}
	*rs = ranges{}
}

// floor finds the run with the greatest start <= p.
func (rs *ranges) floor(p uint64) (validitymap.Range, bool) {
	t := rs.t
	t.ok = false
	t.bt.DescendLessOrEqual(validitymap.Range{Start: p}, t.first)
	return t.found, t.ok
}

// ceil finds the run with the least start >= p.
func (rs *ranges) ceil(p uint64) (validitymap.Range, bool) {
	t := rs.t
	t.ok = false
	t.bt.AscendGreaterOrEqual(validitymap.Range{Start: p}, t.first)
	return t.found, t.ok
}

// adds reports whether [s, e) would add a run: it touches none.
func (rs *ranges) adds(s, e uint64) bool {
	switch {
	case e <= s:
		return false
	case rs.n == 0:
		return true
	case rs.t == nil:
		return rs.one.End < s || rs.one.Start > e
	}
	if r, ok := rs.floor(s); ok && r.End >= s {
		return false
	}
	r, ok := rs.ceil(s)
	return !ok || r.Start > e
}

// add inserts [s, e), merging, and returns how many bytes were new, so
// that duplicated segments do not count twice.
func (rs *ranges) add(s, e uint64, fl *btree.FreeListG[validitymap.Range]) uint64 {
	if e <= s {
		return 0
	}
	if rs.n == 0 {
		rs.one, rs.n = validitymap.Range{Start: s, End: e}, 1
		return e - s
	}
	if rs.t == nil {
		r := rs.one
		if r.End >= s && r.Start <= e { // touches: still one run
			rs.one = validitymap.Range{Start: min(r.Start, s), End: max(r.End, e)}
			return (e - s) - overlap(r, s, e)
		}
		if fl == nil {
			fl = btree.NewFreeListG[validitymap.Range](btree.DefaultFreeListSize)
		}
		t := &rtree{bt: btree.NewWithFreeListG(rangesDegree, rangeLess, fl)}
		t.first = func(r validitymap.Range) bool { t.found, t.ok = r, true; return false }
		t.bt.ReplaceOrInsert(r)
		t.bt.ReplaceOrInsert(validitymap.Range{Start: s, End: e})
		rs.t = t
		rs.n = 2
		return e - s
	}
	ns, ne := s, e
	covered := uint64(0)
	if r, ok := rs.floor(s); ok && r.End >= s {
		covered += overlap(r, s, e)
		ns, ne = r.Start, max(ne, r.End)
		rs.t.bt.Delete(r)
		rs.n--
	}
	for {
		r, ok := rs.ceil(s)
		if !ok || r.Start > e {
			break
		}
		covered += overlap(r, s, e)
		ne = max(ne, r.End)
		rs.t.bt.Delete(r)
		rs.n--
	}
	rs.t.bt.ReplaceOrInsert(validitymap.Range{Start: ns, End: ne})
	rs.n++
	return (e - s) - covered
}

// overlap returns how many bytes of [s, e) r covers.
func overlap(r validitymap.Range, s, e uint64) uint64 {
	lo, hi := max(r.Start, s), min(r.End, e)
	if hi > lo {
		return hi - lo
	}
	return 0
}
