package qp

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// tcpFDs returns the two ends of a loopback TCP connection as plain
// descriptors, closed when the test ends.
func tcpFDs(t *testing.T) (client, server int) {
	t.Helper()
	l, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(l)
	if err := unix.Bind(l, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(l, 1); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(l)
	if client, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(client, sa); err != nil {
		t.Fatal(err)
	}
	if server, _, err = unix.Accept4(l, unix.SOCK_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(client); unix.Close(server) })
	return client, server
}

// fdPair runs MPA's exchange on a fresh TCP connection's descriptors:
// a's QP the initiator, b's the responder, both WaitForRecv.
func fdPair(t *testing.T, a, b *rcSide) (ca, cb int) {
	t.Helper()
	ca, cb = tcpFDs(t)
	done := make(chan error, 1)
	go func() {
		pd, err := a.q.ConnectFD(ca, RCConfig{WaitForRecv: true, PrivateData: []byte("hello")})
		if err == nil && string(pd) != "welcome" {
			err = errors.New("reply private data " + string(pd))
		}
		done <- err
	}()
	pd, err := b.q.AcceptFD(cb, RCConfig{WaitForRecv: true, PrivateData: []byte("welcome")})
	if err != nil {
		t.Fatal(err)
	}
	if string(pd) != "hello" {
		t.Fatalf("request private data %q", pd)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return ca, cb
}

// progressUntil calls q.Progress until cond holds, for at most 5 s.
func progressUntil(t *testing.T, q *QP, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 5 s", what)
		}
		q.Progress()
		time.Sleep(100 * time.Microsecond)
	}
}

// An RC connection on the caller's descriptors: nothing reads it but
// Progress; a Send that finds no receive waits for one (WaitForRecv),
// counted, with the connection left up, and lands once one is posted;
// the peer's FIN is PeerClosed, not an error.
func TestRCOnDescriptor(t *testing.T) {
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	ca, _ := fdPair(t, a, b)
	msgs := [][]byte{bytes.Repeat([]byte{1}, 1000), bytes.Repeat([]byte{2}, 70000), bytes.Repeat([]byte{3}, 10)}
	for i, m := range msgs {
		off := 100000 * i
		copy(a.buf[off:], m)
		if err := a.q.PostSend(&SendWR{ID: uint64(i), Opcode: OpSend, SGL: []SGE{a.mr.SGE(off, len(m))}}); err != nil {
			t.Fatal(err)
		}
	}
	// One receive of 100 KB: the first Send takes it, the second waits.
	if err := b.q.PostRecv(&RecvWR{ID: 0, SGL: []SGE{b.mr.SGE(0, 100000)}}); err != nil {
		t.Fatal(err)
	}
	waits := b.dev.Stats().RCRecvWaits.Load()
	var wcs [4]WorkCompletion
	var got []WorkCompletion
	poll := func() { got = append(got, wcs[:b.cq.Poll(wcs[:])]...) }
	progressUntil(t, b.q, "the first Send and a wait for a receive", func() bool {
		poll()
		return len(got) == 1 && b.dev.Stats().RCRecvWaits.Load() > waits
	})
	if got[0].Status != Success || got[0].Len != 1000 || !bytes.Equal(b.buf[:1000], msgs[0]) {
		t.Fatalf("first: %+v", got[0])
	}
	if b.q.State() != StateRTS {
		t.Fatalf("the QP went to %v: a Send with no receive must wait", b.q.State())
	}
	// Nothing lands without a receive, however often Progress runs.
	for range 20 {
		b.q.Progress()
	}
	if poll(); len(got) != 1 {
		t.Fatalf("%d completions with no receive posted", len(got))
	}
	for i := range 2 {
		if err := b.q.PostRecv(&RecvWR{ID: uint64(1 + i), SGL: []SGE{b.mr.SGE(100000*(1+i), 100000)}}); err != nil {
			t.Fatal(err)
		}
	}
	progressUntil(t, b.q, "the waiting Sends", func() bool { poll(); return len(got) == 3 })
	for i, want := range []int{70000, 10} {
		wc := got[1+i]
		if wc.Status != Success || int(wc.Len) != want || !bytes.Equal(b.buf[100000*(1+i):100000*(1+i)+want], msgs[1+i]) {
			t.Fatalf("Send %d: %+v", 1+i, wc)
		}
	}
	if b.q.PeerClosed() {
		t.Fatal("PeerClosed before the peer closed")
	}
	a.q.Destroy()
	unix.Shutdown(ca, unix.SHUT_WR)
	progressUntil(t, b.q, "the peer's FIN", b.q.PeerClosed)
	if b.q.State() != StateRTS {
		t.Fatalf("the peer's FIN moved the QP to %v", b.q.State())
	}
}

