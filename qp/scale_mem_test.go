package qp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/memstat"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// Issue 18: memory per peer as seed 003 measured it, the whole server
// process (its resident set, not only the Go heap) plus the kernel slab
// its sockets use. The server is a child process (this test binary run
// again, TestScaleChild), so its resident set is its own: one RD or UD
// QP answering every Send with a Send, or an RC listener doing the same
// on every connection it accepts. The clients are in this process, each
// at its own 127.x.y.z address (scaleSockets says how they share
// sockets), which are opened before the baseline is read, so neither
// their memory nor their sockets' slab is in the figures. An RD client is a
// hand-driven RD endpoint speaking the wire of docs/wire.md §11 (Hello,
// Challenge, Data with the issued token, acks), an RC client a
// hand-driven MPA initiator on a TCP socket made before the baseline.

const scaleChildEnv = "UDIWARP_SCALE_CHILD"

// TestScaleChild is the server of the scale measurements when this binary
// runs as their child (scaleChildEnv set to "rd:N", "ud:N" or "rc:N");
// otherwise it does nothing. It reads commands on stdin: "mem" (collect
// garbage, return freed memory to the kernel, print the heap and the
// gauges) and "quit".
func TestScaleChild(t *testing.T) {
	spec := os.Getenv(scaleChildEnv)
	if spec == "" {
		t.Skip("the server of the scale benchmarks, run as their child")
	}
	kind, ns, _ := strings.Cut(spec, ":")
	n, _ := strconv.Atoi(ns)
	if err := scaleServe(kind, n, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stdout, "scale-error %v\n", err)
		t.Fatal(err)
	}
}

// scaleServe runs the server for n peers of kind until "quit" or the end
// of cmds, writing its lines to out.
func scaleServe(kind string, n int, cmds io.Reader, out io.Writer) error {
	dev, err := Open(DeviceConfig{MaxQP: max(4096, n+64)}) // RC: a QP per connection
	if err != nil {
		return err
	}
	defer dev.Close()
	pd := dev.AllocPD()
	cq, err := dev.CreateCQ(1 << 16)
	if err != nil {
		return err
	}
	const slots, slot = 4096, 128
	mr, err := pd.RegisterMemory(make([]byte, slots*slot), AccessLocalWrite)
	if err != nil {
		return err
	}
	var (
		mu  sync.Mutex
		qps = map[uint32]*QP{} // RC: the QP of each connection
		q   *QP
	)
	switch kind {
	case "rd", "ud":
		sock, err := dev.Bind("udp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		attr := QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq, Caps: QPCaps{MaxSendWR: min(1<<20, max(4096, 2*n)), MaxRecvWR: slots}}
		if kind == "rd" {
			// Every peer stays (IdleTimeout), and what is in flight
			// to an active peer stays put while it is measured: the
			// retransmission timeout is floored at 20 s.
			attr.Type = RD
			attr.RD = RDConfig{MaxPeers: max(n, defaultMaxPeers), IdleTimeout: time.Hour,
				Config: reliability.Config{Granularity: 20 * time.Second, MaxRTO: 20 * time.Second}}
		}
		if q, err = pd.CreateQP(attr); err != nil {
			return err
		}
		if err := q.Activate(sock); err != nil {
			return err
		}
		for i := range slots {
			if err := q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{mr.SGE(i*slot, slot)}}); err != nil {
				return err
			}
		}
		fmt.Fprintf(out, "scale-ready %v %d\n", sock.LocalAddr(), q.QPN())
	case "rc":
		l, err := dev.ListenRC("127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait() // after cancel: the accepting goroutine waits in Next
		defer cancel()
		wg.Go(func() {
			for i := 0; ; i++ {
				r, err := l.Next(ctx)
				if err != nil {
					return
				}
				c, err := pd.CreateQP(QPAttr{Type: RC, SendCQ: cq, RecvCQ: cq}) // the default capacities, as an RC user has them
				if err == nil {
					err = c.Modify(ModifyAttr{State: StateInit})
				}
				if err == nil {
					err = c.PostRecv(&RecvWR{ID: uint64(i % slots), SGL: []SGE{mr.SGE(i%slots*slot, slot)}})
				}
				if err != nil {
					r.Reject(nil)
					continue
				}
				mu.Lock()
				qps[c.QPN()] = c
				mu.Unlock()
				r.Accept(c, RCConfig{})
			}
		})
		fmt.Fprintf(out, "scale-ready %v 0\n", l.Addr())
	default:
		return fmt.Errorf("scale child %q", kind)
	}
	lines := make(chan string, 1)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(cmds)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	pong := []byte("pong")
	wcs := make([]WorkCompletion, 256)
	var errs, replies int
	for {
		select {
		case cmd, ok := <-lines:
			if !ok || cmd == "quit" {
				for range lines { // the parent closes stdin after "quit": the reader ends
				}
				return nil
			}
			if cmd == "mem" {
				runtime.GC()
				debug.FreeOSMemory()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				l := dev.Levels()
				fmt.Fprintf(out, "scale-mem heap=%d peers=%d conns=%d replies=%d errors=%d\n", ms.HeapAlloc, l.RDPeers, l.RCConnections, replies, errs)
			}
			continue
		default:
		}
		k := cq.Poll(wcs)
		if k == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			cq.Wait(ctx)
			cancel()
			continue
		}
		for _, wc := range wcs[:k] {
			switch {
			case wc.Status != Success:
				errs++
				continue
			case wc.Opcode != WCRecv:
				continue
			}
			c := q
			if c == nil {
				mu.Lock()
				c = qps[wc.QPN]
				mu.Unlock()
			}
			if err := c.PostRecv(&RecvWR{ID: wc.ID, SGL: []SGE{mr.SGE(int(wc.ID)*slot, slot)}}); err != nil {
				errs++
			}
			wr := SendWR{Inline: pong}
			if c.Type() != RC {
				ah, err := pd.CreateAH(wc.Source, wc.SourceQPN)
				if err != nil {
					errs++
					continue
				}
				wr.AH = ah
			}
			if err := c.PostSend(&wr); err != nil {
				errs++
				continue
			}
			replies++
		}
	}
}

