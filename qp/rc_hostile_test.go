package qp

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// rawMPA is a hand-driven MPA initiator: the test decides every byte it
// sends, and reads what the QP answers.
type rawMPA struct {
	t    *testing.T
	c    net.Conn
	tx   udiwarp.MPAFramer
	rx   udiwarp.MPADeframer
	buf  []byte
	msn  uint32
	rmsn uint32
}

func dialRawMPA(t *testing.T, addr string, rev uint8) *rawMPA {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f := udiwarp.MPAFrameFields{CRC: true, Revision: rev}
	if rev == 2 {
		f.Enhanced = true
		f.IRDORD = udiwarp.IRDORD{PeerToPeer: true, WriteRTR: true, IRD: 4, ORD: 4}
	}
	req, _ := udiwarp.AppendMPAFrame(nil, &f)
	c.Write(req)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rep, early, err := readMPAFrame(c)
	if err != nil || !rep.Reply() || rep.Reject() {
		t.Fatalf("MPA reply: %v", err)
	}
	r := &rawMPA{t: t, c: c, tx: udiwarp.MPAFramer{CRC: true, Markers: rep.Markers()}, rx: udiwarp.MPADeframer{CRC: true}, buf: early, msn: 1, rmsn: 1}
	if rev == 2 { // the RTR: a zero-length RDMA Write
		r.send(udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite)}), nil)
	}
	return r
}

func (r *rawMPA) send(hdr, payload []byte) {
	b, err := r.tx.Append(nil, hdr, payload)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawMPA) sendMsg(payload []byte) {
	r.send(udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), MSN: r.msn}), payload)
	r.msn++
}

// terminate reads FPDUs until a Terminate and returns it.
func (r *rawMPA) terminate() udiwarp.Terminate {
	r.t.Helper()
	tmp := make([]byte, 64<<10)
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		for {
			ulpdu, n, _, err := r.rx.Next(r.buf)
			if err != nil {
				r.t.Fatalf("the QP's stream: %v", err)
			}
			if n == 0 {
				break
			}
			seg, err := udiwarp.ParseSegment(ulpdu, udiwarp.ProfileStream)
			if err != nil {
				r.t.Fatalf("the QP's FPDU: %v", err)
			}
			r.buf = r.buf[n:]
			if seg.Opcode() == udiwarp.OpTerminate {
				return seg.Terminate()
			}
		}
		k, err := r.c.Read(tmp)
		if err != nil {
			r.t.Fatalf("no Terminate before %v", err)
		}
		r.buf = append(r.buf, tmp[:k]...)
	}
}

// rcServer is a device with a listener that accepts every request onto a
// new RC QP with a receive posted, and a region to write and read.
type rcServer struct {
	*rcSide
	l      *RCListener
	region *MR
	qps    chan *QP
}

func newRCServer(t *testing.T, cfg RCConfig) *rcServer {
	s := &rcServer{rcSide: newRCSide(t, DeviceConfig{}), qps: make(chan *QP, 16)}
	var err error
	if s.l, err = s.dev.ListenRC("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.l.Close() })
	s.region, _ = s.pd.RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
	go func() {
		for {
			r, err := s.l.Next(context.Background())
			if err != nil {
				return
			}
			q, err := s.pd.CreateQP(QPAttr{Type: RC, SendCQ: s.cq, RecvCQ: s.cq})
			if err != nil {
				return
			}
			q.Modify(ModifyAttr{State: StateInit})
			q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{s.mr.SGE(0, 100)}})
			if r.Accept(q, cfg) == nil {
				s.qps <- q
			}
		}
	}()
	return s
}

func (s *rcServer) next(t *testing.T) *QP {
	select {
	case q := <-s.qps:
		return q
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
	}
	return nil
}