// Output a full socket held back is sent by the device's poller, which
// waits on a descriptor only meanwhile: the receiver reads slowly, the
// sender never calls Progress, and every byte arrives in order.
func TestRCOnDescriptorHeldOutput(t *testing.T) {
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	ca, _ := fdPair(t, a, b)
	unix.SetsockoptInt(ca, unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10)
	const n, size = 64, 60000
	for i := range n {
		copy(a.buf[size*i:], bytes.Repeat([]byte{byte(i)}, size))
		for {
			err := a.q.PostSend(&SendWR{ID: uint64(i), Opcode: OpSend, SGL: []SGE{a.mr.SGE(size*i, size)}})
			if err == nil {
				break
			}
			if !errors.Is(err, ErrQueueFull) {
				t.Fatal(err)
			}
			// Full: let the receiver take some, as a slow reader would.
			for j := range 4 {
				mustPost(t, b.q.PostRecv(&RecvWR{ID: uint64(1000 + j), SGL: []SGE{b.mr.SGE(size*(j%8), size)}}))
			}
			b.q.Progress()
			time.Sleep(time.Millisecond)
		}
	}
	if !a.q.SendQueued() {
		t.Log("TCP took everything at once: the poller had nothing to do")
	}
	var wcs [16]WorkCompletion
	// The slow reader keeps at most 8 receives posted, one slot each: it
	// posted one each time round before, and as it spins far faster than
	// Sends arrive it filled the receive queue and its posts failed,
	// unseen.
	seen, posted := 0, 0
	for end := time.Now().Add(10 * time.Second); seen < n; {
		if time.Now().After(end) {
			t.Fatalf("%d of %d Sends arrived; sender holds output: %v", seen, n, a.q.SendQueued())
		}
		if posted-seen < 8 {
			mustPost(t, b.q.PostRecv(&RecvWR{ID: uint64(posted), SGL: []SGE{b.mr.SGE(size*(posted%8), size)}}))
			posted++
		}
		b.q.Progress()
		for _, wc := range wcs[:b.cq.Poll(wcs[:])] {
			if wc.Status != Success || wc.Len != size {
				t.Fatalf("completion %+v", wc)
			}
			seen++
		}
	}
	if a.q.SendQueued() {
		t.Fatal("output still held after every Send arrived")
	}
}

// AcceptFD on a connection whose peer speaks something else returns
// ErrNotMPA and consumes nothing; Connect and Accept refuse WaitForRecv.
func TestRCOnDescriptorNotMPA(t *testing.T) {
	b := newRCSide(t, DeviceConfig{})
	ca, cb := tcpFDs(t)
	req := []byte("GET / HTTP/1.0\r\n\r\n")
	if _, err := unix.Write(ca, req); err != nil {
		t.Fatal(err)
	}
	if _, err := b.q.AcceptFD(cb, RCConfig{Timeout: 2 * time.Second}); !errors.Is(err, ErrNotMPA) {
		t.Fatalf("AcceptFD: %v, want ErrNotMPA", err)
	}
	buf := make([]byte, 100)
	if n, err := unix.Read(cb, buf); err != nil || !bytes.Equal(buf[:n], req) {
		t.Fatalf("the plain bytes after AcceptFD: %q, %v", buf[:n], err)
	}
	if b.q.State() != StateInit {
		t.Fatalf("the QP is in %v", b.q.State())
	}
	if _, err := b.q.Connect(t.Context(), "127.0.0.1:1", RCConfig{WaitForRecv: true}); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("Connect with WaitForRecv: %v", err)
	}
}