// scaleServer is the parent's handle on the child server.
type scaleServer struct {
	tb    testing.TB
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	addr  netip.AddrPort
	qpn   uint32
	slab0 memstat.Slab
	rss0  int64
	heap0 int64
}

// scaleMem is one reading: the child's resident set and Go heap, its
// gauges, and the kernel's slab.
type scaleMem struct {
	rss, heap     int64
	peers, conns  int
	replies, errs int
	slab          memstat.Slab
}

func startScaleServer(tb testing.TB, kind string, n int) *scaleServer {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestScaleChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", scaleChildEnv, kind, n))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	outR, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	s := &scaleServer{tb: tb, cmd: cmd, in: in, out: bufio.NewScanner(outR)}
	tb.Cleanup(s.stop)
	f := strings.Fields(s.line("scale-ready"))
	if len(f) != 3 {
		tb.Fatalf("scale child: %q", f)
	}
	s.addr = netip.MustParseAddrPort(f[1])
	qpn, _ := strconv.Atoi(f[2])
	s.qpn = uint32(qpn)
	return s
}

// line returns the child's next line that starts with prefix.
func (s *scaleServer) line(prefix string) string {
	s.tb.Helper()
	for s.out.Scan() {
		l := s.out.Text()
		if strings.HasPrefix(l, "scale-error") {
			s.tb.Fatalf("scale child: %s", l)
		}
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	s.tb.Fatalf("scale child ended before %q: %v", prefix, s.out.Err())
	return ""
}

// mem reads the child's memory at rest (after a collection that returned
// what it freed to the kernel) and the slab.
func (s *scaleServer) mem() scaleMem {
	s.tb.Helper()
	fmt.Fprintln(s.in, "mem")
	var m scaleMem
	for _, f := range strings.Fields(s.line("scale-mem"))[1:] {
		k, v, _ := strings.Cut(f, "=")
		x, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "heap":
			m.heap = x
		case "peers":
			m.peers = int(x)
		case "conns":
			m.conns = int(x)
		case "replies":
			m.replies = int(x)
		case "errors":
			m.errs = int(x)
		}
	}
	var err error
	if m.rss, err = memstat.RSS(s.cmd.Process.Pid); err != nil {
		s.tb.Fatal(err)
	}
	if m.slab, err = memstat.ReadSlab(); err != nil {
		s.tb.Skipf("the slab is not readable: %v", err)
	}
	return m
}

