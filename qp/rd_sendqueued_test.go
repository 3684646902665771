package qp

import (
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
)

// TestRDSendQueued: an RD QP's SendQueued says whether a Send it took is
// still unfinished — unacknowledged, or waiting for its peer's handshake
// — so that its owner can wait before closing it (the LD_PRELOAD
// engine's linger). It is true from the post until the peer acknowledges
// the Send, or until RD gives up on a peer that never answers, and false
// once the Send completed either way.
func TestRDSendQueued(t *testing.T) {
	rd := RDConfig{Config: reliability.Config{InitialRTT: 100 * time.Millisecond, MaxRTO: 400 * time.Millisecond, MaxRetries: 5}}
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, rd)
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("SendQueued never became %s", what)
			}
		}
	}
	if p.qa.SendQueued() {
		t.Fatal("SendQueued before any post")
	}
	mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{p.b.mr.SGE(0, 16)}}))
	if err := p.qa.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("acked"), AH: p.ahAB}); err != nil {
		t.Fatal(err)
	}
	until("false after the acknowledgement", func() bool { return !p.qa.SendQueued() })
	if wc := collect(t, p.cqa, 1, 5*time.Second)[0]; wc.ID != 1 || wc.Status != Success {
		t.Fatalf("%+v", wc)
	}

	// A peer that never answers: a plain UDP socket that reads nothing.
	// Nothing can complete the Send before RD's retries (about 1.9 s)
	// give up on it.
	mute, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	ah, err := p.a.pd.CreateAH(mute.LocalAddr().(*net.UDPAddr).AddrPort(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.qa.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, Inline: []byte("lost"), AH: ah}); err != nil {
		t.Fatal(err)
	}
	if !p.qa.SendQueued() {
		t.Fatal("SendQueued is false with a Send waiting for its peer's handshake")
	}
	until("false after RD gave up", func() bool { return !p.qa.SendQueued() })
	if wc := collect(t, p.cqa, 1, 5*time.Second)[0]; wc.ID != 2 || wc.Status != RetryExceededError {
		t.Fatalf("%+v", wc)
	}
}
