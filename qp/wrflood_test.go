package qp

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/writerecord"
	"golang.org/x/net/ipv4"
)

// TestWriteRecordFlood sends a target a flood of first segments of
// two-segment messages, each from a new source (QP number) with its own
// MSN, so every one would start a message in progress; among them a
// legitimate peer on another address writes two-segment messages. The
// in-progress table must stay at its cap and every legitimate message
// must complete. The flood is paced by what the target has read, so the
// kernel drops nothing and each loss would be the stack's.
func TestWriteRecordFlood(t *testing.T) {
	total := 1_000_000
	if testing.Short() || raceEnabled {
		total = 100_000
	}
	const maxMessages = 4096
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	region, err := b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, WriteRecord: writerecord.Config{MaxMessages: maxMessages}})
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
	const batch = 256
	msgs := make([]ipv4.Message, batch)
	payload := make([]byte, 64)
	start := time.Now()
	sent, rounds := 0, 0
	const legitSize = 1000
	for sent < total {
		for i := range msgs {
			k := uint32(sent + i)
			msgs[i].Buffers = [][]byte{wrDatagram(q.QPN(), k%(1<<24)+1, region.STag(), region.Addr(), k, append(payload, payload...), 0, len(payload), false)}
			msgs[i].Addr = dst
		}
		for off := 0; off < batch; {
			n, err := pc.WriteBatch(msgs[off:], 0)
			if err != nil {
				t.Fatal(err)
			}
			off += n
		}
		sent += batch
		// One legitimate message per round, to its own bytes.
		off := (rounds % 512) * legitSize
		fill(a.buf[off:off+legitSize], rounds)
		if err := legit.PostSend(&SendWR{Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(off, legitSize)}, AH: ah,
			RemoteSTag: region.STag(), RemoteTO: region.Addr() + 100000 + uint64(off)}); err != nil {
			t.Fatal(err)
		}
		rounds++
		wc := waitWC(t, b.cq, 1)[0]
		if wc.Status != Success || wc.Partial || wc.SourceQPN != legit.QPN() || wc.Len != legitSize ||
			!bytes.Equal(region.Bytes()[100000+off:100000+off+legitSize], a.buf[off:off+legitSize]) {
			t.Fatalf("legitimate message %d: %+v", rounds, wc)
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("only %d of %d datagrams in 60 s", sent, total)
		}
	}
	eventually(t, "the flood to be read", func() bool { return b.dev.Stats().RxWRPlaced.Load() >= uint64(sent+2*rounds) })
	q.wrMu.Lock()
	inProgress, st := q.wr.InProgress(), q.wr.Stats()
	q.wrMu.Unlock()
	el := time.Since(start)
	t.Logf("%d flood segments and %d legitimate messages in %v (%.0f datagrams/s); in progress %d (cap %d), evicted %d, completed %d",
		sent, rounds, el.Round(time.Millisecond), float64(sent+2*rounds)/el.Seconds(), inProgress, maxMessages, st.Evicted, st.Completed)
	if inProgress > maxMessages || st.Evicted < uint64(sent-maxMessages) || st.Completed != uint64(rounds) {
		t.Fatalf("in progress %d, evicted %d, completed %d", inProgress, st.Evicted, st.Completed)
	}
}