// baseline records the reading every later one is measured from.
func (s *scaleServer) baseline() {
	m := s.mem()
	s.rss0, s.heap0, s.slab0 = m.rss, m.heap, m.slab
}

// report reports a reading against the baseline per unit (peer or
// connection), as name's metrics.
func (s *scaleServer) report(b *testing.B, m scaleMem, n int, name string) {
	d := m.slab.Sub(s.slab0)
	b.ReportMetric(float64(m.rss-s.rss0)/float64(n), "rss-B/"+name)
	b.ReportMetric(float64(m.heap-s.heap0)/float64(n), "heap-B/"+name)
	b.ReportMetric(float64(d.Sockets())/float64(n), "slab-B/"+name)
	b.ReportMetric(float64(m.rss-s.rss0+d.Sockets())/float64(n), "B/"+name)
}

func (s *scaleServer) stop() {
	if s.cmd == nil {
		return
	}
	fmt.Fprintln(s.in, "quit")
	s.in.Close()
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// scaleAddr is client i's address: 127.x.y.z from 127.100.1.1 on, no
// octet 0 or 255.
func scaleAddr(i int) [4]byte {
	return [4]byte{127, byte(100 + i/(254*254)), byte(1 + i/254%254), byte(1 + i%254)}
}

// scaleClient is the client scaleAddr gave a, or -1.
func scaleClient(a [4]byte) int {
	if a[0] != 127 || a[1] < 100 || a[2] == 0 || a[2] == 255 || a[3] == 0 || a[3] == 255 {
		return -1
	}
	return int(a[1]-100)*254*254 + int(a[2]-1)*254 + int(a[3]-1)
}

// scaleSockets is how many sockets the clients share. A socket per
// client would need RLIMIT_NOFILE above 100,000, and the hard limit here
// is 20,000 without the capability to raise it; so the clients share a
// few sockets bound to the wildcard address, and each sends from its own
// address (IP_PKTINFO) and is told apart by the address its answers come
// to. To the server they are distinct clients all the same: distinct
// sources, each a peer.
const scaleSockets = 16

// scaleClients are n client endpoints at distinct 127.x.y.z addresses,
// on scaleSockets sockets watched by one epoll instance; run drives them
// through a phase, a window of them at a time.
type scaleClients struct {
	tb    testing.TB
	fds   []int
	n     int
	ep    int
	srv   unix.SockaddrInet4
	srvQP uint32
	rd    []rdScaleClient
	buf   []byte
	oob   []byte
	frame []byte
}

// rdScaleClient is one hand-driven RD endpoint's state: its epoch and
// token, the token the server issued it, what it has sent and received.
type rdScaleClient struct {
	epoch        uint32
	mine, theirs uint64
	state        uint8
	sent, got    uint32 // its next sequence number; the server's next it expects
	msn          uint32
	tries        uint8
	at           time.Time
}

func newScaleClients(tb testing.TB, srv *scaleServer, n int) *scaleClients {
	tb.Helper()
	c := &scaleClients{tb: tb, n: n, srv: unix.SockaddrInet4{Port: int(srv.addr.Port()), Addr: srv.addr.Addr().As4()}, srvQP: srv.qpn,
		rd: make([]rdScaleClient, n), buf: make([]byte, 2048), oob: make([]byte, 128)}
	var err error
	if c.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.close)
	for k := range scaleSockets {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			tb.Fatal(err)
		}
		c.fds = append(c.fds, fd)
		for _, o := range []struct{ level, opt, v int }{{unix.IPPROTO_IP, unix.IP_PKTINFO, 1}, {unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16 << 20}} {
			if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil && o.opt == unix.IP_PKTINFO {
				tb.Fatal(err)
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{}); err != nil {
			tb.Fatal(err)
		}
		if err := unix.EpollCtl(c.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(k)}); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range n {
		c.rd[i] = rdScaleClient{epoch: 0x5ca1e000 ^ uint32(i), mine: 0x5eed<<48 | uint64(i+1)}
	}
	return c
}

