package qp

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRCWriteFailureStillReads: a connection whose write fails (the peer
// reset it) is failed by its reader once it has read what the socket
// still holds — the poller's turn at the room a failed socket reports
// must not close it first. It did (onWritable shut down a connection
// dead by a failed write): the reader then never read again, the QP
// stayed in RTS with its receives posted, and the messages that had
// arrived before the reset were never completed — a socketshim RCConn
// Read waited for them for good (issue 30 item 11, BasicIO's hang).
// Holding b's receive side is what a CQ spinner in onReadable does when
// the poller's turn comes.
func TestRCWriteFailureStillReads(t *testing.T) {
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	rcConnect(t, a, b, RCConfig{}, RCConfig{})
	ca, cb := a.q.rc.Load(), b.q.rc.Load()
	const n = 4
	for i := range n {
		if err := b.q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*256, 256)}}); err != nil {
			t.Fatal(err)
		}
	}
	// b has read a's RTR (its own sends wait for it) and everything else.
	eventually(t, "b to read a's RTR", func() bool {
		cb.mu.Lock()
		defer cb.mu.Unlock()
		return !cb.rtrPending && b.dev.stats.RxBytes.Load() == a.dev.stats.TxBytes.Load()
	})

	cb.rxMu.Lock() // b's reader is busy: what a sends now stays in b's socket
	held := true
	defer func() {
		if held {
			cb.rxUnlock()
		}
	}()
	msg := make([]byte, 100)
	for i := range n {
		msg[0] = byte(i)
		if err := a.q.PostSend(&SendWR{ID: uint64(i), Inline: msg}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "a's messages in b's socket", func() bool {
		inq, err := unix.IoctlGetInt(cb.fd, unix.SIOCINQ)
		return err == nil && uint64(inq)+b.dev.stats.RxBytes.Load() == a.dev.stats.TxBytes.Load()
	})
	// a resets the connection (SO_LINGER 0, then close).
	if err := unix.SetsockoptLinger(ca.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		t.Fatal(err)
	}
	a.dev.Close()
	eventually(t, "the reset at b", func() bool {
		p := []unix.PollFd{{Fd: int32(cb.fd), Events: unix.POLLIN}}
		k, err := unix.Poll(p, 10)
		return err == nil && k == 1 && p[0].Revents&unix.POLLERR != 0
	})
	// b's next write fails (taking the socket's error with it).
	if err := b.q.PostSend(&SendWR{ID: 99, Inline: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	cb.mu.Lock()
	dead := cb.dead
	cb.mu.Unlock()
	if !dead {
		t.Fatal("b's write after the reset did not fail: the test did not reach the path")
	}
	cb.onWritable() // the poller's turn: the failed socket reports room
	held = false
	cb.rxUnlock()

	// What arrived before the reset completes, then the QP fails and
	// flushes the failed Send.
	wcs := collect(t, b.cq, n+1, 20*time.Second)
	for i, wc := range wcs[:n] {
		if wc.ID != uint64(i) || wc.Status != Success || wc.Opcode != WCRecv || wc.Len != 100 || b.buf[i*256] != byte(i) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	if wc := wcs[n]; wc.ID != 99 || wc.Status != WRFlushError {
		t.Fatalf("the failed Send: %+v", wc)
	}
	waitState(t, b.q, StateError)
	if b.dev.stats.RCConnectionsLost.Load() != 1 {
		t.Fatalf("RCConnectionsLost %d, want 1", b.dev.stats.RCConnectionsLost.Load())
	}
}
