package qp

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestRDQPRefusesUDFrames: an RD QP takes only RD frames from validated
// peers. UD frames forged to its QP number — a Send, a Write-Record, an
// error message — from a peer's own address take none of its posted
// receives, place nothing in its regions and raise no event; the peer's
// real Send then lands in the receive the forgeries did not take. Before
// the fix the forged Send completed the RD QP's receive with the
// attacker's bytes, "from" the peer.
func TestRDQPRefusesUDFrames(t *testing.T) {
	sp := spoof.NewT(t)
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{})
	qb, cqb := rdQPOn(t, b, RDConfig{})
	region, err := b.pd.RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := qb.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 4096)}}); err != nil {
		t.Fatal(err)
	}
	from, dst := a.sock.LocalAddr(), b.sock.LocalAddr()
	evil := bytes.Repeat([]byte("evil"), 64)
	frames := [][]byte{
		fzSend(qb.QPN(), qa.QPN(), 1, udiwarp.OpSend, 0, evil),
		fzWR(udiwarp.WriteRecordFields{Last: true, STag: region.STag(), TO: 0, MSN: 1,
			MessageLength: uint32(len(evil)), DstQPN: qb.QPN(), SrcQPN: qa.QPN()}, evil),
		fzTerm(qb.QPN(), qa.QPN(), udiwarp.DDPUntaggedNoBuffer, fzSend(qa.QPN(), qb.QPN(), 1, udiwarp.OpSend, 0, nil)),
	}
	st := b.dev.Stats()
	want := st.RxDatagrams.Load() + uint64(len(frames))
	for _, f := range frames {
		if err := sp.Send(from, dst, udiwarp.SealDatagram(f, 0)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the forged datagrams read", func() bool { return st.RxDatagrams.Load() >= want })
	rxSettled(b.sock)
	var wc [1]WorkCompletion
	if cqb.Poll(wc[:]) != 0 {
		t.Fatalf("a forged UD frame completed on the RD QP: %+v", wc[0])
	}
	if !bytes.Equal(region.Bytes(), make([]byte, 4096)) {
		t.Fatal("a forged UD Write-Record placed bytes in the RD QP's region")
	}
	select {
	case ev := <-b.dev.Events():
		t.Fatalf("a forged UD frame raised %+v", ev)
	default:
	}
	if got := st.RxUnknownQP.Load(); got != uint64(len(frames)) {
		t.Fatalf("%d UD frames counted for no UD QP, want %d", got, len(frames))
	}
	// The real peer's Send takes the receive the forgeries did not.
	ah, err := a.pd.CreateAH(dst, qb.QPN())
	if err != nil {
		t.Fatal(err)
	}
	if err := qa.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, Inline: []byte("hello"), AH: ah}); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, cqb, 1, 30*time.Second)[0]; got.ID != 1 || got.Status != Success || got.Len != 5 ||
		got.Source != netip.AddrPortFrom(from.Addr(), from.Port()) || !bytes.Equal(b.mr.Bytes()[:5], []byte("hello")) {
		t.Fatalf("the peer's Send: %+v", got)
	}
	if got := collect(t, cqa, 1, 30*time.Second)[0]; got.ID != 2 || got.Status != Success {
		t.Fatalf("the peer's send completion: %+v", got)
	}
}
