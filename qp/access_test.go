package qp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/writerecord"
	"golang.org/x/sys/unix"
)

// Issue 13, items 8 and 10: one check for every remote access, remote
// invalidation only where granted, revoked stays revoked, zero-based
// regions and unpredictable STags.

// accessTarget is a node (UD QP, socket) that also has an RC QP connected
// to a peer, so that the peer can invalidate the node's STags, and an RD
// QP, so that a second node can write to it reliably.
type accessTarget struct {
	n     *node
	rc    *rcSide // the node's RC side (same device and PD)
	peer  *rcSide // the RC peer that sends Send with Invalidate
	rd    *QP
	rdCQ  *CQ
	wrCQ  *CQ // the UD Write-Record QP's records
	wr    *QP
	other *node // an RD source
	oRD   *QP
	oCQ   *CQ
}

func newAccessTarget(t *testing.T) *accessTarget {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	a := &accessTarget{n: n}
	a.rc = &rcSide{dev: n.dev, pd: n.pd, buf: n.buf, mr: n.mr, cq: n.cq}
	a.rc.q = a.rc.newQP(t)
	a.peer = newRCSide(t, DeviceConfig{})
	rcConnect(t, a.peer, a.rc, RCConfig{}, RCConfig{})
	var err error
	if a.wrCQ, err = n.dev.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	a.wr = n.newQP(QPAttr{Type: UD, SendCQ: a.wrCQ, RecvCQ: a.wrCQ})
	a.rd, a.rdCQ = rdQPOn(t, n, RDConfig{})
	a.other = newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	a.oRD, a.oCQ = rdQPOn(t, a.other, RDConfig{})
	return a
}

