package qp

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/writerecord"
	"golang.org/x/net/ipv4"
)

// wrHandled is how many Write-Record segments the target's engine has
// decided on (placed or dropped).
func wrHandled(n *node) uint64 {
	st := n.dev.Stats()
	return st.RxWRPlaced.Load() + st.RxWRStale.Load()
}

// waitRecords collects Write-Record completions from cq until one with
// MSN last arrives. The bound only ends a hung test: with the 60 s
// deadline the target is given, a flow the stack blocks stays blocked
// for minutes, and a flow it serves is recorded in milliseconds.
func waitRecords(t *testing.T, cq *CQ, last uint32) map[uint32]WorkCompletion {
	t.Helper()
	got := map[uint32]WorkCompletion{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wcs := make([]WorkCompletion, 16)
	for {
		n := cq.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Opcode != WCWriteRecord {
				continue
			}
			if _, dup := got[wc.MSN]; dup {
				t.Fatalf("message %d recorded twice", wc.MSN)
			}
			got[wc.MSN] = wc
		}
		if _, ok := got[last]; ok {
			return got
		}
		if n == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("waiting for the record of message %d, have %d records: %v", last, len(got), err)
			}
		}
	}
}

// TestWriteRecordSpoofedFarAheadMSN forges, from the legitimate source's
// address and QP number, one segment of a multi-segment message whose MSN
// is 2^20 ahead, to a UD Write-Record target whose messages may take 60 s.
// Before the fix that one datagram superseded the source's state and the
// source's next messages were dropped as stale for two deadlines (two
// minutes here). Now a segment more than MSNWindow ahead of the message
// holding the key is dropped; and when no state exists for the forgery to
// be measured against, the source's own messages end it after two.
func TestWriteRecordSpoofedFarAheadMSN(t *testing.T) {
	sp := spoof.NewT(t)
	const size, seg = 1000, 500
	for _, tc := range []struct {
		name string
		// first: legitimate messages recorded before the forgery.
		first int
		// lost: of the messages after it, how many may be lost at most.
		lost int
	}{
		{"after a message", 1, 0},
		{"before any message", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
			src := a.newQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, WriteRecordSegment: seg})
			b, region, q := wrTarget(t, writerecord.Config{Timeout: 60 * time.Second}, RecordCQ)
			ah := a.ah(b, q)
			send := func(msn int) {
				off := (msn - 1) * size
				fill(a.buf[off:off+size], msn)
				if err := src.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(off, size)}, AH: ah,
					RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(off)}); err != nil {
					t.Fatal(err)
				}
			}
			for msn := 1; msn <= tc.first; msn++ {
				send(msn)
				if wc := waitWC(t, b.cq, 1)[0]; wc.MSN != uint32(msn) || wc.Partial {
					t.Fatalf("record %+v", wc)
				}
			}
			// The forgery: the first half of a message far ahead, from the
			// source's own address and QP number, into bytes of its own.
			before := wrHandled(b)
			forged := wrDatagram(q.QPN(), src.QPN(), region.STag(), region.Addr()+500_000, uint32(tc.first)+1<<20,
				make([]byte, size), 0, seg, false)
			if err := sp.Send(a.sock.LocalAddr(), b.sock.LocalAddr(), forged); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the forged segment to be handled", func() bool { return wrHandled(b) > before })

			const more = 5
			last := tc.first + more
			for msn := tc.first + 1; msn <= last; msn++ {
				send(msn)
			}
			recs := waitRecords(t, b.cq, uint32(last))
			for msn := tc.first + 1; msn <= last; msn++ {
				wc, ok := recs[uint32(msn)]
				if !ok {
					continue
				}
				off := (msn - 1) * size
				if wc.Status != Success || wc.Partial || wc.Len != size || wc.TO != region.Addr()+uint64(off) ||
					!bytes.Equal(region.Bytes()[off:off+size], a.buf[off:off+size]) {
					t.Fatalf("record of message %d: %+v", msn, wc)
				}
			}
			if lost := more - len(recs); lost > tc.lost {
				t.Fatalf("%d of the %d messages after the forgery lost (at most %d may be): records %v", lost, more, tc.lost, keys(recs))
			}
			wst, _ := b.dev.WriteRecordStats()
			t.Logf("engine: %+v", wst)
		})
	}
}

