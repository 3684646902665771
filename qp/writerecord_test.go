package qp

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
)

// wrTarget is a node with a remotely writable region and a QP to write
// through, configured for Write-Record.
func wrTarget(t *testing.T, wr writerecord.Config, mode RecordMode) (*node, *MR, *QP) {
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	region, err := b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, WriteRecord: wr, Record: mode})
	return b, region, q
}

func TestWriteRecordEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		segment int
		sges    int
	}{
		{"one segment", 1400, 0, 1},
		{"empty message", 0, 0, 1},
		{"segmented, 3 SGEs", 10000, 1000, 3},
		{"segmented, uneven tail", 4097, 1400, 2},
		{"64000-byte segments, 512 KiB", 512 << 10, 64000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
			src := a.newQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, WriteRecordSegment: tc.segment})
			b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
			fill(a.buf[:tc.size], 9)
			var sgl []SGE
			per := tc.size / tc.sges
			for i := range tc.sges {
				n := per
				if i == tc.sges-1 {
					n = tc.size - per*(tc.sges-1)
				}
				sgl = append(sgl, a.mr.SGE(i*per, n))
			}
			ah := a.ah(b, q)
			for msg := 1; msg <= 2; msg++ {
				// Each message to its own bytes: the race detector cannot see
				// that the next write is caused, through the kernel, by a
				// send that follows this test's read of the last one.
				off := (msg - 1) * tc.size
				to := region.Addr() + uint64(off)
				if err := src.PostSend(&SendWR{ID: 5, Opcode: OpWriteRecord, Flags: FlagSignaled, SGL: sgl, AH: ah, RemoteSTag: region.STag(), RemoteTO: to}); err != nil {
					t.Fatal(err)
				}
				if wc := waitWC(t, a.cq, 1)[0]; wc.Status != Success || wc.Opcode != WCWriteRecord || wc.Len != uint32(tc.size) {
					t.Fatalf("source completion %+v", wc)
				}
				wc := waitWC(t, b.cq, 1)[0]
				if wc.Status != Success || wc.Opcode != WCWriteRecord || wc.Partial || wc.STag != region.STag() || wc.TO != to ||
					wc.Len != uint32(tc.size) || wc.MSN != uint32(msg) || wc.SourceQPN != src.QPN() || wc.Source != a.sock.LocalAddr() {
					t.Fatalf("target record %+v", wc)
				}
				if !bytes.Equal(region.Bytes()[off:off+tc.size], a.buf[:tc.size]) {
					t.Fatal("placed bytes differ")
				}
				// One record per message, no more: b has read every segment
				// a sent (a's completion came after the last went) and
				// handled it.
				quietDrained(t, b.cq, a, b)
			}
		})
	}
}

func TestWriteRecordValidityMap(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b, region, q := wrTarget(t, writerecord.Config{}, RecordMap)
	vm := region.TrackValidity(0)
	fill(a.buf[:5000], 2)
	mustPost(t, a.qp.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(0, 5000)}, AH: a.ah(b, q), RemoteSTag: region.STag(), RemoteTO: region.Addr() + 100}))
	eventually(t, "the map to show the message", func() bool { return vm.Valid(100, 5000) })
	if vm.Valid(99, 1) || vm.Valid(5100, 1) || !bytes.Equal(region.Bytes()[100:5100], a.buf[:5000]) {
		t.Fatal("map or bytes wrong")
	}
	// RecordMap: no CQ entry. The map was filled where the entry would
	// have been made; b has read and handled everything a sent.
	quietDrained(t, b.cq, a, b)
}

// rawWR sends hand-built Write-Record segments, so a test decides exactly
// which are lost, reordered or duplicated.
type rawWR struct {
	t    *testing.T
	conn *net.UDPConn
	to   *node
	q    *QP
}

func newRawWR(t *testing.T, to *node, q *QP) *rawWR {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawWR{t: t, conn: c, to: to, q: q}
}

// send sends segment [mo, mo+n) of message msn (length ml at TO to),
// whose bytes are payload[mo:mo+n].
func (r *rawWR) send(stag uint32, to uint64, msn uint32, payload []byte, mo, n int) {
	b := udiwarp.AppendWriteRecord(nil, &udiwarp.WriteRecordFields{Last: mo+n == len(payload), RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite),
		STag: stag, TO: to + uint64(mo), MSN: msn, MO: uint32(mo), MessageLength: uint32(len(payload)), DstQPN: r.q.QPN(), SrcQPN: 77})
	b = udiwarp.SealDatagram(append(b, payload[mo:mo+n]...), 0)
	if _, err := r.conn.WriteToUDPAddrPort(b, r.to.sock.LocalAddr()); err != nil {
		r.t.Fatal(err)
	}
}

