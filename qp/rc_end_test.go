package qp

import (
	"bytes"
	"errors"
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

// TestRCCompleteOnAckFlag: a WR with FlagCompleteOnAck completes only
// once the peer's TCP acknowledged its last byte, while the WRs around it
// complete when TCP took them; other QP types refuse the flag. b, on a
// descriptor with a small receive buffer, reads only when the test calls
// its Progress: what a sends meanwhile is taken by a's TCP but not
// acknowledged.
func TestRCCompleteOnAckFlag(t *testing.T) {
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	l, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(l)
	// Inherited by the accepted socket, before its window is offered.
	if err := unix.SetsockoptInt(l, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(l, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(l, 1); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(l)
	fa, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fa) })
	if err := unix.Connect(fa, sa); err != nil {
		t.Fatal(err)
	}
	fb, _, err := unix.Accept4(l, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fb) })
	done := make(chan error, 1)
	go func() {
		_, err := a.q.ConnectFD(fa, RCConfig{})
		done <- err
	}()
	if _, err := b.q.AcceptFD(fb, RCConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	const size = 32 << 10 // beyond b's window, within a's send buffer
	for i := range 2 {
		if err := b.q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*size, size)}}); err != nil {
			t.Fatal(err)
		}
	}
	progressUntil(t, b.q, "b reads a's RTR", func() bool { return b.dev.stats.RxBytes.Load() == a.dev.stats.TxBytes.Load() })

	fill(a.buf[:size], 7)
	if err := a.q.PostSend(&SendWR{ID: 1, Flags: FlagSignaled | FlagCompleteOnAck, SGL: []SGE{a.mr.SGE(0, size)}}); err != nil {
		t.Fatal(err)
	}
	ca := a.q.rc.Load()
	eventually(t, "a's TCP to take the Send", func() bool {
		ca.mu.Lock()
		defer ca.mu.Unlock()
		return len(ca.queue) == 0 && len(ca.rest) == 0
	})
	if out, err := unix.IoctlGetInt(fa, unix.SIOCOUTQ); err != nil || out == 0 {
		t.Fatalf("a's socket holds %d unacknowledged bytes (%v): the test did not reach the path", out, err)
	}
	ca.mu.Lock()
	ca.completeLocked()
	ca.mu.Unlock()
	var wc [1]WorkCompletion
	if a.cq.Poll(wc[:]) != 0 {
		t.Fatalf("completed before the peer acknowledged it: %+v", wc[0])
	}
	// b reads: the Send lands, a's TCP hears so, the WR completes.
	var got []WorkCompletion
	progressUntil(t, b.q, "b to receive the Send", func() bool {
		var w [4]WorkCompletion
		n := b.cq.Poll(w[:])
		got = append(got, w[:n]...)
		return len(got) > 0
	})
	if got[0].ID != 0 || got[0].Status != Success || got[0].Len != size || !bytes.Equal(b.buf[:size], a.buf[:size]) {
		t.Fatalf("b's receive: %+v", got[0])
	}
	if wc := collect(t, a.cq, 1, 20*time.Second)[0]; wc.ID != 1 || wc.Status != Success || wc.Len != size {
		t.Fatalf("the Send: %+v", wc)
	}
	if out, err := unix.IoctlGetInt(fa, unix.SIOCOUTQ); err != nil || out != 0 {
		t.Fatalf("completed with %d bytes unacknowledged (%v)", out, err)
	}
	// An unflagged Send completes as TCP takes it, as before.
	if err := a.q.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, Inline: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if wc := collect(t, a.cq, 1, 20*time.Second)[0]; wc.ID != 2 || wc.Status != Success {
		t.Fatalf("the second Send: %+v", wc)
	}

	n, m := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0"), newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	if err := n.qp.PostSend(&SendWR{Flags: FlagCompleteOnAck, Inline: []byte("x"), AH: n.ah(m, m.qp)}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("FlagCompleteOnAck on a UD QP: %v", err)
	}
}
