package qp

import (
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
)

// TestRDReceiverNotReadyRetries: with the default RNR retry limit (7) and
// more than 8 Sends in flight, a receiver that refuses (no receive
// posted) and posts its receives later gets every message: the refusal
// counts once, not once per ack the frames in flight draw, so the
// sender's backoff runs instead of failing the peer at once.
func TestRDReceiverNotReadyRetries(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{Config: reliability.Config{RNRDelay: 10 * time.Millisecond, RNRRetries: 7}})
	const n = 16
	for i := range n {
		p.a.buf[i] = byte(i)
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i, 1)}, AH: p.ahAB}); err != nil {
			t.Fatal(err)
		}
	}
	// The receiver refuses the first, holds the rest behind it, and has
	// acknowledged them all (every one drew an ack).
	eventually(t, "a refusal and the frames behind it held", func() bool {
		return p.b.dev.Stats().RDNotReady.Load() > 0 && p.b.dev.Stats().RDAcksSent.Load() >= n
	})
	for i := range n {
		p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i, 1)}})
	}
	for i, wc := range collect(t, p.cqa, n, 20*time.Second) {
		if wc.ID != uint64(i) || wc.Status != Success {
			t.Fatalf("send %d: %+v", i, wc)
		}
	}
	for i, wc := range collect(t, p.cqb, n, 5*time.Second) {
		if wc.ID != uint64(i) || wc.Status != Success || p.b.buf[i] != byte(i) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
}