func TestRCBadInput(t *testing.T) {
	srv := newRCServer(t, RCConfig{IRD: 1})
	// A good connection that must keep working through all of it.
	good := newRCSide(t, DeviceConfig{})
	if _, err := good.q.Connect(context.Background(), srv.l.Addr().String(), RCConfig{}); err != nil {
		t.Fatal(err)
	}
	gq := srv.next(t)

	big := make([]byte, 64)
	for _, tc := range []struct {
		name string
		do   func(r *rawMPA)
		want udiwarp.ErrorCode
	}{
		{"corrupted CRC", func(r *rawMPA) {
			b, _ := r.tx.Append(nil, udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 1,
				RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), MSN: 1}), []byte("hello"))
			b[len(b)-1] ^= 0xff
			r.c.Write(b)
		}, udiwarp.MPACRCError},
		{"bad STag", func(r *rawMPA) {
			r.send(udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
				STag: srv.region.STag() ^ 0x55, TO: srv.region.Addr()}), big)
		}, udiwarp.DDPTaggedInvalidSTag},
		{"TO out of bounds", func(r *rawMPA) {
			r.send(udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
				STag: srv.region.STag(), TO: srv.region.Addr() + 4096 - 10}), big)
		}, udiwarp.DDPTaggedBaseBounds},
		{"Read beyond IRD", func(r *rawMPA) {
			// Two Reads of 8 MiB in one write, and the client does not read:
			// the first response cannot all leave, so the second is over
			// IRD 1.
			var b []byte
			for i := range 2 {
				h := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpReadRequest),
					QN: 1, MSN: uint32(i + 1)})
				h = udiwarp.AppendReadRequest(h, &udiwarp.ReadRequestFields{SinkSTag: 7, Size: uint32(len(srv.buf)), SourceSTag: srv.mr.STag(), SourceTO: srv.mr.Addr()})
				b, _ = r.tx.Append(b, h, nil)
			}
			r.c.Write(b)
		}, udiwarp.RDMAPCatastrophicStream},
		{"truncated FPDU (ULPDU shorter than a DDP header)", func(r *rawMPA) {
			r.send([]byte{0x41, 0x43, 0, 0, 0}, nil)
		}, truncatedCode},
		{"MSN out of order", func(r *rawMPA) {
			r.msn = 5
			r.sendMsg([]byte("x"))
		}, udiwarp.DDPUntaggedMSNRange},
		{"wrong DDP version", func(r *rawMPA) {
			r.send(udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 2, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), MSN: 1}), nil)
		}, udiwarp.DDPUntaggedInvalidVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRawMPA(t, srv.l.Addr().String(), 2)
			q := srv.next(t)
			tc.do(r)
			term := r.terminate()
			if term.Code() != tc.want {
				t.Fatalf("Terminate code %v, want %v", term.Code(), tc.want)
			}
			waitState(t, q, StateError)
			if tc.want != udiwarp.MPACRCError && tc.name != "truncated FPDU (ULPDU shorter than a DDP header)" && !term.D() {
				t.Fatal("the Terminate does not echo the DDP header")
			}
		})
	}
	// Every bad connection failed alone: the good one still works.
	good.q.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("still")})
	wcs := make([]WorkCompletion, 16)
	for end := time.Now().Add(5 * time.Second); ; {
		n := srv.cq.Poll(wcs) // the bad QPs' flushed receives, then the good one's message
		for _, wc := range wcs[:n] {
			if wc.QPN == gq.QPN() {
				if wc.Status != Success || wc.Len != 5 || gq.State() != StateRTS {
					t.Fatalf("the good connection: %+v, %v", wc, gq.State())
				}
				return
			}
		}
		if time.Now().After(end) {
			t.Fatal("the good connection's message did not arrive")
		}
		time.Sleep(time.Millisecond)
	}
}

// truncatedCode is what the parser reports for a 5-byte untagged ULPDU:
// the Terminate must carry exactly that.
var truncatedCode = func() udiwarp.ErrorCode {
	_, err := udiwarp.ParseSegment([]byte{0x41, 0x43, 0, 0, 0}, udiwarp.ProfileStream)
	c, _ := udiwarp.CodeOf(err)
	return c
}()

func TestRCBogusMPARequest(t *testing.T) {
	srv := newRCServer(t, RCConfig{})
	c, err := net.Dial("tcp", srv.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rep, _, err := readMPAFrame(c)
	if err != nil || !rep.Reject() {
		t.Fatalf("answer to a bogus request: %v", err)
	}
	c.Close()
	eventually(t, "the bad request counted", func() bool { return srv.dev.Stats().RCBadRequests.Load() == 1 })
	// The listener still takes good connections.
	good := newRCSide(t, DeviceConfig{})
	if _, err := good.q.Connect(context.Background(), srv.l.Addr().String(), RCConfig{}); err != nil {
		t.Fatal(err)
	}
	srv.next(t)
}

// TestRCInboundTerminate: a Terminate from the peer reaches the
// application as an asynchronous event with its decoded reason.
func TestRCInboundTerminate(t *testing.T) {
	srv := newRCServer(t, RCConfig{})
	r := dialRawMPA(t, srv.l.Addr().String(), 1)
	q := srv.next(t)
	body, _ := udiwarp.AppendTerminate(nil, &udiwarp.TerminateFields{Code: udiwarp.RDMAPAccessRights})
	r.send(udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpTerminate), QN: 2, MSN: 1}), body)
	waitState(t, q, StateError)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		select {
		case ev := <-srv.dev.Events():
			if ev.Type == AsyncRemoteError && ev.QP == q && ev.Code == udiwarp.RDMAPAccessRights {
				return
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatal("no remote-error event with the Terminate's code")
}

// TestRCHandshakeFlood opens more TCP connections than the listener
// takes MPA exchanges for, sends nothing on them, and checks that a real
// initiator still gets through once the silent ones are refused or time
// out, and that they cost a bounded number of goroutines.
func TestRCHandshakeFlood(t *testing.T) {
	srv := newRCServer(t, RCConfig{})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	before := runtime.NumGoroutine()
	for range 3 * maxHandshakes {
		c, err := net.Dial("tcp", srv.l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eventually(t, "the surplus refused", func() bool { return srv.dev.Stats().RCBadRequests.Load() >= 2*maxHandshakes })
	if g := runtime.NumGoroutine() - before; g > maxHandshakes+8 {
		t.Fatalf("%d goroutines for %d silent connections", g, len(conns))
	}
	for _, c := range conns { // the silent ones give up
		c.Close()
	}
	good := newRCSide(t, DeviceConfig{})
	if _, err := good.q.Connect(context.Background(), srv.l.Addr().String(), RCConfig{}); err != nil {
		t.Fatal(err)
	}
	srv.next(t)
}
