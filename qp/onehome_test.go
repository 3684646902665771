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
