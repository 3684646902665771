package qp

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// TestRDTrains sends RD messages in 1,400-byte segments, which leave as
// UDP GSO trains (rdtrain.go): an RDMA Write gathered from three SGEs
// whose boundaries fall inside segments, a Write with Immediate (a train,
// then the Immediate Data message alone), and an RDMA Read whose
// responses go as trains from the responder. Every byte lands where it
// belongs and every WR completes Success — on a clean path, and with the
// receiver dropping 3 % of the datagrams it reads (the trains' frames
// then come again one at a time).
func TestRDTrains(t *testing.T) {
	for _, loss := range []float64{0, 0.03} {
		t.Run(fmt.Sprintf("loss=%g", loss), func(t *testing.T) {
			var cfgB DeviceConfig
			var im *Impairment
			if loss > 0 {
				im = &Impairment{Seed: 7, Loss: loss}
				cfgB.ImpairRx = im
			}
			p := newRDPair(t, DeviceConfig{}, cfgB, RDConfig{Segment: 1400})
			const size = 512 << 10
			region, err := p.b.pd.RegisterMemory(make([]byte, 2*size), AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			src := p.a.buf[:size]
			fill(src, 31)
			// Three SGEs, each ending inside a segment.
			sgl := []SGE{p.a.mr.SGE(0, 100003), p.a.mr.SGE(100003, 200001), p.a.mr.SGE(300004, size-300004)}
			if err := p.qa.PostSend(&SendWR{ID: 1, Opcode: OpWrite, Flags: FlagSignaled, SGL: sgl, AH: p.ahAB,
				RemoteSTag: region.STag(), RemoteTO: region.Addr()}); err != nil {
				t.Fatal(err)
			}
			mustPost(t, p.qb.PostRecv(&RecvWR{ID: 7, SGL: []SGE{p.b.mr.SGE(0, 64)}}))
			if err := p.qa.PostSend(&SendWR{ID: 2, Opcode: OpWriteImm, Flags: FlagSignaled, Imm: 0xfeed, SGL: []SGE{p.a.mr.SGE(1000, 99999)}, AH: p.ahAB,
				RemoteSTag: region.STag(), RemoteTO: region.Addr() + size}); err != nil {
				t.Fatal(err)
			}
			for i, wc := range collect(t, p.cqa, 2, 30*time.Second) {
				if wc.ID != uint64(i+1) || wc.Status != Success {
					t.Fatalf("write %d: %+v", i+1, wc)
				}
			}
			if wc := collect(t, p.cqb, 1, 30*time.Second)[0]; wc.Status != Success || !wc.WithImm || wc.Imm != 0xfeed {
				t.Fatalf("the Immediate: %+v", wc)
			}
			syncRD(p.qb)
			if !bytes.Equal(region.Bytes()[:size], src) {
				t.Fatal("the Write's bytes differ")
			}
			if !bytes.Equal(region.Bytes()[size:size+99999], p.a.buf[1000:1000+99999]) {
				t.Fatal("the Write with Immediate's bytes differ")
			}
			// A Read of 300,001 bytes: the responder sends it in trains.
			fill(region.Bytes()[size:], 5)
			const rsize = 300001
			sink, err := p.a.pd.RegisterMemory(make([]byte, rsize), AccessLocalWrite|AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.qa.PostSend(&SendWR{ID: 3, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(0, rsize)}, AH: p.ahAB,
				RemoteSTag: region.STag(), RemoteTO: region.Addr() + size + 3}); err != nil {
				t.Fatal(err)
			}
			if wc := collect(t, p.cqa, 1, 30*time.Second)[0]; wc.ID != 3 || wc.Status != Success {
				t.Fatalf("read: %+v", wc)
			}
			if !bytes.Equal(sink.Bytes(), region.Bytes()[size+3:size+3+rsize]) {
				t.Fatal("the Read's bytes differ")
			}
			sa, sb := p.a.dev.Stats(), p.b.dev.Stats()
			if sa.TxGSO.Load() == 0 || sb.TxGSO.Load() == 0 {
				t.Fatalf("no train left: writer %d, responder %d GSO sends", sa.TxGSO.Load(), sb.TxGSO.Load())
			}
			t.Logf("writer: %d data frames in %d trains, %d retransmitted; responder: %d trains; %d dropped by the impairment",
				sa.RDDataSent.Load(), sa.TxGSO.Load(), sa.RDRetransmits.Load(), sb.TxGSO.Load(), sb.RxImpaired.Load())
			if loss > 0 && (im.Dropped.Load() == 0 || sa.RDRetransmits.Load() == 0) {
				t.Fatalf("nothing lost (%d dropped, %d retransmitted): the test did not test", im.Dropped.Load(), sa.RDRetransmits.Load())
			}
		})
	}
}
