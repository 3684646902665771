package qp

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestHostileDatagrams sends malformed datagrams at a UD QP from a plain
// UDP socket, between good messages from a real peer. Each is counted under
// its reason and dropped; none reaches a CQ; the good traffic is intact and
// the QP stays in RTS.
func TestHostileDatagrams(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	raw, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	dst := b.sock.LocalAddr()
	qpn := b.qp.QPN()
	seal := func(f []byte) []byte { return udiwarp.SealDatagram(append([]byte(nil), f...), 0) }
	send := func(dstQP uint32, op udiwarp.Opcode, payload []byte) []byte {
		h := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
			RDMAP: udiwarp.NewRDMAPControl(op), ULP: 9, QN: udiwarp.DatagramQN(dstQP, udiwarp.QueueSend), MSN: 1})
		return append(h, payload...)
	}
	good := seal(send(qpn, udiwarp.OpSend, []byte("hostile-good")))
	badCRC := append([]byte(nil), good...)
	badCRC[len(badCRC)-1] ^= 0xff
	v1 := send(qpn, udiwarp.OpSend, []byte("x"))
	v1[0] = v1[0]&^3 | 1
	rv2 := send(qpn, udiwarp.OpSend, []byte("x"))
	rv2[1] = 0x83
	tagged := udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: 2, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite), STag: b.mr.STag()})
	readReq := udiwarp.AppendReadRequest(udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 2,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpReadRequest), ULP: 9, QN: udiwarp.DatagramQN(qpn, udiwarp.QueueReadRequest), MSN: 1}),
		&udiwarp.ReadRequestFields{SinkSTag: 1, Size: 100, SourceSTag: b.mr.STag()})

	cases := []struct {
		name    string
		b       []byte
		counter *atomic.Uint64
	}{
		{"empty", []byte{}, &b.dev.stats.RxTruncated},
		{"one byte", []byte{0x42}, &b.dev.stats.RxTruncated},
		{"bad CRC", badCRC, &b.dev.stats.RxBadCRC},
		{"DDP version 1", seal(v1), &b.dev.stats.RxBadVersion},
		{"frame type 0", seal([]byte{0x40, 0x43, 0, 0, 0}), &b.dev.stats.RxBadVersion},
		{"RDMAP version 2", seal(rv2), &b.dev.stats.RxBadVersion},
		{"undersized untagged header", seal(send(qpn, udiwarp.OpSend, nil)[:12]), &b.dev.stats.RxTruncated},
		{"undersized tagged header", seal(tagged[:9]), &b.dev.stats.RxTruncated},
		{"tagged without Write-Record", seal(tagged), &b.dev.stats.RxBadOpcode},
		{"unknown opcode", seal(append(send(qpn, udiwarp.OpSend, nil)[:1], append([]byte{0x4e}, send(qpn, udiwarp.OpSend, nil)[2:]...)...)), &b.dev.stats.RxBadOpcode},
		{"Read Request on UD", seal(readReq), &b.dev.stats.RxBadOpcode},
		{"unknown QP number", seal(send(qpn+77, udiwarp.OpSend, []byte("lost"))), &b.dev.stats.RxUnknownQP},
		{"QP number of another socket", seal(send(a.qp.QPN()+1000, udiwarp.OpSend, []byte("lost"))), &b.dev.stats.RxUnknownQP},
		{"Send with no receive posted", good, &b.dev.stats.RxNoRecv},
		{"RD frame with no RD layer", seal([]byte{0x03, 1, 2, 3}), &b.dev.stats.RxRDFrames},
	}
	ah := a.ah(b, b.qp)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.counter.Load()
			if _, err := raw.WriteToUDPAddrPort(tc.b, dst); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(2 * time.Second)
			for tc.counter.Load() == before {
				if time.Now().After(deadline) {
					t.Fatalf("not counted; stats %+v", statsSnapshot(b.dev))
				}
				time.Sleep(time.Millisecond)
			}
			// Counted: once the batch that held it is done, nothing it
			// made is still to come.
			rxSettled(b.sock)
			noCompletion(t, b.cq)
			// Good traffic still flows, byte-exact.
			msg := []byte("good message after " + tc.name)
			if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(0, 200)}}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend(&SendWR{Inline: msg, AH: ah}); err != nil {
				t.Fatal(err)
			}
			rc := waitWC(t, b.cq, 1)[0]
			if rc.Status != Success || rc.ID != uint64(i) || !bytes.Equal(b.buf[:rc.Len], msg) {
				t.Fatalf("good message after hostile one: %+v %q", rc, b.buf[:rc.Len])
			}
			if b.qp.State() != StateRTS {
				t.Fatalf("QP left RTS: %v", b.qp.State())
			}
		})
	}
}

func statsSnapshot(d *Device) map[string]uint64 {
	s := d.Stats()
	return map[string]uint64{
		"rx": s.RxDatagrams.Load(), "delivered": s.RxDelivered.Load(), "truncated": s.RxTruncated.Load(),
		"toolong": s.RxTooLong.Load(), "crc": s.RxBadCRC.Load(), "version": s.RxBadVersion.Load(),
		"header": s.RxBadHeader.Load(), "opcode": s.RxBadOpcode.Load(), "unknownqp": s.RxUnknownQP.Load(),
		"norecv": s.RxNoRecv.Load(), "rd": s.RxRDFrames.Load(), "state": s.RxQPState.Load(), "landed": s.RxLanded.Load(),
	}
}

// TestFloodDoesNotStarve floods one QP of a socket with Sends it has no
// receives for, from a plain socket, while a second QP on the same socket
// receives a real peer's messages: every one of those arrives.
func TestFloodDoesNotStarve(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	cq2, _ := b.dev.CreateCQ(256)
	victim := b.newQP(QPAttr{Type: UD, SendCQ: cq2, RecvCQ: cq2})
	raw, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	defer raw.Close()
	flood := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 2, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend),
		ULP: 1, QN: udiwarp.DatagramQN(b.qp.QPN(), udiwarp.QueueSend), MSN: 1})
	flood = udiwarp.SealDatagram(append(flood, make([]byte, 512)...), 0)
	const n = 100
	for i := range n {
		mustPost(t, victim.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}))
	}
	ah := a.ah(b, victim)
	for i := range n {
		for range 20 { // bounded: 2000 flood datagrams in all
			raw.WriteToUDPAddrPort(flood, b.sock.LocalAddr())
		}
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Inline: []byte{byte(i)}, AH: ah}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Microsecond)
	}
	got := waitWC(t, cq2, n)
	for i, wc := range got {
		if wc.Status != Success || b.buf[wc.ID*64] != byte(wc.ID) {
			t.Fatalf("message %d: %+v", i, wc)
		}
	}
	if b.dev.Stats().RxNoRecv.Load() == 0 {
		t.Fatal("the flood was not counted")
	}
}