func TestWriteRecordLossAndDeadline(t *testing.T) {
	msg := make([]byte, 4000)
	fill(msg, 4)
	for _, tc := range []struct {
		name   string
		policy writerecord.Policy
		send   []int // segments of 1000 bytes, in order sent
		valid  []validitymap.Range
	}{
		{"first lost, partial", writerecord.DeliverPartial, []int{1, 2, 3}, []validitymap.Range{{Start: 1000, End: 4000}}},
		{"middle lost, partial", writerecord.DeliverPartial, []int{0, 3, 1}, []validitymap.Range{{Start: 0, End: 2000}, {Start: 3000, End: 4000}}},
		{"last lost, partial", writerecord.DeliverPartial, []int{2, 0, 1, 1}, []validitymap.Range{{Start: 0, End: 3000}}},
		{"middle lost, discard", writerecord.Discard, []int{0, 1, 3}, nil},
		{"reordered and duplicated, complete", writerecord.DeliverPartial, []int{3, 1, 3, 0, 2, 0}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The deadline outlasts any stall of a loaded machine between
			// the sends (at 20 ms, a stall let it fire between them: a
			// partial of one segment, 1 run in 12 under load); the cases
			// run side by side, so the suite waits it out once.
			t.Parallel()
			b, region, q := wrTarget(t, writerecord.Config{Timeout: 2 * time.Second, Policy: tc.policy}, RecordBoth)
			vm := region.TrackValidity(0)
			r := newRawWR(t, b, q)
			to := region.Addr() + 1000
			for _, k := range tc.send {
				r.send(region.STag(), to, 1, msg, k*1000, 1000)
			}
			complete := slices.Contains(tc.send, 0) && slices.Contains(tc.send, 1) && slices.Contains(tc.send, 2) && slices.Contains(tc.send, 3)
			if tc.valid == nil && !complete {
				// Every segment read and handled, then the message ended at
				// its deadline: the deadline's run counts it under the QP's
				// lock (WriteRecordStats), where a record would be made.
				eventually(t, "every segment read", func() bool { return b.dev.Stats().RxDatagrams.Load() >= uint64(len(tc.send)) })
				rxSettled(b.sock)
				eventually(t, "the incomplete message expired", func() bool { wr, _ := b.dev.WriteRecordStats(); return wr.Expired == 1 })
				noCompletion(t, b.cq)
				if b.dev.Stats().RxWRPartial.Load() != 0 || vm.Bytes() != 0 {
					t.Fatal("a discarded message was recorded")
				}
				return
			}
			wc := waitWC(t, b.cq, 1)[0]
			if complete {
				if wc.Partial || wc.Len != 4000 || !bytes.Equal(region.Bytes()[1000:5000], msg) || !vm.Valid(1000, 4000) {
					t.Fatalf("%+v", wc)
				}
				return
			}
			if !wc.Partial || len(wc.Valid) != len(tc.valid) {
				t.Fatalf("%+v", wc)
			}
			for i, v := range tc.valid {
				abs := validitymap.Range{Start: to + v.Start, End: to + v.End}
				if wc.Valid[i] != abs {
					t.Fatalf("range %d: %v, want %v", i, wc.Valid[i], abs)
				}
				// Every recorded byte is in memory, checked by content.
				if !bytes.Equal(region.Bytes()[1000+v.Start:1000+v.End], msg[v.Start:v.End]) {
					t.Fatalf("range %v: bytes differ", v)
				}
				if !vm.Valid(1000+v.Start, v.Len()) {
					t.Fatalf("range %v missing from the map", v)
				}
			}
			if vm.Bytes() != func() (n uint64) {
				for _, v := range tc.valid {
					n += v.Len()
				}
				return
			}() {
				t.Fatalf("map holds %d bytes", vm.Bytes())
			}
		})
	}
}

