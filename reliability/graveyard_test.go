package reliability

import "testing"

// TestGraveyard: a buried session is remembered by peer and epoch, a
// second burial of it takes no second place, and at capacity the oldest
// is forgotten first, one for one.
func TestGraveyard(t *testing.T) {
	const n = 4
	g := NewGraveyard[string](n)
	g.Bury("a", 1)
	g.Bury("a", 1) // again: still one grave
	if !g.Buried("a", 1) || g.Buried("a", 2) || g.Buried("b", 1) || g.Len() != 1 {
		t.Fatalf("after burying a/1: a/1 %v, a/2 %v, b/1 %v, len %d", g.Buried("a", 1), g.Buried("a", 2), g.Buried("b", 1), g.Len())
	}
	for e := uint32(2); e <= n; e++ {
		g.Bury("a", e)
	}
	if g.Len() != n {
		t.Fatalf("len %d, want %d", g.Len(), n)
	}
	for e := uint32(n + 1); e <= 3*n; e++ {
		g.Bury("a", e)
		if g.Len() != n {
			t.Fatalf("len %d after burying epoch %d, want the capacity %d", g.Len(), e, n)
		}
		for old := uint32(1); old <= e; old++ {
			if want := old > e-n; g.Buried("a", old) != want {
				t.Fatalf("after epoch %d: epoch %d buried %v, want %v (the last %d only)", e, old, !want, want, n)
			}
		}
	}
}
