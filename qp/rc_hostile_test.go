package qp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
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
	return newRCServerWith(t, cfg, func(d *Device) (*RCListener, error) { return d.ListenRC("127.0.0.1:0") })
}

// newRCServerWith is newRCServer with the listener listen makes.
func newRCServerWith(t *testing.T, cfg RCConfig, listen func(*Device) (*RCListener, error)) *rcServer {
	s := &rcServer{rcSide: newRCSide(t, DeviceConfig{}), qps: make(chan *QP, 16)}
	var err error
	if s.l, err = listen(s.dev); err != nil {
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
			if err := q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{s.mr.SGE(0, 100)}}); err != nil {
				t.Errorf("the server's receive: %v", err) // not t.Fatal: this is not the test's goroutine
				r.Reject(nil)
				return
			}
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
	mustPost(t, good.q.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("still")}))
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

// floodListener listens on 127.0.0.1 with the default bounds but an
// exchange deadline of 10 minutes: what ends a silent connection's
// exchange in these tests is shedding, never its deadline.
func floodListener(d *Device) (*RCListener, error) {
	return d.listenRC("127.0.0.1:0", handshakeLimits{total: maxHandshakes, perAddr: maxHandshakesPerAddr, timeout: 10 * time.Minute})
}

// dialFrom opens a TCP connection to addr from the local address src
// (any 127.x.y.z is this host's), closed when the test ends.
func dialFrom(t *testing.T, src, addr string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 30 * time.Second}
	c, err := d.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// held reports the exchanges l has in progress: in all, and from src.
func held(l *RCListener, src string) (all, from int) {
	l.hsMu.Lock()
	defer l.hsMu.Unlock()
	return l.hs.Len(), l.hsBy[netip.MustParseAddr(src)]
}

// TestRCHandshakeFlood: silent TCP connections from many sources, more
// than the listener takes exchanges for (issue 30, item 4: 64 of them
// used to refuse every later initiator for 5 s), shed the oldest
// exchanges, never the newest: a real initiator from another source
// then connects and moves a Send, the listener holds at most its bound
// of exchanges and each source at most its own, the oldest silent
// connections are closed, and they cost a bounded number of goroutines.
func TestRCHandshakeFlood(t *testing.T) {
	srv := newRCServerWith(t, RCConfig{}, floodListener)
	addr := srv.l.Addr().String()
	before := runtime.NumGoroutine()
	var conns []*net.TCPConn
	sources := maxHandshakes/maxHandshakesPerAddr + 2
	for i := range sources {
		for range maxHandshakesPerAddr {
			conns = append(conns, dialFrom(t, fmt.Sprintf("127.0.1.%d", 1+i), addr))
		}
	}
	// The real initiator comes after all of them (the kernel queues
	// connections for accept in order).
	good := newRCSide(t, DeviceConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := good.q.Connect(ctx, addr, RCConfig{}); err != nil {
		t.Fatalf("a real initiator after %d silent connections: %v", len(conns), err)
	}
	gq := srv.next(t)
	if err := good.q.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("through")}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]WorkCompletion, 16)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		n := srv.cq.Poll(wcs)
		if n > 0 && wcs[0].QPN == gq.QPN() {
			if wcs[0].Status != Success || string(srv.buf[:wcs[0].Len]) != "through" {
				t.Fatalf("the real initiator's Send: %+v %q", wcs[0], srv.buf[:wcs[0].Len])
			}
			break
		}
		if time.Now().After(end) {
			t.Fatal("the real initiator's Send did not arrive")
		}
	}
	// Every silent connection was accepted and either holds an exchange
	// or was shed; the real initiator's exchange shed one more and ended.
	shed := len(conns) + 1 - maxHandshakes
	eventually(t, "the oldest shed", func() bool { return srv.dev.Stats().RCHandshakesShed.Load() == uint64(shed) })
	all, _ := held(srv.l, "127.0.1.1")
	if all != maxHandshakes-1 {
		t.Fatalf("%d exchanges in progress, want %d", all, maxHandshakes-1)
	}
	for i := range sources {
		if _, from := held(srv.l, fmt.Sprintf("127.0.1.%d", 1+i)); from > maxHandshakesPerAddr {
			t.Fatalf("source %d holds %d exchanges", i, from)
		}
	}
	for i, c := range conns[:shed] { // the oldest: closed by the listener
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("silent connection %d (of the %d oldest) not closed: %d bytes, %v", i, shed, n, err)
		}
	}
	// Shed exchanges leave no goroutine behind.
	eventually(t, "goroutines bounded", func() bool { return runtime.NumGoroutine()-before <= maxHandshakes+16 })
}

