package qp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/protect"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// sealedInner parses a captured Sealed datagram: its envelope header and
// the frame inside (clear bytes only are meaningful under AEAD).
func sealedInner(b []byte) (protect.Header, []byte, bool) {
	var h protect.Header
	if len(b) == 0 || b[0] != byte(protect.KindSealed)<<2 || h.Parse(b) != nil {
		return h, nil, false
	}
	return h, b[h.Size : len(b)-protect.TagSize], true
}

// TestProtectedAttacks plays an on-path attacker against two AEAD
// devices through real sockets: it sees every datagram of a live flow
// (an AF_PACKET tap on lo), and sends from a raw socket with any source.
// Every attack the issue names is refused by the protected link before
// the stack sees it — nothing placed, nothing delivered, nothing ended —
// counted under its reason, and the flow goes on.
func TestProtectedAttacks(t *testing.T) {
	sp := spoof.NewT(t)
	a := newNode(t, protCfg(protect.AEAD), "udp4", "127.0.0.1:0")
	b := newNode(t, protCfg(protect.AEAD), "udp4", "127.0.0.1:0")
	tap := spoof.NewTap(t, b.sock.LocalAddr().Port()) // before any traffic
	qa, cqa := rdQPOn(t, a, RDConfig{})
	qb, cqb := rdQPOn(t, b, RDConfig{})
	ahAB := a.ah(b, qb)
	region, err := b.pd.RegisterMemory(make([]byte, 1<<16), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	wq := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, WriteRecord: writerecord.Config{}, Record: RecordCQ})
	bport := b.sock.LocalAddr().Port()
	aaddr := a.sock.LocalAddr()

	// The live flow: RD Sends a→b (the contact agrees keys), then a
	// Write-Record over UD under the keys of that contact.
	send := func(id uint64, seed int) {
		t.Helper()
		fill(a.buf[:2000], seed)
		mustPost(t, qb.PostRecv(&RecvWR{ID: id, SGL: []SGE{b.mr.SGE(int(id%64)*2000, 2000)}}))
		mustPost(t, qa.PostSend(&SendWR{ID: id, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, 2000)}, AH: ahAB}))
		if wc := collect(t, cqa, 1, 10*time.Second)[0]; wc.Status != Success {
			t.Fatalf("send %d: %+v", id, wc)
		}
		if wc := collect(t, cqb, 1, 10*time.Second)[0]; wc.Status != Success || !bytes.Equal(b.buf[int(id%64)*2000:int(id%64)*2000+2000], a.buf[:2000]) {
			t.Fatalf("receive %d: %+v", id, wc)
		}
	}
	for i := range 4 {
		send(uint64(i), i)
	}
	fill(a.buf[4096:4096+512], 77)
	mustPost(t, a.qp.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(4096, 512)}, AH: a.ah(b, wq),
		RemoteSTag: region.STag(), RemoteTO: region.Addr()}))
	if wc := waitWC(t, b.cq, 1)[0]; wc.Status != Success || wc.Opcode != WCWriteRecord {
		t.Fatalf("write-record: %+v", wc)
	}

	// What the tap saw, in order: the Hello, the opener's first sealed
	// frame (with the initial block), later Data frames, the Write-Record.
	var hello, initial, data, wr []byte
	for _, want := range []struct {
		into *[]byte
		keep func([]byte) bool
	}{
		{&hello, func(p []byte) bool { return p[0] == byte(protect.KindContact)<<2 }},
		{&initial, func(p []byte) bool { h, _, ok := sealedInner(p); return ok && h.Flags&protect.FlagInitial != 0 }},
		{&data, func(p []byte) bool {
			h, f, ok := sealedInner(p)
			return ok && h.Flags&protect.FlagInitial == 0 && f[0]&3 == 3 && reliability.Type(f[0]>>2) == reliability.Data
		}},
		{&wr, func(p []byte) bool {
			_, f, ok := sealedInner(p)
			return ok && f[0]&3 == 2 && udiwarp.DDPControl(f[0]).WriteRecord()
		}},
	} {
		d, ok := tap.Next(bport, func(d spoof.Datagram) bool { return d.Src == aaddr && want.keep(d.Payload) }, 5*time.Second)
		if !ok {
			t.Fatal("the tap did not see the flow")
		}
		*want.into = d.Payload
	}
	// Under AEAD the headers travel in clear and the payload does not:
	// the attacker reads the STag, not the bytes.
	wh, wf, _ := sealedInner(wr)
	stag := udiwarp.WriteRecordHeader(wf).Tagged().STag()
	if stag != region.STag() || bytes.Contains(wr, a.buf[4096:4096+64]) || wh.ClearLen != udiwarp.WriteRecordHeaderSize {
		t.Fatalf("the captured Write-Record: STag %#x (region's %#x), clear length %d, payload in clear: %v",
			stag, region.STag(), wh.ClearLen, bytes.Contains(wr, a.buf[4096:4096+64]))
	}

	st := b.dev.Stats()
	delivered, placed, dups, peers, sessions := st.RxDelivered.Load(), st.RxWRPlaced.Load(), st.RDDuplicates.Load(), st.RDPeers.Load(), st.ProtSessions.Load()
	snapshot := append([]byte(nil), region.Bytes()[:4096]...)
	forged := netip.MustParseAddrPort("127.0.0.77:4791")
	attack := func(name string, counter func() uint64, src netip.AddrPort, payload []byte) {
		t.Helper()
		before := counter()
		if err := sp.Send(src, b.sock.LocalAddr(), payload); err != nil {
			t.Fatal(err)
		}
		eventually(t, name+" refused", func() bool { return counter() > before })
	}
	// 1. A segment captured from the live flow, replayed from its source.
	attack("replayed Data", st.ProtReplayed.Load, aaddr, data)
	// 2. Its payload changed, a fresh packet number, the trailer "fixed"
	// as one fixes a CRC32c: the tag does not verify.
	mod := append([]byte(nil), data...)
	binary.BigEndian.PutUint64(mod[8:], 1<<40)
	mod[len(mod)-protect.TagSize-1] ^= 0x55
	binary.LittleEndian.PutUint32(mod[len(mod)-4:], udiwarp.CRC32c(mod[:len(mod)-4]))
	attack("changed Data", st.ProtAuthFailed.Load, aaddr, mod)
	// ... and the frame alone, in clear with a right CRC32c.
	_, df, _ := sealedInner(data)
	attack("clear Data", st.ProtClear.Load, aaddr, udiwarp.SealDatagram(append([]byte(nil), df...), 0))
	// 3. A Write-Record with the sniffed STag from a forged source: in
	// clear, and as the captured envelope replayed from elsewhere.
	clearWR := udiwarp.AppendWriteRecord(nil, &udiwarp.WriteRecordFields{Last: true, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
		STag: stag, TO: 0, MSN: 9, MessageLength: 64, DstQPN: wq.QPN(), SrcQPN: 5})
	attack("clear Write-Record", st.ProtClear.Load, forged, udiwarp.SealDatagram(append(clearWR, bytes.Repeat([]byte{0xEE}, 64)...), 0))
	attack("Write-Record from elsewhere", st.ProtWrongSource.Load, forged, wr)
	// 4. A forged Terminate: in clear, and inside the sniffed envelope
	// header (key ID, a fresh packet number) with a made-up tag.
	attack("clear Terminate", st.ProtClear.Load, aaddr, spoofedTerminate(wq.QPN(), 1))
	term := spoofedTerminate(wq.QPN(), 1)
	env := append([]byte(nil), wr[:protect.HeaderSize]...)
	binary.BigEndian.PutUint64(env[8:], 1<<41)
	binary.BigEndian.PutUint16(env[16:], uint16(len(term)-4))
	env = append(append(env, term[:len(term)-4]...), make([]byte, protect.TagSize)...)
	attack("sealed Terminate", st.ProtAuthFailed.Load, aaddr, env)
	// 5. The handshake replayed: the Hello draws a Challenge (stateless,
	// no larger) that a drops as answering nothing new; the opener's
	// first sealed frame is a replay.
	attack("replayed opening", st.ProtReplayed.Load, aaddr, initial)
	before := st.RDChallenges.Load()
	if err := sp.Send(aaddr, b.sock.LocalAddr(), hello); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replayed Hello answered statelessly", func() bool { return st.RDChallenges.Load() > before })

	if st.RxDelivered.Load() != delivered || st.RxWRPlaced.Load() != placed || st.RDDuplicates.Load() != dups ||
		st.RDPeers.Load() != peers || st.ProtSessions.Load() != sessions || !bytes.Equal(region.Bytes()[:4096], snapshot) {
		t.Fatalf("an attack got through: delivered %d→%d, Write-Record placed %d→%d, RD duplicates %d→%d, peers %d→%d, sessions %d→%d, region changed %v",
			delivered, st.RxDelivered.Load(), placed, st.RxWRPlaced.Load(), dups, st.RDDuplicates.Load(), peers, st.RDPeers.Load(),
			sessions, st.ProtSessions.Load(), !bytes.Equal(region.Bytes()[:4096], snapshot))
	}
	if ev := len(b.dev.Events()); ev != 0 {
		t.Fatalf("%d events raised (a forged Terminate reached the QP)", ev)
	}
	// The flow goes on.
	for i := 4; i < 8; i++ {
		send(uint64(i), i)
	}
	t.Logf("b refused: %d replayed, %d failed authentication, %d clear, %d from a wrong source",
		st.ProtReplayed.Load(), st.ProtAuthFailed.Load(), st.ProtClear.Load(), st.ProtWrongSource.Load())
}
