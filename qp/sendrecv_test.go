package qp

import (
	"bytes"
	"fmt"
	"testing"
)

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed*13 + i>>8)
	}
}

func TestSendRecvAllSizes(t *testing.T) {
	for _, mode := range []PollMode{PollEvent, PollBusy} {
		t.Run(mode.String(), func(t *testing.T) {
			a := newNode(t, DeviceConfig{Poll: mode}, "udp4", "127.0.0.1:0")
			b := newNode(t, DeviceConfig{Poll: mode}, "udp4", "127.0.0.1:0")
			ah := a.ah(b, b.qp)
			max := a.sock.MaxMessage()
			sizes := []int{0, 1, 2, 3, 17, 63, 64, 1024, 1400, 1472, 4096, 8192, 32768, 65000, max}
			for i, n := range sizes {
				fill(a.buf[:n], i)
				if err := b.qp.PostRecv(&RecvWR{ID: uint64(100 + i), SGL: []SGE{b.mr.SGE(0, max)}}); err != nil {
					t.Fatal(err)
				}
				if err := a.qp.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, n)}, AH: ah}); err != nil {
					t.Fatal(err)
				}
				sc := waitWC(t, a.cq, 1)[0]
				if sc.Status != Success || sc.ID != uint64(i) || sc.Opcode != WCSend || sc.Len != uint32(n) {
					t.Fatalf("size %d: send completion %+v", n, sc)
				}
				rc := waitWC(t, b.cq, 1)[0]
				if rc.Status != Success || rc.ID != uint64(100+i) || rc.Opcode != WCRecv || rc.Len != uint32(n) {
					t.Fatalf("size %d: receive completion %+v", n, rc)
				}
				if rc.Source != a.sock.LocalAddr() || rc.SourceQPN != a.qp.QPN() || rc.QPN != b.qp.QPN() || rc.MSN != uint32(i+1) {
					t.Fatalf("size %d: source %v QP %d MSN %d, want %v QP %d MSN %d", n, rc.Source, rc.SourceQPN, rc.MSN, a.sock.LocalAddr(), a.qp.QPN(), i+1)
				}
				if !bytes.Equal(b.buf[:n], a.buf[:n]) {
					t.Fatalf("size %d: payload differs", n)
				}
			}
			if s := a.qp.State(); s != StateRTS {
				t.Fatalf("sender in %v", s)
			}
		})
	}
}

func TestGatherScatter(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	fill(a.buf[:4096], 3)
	// Gather 3 pieces of the sender's buffer, scatter into 4 pieces.
	gather := []SGE{a.mr.SGE(100, 10), a.mr.SGE(2000, 0), a.mr.SGE(3000, 500), a.mr.SGE(7, 90)}
	want := append(append(append([]byte{}, a.buf[100:110]...), a.buf[3000:3500]...), a.buf[7:97]...)
	scatter := []SGE{b.mr.SGE(0, 5), b.mr.SGE(10000, 300), b.mr.SGE(20000, 1), b.mr.SGE(30000, 1000)}
	if err := b.qp.PostRecv(&RecvWR{ID: 1, SGL: scatter}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, SGL: gather, AH: a.ah(b, b.qp)}); err != nil {
		t.Fatal(err)
	}
	rc := waitWC(t, b.cq, 1)[0]
	if rc.Status != Success || rc.Len != uint32(len(want)) {
		t.Fatalf("receive %+v", rc)
	}
	got := append(append(append(append([]byte{}, b.buf[0:5]...), b.buf[10000:10300]...), b.buf[20000:20001]...), b.buf[30000:30294]...)
	if !bytes.Equal(got, want) {
		t.Fatal("scattered bytes differ")
	}
	if b.buf[30294] != 0 {
		t.Fatal("wrote past the message")
	}
}

