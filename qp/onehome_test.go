package qp

import (
	"bytes"
	"testing"
	"time"
)

// TestRCSRQLimitReleased: an RC QP on an SRQ gives back each SRQ receive
// it holds when its completion is polled, as UD and RD do (completeRecv is
// the one home of a receive's completion). Before, RC's completions did
// not carry the QP, so its count of held receives only grew: with
// SRQLimit 2, the third Send failed with no buffer although the first two
// had been polled.
func TestRCSRQLimitReleased(t *testing.T) {
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	srq, err := b.pd.CreateSRQ(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	q, err := b.pd.CreateQP(QPAttr{Type: RC, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, SRQLimit: 2,
		Caps: QPCaps{MaxSendWR: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(ModifyAttr{State: StateInit}); err != nil {
		t.Fatal(err)
	}
	b.q = q
	rcConnect(t, a, b, RCConfig{}, RCConfig{})
	const n = 6
	for i := 0; i < n; i++ {
		if err := srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		fill(a.buf[i*64:i*64+40], i)
		if err := a.q.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(i*64, 40)}}); err != nil {
			t.Fatal(err)
		}
		if wc := collect(t, a.cq, 1, 10*time.Second)[0]; wc.Status != Success {
			t.Fatalf("send %d: %+v", i, wc)
		}
		wc := collect(t, b.cq, 1, 10*time.Second)[0]
		if wc.ID != uint64(i) || wc.Status != Success || wc.Len != 40 {
			t.Fatalf("receive %d: %+v", i, wc)
		}
		if !bytes.Equal(b.buf[i*64:i*64+40], a.buf[i*64:i*64+40]) {
			t.Fatalf("message %d differs", i)
		}
	}
	if got := q.srqHeld.Load(); got != 0 {
		t.Fatalf("SRQ receives held after all were polled: %d", got)
	}
}
