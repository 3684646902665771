package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/protect"
)

func protCfg(m protect.Mode) DeviceConfig { return DeviceConfig{Protect: protect.Config{Mode: m}} }

// TestProtectedRD: RD Sends and Writes between two protected devices, in
// both modes: the contact agrees the keys (no pre-shared key), every
// datagram is sealed and opened, and the bytes arrive.
func TestProtectedRD(t *testing.T) {
	for _, m := range []protect.Mode{protect.Auth, protect.AEAD} {
		t.Run(m.String(), func(t *testing.T) {
			p := newRDPair(t, protCfg(m), protCfg(m), RDConfig{})
			const n, slot = 50, 3000
			for i := range n {
				mustPost(t, p.qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{p.b.mr.SGE(i*slot, slot)}}))
			}
			for i := range n {
				size := (i * 997) % slot
				fill(p.a.buf[i*slot:i*slot+size], i)
				mustPost(t, p.qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i*slot, size)}, AH: p.ahAB}))
			}
			for i, wc := range collect(t, p.cqa, n, time.Minute) {
				if wc.Status != Success {
					t.Fatalf("send %d: %+v", i, wc)
				}
			}
			for i, wc := range collect(t, p.cqb, n, time.Minute) {
				size := (i * 997) % slot
				if wc.ID != uint64(i) || wc.Status != Success || int(wc.Len) != size || !bytes.Equal(p.b.buf[i*slot:i*slot+size], p.a.buf[i*slot:i*slot+size]) {
					t.Fatalf("receive %d: %+v", i, wc)
				}
			}
			sa, sb := p.a.dev.Stats(), p.b.dev.Stats()
			if sa.ProtSessions.Load() == 0 || sb.ProtSessions.Load() == 0 || sb.ProtOpened.Load() < n || sa.ProtSealed.Load() < n {
				t.Fatalf("a: %+v\nb: %+v", sa.Snapshot(), sb.Snapshot())
			}
			t.Logf("a sealed %d opened %d; b sealed %d opened %d; refused a %d b %d", sa.ProtSealed.Load(), sa.ProtOpened.Load(),
				sb.ProtSealed.Load(), sb.ProtOpened.Load(), sa.ProtAuthFailed.Load()+sa.ProtNoKey.Load(), sb.ProtAuthFailed.Load()+sb.ProtNoKey.Load())
		})
	}
}