func keys(m map[uint32]WorkCompletion) []uint32 {
	var out []uint32
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestWriteRecordTinySegmentFlood floods one QP of a target with 80 000
// one-byte segments of one message, none touching another, in random
// order, while a legitimate source writes messages to another QP on the
// same socket. Before the fix each segment cost a copy of the message's
// whole run list on the receive goroutine (80 000 cost seconds, and an
// unpaced stream made the kernel drop the other QP's datagrams). The
// flood is paced by what the target has read, so that nothing is lost to
// the kernel and what is asserted is counts, not rates: every legitimate
// message is recorded, and the flooded message ends at MaxRanges with one
// partial record of exactly the runs that arrived, after which each of
// its segments is dropped.
func TestWriteRecordTinySegmentFlood(t *testing.T) {
	total := 80_000
	if testing.Short() || raceEnabled {
		total = 20_000
	}
	const maxRanges = 1024
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	region, err := b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	floodCQ, err := b.dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	flooded := b.newQP(QPAttr{Type: UD, SendCQ: floodCQ, RecvCQ: floodCQ, WriteRecord: writerecord.Config{Policy: writerecord.DeliverPartial, MaxRanges: maxRanges}})
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq})
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.2:0")
	legit := a.newQP(QPAttr{Type: UD, SendCQ: a.cq, RecvCQ: a.cq, WriteRecordSegment: 500})
	ah := a.ah(b, q)

	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 3)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc := ipv4.NewPacketConn(c)
	dst := net.UDPAddrFromAddrPort(b.sock.LocalAddr())
	const floodTO = 600_000
	msg := make([]byte, 2*total)
	order := rand.New(rand.NewPCG(7, 8)).Perm(total)
	const batch = 256
	msgs := make([]ipv4.Message, batch)
	const legitSize = 1000
	sent, rounds := 0, 0
	for sent < total {
		k := min(batch, total-sent)
		for i := range k {
			mo := 2 * order[sent+i]
			msgs[i].Buffers = [][]byte{wrDatagram(flooded.QPN(), 77, region.STag(), region.Addr()+floodTO, 1, msg, mo, 1, false)}
			msgs[i].Addr = dst
		}
		for off := 0; off < k; {
			n, err := pc.WriteBatch(msgs[off:k], 0)
			if err != nil {
				t.Fatal(err)
			}
			off += n
		}
		sent += k
		// One legitimate two-segment message per round, to its own bytes.
		off := (rounds % 256) * legitSize
		fill(a.buf[off:off+legitSize], rounds)
		if err := legit.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(off, legitSize)}, AH: ah,
			RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(off)}); err != nil {
			t.Fatal(err)
		}
		rounds++
		wc := waitWC(t, b.cq, 1)[0]
		if wc.Status != Success || wc.Partial || wc.QPN != q.QPN() || wc.MSN != uint32(rounds) || wc.Len != legitSize ||
			!bytes.Equal(region.Bytes()[off:off+legitSize], a.buf[off:off+legitSize]) {
			t.Fatalf("legitimate message %d: %+v", rounds, wc)
		}
	}
	eventually(t, "the flood to be read", func() bool { return wrHandled(b) >= uint64(total+2*rounds) })
	rxSettled(b.sock) // every segment handled: all it recorded is in floodCQ
	wcs := waitWC(t, floodCQ, 1)
	noCompletion(t, floodCQ) // one record
	wc := wcs[0]
	if wc.Opcode != WCWriteRecord || !wc.Partial || wc.MSN != 1 || wc.SourceQPN != 77 || len(wc.Valid) != maxRanges {
		t.Fatalf("flooded message's record: partial %v, MSN %d, %d runs (want %d)", wc.Partial, wc.MSN, len(wc.Valid), maxRanges)
	}
	for i, r := range wc.Valid {
		if r.Len() != 1 || (r.Start-region.Addr()-floodTO)%2 != 0 || i > 0 && r.Start <= wc.Valid[i-1].Start {
			t.Fatalf("run %d: %+v", i, r)
		}
	}
	flooded.wrMu.Lock()
	st := flooded.wr.Stats()
	flooded.wrMu.Unlock()
	if st.Fragmented != 1 || st.Partial != 1 || st.Duplicate != uint64(total-maxRanges-1) {
		t.Fatalf("flooded QP's engine: %+v", st)
	}
	t.Logf("%d flood segments, %d legitimate messages; engine %+v", total, rounds, st)
}
