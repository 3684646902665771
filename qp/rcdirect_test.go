package qp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestRCDirectPlacement: long Sends, Writes and Read Responses are read
// from the socket into place (the receiver's RCDirectFPDUs moves) and
// arrive whole, with CRC and without, event and busy polling; a Send
// into a receive of several SGEs goes the ordinary way and arrives whole
// too.
func TestRCDirectPlacement(t *testing.T) {
	for _, tc := range []struct {
		name string
		poll PollMode
		cfg  RCConfig
	}{
		{"event, CRC", PollEvent, RCConfig{}},
		{"event, no CRC", PollEvent, RCConfig{NoCRC: true}},
		{"busy, CRC", PollBusy, RCConfig{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newRCSide(t, DeviceConfig{Poll: tc.poll}), newRCSide(t, DeviceConfig{Poll: tc.poll})
			rcConnect(t, a, b, tc.cfg, tc.cfg)
			const n = 3 << 20
			wait := func(cq *CQ, want WCOpcode) WorkCompletion {
				t.Helper()
				var wc [1]WorkCompletion
				for end := time.Now().Add(20 * time.Second); ; {
					a.cq.Poll(nil)
					b.cq.Poll(nil)
					if cq.Poll(wc[:]) == 1 {
						if wc[0].Status != Success || wc[0].Opcode != want {
							t.Fatalf("%+v, want %v", wc[0], want)
						}
						return wc[0]
					}
					if time.Now().After(end) {
						t.Fatalf("no %v in 20 s", want)
					}
					if tc.poll == PollEvent {
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
						cq.Wait(ctx)
						cancel()
					}
				}
			}
			direct := func(s *rcSide) uint64 { return s.dev.stats.RCDirectFPDUs.Load() }
			// A Send into one SGE, then one into three.
			fill(a.buf[:n], 1)
			b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, n)}})
			a.q.PostSend(&SendWR{ID: 1, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, n)}})
			wait(a.cq, WCSend)
			if wc := wait(b.cq, WCRecv); wc.Len != n || !bytes.Equal(b.buf[:n], a.buf[:n]) {
				t.Fatalf("Send: %d bytes, equal %v", wc.Len, bytes.Equal(b.buf[:n], a.buf[:n]))
			}
			if direct(b) == 0 {
				t.Fatal("no FPDU of a 3 MiB Send was read into place")
			}
			fill(a.buf[:n], 2)
			clear(b.buf)
			b.q.PostRecv(&RecvWR{ID: 2, SGL: []SGE{b.mr.SGE(0, 1000), b.mr.SGE(4<<20, 70000), b.mr.SGE(1000, n-71000)}})
			a.q.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, n)}})
			wait(a.cq, WCSend)
			wait(b.cq, WCRecv)
			got := append(append(append([]byte{}, b.buf[:1000]...), b.buf[4<<20:4<<20+70000]...), b.buf[1000:n-70000]...)
			if !bytes.Equal(got, a.buf[:n]) {
				t.Fatal("a Send into three SGEs differs")
			}
			// A Write, then a Read of it back: the Read Responses are read
			// into place at a. (The test reads b's memory only through the
			// Read: a Go reader of memory a peer writes over TCP would race
			// as far as the race detector can see.)
			fill(a.buf[:n], 3)
			before := direct(b)
			a.q.PostSend(&SendWR{ID: 3, Opcode: OpWrite, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, n)}, RemoteSTag: b.mr.STag(), RemoteTO: b.mr.Addr() + 5<<20})
			wait(a.cq, WCRDMAWrite)
			clear(a.buf[4<<20:])
			beforeRead := direct(a)
			a.q.PostSend(&SendWR{ID: 4, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(4<<20, n)}, RemoteSTag: b.mr.STag(), RemoteTO: b.mr.Addr() + 5<<20})
			wait(a.cq, WCRDMARead)
			if !bytes.Equal(a.buf[4<<20:4<<20+n], a.buf[:n]) {
				t.Fatal("what the Read brought back differs from what was written")
			}
			if direct(b) == before {
				t.Fatal("no FPDU of a 3 MiB Write was read into place")
			}
			if direct(a) == beforeRead {
				t.Fatal("no Read Response FPDU was read into place")
			}
		})
	}
}

