package protect

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

func TestWindow(t *testing.T) {
	var w window
	take := func(pn uint64) bool {
		if !w.check(pn) {
			return false
		}
		w.mark(pn)
		return true
	}
	for _, pn := range []uint64{0, 2, 1, 1000, 41} {
		if !take(pn) {
			t.Fatalf("%d refused", pn)
		}
	}
	for _, pn := range []uint64{0, 1, 2, 1000, 41, 39} {
		if take(pn) {
			t.Fatalf("%d taken twice or too old", pn)
		}
	}
	if !take(42) || !take(999) || take(40) {
		t.Fatal("a late number within the window refused")
	}
	// A jump of more than the bitmap forgets everything below the window.
	if !take(1_000_000) || take(1_000_000) || take(1000) || !take(1_000_000-Window+1) || take(1_000_000-Window) {
		t.Fatal("after a long jump")
	}
	// Words reused as the window slides hold no stale bits.
	w = window{}
	for pn := uint64(0); pn < 64*windowWords*4; pn += 3 {
		if !take(pn) {
			t.Fatalf("%d refused while sliding", pn)
		}
		if pn >= 3 && take(pn-3) {
			t.Fatalf("%d taken twice while sliding", pn-3)
		}
	}
}

// pair is two links protecting over an in-memory network, with the
// pre-shared key psk.
func pair(t testing.TB, m Mode, psk []byte) (a, b *Link, net *llp.MemNet) {
	t.Helper()
	net = llp.NewMemNet()
	la, _ := net.Open(netip.MustParseAddrPort("10.0.0.1:1"))
	lb, _ := net.Open(netip.MustParseAddrPort("10.0.0.2:1"))
	var err error
	if a, err = Wrap(la, Config{Mode: m, PSK: psk}, 8, Stats{}); err != nil {
		t.Fatal(err)
	}
	if b, err = Wrap(lb, Config{Mode: m, PSK: psk}, 8, Stats{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, net
}

// udSend is a UD Send frame with a zero trailer, as the device hands it.
func udSend(payload []byte) []byte {
	h := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: 1, QN: udiwarp.DatagramQN(2, udiwarp.QueueSend), MSN: 1})
	return append(append(h, payload...), 0, 0, 0, 0)
}

func readAll(l *Link) [][]byte {
	var out [][]byte
	for {
		buf := make([]byte, 70000)
		ms := []llp.Msg{{Bufs: [][]byte{buf}}}
		n, _ := l.Read(ms)
		if n == 0 {
			return out
		}
		out = append(out, buf[:ms[0].N])
	}
}

// TestSealOpen: a frame sealed by one link opens at the other as it was
// (with the zero trailer), in both modes; under AEAD the payload is not
// on the wire in clear, under Auth it is.
func TestSealOpen(t *testing.T) {
	for _, m := range []Mode{Auth, AEAD} {
		a, b, _ := pair(t, m, bytes.Repeat([]byte{7}, 16))
		payload := bytes.Repeat([]byte("secret payload "), 10)
		f := udSend(payload)
		wire, err := a.seal(nil, &llp.Msg{Bufs: [][]byte{f[:10], f[10:]}, Addr: b.LocalAddr()})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(wire, payload[:15]) != (m == Auth) {
			t.Fatalf("%v: payload in clear on the wire: %v", m, bytes.Contains(wire, payload[:15]))
		}
		if _, err := a.Write([]llp.Msg{{Bufs: [][]byte{f}, Addr: b.LocalAddr()}}); err != nil {
			t.Fatal(err)
		}
		got := readAll(b)
		if len(got) != 1 || !bytes.Equal(got[0], f) {
			t.Fatalf("%v: got %x, want %x", m, got, f)
		}
	}
}

// TestEveryByteCounts: changing any one byte of a sealed datagram gets
// it refused (the header, the initial block and the tag are all
// covered), and the original still opens after all of them.
func TestEveryByteCounts(t *testing.T) {
	for _, m := range []Mode{Auth, AEAD} {
		a, b, net := pair(t, m, bytes.Repeat([]byte{7}, 16))
		inj, _ := net.Open(netip.MustParseAddrPort("10.0.0.1:2"))
		_ = inj
		wire, err := a.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("0123456789abcdef"))}, Addr: b.LocalAddr()})
		if err != nil {
			t.Fatal(err)
		}
		now := b.cfg.Now()
		for i := range wire {
			for _, bit := range []byte{0x01, 0x80} {
				d := append([]byte(nil), wire...)
				d[i] ^= bit
				if f := b.open(d, a.LocalAddr(), nil, now); f != nil {
					t.Fatalf("%v: byte %d ^ %#x: opened", m, i, bit)
				}
			}
		}
		if f := b.open(append([]byte(nil), wire...), a.LocalAddr(), nil, now); f == nil {
			t.Fatalf("%v: the original refused after the forgeries", m)
		}
		if f := b.open(append([]byte(nil), wire...), a.LocalAddr(), nil, now); f != nil {
			t.Fatalf("%v: the original opened twice", m)
		}
	}
}

