package qp

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestRDLongSends: an RD Send longer than a segment is segmented and
// placed in order into one receive (udiwarp.ParseRDSegment), in
// 1,400-byte segments and in datagram-sized ones, into a receive of three
// SGEs, with and without Immediate Data; a Send longer than its receive
// completes the receive with LocalLengthError and its WR with an error,
// and the next Send is placed as if nothing had happened.
func TestRDLongSends(t *testing.T) {
	for _, seg := range []int{1400, 0} {
		t.Run(fmt.Sprintf("segment=%d", seg), func(t *testing.T) {
			p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{Segment: seg})
			sink, err := p.b.pd.RegisterMemory(make([]byte, 3<<20), AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			src, err := p.a.pd.RegisterMemory(make([]byte, 3<<20), AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			fill(src.Bytes(), 3)
			sizes := []int{0, 1, 1399, 1400, 1401, 65313, 65314, 100000, 1<<20 + 3}
			for i, n := range sizes {
				// Three SGEs, the first two ending inside segments.
				a, b := min(n, 1000), min(n, 70001)
				mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{sink.SGE(0, a), sink.SGE(1<<20, b-a), sink.SGE(2<<20, n-b)}}))
				op := OpSend
				if i%3 == 2 {
					op = OpSendImm // its Immediate Data message takes a receive of its own (RFC 7306)
					mustPost(t, p.qb.PostRecv(&RecvWR{ID: 1000 + uint64(i)}))
				}
				if err := p.qa.PostSend(&SendWR{ID: uint64(i), Opcode: op, Imm: uint64(i), Flags: FlagSignaled, SGL: []SGE{src.SGE(7, n)}, AH: p.ahAB}); err != nil {
					t.Fatal(err)
				}
				if wc := collect(t, p.cqa, 1, 30*time.Second)[0]; wc.ID != uint64(i) || wc.Status != Success {
					t.Fatalf("Send of %d: %+v", n, wc)
				}
				wc := collect(t, p.cqb, 1, 30*time.Second)[0]
				if wc.ID != uint64(i) || wc.Status != Success || wc.Len != uint32(n) {
					t.Fatalf("receive of %d: %+v", n, wc)
				}
				if op == OpSendImm {
					if wc := collect(t, p.cqb, 1, 30*time.Second)[0]; wc.ID != 1000+uint64(i) || wc.Status != Success || !wc.WithImm || wc.Imm != uint64(i) {
						t.Fatalf("the Immediate after the Send of %d: %+v", n, wc)
					}
				}
				got := append(append(append([]byte{}, sink.Bytes()[:a]...), sink.Bytes()[1<<20:1<<20+b-a]...), sink.Bytes()[2<<20:2<<20+n-b]...)
				if !bytes.Equal(got, src.Bytes()[7:7+n]) {
					t.Fatalf("Send of %d: the bytes differ", n)
				}
			}
			if seg == 1400 && p.a.dev.Stats().TxGSO.Load() == 0 {
				t.Fatal("no Send went as a train")
			}
			// Too long for its receive: both ends fail it, and the next
			// Send is whole.
			mustPost(t, p.qb.PostRecv(&RecvWR{ID: 100, SGL: []SGE{sink.SGE(0, 5000)}}))
			mustPost(t, p.qb.PostRecv(&RecvWR{ID: 101, SGL: []SGE{sink.SGE(1<<20, 5000)}}))
			mustPost(t, p.qa.PostSend(&SendWR{ID: 100, Flags: FlagSignaled, SGL: []SGE{src.SGE(0, 200000)}, AH: p.ahAB}))
			mustPost(t, p.qa.PostSend(&SendWR{ID: 101, Flags: FlagSignaled, SGL: []SGE{src.SGE(11, 4999)}, AH: p.ahAB}))
			if wc := collect(t, p.cqb, 1, 30*time.Second)[0]; wc.ID != 100 || wc.Status != LocalLengthError {
				t.Fatalf("the receive too short: %+v", wc)
			}
			if wc := collect(t, p.cqa, 1, 30*time.Second)[0]; wc.ID != 100 || wc.Status != RemoteInvalidRequestError {
				t.Fatalf("the Send too long: %+v", wc)
			}
			if wc := collect(t, p.cqb, 1, 30*time.Second)[0]; wc.ID != 101 || wc.Status != Success || wc.Len != 4999 ||
				!bytes.Equal(sink.Bytes()[1<<20:1<<20+4999], src.Bytes()[11:11+4999]) {
				t.Fatalf("the Send after: %+v", wc)
			}
			if wc := collect(t, p.cqa, 1, 30*time.Second)[0]; wc.ID != 101 || wc.Status != Success {
				t.Fatalf("the Send after: %+v", wc)
			}
		})
	}
}

