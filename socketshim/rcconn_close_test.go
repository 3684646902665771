package socketshim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/sys/unix"
)

// rawRCPeer is the far end of an RC stream socket on a TCP socket the
// test owns (qp.ConnectFD): it reads only when the test calls Progress,
// and its receive buffer is small, so what the socket sends it waits in
// the sender's TCP, sent but not acknowledged.
type rawRCPeer struct {
	fd  int
	dev *qp.Device
	q   *qp.QP
	cq  *qp.CQ
	mr  *qp.MR
}

const rawPeerSlot = 65536

// dialRawRCPeer connects a raw peer offering o's receive depth and
// message size and posting posted receives.
func dialRawRCPeer(t *testing.T, addr netip.AddrPort, o *RCOptions, posted int) *rawRCPeer {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096); err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}); err != nil {
		t.Fatal(err)
	}
	p := &rawRCPeer{fd: fd}
	if p.dev, err = qp.Open(qp.DeviceConfig{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.dev.Close() }) // before the descriptor closes
	pd := p.dev.AllocPD()
	if p.mr, err = pd.RegisterMemory(make([]byte, posted*rawPeerSlot), qp.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if p.cq, err = p.dev.CreateCQ(4 * posted); err != nil {
		t.Fatal(err)
	}
	if p.q, err = pd.CreateQP(qp.QPAttr{Type: qp.RC, SendCQ: p.cq, RecvCQ: p.cq,
		Caps: qp.QPCaps{MaxSendWR: 64, MaxRecvWR: posted, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64}}); err != nil {
		t.Fatal(err)
	}
	if err := p.q.Modify(qp.ModifyAttr{State: qp.StateInit}); err != nil {
		t.Fatal(err)
	}
	for i := range posted {
		if err := p.q.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{p.mr.SGE(i*rawPeerSlot, rawPeerSlot)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.q.ConnectFD(fd, qp.RCConfig{PrivateData: o.private()}); err != nil {
		t.Fatal(err)
	}
	return p
}

// credit sends the socket a credit-only message granting grant.
func (p *rawRCPeer) credit(t *testing.T, grant uint32) {
	t.Helper()
	var m [rcHeaderSize]byte
	m[0] = rcCredit
	binary.BigEndian.PutUint32(m[4:], grant)
	if err := p.q.PostSend(&qp.SendWR{ID: 1, Inline: m[:]}); err != nil {
		t.Fatal(err)
	}
}

// readStream reads the socket's data messages until its FIN, the
// connection's end or the deadline: the stream's bytes and whether the
// FIN came.
func (p *rawRCPeer) readStream(t *testing.T, deadline time.Time) (got []byte, fin bool) {
	t.Helper()
	wcs := make([]qp.WorkCompletion, 16)
	buf := p.mr.Bytes()
	for time.Now().Before(deadline) {
		pfd := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		unix.Poll(pfd, 10)
		p.q.Progress()
		for n := p.cq.Poll(wcs); n > 0; n = p.cq.Poll(wcs) {
			for _, wc := range wcs[:n] {
				if wc.Opcode != qp.WCRecv {
					continue
				}
				if wc.Status != qp.Success {
					return got, false // the connection ended (a reset flushes the receives)
				}
				m := buf[int(wc.ID)*rawPeerSlot : int(wc.ID)*rawPeerSlot+int(wc.Len)]
				switch m[0] {
				case rcData:
					got = append(got, m[rcHeaderSize:]...)
				case rcFIN:
					return got, true
				}
				if err := p.q.PostRecv(&qp.RecvWR{ID: wc.ID, SGL: []qp.SGE{p.mr.SGE(int(wc.ID)*rawPeerSlot, rawPeerSlot)}}); err != nil {
					t.Fatalf("repost receive %d: %v", wc.ID, err)
				}
			}
		}
	}
	return got, false
}

// TestRCConnCloseUnreadInput: Close loses nothing of what was written
// when the peer's credit-only messages (which no application reads) sit
// unread in the socket as it closes. Closing a TCP socket with unread
// input resets the connection (RFC 2525 §2.17), and the reset throws
// away what TCP still holds unacknowledged: Close waited only until TCP
// had taken the FIN, so the stream's tail and the FIN were lost and the
// reader saw a short stream and a reset (issue 30 item 11: BasicIO's
// "transmitted data differs"). The socket's device busy-polls, so input
// stays unread while its application reads nothing: the unread message
// is certain, not a race.
func TestRCConnCloseUnreadInput(t *testing.T) {
	o := &RCOptions{Device: qp.DeviceConfig{Poll: qp.PollBusy}}
	if err := o.fill(); err != nil {
		t.Fatal(err)
	}
	l, err := ListenRC("tcp4", "127.0.0.1:0", o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *RCConn, 1)
	go func() {
		c, _ := l.AcceptRC()
		accepted <- c
	}()
	p := dialRawRCPeer(t, l.Addr().(*net.TCPAddr).AddrPort(), o, o.RecvDepth+8)
	c := <-accepted
	if c == nil {
		t.Fatal("accept failed")
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	// The socket reads the peer's RTR: its sends wait for it.
	deadline := time.Now().Add(20 * time.Second)
	for c.dev.Stats().RCFPDUsReceived.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the socket never read the peer's RTR")
		}
		c.poll()
	}

	const size = 32 << 10 // beyond the peer's window, within TCP's send buffer
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 7)
	}
	if n, err := c.Write(src); err != nil || n != size {
		t.Fatalf("write: %d, %v", n, err)
	}
	// TCP took it all; the peer, reading nothing, acknowledged only what
	// its small buffer holds.
	for c.q.SendQueued() {
		if time.Now().After(deadline) {
			t.Fatal("TCP never took the stream: the socket's send buffer is too small for the test")
		}
		time.Sleep(time.Millisecond)
	}
	// The peer's credit-only message arrives, unread: nothing reads the
	// busy-polled socket while its application is idle.
	p.credit(t, 0)
	for {
		outq, err := unix.IoctlGetInt(p.fd, unix.SIOCOUTQ)
		if err != nil {
			t.Fatal(err)
		}
		if outq == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket's TCP never acknowledged the credit")
		}
		time.Sleep(time.Millisecond)
	}
	before := c.dev.Stats().RCFPDUsReceived.Load()

	closeErr := make(chan error, 1)
	go func() { closeErr <- c.Close() }()
	closed = true
	// The peer reads once Close returned, or once Close, waiting, has
	// taken the credit off the socket (a busy-polled socket reads while
	// its Close waits): Close must not return while what it sent is
	// unacknowledged.
	var cerr error
	returned := false
	for !returned && c.dev.Stats().RCFPDUsReceived.Load() == before {
		select {
		case cerr = <-closeErr:
			returned = true
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("Close neither returned nor read")
		}
	}
	got, fin := p.readStream(t, deadline)
	if !returned {
		cerr = <-closeErr
	}
	if cerr != nil {
		t.Fatalf("Close: %v", cerr)
	}
	if !fin || !bytes.Equal(got, src) {
		t.Fatalf("the peer read %d of %d bytes (equal: %v), FIN %v: Close reset the connection with the stream's tail unsent",
			len(got), size, bytes.Equal(got, src[:min(len(got), size)]), fin)
	}
}

