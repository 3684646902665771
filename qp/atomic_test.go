package qp

import (
	"cmp"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// reliablePair is a requester and a responder connected by a reliable QP
// type: RD (an address handle) or RC (a connection).
type reliablePair struct {
	name            string
	reqDev, respDev *Device
	reqPD, respPD   *PD
	req, resp       *QP
	reqCQ, respCQ   *CQ
	ah              *AH // RD: the requester's handle for the responder
	rc              bool
	reqBuf, respBuf []byte
	reqMR           *MR
}

func reliablePairs(t *testing.T) []func(t *testing.T) *reliablePair {
	return []func(t *testing.T) *reliablePair{
		func(t *testing.T) *reliablePair {
			p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
			return &reliablePair{name: "RD", reqDev: p.a.dev, respDev: p.b.dev, reqPD: p.a.pd, respPD: p.b.pd, req: p.qa, resp: p.qb,
				reqCQ: p.cqa, respCQ: p.cqb, ah: p.ahAB, reqBuf: p.a.buf, respBuf: p.b.buf, reqMR: p.a.mr}
		},
		func(t *testing.T) *reliablePair {
			a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
			rcConnect(t, a, b, RCConfig{}, RCConfig{})
			return &reliablePair{name: "RC", reqDev: a.dev, respDev: b.dev, reqPD: a.pd, respPD: b.pd, req: a.q, resp: b.q,
				reqCQ: a.cq, respCQ: b.cq, rc: true, reqBuf: a.buf, respBuf: b.buf, reqMR: a.mr}
		},
	}
}

// marker checks that nothing the requester sent before completed at the
// responder (marker).
func (p *reliablePair) marker(t *testing.T) {
	t.Helper()
	marker(t, p.req, p.reqCQ, p.ah, p.resp, p.respCQ)
}

func (p *reliablePair) post(t *testing.T, wr *SendWR) {
	t.Helper()
	wr.AH = p.ah
	if err := p.req.PostSend(wr); err != nil {
		t.Fatal(err)
	}
}

// word is the 64-bit word at off of an atomic region, read atomically.
func word(m *MR, off int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&m.Bytes()[off])))
}

// TestAtomicSemantics: FetchAdd and CmpSwap on RD and RC return the
// word's original value into the 8-byte SGE and change it as RFC 7306
// says; a CmpSwap that does not match changes nothing.
func TestAtomicSemantics(t *testing.T) {
	for _, mk := range reliablePairs(t) {
		p := mk(t)
		t.Run(p.name, func(t *testing.T) {
			region, err := p.respPD.RegisterMemory(make([]byte, 64), AccessLocalWrite|AccessRemoteAtomic)
			if err != nil {
				t.Fatal(err)
			}
			atomic.StoreUint64((*uint64)(unsafe.Pointer(&region.Bytes()[16])), 40)
			orig := func(i int) uint64 { return binary.NativeEndian.Uint64(p.reqBuf[i*8:]) }
			ops := []struct {
				op         SendOpcode
				cmpAdd     uint64
				swap       uint64
				want, word uint64
			}{
				{OpAtomicFetchAdd, 2, 0, 40, 42},
				{OpAtomicFetchAdd, ^uint64(0), 0, 42, 41}, // adding -1 wraps
				{OpAtomicCmpSwap, 41, 7, 41, 7},           // equal: swapped
				{OpAtomicCmpSwap, 41, 9, 7, 7},            // not equal: unchanged
				{OpAtomicFetchAdd, 1 << 63, 0, 7, 1<<63 + 7},
			}
			for i, o := range ops {
				p.post(t, &SendWR{ID: uint64(i), Opcode: o.op, Flags: FlagSignaled, SGL: []SGE{p.reqMR.SGE(i*8, 8)},
					RemoteSTag: region.STag(), RemoteTO: 16, CompareAdd: o.cmpAdd, Swap: o.swap})
				wc := collect(t, p.reqCQ, 1, 5*time.Second)[0]
				if wc.ID != uint64(i) || wc.Status != Success || wc.Opcode != o.op.wcOpcode() || wc.Len != 8 {
					t.Fatalf("op %d (%v): %+v", i, o.op, wc)
				}
				if got := orig(i); got != o.want {
					t.Fatalf("op %d (%v): original value %d, want %d", i, o.op, got, o.want)
				}
				if got := word(region, 16); got != o.word {
					t.Fatalf("op %d (%v): the word is %d, want %d", i, o.op, got, o.word)
				}
			}
			if n := p.respDev.Stats().RxAtomics.Load(); n != uint64(len(ops)) {
				t.Fatalf("the responder counted %d atomics, want %d", n, len(ops))
			}
			p.marker(t) // an atomic completes nothing at the responder
		})
	}
}

