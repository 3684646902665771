package qp

import (
	"bytes"
	"testing"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestGSOSegmentsNear4GiB counts the segments one GSO send may carry for a
// Write-Record message whose remaining length is close to 4 GiB: the
// count of segments left is computed without wrapping 32 bits, so such a
// message is batched like any other (it went one datagram per call when
// length+seg-1 wrapped).
func TestGSOSegmentsNear4GiB(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	s := n.sock
	const seg = 1000
	perSend := s.maxDatagram / (udiwarp.WriteRecordHeaderSize + seg + udiwarp.CRCSize)
	want := min(maxGSOSegments, perSend)
	for _, tc := range []struct {
		name        string
		length, off uint32
		want        int
	}{
		{"small", 10 * seg, 0, 10},
		{"one left", 10 * seg, 9*seg + 1, 1},
		{"4 GiB - 1", 0xFFFF_FFFF, 0, want},
		{"4 GiB - 1, partly sent", 0xFFFF_FFFF, 12345, want},
		{"last bytes of 4 GiB - 1", 0xFFFF_FFFF, 0xFFFF_FFFF - 2*seg + 1, 2},
		{"wraps at seg-1", 0xFFFF_FFFF - seg + 2, 0, want},
	} {
		w := &sendWQE{nsge: 1, length: tc.length, off: tc.off}
		if got := n.qp.gsoSegments(s, w, seg); got != tc.want {
			t.Errorf("%s: length %d from %d: %d segments per send, want %d", tc.name, tc.length, tc.off, got, tc.want)
		}
	}
}

// TestWriteRecordGSOOverSmallMTU: Write-Record segments larger than the
// route's MTU (9,000 bytes over a loopback set to 1,500, as over an
// Ethernet link) arrive whole. The kernel refuses a GSO send of such
// segments with EMSGSIZE, where it fragments the same datagram sent
// alone; before the fix every such message completed GeneralError and
// nothing arrived (found by experiments/ on a veth pair).
func TestWriteRecordGSOOverSmallMTU(t *testing.T) {
	ns := newNetns(t, "link set lo mtu 1500", "link set lo up")
	var a, b *node
	inNetns(t, ns, func() {
		a = newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
		b = newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	})
	const seg, size = 9000, 90000
	src := a.newQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, WriteRecordSegment: seg})
	region, err := b.pd.RegisterMemory(make([]byte, 4*size), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, Record: RecordCQ})
	ah := a.ah(b, q)
	fill(a.buf[:size], 9)
	for i := range 3 {
		if err := src.PostSend(&SendWR{ID: uint64(i), Opcode: OpWriteRecord, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, size)}, AH: ah,
			RemoteSTag: region.STag(), RemoteTO: uint64(i * size)}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.cq, 1)[0]; wc.Status != Success {
			t.Fatalf("message %d: %+v (TxErrors %d)", i, wc, a.dev.Stats().TxErrors.Load())
		}
		if wc := waitWC(t, b.cq, 1)[0]; wc.Opcode != WCWriteRecord || wc.Partial || int(wc.Len) != size {
			t.Fatalf("message %d recorded %+v", i, wc)
		}
		if !bytes.Equal(region.Bytes()[i*size:(i+1)*size], a.buf[:size]) {
			t.Fatalf("message %d differs", i)
		}
	}
	if a.sock.gsoTooBig.Load() == 0 {
		t.Fatal("no GSO send was refused: the test did not reach the case")
	}
}