// rdSendPart is one segment of a Send of several segments.
func rdSendPart(dst, src, msn, mo uint32, last bool, payload []byte) []byte {
	b := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: last, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: src, QN: udiwarp.DatagramQN(dst, udiwarp.QueueSend), MSN: msn, MO: mo})
	return append(b, payload...)
}

// TestRDLongSendsHostile: a peer that breaks a long Send's order cannot
// make the receiver place bytes where they do not belong or hold a
// receive: a segment at an offset past the start with no message begun is
// refused (its error in the acks, no receive taken); a message cut short
// by another ends its receive with RemoteAbortedError; and a receive
// part-filled when the peer's session ends completes with
// RemoteAbortedError too.
func TestRDLongSendsHostile(t *testing.T) {
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qb, cqb := rdQPOn(t, b, RDConfig{})
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 4 {
		mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*1000, 1000)}}))
	}
	const qpn = 77
	r := rawContact(t, c, b, qb, qpn)
	errAt := func(seq uint32, code reliability.Code) bool {
		return r.await(func(h *reliability.Header) bool {
			if !h.HasAck {
				return false
			}
			c, bad := h.Ack.Error(seq)
			return bad && c == code
		})
	}
	// A whole message in two segments.
	r.data(0, rdSendPart(qb.QPN(), qpn, 1, 0, false, []byte("abcd")), false, 0, 64)
	r.data(1, rdSendPart(qb.QPN(), qpn, 1, 4, true, []byte("efgh")), false, 0, 64)
	if wc := collect(t, cqb, 1, 5*time.Second)[0]; wc.ID != 0 || wc.Status != Success || wc.Len != 8 || string(b.buf[:8]) != "abcdefgh" {
		t.Fatalf("two segments: %+v %q", wc, b.buf[:8])
	}
	// A middle with no beginning.
	r.data(2, rdSendPart(qb.QPN(), qpn, 2, 5, true, []byte("zz")), false, 0, 64)
	if !errAt(2, reliability.CodeInvalidRequest) {
		t.Fatal("a segment at MO 5 with no message begun was not refused")
	}
	noCompletion(t, cqb) // refused in the acks: handled, no receive taken
	// A message cut short by another.
	r.data(3, rdSendPart(qb.QPN(), qpn, 3, 0, false, []byte("1234")), false, 0, 64)
	r.data(4, rdSendPart(qb.QPN(), qpn, 4, 0, true, []byte("whole")), false, 0, 64)
	wcs := collect(t, cqb, 2, 5*time.Second)
	if wcs[0].ID != 1 || wcs[0].Status != RemoteAbortedError || wcs[1].ID != 2 || wcs[1].Status != Success || string(b.buf[2000:2005]) != "whole" {
		t.Fatalf("cut short: %+v", wcs)
	}
	// A receive part-filled when the session ends.
	r.data(5, rdSendPart(qb.QPN(), qpn, 5, 0, false, []byte("part")), false, 0, 64)
	if !r.await(func(h *reliability.Header) bool { return h.HasAck && h.Ack.Cumulative == 6 }) {
		t.Fatal("the first segment was not acknowledged")
	}
	// Acknowledged: handled, its receive part-filled, not completed.
	noCompletion(t, cqb)
	r2 := rawContactIn(t, c, b, qb, qpn, r.epoch+1, r.mine+1) // the peer reopens: a new session
	r2.data(0, rdSendSeg(qb.QPN(), qpn, 1, []byte("new")), false, 0, 64)
	wcs = collect(t, cqb, 1, 5*time.Second)
	if wcs[0].ID != 3 || wcs[0].Status != RemoteAbortedError {
		t.Fatalf("the session's end: %+v", wcs)
	}
}
