package qp

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
)

func nextEvent(t *testing.T, d *Device, want AsyncEventType) AsyncEvent {
	t.Helper()
	timeout := time.After(3 * time.Second)
	for {
		select {
		case e := <-d.Events():
			if e.Type == want {
				return e
			}
		case <-timeout:
			t.Fatalf("no %v event", want)
		}
	}
}

func TestLocalErrors(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	ah := a.ah(b, b.qp)
	otherPD := a.dev.AllocPD()
	otherMR, _ := otherPD.RegisterMemory(make([]byte, 100), AccessLocalWrite)
	small, _ := a.pd.RegisterMemory(make([]byte, 100), 0)

	// Faults in memory complete with an error status; the QP stays in RTS.
	for _, tc := range []struct {
		name string
		sgl  []SGE
		want Status
	}{
		{"invalid lkey", []SGE{{Addr: a.mr.Addr(), Length: 10, LKey: 0xdead00}}, LocalProtectionError},
		{"stale key", []SGE{{Addr: a.mr.Addr(), Length: 10, LKey: a.mr.LKey() ^ 0x01}}, LocalProtectionError},
		{"MR of another PD", []SGE{otherMR.SGE(0, 10)}, LocalProtectionError},
		{"length beyond the MR", []SGE{small.SGE(50, 51)}, LocalProtectionError},
		{"address below the MR", []SGE{{Addr: small.Addr() - 1, Length: 2, LKey: small.LKey()}}, LocalProtectionError},
		{"larger than a datagram", []SGE{a.mr.SGE(0, a.sock.MaxMessage()+1)}, LocalLengthError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := a.qp.PostSend(&SendWR{ID: 7, SGL: tc.sgl, AH: ah}); err != nil {
				t.Fatal(err)
			}
			wc := waitWC(t, a.cq, 1)[0] // errors complete even unsignaled
			if wc.Status != tc.want || wc.ID != 7 {
				t.Fatalf("completion %+v, want %v", wc, tc.want)
			}
			if a.qp.State() != StateRTS {
				t.Fatal("QP left RTS")
			}
		})
	}

	// Faults PostSend sees without touching memory post nothing.
	otherAH, _ := otherPD.CreateAH(b.sock.LocalAddr(), b.qp.QPN())
	for _, tc := range []struct {
		name string
		wr   SendWR
		err  error
	}{
		{"no address handle", SendWR{}, ErrInvalidWR},
		{"address handle of another PD", SendWR{AH: otherAH}, ErrInvalidWR},
		{"too many SGEs", SendWR{AH: ah, SGL: make([]SGE, 5)}, ErrInvalidWR},
		{"inline and SGL", SendWR{AH: ah, SGL: make([]SGE, 1), Inline: []byte{1}}, ErrInvalidWR},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := a.qp.PostSend(&tc.wr); !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
		})
	}
	// Posted nothing: the send queue is empty, and a WR taken and failed
	// would have completed before it left it.
	eventually(t, "a's send queue empty", func() bool { return sendQueueEmpty(a.qp) })
	noCompletion(t, a.cq)

	t.Run("receive too small", func(t *testing.T) {
		mustPost(t, b.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 4)}}))
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("longer than four"), AH: ah}))
		wc := waitWC(t, b.cq, 1)[0]
		if wc.Status != LocalLengthError || wc.ID != 1 {
			t.Fatalf("%+v", wc)
		}
	})
	t.Run("receive into memory without local write", func(t *testing.T) {
		ro, _ := b.pd.RegisterMemory(make([]byte, 64), 0) // read-only
		mustPost(t, b.qp.PostRecv(&RecvWR{ID: 2, SGL: []SGE{ro.SGE(0, 64)}}))
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("x"), AH: ah}))
		if wc := waitWC(t, b.cq, 1)[0]; wc.Status != LocalProtectionError {
			t.Fatalf("%+v", wc)
		}
	})
	t.Run("deregistered receive buffer", func(t *testing.T) {
		m, _ := b.pd.RegisterMemory(make([]byte, 64), AccessLocalWrite)
		mustPost(t, b.qp.PostRecv(&RecvWR{ID: 3, SGL: []SGE{m.SGE(0, 64)}}))
		if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
		if err := m.Deregister(); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second Deregister: %v", err)
		}
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("x"), AH: ah}))
		if wc := waitWC(t, b.cq, 1)[0]; wc.Status != LocalProtectionError {
			t.Fatalf("%+v", wc)
		}
	})
}

