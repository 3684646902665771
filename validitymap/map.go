package validitymap

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"sync"

	"github.com/google/btree"
)

// Range is the half-open byte range [Start, End).
type Range struct {
	Start, End uint64
}

// Len returns the range's length in bytes.
func (r Range) Len() uint64 { return r.End - r.Start }

func (r Range) String() string { return fmt.Sprintf("[%d, %d)", r.Start, r.End) }

var (
	// ErrFull: the insert would need one disjoint range more than the limit.
	ErrFull = errors.New("validitymap: range limit reached")
	// ErrRange: a range that wraps past 2^64 or is otherwise malformed.
	ErrRange = errors.New("validitymap: invalid range")
)

// DefaultLimit is the number of disjoint ranges a Map holds by default:
// 65536, about 3 MiB at worst (a B-tree item is 16 bytes plus node
// overhead). A 64 MiB region written in 1 KiB segments with every other
// segment lost needs 32768.
const DefaultLimit = 1 << 16

// Map is a set of valid byte ranges. Its zero value is not usable; call New.
type Map struct {
	mu    sync.RWMutex
	t     *btree.BTreeG[Range]
	limit int
	bytes uint64 // total valid bytes

	// Scratch for the writer (under mu held exclusively); the callbacks
	// are bound once, so writes do not allocate.
	scratch []Range
	qEnd    uint64
	collect btree.ItemIteratorG[Range]
}

func less(a, b Range) bool { return a.Start < b.Start }

// New returns an empty Map that holds at most limit disjoint ranges
// (DefaultLimit when limit <= 0).
func New(limit int) *Map {
	if limit <= 0 {
		limit = DefaultLimit
	}
	m := &Map{t: btree.NewWithFreeListG(16, less, btree.NewFreeListG[Range](64)), limit: limit}
	m.collect = m.collectUpTo
	return m
}

// collectUpTo gathers ranges starting at or before qEnd into scratch.
func (m *Map) collectUpTo(r Range) bool {
	if r.Start > m.qEnd {
		return false
	}
	m.scratch = append(m.scratch, r)
	return true
}

func check(off, n uint64) (Range, error) {
	if n > math.MaxUint64-off {
		return Range{}, fmt.Errorf("%w: offset %d length %d wraps", ErrRange, off, n)
	}
	return Range{off, off + n}, nil
}

// gather collects into scratch, in order, the ranges that overlap r, and
// with touching also those that merely touch it (end where r starts or
// start where r ends).
func (m *Map) gather(r Range, touching bool) {
	m.scratch = m.scratch[:0]
	if p, ok := m.floor(r.Start); ok && (p.End > r.Start || touching && p.End == r.Start) {
		m.scratch = append(m.scratch, p)
	}
	m.qEnd = r.End - 1 // r is not empty
	if touching {
		m.qEnd = r.End
	}
	m.t.AscendGreaterOrEqual(Range{Start: r.Start + 1}, m.collect)
}

// floor returns the range with the greatest Start <= x.
func (m *Map) floor(x uint64) (r Range, ok bool) {
	m.t.DescendLessOrEqual(Range{Start: x}, func(it Range) bool {
		r, ok = it, true
		return false
	})
	return r, ok
}

// Insert marks [off, off+n) valid, merging it with every range it
// overlaps or touches. At the limit, an insert that would add a disjoint
// range is refused with ErrFull and changes nothing; one that merges
// always succeeds.
func (m *Map) Insert(off, n uint64) error {
	r, err := check(off, n)
	if err != nil || n == 0 {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gather(r, true)
	if len(m.scratch) == 0 && m.t.Len() >= m.limit {
		return fmt.Errorf("%w: %d ranges", ErrFull, m.t.Len())
	}
	for _, p := range m.scratch {
		r.Start, r.End = min(r.Start, p.Start), max(r.End, p.End)
		m.t.Delete(p)
		m.bytes -= p.Len()
	}
	m.t.ReplaceOrInsert(r)
	m.bytes += r.Len()
	return nil
}

// Valid reports whether every byte of [off, off+n) is valid.
func (m *Map) Valid(off, n uint64) bool {
	r, err := check(off, n)
	if err != nil {
		return false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if n == 0 {
		return true
	}
	p, ok := m.floor(r.Start)
	return ok && p.End >= r.End
}

// Invalidate marks [off, off+n) not valid, as when the application has
// consumed the data. Cutting a hole in a range adds one disjoint range; at
// the limit the part after the hole is invalidated too, so that the Map
// never claims bytes valid that are not.
func (m *Map) Invalidate(off, n uint64) error {
	r, err := check(off, n)
	if err != nil || n == 0 {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gather(r, false)
	for _, p := range m.scratch {
		m.t.Delete(p)
		m.bytes -= p.Len()
		if p.Start < r.Start {
			left := Range{p.Start, r.Start}
			m.t.ReplaceOrInsert(left)
			m.bytes += left.Len()
		}
		if p.End > r.End && m.t.Len() < m.limit {
			right := Range{r.End, p.End}
			m.t.ReplaceOrInsert(right)
			m.bytes += right.Len()
		}
	}
	return nil
}

// Clear invalidates everything.
func (m *Map) Clear() {
	m.mu.Lock()
	m.t.Clear(true)
	m.bytes = 0
	m.mu.Unlock()
}

// Ranges returns the number of disjoint valid ranges.
func (m *Map) Ranges() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.t.Len()
}

// Bytes returns the number of valid bytes.
func (m *Map) Bytes() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.bytes
}

// Limit returns the most disjoint ranges the Map holds.
func (m *Map) Limit() int { return m.limit }

// All yields the valid ranges in order. The Map is read-locked while the
// loop runs: the loop must not write to it.
func (m *Map) All() iter.Seq[Range] {
	return func(yield func(Range) bool) {
		m.mu.RLock()
		defer m.mu.RUnlock()
		m.t.Ascend(func(r Range) bool { return yield(r) })
	}
}

// Snapshot appends the valid ranges, in order, to dst and returns it: a
// copy the caller may keep while the Map changes.
func (m *Map) Snapshot(dst []Range) []Range {
	m.mu.RLock()
	defer m.mu.RUnlock()
	m.t.Ascend(func(r Range) bool {
		dst = append(dst, r)
		return true
	})
	return dst
}