// TestAtomicRefusals: every reason to refuse an atomic — a misaligned
// word (by the address in memory, not only the offset), a region without
// remote atomic access, a word past the end, a wrong key, a region of
// another PD, an invalidated region — is refused by
// the one remote-access check with its own counter, the word is
// untouched, and the requester's WR completes with the status the reason
// maps to (RC: the Terminate's code names it too).
func TestAtomicRefusals(t *testing.T) {
	type reason struct {
		name    string
		status  Status
		code    udiwarp.ErrorCode // RC's Terminate
		counter func(*Stats) uint64
		mk      func(pd *PD) (*MR, uint32, uint64)
	}
	atomicRW := AccessLocalWrite | AccessRemoteAtomic
	reg := func(pd *PD, buf []byte, a Access) *MR {
		m, err := pd.RegisterMemory(buf, a)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	reasons := []reason{
		{"misaligned offset", RemoteInvalidRequestError, udiwarp.RDMAPOpUnspecified, func(s *Stats) uint64 { return s.RxMisaligned.Load() },
			func(pd *PD) (*MR, uint32, uint64) { m := reg(pd, make([]byte, 64), atomicRW); return m, m.STag(), 4 }},
		{"misaligned memory", RemoteInvalidRequestError, udiwarp.RDMAPOpUnspecified, func(s *Stats) uint64 { return s.RxMisaligned.Load() },
			func(pd *PD) (*MR, uint32, uint64) {
				m := reg(pd, make([]byte, 72)[1:], atomicRW) // offset 8 is address 9 of an aligned buffer
				return m, m.STag(), 8
			}},
		{"no atomic access", RemoteAccessError, udiwarp.RDMAPAccessRights, func(s *Stats) uint64 { return s.RxAccess.Load() },
			func(pd *PD) (*MR, uint32, uint64) {
				m := reg(pd, make([]byte, 64), AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
				return m, m.STag(), 0
			}},
		{"out of bounds", RemoteAccessError, udiwarp.RDMAPBaseBounds, func(s *Stats) uint64 { return s.RxBounds.Load() },
			func(pd *PD) (*MR, uint32, uint64) { m := reg(pd, make([]byte, 64), atomicRW); return m, m.STag(), 64 }},
		{"wrong key", RemoteAccessError, udiwarp.RDMAPInvalidSTag, func(s *Stats) uint64 { return s.RxBadSTag.Load() },
			func(pd *PD) (*MR, uint32, uint64) {
				m := reg(pd, make([]byte, 64), atomicRW)
				return m, m.STag() ^ 0x01, 0
			}},
		{"other PD", RemoteAccessError, udiwarp.RDMAPSTagNotAssociated, func(s *Stats) uint64 { return s.RxBadSTag.Load() },
			func(pd *PD) (*MR, uint32, uint64) {
				m := reg(pd.dev.AllocPD(), make([]byte, 64), atomicRW)
				return m, m.STag(), 0
			}},
		{"invalidated", RemoteAccessError, udiwarp.RDMAPAccessRights, func(s *Stats) uint64 { return s.RxAccess.Load() },
			func(pd *PD) (*MR, uint32, uint64) {
				m := reg(pd, make([]byte, 64), atomicRW)
				m.Invalidate()
				return m, m.STag(), 0
			}},
	}
	for _, mk := range reliablePairs(t) {
		for _, r := range reasons {
			p := mk(t) // RC: a connection per reason, as every refusal ends it
			t.Run(p.name+"/"+r.name, func(t *testing.T) {
				m, stag, to := r.mk(p.respPD)
				for i := range m.Bytes() {
					m.Bytes()[i] = 7
				}
				st := p.respDev.Stats()
				before := r.counter(st)
				p.post(t, &SendWR{ID: 1, Opcode: OpAtomicFetchAdd, Flags: FlagSignaled, SGL: []SGE{p.reqMR.SGE(0, 8)},
					RemoteSTag: stag, RemoteTO: to, CompareAdd: 1})
				wc := collect(t, p.reqCQ, 1, 5*time.Second)[0]
				if wc.ID != 1 || wc.Status != r.status || wc.Opcode != WCAtomicFetchAdd {
					t.Fatalf("the requester's completion: %+v, want %v", wc, r.status)
				}
				if got := r.counter(st) - before; got != 1 {
					t.Fatalf("the reason's counter moved by %d, want 1", got)
				}
				if st.RxAtomics.Load() != 0 {
					t.Fatal("a refused atomic was carried out")
				}
				for i, c := range m.Bytes() {
					if c != 7 {
						t.Fatalf("byte %d of the region changed", i)
					}
				}
				if p.rc {
					if ev := nextEvent(t, p.reqDev, AsyncRemoteError); ev.Code != r.code {
						t.Fatalf("the Terminate's code %v, want %v", ev.Code, r.code)
					}
				}
			})
		}
	}
}

// TestAtomicFetchAddUnderLoss: four peers, each on its own device
// dropping 5 % of what it sends (and duplicating 5 %), and a responder
// doing the same, run
// concurrent FetchAdds on one word over RD. Every add is applied exactly
// once: the original values the requesters got, sorted, chain from 0 by
// the adds to the final word (a lost update breaks the chain, a doubled
// one too), although the requests and responses were retransmitted.
func TestAtomicFetchAddUnderLoss(t *testing.T) {
	const peers, each = 4, 150
	rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond}}
	// 5 % loss, and 5 % duplicated besides: a request that arrives twice
	// must still be carried out once.
	imp := func(seed uint64) *Impairment { return &Impairment{Seed: seed, Loss: 0.05, Duplicate: 0.05} }
	b := newNode(t, DeviceConfig{Impair: imp(100)}, "udp4", "127.0.0.1:0")
	qb, _ := rdQPOn(t, b, rd)
	region, err := b.pd.RegisterMemory(make([]byte, 8), AccessLocalWrite|AccessRemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	type result struct{ orig, add uint64 }
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
		retx    atomic.Uint64
	)
	for k := range peers {
		a := newNode(t, DeviceConfig{Impair: imp(uint64(k + 1))}, "udp4", "127.0.0.1:0")
		qa, cqa := rdQPOn(t, a, rd)
		ah := a.ah(b, qb)
		wg.Add(1)
		go func() {
			defer wg.Done()
			add := func(i int) uint64 { return uint64(k*1000 + i + 1) }
			for i := range each {
				if err := qa.PostSend(&SendWR{ID: uint64(i), Opcode: OpAtomicFetchAdd, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(i*8, 8)},
					AH: ah, RemoteSTag: region.STag(), CompareAdd: add(i)}); err != nil {
					t.Error(err)
					return
				}
			}
			wcs := make([]WorkCompletion, 64)
			got := 0
			for end := time.Now().Add(30 * time.Second); got < each && time.Now().Before(end); {
				n := cqa.Poll(wcs)
				for _, wc := range wcs[:n] {
					if wc.Status != Success {
						t.Errorf("peer %d: %+v", k, wc)
						return
					}
					i := int(wc.ID)
					mu.Lock()
					results = append(results, result{binary.NativeEndian.Uint64(a.buf[i*8:]), add(i)})
					mu.Unlock()
				}
				got += n
				if n == 0 {
					time.Sleep(100 * time.Microsecond)
				}
			}
			if got < each {
				qa.rd.mu.Lock()
				qa.rd.ep.EachPeer(func(pi *reliability.PeerInfo) {
					t.Logf("peer %d: %+v", k, *pi)
				})
				qa.rd.mu.Unlock()
				t.Errorf("peer %d: %d of %d completions", k, got, each)
			}
			retx.Add(a.dev.Stats().RDRetransmits.Load())
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.SortFunc(results, func(x, y result) int { return cmp.Compare(x.orig, y.orig) })
	next := uint64(0)
	for _, r := range results {
		if r.orig != next {
			t.Fatalf("the chain of original values breaks at %d (want %d): an add was lost or applied twice", r.orig, next)
		}
		next += r.add
	}
	if w := word(region, 0); w != next {
		t.Fatalf("the word is %d, the adds sum to %d", w, next)
	}
	st := b.dev.Stats()
	if n := st.RxAtomics.Load(); n != peers*each {
		t.Fatalf("the responder carried out %d atomics, want %d", n, peers*each)
	}
	t.Logf("%d adds, %d requester retransmissions, responder: %d retransmissions, %d duplicates", peers*each, retx.Load(),
		st.RDRetransmits.Load(), st.RDDuplicates.Load())
	if retx.Load()+st.RDRetransmits.Load() == 0 || st.RDDuplicates.Load() == 0 {
		t.Fatal("nothing was retransmitted or duplicated: the test did not test")
	}
}

// TestImmediateData: Immediate Data alone, Send with Immediate and RDMA
// Write with Immediate on RD and RC. Each Immediate Data consumes a
// posted receive whose completion carries the value (WithImm, Len 0);
// Send with Immediate consumes two (the Send's, then the value's), in
// order; Write with Immediate completes its receive only with the
// Write's bytes placed; FlagSolicited marks the Immediate Data solicited.
func TestImmediateData(t *testing.T) {
	for _, mk := range reliablePairs(t) {
		p := mk(t)
		t.Run(p.name, func(t *testing.T) {
			region, err := p.respPD.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			recvMR, err := p.respPD.RegisterMemory(make([]byte, 64<<10), AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				if err := p.resp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{recvMR.SGE(i*16<<10, 16<<10)}}); err != nil {
					t.Fatal(err)
				}
			}
			const wlen = 300 << 10 // many segments on RD, many FPDUs on RC
			fill(p.reqBuf[:wlen], 5)
			p.post(t, &SendWR{ID: 1, Opcode: OpImmediate, Flags: FlagSignaled | FlagSolicited, Imm: 0x0102030405060708})
			p.post(t, &SendWR{ID: 2, Opcode: OpSendImm, Flags: FlagSignaled, Inline: []byte("hello"), Imm: 42})
			p.post(t, &SendWR{ID: 3, Opcode: OpWriteImm, Flags: FlagSignaled, SGL: []SGE{p.reqMR.SGE(0, wlen)},
				RemoteSTag: region.STag(), RemoteTO: 4096, Imm: ^uint64(0)})
			for i, wc := range collect(t, p.reqCQ, 3, 10*time.Second) {
				want := []WCOpcode{WCSend, WCSend, WCRDMAWrite}[i]
				if wc.ID != uint64(i+1) || wc.Status != Success || wc.Opcode != want {
					t.Fatalf("send completion %d: %+v", i, wc)
				}
			}
			got := collect(t, p.respCQ, 4, 10*time.Second)
			type want struct {
				imm       bool
				v         uint64
				n         uint32
				solicited bool
			}
			for i, w := range []want{{true, 0x0102030405060708, 0, true}, {false, 0, 5, false}, {true, 42, 0, false}, {true, ^uint64(0), 0, false}} {
				wc := got[i]
				if wc.ID != uint64(i) || wc.Status != Success || wc.Opcode != WCRecv || wc.WithImm != w.imm || wc.Imm != w.v || wc.Len != w.n || wc.Solicited != w.solicited {
					t.Fatalf("receive %d: %+v, want %+v", i, wc, w)
				}
				if i == 3 && !slices.Equal(region.Bytes()[4096:4096+wlen], p.reqBuf[:wlen]) {
					t.Fatal("Write with Immediate completed before its bytes were placed")
				}
			}
			if string(recvMR.Bytes()[16<<10:16<<10+5]) != "hello" {
				t.Fatal("the Send of Send with Immediate did not land in its receive")
			}
			if n := p.respDev.Stats().RxImmediate.Load(); n != 3 {
				t.Fatalf("RxImmediate %d, want 3", n)
			}
		})
	}
}