func TestMRKeys(t *testing.T) {
	d, _ := Open(DeviceConfig{MaxMR: 4})
	defer d.Close()
	pd := d.AllocPD()
	buf := make([]byte, 10)
	// An index's key never repeats from one registration to the next, so a
	// stale STag cannot reach the region registered after it.
	last := map[uint32]uint32{} // index -> previous STag
	keys := map[uint32]bool{}
	for range 50 {
		m, err := pd.RegisterMemory(buf, AccessLocalWrite|AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[m.STag()>>8]; ok && prev == m.STag() {
			t.Fatalf("STag %#x re-registered with the key it had last", m.STag())
		}
		last[m.STag()>>8] = m.STag()
		keys[m.STag()&0xff] = true
		m.Deregister()
	}
	if len(keys) < 10 {
		t.Fatalf("keys are not random: %d distinct in 50 registrations", len(keys))
	}
	var mrs []*MR
	for range 4 {
		m, err := pd.RegisterMemory(buf, AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		mrs = append(mrs, m)
	}
	if _, err := pd.RegisterMemory(buf, AccessLocalWrite); !errors.Is(err, ErrTooMany) {
		t.Fatalf("fifth MR of four: %v", err)
	}
	// Freeing one makes room again, under a new STag.
	old := mrs[2].STag()
	mrs[2].Deregister()
	m, err := pd.RegisterMemory(buf, AccessLocalWrite)
	if err != nil || m.STag() == old {
		t.Fatalf("re-registration: %v, STag %#x (old %#x)", err, m.STag(), old)
	}
	if _, err := pd.RegisterMemory(nil, AccessLocalWrite); !errors.Is(err, ErrInvalidAttr) {
		t.Fatal("empty buffer registered")
	}
	if _, err := pd.RegisterMemory(buf, AccessRemoteWrite); !errors.Is(err, ErrInvalidAttr) {
		t.Fatal("remote write without local write registered")
	}
	if s := (AccessLocalWrite | AccessRemoteRead).String(); s != "local-write|remote-read" {
		t.Fatal(s)
	}
}

func TestStateMachine(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	q, err := n.pd.CreateQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq})
	if err != nil {
		t.Fatal(err)
	}
	ah := n.ah(n, n.qp)
	if err := q.PostSend(&SendWR{Inline: []byte("x"), AH: ah}); !errors.Is(err, ErrQPState) {
		t.Fatalf("PostSend in RESET: %v", err)
	}
	if err := q.PostRecv(&RecvWR{}); !errors.Is(err, ErrQPState) {
		t.Fatalf("PostRecv in RESET: %v", err)
	}
	for _, bad := range []QPState{StateRTR, StateRTS} {
		if err := q.Modify(ModifyAttr{State: bad}); !errors.Is(err, ErrQPState) {
			t.Fatalf("RESET to %v: %v", bad, err)
		}
	}
	if err := q.Modify(ModifyAttr{State: StateInit}); err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(ModifyAttr{State: StateRTR}); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("RTR without a socket: %v", err)
	}
	q.Modify(ModifyAttr{State: StateInit, Socket: n.sock})
	mustPost(t, q.PostRecv(&RecvWR{ID: 42, SGL: []SGE{n.mr.SGE(0, 10)}})) // allowed in INIT
	if err := q.Modify(ModifyAttr{State: StateRTR}); err != nil {
		t.Fatal(err)
	}
	if err := q.PostSend(&SendWR{Inline: []byte("x"), AH: ah}); !errors.Is(err, ErrQPState) {
		t.Fatalf("PostSend in RTR: %v", err)
	}
	if err := q.Modify(ModifyAttr{State: StateRTS, Socket: n.sock}); !errors.Is(err, ErrQPState) {
		t.Fatalf("socket change in RTR: %v", err)
	}
	if err := q.Modify(ModifyAttr{State: StateRTS}); err != nil {
		t.Fatal(err)
	}
	// ERROR flushes the posted receive; later receives flush at once.
	if err := q.Modify(ModifyAttr{State: StateError}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, n.cq, 1)[0]; wc.ID != 42 || wc.Status != WRFlushError {
		t.Fatalf("flush: %+v", wc)
	}
	mustPost(t, q.PostRecv(&RecvWR{ID: 43}))
	if wc := waitWC(t, n.cq, 1)[0]; wc.ID != 43 || wc.Status != WRFlushError {
		t.Fatalf("post in ERROR: %+v", wc)
	}
	if err := q.Modify(ModifyAttr{State: StateReset}); err != nil {
		t.Fatal(err)
	}
	if q.State().String() != "RESET" {
		t.Fatal(q.State())
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
}