func TestWriteRecordSupersession(t *testing.T) {
	b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
	r := newRawWR(t, b, q)
	old, newer := make([]byte, 2000), make([]byte, 2000)
	fill(old, 1)
	fill(newer, 2)
	to := region.Addr()
	r.send(region.STag(), to, 5, old, 0, 1000)
	r.send(region.STag(), to, 6, newer, 1000, 1000) // newer MSN: message 5 is discarded
	r.send(region.STag(), to, 5, old, 1000, 1000)   // straggler: dropped
	r.send(region.STag(), to, 6, newer, 0, 1000)
	wc := waitWC(t, b.cq, 1)[0]
	if wc.MSN != 6 || wc.Partial || !bytes.Equal(region.Bytes()[:2000], newer) {
		t.Fatalf("%+v", wc)
	}
	// Nothing else recorded (message 5 discarded): b read and handled
	// all four segments, the straggler counted as dropped.
	quietUntil(t, b.cq, b.sock, "the four segments read", func() bool { return b.dev.Stats().RxDatagrams.Load() >= 4 })
	if n := b.dev.Stats().RxWRStale.Load(); n != 1 {
		t.Fatalf("%d stragglers counted, want 1", n)
	}
}

func TestWriteRecordBadTarget(t *testing.T) {
	b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
	local, _ := b.pd.RegisterMemory(make([]byte, 4096), AccessLocalWrite) // no remote write
	otherPD, _ := b.dev.AllocPD().RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	r := newRawWR(t, b, q)
	msg := bytes.Repeat([]byte{0xAB}, 100)
	st := b.dev.Stats()
	for _, tc := range []struct {
		name    string
		stag    uint32
		to      uint64
		counter func() uint64
	}{
		{"unknown STag", 0x00ffff00, 0, st.RxBadSTag.Load},
		{"stale key", region.STag() ^ 1, region.Addr(), st.RxBadSTag.Load},
		{"region of another PD", otherPD.STag(), otherPD.Addr(), st.RxBadSTag.Load},
		{"no remote write", local.STag(), local.Addr(), st.RxAccess.Load},
		{"past the end", region.STag(), region.Addr() + uint64(region.Len()) - 50, st.RxBounds.Load},
		{"at a heap-like address", region.STag(), 0xc000000000, st.RxBounds.Load}, // regions are zero-based
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.counter()
			r.send(tc.stag, tc.to, 1, msg, 0, len(msg))
			quietUntil(t, b.cq, b.sock, "the drop counted", func() bool { return tc.counter() == before+1 })
		})
	}
	if bytes.Contains(region.Bytes(), msg[:8]) || bytes.Contains(local.Bytes(), msg[:8]) || bytes.Contains(otherPD.Bytes(), msg[:8]) {
		t.Fatal("a refused segment wrote memory")
	}
}

// TestWriteRecordManySources interleaves messages from 16 source QPs to
// one STag, each into its own slice of the region.
func TestWriteRecordManySources(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
	ah := a.ah(b, q)
	var srcs []*QP
	for range 16 {
		srcs = append(srcs, a.newQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, WriteRecordSegment: 500}))
	}
	fill(a.buf[:16*3000], 6)
	for round := range 3 {
		for i, s := range srcs {
			off := i*3000 + round*1000
			if err := s.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(off, 1000)}, AH: ah,
				RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(off)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := waitWC(t, b.cq, 48)
	seen := map[uint32]int{}
	for _, wc := range got {
		if wc.Partial || wc.Len != 1000 {
			t.Fatalf("%+v", wc)
		}
		seen[wc.SourceQPN]++
	}
	if len(seen) != 16 || !bytes.Equal(region.Bytes()[:16*3000], a.buf[:16*3000]) {
		t.Fatalf("sources %d; bytes equal %v", len(seen), bytes.Equal(region.Bytes()[:16*3000], a.buf[:16*3000]))
	}
}

func TestAggregateWriteRecords(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
	ah := a.ah(b, q)
	for _, off := range []int{0, 1000, 3000, 3500} {
		mustPost(t, a.qp.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(off, 500)}, AH: ah, RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(off)}))
	}
	wcs := waitWC(t, b.cq, 4)
	m := validitymap.New(0)
	if n, err := AggregateWriteRecords(wcs, region.STag(), region.Addr(), m); err != nil || n != 4 {
		t.Fatalf("%d %v", n, err)
	}
	want := []validitymap.Range{{Start: 0, End: 500}, {Start: 1000, End: 1500}, {Start: 3000, End: 4000}}
	if got := m.Snapshot(nil); !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
	if n, _ := AggregateWriteRecords(wcs, region.STag()+1, region.Addr(), validitymap.New(0)); n != 0 {
		t.Fatal("another STag's entries were used")
	}
}