// TestImmediateNeedsReceive (RD): an Immediate Data message waits for a
// posted receive (receiver not ready) like a Send, and is delivered once.
func TestImmediateNeedsReceive(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{Config: reliability.Config{RNRDelay: time.Millisecond, RNRRetries: -1}})
	if err := p.qa.PostSend(&SendWR{ID: 1, Opcode: OpImmediate, Flags: FlagSignaled, AH: p.ahAB, Imm: 9}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a refusal for want of a receive", func() bool { return p.b.dev.Stats().RDNotReady.Load() > 0 })
	mustPost(t, p.qb.PostRecv(&RecvWR{ID: 7, SGL: []SGE{p.b.mr.SGE(0, 8)}}))
	if wc := collect(t, p.cqb, 1, 5*time.Second)[0]; wc.ID != 7 || !wc.WithImm || wc.Imm != 9 {
		t.Fatalf("%+v", wc)
	}
	if wc := collect(t, p.cqa, 1, 5*time.Second)[0]; wc.ID != 1 || wc.Status != Success {
		t.Fatalf("%+v", wc)
	}
	// Delivered once: b has read every frame a sent (the refused tries
	// included) and none completed again.
	quietDrained(t, p.cqb, p.a, p.b)
}

// TestAtomicImmediatePostChecks: what PostSend refuses outright — atomics
// and Immediate Data on UD (no response comes back; the Send or Write
// before an Immediate Data may be lost alone), an atomic without one
// 8-byte SGE, Immediate Data with a payload — each with a clear error;
// and a region for remote atomics needs local write.
func TestAtomicImmediatePostChecks(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	cq, err := n.dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	ud := n.newQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq})
	ah := n.ah(n, ud)
	for _, op := range []SendOpcode{OpAtomicFetchAdd, OpAtomicCmpSwap, OpImmediate, OpSendImm, OpWriteImm} {
		err := ud.PostSend(&SendWR{Opcode: op, AH: ah, SGL: []SGE{n.mr.SGE(0, 8)}})
		if !errors.Is(err, ErrInvalidWR) || !strings.Contains(err.Error(), "reliable QP") {
			t.Errorf("UD %v: %v", op, err)
		}
	}
	for _, mk := range reliablePairs(t) {
		p := mk(t)
		for _, wr := range []*SendWR{
			{Opcode: OpAtomicFetchAdd},
			{Opcode: OpAtomicFetchAdd, SGL: []SGE{p.reqMR.SGE(0, 4)}},
			{Opcode: OpAtomicCmpSwap, SGL: []SGE{p.reqMR.SGE(0, 8), p.reqMR.SGE(8, 8)}},
			{Opcode: OpAtomicCmpSwap, Inline: make([]byte, 8)},
			{Opcode: OpImmediate, Inline: []byte("x")},
		} {
			wr.AH = p.ah
			if err := p.req.PostSend(wr); !errors.Is(err, ErrInvalidWR) {
				t.Errorf("%s %v: %v", p.name, wr.Opcode, err)
			}
		}
		// A sink without local write: the WR completes with a local error.
		ro, _ := p.reqPD.RegisterMemory(make([]byte, 8), 0)
		target, _ := p.respPD.RegisterMemory(make([]byte, 8), AccessLocalWrite|AccessRemoteAtomic)
		p.post(t, &SendWR{ID: 5, Opcode: OpAtomicFetchAdd, Flags: FlagSignaled, SGL: []SGE{ro.SGE(0, 8)}, RemoteSTag: target.STag()})
		if wc := collect(t, p.reqCQ, 1, 5*time.Second)[0]; wc.ID != 5 || wc.Status != LocalProtectionError {
			t.Errorf("%s: %+v", p.name, wc)
		}
	}
	if _, err := n.pd.RegisterMemory(make([]byte, 8), AccessRemoteAtomic); !errors.Is(err, ErrInvalidAttr) {
		t.Errorf("remote atomic without local write: %v", err)
	}
}