func (c *scaleClients) close() {
	for _, fd := range c.fds {
		unix.Close(fd)
	}
	c.fds = nil
	if c.ep > 0 {
		unix.Close(c.ep)
		c.ep = 0
	}
}

// send sends b to the server from client i's address.
func (c *scaleClients) send(i int, b []byte) {
	oob := unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: scaleAddr(i)})
	if _, err := unix.SendmsgN(c.fds[i%scaleSockets], b, oob, &c.srv, 0); err != nil && !errors.Is(err, unix.EAGAIN) {
		c.tb.Fatalf("client %d: %v", i, err)
	}
}

// recv reads a datagram from socket k: its bytes and the client it was
// sent to, or -1; false when there is none.
func (c *scaleClients) recv(k int) ([]byte, int, bool) {
	m, oobn, _, _, err := unix.Recvmsg(c.fds[k], c.buf, c.oob, unix.MSG_DONTWAIT)
	if err != nil {
		return nil, -1, false
	}
	msgs, _ := unix.ParseSocketControlMessage(c.oob[:oobn])
	for _, cm := range msgs {
		if cm.Header.Level == unix.IPPROTO_IP && cm.Header.Type == unix.IP_PKTINFO && len(cm.Data) >= 12 {
			var a [4]byte
			copy(a[:], cm.Data[8:12]) // in_pktinfo: ifindex, spec_dst, addr (the header's destination)
			if i := scaleClient(a); i >= 0 && i < c.n && i%scaleSockets == k {
				return c.buf[:m], i, true
			}
		}
	}
	return c.buf[:m], -1, true
}

// scalePhase is what every client does in one phase: start sends its
// first frame (and again when no answer came in time), frame takes what
// the server sent it and reports whether the client is done.
type scalePhase struct {
	name  string
	start func(i int)
	frame func(i int, b []byte) bool
}

// run drives every client through ph, window at a time, within limit.
func (c *scaleClients) run(ph scalePhase, window int, limit time.Duration) {
	c.tb.Helper()
	n := c.n
	busy := make([]bool, n)
	var active []int
	started, done := 0, 0
	events := make([]unix.EpollEvent, 256)
	end := time.Now().Add(limit)
	lastScan := time.Now()
	for done < n {
		for len(active) < window && started < n {
			i := started
			started++
			busy[i] = true
			c.rd[i].tries, c.rd[i].at = 0, time.Now()
			ph.start(i)
			active = append(active, i)
		}
		k, err := unix.EpollWait(c.ep, events, 5)
		if err != nil && !errors.Is(err, unix.EINTR) {
			c.tb.Fatal(err)
		}
		for _, ev := range events[:max(k, 0)] {
			for {
				b, i, ok := c.recv(int(ev.Fd))
				if !ok {
					break
				}
				if i >= 0 && busy[i] && len(b) > udiwarp.CRCSize && ph.frame(i, b) {
					busy[i] = false
					done++
				}
			}
		}
		now := time.Now()
		if now.Sub(lastScan) < 50*time.Millisecond && done < n {
			continue
		}
		lastScan = now
		if now.After(end) {
			c.tb.Fatalf("phase %s: %d of %d clients done in %v", ph.name, done, n, limit)
		}
		keep := active[:0]
		for _, i := range active {
			if !busy[i] {
				continue
			}
			keep = append(keep, i)
			if r := &c.rd[i]; now.Sub(r.at) > 500*time.Millisecond {
				if r.tries++; r.tries > 20 {
					c.tb.Fatalf("phase %s: client %d (%v) unanswered", ph.name, i, scaleAddr(i))
				}
				r.at = now
				ph.start(i)
			}
		}
		active = keep
	}
}

// The RD client's frames.

func (c *scaleClients) rdHeader(i int, f *reliability.Fields, payload []byte) []byte {
	r := &c.rd[i]
	f.DstQPN, f.SrcQPN, f.Epoch, f.Window = c.srvQP, 1, r.epoch, 64 // the window it offers the server
	b := reliability.Append(c.frame[:0], f)
	b = append(b, payload...)
	c.frame = udiwarp.SealDatagram(b, 0)
	return c.frame
}

