package qp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCloseWhileLanding closes an event-mode device while its receive
// loop lands a stream of large Sends in posted receives (iovecs into the
// registered memory) and a goroutine reposts each receive as it
// completes: Close returns, every posted receive completes exactly once,
// whole and correct or flushed, no memory stays pinned (Deregister
// returns), and landing did happen. Many rounds, each bounded.
func TestCloseWhileLanding(t *testing.T) {
	const (
		rounds = 12
		depth  = 128
		slot   = 4096
		size   = 3000 // above landBigMin: single reads land in place
		kinds  = 64   // distinct messages the sender cycles through
	)
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	for k := range kinds {
		msg := a.buf[k*size : (k+1)*size]
		fill(msg, k)
		binary.LittleEndian.PutUint32(msg, uint32(k))
	}
	landed := uint64(0)
	for round := range rounds {
		dev, err := Open(DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		sock, err := dev.Bind("udp4", "127.0.0.1:0")
		if err != nil {
			dev.Close()
			t.Fatal(err)
		}
		pd := dev.AllocPD()
		buf := make([]byte, depth*slot)
		mr, err := pd.RegisterMemory(buf, AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		cq, _ := dev.CreateCQ(2 * depth)
		q, err := pd.CreateQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, Caps: QPCaps{MaxRecvWR: depth, MaxSendWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Activate(sock); err != nil {
			t.Fatal(err)
		}
		posted := 0
		for i := range depth {
			if err := q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{mr.SGE(i*slot, slot)}}); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		ah := a.ah(&node{t: t, sock: sock}, q)

		// The sender streams until told to stop.
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			wcs := make([]WorkCompletion, 64)
			out := 0
			for i := 0; !stop.Load() && i < 1_000_000; i++ {
				out -= a.cq.Poll(wcs)
				if out >= 256 {
					time.Sleep(50 * time.Microsecond)
					continue
				}
				k := i % kinds
				if err := a.qp.PostSend(&SendWR{Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(k*size, size)}, AH: ah}); err == nil {
					out++
				} else if !errors.Is(err, ErrQueueFull) {
					t.Error(err)
					return
				}
			}
			for deadline := time.Now().Add(10 * time.Second); out > 0 && time.Now().Before(deadline); {
				if n := a.cq.Poll(wcs); n > 0 {
					out -= n
				} else {
					time.Sleep(100 * time.Microsecond)
				}
			}
		}()

		// The receiver checks and reposts; after enough completions (the
		// loop lands by then) the device closes under it.
		var completed, flushed int
		seen := map[uint64]bool{}
		wcs := make([]WorkCompletion, 32)
		closed := false
		var closeErr error
		deadline := time.Now().Add(20 * time.Second)
		for completed+flushed < posted || !closed {
			if time.Now().After(deadline) {
				stop.Store(true)
				wg.Wait()
				t.Fatalf("round %d: %d posted, %d completed, %d flushed, closed %v", round, posted, completed, flushed, closed)
			}
			if !closed && completed >= 2*depth {
				landed += dev.Stats().RxLanded.Load()
				closeErr = dev.Close()
				closed = true
			}
			n := cq.Poll(wcs)
			if n == 0 {
				time.Sleep(50 * time.Microsecond)
				continue
			}
			for _, wc := range wcs[:n] {
				if seen[wc.ID] {
					t.Fatalf("round %d: receive %d completed twice", round, wc.ID)
				}
				seen[wc.ID] = true
				switch wc.Status {
				case WRFlushError:
					flushed++
					continue
				case Success:
				default:
					t.Fatalf("round %d: %+v", round, wc)
				}
				completed++
				off := int(wc.ID%depth) * slot
				got := buf[off : off+int(wc.Len)]
				k := int(binary.LittleEndian.Uint32(got))
				if wc.Len != size || k >= kinds || !bytes.Equal(got, a.buf[k*size:(k+1)*size]) {
					t.Fatalf("round %d: receive %d holds a wrong message (%d bytes)", round, wc.ID, wc.Len)
				}
				id := wc.ID + depth
				if err := q.PostRecv(&RecvWR{ID: id, SGL: []SGE{mr.SGE(off, slot)}}); err == nil {
					posted++
				} else if !closed {
					t.Fatalf("round %d: repost before Close: %v", round, err)
				}
			}
		}
		stop.Store(true)
		wg.Wait()
		if closeErr != nil {
			t.Fatal(closeErr)
		}
		done := make(chan error, 1)
		go func() { done <- mr.Deregister() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: Deregister after Close: %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Deregister after Close hangs: the region stayed pinned", round)
		}
	}
	if landed == 0 {
		t.Fatalf("no receive landed in place in %d rounds: the test did not exercise landing", rounds)
	}
	t.Logf("%d receives landed in place before the closes", landed)
}
