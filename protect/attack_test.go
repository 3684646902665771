package protect

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

var (
	addrA = netip.MustParseAddrPort("10.0.0.1:1")
	addrB = netip.MustParseAddrPort("10.0.0.2:1")
	addrC = netip.MustParseAddrPort("10.0.0.3:1")
	addrD = netip.MustParseAddrPort("10.0.0.4:1")
)

func newLink(t testing.TB, net *llp.MemNet, a netip.AddrPort, cfg Config) *Link {
	t.Helper()
	in, err := net.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Wrap(in, cfg, 8, Stats{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func withTrailer(f []byte) []byte { return append(f, 0, 0, 0, 0) }

func rdFrame(f *reliability.Fields) []byte { return withTrailer(reliability.Append(nil, f)) }

// contactState is what a handshake left for the attacker to see.
type contactState struct {
	hello, challenge []byte // the wire Contact envelopes
	token            uint64
}

// handshake runs an RD contact between opener a (QP 5) and answerer b
// (QP 6) by hand, as the engines would, and exchanges one sealed UD frame
// each way so that both hold and confirmed the keys.
func handshake(t *testing.T, a, b *Link, token uint64) contactState {
	t.Helper()
	hello := rdFrame(&reliability.Fields{Type: reliability.Hello, DstQPN: 6, SrcQPN: 5, Epoch: 1, Init: true, Issued: token})
	wh, err := a.seal(nil, &llp.Msg{Bufs: [][]byte{hello}, Addr: b.LocalAddr()})
	if err != nil {
		t.Fatal(err)
	}
	if b.open(append([]byte(nil), wh...), a.LocalAddr(), nil, b.cfg.Now()) == nil {
		t.Fatal("hello not handed up")
	}
	ch := rdFrame(&reliability.Fields{Type: reliability.Challenge, DstQPN: 5, SrcQPN: 6, Epoch: 2, Token: token, Init: true, Issued: token ^ 0xabcdef})
	wc, err := b.seal(nil, &llp.Msg{Bufs: [][]byte{ch}, Addr: a.LocalAddr()})
	if err != nil {
		t.Fatal(err)
	}
	if a.open(append([]byte(nil), wc...), b.LocalAddr(), nil, a.cfg.Now()) == nil {
		t.Fatal("challenge not handed up")
	}
	openerData(t, a, b, token, a.cfg.Now())
	exchange(t, b, a, "b->a after contact")
	exchange(t, a, b, "a->b after contact")
	return contactState{hello: wh, challenge: wc, token: token}
}

// openerData sends the opener's first Data frame of the contact (QP 5 to
// QP 6, INIT), sealed under the contact's pending keys with the initial
// block, as RD's engine would, and opens it at the answerer; it returns
// the datagram.
func openerData(t *testing.T, op, ans *Link, tok uint64, now time.Time) []byte {
	t.Helper()
	d := rdFrame(&reliability.Fields{Type: reliability.Data, DstQPN: 6, SrcQPN: 5, Epoch: 1, Token: tok ^ 0xabcdef, Seq: 0, Init: true, Issued: tok})
	w, err := op.seal(nil, &llp.Msg{Bufs: [][]byte{d}, Addr: ans.LocalAddr()})
	if err != nil {
		t.Fatal(err)
	}
	c := bytes.Clone(w)
	if ans.open(w, op.LocalAddr(), nil, now) == nil {
		t.Fatalf("the opener's first frame: %v", snap(ans))
	}
	return c
}

// exchange seals a UD Send at from to to and opens it there.
func exchange(t *testing.T, from, to *Link, what string) {
	t.Helper()
	if !tryExchange(t, from, to) {
		t.Fatalf("%s: did not open (stats %+v)", what, snap(to))
	}
}

func tryExchange(t *testing.T, from, to *Link) bool {
	t.Helper()
	w, err := from.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("payload"))}, Addr: to.LocalAddr()})
	if err != nil {
		t.Fatal(err)
	}
	return to.open(w, from.LocalAddr(), nil, to.cfg.Now()) != nil
}