func (c *scaleClients) rdHello(i int) {
	c.send(i, c.rdHeader(i, &reliability.Fields{Type: reliability.Hello, Init: true, Issued: c.rd[i].mine}, nil))
}

// rdSend sends Data frame seq carrying a Send of "ping" with MSN msn.
func (c *scaleClients) rdSend(i int, seq, msn uint32) {
	r := &c.rd[i]
	seg := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: 1, QN: udiwarp.DatagramQN(c.srvQP, udiwarp.QueueSend), MSN: msn})
	seg = append(seg, "ping"...)
	c.send(i, c.rdHeader(i, &reliability.Fields{Type: reliability.Data, Token: r.theirs, Seq: seq, Init: true, Issued: r.mine, AckNow: true}, seg))
}

func (c *scaleClients) rdAck(i int) {
	r := &c.rd[i]
	c.send(i, c.rdHeader(i, &reliability.Fields{Type: reliability.Ack, Token: r.theirs, Ack: &reliability.AckBlock{Cumulative: r.got}}, nil))
}

// rdParse returns the RD frame b carries if it is the server's to client
// i (its token), nil otherwise.
func (c *scaleClients) rdParse(i int, b []byte) *reliability.Header {
	h := new(reliability.Header)
	if h.Parse(b[:len(b)-udiwarp.CRCSize]) != nil || h.DstQPN != 1 {
		return nil
	}
	if h.Token != c.rd[i].mine { // a Challenge echoes it; the server's Data and acks carry it
		return nil
	}
	return h
}

// rdContact: Hello, the Challenge, a Send in the first Data frame, the
// server's answer (a Send), and an ack for it: the peer is then idle at
// the server, nothing outstanding either way.
func (c *scaleClients) rdContact() scalePhase {
	return scalePhase{name: "rd contact",
		start: func(i int) {
			r := &c.rd[i]
			if r.state == 0 {
				c.rdHello(i)
			} else {
				c.rdSend(i, 0, 1)
			}
		},
		frame: func(i int, b []byte) bool {
			r := &c.rd[i]
			h := c.rdParse(i, b)
			switch {
			case h == nil:
			case h.Type == reliability.Challenge && r.state == 0:
				r.theirs, r.state = h.Issued, 1
				c.rdSend(i, 0, 1)
			case h.Type == reliability.Data && h.Seq == 0 && r.state == 1:
				r.got, r.sent, r.msn, r.state = 1, 1, 1, 2
				c.rdAck(i)
				return true
			}
			return false
		}}
}

// rdActive: a second Send, and the server's answer left unacknowledged:
// the peer is then active at the server, its answer in flight.
func (c *scaleClients) rdActive() scalePhase {
	return scalePhase{name: "rd active",
		start: func(i int) { c.rdSend(i, c.rd[i].sent, c.rd[i].msn+1) },
		frame: func(i int, b []byte) bool {
			r := &c.rd[i]
			if h := c.rdParse(i, b); h != nil && h.Type == reliability.Data && h.Seq == r.got {
				r.got++
				r.sent++
				r.msn++
				return true
			}
			return false
		}}
}

// rdAckAll acknowledges what the server has in flight; nothing answers.
func (c *scaleClients) rdAckAll() {
	for i := range c.n {
		c.rdAck(i)
	}
}

// udExchange: a UD Send from each client, the server's answer back.
func (c *scaleClients) udExchange(msn uint32) scalePhase {
	return scalePhase{name: "ud exchange",
		start: func(i int) {
			seg := udiwarp.AppendUntagged(c.frame[:0], &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
				RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: 1, QN: udiwarp.DatagramQN(c.srvQP, udiwarp.QueueSend), MSN: msn})
			seg = append(seg, "ping"...)
			c.frame = udiwarp.SealDatagram(seg, 0)
			c.send(i, c.frame)
		},
		frame: func(i int, b []byte) bool {
			seg, err := udiwarp.ParseSegment(b[:len(b)-udiwarp.CRCSize], udiwarp.ProfileDatagram)
			return err == nil && seg.Opcode() == udiwarp.OpSend && string(seg.Payload) == "pong"
		}}
}