func TestInlineAndUnsignaled(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	ah := a.ah(b, b.qp)
	for i := range 10 {
		if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*1000, 1000)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		msg := []byte(fmt.Sprintf("inline message %d", i))
		flags := SendFlags(0)
		if i == 9 {
			flags = FlagSignaled
		}
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Flags: flags, Inline: msg, AH: ah}); err != nil {
			t.Fatal(err)
		}
		msg[0] = 'X' // inline data was copied at post time
	}
	sc := waitWC(t, a.cq, 1)
	if sc[0].ID != 9 || sc[0].Status != Success {
		t.Fatalf("only the signaled WR completes: %+v", sc)
	}
	// Nothing more: the send queue is empty, so each WR has been sent and
	// made what completion it would (the unsignaled ones, ahead of 9's,
	// would have come first).
	eventually(t, "a's send queue empty", func() bool { return sendQueueEmpty(a.qp) })
	noCompletion(t, a.cq)
	rcs := waitWC(t, b.cq, 10)
	for i, rc := range rcs {
		want := fmt.Sprintf("inline message %d", i)
		if rc.Status != Success || string(b.buf[i*1000:i*1000+int(rc.Len)]) != want {
			t.Fatalf("receive %d: %+v %q", i, rc, b.buf[i*1000:i*1000+int(rc.Len)])
		}
	}
	if err := a.qp.PostSend(&SendWR{Inline: make([]byte, 257), AH: ah}); err == nil {
		t.Fatal("inline data over MaxInline accepted")
	}
}

func TestQPsShareOneSocket(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	cq2, _ := b.dev.CreateCQ(64)
	q2 := b.newQP(QPAttr{Type: UD, SendCQ: cq2, RecvCQ: cq2})
	if q2.QPN() == b.qp.QPN() || q2.Socket() != b.qp.Socket() {
		t.Fatal("QPs should share the socket with distinct numbers")
	}
	mustPost(t, b.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 100)}}))
	mustPost(t, q2.PostRecv(&RecvWR{ID: 2, SGL: []SGE{b.mr.SGE(100, 100)}}))
	mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("to qp2"), AH: a.ah(b, q2)}))
	mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("to qp1"), AH: a.ah(b, b.qp)}))
	r1, r2 := waitWC(t, b.cq, 1)[0], waitWC(t, cq2, 1)[0]
	if r1.ID != 1 || string(b.buf[0:r1.Len]) != "to qp1" || r2.ID != 2 || string(b.buf[100:100+r2.Len]) != "to qp2" {
		t.Fatalf("misrouted: %+v %+v", r1, r2)
	}
}

func TestIPv6(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp6", "[::1]:0")
	b := newNode(t, DeviceConfig{}, "udp6", "[::1]:0")
	max := a.sock.MaxMessage()
	if max != 65527-22 {
		t.Fatalf("IPv6 MaxMessage %d", max)
	}
	fill(a.buf[:max], 5)
	mustPost(t, b.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, max)}}))
	mustPost(t, a.qp.PostSend(&SendWR{SGL: []SGE{a.mr.SGE(0, max)}, AH: a.ah(b, b.qp)}))
	rc := waitWC(t, b.cq, 1)[0]
	if rc.Status != Success || int(rc.Len) != max || !bytes.Equal(a.buf[:max], b.buf[:max]) || !rc.Source.Addr().Is6() {
		t.Fatalf("IPv6 receive %+v", rc)
	}
}

// TestNoCRC runs two devices whose applications agreed to send without
// CRC, and checks that a device that still checks drops their datagrams.
func TestNoCRC(t *testing.T) {
	a := newNode(t, DeviceConfig{NoCRC: true}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{NoCRC: true}, "udp4", "127.0.0.1:0")
	checking := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	fill(a.buf[:30000], 1)
	for i := range 20 { // enough back to back for batches that land directly
		mustPost(t, b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*30000, 30000)}}))
	}
	ah := a.ah(b, b.qp)
	for range 20 {
		mustPost(t, a.qp.PostSend(&SendWR{SGL: []SGE{a.mr.SGE(0, 30000)}, AH: ah}))
	}
	for i, wc := range waitWC(t, b.cq, 20) {
		if wc.Status != Success || wc.Len != 30000 || !bytes.Equal(b.buf[i*30000:(i+1)*30000], a.buf[:30000]) {
			t.Fatalf("%d: %+v", i, wc)
		}
	}
	mustPost(t, checking.qp.PostRecv(&RecvWR{SGL: []SGE{checking.mr.SGE(0, 100)}}))
	mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("unchecked"), AH: a.ah(checking, checking.qp)}))
	quietUntil(t, checking.cq, checking.sock, "the zero trailer counted as a CRC error", func() bool { return checking.dev.Stats().RxBadCRC.Load() == 1 })
}