// acceptFDWithin runs AcceptFD and fails the test if it has not returned
// within 30 s: a descriptor that must not wait is given an exchange
// timeout of 10 minutes, so an AcceptFD that waits is caught by this,
// not by a clock race.
func acceptFDWithin(t *testing.T, q *QP, fd int, cfg RCConfig) ([]byte, error) {
	t.Helper()
	type res struct {
		pd  []byte
		err error
	}
	ch := make(chan res, 1)
	go func() { pd, err := q.AcceptFD(fd, cfg); ch <- res{pd, err} }()
	select {
	case r := <-ch:
		return r.pd, r.err
	case <-time.After(30 * time.Second):
		t.Fatal("AcceptFD waited on its peer (30 s of a 10 minute exchange timeout)")
	}
	return nil, nil
}

// On a non-blocking descriptor AcceptFD never waits for its peer (issue
// 30, item 3: a peer that sent the 16-byte key and stopped held it for
// the exchange's timeout): part of the key, the key, the header without
// its private data are each ErrMPAIncomplete (EAGAIN) at once, with
// nothing read, MPARequestNeed saying what the Request needs in all; the
// rest arriving, AcceptFD answers it. On a blocking one it waits, and a
// peer that ends its side mid-Request fails it at once, not at the
// timeout.
func TestAcceptFDNonBlocking(t *testing.T) {
	const forever = 10 * time.Minute
	pd := []byte("private data of the request")
	req, err := udiwarp.AppendMPAFrame(nil, &udiwarp.MPAFrameFields{Revision: udiwarp.MPARevision2, Enhanced: true, CRC: true,
		IRDORD: udiwarp.IRDORD{PeerToPeer: true, WriteRTR: true, IRD: 4, ORD: 4}, PrivateData: pd})
	if err != nil {
		t.Fatal(err)
	}
	total := len(req)
	b := newRCSide(t, DeviceConfig{})
	ca, cb := tcpFDs(t)
	if err := unix.SetNonblock(cb, true); err != nil {
		t.Fatal(err)
	}
	sent := 0
	for _, upto := range []int{1, 9, 16, 18, 20, total - 1} {
		if _, err := unix.Write(ca, req[sent:upto]); err != nil {
			t.Fatal(err)
		}
		sent = upto
		// What the peer sent is all there before AcceptFD looks.
		eventually(t, "the bytes queued", func() bool {
			n, _, _ := unix.Recvfrom(cb, make([]byte, 1024), unix.MSG_PEEK|unix.MSG_DONTWAIT)
			return n == sent
		})
		if _, err := acceptFDWithin(t, b.q, cb, RCConfig{Timeout: forever}); !errors.Is(err, ErrMPAIncomplete) || !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("%d of %d bytes: AcceptFD %v, want ErrMPAIncomplete", sent, total, err)
		}
		want := udiwarp.MPAFrameHeaderSize
		if sent >= udiwarp.MPAFrameHeaderSize {
			want = total
		}
		if need, err := MPARequestNeed(cb); need != want || err != nil {
			t.Fatalf("%d of %d bytes: MPARequestNeed %d, %v; want %d", sent, total, need, err, want)
		}
		if b.q.State() != StateInit {
			t.Fatalf("the QP is in %v", b.q.State())
		}
	}
	if _, err := unix.Write(ca, req[sent:]); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the whole Request", func() bool { n, _ := MPARequestNeed(cb); return n == 0 })
	got, err := acceptFDWithin(t, b.q, cb, RCConfig{Timeout: forever})
	if err != nil || !bytes.Equal(got, pd) {
		t.Fatalf("AcceptFD of the whole Request: %q, %v", got, err)
	}
	unix.SetNonblock(ca, false)
	unix.SetsockoptTimeval(ca, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 30})
	rep := make([]byte, 1024)
	n, err := unix.Read(ca, rep)
	if err != nil || n < udiwarp.MPAFrameHeaderSize || string(rep[:16]) != "MPA ID Rep Frame" {
		t.Fatalf("the Reply: %q, %v", rep[:max(n, 0)], err)
	}

	// Blocking: a peer that sends the key and ends fails AcceptFD at once.
	c := newRCSide(t, DeviceConfig{})
	ca, cb = tcpFDs(t)
	unix.Write(ca, req[:16])
	unix.Shutdown(ca, unix.SHUT_WR)
	if _, err := acceptFDWithin(t, c.q, cb, RCConfig{Timeout: forever}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a Request cut short by the peer's end: %v", err)
	}
	// Blocking, the peer silent after part of its Request: the timeout.
	ca, cb = tcpFDs(t)
	unix.Write(ca, req[:20])
	if _, err := acceptFDWithin(t, c.q, cb, RCConfig{Timeout: 50 * time.Millisecond}); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a Request that stopped: %v", err)
	}
	if lo, err := unix.GetsockoptInt(cb, unix.SOL_SOCKET, unix.SO_RCVLOWAT); lo != 1 || err != nil {
		t.Fatalf("SO_RCVLOWAT left at %d, %v", lo, err)
	}
	// A key followed by a header no Request has fails at once, blocking.
	ca, cb = tcpFDs(t)
	bogus := append([]byte(nil), req[:20]...)
	bogus[18], bogus[19] = 0xff, 0xff // PD_Length 65535
	unix.Write(ca, bogus)
	eventually(t, "the bogus header queued", func() bool {
		n, _, _ := unix.Recvfrom(cb, make([]byte, 64), unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return n == 20
	})
	if _, err := acceptFDWithin(t, c.q, cb, RCConfig{Timeout: forever}); err == nil || errors.Is(err, ErrMPAIncomplete) {
		t.Fatalf("a bogus header: %v", err)
	}
}