// invalidate has the RC peer send a Send with Invalidate naming stag and
// returns the target's receive completion.
func (a *accessTarget) invalidate(t *testing.T, stag uint32) {
	t.Helper()
	if err := a.rc.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{a.n.mr.SGE(0, 16)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.peer.q.PostSend(&SendWR{ID: 1, Opcode: OpSendInvalidate, Flags: FlagSignaled, Inline: []byte("inv"), InvalidateSTag: stag}); err != nil {
		t.Fatal(err)
	}
}

// udWriteRecord sends a one-segment Write-Record to the UD QP and waits
// until the target has counted it (placed or refused) and handled it: a
// record it made is then in the CQ.
func (a *accessTarget) udWriteRecord(t *testing.T, r *rawWR, stag uint32, to uint64, msn uint32, payload []byte) {
	t.Helper()
	st := a.n.dev.Stats()
	count := func() uint64 {
		return st.RxWRPlaced.Load() + st.RxBadSTag.Load() + st.RxAccess.Load() + st.RxBounds.Load() + st.RxWRStale.Load()
	}
	before := count()
	r.send(stag, to, msn, payload, 0, len(payload))
	eventually(t, "the Write-Record counted", func() bool { return count() > before })
	rxSettled(a.n.sock)
}

// TestWriteRecordRevokedSTag: an STag a peer invalidated takes no UD or
// RD Write-Record (nothing placed, no record), no RDMA Write, no Read, and
// stays revoked until the memory is registered again.
func TestWriteRecordRevokedSTag(t *testing.T) {
	a := newAccessTarget(t)
	buf := make([]byte, 4096)
	region, err := a.n.pd.RegisterMemory(buf, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead|AccessRemoteInvalidate)
	if err != nil {
		t.Fatal(err)
	}
	raw := newRawWR(t, a.n, a.wr)
	// It works before the invalidation.
	a.udWriteRecord(t, raw, region.STag(), region.Addr(), 1, []byte("before"))
	if wc := waitWC(t, a.wrCQ, 1)[0]; wc.Opcode != WCWriteRecord || wc.Status != Success || !bytes.Equal(buf[:6], []byte("before")) {
		t.Fatalf("before: %+v, %q", wc, buf[:6])
	}
	a.invalidate(t, region.STag())
	if wc := waitWC(t, a.n.cq, 1)[0]; wc.Status != Success || wc.Invalidated != region.STag() {
		t.Fatalf("Send with Invalidate: %+v", wc)
	}
	st := a.n.dev.Stats()
	refused := st.RxAccess.Load()
	// UD Write-Record.
	a.udWriteRecord(t, raw, region.STag(), region.Addr()+100, 2, []byte("ud-after"))
	// RD Write-Record and RD Write.
	ah := a.other.ah(a.n, a.rd)
	if err := a.oRD.PostSend(&SendWR{ID: 2, Opcode: OpWriteRecord, Flags: FlagSignaled, Inline: []byte("rd-after"), AH: ah,
		RemoteSTag: region.STag(), RemoteTO: region.Addr() + 200}); err != nil {
		t.Fatal(err)
	}
	collect(t, a.oCQ, 1, 5*time.Second) // its status is item 5's; what matters is what the target did
	if err := a.oRD.PostSend(&SendWR{ID: 3, Opcode: OpWrite, Flags: FlagSignaled, Inline: []byte("write"), AH: ah,
		RemoteSTag: region.STag(), RemoteTO: region.Addr() + 300}); err != nil {
		t.Fatal(err)
	}
	if wc := collect(t, a.oCQ, 1, 5*time.Second)[0]; wc.Status == Success {
		t.Fatalf("RD Write to a revoked STag: %+v", wc)
	}
	sink, _ := a.other.pd.RegisterMemory(make([]byte, 64), AccessLocalWrite|AccessRemoteWrite)
	if err := a.oRD.PostSend(&SendWR{ID: 4, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(0, 16)}, AH: ah,
		RemoteSTag: region.STag(), RemoteTO: region.Addr()}); err != nil {
		t.Fatal(err)
	}
	if wc := collect(t, a.oCQ, 1, 5*time.Second)[0]; wc.Status == Success {
		t.Fatalf("RD Read of a revoked STag: %+v", wc)
	}
	if !bytes.Equal(buf[6:], make([]byte, len(buf)-6)) {
		t.Fatalf("a revoked region was written: %q", bytes.TrimRight(buf, "\x00"))
	}
	noCompletion(t, a.wrCQ) // udWriteRecord waited for the refusal
	noCompletion(t, a.rdCQ) // the target answered all three RD requests: it handled them
	if got := st.RxAccess.Load() - refused; got < 2 {
		t.Fatalf("%d Write-Records refused for access, want 2", got)
	}
	// Revoked stays revoked: again, much later in MSN terms.
	a.udWriteRecord(t, raw, region.STag(), region.Addr()+400, 1000, []byte("again"))
	noCompletion(t, a.wrCQ)
	if !bytes.Equal(buf[6:], make([]byte, len(buf)-6)) {
		t.Fatal("a revoked region was written")
	}
	// Registered again, the memory takes writes under its new STag only.
	if err := region.Deregister(); err != nil {
		t.Fatal(err)
	}
	again, err := a.n.pd.RegisterMemory(buf, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	a.udWriteRecord(t, raw, region.STag(), again.Addr()+500, 1001, []byte("old"))
	a.udWriteRecord(t, raw, again.STag(), again.Addr()+600, 1, []byte("new"))
	if wc := waitWC(t, a.wrCQ, 1)[0]; wc.STag != again.STag() || !bytes.Equal(buf[600:603], []byte("new")) || buf[500] != 0 {
		t.Fatalf("after re-registration: %+v", wc)
	}
}

// TestRemoteInvalidateNeedsAccess: a Send with Invalidate naming an STag
// registered without AccessRemoteInvalidate is refused with the RDMAP
// remote protection error "STag cannot be invalidated" (the RC stream
// ends, as every RC error does), and the STag keeps working.
func TestRemoteInvalidateNeedsAccess(t *testing.T) {
	a := newAccessTarget(t)
	buf := make([]byte, 4096)
	region, err := a.n.pd.RegisterMemory(buf, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	a.invalidate(t, region.STag())
	if ev := nextEvent(t, a.n.dev, AsyncQPFatal); ev.Code != udiwarp.RDMAPProtCannotInvalidate {
		t.Fatalf("event %+v, want code %v", ev, udiwarp.RDMAPProtCannotInvalidate)
	}
	if ev := nextEvent(t, a.peer.dev, AsyncRemoteError); ev.Code != udiwarp.RDMAPProtCannotInvalidate {
		t.Fatalf("peer's event %+v", ev)
	}
	raw := newRawWR(t, a.n, a.wr)
	a.udWriteRecord(t, raw, region.STag(), region.Addr()+10, 1, []byte("still"))
	if wc := waitWC(t, a.wrCQ, 1)[0]; wc.Status != Success || !bytes.Equal(buf[10:15], []byte("still")) {
		t.Fatalf("after a refused invalidation: %+v %q", wc, buf[10:15])
	}
}

// TestWriteRecordLandingRevoked: a message in progress whose next
// segments the socket would land in place: once the STag is revoked, the
// rest of the message is refused on the landing path like on the
// ordinary one — nothing placed, nothing recorded.
func TestWriteRecordLandingRevoked(t *testing.T) {
	const seg = 4000
	b, region, sendSegs := landingTarget(t, 1<<20, seg)
	msg := make([]byte, 12*seg)
	fill(msg, 5)
	send := func(from, to int) { sendSegs(1, msg, from, to) }
	st := b.dev.Stats()
	drive := func(what string, cond func() bool) {
		t.Helper()
		var wc [1]WorkCompletion
		for end := time.Now().Add(5 * time.Second); !cond(); {
			if b.cq.Poll(wc[:]) > 0 {
				t.Fatalf("unexpected completion %+v", wc[0])
			}
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	send(0, 3)
	drive("three segments placed", func() bool { return st.RxWRPlaced.Load() == 3 })
	region.revokeForTest()
	landed := st.RxLanded.Load()
	send(3, 12)
	drive("nine segments refused", func() bool { return st.RxAccess.Load() == 9 })
	if st.RxWRPlaced.Load() != 3 || st.RxLanded.Load() != landed {
		t.Fatalf("placed %d, landed %d more after the revocation", st.RxWRPlaced.Load()-3, st.RxLanded.Load()-landed)
	}
	if !bytes.Equal(region.Bytes()[3*seg:len(msg)], make([]byte, 9*seg)) {
		t.Fatal("bytes of a revoked region were written")
	}
}

// TestRegionsZeroBased: a region's tagged offsets and SGE addresses start
// at 0, whatever its address in the heap.
func TestRegionsZeroBased(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	region, err := n.pd.RegisterMemory(make([]byte, 8192), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if region.Addr() != 0 || region.SGE(100, 5).Addr != 100 {
		t.Fatalf("Addr %#x, SGE(100) at %#x", region.Addr(), region.SGE(100, 5).Addr)
	}
	q := n.newQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq})
	raw := newRawWR(t, n, q)
	raw.send(region.STag(), 4096, 1, []byte("at 4096"), 0, 7)
	if wc := waitWC(t, n.cq, 1)[0]; wc.Status != Success || wc.TO != 4096 || string(region.Bytes()[4096:4103]) != "at 4096" {
		t.Fatalf("%+v", wc)
	}
}

// TestSTagsUnpredictable: the index part of successive registrations'
// STags is spread over the 24-bit space, not handed out in order.
func TestSTagsUnpredictable(t *testing.T) {
	d, err := Open(DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pd := d.AllocPD()
	var idx []uint32
	seen := map[uint32]bool{}
	for range 64 {
		m, err := pd.RegisterMemory(make([]byte, 16), AccessLocalWrite|AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		if seen[m.STag()] {
			t.Fatalf("STag %#x twice", m.STag())
		}
		seen[m.STag()] = true
		idx = append(idx, m.STag()>>8)
	}
	close, high := 0, 0
	for i := 1; i < len(idx); i++ {
		if d := int64(idx[i]) - int64(idx[i-1]); d >= -16 && d <= 16 {
			close++
		}
	}
	for _, i := range idx {
		if i >= 1<<16 {
			high++
		}
	}
	// Random indices: two successive ones within 16 of each other with
	// probability ~2^-19 each; at least one in 2^8 falls below 2^16.
	if close > 2 || high < 48 {
		t.Fatalf("STag indices %x: %d successive pairs close together, %d of 64 above 2^16", idx, close, high)
	}
}

// TestSpoofedWriteRecordGuesses: an off-path sender that forges a
// legitimate peer's address and guesses STags (the low indices, every
// key) and heap-address tagged offsets places nothing, even with the true
// STag.
func TestSpoofedWriteRecordGuesses(t *testing.T) {
	sp := spoof.NewT(t)
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	buf := make([]byte, 1<<20)
	region, err := n.pd.RegisterMemory(buf, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	heap := uint64(uintptr(unsafePointer(buf)))
	q := n.newQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq})
	src := netip.MustParseAddrPort("127.9.8.7:4791")
	dst := n.sock.LocalAddr()
	st := n.dev.Stats()
	sent := st.RxDatagrams.Load()
	msn := uint32(0)
	payload := []byte("pwned")
	shot := func(stag uint32, to uint64) {
		msn++
		b := udiwarp.AppendWriteRecord(nil, &udiwarp.WriteRecordFields{Last: true, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
			STag: stag, TO: to, MSN: msn, MessageLength: uint32(len(payload)), DstQPN: q.QPN(), SrcQPN: 1})
		if err := sp.Send(src, dst, udiwarp.SealDatagram(append(b, payload...), 0)); err != nil {
			t.Fatal(err)
		}
		sent++
		if sent%64 == 0 { // paced: the socket buffer drops nothing
			eventually(t, "the spoofed datagrams read", func() bool { return st.RxDatagrams.Load() >= sent })
		}
	}
	// Blind: the first STag indices with every key, at the region's heap
	// address and at offset 0.
	for i := uint32(1); i <= 4; i++ {
		for k := uint32(0); k < 256; k++ {
			shot(i<<8|k, heap)
			shot(i<<8|k, heap+4096)
		}
	}
	// With the true STag (leaked): heap addresses near the buffer's.
	for k := uint64(0); k < 64; k++ {
		shot(region.STag(), heap+k*4096)
		shot(region.STag(), heap-k*4096-4096)
	}
	quietUntil(t, n.cq, n.sock, "the spoofed datagrams read", func() bool { return st.RxDatagrams.Load() >= sent })
	if st.RxWRPlaced.Load() != 0 || bytes.Contains(buf, payload) {
		t.Fatalf("%d spoofed segments placed", st.RxWRPlaced.Load())
	}
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func (m *MR) revokeForTest() { m.Invalidate() }

// TestRCReadInvalidatedSource: a Read Response is checked as it is sent,
// not only when the Read Request arrives: a source region the owner
// invalidates while the response is still going out (the requester, busy
// polled, reads nothing meanwhile, so TCP holds the rest back) gives the
// peer no more bytes: the stream ends with a Terminate (access rights)
// and the Read fails.
func TestRCReadInvalidatedSource(t *testing.T) {
	const size = 32 << 20 // more than loopback TCP buffers hold
	a, b := newRCSide(t, DeviceConfig{Poll: PollBusy}), newRCSide(t, DeviceConfig{})
	rcConnect(t, a, b, RCConfig{}, RCConfig{})
	src, err := b.pd.RegisterMemory(make([]byte, size), AccessLocalWrite|AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := a.pd.RegisterMemory(make([]byte, size), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.q.PostSend(&SendWR{ID: 1, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(0, size)}, RemoteSTag: src.STag(), RemoteTO: src.Addr()}); err != nil {
		t.Fatal(err)
	}
	// a is busy polled and nobody polls it until the source is
	// invalidated, so it reads nothing: b's response fills the TCP buffers
	// and stalls with most of it unsent, whatever the machine's speed.
	// (Polling a here, as this test first did, let a drain the whole
	// response on a loaded machine before the invalidation.)
	// The state to wait for: a's TCP window, which a advertises to b, is
	// closed (tcpi_snd_wnd 0 on b's socket), so b holds the rest back.
	st := b.dev.Stats()
	c := b.q.rc.Load()
	raw, err := c.tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's TCP window closed to b's response", func() bool {
		var info *unix.TCPInfo
		var ierr error
		if err := raw.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
			t.Fatal(err)
		}
		if ierr != nil {
			t.Fatal(ierr)
		}
		return st.TxBytes.Load() > 0 && info.Snd_wnd == 0
	})
	if st.TxBytes.Load() >= size {
		t.Skip("TCP took the whole response before the invalidation")
	}
	src.Invalidate()
	wc := collect(t, a.cq, 1, 10*time.Second)[0]
	if wc.ID != 1 || wc.Status == Success {
		t.Fatalf("Read of an invalidated source: %+v", wc)
	}
	if ev := nextEvent(t, a.dev, AsyncRemoteError); ev.Code != udiwarp.RDMAPAccessRights {
		t.Fatalf("requester's event %+v", ev)
	}
}

// TestRDReadInvalidatedSource: on RD, a Read Response segment is checked
// as it is sent: once the owner invalidates the source, the rest of the
// response goes out empty and the requester completes the Read with
// RemoteAccessError, never Success; a later Read is refused outright.
// The responder sends two small segments per round trip, its datagrams
// delayed, so the Read is in flight when the source is invalidated.
func TestRDReadInvalidatedSource(t *testing.T) {
	const size = 64 << 10
	rd := RDConfig{Segment: 1024}
	rd.Window = 2
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{Impair: &Impairment{Delay: 20 * time.Millisecond}}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{})
	qb, _ := rdQPOn(t, b, rd)
	src, err := b.pd.RegisterMemory(bytes.Repeat([]byte{7}, size), AccessLocalWrite|AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := a.pd.RegisterMemory(make([]byte, size), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	ah := a.ah(b, qb)
	if err := qa.PostSend(&SendWR{ID: 1, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(0, size)}, AH: ah,
		RemoteSTag: src.STag(), RemoteTO: src.Addr()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Read served", func() bool { return b.dev.Stats().RDReadsServed.Load() == 1 })
	src.Invalidate()
	if wc := collect(t, cqa, 1, 10*time.Second)[0]; wc.ID != 1 || wc.Status != RemoteAccessError {
		t.Fatalf("Read of a source invalidated under it: %+v", wc)
	}
	if bytes.Count(sink.Bytes(), []byte{7}) == size {
		t.Fatal("the whole source arrived after the invalidation")
	}
	if err := qa.PostSend(&SendWR{ID: 2, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(0, 16)}, AH: ah,
		RemoteSTag: src.STag(), RemoteTO: src.Addr()}); err != nil {
		t.Fatal(err)
	}
	if wc := collect(t, cqa, 1, 10*time.Second)[0]; wc.ID != 2 || wc.Status != RemoteAccessError {
		t.Fatalf("a later Read: %+v", wc)
	}
	if err := src.Deregister(); err != nil {
		t.Fatal(err)
	}
}

// landingTarget is a busy-polled node with a Write-Record UD QP
// (deliver-partial) and a region of size bytes, for the landing path;
// send sends segments [from, to) of msg, seg bytes each, as message msn
// from a plain UDP socket.
func landingTarget(t *testing.T, size, seg int) (b *node, region *MR, send func(msn uint32, msg []byte, from, to int)) {
	t.Helper()
	b = newNode(t, DeviceConfig{Poll: PollBusy}, "udp4", "127.0.0.1:0")
	region, err := b.pd.RegisterMemory(make([]byte, size), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, WriteRecord: writerecord.Config{Policy: writerecord.DeliverPartial}})
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return b, region, func(msn uint32, msg []byte, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := conn.WriteToUDPAddrPort(wrDatagram(q.QPN(), 77, region.STag(), region.Addr(), msn, msg, i*seg, seg, false), b.sock.LocalAddr()); err != nil {
				t.Fatal(err)
			}
		}
	}
}