func TestCQ(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	ah := a.ah(b, b.qp)
	t.Run("overflow raises an event and stops accepting", func(t *testing.T) {
		small, _ := b.dev.CreateCQ(2)
		q := b.newQP(QPAttr{Type: UD, SendCQ: small, RecvCQ: small})
		for i := range 4 {
			mustPost(t, q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(0, 10)}}))
		}
		ah2 := a.ah(b, q)
		for range 4 {
			mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("x"), AH: ah2}))
		}
		e := nextEvent(t, b.dev, AsyncCQOverflow)
		if e.CQ != small || !small.Overflowed() {
			t.Fatal("wrong CQ")
		}
		deadline := time.Now().Add(5 * time.Second)
		for small.Dropped() != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("dropped %d; stats %v landed %d", small.Dropped(), statsSnapshot(b.dev), b.dev.Stats().RxLanded.Load())
			}
			time.Sleep(time.Millisecond)
		}
		wcs := make([]WorkCompletion, 8)
		if n := small.Poll(wcs); n != 2 || wcs[0].ID != 0 || wcs[1].ID != 1 {
			t.Fatalf("the first two completions must survive, never overwritten: %d %+v", n, wcs[:n])
		}
		if small.Dropped() != 2 {
			t.Fatalf("dropped %d", small.Dropped())
		}
		if st := b.dev.Stats(); st.CQDropped.Load() != 2 || st.Events[AsyncCQOverflow].Load() != 1 {
			t.Fatalf("device counts %d completions dropped and %d overflow events, want 2 and 1", st.CQDropped.Load(), st.Events[AsyncCQOverflow].Load())
		}
	})
	t.Run("notification: solicited only", func(t *testing.T) {
		b.cq.RequestNotify(true)
		for i := range 2 {
			mustPost(t, b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(0, 10)}}))
		}
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("plain"), AH: ah}))
		waitWC(t, b.cq, 1)
		select {
		case <-b.cq.C():
			t.Fatal("notified for an unsolicited completion")
		case <-time.After(30 * time.Millisecond):
		}
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("urgent"), Flags: FlagSolicited, AH: ah}))
		select {
		case <-b.cq.C():
		case <-time.After(3 * time.Second):
			t.Fatal("no notification for a solicited completion")
		}
		if wc := waitWC(t, b.cq, 1)[0]; !wc.Solicited {
			t.Fatalf("%+v", wc)
		}
	})
	t.Run("Wait honours its context", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := b.cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
	})
	if _, err := b.dev.CreateCQ(0); !errors.Is(err, ErrInvalidAttr) {
		t.Fatal("CQ of depth 0")
	}
}