func snap(l *Link) map[string]uint64 {
	s := l.Stats()
	return map[string]uint64{"opened": s.Opened.Load(), "authFailed": s.AuthFailed.Load(), "noKey": s.NoKey.Load(),
		"replayed": s.Replayed.Load(), "unsolicited": s.Unsolicited.Load(), "peersFull": s.PeersFull.Load(),
		"sessions": s.Sessions.Load(), "wrongSource": s.WrongSource.Load(), "reflected": s.Reflected.Load(),
		"contactLimited": s.ContactLimited.Load(), "recv": uint64(l.Sessions())}
}

// forgedChallenge is what an on-path attacker that saw the Hello (its
// token, in clear in the Contact envelope) builds: a Challenge from the
// answerer's address with a share of its own. It holds no key at all.
func forgedChallenge(t *testing.T, m Mode, token uint64, issued uint64) []byte {
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f := reliability.Append(nil, &reliability.Fields{Type: reliability.Challenge, DstQPN: 5, SrcQPN: 6, Epoch: 2, Token: token, Init: true, Issued: issued})
	out := make([]byte, HeaderSize+ShareSize, HeaderSize+ShareSize+len(f)+CRCSize)
	putHeader(out, KindContact, m, FlagShare, 0, 0, len(f), priv.PublicKey().Bytes())
	return udiwarp.SealDatagram(append(out, f...), 0)
}

// TestAttackForgedChallengeHijacksTx: after a contact completed (even with
// a pre-shared key on both sides), an on-path attacker replays the
// Challenge with a fresh share (or just another keyed token, CRC fixed):
// the opener installs new keys and seals everything to the peer under
// them; the peer cannot open anything any more.
func TestAttackForgedChallengeHijacksTx(t *testing.T) {
	psk := bytes.Repeat([]byte{7}, 16)
	net := llp.NewMemNet()
	a := newLink(t, net, addrA, Config{Mode: AEAD, PSK: psk})
	b := newLink(t, net, addrB, Config{Mode: AEAD, PSK: psk})
	cs := handshake(t, a, b, 0x1111111111111111)
	exchange(t, a, b, "before the attack")

	// The attacker reads the token from the captured Hello (in clear).
	var h Header
	if err := h.Parse(cs.hello); err != nil {
		t.Fatal(err)
	}
	var rh reliability.Header
	if err := rh.Parse(cs.hello[h.Size : len(cs.hello)-CRCSize]); err != nil {
		t.Fatal(err)
	}
	a.cfg.Now = func() time.Time { return time.Now().Add(3 * time.Minute) } // still within 2 secret lifetimes
	if a.open(forgedChallenge(t, AEAD, rh.Issued, 42), b.LocalAddr(), nil, a.cfg.Now()) == nil {
		t.Log("forged challenge not handed up")
	}
	t.Logf("a after forged Challenge: %v", snap(a))
	for i := range 3 {
		if !tryExchange(t, a, b) {
			t.Errorf("a->b datagram %d after one forged (keyless) Challenge: refused at b: %v", i, snap(b))
		}
	}
	// Each forged Challenge is a new receive key at a: MaxPeers fills.
	a.bucket = 1e9
	for i := range 50 {
		a.open(forgedChallenge(t, AEAD, rh.Issued, uint64(1000+i)), b.LocalAddr(), nil, a.cfg.Now())
	}
	t.Logf("a's receive keys after 51 forged Challenges: %d", a.Sessions())
}

