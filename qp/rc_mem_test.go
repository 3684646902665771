package qp

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/udiwarp/udiwarp/internal/memstat"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// rcScaleClients are n hand-driven MPA initiators, each on a TCP socket
// made before the server's baseline is read: what connecting adds to the
// slab is then the server's end (its accepted socket, its descriptor and
// epoll entry, the buffers in use), and the connection state both ends'
// kernels keep, not the clients' sockets.
type rcScaleClients struct {
	tb  testing.TB
	fds []int
	srv unix.SockaddrInet4
}

func newRCScaleClients(tb testing.TB, srv *scaleServer, n int) *rcScaleClients {
	tb.Helper()
	c := &rcScaleClients{tb: tb, srv: unix.SockaddrInet4{Port: int(srv.addr.Port()), Addr: srv.addr.Addr().As4()}}
	tb.Cleanup(func() {
		for _, fd := range c.fds {
			unix.Close(fd)
		}
	})
	for range n {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			tb.Fatal(err)
		}
		c.fds = append(c.fds, fd)
		tv := unix.Timeval{Sec: 10}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	return c
}

// exchange connects every client (MPA revision 2, peer-to-peer with the
// zero-length RDMA Write as ready-to-receive), sends a Send of "ping" and
// reads the server's Send of "pong", a few clients at a time.
func (c *rcScaleClients) exchange() {
	c.tb.Helper()
	const workers = 4
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(c.fds); i += workers {
				if err := c.one(c.fds[i]); err != nil {
					errs <- fmt.Errorf("RC client %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		c.tb.Fatal(err)
	}
}

func (c *rcScaleClients) one(fd int) error {
	if err := unix.Connect(fd, &c.srv); errors.Is(err, unix.EINTR) {
		// The connection goes on: wait for it (the runtime's signals
		// interrupt blocking calls).
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		for {
			if _, err := unix.Poll(pfd, 10000); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || v != 0 {
			return fmt.Errorf("connect: %v (%w)", unix.Errno(v), err)
		}
	} else if err != nil {
		return err
	}
	write := func(b []byte) error {
		for len(b) > 0 {
			k, err := unix.Write(fd, b)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			b = b[k:]
		}
		return nil
	}
	var buf []byte
	tmp := make([]byte, 4096)
	more := func() error {
		k, err := unix.Read(fd, tmp)
		for errors.Is(err, unix.EINTR) {
			k, err = unix.Read(fd, tmp)
		}
		if err == nil && k == 0 {
			err = fmt.Errorf("the server closed the connection")
		}
		buf = append(buf, tmp[:max(k, 0)]...)
		return err
	}
	req, _ := udiwarp.AppendMPAFrame(nil, &udiwarp.MPAFrameFields{CRC: true, Revision: 2, Enhanced: true,
		IRDORD: udiwarp.IRDORD{PeerToPeer: true, WriteRTR: true, IRD: 4, ORD: 4}})
	if err := write(req); err != nil {
		return err
	}
	var rep udiwarp.MPAFrame
	for {
		m, n, _, err := udiwarp.ParseMPAFrame(buf)
		if err != nil {
			return err
		}
		if n > 0 {
			rep, buf = m, buf[n:]
			break
		}
		if err := more(); err != nil {
			return err
		}
	}
	if !rep.Reply() || rep.Reject() || rep.Markers() {
		return fmt.Errorf("MPA reply: reject %v, markers %v", rep.Reject(), rep.Markers())
	}
	tx := udiwarp.MPAFramer{CRC: true}
	rtr, _ := tx.Append(nil, udiwarp.AppendTagged(nil, &udiwarp.TaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpWrite)}), nil)
	send, _ := tx.Append(nil, udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 1, RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), MSN: 1}), []byte("ping"))
	if err := write(append(rtr, send...)); err != nil {
		return err
	}
	rx := udiwarp.MPADeframer{CRC: true}
	for {
		ulpdu, n, _, err := rx.Next(buf)
		if err != nil {
			return err
		}
		if n == 0 {
			if err := more(); err != nil {
				return err
			}
			continue
		}
		buf = buf[n:]
		seg, err := udiwarp.ParseSegment(ulpdu, udiwarp.ProfileStream)
		if err != nil {
			return err
		}
		if seg.Opcode() == udiwarp.OpSend {
			if string(seg.Payload) != "pong" {
				return fmt.Errorf("the server sent %q", seg.Payload)
			}
			return nil
		}
	}
}

// BenchmarkRCConnectionMemory: memory per RC connection at a server of
// 1,000 and 10,000 connections, measured as BenchmarkPeerMemory measures
// a datagram QP's peers: the whole server process (its RSS, a child
// process's; heap-B/conn is the Go heap's part) plus the slab's socket
// caches, after each connection carried a Send each way. The server's
// QPs have the default capacities (256 send and 256 receive WRs), as an
// RC user has them. Run alone, once, as root: go test -run '^$' -bench
// BenchmarkRCConnectionMemory -benchtime 1x ./qp/
func BenchmarkRCConnectionMemory(b *testing.B) {
	if _, err := memstat.ReadSlab(); err != nil {
		b.Skipf("the slab is not readable: %v", err)
	}
	for _, n := range scaleCounts(b, "UDIWARP_SCALE_CONNS", 1000, 10000) {
		b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) {
			for b.Loop() {
				srv := startScaleServer(b, "rc", n)
				c := newRCScaleClients(b, srv, n)
				srv.baseline()
				c.exchange() // every client has the server's answer
				scaleSettle()
				m := srv.mem()
				if m.conns != n || m.replies != n || m.errs != 0 {
					b.Fatalf("%d connections, %d answers, %d errors (%d clients)", m.conns, m.replies, m.errs, n)
				}
				srv.report(b, m, n, "conn")
			}
		})
	}
}
