package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestRemoteAccessMatrix (issue 15, "one home for each shared step"):
// every tagged path — UD and RD Write-Record, RD Write and Read, RC Write
// and Read — refuses every reason to refuse through the one check
// (Device.remoteRegion): on the target the counter of that reason moves
// by exactly one and the region is untouched; the requester never
// completes Success for it (RD: RemoteAccessError), and on RC the
// Terminate carries the code RFC 5040/5041 give that reason.
func TestRemoteAccessMatrix(t *testing.T) {
	const n = 64
	full := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead

	// A reason makes, on the target, a region of 4 KiB (filled with 7s,
	// so a Read has something to take) and the STag and offset a request
	// of n bytes needing need names.
	type reason struct {
		name    string
		fault   tagFault
		counter func(*Stats) uint64
		mk      func(t *testing.T, dev *Device, pd *PD, need Access) (*MR, uint32, uint64)
	}
	region := func(t *testing.T, pd *PD, access Access) *MR {
		t.Helper()
		m, err := pd.RegisterMemory(bytes.Repeat([]byte{7}, 4096), access)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	badSTag := func(s *Stats) uint64 { return s.RxBadSTag.Load() }
	access := func(s *Stats) uint64 { return s.RxAccess.Load() }
	reasons := []reason{
		{"unknown STag", faultSTag, badSTag, func(t *testing.T, _ *Device, pd *PD, _ Access) (*MR, uint32, uint64) {
			m := region(t, pd, full)
			return m, m.STag() ^ 0x5a5a5a00, 0
		}},
		{"other PD", faultPD, badSTag, func(t *testing.T, dev *Device, _ *PD, _ Access) (*MR, uint32, uint64) {
			m := region(t, dev.AllocPD(), full)
			return m, m.STag(), 0
		}},
		{"access not granted", faultAccess, access, func(t *testing.T, _ *Device, pd *PD, need Access) (*MR, uint32, uint64) {
			m := region(t, pd, full&^need)
			return m, m.STag(), 0
		}},
		{"invalidated", faultAccess, access, func(t *testing.T, _ *Device, pd *PD, _ Access) (*MR, uint32, uint64) {
			m := region(t, pd, full)
			m.Invalidate()
			return m, m.STag(), 0
		}},
		{"out of bounds", faultBounds, func(s *Stats) uint64 { return s.RxBounds.Load() },
			func(t *testing.T, _ *Device, pd *PD, _ Access) (*MR, uint32, uint64) {
				m := region(t, pd, full)
				return m, m.STag(), 4096 - n/2
			}},
	}
	untouched := func(t *testing.T, m *MR) {
		t.Helper()
		if !bytes.Equal(m.Bytes(), bytes.Repeat([]byte{7}, 4096)) {
			t.Fatal("the refused region was written")
		}
	}
	refused := func(t *testing.T, r reason, st *Stats, before uint64) {
		t.Helper()
		eventually(t, r.name+" counted", func() bool { return r.counter(st) > before })
	}
	// once, at a cell's end (the requester has its answer): the refusal
	// was counted once, not again.
	once := func(t *testing.T, r reason, st *Stats, before uint64) {
		t.Helper()
		if got := r.counter(st) - before; got != 1 {
			t.Fatalf("%s counted %d times, want once", r.name, got)
		}
	}

	// The datagram paths: a target node with a UD and an RD QP, a source
	// node with the same.
	type datagramPath struct {
		name string
		rd   bool
		op   SendOpcode
		need Access
	}
	for _, p := range []datagramPath{
		{"UD Write-Record", false, OpWriteRecord, AccessRemoteWrite},
		{"RD Write-Record", true, OpWriteRecord, AccessRemoteWrite},
		{"RD Write", true, OpWrite, AccessRemoteWrite},
		{"RD Read", true, OpRead, AccessRemoteRead},
	} {
		for _, r := range reasons {
			t.Run(p.name+"/"+r.name, func(t *testing.T) {
				tn := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
				sn := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
				tq, tcq, sq, scq := tn.qp, tn.cq, sn.qp, sn.cq
				if p.rd {
					tq, tcq = rdQPOn(t, tn, RDConfig{})
					sq, scq = rdQPOn(t, sn, RDConfig{})
				}
				m, stag, to := r.mk(t, tn.dev, tn.pd, p.need)
				fill(sn.buf[:n], 0xab)
				wr := &SendWR{ID: 1, Opcode: p.op, Flags: FlagSignaled, SGL: []SGE{sn.mr.SGE(0, n)}, AH: sn.ah(tn, tq),
					RemoteSTag: stag, RemoteTO: to}
				sink, err := sn.pd.RegisterMemory(make([]byte, n), AccessLocalWrite|AccessRemoteWrite)
				if err != nil {
					t.Fatal(err)
				}
				if p.op == OpRead {
					wr.SGL = []SGE{sink.SGE(0, n)}
				}
				st := tn.dev.Stats()
				before := r.counter(st)
				if err := sq.PostSend(wr); err != nil {
					t.Fatal(err)
				}
				refused(t, r, st, before)
				untouched(t, m)
				if p.rd {
					if wc := collect(t, scq, 1, 5*time.Second)[0]; wc.ID != 1 || wc.Status != RemoteAccessError {
						t.Fatalf("the requester's completion: %+v, want RemoteAccessError", wc)
					}
				}
				if !bytes.Equal(sink.Bytes(), make([]byte, n)) {
					t.Fatal("a refused Read placed data")
				}
				// The refusal was counted (refused) and, on RD, answered: once
				// the batch that carried it is done, a record or completion it
				// made would be in the target's CQ.
				rxSettled(tn.sock)
				noCompletion(t, tcq) // no record, no completion at the target
				once(t, r, st, before)
			})
		}
	}

	// RC: a connection per cell, as every refusal ends it.
	for _, p := range []struct {
		name string
		op   SendOpcode
		need Access
		code func(tagFault) udiwarp.ErrorCode
	}{
		{"RC Write", OpWrite, AccessRemoteWrite, tagFault.ddpCode},
		{"RC Read", OpRead, AccessRemoteRead, tagFault.rdmapCode},
	} {
		for _, r := range reasons {
			t.Run(p.name+"/"+r.name, func(t *testing.T) {
				a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
				rcConnect(t, a, b, RCConfig{}, RCConfig{})
				m, stag, to := r.mk(t, b.dev, b.pd, p.need)
				sink, err := a.pd.RegisterMemory(make([]byte, n), AccessLocalWrite|AccessRemoteWrite)
				if err != nil {
					t.Fatal(err)
				}
				wr := &SendWR{ID: 1, Opcode: p.op, Flags: FlagSignaled, Inline: bytes.Repeat([]byte{0xab}, n), RemoteSTag: stag, RemoteTO: to}
				if p.op == OpRead {
					wr.Inline, wr.SGL = nil, []SGE{sink.SGE(0, n)}
				}
				st := b.dev.Stats()
				before := r.counter(st)
				if err := a.q.PostSend(wr); err != nil {
					t.Fatal(err)
				}
				refused(t, r, st, before)
				untouched(t, m)
				if ev := nextEvent(t, a.dev, AsyncRemoteError); ev.Code != p.code(r.fault) {
					t.Fatalf("the requester's event %+v, want code %v", ev, p.code(r.fault))
				}
				if p.op == OpRead {
					if wc := collect(t, a.cq, 1, 5*time.Second)[0]; wc.ID != 1 || wc.Status == Success {
						t.Fatalf("a refused Read completed %+v", wc)
					}
					if !bytes.Equal(sink.Bytes(), make([]byte, n)) {
						t.Fatal("a refused Read placed data")
					}
				}
				once(t, r, st, before)
			})
		}
	}
}

// TestWriteRecordLandingBounds: the landing path (a busy-polled UD QP
// reading Write-Record segments straight into the region) holds to the
// same check as the rest: after a message that fits has landed, a message
// that runs past the end of the region lands nothing and places nothing;
// every one of its segments is refused and counted out of bounds.
func TestWriteRecordLandingBounds(t *testing.T) {
	const seg = 4000
	b, region, sendSegs := landingTarget(t, 6*seg, seg)
	st := b.dev.Stats()
	send := func(msn uint32, msg []byte) { sendSegs(msn, msg, 0, len(msg)/seg) }
	drive := func(what string, cond func() bool) {
		t.Helper()
		var wc [1]WorkCompletion
		for end := time.Now().Add(5 * time.Second); !cond(); {
			b.cq.Poll(wc[:]) // drives the busy-polled device
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s: placed %d, landed %d, out of bounds %d", what, st.RxWRPlaced.Load(), st.RxLanded.Load(), st.RxBounds.Load())
			}
		}
	}
	fits := make([]byte, 6*seg)
	fill(fits, 3)
	send(1, fits)
	drive("the message that fits", func() bool { return st.RxWRPlaced.Load() == 6 })
	if st.RxLanded.Load() == 0 {
		t.Fatal("nothing landed: the test does not reach the landing path")
	}
	landed := st.RxLanded.Load()
	long := make([]byte, 12*seg)
	fill(long, 9)
	send(2, long)
	drive("twelve segments refused", func() bool { return st.RxBounds.Load() == 12 })
	if st.RxWRPlaced.Load() != 6 || st.RxLanded.Load() != landed {
		t.Fatalf("placed %d, landed %d more from the message that does not fit", st.RxWRPlaced.Load()-6, st.RxLanded.Load()-landed)
	}
	if !bytes.Equal(region.Bytes(), fits) {
		t.Fatal("the region holds bytes of the message that does not fit")
	}
}
