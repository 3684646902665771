package protect

import (
	"bytes"
	"testing"

	"github.com/udiwarp/udiwarp/llp"
)

// TestAttackGenerationDesync: the receiver tries only cur/next/prev. A
// receiver that missed a whole generation, or that (re)derives a
// pre-shared-key SA at generation 0 after a restart or an idle reclaim
// while the sender is at generation >= 2, never opens that sender again.
func TestAttackGenerationDesync(t *testing.T) {
	psk := bytes.Repeat([]byte{7}, 16)
	net := llp.NewMemNet()
	cfg := Config{Mode: AEAD, PSK: psk, KeyUpdateAfter: 4}
	a := newLink(t, net, addrA, cfg)
	b := newLink(t, net, addrB, cfg)
	seal := func() []byte {
		w, err := a.seal(nil, &llp.Msg{Bufs: [][]byte{udSend([]byte("payload"))}, Addr: addrB})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	for range 4 { // generation 0 delivered
		if b.open(seal(), addrA, nil, b.cfg.Now()) == nil {
			t.Fatal("gen 0")
		}
	}
	for range 4 { // generation 1 lost (or dropped by an on-path attacker)
		seal()
	}
	ok := 0
	for range 40 { // generations 2..11
		if b.open(seal(), addrA, nil, b.cfg.Now()) != nil {
			ok++
		}
	}
	t.Logf("after one lost generation: %d of 40 later datagrams opened; %v", ok, snap(b))
	if ok == 0 {
		t.Errorf("one generation lost: the SA never opens again")
	}
	// b restarts: a fresh receiver derives generation 0 for a's key ID.
	b2 := newLink(t, llp.NewMemNet(), addrB, cfg)
	ok = 0
	for range 40 {
		if b2.open(seal(), addrA, nil, b2.cfg.Now()) != nil {
			ok++
		}
	}
	t.Logf("restarted receiver: %d of 40 opened; %v", ok, snap(b2))
	if ok == 0 {
		t.Errorf("a restarted receiver never opens a sender past generation 1")
	}
}
