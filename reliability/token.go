package reliability

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"
	"net/netip"
	"sync"
)

// Tokens issues and checks the tokens that make a peer's frames count.
// A peer learns its token only from a Challenge sent to its own address,
// so a datagram with a spoofed source cannot carry a valid one: it cannot
// create state, change a peer's epoch or inject data (RELIABILITY-
// CHECKLIST §4.2, §5.5; the idea of TCP SYN cookies and QUIC's address
// validation). A token is a keyed hash (HMAC-SHA-256, truncated to 64
// bits) of the peer's address, QP number and epoch and of the local QP
// number and epoch, under a secret drawn when the Tokens is made and
// drawn again by Rotate (the one before still checks, until the next);
// the issuer keeps no state until the peer proves it received one.
//
// Epochs are per session: each side draws a fresh one whenever it opens
// or reopens contact with a peer, and a side answering contact without
// state derives its own from the opener's (Epoch), so that it can check
// the token later without having kept anything. A token binds both
// epochs, so a token of one session is worth nothing in another: frames
// of an ended session are refused by the next one between the same two
// QPs.
type Tokens struct {
	mu sync.Mutex
	// rand draws the secrets (crypto/rand unless NewTokensFrom).
	rand io.Reader
	// cur issues and checks; prev, once Rotate has run, only checks.
	cur, prev hash.Hash
	buf       [64]byte
	sum       [sha256.Size]byte
}

// NewTokens returns a Tokens with a fresh random secret.
func NewTokens() *Tokens {
	return NewTokensFrom(rand.Reader)
}

// NewTokensFrom returns a Tokens whose secrets (the first, and each
// Rotate's) are read from r: crypto/rand.Reader in use, a seeded source
// in a deterministic simulation (Endpoint, simnet_test.go).
func NewTokensFrom(r io.Reader) *Tokens {
	return &Tokens{rand: r, cur: newSecret(r)}
}

func newSecret(r io.Reader) hash.Hash {
	var key [32]byte
	io.ReadFull(r, key[:])
	return hmac.New(sha256.New, key[:])
}

// Rotate draws a new secret to issue under; the one it replaces still
// checks (Valid, Derive) until the next Rotate, so a handshake in flight
// across one rotation completes. Every token and derived epoch of the
// secret before that verifies nothing any more. A Graveyard rotates the
// Tokens whose sessions it buries when it forgets a generation of graves.
func (t *Tokens) Rotate() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prev, t.cur = t.cur, newSecret(t.rand)
}

// Domain bytes keep a token and a derived epoch from ever being the same
// hash input.
const (
	domainToken = 'T'
	domainEpoch = 'E'
)

// sum64 is the keyed hash under the current secret, or under the
// previous one if prev; false if there is no previous one.
func (t *Tokens) sum64(prev bool, domain byte, peer netip.AddrPort, qpn, epoch, local, localEpoch uint32) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	mac := t.cur
	if prev {
		if mac = t.prev; mac == nil {
			return 0, false
		}
	}
	a := peer.Addr().As16()
	b := append(t.buf[:0], domain)
	b = append(b, a[:]...)
	b = binary.BigEndian.AppendUint16(b, peer.Port())
	b = binary.BigEndian.AppendUint32(b, qpn)
	b = binary.BigEndian.AppendUint32(b, epoch)
	b = binary.BigEndian.AppendUint32(b, local)
	b = binary.BigEndian.AppendUint32(b, localEpoch)
	mac.Reset()
	mac.Write(b)
	return binary.BigEndian.Uint64(mac.Sum(t.sum[:0])), true
}

func nonZero64(v uint64) uint64 {
	if v == 0 {
		return 1
	}
	return v
}

func nonZero32(v uint32) uint32 {
	if v == 0 {
		return 1
	}
	return v
}

// Issue returns the token for a peer (its address, QP number and epoch)
// talking to local QP local in the local session epoch localEpoch, under
// the current secret. Never 0.
func (t *Tokens) Issue(peer netip.AddrPort, qpn, epoch, local, localEpoch uint32) uint64 {
	v, _ := t.sum64(false, domainToken, peer, qpn, epoch, local, localEpoch)
	return nonZero64(v)
}

// Valid reports whether tok is the token Issue gives for these values
// under the current secret or the one before it (Rotate).
func (t *Tokens) Valid(tok uint64, peer netip.AddrPort, qpn, epoch, local, localEpoch uint32) bool {
	if tok == 0 {
		return false
	}
	if tok == t.Issue(peer, qpn, epoch, local, localEpoch) {
		return true
	}
	v, ok := t.sum64(true, domainToken, peer, qpn, epoch, local, localEpoch)
	return ok && tok == nonZero64(v)
}

// Epoch returns the session epoch local QP local takes with a peer (its
// address, QP number and epoch) whose contact it answers without state:
// a keyed hash of those under the current secret, so that it is the same
// when the peer's next frame comes back, and new whenever the peer's
// epoch is. Never 0.
func (t *Tokens) Epoch(peer netip.AddrPort, qpn, epoch, local uint32) uint32 {
	v, _ := t.sum64(false, domainEpoch, peer, qpn, epoch, local, 0)
	return nonZero32(uint32(v))
}

// Derive checks tok, a token a peer (its address, QP number and epoch)
// carries in a frame to local QP local that has no session with it, as a
// token issued with the epoch Epoch derived, under the current secret or
// the one before it, and returns that epoch.
func (t *Tokens) Derive(tok uint64, peer netip.AddrPort, qpn, epoch, local uint32) (uint32, bool) {
	if tok == 0 {
		return 0, false
	}
	for _, prev := range [2]bool{false, true} {
		d, ok := t.sum64(prev, domainEpoch, peer, qpn, epoch, local, 0)
		if !ok {
			break
		}
		e := nonZero32(uint32(d))
		if v, ok := t.sum64(prev, domainToken, peer, qpn, epoch, local, e); ok && nonZero64(v) == tok {
			return e, true
		}
	}
	return 0, false
}

// NewEpoch returns a random non-zero epoch.
func NewEpoch() uint32 { return newEpochFrom(rand.Reader) }

// newEpochFrom returns a non-zero epoch read from r.
func newEpochFrom(r io.Reader) uint32 {
	var b [4]byte
	for {
		io.ReadFull(r, b[:])
		if v := binary.BigEndian.Uint32(b[:]); v != 0 {
			return v
		}
	}
}