// TestAtomicSpoofed: RFC 7306 frames from raw sockets with spoofed
// 127.x.y.z sources, with the true STag of a region that grants remote
// atomic access, carry out nothing. A UD QP drops Atomic Requests,
// Atomic Responses and Immediate Data as an unexpected opcode (nothing
// executed, no receive consumed, no reply); an RD QP takes them only in a
// Data frame of a validated session, so bare ones are not RD frames at
// all and are dropped before any state exists.
func TestAtomicSpoofed(t *testing.T) {
	sp := spoof.NewT(t)
	for _, typ := range []QPType{UD, RD} {
		t.Run(typ.String(), func(t *testing.T) {
			n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
			q := n.newQP(QPAttr{Type: typ, SendCQ: n.cq, RecvCQ: n.cq})
			region, err := n.pd.RegisterMemory(make([]byte, 64), AccessLocalWrite|AccessRemoteAtomic)
			if err != nil {
				t.Fatal(err)
			}
			mustPost(t, q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{n.mr.SGE(0, 64)}}))
			st := n.dev.Stats()
			sent := st.RxDatagrams.Load()
			dst := n.sock.LocalAddr()
			untagged := func(op udiwarp.Opcode, queue udiwarp.Queue, msn uint32) []byte {
				return udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
					RDMAP: udiwarp.NewRDMAPControl(op), ULP: 9, QN: udiwarp.DatagramQN(q.QPN(), queue), MSN: msn})
			}
			for i := range 200 {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(i), byte(i * 7), 3}), uint16(4000+i))
				a := atomicRequest(OpAtomicFetchAdd, uint32(i), region.STag(), 0, 1, 0)
				frames := [][]byte{
					udiwarp.AppendAtomicRequest(untagged(udiwarp.OpAtomicRequest, udiwarp.QueueReadRequest, uint32(i)), &a),
					udiwarp.AppendAtomicResponse(untagged(udiwarp.OpAtomicResponse, udiwarp.QueueAtomicResponse, uint32(i)), 1, 2),
					udiwarp.AppendImmediateData(untagged(udiwarp.OpImmediateData, udiwarp.QueueSend, uint32(i)), 3),
				}
				for _, f := range frames {
					if err := sp.Send(src, dst, udiwarp.SealDatagram(f, 0)); err != nil {
						t.Fatal(err)
					}
					sent++
				}
				if i%20 == 0 {
					eventually(t, "the spoofed datagrams read", func() bool { return st.RxDatagrams.Load() >= sent })
				}
			}
			eventually(t, "the spoofed datagrams read", func() bool { return st.RxDatagrams.Load() >= sent })
			if w := word(region, 0); w != 0 || st.RxAtomics.Load() != 0 || st.RxImmediate.Load() != 0 {
				t.Fatalf("spoofed frames were carried out: word %d, %d atomics, %d immediate", w, st.RxAtomics.Load(), st.RxImmediate.Load())
			}
			if st.TxDatagrams.Load() != 0 {
				t.Fatalf("%d replies to spoofed sources", st.TxDatagrams.Load())
			}
			rxSettled(n.sock)     // every spoofed datagram was read: its batch is done
			noCompletion(t, n.cq) // the posted receive is still there: nothing completed it
			if typ == UD && st.RxBadOpcode.Load() != 600 {
				t.Fatalf("UD dropped %d as an unexpected opcode, want 600", st.RxBadOpcode.Load())
			}
		})
	}
}
