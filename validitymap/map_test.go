package validitymap

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// model is the obvious implementation: one bool per byte of a small space.
type model []bool

func (b model) set(off, n uint64, v bool) {
	for i := off; i < off+n; i++ {
		b[i] = v
	}
}

func (b model) valid(off, n uint64) bool {
	for i := off; i < off+n; i++ {
		if !b[i] {
			return false
		}
	}
	return true
}

func (b model) ranges() []Range {
	var out []Range
	for i := 0; i < len(b); {
		if !b[i] {
			i++
			continue
		}
		j := i
		for j < len(b) && b[j] {
			j++
		}
		out = append(out, Range{uint64(i), uint64(j)})
		i = j
	}
	return out
}

// checkAgainst compares every observable of m with the model.
func checkAgainst(t *testing.T, m *Map, b model) {
	t.Helper()
	want := b.ranges()
	got := m.Snapshot(nil)
	if !slices.Equal(got, want) {
		t.Fatalf("ranges %v, model %v", got, want)
	}
	var all []Range
	for r := range m.All() {
		all = append(all, r)
	}
	if !slices.Equal(all, want) {
		t.Fatalf("All() %v, model %v", all, want)
	}
	var bytes uint64
	for _, r := range want {
		bytes += r.Len()
	}
	if m.Bytes() != bytes || m.Ranges() != len(want) {
		t.Fatalf("Bytes %d Ranges %d, model %d %d", m.Bytes(), m.Ranges(), bytes, len(want))
	}
}

// run applies a script of operations, decoded from bytes, to a Map and to
// the model, and checks them after every step.
func run(t *testing.T, script []byte, limit int) {
	const space = 256
	m := New(limit)
	b := make(model, space)
	for len(script) >= 3 {
		op, off, n := script[0]%4, uint64(script[1]), uint64(script[2])%64
		script = script[3:]
		if off+n > space {
			n = space - off
		}
		switch op {
		case 0, 1:
			before := m.Snapshot(nil)
			err := m.Insert(off, n)
			switch {
			case errors.Is(err, ErrFull):
				if m.Ranges() < limit || !slices.Equal(m.Snapshot(nil), before) {
					t.Fatalf("ErrFull below the limit or with a change")
				}
			case err != nil:
				t.Fatal(err)
			default:
				b.set(off, n, true)
			}
		case 2:
			if err := m.Invalidate(off, n); err != nil {
				t.Fatal(err)
			}
			b.set(off, n, false)
			if m.Ranges() >= limit {
				// At the limit, Invalidate may drop more than asked: the map
				// must only ever be a subset of the model.
				for _, r := range m.Snapshot(nil) {
					if !b.valid(r.Start, r.Len()) {
						t.Fatalf("invalid bytes claimed valid: %v", r)
					}
				}
				b = model(slices.Repeat([]bool{false}, space))
				for _, r := range m.Snapshot(nil) {
					b.set(r.Start, r.Len(), true)
				}
			}
		case 3:
			if got, want := m.Valid(off, n), b.valid(off, n); got != want {
				t.Fatalf("Valid(%d, %d) = %v, model %v", off, n, got, want)
			}
		}
		checkAgainst(t, m, b)
	}
}

func TestAgainstBitmapModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		script := make([]byte, 3*200)
		for i := range script {
			script[i] = byte(r.Uint32())
		}
		run(t, script, DefaultLimit)
		run(t, script, 4) // a small limit exercises ErrFull and lossy Invalidate
	}
}

func FuzzAgainstBitmapModel(f *testing.F) {
	f.Add([]byte{0, 10, 5, 0, 20, 5, 2, 12, 10, 3, 0, 30}, uint8(4))
	f.Add([]byte{1, 0, 63, 1, 63, 63, 2, 5, 1, 3, 0, 200}, uint8(2))
	f.Fuzz(func(t *testing.T, script []byte, limit uint8) {
		run(t, script, int(limit%16)+1)
	})
}

func TestMerging(t *testing.T) {
	m := New(0)
	m.Insert(10, 10) // [10,20)
	m.Insert(30, 10) // [30,40)
	m.Insert(20, 10) // touches both: [10,40)
	if got := m.Snapshot(nil); !slices.Equal(got, []Range{{10, 40}}) {
		t.Fatalf("%v", got)
	}
	m.Invalidate(15, 10) // [10,15) [25,40)
	if got := m.Snapshot(nil); !slices.Equal(got, []Range{{10, 15}, {25, 40}}) {
		t.Fatalf("%v", got)
	}
	if !m.Valid(25, 15) || m.Valid(14, 2) || !m.Valid(0, 0) {
		t.Fatal("Valid")
	}
	if m.Insert(math.MaxUint64-1, 2) == nil || m.Invalidate(math.MaxUint64, 2) == nil || m.Valid(math.MaxUint64, 2) {
		t.Fatal("a wrapping range was accepted")
	}
	if err := m.Insert(math.MaxUint64-1, 1); err != nil {
		t.Fatal(err) // the last byte of the space is fine
	}
	m.Clear()
	if m.Ranges() != 0 || m.Bytes() != 0 {
		t.Fatal("Clear")
	}
}

func TestLimit(t *testing.T) {
	m := New(2)
	m.Insert(0, 1)
	m.Insert(10, 1)
	if err := m.Insert(20, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("third range of two: %v", err)
	}
	if err := m.Insert(1, 9); err != nil { // merges: always allowed
		t.Fatal(err)
	}
	if got := m.Snapshot(nil); !slices.Equal(got, []Range{{0, 11}}) {
		t.Fatalf("%v", got)
	}
	m.Insert(20, 5)
	m.Invalidate(5, 1) // would make three: the part after the hole goes too
	if got := m.Snapshot(nil); !slices.Equal(got, []Range{{0, 5}, {20, 25}}) {
		t.Fatalf("%v", got)
	}
}

// TestConcurrentReaders runs readers beside one writer (under -race).
func TestConcurrentReaders(t *testing.T) {
	m := New(0)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				prev := uint64(0)
				for r := range m.All() {
					if r.Start < prev || r.End <= r.Start {
						t.Errorf("ranges out of order: %v after %d", r, prev)
					}
					prev = r.End + 1
				}
				m.Valid(100, 50)
			}
		}()
	}
	for i := range 5000 {
		off := uint64(i * 7 % 4000)
		if i%3 == 2 {
			m.Invalidate(off, 5)
		} else {
			m.Insert(off, 6)
		}
	}
	close(stop)
	wg.Wait()
}

func BenchmarkInsert(b *testing.B) {
	m := New(0)
	b.ReportAllocs()
	i := uint64(0)
	for b.Loop() {
		// Segments of a 1 MiB region arriving with every 8th lost: a mix of
		// fresh ranges and merges; the map is reset every pass.
		off := (i % 1024) * 1024
		if i%8 != 7 {
			m.Insert(off, 1024)
		}
		i++
		if i%1024 == 0 {
			m.Clear()
		}
	}
}

func BenchmarkValid(b *testing.B) {
	m := New(0)
	for i := uint64(0); i < 1024; i++ {
		if i%8 != 7 {
			m.Insert(i*1024, 1024)
		}
	}
	b.ReportAllocs()
	i := uint64(0)
	for b.Loop() {
		m.Valid((i%1024)*1024, 512)
		i++
	}
}
