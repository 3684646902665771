package writerecord

import "github.com/udiwarp/udiwarp/validitymap"

// ranges is the sorted, disjoint set of byte ranges a message in progress
// has received. Messages lose few segments, so a short slice beats a tree.
type ranges []validitymap.Range

// add inserts [s, e), merging, and returns how many bytes were new, so
// that duplicated segments do not count twice.
func (rs *ranges) add(s, e uint64) uint64 {
	if e <= s {
		return 0
	}
	r := *rs
	// Find the first range that ends at or after s.
	i := 0
	for i < len(r) && r[i].End < s {
		i++
	}
	covered := uint64(0)
	j := i
	ns, ne := s, e
	for j < len(r) && r[j].Start <= e {
		lo, hi := max(r[j].Start, s), min(r[j].End, e)
		if hi > lo {
			covered += hi - lo
		}
		ns, ne = min(ns, r[j].Start), max(ne, r[j].End)
		j++
	}
	merged := validitymap.Range{Start: ns, End: ne}
	switch {
	case j == i:
		r = append(r, validitymap.Range{})
		copy(r[i+1:], r[i:])
		r[i] = merged
	default:
		r[i] = merged
		r = append(r[:i+1], r[j:]...)
	}
	*rs = r
	return (e - s) - covered
}