// TestRCHandshakesPerSource: one source's silent connections never hold
// more than maxHandshakesPerAddr exchanges: each one past it sheds that
// source's oldest (issue 30, item 4), while another source's are kept.
func TestRCHandshakesPerSource(t *testing.T) {
	srv := newRCServerWith(t, RCConfig{}, floodListener)
	addr := srv.l.Addr().String()
	other := dialFrom(t, "127.0.2.2", addr)
	eventually(t, "the other source's exchange", func() bool { _, n := held(srv.l, "127.0.2.2"); return n == 1 })
	var conns []*net.TCPConn
	for range 3 * maxHandshakesPerAddr {
		conns = append(conns, dialFrom(t, "127.0.2.1", addr))
	}
	shed := len(conns) - maxHandshakesPerAddr
	eventually(t, "the source's oldest shed", func() bool {
		all, from := held(srv.l, "127.0.2.1")
		return srv.dev.Stats().RCHandshakesShed.Load() == uint64(shed) && from == maxHandshakesPerAddr && all == from+1
	})
	// The exchanges kept are the source's newest.
	srv.l.hsMu.Lock()
	kept := map[netip.AddrPort]bool{}
	for e := srv.l.hs.Front(); e != nil; e = e.Next() {
		kept[e.Value.(*handshake).c.RemoteAddr().(*net.TCPAddr).AddrPort()] = true
	}
	srv.l.hsMu.Unlock()
	for i, c := range conns {
		if want := i >= shed; kept[c.LocalAddr().(*net.TCPAddr).AddrPort()] != want {
			t.Fatalf("connection %d of %d: kept %v, want %v", i, len(conns), !want, want)
		}
	}
	if !kept[other.LocalAddr().(*net.TCPAddr).AddrPort()] {
		t.Fatal("another source's exchange was shed")
	}
	for i, c := range conns[:shed] {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("shed connection %d not closed: %d bytes, %v", i, n, err)
		}
	}
	// Close ends the exchanges in progress at once, not at their deadline.
	done := make(chan struct{})
	go func() { srv.l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the exchanges in progress")
	}
}

// TestRCShortNonMPAClientRejectedAtOnce: a plain TCP client that speaks
// first with fewer bytes than an MPA Request's header ("PING\r\n") is
// rejected at its first byte that is not MPA's, not left waiting for
// the handshake deadline (it was: EOF after 5 s, and docs/sockets.md said
// "rejected"). The listener's deadline here is an hour, so only the bytes
// can end it.
func TestRCShortNonMPAClientRejectedAtOnce(t *testing.T) {
	d := newRCSide(t, DeviceConfig{}).dev
	l, err := d.listenRC("127.0.0.1:0", handshakeLimits{total: maxHandshakes, perAddr: maxHandshakesPerAddr, timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("PING\r\n"))
	c.SetReadDeadline(time.Now().Add(time.Minute)) // only a hung test gets here
	rep, _, err := readMPAFrame(c)
	if err != nil || !rep.Reject() {
		t.Fatalf("answer to a short non-MPA client: %v", err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection stays open after the rejection")
	}
	if n := d.Stats().RCBadRequests.Load(); n != 1 {
		t.Fatalf("RCBadRequests %d", n)
	}
}

// TestRCListenerCloseSparesAccepted: a request Next returned is the
// application's: closing the listener (or shedding) while the exchange's
// goroutine still runs leaves its accepted connection alone. The
// goroutine used to take its exchange off the list only after queueing
// the request, and a Close in between closed the connection under the
// accepted QP (socketshim's nettest: "connection reset by peer" at both
// ends, one run in forty).
func TestRCListenerCloseSparesAccepted(t *testing.T) {
	release := make(chan struct{})
	testHookQueued = func() { <-release }
	defer func() { testHookQueued = nil }()
	srv, cli := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	l, err := srv.dev.ListenRC("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connected := make(chan error, 1)
	go func() { _, err := cli.q.Connect(ctx, l.Addr().String(), RCConfig{}); connected <- err }()
	r, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{srv.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Accept(srv.q, RCConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := <-connected; err != nil {
		t.Fatal(err)
	}
	// Close while the exchange's goroutine is held after queueing.
	closed := make(chan struct{})
	go func() { l.Close(); close(closed) }()
	eventually(t, "the listener's exchanges ended", func() bool {
		l.hsMu.Lock()
		defer l.hsMu.Unlock()
		return l.hsDone
	})
	close(release)
	<-closed
	if err := cli.q.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, Inline: []byte("still here")}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]WorkCompletion, 4)
	eventually(t, "the Send after the listener closed", func() bool {
		for _, w := range wcs[:srv.cq.Poll(wcs)] {
			if w.Status != Success {
				t.Fatalf("the accepted connection after Close: %v", w.Status)
			}
			if w.Opcode == WCRecv {
				return string(srv.buf[:w.Len]) == "still here"
			}
		}
		return false
	})
}
