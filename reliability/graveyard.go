package reliability

// Graveyard remembers the last sessions that ended, each named by its
// peer and the epoch the peer had in it, so that a frame of an ended
// session — late, or sent again by a peer that has not yet learnt the
// session ended — cannot open it again, however valid its keyed token:
// a token binds a session's epochs (Tokens), and a buried session's
// epochs open nothing. It holds at most its capacity and forgets the
// oldest first; it is not safe for concurrent use (its owner's lock
// guards it, as the peer table's does).
type Graveyard[K comparable] struct {
	set  map[grave[K]]struct{}
	ring []grave[K] // the graves in burial order, oldest at at once full
	at   int
}

type grave[K comparable] struct {
	key   K
	epoch uint32
}

// NewGraveyard returns a graveyard that remembers up to n sessions.
func NewGraveyard[K comparable](n int) *Graveyard[K] {
	return &Graveyard[K]{set: make(map[grave[K]]struct{}, n), ring: make([]grave[K], 0, max(n, 1))}
}

// Bury remembers that the session with peer k at its epoch ended.
func (g *Graveyard[K]) Bury(k K, epoch uint32) {
	e := grave[K]{k, epoch}
	if _, ok := g.set[e]; ok {
		return
	}
	if len(g.ring) < cap(g.ring) {
		g.ring = append(g.ring, e)
	} else {
		delete(g.set, g.ring[g.at])
		g.ring[g.at] = e
		g.at = (g.at + 1) % len(g.ring)
	}
	g.set[e] = struct{}{}
}

// Buried reports whether the session with peer k at its epoch ended.
func (g *Graveyard[K]) Buried(k K, epoch uint32) bool {
	_, ok := g.set[grave[K]{k, epoch}]
	return ok
}

// Len is how many sessions the graveyard remembers.
func (g *Graveyard[K]) Len() int { return len(g.set) }
