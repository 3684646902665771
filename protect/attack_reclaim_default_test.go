package protect

import (
	"bytes"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/reliability"
)

func contactVia(t *testing.T, op, ans *Link, tok uint64, now time.Time) (initial []byte) {
	t.Helper()
	hello := rdFrame(&reliability.Fields{Type: reliability.Hello, DstQPN: 6, SrcQPN: 5, Epoch: 1, Init: true, Issued: tok})
	wh, _ := op.seal(nil, &llp.Msg{Bufs: [][]byte{hello}, Addr: ans.LocalAddr()})
	if ans.open(wh, op.LocalAddr(), nil, now) == nil {
		t.Fatalf("hello: %v", snap(ans))
	}
	ch := rdFrame(&reliability.Fields{Type: reliability.Challenge, DstQPN: 5, SrcQPN: 6, Epoch: 2, Token: tok, Init: true, Issued: tok})
	wc, _ := ans.seal(nil, &llp.Msg{Bufs: [][]byte{ch}, Addr: op.LocalAddr()})
	if op.open(wc, ans.LocalAddr(), nil, now) == nil {
		t.Fatal("challenge")
	}
	return openerData(t, op, ans, tok, now)
}

// TestAttackDefaultReclaimReplay: default IdleTimeout and SecretLifetime.
// The answering side held no contact for 11 minutes, so its secret turned
// once only (tick); its idle session is reclaimed under MaxPeers pressure
// (which a keyless client can make: TestReviewOneHostFillsMaxPeers), and
// the opener's captured first datagram, replayed, derives the keys again:
// the old datagram is handed up a second time, and the answering side's
// new sender starts again at packet number 0 under the same key.
func TestAttackDefaultReclaimReplay(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	net := llp.NewMemNet()
	cfg := Config{Mode: AEAD, Now: clk.Now, MaxPeers: 2} // MaxPeers small only to keep the test short
	a := newLink(t, net, addrA, cfg)
	b := newLink(t, net, addrB, cfg)
	m := newLink(t, net, addrD, cfg)
	initial := contactVia(t, a, b, 0x3333, clk.Now())
	wb1, _ := b.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("b to a, first life"))}, Addr: a.LocalAddr()})
	contactVia(t, m, b, 0x4444, clk.Now()) // b full
	clk.t = clk.t.Add(11 * time.Minute)
	b.coarse = clk.Now()
	contactVia(t, m, b, 0x5555, clk.Now()) // pressure: reclaims the idle ones
	up := b.open(bytes.Clone(initial), a.LocalAddr(), nil, clk.Now())
	if up != nil {
		t.Errorf("an 11-minute-old captured datagram, replayed, opened again: %q", up)
	}
	wb2, _ := b.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("b to a, 2nd life!!"))}, Addr: a.LocalAddr()})
	var h1, h2 Header
	h1.Parse(wb1)
	h2.Parse(wb2)
	t.Logf("b->a before: key %#x pn %d; after: key %#x pn %d", h1.KeyID, h1.PN, h2.KeyID, h2.PN)
	if h1.KeyID == h2.KeyID && h1.PN == h2.PN && !bytes.Equal(wb1, wb2) {
		t.Errorf("nonce reuse under the default configuration")
	}
}
