// Package protect protects udiwarp's datagrams: every segment
// authenticated (Auth: AES-128-GCM's GMAC over the whole datagram, the
// payload in clear) or authenticated and its payload encrypted (AEAD:
// AES-128-GCM), the 16-byte tag in place of the CRC32c, each datagram
// numbered so that a replay is refused (docs/wire.md §12).
//
// Keys come from two places:
//
//   - RD's contact: the Hello and the Challenge that answers it carry
//     ephemeral X25519 shares, and both ends derive two directional keys
//     and IV salts with HKDF-SHA-256 over the shared secret and the
//     contact's transcript (QP numbers, the opener's epoch, both tokens,
//     both shares). The answering side stays stateless until the opener
//     proves it received the Challenge: its share is derived from a
//     rotating secret and the Hello's token, so it derives the keys again
//     from the opener's first sealed Data frame.
//   - A pre-shared key, per peer address or for the device, for traffic
//     with no session (UD, Write-Record) to a peer no RD contact reached.
//     With a pre-shared key set, it is mixed into every contact's keys
//     too, which authenticates both ends (as Noise's psk modifier and
//     WireGuard's optional PSK do); without it, a contact resists anyone
//     who only watches but not someone who intercepts both directions.
//
// The keys belong to the pair of devices, not to one pair of QPs: every
// QP of a device uses the newest keys it has for a peer address, as an
// IPsec or WireGuard peer does.
//
// Link wraps an llp.Link and does all of it: the stack above writes and
// reads its usual frames (with a zero CRC trailer, the device running
// without CRC) and never sees an envelope. Every parse, derivation and
// replay check has its home here; nothing here does I/O of its own.
package protect

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// Mode says what a device does to its datagrams.
type Mode uint8

const (
	// None sends today's wire: a CRC32c trailer, nothing authenticated.
	None Mode = 0
	// Auth authenticates header and payload (GMAC); the payload travels
	// in clear (PSP's authenticate-only mode).
	Auth Mode = 1
	// AEAD authenticates the headers and encrypts the payload
	// (AES-128-GCM).
	AEAD Mode = 2
)

func (m Mode) String() string {
	switch m {
	case None:
		return "none"
	case Auth:
		return "auth"
	case AEAD:
		return "aead"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode reads "none", "auth" or "aead".
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{None, Auth, AEAD} {
		if m.String() == s {
			return m, nil
		}
	}
	return None, fmt.Errorf("protect: mode %q: want none, auth or aead", s)
}

// Config configures a device's protection.
type Config struct {
	// Mode: None (the default), Auth or AEAD. Both ends must agree: a
	// contact with a peer in another mode is refused, and the opener's
	// work requests end with a RefusedError naming both modes.
	Mode Mode
	// PSK is the device's pre-shared key (16 bytes or more): it keys
	// traffic with no session to any address without a key of its own,
	// and is mixed into every contact's keys.
	PSK []byte
	// Peers are pre-shared keys per peer address (Link.SetPeerKey adds
	// more): what UD and Write-Record to that address are sealed with
	// when no RD contact gave keys, and what that peer's contacts mix in.
	Peers map[netip.AddrPort][]byte
	// KeyUpdateAfter is how many datagrams one key seals before the
	// sender moves to the next: a contact's keys to their next
	// generation (flagged by the key phase bit), a pre-shared key's
	// sender to a new key ID. Default 1<<23, AES-GCM's confidentiality
	// limit in RFC 9001 §6.6, at most 2^32; a nonce never repeats (the
	// packet number is never reused under a key), this bounds what one
	// key protects.
	KeyUpdateAfter uint64
	// ContactRate bounds the X25519 operations per second spent on
	// contact from sources not yet authenticated (a Hello costs one, an
	// opener's first sealed frame two, about 40 µs each here). Beyond it
	// such datagrams are dropped and counted (Stats.ContactLimited).
	// Default 2000.
	ContactRate int
	// SecretLifetime is how long the secret that derives the answering
	// side's shares issues them: it is replaced then, and the one before
	// it is kept for one more lifetime, so a contact's private keys are
	// gone at most twice this after it (forward secrecy for the
	// stateless side). Default 2 minutes.
	SecretLifetime time.Duration
	// IdleTimeout drops a peer's keys that received nothing for this
	// long. Default 10 minutes.
	IdleTimeout time.Duration
	// MaxPeers bounds the receive keys held (sessions and pre-shared
	// peers): beyond it a new one is refused and counted. Default 4096.
	MaxPeers int
	// Rand draws keys and secrets (default crypto/rand).
	Rand io.Reader
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Defaults.
const (
	DefaultKeyUpdateAfter = 1 << 23
	DefaultContactRate    = 2000
	DefaultSecretLifetime = 2 * time.Minute
	DefaultIdleTimeout    = 10 * time.Minute
	DefaultMaxPeers       = 4096
	// MinPSK is the shortest pre-shared key taken.
	MinPSK = 16
)

// Check reports what is wrong with c, if anything.
func (c *Config) Check() error {
	if c.Mode > AEAD {
		return fmt.Errorf("protect: %v: want none, auth or aead", c.Mode)
	}
	if c.KeyUpdateAfter > 1<<32 {
		return fmt.Errorf("protect: KeyUpdateAfter %d: at most 2^32", c.KeyUpdateAfter)
	}
	if c.PSK != nil && len(c.PSK) < MinPSK {
		return fmt.Errorf("protect: pre-shared key of %d bytes: want %d or more", len(c.PSK), MinPSK)
	}
	for a, k := range c.Peers {
		if len(k) < MinPSK {
			return fmt.Errorf("protect: pre-shared key for %v of %d bytes: want %d or more", a, len(k), MinPSK)
		}
	}
	return nil
}

// Errors.
var (
	// ErrNoKey: a datagram to a peer with no key — no RD contact reached
	// it and no pre-shared key names it. It is not sent.
	ErrNoKey = errors.New("protect: no key for the peer: open an RD contact to it first or set a pre-shared key")
	// ErrAuth: a datagram failed authentication (forged, changed,
	// or under keys this end does not hold).
	ErrAuth = errors.New("protect: authentication failed")
	// ErrReplay: a datagram's packet number was seen before, or is older
	// than the replay window.
	ErrReplay = errors.New("protect: replayed datagram")
	// ErrContactBudget: a Challenge not sent, the contact budget spent
	// (Config.ContactRate).
	ErrContactBudget = errors.New("protect: contact budget spent (ContactRate)")
	// ErrEnvelope: a malformed envelope.
	ErrEnvelope = errors.New("protect: malformed envelope")
)

// RefusedError ends the work requests of a contact the peer refused
// because it runs another mode.
type RefusedError struct {
	Ours, Theirs Mode
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("protect: the peer refused contact: it protects with %v, this device with %v", e.Theirs, e.Ours)
}