// TestRCConnGreedyPeer: a peer that offers more receives than the
// socket's send queue holds, and reads nothing, holds a Write no longer
// than its deadline and a Close no longer than closeLinger. The socket
// sent on the peer's credits alone; with more credits than send WRs, a
// Write that filled the send queue slept and retried without looking at
// its deadline, for as long as the peer read nothing, and Close's FIN did
// the same for good: one remote peer froze the program's Close.
func TestRCConnGreedyPeer(t *testing.T) {
	l, err := ListenRC("tcp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *RCConn, 1)
	go func() {
		c, _ := l.AcceptRC()
		accepted <- c
	}()
	// 16384 receives of 64 KiB offered (1 GiB), none posted: the peer
	// never reads.
	dialRawRCPeer(t, l.Addr().(*net.TCPAddr).AddrPort(), &RCOptions{RecvDepth: 1 << 14, MessageSize: 65536}, 1)
	c := <-accepted
	if c == nil {
		t.Fatal("accept failed")
	}
	src := make([]byte, 64<<20)
	c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	type result struct {
		n   int
		err error
	}
	wrote := make(chan result, 1)
	go func() {
		n, err := c.Write(src)
		wrote <- result{n, err}
	}()
	select {
	case r := <-wrote:
		if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.n >= len(src) {
			t.Fatalf("Write: %d bytes, %v (want its deadline)", r.n, r.err)
		}
	case <-time.After(30 * time.Second):
		go c.Close()
		t.Fatal("Write ignored its deadline: the send queue was full and it retried for as long as the peer read nothing")
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Close did not return within 30 s (closeLinger is %v): its FIN waited for room in the send queue for good", closeLinger)
	}
}

// TestRCConnOvergrant: a peer that grants more credits than the receives
// it offered ends the connection with a clear error (its grants would
// otherwise let the socket send into receives that do not exist).
func TestRCConnOvergrant(t *testing.T) {
	l, err := ListenRC("tcp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *RCConn, 1)
	go func() {
		c, _ := l.AcceptRC()
		accepted <- c
	}()
	p := dialRawRCPeer(t, l.Addr().(*net.TCPAddr).AddrPort(), &RCOptions{RecvDepth: 8, MessageSize: 4096}, 1)
	c := <-accepted
	if c == nil {
		t.Fatal("accept failed")
	}
	defer c.Close()
	p.credit(t, 1) // nothing was sent: all 8 credits are the socket's already
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = c.Read(make([]byte, 10))
	if err == nil || !strings.Contains(err.Error(), "more than the 8 receives it offered") {
		t.Fatalf("Read after an overgrant: %v", err)
	}
}
