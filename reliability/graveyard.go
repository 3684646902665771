package reliability

// Graveyard remembers the sessions that ended, each named by its peer and
// the epoch the peer had in it, so that a frame of an ended session —
// late, or sent again by a peer that has not yet learnt the session
// ended — cannot open it again, however valid its keyed token: a token
// binds a session's epochs (Tokens), and a buried session's epochs open
// nothing.
//
// Its memory is bounded without ever forgetting a grave whose session
// could still be opened. The graves are kept in two generations, each
// of at most its capacity, tied to the two secrets of the Tokens it
// guards: the sessions buried while the current secret issues tokens
// are in the current generation, the ones buried before it in the
// previous one. When the current generation is full, the previous one
// is forgotten and the Tokens rotated in the same step (Tokens.Rotate):
// every token the forgotten graves' sessions could carry was issued
// under a secret that no longer verifies anything, so no frame of those
// sessions can open one. No churn, by any peer, frees another session's
// grave while its tokens are still good; the cost of churn is a rotation
// (a handshake in flight across two of them starts again).
//
// It is not safe for concurrent use (its owner's lock guards it, as the
// peer table's does).
type Graveyard[K comparable] struct {
	cur, prev map[grave[K]]struct{}
	n         int
	tokens    *Tokens
}

type grave[K comparable] struct {
	key   K
	epoch uint32
}

// NewGraveyard returns a graveyard that keeps up to n sessions a
// generation (at most 2n in all) for the sessions whose tokens t issues.
func NewGraveyard[K comparable](n int, t *Tokens) *Graveyard[K] {
	n = max(n, 1)
	return &Graveyard[K]{cur: make(map[grave[K]]struct{}), prev: make(map[grave[K]]struct{}), n: n, tokens: t}
}

// Bury remembers that the session with peer k at its epoch ended. When
// the current generation is full, it turns a generation first: the
// previous one is forgotten and the Tokens rotated.
func (g *Graveyard[K]) Bury(k K, epoch uint32) {
	e := grave[K]{k, epoch}
	if _, ok := g.cur[e]; ok {
		return
	}
	if len(g.cur) >= g.n {
		clear(g.prev)
		g.prev, g.cur = g.cur, g.prev
		g.tokens.Rotate()
	}
	g.cur[e] = struct{}{}
}

// Buried reports whether the session with peer k at its epoch ended.
func (g *Graveyard[K]) Buried(k K, epoch uint32) bool {
	e := grave[K]{k, epoch}
	if _, ok := g.cur[e]; ok {
		return true
	}
	_, ok := g.prev[e]
	return ok
}

// Len is how many sessions the graveyard remembers.
func (g *Graveyard[K]) Len() int { return len(g.cur) + len(g.prev) }
