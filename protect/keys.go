package protect

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
)

// The key schedule (docs/wire.md §12.3). Each direction of a pair of
// devices has a traffic secret; generation g of its keys is
//
//	secret_0 = from the contact or the pre-shared key
//	secret_g = HKDF-Expand(secret_g-1, "udiwarp ku", 32)
//	key_g    = HKDF-Expand(secret_g, "udiwarp key", 16)
//	iv_g     = HKDF-Expand(secret_g, "udiwarp iv", 12)
//
// and the nonce of packet number pn is iv_g XOR pn (big-endian, in the
// last 8 bytes), as QUIC builds it (RFC 9001 §5.3). A packet number is
// never used twice under one key ID, so a nonce never repeats under a
// key; a sender moves to the next generation every KeyUpdateAfter
// packets, flipping the PHASE flag (RFC 9001 §6).

const secretSize = 32

// gen is one generation of a direction's keys.
type gen struct {
	n      uint64
	secret [secretSize]byte
	aead   cipher.AEAD
	iv     [12]byte
	// prev is the generation before (a sender's, while writers that drew
	// their numbers under it may still seal), cleared one update later.
	prev atomic.Pointer[gen]
}

func expand(secret []byte, label string, n int) []byte {
	b, err := hkdf.Expand(sha256.New, secret, label, n)
	if err != nil {
		panic(err) // only for lengths out of range
	}
	return b
}

func newGen(n uint64, secret []byte) *gen {
	g := &gen{n: n}
	copy(g.secret[:], secret)
	blk, err := aes.NewCipher(expand(secret, "udiwarp key", 16))
	if err != nil {
		panic(err)
	}
	if g.aead, err = cipher.NewGCM(blk); err != nil {
		panic(err)
	}
	copy(g.iv[:], expand(secret, "udiwarp iv", 12))
	return g
}

// next is generation n+1.
func (g *gen) next() *gen { return newGen(g.n+1, expand(g.secret[:], "udiwarp ku", secretSize)) }

func (g *gen) phase() byte {
	if g.n&1 != 0 {
		return FlagPhase
	}
	return 0
}

func (g *gen) nonce(pn uint64, out *[12]byte) {
	*out = g.iv
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], pn)
	for i := range p {
		out[4+i] ^= p[i]
	}
}

// sendSA seals one direction: to the peer, under the key ID the peer
// receives it by. Several goroutines may seal at once.
type sendSA struct {
	keyID uint32
	mode  Mode
	every uint64 // KeyUpdateAfter
	pn    atomic.Uint64
	cur   atomic.Pointer[gen]
	mu    sync.Mutex // moving to the next generation
}

func newSendSA(keyID uint32, m Mode, every uint64, secret []byte) *sendSA {
	s := &sendSA{keyID: keyID, mode: m, every: every}
	s.cur.Store(newGen(0, secret))
	return s
}

// take draws the next packet number and the generation it is sealed in.
func (s *sendSA) take() (uint64, *gen) {
	pn := s.pn.Add(1) - 1
	return pn, s.genOf(pn)
}

// genOf is the generation packet number pn is sealed in, moving the
// sender on when pn is the first of the next.
func (s *sendSA) genOf(pn uint64) *gen {
	want := pn / s.every
	g := s.cur.Load()
	for g.n < want {
		s.mu.Lock()
		if g = s.cur.Load(); g.n < want {
			ng := g.next()
			ng.prev.Store(g)
			g.prev.Store(nil) // two back: no writer can still want it (but one stalled 2^23 datagrams long)
			s.cur.Store(ng)
			g = ng
		}
		s.mu.Unlock()
	}
	// Another writer moved on while this one drew its number: seal under
	// the generation the number belongs to, so that the receiver, which
	// tells generations apart by packet number and phase, finds it.
	if g.n > want {
		if p := g.prev.Load(); p != nil && p.n == want {
			g = p
		}
	}
	return g
}

// recvSA opens one direction: from the peer, under keyID. Only the
// link's reader uses it (one goroutine at a time).
type recvSA struct {
	keyID    uint32
	mode     Mode
	prev     *gen // nil at generation 0
	cur      *gen
	next     *gen
	firstCur uint64 // lowest packet number opened under cur
	win      window
	psk      bool           // keyed by a pre-shared key (else a contact)
	peer     netip.AddrPort // the only source it opens from
	// confirm is the opener's sender of the same contact, which sends
	// the initial block, and seals only the contact's QP pair's frames
	// (pending), until a datagram opens here.
	confirm *peerTx
	pending txKey
	// secret0 is generation 0's secret; epoch the Link's PSK epoch it
	// was checked at (pre-shared keys).
	secret0 [secretSize]byte
	epoch   uint64
	// last is when a datagram last opened under it (unix ns), for idle
	// reclamation.
	last atomic.Int64
}

func newRecvSA(keyID uint32, m Mode, secret []byte, psk bool) *recvSA {
	r := &recvSA{keyID: keyID, mode: m, cur: newGen(0, secret), psk: psk}
	copy(r.secret0[:], secret)
	r.next = r.cur.next()
	return r
}

// genFor picks the generation a datagram with packet number pn and
// phase flag ph was sealed in.
func (r *recvSA) genFor(pn uint64, ph byte) *gen {
	if ph == r.cur.phase() {
		return r.cur
	}
	if pn < r.firstCur {
		return r.prev // late, from before the last update (nil: none)
	}
	return r.next
}

// opened records that g opened packet number pn — in the replay window,
// and a datagram under next moves the SA one generation on.
func (r *recvSA) opened(g *gen, pn uint64) {
	r.win.mark(pn)
	switch g {
	case r.next:
		r.prev, r.cur, r.next = r.cur, r.next, r.next.next()
		r.firstCur = pn
	case r.cur:
		r.firstCur = min(r.firstCur, pn)
	}
}

// window is a replay window over packet numbers (RFC 6479's bitmap): the
// highest number seen and which of the Window numbers below it were.
type window struct {
	top    uint64 // highest seen + 1 (0: none yet)
	bitmap [windowWords]uint64
}

const (
	windowWords = 16
	// Window is how far below the highest packet number seen a
	// datagram may come late and still be taken once.
	Window = windowWords*64 - 64
)

// check reports whether pn is new and within the window (it does not
// record it: a datagram that then fails authentication must not).
func (w *window) check(pn uint64) bool {
	if pn >= w.top {
		return true
	}
	if w.top-pn > Window {
		return false
	}
	return w.bitmap[(pn/64)%windowWords]&(1<<(pn%64)) == 0
}

// mark records pn, which check passed.
func (w *window) mark(pn uint64) {
	if pn >= w.top {
		end := pn / 64
		if w.top == 0 {
			w.bitmap = [windowWords]uint64{}
		} else if cur := (w.top - 1) / 64; end-cur >= windowWords {
			w.bitmap = [windowWords]uint64{}
		} else {
			for i := (w.top-1)/64 + 1; i <= end; i++ {
				w.bitmap[i%windowWords] = 0
			}
		}
		w.top = pn + 1
	}
	w.bitmap[(pn/64)%windowWords] |= 1 << (pn % 64)
}
