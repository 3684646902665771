package reliability

import (
	"net/netip"
	"testing"
)

// TestGraveyard: a buried session is remembered by peer and epoch, and a
// second burial of it takes no second place.
func TestGraveyard(t *testing.T) {
	g := NewGraveyard[string](4, NewTokens())
	g.Bury("a", 1)
	g.Bury("a", 1) // again: still one grave
	if !g.Buried("a", 1) || g.Buried("a", 2) || g.Buried("b", 1) || g.Len() != 1 {
		t.Fatalf("after burying a/1: a/1 %v, a/2 %v, b/1 %v, len %d", g.Buried("a", 1), g.Buried("a", 2), g.Buried("b", 1), g.Len())
	}
}

// TestGraveyardNeverForgetsAnOpenableSession: however many sessions
// other peers bury, a grave is forgotten only once the tokens its
// session could carry no longer verify — both kinds, the one issued with
// a known local epoch (Valid) and the one issued with a derived epoch
// (Derive) — while the memory stays within two generations. The test
// fails with a graveyard that forgets the oldest grave at capacity
// without rotating the tokens.
func TestGraveyardNeverForgetsAnOpenableSession(t *testing.T) {
	const n = 8
	tk := NewTokens()
	g := NewGraveyard[netip.AddrPort](n, tk)
	victim := netip.MustParseAddrPort("127.0.0.1:4791")
	churner := netip.MustParseAddrPort("127.0.0.2:4791")
	// The victim's session: opened with a derived epoch (its Challenge
	// came from a QP with no state) and a known one (a QP with state).
	derived := tk.Epoch(victim, 5, 77, 6)
	keyed := tk.Issue(victim, 5, 77, 6, derived)
	known := tk.Issue(victim, 5, 77, 6, 999)
	g.Bury(victim, 77)
	rotations := 0
	for e := uint32(1); e <= 10*n; e++ {
		before := tk.Issue(churner, 1, 0, 1, 0)
		g.Bury(churner, e)
		if tk.Issue(churner, 1, 0, 1, 0) != before {
			rotations++
		}
		if g.Len() > 2*n {
			t.Fatalf("after %d burials: %d graves, more than two generations of %d", e, g.Len(), n)
		}
		buried := g.Buried(victim, 77)
		_, derivable := tk.Derive(keyed, victim, 5, 77, 6)
		valid := tk.Valid(known, victim, 5, 77, 6, 999)
		if !buried && (derivable || valid) {
			t.Fatalf("after %d burials by another peer (%d rotations): the victim's grave is gone, and its tokens still open it (derived %v, known epoch %v)",
				e, rotations, derivable, valid)
		}
		if buried != (rotations < 2) {
			t.Fatalf("after %d burials, %d rotations: victim buried %v", e, rotations, buried)
		}
	}
	if rotations < 2 {
		t.Fatalf("%d rotations: the test did not test", rotations)
	}
}

// TestTokensRotate: a token issued under the secret before the current
// one still verifies, and a derived epoch is still found; two rotations
// later neither is.
func TestTokensRotate(t *testing.T) {
	tk := NewTokens()
	peer := netip.MustParseAddrPort("127.0.0.1:4791")
	d := tk.Epoch(peer, 5, 100, 6)
	tok := tk.Issue(peer, 5, 100, 6, d)
	if e, ok := tk.Derive(tok, peer, 5, 100, 6); !ok || e != d {
		t.Fatalf("Derive before rotating: %d %v, want %d", e, ok, d)
	}
	tk.Rotate()
	if e, ok := tk.Derive(tok, peer, 5, 100, 6); !ok || e != d || !tk.Valid(tok, peer, 5, 100, 6, d) {
		t.Fatalf("after one rotation: Derive %d %v, Valid %v", e, ok, tk.Valid(tok, peer, 5, 100, 6, d))
	}
	if tk.Epoch(peer, 5, 100, 6) == d || tk.Issue(peer, 5, 100, 6, d) == tok {
		t.Fatal("the new secret issues what the old one did")
	}
	tk.Rotate()
	if _, ok := tk.Derive(tok, peer, 5, 100, 6); ok || tk.Valid(tok, peer, 5, 100, 6, d) {
		t.Fatal("a token of two secrets ago still verifies")
	}
	if _, ok := tk.Derive(0, peer, 5, 100, 6); ok {
		t.Fatal("token 0 verifies")
	}
}