// FuzzOpen: whatever arrives, the link never panics, never hands up a
// datagram that did not open under keys (a fuzzer cannot forge a tag),
// and never installs keys for it.
func FuzzOpen(f *testing.F) {
	a, _, _ := pair(f, AEAD, bytes.Repeat([]byte{7}, 16))
	b, _, _ := pair(f, AEAD, bytes.Repeat([]byte{9}, 16))
	seed, _ := a.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("seed"))}, Addr: b.LocalAddr()})
	f.Add(seed)
	c, _ := a.contact(udiwarp.SealDatagram(helloFrame(), 0)[:36], b.LocalAddr())
	f.Add(c)
	f.Add(AppendRefuse(nil, &Refusal{Mode: Auth, FromQP: 1, NameQP: 2, Token: 3}))
	f.Fuzz(func(t *testing.T, d []byte) {
		if len(d) > 0 && d[0] == byte(KindRefuse)<<2 {
			return // handed up for the device to parse (RefuseFor, Refusal.Parse: FuzzRefusal)
		}
		if len(d) > 0 && d[0] == byte(KindContact)<<2 {
			// A Contact with a right CRC goes up (a Hello for the engine):
			// check only that nothing is installed.
			b.open(d, a.LocalAddr(), nil, b.cfg.Now())
		} else if fr := b.open(d, a.LocalAddr(), nil, b.cfg.Now()); fr != nil {
			t.Fatalf("a forged datagram opened: %x", d)
		}
		if b.Sessions() != 0 {
			t.Fatal("keys installed from a forgery")
		}
	})
}

// FuzzHandshake: an opener's first sealed frame with a fuzzed initial
// block, key ID and tag never installs keys nor panics.
func FuzzHandshake(f *testing.F) {
	_, b, _ := pair(f, AEAD, nil)
	f.Add(make([]byte, InitialSize), uint32(1), []byte("frame and tag....................."))
	f.Fuzz(func(t *testing.T, initial []byte, keyID uint32, rest []byte) {
		if len(initial) != InitialSize || keyID == 0 {
			return
		}
		d := make([]byte, HeaderSize+InitialSize, HeaderSize+InitialSize+len(rest))
		putHeader(d, KindSealed, AEAD, FlagInitial, keyID, 0, 0, initial)
		d = append(d, rest...)
		b.bucket = 1e9 // the fuzzer, not the budget, decides
		if fr := b.open(d, netip.MustParseAddrPort("10.0.0.9:9"), nil, b.cfg.Now()); fr != nil || b.Sessions() != 0 {
			t.Fatalf("a forged opening installed keys: %x", d)
		}
	})
}

// FuzzRefusal: Refusal.Parse and RefuseFor take any bytes.
func FuzzRefusal(f *testing.F) {
	f.Add(udiwarp.SealDatagram(AppendRefuse(nil, &Refusal{Mode: Auth, FromQP: 1, NameQP: 2, Token: 3}), 0))
	f.Fuzz(func(t *testing.T, d []byte) {
		var r Refusal
		if r.Parse(d) == nil && len(d) != RefuseSize {
			t.Fatal("a Refuse of the wrong size parsed")
		}
		if out := RefuseFor(d, AEAD); out != nil && len(out) > len(d) {
			t.Fatal("a Refuse larger than what drew it")
		}
	})
}

// helloFrame is an RD Hello (QP 5 to QP 6, token 0x1122...).
func helloFrame() []byte {
	return reliability.Append(nil, &reliability.Fields{Type: reliability.Hello, DstQPN: 6, SrcQPN: 5, Epoch: 1, Init: true, Issued: 0x1122334455667788})
}

// TestKeyUpdateStalledWriter: a writer that drew its packet number
// before another moved the sender to the next generation seals under the
// generation its number belongs to, and the receiver, which tells
// generations apart by number and phase, opens both, in either order.
// (Before, it sealed under the newer key, and the receiver tried the
// other one: the datagram was lost.)
func TestKeyUpdateStalledWriter(t *testing.T) {
	x, y, _ := pair(t, AEAD, bytes.Repeat([]byte{7}, 16))
	x.cfg.KeyUpdateAfter = 8
	f := udSend([]byte("payload"))
	if _, err := x.seal(nil, &llp.Msg{Bufs: [][]byte{f}, Addr: y.LocalAddr()}); err != nil { // keys the peer
		t.Fatal(err)
	}
	tx, _ := x.txFor(y.LocalAddr(), 0)
	tx.every = 8
	late := tx.genOf(7)  // drawn before the update, sealed after it
	first := tx.genOf(8) // the update
	if first.n != 1 || tx.genOf(7) != late || late.n != 0 {
		t.Fatalf("packet 7 sealed in generation %d after the update to %d", tx.genOf(7).n, first.n)
	}
	seal := func(pn uint64) []byte {
		tx.pn.Store(pn)
		d, err := x.seal(nil, &llp.Msg{Bufs: [][]byte{f}, Addr: y.LocalAddr()})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d8, d7 := seal(8), seal(7) // 7 after 8, as a stalled writer would
	for _, d := range [][]byte{d8, d7} {
		if y.open(d, x.LocalAddr(), nil, y.coarse) == nil {
			t.Fatalf("datagram %x refused (auth failures: %d)", d[8:16], y.st.AuthFailed.Load())
		}
	}
}
