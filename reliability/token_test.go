package reliability

import (
	"net/netip"
	"testing"
	"time"
)

// TestTokensBindTheSession: a token is valid only for the session it was
// issued in — the peer's address, QP and epoch and the local QP and
// epoch — and the epoch derived for answering without state changes
// with the peer's epoch and is the same each time.
func TestTokensBindTheSession(t *testing.T) {
	tk := NewTokens()
	peer := netip.MustParseAddrPort("127.0.0.1:4791")
	tok := tk.Issue(peer, 5, 100, 6, 200)
	if !tk.Valid(tok, peer, 5, 100, 6, 200) {
		t.Fatal("not valid where issued")
	}
	for _, c := range []struct {
		name                          string
		qpn, epoch, local, localEpoch uint32
	}{{"peer QP", 7, 100, 6, 200}, {"peer epoch", 5, 101, 6, 200}, {"local QP", 5, 100, 8, 200}, {"local epoch", 5, 100, 6, 201}} {
		if tk.Valid(tok, peer, c.qpn, c.epoch, c.local, c.localEpoch) {
			t.Errorf("valid with another %s", c.name)
		}
	}
	if tk.Valid(tok, netip.MustParseAddrPort("127.0.0.1:4792"), 5, 100, 6, 200) {
		t.Error("valid from another port")
	}
	if e := tk.Epoch(peer, 5, 100, 6); e == 0 || e != tk.Epoch(peer, 5, 100, 6) || e == tk.Epoch(peer, 5, 101, 6) {
		t.Error("derived epoch not stable per peer epoch, or the same for another")
	}
	if NewTokens().Issue(peer, 5, 100, 6, 200) == tok {
		t.Error("two secrets, one token")
	}
}

// TestSenderFind: the packet in flight a Challenge's 16 bits name, across
// the 2^16 and 2^32 wraps, and whether it went more than once.
func TestSenderFind(t *testing.T) {
	for _, first := range []uint32{0, 1<<16 - 3, 1<<32 - 3} {
		s := NewSender[int](Config{FirstSeq: first})
		now := time.Unix(1, 0)
		for i := range 6 {
			s.Push(i, 1200, now)
		}
		for i := range uint32(6) {
			seq, once, ok := s.Find(uint16(first + i))
			if !ok || seq != first+i || !once {
				t.Fatalf("first %d, packet %d: %d %v %v", first, i, seq, once, ok)
			}
		}
		if _, _, ok := s.Find(uint16(first + 6)); ok {
			t.Fatalf("first %d: found a packet not sent", first)
		}
		if _, _, ok := s.Find(uint16(first - 1)); ok {
			t.Fatalf("first %d: found a packet before the oldest", first)
		}
		s.OnTimer(now.Add(time.Hour), func(uint32, *int) {}) // the oldest goes again
		if _, once, _ := s.Find(uint16(first)); once {
			t.Fatalf("first %d: a retransmitted packet went once", first)
		}
	}
}