// A listener that shows the application the initiator's private data
// before answering (libfabric's FI_CONNREQ): PeekMPARequest reads
// nothing, so AcceptFD still finds the whole Request; RejectFD refuses
// with private data that ConnectFD returns in its *RejectError.
func TestPeekAndRejectFD(t *testing.T) {
	a, b := newRCSide(t, DeviceConfig{}), newRCSide(t, DeviceConfig{})
	ca, cb := tcpFDs(t)
	done := make(chan error, 1)
	go func() {
		_, err := a.q.ConnectFD(ca, RCConfig{PrivateData: []byte("may I")})
		done <- err
	}()
	var pd []byte
	eventually(t, "the whole Request", func() bool {
		var err error
		pd, err = PeekMPARequest(cb)
		if err != nil && !errors.Is(err, ErrMPAIncomplete) {
			t.Fatal(err)
		}
		return err == nil
	})
	if string(pd) != "may I" {
		t.Fatalf("PeekMPARequest: %q", pd)
	}
	if again, err := PeekMPARequest(cb); string(again) != "may I" || err != nil {
		t.Fatalf("a second peek: %q, %v", again, err)
	}
	if err := RejectFD(cb, []byte("not now"), time.Minute); err != nil {
		t.Fatal(err)
	}
	var rej *RejectError
	if err := <-done; !errors.As(err, &rej) || string(rej.PrivateData) != "not now" {
		t.Fatalf("ConnectFD of a rejected Request: %v", err)
	}
	if b.q.State() != StateInit {
		t.Fatalf("the responder's QP is in %v", b.q.State())
	}

	// Not MPA: the peek says so and reads nothing.
	ca, cb = tcpFDs(t)
	unix.Write(ca, []byte("GET / HTTP/1.0\r\n\r\n"))
	eventually(t, "the bytes queued", func() bool {
		n, _, _ := unix.Recvfrom(cb, make([]byte, 64), unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return n > 0
	})
	if _, err := PeekMPARequest(cb); !errors.Is(err, ErrNotMPA) {
		t.Fatalf("PeekMPARequest of HTTP: %v", err)
	}
}