// scaleSettle gives the server time to take the clients' last frames.
func scaleSettle() { time.Sleep(300 * time.Millisecond) }

// scaleIdle waits until every peer has been quiet long enough to be idle
// (its sender's ring let go of, rdCompactAfter).
func scaleIdle() { time.Sleep(rdCompactAfter + 500*time.Millisecond) }

// peerMemory measures kind ("rd" or "ud") at n peers: idle (a while
// after one exchange, nothing outstanding) and active (a second
// exchange's answer in flight, RD's unacknowledged).
func peerMemory(b *testing.B, kind string, n int) {
	srv := startScaleServer(b, kind, n)
	c := newScaleClients(b, srv, n)
	limit := time.Duration(n)*200*time.Microsecond + 30*time.Second
	srv.baseline()
	if kind == "rd" {
		c.run(c.rdContact(), 1024, limit)
	} else {
		c.run(c.udExchange(1), 1024, limit)
	}
	scaleIdle()
	idle := srv.mem()
	if kind == "rd" {
		c.run(c.rdActive(), 1024, limit)
	} else {
		c.run(c.udExchange(2), 1024, limit)
	}
	scaleSettle()
	active := srv.mem()
	if kind == "rd" {
		c.rdAckAll()
		scaleSettle()
	}
	if kind == "rd" && (idle.peers != n || active.peers != n) {
		b.Fatalf("%d peers idle, %d active, want %d", idle.peers, active.peers, n)
	}
	if active.errs != 0 || active.replies < 2*n {
		b.Fatalf("the server answered %d Sends of %d, %d errors", active.replies, 2*n, active.errs)
	}
	srv.report(b, idle, n, "idle-peer")
	srv.report(b, active, n, "active-peer")
}

// BenchmarkPeerMemory: memory per peer of one RD and one UD QP serving
// 1,000 to 100,000 clients at distinct addresses, idle and active,
// whole-process RSS plus the sockets' slab (B/peer = rss-B/peer +
// slab-B/peer; heap-B/peer is the Go heap's part of the RSS). Run it
// alone, once: go test -run '^$' -bench BenchmarkPeerMemory -benchtime 1x
// ./qp/ (as root: the slab is root's to read).
//
// UDIWARP_SCALE_PEERS (a comma-separated list) replaces the counts: the
// experiments' quick run measures small ones.
func BenchmarkPeerMemory(b *testing.B) {
	for _, kind := range []string{"rd", "ud"} {
		for _, n := range scaleCounts(b, "UDIWARP_SCALE_PEERS", 1000, 10000, 100000) {
			b.Run(fmt.Sprintf("%s/peers=%d", kind, n), func(b *testing.B) {
				for b.Loop() {
					peerMemory(b, kind, n)
				}
			})
		}
	}
}

// TestPeerScaleHarness runs the measurement's harness small: a child
// server, RD and UD clients at distinct addresses through every phase.
// What the benchmark reports is checked there; here, that every client
// is served and every peer made.
func TestPeerScaleHarness(t *testing.T) {
	if _, err := memstat.ReadSlab(); err != nil {
		t.Skipf("the slab is not readable: %v", err)
	}
	for _, kind := range []string{"rd", "ud"} {
		t.Run(kind, func(t *testing.T) {
			const n = 300
			srv := startScaleServer(t, kind, n)
			c := newScaleClients(t, srv, n)
			srv.baseline()
			if kind == "rd" {
				c.run(c.rdContact(), 64, 20*time.Second)
				c.run(c.rdActive(), 64, 20*time.Second)
				c.rdAckAll()
			} else {
				c.run(c.udExchange(1), 64, 20*time.Second)
				c.run(c.udExchange(2), 64, 20*time.Second)
			}
			m := srv.mem()
			if kind == "rd" && m.peers != n || m.replies < 2*n || m.errs != 0 {
				t.Fatalf("%d peers, %d answers, %d errors (%d clients)", m.peers, m.replies, m.errs, n)
			}
		})
	}
}

// scaleCounts is the list of counts in environment variable env, or def.
func scaleCounts(b *testing.B, env string, def ...int) []int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: want counts like 1000,10000", env, v)
		}
		ns = append(ns, n)
	}
	return ns
}
