package qp

import (
	"bytes"
	"testing"
	"time"
)

// TestRCSRQLimitReleased: an RC QP on an SRQ gives back each SRQ receive
// it holds when its completion is polled, as UD and RD do (completeRecv is
// the one home of a receive's completion). Before, RC's completions did
// not carry the QP, so its count of held receives only grew: with
// SRQLimit 2, the third Send failed with no buffer although the first two
// had been polled.
func TestRCSRQLimitReleased(t *testing.T) {
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	srq, err := b.pd.CreateSRQ(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	q, err := b.pd.CreateQP(QPAttr{Type: RC, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, SRQLimit: 2,
		Caps: QPCaps{MaxSendWR: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(ModifyAttr{State: StateInit}); err != nil {
		t.Fatal(err)
	}
	b.q = q
	rcConnect(t, a, b, RCConfig{}, RCConfig{})
	const n = 6
	for i := 0; i < n; i++ {
		if err := srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		fill(a.buf[i*64:i*64+40], i)
		if err := a.q.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(i*64, 40)}}); err != nil {
			t.Fatal(err)
		}
		if wc := collect(t, a.cq, 1, 10*time.Second)[0]; wc.Status != Success {
			t.Fatalf("send %d: %+v", i, wc)
		}
		wc := collect(t, b.cq, 1, 10*time.Second)[0]
		if wc.ID != uint64(i) || wc.Status != Success || wc.Len != 40 {
			t.Fatalf("receive %d: %+v", i, wc)
		}
		if !bytes.Equal(b.buf[i*64:i*64+40], a.buf[i*64:i*64+40]) {
			t.Fatalf("message %d differs", i)
		}
	}
	if got := q.srqHeld.Load(); got != 0 {
		t.Fatalf("SRQ receives held after all were polled: %d", got)
	}
}

// sglPrefix is the first n bytes of sgl.
func sglPrefix(sgl []SGE, n int) []SGE {
	var out []SGE
	for _, g := range sgl {
		if n == 0 {
			break
		}
		k := min(int(g.Length), n)
		out = append(out, SGE{LKey: g.LKey, Addr: g.Addr, Length: uint32(k)})
		n -= k
	}
	return out
}

// TestSGLSliceBoundaries sends messages gathered from several SGEs into
// receives of several other SGEs, at every size around each boundary of
// both SGLs, over UD, RD and RC: the one SGL slicer (sglSlice) serves UD's
// and RD's scatter, RD's gather, and RC's gather and its scatter at an
// offset (RC splits the larger messages into several FPDUs). A message one
// byte longer than the receive completes it with LocalLengthError (UD, RD).
func TestSGLSliceBoundaries(t *testing.T) {
	sendLens := []int{2, 9, 1989, 4001} // 6001 in all: one byte more than a receive
	recvLens := []int{3, 5, 2992, 3000} // 6000 in all: 4 SGEs, the default cap
	var sizes []int
	for _, lens := range [][]int{sendLens, recvLens} {
		at := 0
		for _, l := range lens {
			at += l
			sizes = append(sizes, at-1, at, at+1)
		}
	}
	sizes = append([]int{0, 1}, sizes...)
	type side struct {
		mr  *MR
		buf []byte
		cq  *CQ
	}
	run := func(t *testing.T, src, dst side, post func(*RecvWR), send func(*SendWR), long bool) {
		for _, n := range sizes {
			if n > 6001 || n > 6000 && !long {
				continue
			}
			var ssgl, rsgl []SGE
			at := 0
			for i, l := range sendLens { // spread out, with gaps
				ssgl = append(ssgl, src.mr.SGE(at+i*100, l))
				at += l + i*100
			}
			at = 0
			for i, l := range recvLens {
				rsgl = append(rsgl, dst.mr.SGE(200000+at+i*77, l))
				at += l + i*77
			}
			clear(dst.buf[200000:220000])
			msg := make([]byte, n)
			fill(msg, n)
			off := 0
			for _, g := range sglPrefix(ssgl, n) {
				off += copy(src.buf[g.Addr-src.mr.Addr():][:g.Length], msg[off:])
			}
			post(&RecvWR{ID: uint64(n), SGL: rsgl})
			send(&SendWR{ID: uint64(n), SGL: sglPrefix(ssgl, n)})
			wc := collect(t, dst.cq, 1, 10*time.Second)[0]
			if n > 6000 {
				if wc.Status != LocalLengthError {
					t.Fatalf("size %d: %+v, want LocalLengthError", n, wc)
				}
				continue
			}
			if wc.ID != uint64(n) || wc.Status != Success || int(wc.Len) != n {
				t.Fatalf("size %d: %+v", n, wc)
			}
			var got []byte
			for _, g := range rsgl {
				got = append(got, dst.buf[g.Addr-dst.mr.Addr():][:g.Length]...)
			}
			if !bytes.Equal(got[:n], msg) {
				t.Fatalf("size %d: the bytes differ", n)
			}
			last := rsgl[len(rsgl)-1]
			end := last.Addr + uint64(last.Length) - dst.mr.Addr()
			// Past Len the receive's bytes are undefined (a landed datagram
			// leaves its CRC trailer there); outside the SGEs nothing moves.
			if bytes.ContainsFunc(dst.buf[end:220000], func(r rune) bool { return r != 0 }) {
				t.Fatalf("size %d: bytes written past the receive", n)
			}
		}
	}
	t.Run("UD", func(t *testing.T) {
		a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
		b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
		ah := a.ah(b, b.qp)
		run(t, side{a.mr, a.buf, a.cq}, side{b.mr, b.buf, b.cq},
			func(w *RecvWR) {
				if err := b.qp.PostRecv(w); err != nil {
					t.Fatal(err)
				}
			},
			func(w *SendWR) {
				w.AH = ah
				if err := a.qp.PostSend(w); err != nil {
					t.Fatal(err)
				}
			}, true)
	})
	t.Run("RD", func(t *testing.T) {
		p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
		run(t, side{p.a.mr, p.a.buf, p.cqa}, side{p.b.mr, p.b.buf, p.cqb},
			func(w *RecvWR) {
				if err := p.qb.PostRecv(w); err != nil {
					t.Fatal(err)
				}
			},
			func(w *SendWR) {
				w.AH = p.ahAB
				if err := p.qa.PostSend(w); err != nil {
					t.Fatal(err)
				}
			}, true)
	})
	t.Run("RC", func(t *testing.T) {
		a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
		rcConnect(t, a, b, RCConfig{Markers: true}, RCConfig{Markers: true})
		run(t, side{a.mr, a.buf, a.cq}, side{b.mr, b.buf, b.cq},
			func(w *RecvWR) {
				if err := b.q.PostRecv(w); err != nil {
					t.Fatal(err)
				}
			},
			func(w *SendWR) {
				if err := a.q.PostSend(w); err != nil {
					t.Fatal(err)
				}
			}, false)
	})
}

// waitCount waits, with a bound that only a hung test meets, for c to
// reach want.
func waitCount(t *testing.T, what string, c interface{ Load() uint64 }, want uint64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); c.Load() < want; {
		if time.Now().After(end) {
			t.Fatalf("%s: %d, want %d", what, c.Load(), want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestSendRefused: a Send to a QP that cannot take it — no receive
// posted, a receive too small, the QP not in RTR/RTS (QP.canReceive) — is
// refused and counted the same way over UD and RD (deliverSend and
// completeRecv are their one home), and the QP then takes the next Send.
func TestSendRefused(t *testing.T) {
	type path struct {
		name      string
		src, dst  *QP
		srcCQ, cq *CQ
		mr        *MR
		ah        *AH
		dev       *Device
		notReady  func(*Device) uint64
		reliable  bool
	}
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	rd := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
	for _, p := range []path{
		{name: "UD", src: a.qp, dst: b.qp, srcCQ: a.cq, cq: b.cq, mr: b.mr, ah: a.ah(b, b.qp), dev: b.dev,
			notReady: func(d *Device) uint64 { return d.Stats().RxNoRecv.Load() }},
		{name: "RD", src: rd.qa, dst: rd.qb, srcCQ: rd.cqa, cq: rd.cqb, mr: rd.b.mr, ah: rd.ahAB, dev: rd.b.dev,
			notReady: func(d *Device) uint64 { return d.Stats().RDNotReady.Load() }, reliable: true},
	} {
		t.Run(p.name, func(t *testing.T) {
			st := p.dev.Stats()
			// No receive posted.
			nr := p.notReady(p.dev)
			if err := p.src.PostSend(&SendWR{ID: 1, Inline: []byte("none"), AH: p.ah}); err != nil {
				t.Fatal(err)
			}
			waitCount(t, "not ready", fakeCounter(func() uint64 { return p.notReady(p.dev) }), nr+1)
			if p.reliable { // RD keeps it and delivers it once a receive is posted
				mustPost(t, p.dst.PostRecv(&RecvWR{ID: 10, SGL: []SGE{p.mr.SGE(0, 16)}}))
				if wc := collect(t, p.cq, 1, 10*time.Second)[0]; wc.ID != 10 || wc.Status != Success || wc.Len != 4 {
					t.Fatalf("after not ready: %+v", wc)
				}
			}
			// A receive too small.
			small := st.RxRecvTooSmall.Load()
			mustPost(t, p.dst.PostRecv(&RecvWR{ID: 11, SGL: []SGE{p.mr.SGE(0, 3), p.mr.SGE(100, 2)}}))
			if err := p.src.PostSend(&SendWR{ID: 2, Inline: []byte("sixsix"), AH: p.ah}); err != nil {
				t.Fatal(err)
			}
			if wc := collect(t, p.cq, 1, 10*time.Second)[0]; wc.ID != 11 || wc.Status != LocalLengthError {
				t.Fatalf("receive too small: %+v", wc)
			}
			if st.RxRecvTooSmall.Load() != small+1 {
				t.Fatalf("RxRecvTooSmall %d, want %d", st.RxRecvTooSmall.Load(), small+1)
			}
			// A receive that fits, across both SGEs.
			mustPost(t, p.dst.PostRecv(&RecvWR{ID: 12, SGL: []SGE{p.mr.SGE(0, 3), p.mr.SGE(100, 2)}}))
			if err := p.src.PostSend(&SendWR{ID: 3, Inline: []byte("fiver"), AH: p.ah}); err != nil {
				t.Fatal(err)
			}
			if wc := collect(t, p.cq, 1, 10*time.Second)[0]; wc.ID != 12 || wc.Status != Success || wc.Len != 5 ||
				string(p.mr.Bytes()[:3])+string(p.mr.Bytes()[100:102]) != "fiver" {
				t.Fatalf("fitting receive: %+v", wc)
			}
			// The QP in Error: nothing it receives is taken.
			qs := st.RxQPState.Load()
			if err := p.dst.Modify(ModifyAttr{State: StateError}); err != nil {
				t.Fatal(err)
			}
			if err := p.src.PostSend(&SendWR{ID: 4, Inline: []byte("late"), AH: p.ah}); err != nil {
				t.Fatal(err)
			}
			waitCount(t, "RxQPState", fakeCounter(st.RxQPState.Load), qs+1)
		})
	}
}

type fakeCounter func() uint64

func (f fakeCounter) Load() uint64 { return f() }