// TestAttackPSKKeyIDCollision: the pre-shared-key traffic secret is a
// function of (psk, mode, key ID) only; two senders (two nodes, or one
// node before and after a restart) that draw the same 32-bit key ID seal
// packet number 0, 1, ... under the same key and IV.
func TestAttackPSKKeyIDCollision(t *testing.T) {
	psk := bytes.Repeat([]byte{9}, 16)
	net := llp.NewMemNet()
	// Same draws: models a 2^-32 collision (birthday: ~50% after ~77,000
	// pre-shared-key senders under one key, over all nodes and restarts).
	// (Since the fix: the same key ID, drawn after the two 32-byte
	// secrets Wrap draws; the packet numbers' salts, drawn next, differ.)
	seed := bytes.Repeat([]byte{1}, 1024)
	seedC := bytes.Clone(seed)
	seedC[68] = 2
	a := newLink(t, net, addrA, Config{Mode: AEAD, PSK: psk, Rand: bytes.NewReader(seed)})
	c := newLink(t, net, addrC, Config{Mode: AEAD, PSK: psk, Rand: bytes.NewReader(seedC)})
	p1, p2 := []byte("attack at dawn!!"), []byte("retreat at dusk!")
	w1, _ := a.seal(nil, &llp.Msg{Bufs: [][]byte{udSend(p1)}, Addr: addrB})
	w2, _ := c.seal(nil, &llp.Msg{Bufs: [][]byte{udSend(p2)}, Addr: addrD})
	if !bytes.Equal(w1[4:8], w2[4:8]) {
		t.Fatalf("the test does not reach the case: key IDs %x and %x differ", w1[4:8], w2[4:8])
	}
	if bytes.Equal(w1[:16], w2[:16]) {
		var h Header
		h.Parse(w1)
		x := make([]byte, len(p1))
		for i := range x {
			x[i] = w1[h.Size+h.ClearLen+i] ^ w2[h.Size+h.ClearLen+i] ^ p1[i]
		}
		t.Errorf("same key ID and packet number under the same key: ct1^ct2^p1 = %q (p2)", x)
	}
}

// TestAttackReclaimThenReplayNonceReuse: with IdleTimeout below twice
// SecretLifetime (allowed by Check), a receive key reclaimed under
// MaxPeers pressure is derived again from a replayed Challenge (opener)
// or initial block (answerer): a fresh sender restarts at packet number
// 0 under the same key (nonce reuse) and a fresh window takes replays.
func TestAttackReclaimThenReplayNonceReuse(t *testing.T) {
	psk := bytes.Repeat([]byte{7}, 16)
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	cfg := Config{Mode: AEAD, PSK: psk, Now: clk.Now, IdleTimeout: time.Minute, MaxPeers: 1}
	net := llp.NewMemNet()
	a := newLink(t, net, addrA, cfg)
	b := newLink(t, net, addrB, cfg)
	c := newLink(t, net, addrC, cfg)
	cs := handshake(t, a, b, 0x2222222222222222)
	w1, _ := a.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("first secret...."))}, Addr: b.LocalAddr()})
	if b.open(append([]byte(nil), w1...), a.LocalAddr(), nil, clk.Now()) == nil {
		t.Fatal("w1")
	}
	clk.t = clk.t.Add(61 * time.Second)
	// Pressure: c's pre-shared-key datagram needs a slot at a.
	wc, _ := c.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("x"))}, Addr: a.LocalAddr()})
	a.coarse = clk.Now()
	if a.open(wc, c.LocalAddr(), nil, clk.Now()) == nil {
		t.Fatalf("c at a: %v", snap(a))
	}
	// The attacker replays the captured Challenge.
	clk.t = clk.t.Add(61 * time.Second) // c idle too (hello still < 2 secret lifetimes old)
	t.Logf("a before replay: %v", snap(a))
	a.open(append([]byte(nil), cs.challenge...), b.LocalAddr(), nil, clk.Now())
	t.Logf("a after replay: %v", snap(a))
	w2, _ := a.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("second secret..."))}, Addr: b.LocalAddr()})
	var h1, h2 Header
	h1.Parse(w1)
	h2.Parse(w2)
	t.Logf("first: key ID %#x pn %d; after reclaim+replay: key ID %#x pn %d", h1.KeyID, h1.PN, h2.KeyID, h2.PN)
	// Find the same key ID's pn 0 from the first life: w0 was the
	// handshake's a->b frame; compare the (keyID, pn) sets.
	if h2.KeyID != 0 {
		// re-seal to reach the same pn as w1
		for h2.PN < h1.PN {
			w2, _ = a.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("second secret..."))}, Addr: b.LocalAddr()})
			h2.Parse(w2)
		}
		if h1.KeyID == h2.KeyID && h1.PN == h2.PN && !bytes.Equal(w1, w2) {
			t.Errorf("nonce reuse: key ID %#x packet number %d sealed twice with different bytes", h1.KeyID, h1.PN)
		}
	}
}

