package qp

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/protect"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestAttackForgedChallengeKillsSession: two AEAD devices sharing a
// pre-shared key. An on-path attacker holding no key reads the token of
// a's Hello (in clear) and, after the session is up, sends a Challenge
// "from b" with a share of its own. Before the fix a installed keys from
// it and sealed everything to b under keys b could not derive, killing
// the session (found by review). Now a Hello is answered once: the
// forgery answers nothing, is counted, and the flow goes on.
func TestAttackForgedChallengeKillsSession(t *testing.T) {
	sp := spoof.NewT(t)
	cfg := DeviceConfig{Protect: protect.Config{Mode: protect.AEAD, PSK: bytes.Repeat([]byte{3}, 16)}}
	a := newNode(t, cfg, "udp4", "127.0.0.1:0")
	b := newNode(t, cfg, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{})
	qb, cqb := rdQPOn(t, b, RDConfig{})
	ahAB := a.ah(b, qb)
	aaddr, baddr := a.sock.LocalAddr(), b.sock.LocalAddr()
	tap := spoof.NewTap(t, baddr.Port()) // before any traffic
	send := func(id uint64, limit time.Duration) bool {
		t.Helper()
		mustPost(t, qb.PostRecv(&RecvWR{ID: id, SGL: []SGE{b.mr.SGE(int(id%64)*200, 200)}}))
		mustPost(t, qa.PostSend(&SendWR{ID: id, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, 200)}, AH: ahAB}))
		end := time.Now().Add(limit)
		var wc [1]WorkCompletion
		for time.Now().Before(end) {
			if cqb.Poll(wc[:]) == 1 {
				return wc[0].Status == Success
			}
			time.Sleep(time.Millisecond)
		}
		return false
	}
	for i := range 3 {
		if !send(uint64(i), 5*time.Second) {
			t.Fatal("flow before the attack")
		}
	}
	d, ok := tap.Next(baddr.Port(), func(d spoof.Datagram) bool {
		return d.Src == aaddr && len(d.Payload) > 0 && d.Payload[0] == byte(protect.KindContact)<<2
	}, 5*time.Second)
	if !ok {
		t.Fatal("no Hello seen")
	}
	var h protect.Header
	if err := h.Parse(d.Payload); err != nil {
		t.Fatal(err)
	}
	var rh reliability.Header
	if err := rh.Parse(d.Payload[h.Size : len(d.Payload)-4]); err != nil {
		t.Fatal(err)
	}
	priv, _ := ecdh.X25519().GenerateKey(rand.Reader)
	f := reliability.Append(nil, &reliability.Fields{Type: reliability.Challenge, DstQPN: rh.SrcQPN, SrcQPN: rh.DstQPN, Epoch: 12345,
		Token: rh.Issued, Init: true, Issued: 0x5555})
	env := make([]byte, protect.HeaderSize+protect.ShareSize)
	copy(env, d.Payload[:4]) // kind, mode, flags
	env = append(env[:protect.HeaderSize], priv.PublicKey().Bytes()...)
	env[16], env[17] = byte(len(f)>>8), byte(len(f))
	forged := udiwarp.SealDatagram(append(env, f...), 0)
	sa, sb := a.dev.Stats(), b.dev.Stats()
	sessions, unsolicited := sa.ProtSessions.Load(), sa.ProtUnsolicited.Load()
	if err := sp.Send(baddr, aaddr, forged); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a refuses the forged Challenge", func() bool { return sa.ProtUnsolicited.Load() > unsolicited })
	if sa.ProtSessions.Load() != sessions {
		t.Fatal("a installed keys from a forged Challenge")
	}
	noKey := sb.ProtNoKey.Load()
	okAfter := send(100, 3*time.Second)
	t.Logf("after one forged keyless Challenge: a->b send delivered=%v; b NoKey %d->%d; a Unsolicited=%d",
		okAfter, noKey, sb.ProtNoKey.Load(), sa.ProtUnsolicited.Load())
	if !okAfter {
		t.Errorf("the live session no longer delivers a->b after a forged Challenge")
	}
	_ = cqa
}
