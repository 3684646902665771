package qp

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestRDChurnDoesNotReopenEndedSession (issue 30, item 1): a session's
// first frame (INIT, its keyed token, a Send or an Atomic FetchAdd) is
// delivered, the receiver drops the session (idle reclaim) with the ack
// lost, and then another validated peer reopens its own session again
// and again — more sessions than the receiver's graveyard holds in two
// generations. The first frame, sent again (a retransmission, or a copy
// the network delayed), must still open nothing: no second delivery, no
// second FetchAdd, and a Challenge back. It fails against a graveyard
// that forgets the oldest graves when other peers fill it (the Send is
// delivered twice, the word goes 1 -> 2).
func TestRDChurnDoesNotReopenEndedSession(t *testing.T) {
	for _, isAtomic := range []bool{false, true} {
		name := "Send"
		if isAtomic {
			name = "Atomic FetchAdd"
		}
		t.Run(name, func(t *testing.T) {
			b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
			// b gives up on an Atomic Response never acknowledged after a
			// few tries, and so ends the session.
			qb, cqb := rdQPOn(t, b, RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond, MaxRTO: 5 * time.Millisecond, MaxRetries: 3},
				IdleTimeout: time.Hour})
			amr, err := b.pd.RegisterMemory(make([]byte, 8), AccessLocalWrite|AccessRemoteAtomic)
			if err != nil {
				t.Fatal(err)
			}
			word := func() uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&amr.Bytes()[0]))) }
			for i := range 2 {
				mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*10, 10)}}))
			}
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const qpn = 9
			r := rawContact(t, c, b, qb, qpn)
			var seg []byte
			if isAtomic {
				seg = udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
					RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpAtomicRequest), ULP: qpn, QN: udiwarp.DatagramQN(qb.QPN(), udiwarp.QueueReadRequest), MSN: 1})
				a := atomicRequest(OpAtomicFetchAdd, 1, amr.STag(), amr.Addr(), 1, 0)
				seg = udiwarp.AppendAtomicRequest(seg, &a)
			} else {
				seg = rdSendSeg(qb.QPN(), qpn, 1, []byte("once"))
			}
			r.data(0, seg, false, 0, 0)
			if isAtomic {
				eventually(t, "the FetchAdd carried out", func() bool { return word() == 1 })
			} else if wc := collect(t, cqb, 1, 5*time.Second)[0]; wc.Status != Success || string(b.buf[:4]) != "once" {
				t.Fatalf("%+v", wc)
			}
			// The ack (and the Atomic Response) are lost: the source
			// never answers them. b ends the session: it reclaims the idle
			// peer, or gives up on the Atomic Response.
			if !isAtomic {
				setIdleTimeout(qb, time.Millisecond)
			}
			eventually(t, "b ending the session", func() bool { return peersOf(qb) == 0 })
			setIdleTimeout(qb, time.Hour)

			// Another validated peer reopens its session, again and
			// again: three generations of graves, each its own.
			churner, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
			if err != nil {
				t.Fatal(err)
			}
			defer churner.Close()
			const churn = 3*rdGraveyard + 10
			for e := uint32(1); e <= churn; e++ {
				// Each contact in a new epoch ends the one before.
				rawContactIn(t, churner, b, qb, 5, 1000+e, uint64(e)).data(0, []byte("junk, not DDP"), false, 0, 0)
			}
			eventually(t, "b taking every reopened session", func() bool {
				return b.dev.Stats().RDPeerRestarts.Load() >= churn-1
			})
			qb.rd.mu.Lock()
			graves := qb.rd.ep.Graves()
			qb.rd.mu.Unlock()
			if graves > 2*rdGraveyard {
				t.Fatalf("%d graves: more than two generations of %d", graves, rdGraveyard)
			}

			// The first frame again. What b sent before (acks, Atomic
			// Responses) is still queued at c: read up to the Challenge.
			r.data(0, seg, false, 0, 0)
			challenged := r.await(func(h *reliability.Header) bool { return h.Type == reliability.Challenge && h.Token == r.theirs })
			if v := word(); isAtomic && v != 1 {
				t.Fatalf("the FetchAdd ran again: word %d", v)
			}
			if !isAtomic {
				var wc [1]WorkCompletion
				if cqb.Poll(wc[:]) > 0 {
					t.Fatalf("the Send was delivered again: %+v, %q", wc[0], b.buf[10:14])
				}
			}
			if n := peersOf(qb); n != 1 {
				t.Fatalf("%d peers: the frame of the ended session opened one", n)
			}
			if !challenged {
				t.Fatal("the frame of the ended session drew no Challenge")
			}
		})
	}
}

// TestRDErrorEndsSessionsForGood: a QP moved to ERROR drops its peers;
// brought back (RESET, INIT, RTR, RTS), a session it had — its first
// frame sent again by a peer still waiting for the ack — opens nothing
// and is not delivered a second time. It fails when the flush drops the
// peers without burying their sessions.
func TestRDErrorEndsSessionsForGood(t *testing.T) {
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, RDConfig{})
	mustPost(t, qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 10)}}))
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const qpn = 9
	r := rawContact(t, c, b, qb, qpn)
	readType := func(want reliability.Type) bool {
		return r.await(func(h *reliability.Header) bool { return h.Type == want })
	}
	seg := rdSendSeg(qb.QPN(), qpn, 1, []byte("once"))
	r.data(0, seg, false, 0, 0)
	if wc := collect(t, cqb, 1, 5*time.Second)[0]; wc.Status != Success || string(b.buf[:4]) != "once" {
		t.Fatalf("%+v", wc)
	}
	if !readType(reliability.Ack) {
		t.Fatal("no ack")
	}
	for _, st := range []QPState{StateError, StateReset, StateInit, StateRTR, StateRTS} {
		if err := qb.Modify(ModifyAttr{State: st}); err != nil {
			t.Fatal(err)
		}
	}
	if peersOf(qb) != 0 {
		t.Fatal("the flush kept a peer")
	}
	mustPost(t, qb.PostRecv(&RecvWR{ID: 2, SGL: []SGE{b.mr.SGE(10, 10)}}))
	r.data(0, seg, false, 0, 0)
	challenged := readType(reliability.Challenge)
	var wc [1]WorkCompletion
	if cqb.Poll(wc[:]) > 0 {
		t.Fatalf("the Send of the session before ERROR was delivered again: %+v", wc[0])
	}
	if n := peersOf(qb); n != 0 {
		t.Fatalf("%d peers: the session before ERROR opened again", n)
	}
	if !challenged {
		t.Fatal("no Challenge")
	}
}
