package qp

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// TestRDWriteRecordUnderLoss: Write-Records over RD through a lossy link
// (5 % of what the source sends, seeded), to a target whose Write-Record
// deadline (1 ms; the QP's, or the region's own) is shorter than RD's
// recovery of a lost segment. Every WR must complete Success and be
// recorded whole, once, with its bytes: RD delivers every segment of a
// message, so a deadline that ends a message while RD is still
// retransmitting turns a reliable delivery into a lost record. Before,
// such messages expired at the target: the rest of their segments were
// dropped as a remembered message's (the WR completed
// RemoteOperationError), or, once it was forgotten, started a message
// that never completed (the WR completed Success, nothing recorded).
func TestRDWriteRecordUnderLoss(t *testing.T) {
	const (
		seg    = 1024
		msgLen = 8 * seg // eight segments a message
		slots  = 64
		msgs   = 300
	)
	for _, tc := range []struct {
		name   string
		qp     writerecord.Config
		region *writerecord.Limits
	}{
		{"discard", writerecord.Config{Timeout: time.Millisecond}, nil},
		{"deliver-partial", writerecord.Config{Timeout: time.Millisecond, Policy: writerecord.DeliverPartial}, nil},
		{"region-limits", writerecord.Config{Timeout: time.Hour}, &writerecord.Limits{Timeout: time.Millisecond, Policy: writerecord.DeliverPartial}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t, DeviceConfig{Impair: &Impairment{Seed: 30, Loss: 0.05}}, "udp4", "127.0.0.1:0")
			b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
			rd := RDConfig{Segment: seg}
			qa := a.newQP(QPAttr{Type: RD, SendCQ: a.cq, RecvCQ: a.cq, RD: rd})
			qb := b.newQP(QPAttr{Type: RD, SendCQ: b.cq, RecvCQ: b.cq, RD: rd, WriteRecord: tc.qp, Record: RecordCQ})
			region, err := b.pd.RegisterMemory(make([]byte, slots*msgLen), AccessLocalWrite|AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			region.SetWriteRecordLimits(tc.region)
			ah := a.ah(b, qb)
			wcs := make([]WorkCompletion, 4)
			for i := range msgs {
				id := uint64(i + 1)
				src := a.buf[:msgLen]
				for j := range src {
					src[j] = byte(i*7 + j*13)
				}
				to := uint64(i%slots) * msgLen
				if err := qa.PostSend(&SendWR{ID: id, Flags: FlagSignaled, Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(0, msgLen)},
					AH: ah, RemoteSTag: region.STag(), RemoteTO: region.Addr() + to}); err != nil {
					t.Fatal(err)
				}
				// One at a time: each lost segment but a message's first
				// is a gap at the target until RD's probe timeout sends
				// it again (a few ms, over the 1 ms deadline).
				if wc := collect(t, a.cq, 1, time.Minute)[0]; wc.ID != id || wc.Status != Success {
					t.Fatalf("Write-Record %d of %d completed %v at the source: RD lost it (target engine %+v)", id, msgs, wc.Status, engineStats(b))
				}
				// The record is made before the last segment is
				// acknowledged: a WR that completed Success is in the
				// target's CQ already.
				n := b.cq.Poll(wcs)
				if n != 1 || wcs[0].Opcode != WCWriteRecord || wcs[0].Status != Success || wcs[0].Partial ||
					wcs[0].TO != to || wcs[0].Len != msgLen {
					t.Fatalf("Write-Record %d completed Success at the source, recorded as %+v (target engine %+v)", id, wcs[:n], engineStats(b))
				}
				if !bytes.Equal(region.Bytes()[to:to+msgLen], src) {
					t.Fatalf("Write-Record %d recorded whole, not its bytes", id)
				}
			}
			// The path was taken: segments were lost and sent again.
			if a.dev.Stats().TxImpaired.Load() == 0 || a.dev.Stats().RDRetransmits.Load() == 0 {
				t.Fatalf("impaired %d, retransmits %d: no loss to recover from", a.dev.Stats().TxImpaired.Load(), a.dev.Stats().RDRetransmits.Load())
			}
			if st := engineStats(b); st.Completed != msgs || st.Expired+st.Partial+st.Duplicate+st.Stale != 0 {
				t.Fatalf("target engine %+v, want %d completed and nothing else", st, msgs)
			}
		})
	}
}

func engineStats(n *node) writerecord.Stats {
	st, _ := n.dev.WriteRecordStats()
	return st
}

// TestRDWriteRecordForgottenPeer: over RD a Write-Record message in
// progress has no deadline, so what ends it when its source can no
// longer finish it is the end of the source's session: a peer the QP
// forgets (here reclaimed idle, after the first of the message's two
// segments) has its message ended by its policy at once — deliver-partial
// records the segment that arrived — and the engine keeps nothing of it.
func TestRDWriteRecordForgottenPeer(t *testing.T) {
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb := b.newQP(QPAttr{Type: RD, SendCQ: b.cq, RecvCQ: b.cq, RD: RDConfig{IdleTimeout: time.Hour},
		WriteRecord: writerecord.Config{Timeout: time.Millisecond, Policy: writerecord.DeliverPartial}, Record: RecordCQ})
	region, _ := b.pd.RegisterMemory(make([]byte, 1<<16), AccessLocalWrite|AccessRemoteWrite)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := rawContact(t, c, b, qb, 91)
	h := udiwarp.AppendWriteRecord(nil, &udiwarp.WriteRecordFields{RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
		STag: region.STag(), TO: region.Addr() + 4096, MSN: 1, MO: 0, MessageLength: 2000, DstQPN: qb.QPN(), SrcQPN: 91})
	r.data(0, append(h, make([]byte, 1000)...), false, 0, 256)
	eventually(t, "the first segment placed", func() bool { return b.dev.Stats().RxWRPlaced.Load() == 1 })
	if _, n := b.dev.WriteRecordStats(); n != 1 {
		t.Fatalf("%d messages in progress, want 1", n)
	}
	setIdleTimeout(qb, time.Millisecond)
	eventually(t, "b reclaiming the raw peer", func() bool { return peersOf(qb) == 0 })
	wc := collect(t, b.cq, 1, 5*time.Second)[0]
	if wc.Opcode != WCWriteRecord || !wc.Partial || wc.TO != 4096 || wc.Len != 2000 ||
		len(wc.Valid) != 1 || wc.Valid[0].Start != 4096 || wc.Valid[0].End != 5096 {
		t.Fatalf("the message of the forgotten peer recorded as %+v", wc)
	}
	if st, n := b.dev.WriteRecordStats(); n != 0 || st.Partial != 1 {
		t.Fatalf("engine %+v with %d in progress after the peer was forgotten", st, n)
	}
}
