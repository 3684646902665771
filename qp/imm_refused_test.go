package qp

import (
	"testing"
	"time"
)

// TestImmediateAfterRefusedPart (issue 30, item 2): the Immediate Data
// of a Write with Immediate whose Write the target refused, or of a Send
// with Immediate whose Send did not fit its receive, never completes a
// receive with Success: the target would read the value as "the data is
// here" while it is not. On RD the receive completes with the refusal's
// status (the requester's WR's), no value; on RC the refusal ends the
// connection, and nothing completes Success. A refusal does not stick:
// the next Immediate Data after a message carried out completes Success.
// It fails when the Immediate ignores the refusal before it (the receive
// completes Success with the value).
func TestImmediateAfterRefusedPart(t *testing.T) {
	for _, mk := range reliablePairs(t) {
		p := mk(t)
		t.Run(p.name, func(t *testing.T) {
			noWrite, err := p.respPD.RegisterMemory(make([]byte, 4096), AccessLocalWrite) // no remote write
			if err != nil {
				t.Fatal(err)
			}
			region, err := p.respPD.RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			recvMR, err := p.respPD.RegisterMemory(make([]byte, 4096), AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 6 {
				if err := p.resp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{recvMR.SGE(i*16, 16)}}); err != nil {
					t.Fatal(err)
				}
			}
			fill(p.reqBuf[:3000], 7)
			p.post(t, &SendWR{ID: 1, Opcode: OpWriteImm, Flags: FlagSignaled, SGL: []SGE{p.reqMR.SGE(0, 3000)},
				RemoteSTag: noWrite.STag(), RemoteTO: noWrite.Addr(), Imm: 0xfeed})
			if p.rc {
				// An RC requester completes a Write once TCP took it, as
				// iWARP does; the target's Terminate then ends the
				// connection: its receives are flushed, none completes
				// Success.
				for _, wc := range collect(t, p.respCQ, 6, 10*time.Second) {
					if wc.Status == Success {
						t.Fatalf("a receive completed Success after the Write was refused: %+v", wc)
					}
				}
				return
			}
			p.post(t, &SendWR{ID: 2, Opcode: OpSendImm, Flags: FlagSignaled, Inline: make([]byte, 100), Imm: 0xbeef}) // 100 bytes into 16
			p.post(t, &SendWR{ID: 3, Opcode: OpSend, Flags: FlagSignaled, Inline: []byte("ok")})
			p.post(t, &SendWR{ID: 4, Opcode: OpImmediate, Flags: FlagSignaled, Imm: 7})
			p.post(t, &SendWR{ID: 5, Opcode: OpWriteImm, Flags: FlagSignaled, SGL: []SGE{p.reqMR.SGE(0, 3000)},
				RemoteSTag: region.STag(), RemoteTO: region.Addr(), Imm: 8})
			wantReq := []Status{RemoteAccessError, RemoteInvalidRequestError, Success, Success, Success}
			for i, wc := range collect(t, p.reqCQ, 5, 10*time.Second) {
				if wc.ID != uint64(i+1) || wc.Status != wantReq[i] {
					t.Fatalf("requester completion %d: %+v, want %v", i, wc, wantReq[i])
				}
			}
			type want struct {
				st  Status
				imm bool
				v   uint64
			}
			wants := []want{
				{RemoteAccessError, true, 0},         // the refused Write's Immediate
				{LocalLengthError, false, 0},         // the Send that did not fit
				{RemoteInvalidRequestError, true, 0}, // its Immediate
				{Success, false, 0},                  // "ok"
				{Success, true, 7},                   // Immediate alone, after a Send carried out
				{Success, true, 8},                   // the Write with Immediate carried out
			}
			for i, wc := range collect(t, p.respCQ, 6, 10*time.Second) {
				w := wants[i]
				if wc.ID != uint64(i) || wc.Status != w.st || wc.WithImm != w.imm || wc.Imm != w.v {
					t.Fatalf("target receive %d: %+v, want %+v", i, wc, w)
				}
			}
			if n := p.respDev.Stats().RxImmediate.Load(); n != 2 {
				t.Fatalf("RxImmediate %d, want 2 (only the Immediates carried out)", n)
			}
		})
	}
}
