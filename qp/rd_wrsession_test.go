package qp

import (
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/writerecord"
)

// TestRDWriteRecordNewSession: an RD source that forgets its peer (here
// reclaimed idle) numbers its Write-Records to the peer from 1 again in
// the new session, while the target's engine still remembers the old
// session's last message of that STag (its deadline is an hour). The new
// session's messages must be placed and recorded, and complete Success:
// a new session ends the old one's Write-Record state at the target.
// Before, they were dropped as an older message's and completed
// RemoteOperationError.
func TestRDWriteRecordNewSession(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	rd := RDConfig{IdleTimeout: time.Hour, Segment: 1024} // three segments a message: the target remembers it
	qa := a.newQP(QPAttr{Type: RD, SendCQ: a.cq, RecvCQ: a.cq, RD: rd})
	qb := b.newQP(QPAttr{Type: RD, SendCQ: b.cq, RecvCQ: b.cq, RD: rd,
		WriteRecord: writerecord.Config{Timeout: time.Hour}, Record: RecordCQ})
	region, err := b.pd.RegisterMemory(make([]byte, 1<<16), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	ah := a.ah(b, qb)
	id := uint64(0)
	write := func(k int) {
		t.Helper()
		for i := range k {
			id++
			copy(a.buf[:8], []byte{byte(id), 1, 2, 3, 4, 5, 6, 7})
			if err := qa.PostSend(&SendWR{ID: id, Flags: FlagSignaled, Opcode: OpWriteRecord, SGL: []SGE{a.mr.SGE(0, 3000)},
				AH: ah, RemoteSTag: region.STag(), RemoteTO: region.Addr() + uint64(i)*4096}); err != nil {
				t.Fatal(err)
			}
			if wc := collect(t, a.cq, 1, time.Minute)[0]; wc.ID != id || wc.Status != Success {
				t.Fatalf("Write-Record %d: %+v", id, wc)
			}
			if rec := collect(t, b.cq, 1, time.Minute)[0]; rec.Opcode != WCWriteRecord || rec.Status != Success || rec.Len != 3000 ||
				rec.TO != uint64(i)*4096 {
				t.Fatalf("Write-Record %d recorded as %+v", id, rec)
			}
		}
	}
	write(3)
	setIdleTimeout(qa, time.Millisecond)
	eventually(t, "a reclaiming b", func() bool { return !hasPeer(qa, b, qb) })
	setIdleTimeout(qa, time.Hour)
	if !hasPeer(qb, a, qa) {
		t.Fatal("b dropped a too")
	}
	write(3) // a new session, MSNs from 1 again
}
