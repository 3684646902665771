package writerecord

import (
	"fmt"
	"testing"
)

// BenchmarkRangesInsert adds n one-byte runs to one message's set in the
// worst order for a sorted slice (descending, none touching: each lands
// in front of all the others) and reports the cost per insertion, which
// must grow as log n, not as n.
func BenchmarkRangesInsert(b *testing.B) {
	for _, n := range []int{1000, 10_000, 80_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r ranges
				for i := n; i > 0; i-- {
					s := uint64(2 * i)
					r.add(s, s+1, nil)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/insert")
		})
	}
}
