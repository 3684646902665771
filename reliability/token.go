package reliability

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"hash"
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
// number and epoch, under a secret drawn when the Tokens is made; the
// issuer keeps no state until the peer proves it received one.
//
// Epochs are per session: each side draws a fresh one whenever it opens
// or reopens contact with a peer, and a side answering contact without
// state derives its own from the opener's (Epoch), so that it can check
// the token later without having kept anything. A token binds both
// epochs, so a token of one session is worth nothing in another: frames
// of an ended session are refused by the next one between the same two
// QPs.
type Tokens struct {
	mu  sync.Mutex
	mac hash.Hash
	buf [64]byte
	sum [sha256.Size]byte
}

// NewTokens returns a Tokens with a fresh random secret.
func NewTokens() *Tokens {
	var key [32]byte
	rand.Read(key[:])
	return &Tokens{mac: hmac.New(sha256.New, key[:])}
}

// Domain bytes keep a token and a derived epoch from ever being the same
// hash input.
const (
	domainToken = 'T'
	domainEpoch = 'E'
)

func (t *Tokens) sum64(domain byte, peer netip.AddrPort, qpn, epoch, local, localEpoch uint32) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := peer.Addr().As16()
	b := append(t.buf[:0], domain)
	b = append(b, a[:]...)
	b = binary.BigEndian.AppendUint16(b, peer.Port())
	b = binary.BigEndian.AppendUint32(b, qpn)
	b = binary.BigEndian.AppendUint32(b, epoch)
	b = binary.BigEndian.AppendUint32(b, local)
	b = binary.BigEndian.AppendUint32(b, localEpoch)
	t.mac.Reset()
	t.mac.Write(b)
	return binary.BigEndian.Uint64(t.mac.Sum(t.sum[:0]))
}

// Issue returns the token for a peer (its address, QP number and epoch)
// talking to local QP local in the local session epoch localEpoch. Never
// 0.
func (t *Tokens) Issue(peer netip.AddrPort, qpn, epoch, local, localEpoch uint32) uint64 {
	v := t.sum64(domainToken, peer, qpn, epoch, local, localEpoch)
	if v == 0 {
		v = 1
	}
	return v
}

// Valid reports whether tok is the token Issue gives for these values.
func (t *Tokens) Valid(tok uint64, peer netip.AddrPort, qpn, epoch, local, localEpoch uint32) bool {
	return tok != 0 && tok == t.Issue(peer, qpn, epoch, local, localEpoch)
}

// Epoch returns the session epoch local QP local takes with a peer (its
// address, QP number and epoch) whose contact it answers without state:
// a keyed hash of those, so that it is the same when the peer's next
// frame comes back, and new whenever the peer's epoch is. Never 0.
func (t *Tokens) Epoch(peer netip.AddrPort, qpn, epoch, local uint32) uint32 {
	v := uint32(t.sum64(domainEpoch, peer, qpn, epoch, local, 0))
	if v == 0 {
		v = 1
	}
	return v
}

// NewEpoch returns a random non-zero epoch.
func NewEpoch() uint32 {
	var b [4]byte
	for {
		rand.Read(b[:])
		if v := binary.BigEndian.Uint32(b[:]); v != 0 {
			return v
		}
	}
}
