package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
)

func TestRDRead(t *testing.T) {
	p := newRDPair(t, DeviceConfig{}, DeviceConfig{}, RDConfig{})
	src, err := p.b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	fill(src.Bytes(), 42)
	sink, err := p.a.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	noRead, _ := p.b.pd.RegisterMemory(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	for i, tc := range []struct {
		off, size int
		stag      uint32
		want      Status
	}{
		{0, 0, 0, Success}, // zero length: no STag needed
		{100, 1000, src.STag(), Success},
		{5000, 70000, src.STag(), Success},       // two responses
		{200000, 700 << 10, src.STag(), Success}, // many
		{0, 10, noRead.STag(), RemoteAccessError},
		{0, 10, src.STag() ^ 0x01, RemoteAccessError},
		{1<<20 - 5, 10, src.STag(), RemoteAccessError}, // past the end
	} {
		dst := i * 16 // each Read to its own sink bytes
		if tc.size > 1000 {
			dst = 100000
		}
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(dst, tc.size)}, AH: p.ahAB,
			RemoteSTag: tc.stag, RemoteTO: src.Addr() + uint64(tc.off)}); err != nil {
			t.Fatal(err)
		}
		wc := collect(t, p.cqa, 1, 5*time.Second)[0]
		if wc.ID != uint64(i) || wc.Status != tc.want || wc.Opcode != WCRDMARead {
			t.Fatalf("case %d: %+v, want %v", i, wc, tc.want)
		}
		if tc.want == Success && !bytes.Equal(sink.Bytes()[dst:dst+tc.size], src.Bytes()[tc.off:tc.off+tc.size]) {
			t.Fatalf("case %d: the sink differs from the source", i)
		}
	}
	// A sink without remote-write access is refused locally.
	local, _ := p.a.pd.RegisterMemory(make([]byte, 64), AccessLocalWrite)
	mustPost(t, p.qa.PostSend(&SendWR{ID: 99, Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{local.SGE(0, 64)}, AH: p.ahAB, RemoteSTag: src.STag(), RemoteTO: src.Addr()}))
	if wc := collect(t, p.cqa, 1, time.Second)[0]; wc.Status != LocalProtectionError {
		t.Fatalf("%+v", wc)
	}
	noCompletion(t, p.cqb) // the responder completes nothing: it answered every Read
}

// TestRDReadIRD: a responder serves at most IRD Reads at once (responses
// not yet all sent: here a window of 4 segments holds them back); the
// rest are refused with a remote operation error, and served ones are
// intact.
func TestRDReadIRD(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	qa, cqa := rdQPOn(t, a, RDConfig{ORD: 8})
	qb, _ := rdQPOn(t, b, RDConfig{IRD: 1, Segment: 4000, Config: reliability.Config{Window: 4}})
	src, _ := b.pd.RegisterMemory(make([]byte, 8*65536), AccessLocalWrite|AccessRemoteRead)
	fill(src.Bytes(), 3)
	sink, _ := a.pd.RegisterMemory(make([]byte, 8*65536), AccessLocalWrite|AccessRemoteWrite)
	ah := a.ah(b, qb)
	for i := range 8 {
		mustPost(t, qa.PostSend(&SendWR{ID: uint64(i), Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{sink.SGE(i*65536, 65536)}, AH: ah,
			RemoteSTag: src.STag(), RemoteTO: src.Addr() + uint64(i*65536)}))
	}
	refused := 0
	for _, wc := range collect(t, cqa, 8, 5*time.Second) {
		switch wc.Status {
		case Success:
			i := int(wc.ID)
			if !bytes.Equal(sink.Bytes()[i*65536:(i+1)*65536], src.Bytes()[i*65536:(i+1)*65536]) {
				t.Fatalf("read %d differs", i)
			}
		case RemoteOperationError:
			refused++
		default:
			t.Fatalf("%+v", wc)
		}
	}
	if n := b.dev.Stats().RDReadsRefused.Load(); refused == 0 || uint64(refused) != n {
		t.Fatalf("%d refused at the requester, %d at the responder", refused, n)
	}
}

// TestRDWriteRecord: Write-Record over RD, through 5 % loss both ways:
// every message completes at the source and is recorded whole at the
// target, because RD retransmits what was lost.
func TestRDWriteRecord(t *testing.T) {
	ia, ib := &Impairment{Seed: 5, Loss: 0.05}, &Impairment{Seed: 6, Loss: 0.05}
	p := newRDPair(t, DeviceConfig{Impair: ia}, DeviceConfig{Impair: ib}, RDConfig{Segment: 8000, Config: reliability.Config{InitialRTT: time.Millisecond}})
	region, _ := p.b.pd.RegisterMemory(make([]byte, 1<<20), AccessLocalWrite|AccessRemoteWrite)
	const msgs, size = 20, 40000
	fill(p.a.buf[:msgs*size], 8)
	for i := range msgs {
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Opcode: OpWriteRecord, Flags: FlagSignaled, SGL: []SGE{p.a.mr.SGE(i*size, size)}, AH: p.ahAB,
			RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(i*size)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, wc := range collect(t, p.cqa, msgs, 10*time.Second) {
		if wc.Status != Success || wc.Opcode != WCWriteRecord {
			t.Fatalf("source: %+v", wc)
		}
	}
	for _, wc := range collect(t, p.cqb, msgs, 5*time.Second) {
		i := int(wc.TO-region.Addr()) / size
		if wc.Opcode != WCWriteRecord || wc.Partial || wc.Len != size || wc.SourceQPN != p.qa.QPN() ||
			!bytes.Equal(region.Bytes()[i*size:(i+1)*size], p.a.buf[i*size:(i+1)*size]) {
			t.Fatalf("target: %+v", wc)
		}
	}
	if ia.Dropped.Load() == 0 {
		t.Fatal("nothing was lost: the test did not test")
	}
}
