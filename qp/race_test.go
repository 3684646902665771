package qp

import (
	"sync"
	"testing"
)

// TestDeregisterWhileSending deregisters regions that sends are reading
// through two SGEs each: Deregister must neither deadlock nor return while
// a copy still runs, and every send completes.
func TestDeregisterWhileSending(t *testing.T) {
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	ah := a.ah(b, b.qp)
	const rounds = 200
	sent := 0
	for range rounds {
		m, err := a.pd.RegisterMemory(make([]byte, 8192), AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.Deregister()
		}()
		if err := a.qp.PostSend(&SendWR{SGL: []SGE{m.SGE(0, 4000), m.SGE(4000, 4000)}, AH: ah, Flags: FlagSignaled}); err != nil {
			t.Fatal(err)
		}
		sent++
		wg.Wait()
	}
	for _, wc := range waitWC(t, a.cq, sent) {
		if wc.Status != Success && wc.Status != LocalProtectionError {
			t.Fatalf("%+v", wc)
		}
	}
}

// TestSTagNeverRepeats reuses one table slot many times: each STag must
// differ from the one before it, so a stale STag never reaches new memory.
func TestSTagNeverRepeats(t *testing.T) {
	d, _ := Open(DeviceConfig{MaxMR: 1})
	defer d.Close()
	pd := d.AllocPD()
	prev := uint32(0)
	for range 2000 {
		m, err := pd.RegisterMemory(make([]byte, 1), AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if m.STag() == prev {
			t.Fatalf("STag %#x reused at once", prev)
		}
		prev = m.STag()
		m.Deregister()
	}
}

// TestPostRacingFlush posts receives while another goroutine moves the QP
// to ERROR: every receive that was accepted completes, none is lost.
func TestPostRacingFlush(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	for range 20 {
		cq, _ := n.dev.CreateCQ(4096)
		q := n.newQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, Caps: QPCaps{MaxRecvWR: 2048}})
		var wg sync.WaitGroup
		posted := 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.Modify(ModifyAttr{State: StateError})
		}()
		for i := range 300 {
			if err := q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{n.mr.SGE(0, 10)}}); err == nil {
				posted++
			}
		}
		wg.Wait()
		if got := len(waitWC(t, cq, posted)); got != posted {
			t.Fatalf("%d of %d receives completed", got, posted)
		}
		// None twice, none more: the flush and the posts are done (Modify
		// and PostRecv returned), and they complete in the caller.
		noCompletion(t, cq)
		q.Destroy()
	}
}