// TestWriteRecordDeregisterInProgress deregisters the target region while
// a message is half placed: the rest is refused, and nothing is recorded.
func TestWriteRecordDeregisterInProgress(t *testing.T) {
	b, region, q := wrTarget(t, writerecord.Config{Timeout: 20 * time.Millisecond, Policy: writerecord.DeliverPartial}, RecordCQ)
	r := newRawWR(t, b, q)
	msg := make([]byte, 2000)
	r.send(region.STag(), region.Addr(), 1, msg, 0, 1000)
	eventually(t, "the first half placed", func() bool { return b.dev.Stats().RxWRPlaced.Load() == 1 })
	if err := region.Deregister(); err != nil {
		t.Fatal(err)
	}
	r.send(region.STag(), region.Addr(), 1, msg, 1000, 1000)
	eventually(t, "the second half refused", func() bool { return b.dev.Stats().RxBadSTag.Load() == 1 })
	// Past the deadline: the engine ended the message (a partial record,
	// of a region that is gone), under the QP's lock, where its record
	// would have been made.
	eventually(t, "the message's deadline", func() bool { st, _ := b.dev.WriteRecordStats(); return st.Partial+st.Expired > 0 })
	noCompletion(t, b.cq)
}

// TestWriteRecordGSO sends a message of many small segments from one SGE:
// the source batches them with UDP GSO, the target's GRO hands them over
// in merged reads, and the message arrives byte-exact.
func TestWriteRecordGSO(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	src := a.newQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, WriteRecordSegment: 1000})
	b, region, q := wrTarget(t, writerecord.Config{}, RecordCQ)
	const size = 200_000 + 123
	fill(a.buf[:size], 3)
	for msg := 1; msg <= 5; msg++ {
		off := (msg - 1) * size // each message to its own bytes (see TestWriteRecordEndToEnd)
		if err := src.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(0, size)}, AH: a.ah(b, q),
			RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(off)}); err != nil {
			t.Fatal(err)
		}
		wc := waitWC(t, b.cq, 1)[0]
		if wc.Partial || wc.Len != size || wc.MSN != uint32(msg) || !bytes.Equal(region.Bytes()[off:off+size], a.buf[:size]) {
			t.Fatalf("message %d: %+v", msg, wc)
		}
	}
	segs := uint64(5 * ((size + 999) / 1000))
	if got := b.dev.Stats().RxWRPlaced.Load(); got != segs {
		t.Fatalf("placed %d segments, want %d", got, segs)
	}
	if a.dev.Stats().TxGSO.Load() == 0 {
		t.Log("the kernel took no UDP GSO send; segments went one at a time")
	}
}

// TestRecordModeBits: each record mode is a bit of its own, so
// RecordCQ|RecordMap records both ways (RecordCQ was 0, and the
// combination a new user wrote was RecordMap alone: no CQ entry); the
// zero value is RecordCQ; bits that are no mode are refused.
func TestRecordModeBits(t *testing.T) {
	if RecordCQ|RecordMap != RecordBoth {
		t.Fatalf("RecordCQ|RecordMap = %#x, RecordBoth %#x", RecordCQ|RecordMap, RecordBoth)
	}
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	for _, tc := range []struct {
		name     string
		mode     RecordMode
		cq, vmap bool
	}{
		{"zero value", 0, true, false},
		{"RecordCQ", RecordCQ, true, false},
		{"RecordMap", RecordMap, false, true},
		{"RecordCQ|RecordMap", RecordCQ | RecordMap, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, region, q := wrTarget(t, writerecord.Config{}, tc.mode)
			vm := region.TrackValidity(0)
			if err := a.qp.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(0, 3000)}, AH: a.ah(b, q), RemoteSTag: region.STag(), RemoteTO: region.Addr()}); err != nil {
				t.Fatal(err)
			}
			if tc.cq {
				if wc := collect(t, b.cq, 1, 5*time.Second)[0]; wc.Opcode != WCWriteRecord || wc.Status != Success || wc.Len != 3000 {
					t.Fatalf("%+v", wc)
				}
			}
			if tc.vmap {
				eventually(t, "the map to show the message", func() bool { return vm.Valid(0, 3000) })
			}
			if !tc.cq {
				// The map was filled where the entry would have been made;
				// b has read and handled everything a sent.
				quietDrained(t, b.cq, a, b)
			}
			if !tc.vmap && vm.Bytes() != 0 {
				t.Fatalf("the map holds %d bytes with %v", vm.Bytes(), tc.name)
			}
		})
	}
	_, err := a.pd.CreateQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, Record: 1 << 2})
	if !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("Record 1<<2: %v, want ErrInvalidAttr", err)
	}
}