// TestAttackRevokedPSKStillOpens: removing a peer's pre-shared key keeps
// the receive keys derived from it: the peer (or whoever stole the key)
// is still taken.
func TestAttackRevokedPSKStillOpens(t *testing.T) {
	k := bytes.Repeat([]byte{5}, 16)
	net := llp.NewMemNet()
	a := newLink(t, net, addrA, Config{Mode: Auth, Peers: map[netip.AddrPort][]byte{addrB: k}})
	b := newLink(t, net, addrB, Config{Mode: Auth, Peers: map[netip.AddrPort][]byte{addrA: k}})
	exchange(t, a, b, "before revocation")
	if err := b.SetPeerKey(addrA, nil); err != nil {
		t.Fatal(err)
	}
	if b.HasKeys(addrA) {
		t.Fatal("b still has a key for a")
	}
	if tryExchange(t, a, b) {
		t.Errorf("after b removed a's pre-shared key, a datagram under it still opens at b")
	}
	k2 := bytes.Repeat([]byte{6}, 16)
	b.SetPeerKey(addrA, k2) // rotated
	if tryExchange(t, a, b) {
		t.Errorf("after b rotated a's pre-shared key, a datagram under the old key still opens at b")
	}
}

// TestAttackOneHostFillsMaxPeers: without a pre-shared key, one host
// completing contacts (a legitimate client) installs one receive key per
// contact at the answerer; there is no per-address bound, and a new
// peer is then refused (PeersFull) for IdleTimeout.
func TestAttackOneHostFillsMaxPeers(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	net := llp.NewMemNet()
	cfg := Config{Mode: AEAD, Now: clk.Now}
	b := newLink(t, net, addrB, cfg)
	m := newLink(t, net, addrD, cfg) // the attacker: one address
	for i := range DefaultMaxPeers {
		clk.t = clk.t.Add(2 * time.Millisecond) // ~3 units of budget per 1.5 ms: the attacker stays under ContactRate
		m.bucket, b.bucket = 1e9, 1e9           // (test speed: the budget refills at 2000/s anyway)
		tok := uint64(i + 1)
		hello := rdFrame(&reliability.Fields{Type: reliability.Hello, DstQPN: 6, SrcQPN: 5, Epoch: 1, Init: true, Issued: tok})
		wh, _ := m.seal(nil, &llp.Msg{Bufs: [][]byte{hello}, Addr: b.LocalAddr()})
		b.open(wh, m.LocalAddr(), nil, clk.Now())
		ch := rdFrame(&reliability.Fields{Type: reliability.Challenge, DstQPN: 5, SrcQPN: 6, Epoch: 2, Token: tok, Init: true, Issued: tok})
		wc, _ := b.seal(nil, &llp.Msg{Bufs: [][]byte{ch}, Addr: m.LocalAddr()})
		m.open(wc, b.LocalAddr(), nil, clk.Now())
		d := rdFrame(&reliability.Fields{Type: reliability.Data, DstQPN: 6, SrcQPN: 5, Epoch: 1, Token: tok, Seq: 0, Init: true, Issued: tok})
		wd, _ := m.seal(nil, &llp.Msg{Bufs: [][]byte{d}, Addr: b.LocalAddr()})
		b.open(wd, m.LocalAddr(), nil, clk.Now())
	}
	if n := b.Sessions(); n > MaxPerAddr {
		t.Errorf("b holds %d receive keys from one address, more than MaxPerAddr", n)
	}
	t.Logf("b holds %d receive keys, all from %v", b.Sessions(), addrD)
	a := newLink(t, net, addrA, cfg)
	b.bucket = 1e9
	hello := rdFrame(&reliability.Fields{Type: reliability.Hello, DstQPN: 6, SrcQPN: 5, Epoch: 1, Init: true, Issued: 77})
	wh, _ := a.seal(nil, &llp.Msg{Bufs: [][]byte{hello}, Addr: b.LocalAddr()})
	b.open(wh, a.LocalAddr(), nil, clk.Now())
	ch := rdFrame(&reliability.Fields{Type: reliability.Challenge, DstQPN: 5, SrcQPN: 6, Epoch: 2, Token: 77, Init: true, Issued: 77})
	wc, _ := b.seal(nil, &llp.Msg{Bufs: [][]byte{ch}, Addr: a.LocalAddr()})
	a.open(wc, b.LocalAddr(), nil, clk.Now())
	openerData(t, a, b, 77, clk.Now())
}

