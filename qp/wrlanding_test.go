package qp

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
)

// wrDatagram builds segment [mo, mo+n) of a Write-Record message from
// source QP src; corrupt flips a payload bit after sealing (bad CRC).
func wrDatagram(dst, src uint32, stag uint32, to uint64, msn uint32, msg []byte, mo, n int, corrupt bool) []byte {
	b := udiwarp.AppendWriteRecord(nil, &udiwarp.WriteRecordFields{Last: mo+n == len(msg), RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
		STag: stag, TO: to + uint64(mo), MSN: msn, MO: uint32(mo), MessageLength: uint32(len(msg)), DstQPN: dst, SrcQPN: src})
	b = udiwarp.SealDatagram(append(b, msg[mo:mo+n]...), 0)
	if corrupt {
		b[udiwarp.WriteRecordHeaderSize+1] ^= 0x10
	}
	return b
}

// TestWriteRecordDirectPlacement queues a message's segments at a
// busy-polled target before it reads any, mixed with what must not be
// placed where the next segment is predicted: another source's message,
// a segment with a bad CRC, a duplicate, a reordered pair, a datagram of
// another length, a truncated one. The target reads them in batches that
// land at the predicted offsets; every record must match the bytes, and
// the bytes where a wrong datagram landed must never be recorded valid.
func TestWriteRecordDirectPlacement(t *testing.T) {
	b := newNode(t, DeviceConfig{Poll: PollBusy}, "udp4", "127.0.0.1:0")
	region, err := b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	vm := region.TrackValidity(0)
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, Record: RecordBoth,
		WriteRecord: writerecord.Config{Policy: writerecord.DeliverPartial}})
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const seg = 4000
	msg := make([]byte, 12*seg)
	fill(msg, 3)
	other := make([]byte, 3*seg)
	fill(other, 8)
	stag := region.STag()
	to, otherTO := region.Addr(), region.Addr()+600000
	mine := func(i int) []byte { return wrDatagram(q.QPN(), 77, stag, to, 1, msg, i*seg, seg, false) }
	var dgs [][]byte
	for i := range 3 {
		dgs = append(dgs, mine(i))
	}
	dgs = append(dgs,
		wrDatagram(q.QPN(), 78, stag, otherTO, 1, other, 0, seg, false), // another source, another place
		wrDatagram(q.QPN(), 77, stag, to, 1, msg, 3*seg, seg, true),     // bad CRC where segment 3 goes
		mine(3), mine(4), mine(4), // a duplicate
		mine(6), mine(5), // reordered
		udiwarp.SealDatagram(wrDatagram(q.QPN(), 77, stag, to, 1, msg, 7*seg, seg, false)[:24], 0), // shorter than its header
		mine(7),
		wrDatagram(q.QPN(), 78, stag, otherTO, 1, other, seg, seg, false),
		mine(8), mine(9), mine(10), mine(11))
	for _, d := range dgs {
		if _, err := conn.WriteToUDPAddrPort(d, b.sock.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	wc := spinWC(t, b.cq, 1)[0]
	if wc.Status != Success || wc.Partial || wc.SourceQPN != 77 || wc.TO != to || wc.Len != uint32(len(msg)) {
		t.Fatalf("record %+v", wc)
	}
	if !bytes.Equal(region.Bytes()[:len(msg)], msg) {
		t.Fatal("message bytes differ from what was sent")
	}
	if !vm.Valid(0, uint64(len(msg))) {
		t.Fatal("validity map lacks the message")
	}
	// Source 78's message is in progress: two of three segments placed and
	// nothing of it valid yet.
	if got := vm.Snapshot(nil); len(got) != 1 || got[0] != (validitymap.Range{Start: 0, End: uint64(len(msg))}) {
		t.Fatalf("valid ranges %v", got)
	}
	if _, err := conn.WriteToUDPAddrPort(wrDatagram(q.QPN(), 78, stag, otherTO, 1, other, 2*seg, seg, false), b.sock.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	wc = spinWC(t, b.cq, 1)[0]
	if wc.Status != Success || wc.Partial || wc.SourceQPN != 78 || wc.TO != otherTO {
		t.Fatalf("record %+v", wc)
	}
	if !bytes.Equal(region.Bytes()[600000:600000+len(other)], other) || !vm.Valid(600000, uint64(len(other))) {
		t.Fatal("second message wrong")
	}
	var extra [1]WorkCompletion
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		if b.cq.Poll(extra[:]) > 0 {
			t.Fatalf("unexpected completion %+v", extra[0])
		}
	}
	st := b.dev.Stats()
	t.Logf("landed %d, placed %d, bad CRC %d, truncated %d", st.RxLanded.Load(), st.RxWRPlaced.Load(), st.RxBadCRC.Load(), st.RxTruncated.Load())
	if st.RxLanded.Load() == 0 {
		t.Fatal("no segment landed in place")
	}
	if st.RxBadCRC.Load() != 1 || st.RxTruncated.Load() != 1 {
		t.Fatal("the corrupted and the truncated datagram were not counted")
	}
}

// spinWC polls a busy-mode CQ (whose Poll drives the device) for k
// completions, for at most five seconds.
func spinWC(t testing.TB, cq *CQ, k int) []WorkCompletion {
	t.Helper()
	out := make([]WorkCompletion, k)
	n := 0
	for deadline := time.Now().Add(5 * time.Second); n < k; {
		n += cq.Poll(out[n:])
		if time.Now().After(deadline) {
			t.Fatalf("polled %d of %d completions in 5 s", n, k)
		}
	}
	return out
}