// TestRCDirectHostile: an FPDU being read into place ends as it would
// have whole. A corrupted CRC ends the stream with an MPA CRC Terminate
// and completes the Send's receive in error, never Success; a region
// deregistered under the FPDU ends it with the handler's invalid-STag
// Terminate, and Deregister does not wait for the peer to send the rest.
func TestRCDirectHostile(t *testing.T) {
	srv := newRCServer(t, RCConfig{})
	const n = 60000
	payload := make([]byte, n)
	fill(payload, 9)
	// start sends an FPDU's first 2 KiB and waits until the server reads
	// it into place; the rest is returned.
	start := func(r *rawMPA, hdr []byte) []byte {
		t.Helper()
		b, _ := r.tx.Append(nil, hdr, payload)
		before := srv.dev.stats.RCDirectFPDUs.Load()
		r.c.Write(b[:2048])
		for end := time.Now().Add(5 * time.Second); srv.dev.stats.RCDirectFPDUs.Load() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the FPDU was not read into place: the test does not reach the path")
			}
		}
		return b[2048:]
	}
	t.Run("bad CRC in a Send's second FPDU", func(t *testing.T) {
		r := dialRawMPA(t, srv.l.Addr().String(), 2)
		q := srv.next(t)
		// The receive posted holds 100 bytes: a second one of 200 KiB.
		q.PostRecv(&RecvWR{ID: 2, SGL: []SGE{srv.mr.SGE(1<<20, 200<<10)}})
		r.send(udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), MSN: 1}), []byte("x"))
		first := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), MSN: 2})
		r.send(first, payload[:100])
		rest := start(r, udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), MSN: 2, MO: 100}))
		rest[len(rest)-1] ^= 0xff
		r.c.Write(rest)
		if term := r.terminate(); term.Code() != udiwarp.MPACRCError {
			t.Fatalf("Terminate %v, want an MPA CRC error", term.Code())
		}
		waitState(t, q, StateError)
		for _, wc := range collect(t, srv.cq, 2, 5*time.Second) {
			if wc.ID == 2 && wc.Status == Success {
				t.Fatalf("the receive of a Send with a bad CRC completed: %+v", wc)
			}
		}
	})
	t.Run("bad CRC in a Write", func(t *testing.T) {
		r := dialRawMPA(t, srv.l.Addr().String(), 2)
		q := srv.next(t)
		rest := start(r, udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
			STag: srv.mr.STag(), TO: srv.mr.Addr() + 2<<20}))
		rest[len(rest)-2] ^= 0x01
		r.c.Write(rest)
		if term := r.terminate(); term.Code() != udiwarp.MPACRCError {
			t.Fatalf("Terminate %v, want an MPA CRC error", term.Code())
		}
		waitState(t, q, StateError)
		collect(t, srv.cq, 1, 5*time.Second) // the flushed receive
	})
	t.Run("region deregistered under a Write", func(t *testing.T) {
		r := dialRawMPA(t, srv.l.Addr().String(), 2)
		q := srv.next(t)
		mem := make([]byte, 1<<20)
		region, err := srv.pd.RegisterMemory(mem, AccessLocalWrite|AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		rest := start(r, udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
			STag: region.STag(), TO: region.Addr()}))
		done := make(chan error, 1)
		go func() { done <- region.Deregister() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Deregister waits for the peer to send the rest of an FPDU being read into place")
		}
		r.c.Write(rest)
		if term := r.terminate(); term.Code() != udiwarp.DDPTaggedInvalidSTag {
			t.Fatalf("Terminate %v, want an invalid STag", term.Code())
		}
		waitState(t, q, StateError)
		collect(t, srv.cq, 1, 5*time.Second)
		// Nothing was written after Deregister returned: only what came
		// before (less than the first 2 KiB sent).
		if i := bytes.IndexFunc(mem[2048:], func(r rune) bool { return r != 0 }); i >= 0 {
			t.Fatalf("byte %d of a deregistered region was written", 2048+i)
		}
	})
}