// TestAttackWindowModel: the replay window against a set.
func TestAttackWindowModel(t *testing.T) {
	var w window
	seen := map[uint64]bool{}
	var top uint64
	var x uint64 = 88172645463325252
	for i := 0; i < 2_000_000; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		var pn uint64
		switch x % 4 {
		case 0:
			pn = top + x%2000
		default:
			if top > 1100 {
				pn = top - 1100 + (x>>8)%1100
			} else {
				pn = (x >> 8) % 1100
			}
		}
		want := !seen[pn] && (pn >= top || top-pn <= Window)
		if got := w.check(pn); got != want {
			t.Fatalf("step %d pn %d top %d: check %v want %v", i, pn, top, got, want)
		}
		if want {
			w.mark(pn)
			seen[pn] = true
			if pn+1 > top {
				top = pn + 1
			}
		}
	}
}

var _ = binary.BigEndian

// TestAttackForgedChallengeSecondContact: a and b hold working keys from
// one contact; a opens a second (QP 7 to QP 8), and an on-path attacker
// answers its Hello first with a forged Challenge. Only that contact's
// QP pair is sealed under the forged keys (pending): everything else to
// b still goes under the working keys and opens.
func TestAttackForgedChallengeSecondContact(t *testing.T) {
	net := llp.NewMemNet()
	a := newLink(t, net, addrA, Config{Mode: AEAD})
	b := newLink(t, net, addrB, Config{Mode: AEAD})
	handshake(t, a, b, 0x1111)
	hello := rdFrame(&reliability.Fields{Type: reliability.Hello, DstQPN: 8, SrcQPN: 7, Epoch: 3, Init: true, Issued: 0x7777})
	if _, err := a.seal(nil, &llp.Msg{Bufs: [][]byte{hello}, Addr: b.LocalAddr()}); err != nil {
		t.Fatal(err)
	}
	f := reliability.Append(nil, &reliability.Fields{Type: reliability.Challenge, DstQPN: 7, SrcQPN: 8, Epoch: 4, Token: 0x7777, Init: true, Issued: 0x99})
	priv, _ := ecdh.X25519().GenerateKey(rand.Reader)
	out := make([]byte, HeaderSize+ShareSize, HeaderSize+ShareSize+len(f)+CRCSize)
	putHeader(out, KindContact, AEAD, FlagShare, 0, 0, len(f), priv.PublicKey().Bytes())
	if a.open(udiwarp.SealDatagram(append(out, f...), 0), b.LocalAddr(), nil, a.cfg.Now()) == nil {
		t.Fatal("the forged Challenge did not reach the path (not taken)")
	}
	exchange(t, a, b, "a->b under the first contact's keys, after a forged Challenge for another")
}

// TestAttackReplayedOpeningAfterReclaim: within the answering secret's
// lifetime, b's keys of a contact are reclaimed idle; the opener's first
// frame, captured and replayed, must not derive them again (its packet
// numbers and b's would restart under the same keys).
func TestAttackReplayedOpeningAfterReclaim(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	net := llp.NewMemNet()
	cfg := Config{Mode: AEAD, Now: clk.Now, MaxPeers: 2, IdleTimeout: time.Minute, SecretLifetime: time.Hour}
	a := newLink(t, net, addrA, cfg)
	b := newLink(t, net, addrB, cfg)
	m := newLink(t, net, addrD, cfg)
	initial := contactVia(t, a, b, 0x3333, clk.Now())
	contactVia(t, m, b, 0x4444, clk.Now()) // b full
	clk.t = clk.t.Add(2 * time.Minute)     // idle, the secret still the same
	b.coarse = clk.Now()
	contactVia(t, m, b, 0x5555, clk.Now()) // reclaims the idle ones
	replayed := b.st.Replayed.Load()
	if up := b.open(bytes.Clone(initial), a.LocalAddr(), nil, clk.Now()); up != nil {
		t.Fatalf("the replayed opening derived its reclaimed keys again: %q", up)
	}
	if b.st.Replayed.Load() != replayed+1 {
		t.Fatalf("not refused as a replay: %v", snap(b))
	}
}
