package protect

import (
	"bytes"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/llp"
)

// TestAttackSecretOutlivesTwoLifetimes: tick turns the answering secret
// one step, however long it has been: after an hour with no contact, the
// secret that answered the last contacts is still held (and still derives
// their keys) for one more lifetime.
func TestAttackSecretOutlivesTwoLifetimes(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	net := llp.NewMemNet()
	b := newLink(t, net, addrB, Config{Mode: AEAD, Now: clk.Now})
	old := bytes.Clone(b.secret[0])
	clk.t = clk.t.Add(time.Hour)
	b.mu.Lock()
	b.tick(clk.Now())
	b.mu.Unlock()
	if bytes.Equal(b.secret[1], old) {
		t.Errorf("an hour (30 lifetimes) later, the secret of the last contacts is still held as the previous one")
	}
}