func TestSRQ(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	srq, err := b.pd.CreateSRQ(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := b.dev.CreateCQ(256)
	flooded := b.newQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, SRQ: srq, SRQLimit: 8})
	quietQP := b.newQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, SRQ: srq, SRQLimit: 8})
	if err := flooded.PostRecv(&RecvWR{}); !errors.Is(err, ErrInvalidWR) {
		t.Fatal("PostRecv on a QP with an SRQ")
	}
	for i := range 40 {
		mustPost(t, srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*100, 100)}}))
	}
	if err := srq.Arm(30); err != nil {
		t.Fatal(err)
	}
	// 20 messages to one QP: only 8 get SRQ receives, the rest are dropped,
	// counted, and reported once.
	ahF := a.ah(b, flooded)
	for range 20 {
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("flood"), AH: ahF}))
	}
	e := nextEvent(t, b.dev, AsyncSRQOverdraft)
	if e.QP != flooded {
		t.Fatal("overdraft event for the wrong QP")
	}
	eventually(t, "12 overdraft drops", func() bool { return b.dev.Stats().RxSRQOverdraft.Load() == 12 })
	// The watermark (30) was crossed once: 40 - 8 = 32 left, not yet.
	select {
	case e := <-b.dev.Events():
		t.Fatalf("unexpected event %v", e)
	default:
	}
	// The other QP still gets receives.
	ahQ := a.ah(b, quietQP)
	for range 3 {
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("quiet"), AH: ahQ}))
	}
	if e := nextEvent(t, b.dev, AsyncSRQLimit); e.SRQ != srq {
		t.Fatal("limit event for the wrong SRQ")
	}
	got := waitWC(t, cq, 11)
	nq := 0
	for _, wc := range got {
		if wc.QPN == quietQP.QPN() {
			nq++
		}
	}
	if nq != 3 || srq.Len() != 29 {
		t.Fatalf("quiet QP got %d, SRQ holds %d", nq, srq.Len())
	}
	// Polling released the flooded QP's 8 receives: it can receive again.
	mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("again"), AH: ahF}))
	if wc := waitWC(t, cq, 1)[0]; wc.QPN != flooded.QPN() || wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	// The watermark fires once per arming.
	for range 5 {
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("more"), AH: ahQ}))
	}
	waitWC(t, cq, 5)
	select {
	case e := <-b.dev.Events():
		if e.Type == AsyncSRQLimit {
			t.Fatal("the watermark fired twice for one arming")
		}
	case <-time.After(20 * time.Millisecond):
	}
}

func TestErrorMessages(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	cq, _ := b.dev.CreateCQ(16)
	reporter := b.newQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, ReportErrors: true})
	ah := a.ah(b, reporter)
	// At least 24 bytes: the 46-byte error message is no larger than the
	// datagram that draws it (docs/wire.md §6.2).
	mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("nobody listens to this message"), AH: ah}))
	e := nextEvent(t, a.dev, AsyncRemoteError)
	if e.QP != a.qp || e.Code != udiwarp.DDPUntaggedNoBuffer || e.MSN != 1 || e.SourceQPN != reporter.QPN() || e.Source != b.sock.LocalAddr() {
		t.Fatalf("error event %v %+v", e, e)
	}
	if a.qp.State() != StateRTS {
		t.Fatal("an error message moved the QP")
	}
	// Without ReportErrors the source hears nothing.
	mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte("silent"), AH: a.ah(b, b.qp)}))
	select {
	case e := <-a.dev.Events():
		t.Fatalf("unexpected %v", e)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestAddressHandles(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	for _, tc := range []struct {
		addr string
		qpn  uint32
	}{
		{"127.0.0.1:0", 1}, {"127.0.0.1:9", 0}, {"127.0.0.1:9", 1 << 24}, {"239.1.1.1:9", 5}, {"127.0.0.1:9", MulticastQPN},
	} {
		if _, err := n.pd.CreateAH(netip.MustParseAddrPort(tc.addr), tc.qpn); !errors.Is(err, ErrInvalidAttr) {
			t.Errorf("CreateAH(%s, %d): %v", tc.addr, tc.qpn, err)
		}
	}
}

func TestCloseFlushesAndStops(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	mustPost(t, n.qp.PostRecv(&RecvWR{ID: 5, SGL: []SGE{n.mr.SGE(0, 10)}}))
	if err := n.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if wc := waitWCNoWait(n.cq); wc == nil || wc.ID != 5 || wc.Status != WRFlushError {
		t.Fatalf("flush on Close: %+v", wc)
	}
	if _, err := n.dev.Bind("udp4", "127.0.0.1:0"); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := n.cq.Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}

func waitWCNoWait(cq *CQ) *WorkCompletion {
	var wc [1]WorkCompletion
	if cq.Poll(wc[:]) == 1 {
		return &wc[0]
	}
	return nil
}
