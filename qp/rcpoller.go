package qp

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// rcPoller is a device's one poller for all its RC connections (the
// datamover of seed 000 for RC): an epoll instance and an eventfd that
// wakes it, the connections by descriptor, and the listeners to close
// with the device. Its goroutine starts with the first connection; the
// connections call it (register, interest, unregister), the device starts
// and stops it (init, pollOnce, close), and it calls the connections
// (onReadable, onWritable). It knows nothing else of the device.
type rcPoller struct {
	busy bool // the device busy-polls: CQ.Poll reads, the poller only writes

	mu        sync.Mutex
	closed    bool
	file      *os.File // epoll's descriptor, in Go's netpoller
	epoll     int
	wake      int
	conns     map[int]*rcConn
	list      atomic.Pointer[[]*rcConn] // a snapshot for busy pollers
	listeners []*RCListener
	wg        sync.WaitGroup // the poller's goroutine
}

func (p *rcPoller) init(busy bool) {
	p.busy, p.epoll, p.wake, p.conns = busy, -1, -1, map[int]*rcConn{}
}

// addListener has l closed with the device.
func (p *rcPoller) addListener(l *RCListener) {
	p.mu.Lock()
	p.listeners = append(p.listeners, l)
	p.mu.Unlock()
}

// register adds c to the poller, starting it on first use.
func (p *rcPoller) register(c *rcConn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.epoll < 0 {
		ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return fmt.Errorf("qp: epoll: %w", err)
		}
		ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			unix.Close(ep)
			return fmt.Errorf("qp: eventfd: %w", err)
		}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ev, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ev)}); err != nil {
			unix.Close(ep)
			unix.Close(ev)
			return err
		}
		// The epoll instance waits in Go's netpoller (it is readable when
		// one of its descriptors is ready): the poller's goroutine parks
		// there, not in a blocking epoll_wait that holds an OS thread, so
		// a wake-up needs no thread handed a P and no second thread
		// started meanwhile (issue 32).
		if err := unix.SetNonblock(ep, true); err != nil {
			unix.Close(ep)
			unix.Close(ev)
			return err
		}
		f := os.NewFile(uintptr(ep), "rc-epoll")
		raw, err := f.SyscallConn()
		if err != nil {
			f.Close()
			unix.Close(ev)
			return err
		}
		p.file, p.epoll, p.wake = f, ep, ev
		p.wg.Add(1)
		go p.loop(raw, ev)
	}
	p.conns[c.fd] = c
	if c.manual {
		return nil // waited on only while it holds output back (interest)
	}
	p.relistLocked()
	return unix.EpollCtl(p.epoll, unix.EPOLL_CTL_ADD, c.fd, &unix.EpollEvent{Events: p.events(false), Fd: int32(c.fd)})
}

// unregister takes c out of the poller.
func (p *rcPoller) unregister(c *rcConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns[c.fd] != c {
		return
	}
	delete(p.conns, c.fd)
	if c.manual {
		if c.inEpoll && p.epoll >= 0 {
			unix.EpollCtl(p.epoll, unix.EPOLL_CTL_DEL, c.fd, nil)
		}
		c.inEpoll = false
		return
	}
	p.relistLocked()
	if p.epoll >= 0 {
		unix.EpollCtl(p.epoll, unix.EPOLL_CTL_DEL, c.fd, nil)
	}
}

// interest asks the poller to report (or stop reporting) room to write
// on c.
func (p *rcPoller) interest(c *rcConn, out bool) {
	ev := p.events(out)
	p.mu.Lock()
	if c.manual {
		// The caller reads a manual connection (Progress): the poller waits
		// only for room to send what it holds back, and only meanwhile.
		if p.epoll >= 0 && p.conns[c.fd] == c && out != c.inEpoll {
			op := unix.EPOLL_CTL_DEL
			if out {
				op = unix.EPOLL_CTL_ADD
			}
			if unix.EpollCtl(p.epoll, op, c.fd, &unix.EpollEvent{Events: unix.EPOLLOUT, Fd: int32(c.fd)}) == nil {
				c.inEpoll = out
			}
		}
		p.mu.Unlock()
		return
	}
	if p.busy {
		// The spinning threads send what the socket held back (pollOnce):
		// nothing to change, and no system call to make it.
		p.mu.Unlock()
		return
	}
	if p.epoll >= 0 && p.conns[c.fd] == c {
		unix.EpollCtl(p.epoll, unix.EPOLL_CTL_MOD, c.fd, &unix.EpollEvent{Events: ev, Fd: int32(c.fd)})
	}
	p.mu.Unlock()
}

// relistLocked publishes the connections for busy pollers, which read
// the list without the lock. The caller holds mu.
func (p *rcPoller) relistLocked() {
	list := make([]*rcConn, 0, len(p.conns))
	for _, x := range p.conns {
		if !x.manual { // read by their callers only
			list = append(list, x)
		}
	}
	p.list.Store(&list)
}

// loop waits on every RC socket of the device: it reads what arrives and
// sends what a full socket held back, one goroutine for all connections,
// until close wakes it.
func (p *rcPoller) loop(raw syscall.RawConn, wake int) {
	defer p.wg.Done()
	events := make([]unix.EpollEvent, 64)
	var n int
	var werr error
	wait := func(fd uintptr) bool {
		n, werr = unix.EpollWait(int(fd), events, 0)
		return n > 0 || (werr != nil && werr != unix.EINTR)
	}
	for {
		if err := raw.Read(wait); err != nil || werr != nil {
			return
		}
		for _, ev := range events[:n] {
			if int(ev.Fd) == wake {
				p.mu.Lock()
				closed := p.closed
				p.mu.Unlock()
				if closed {
					return
				}
				var b [8]byte
				unix.Read(wake, b[:])
				continue
			}
			p.mu.Lock()
			c := p.conns[int(ev.Fd)]
			p.mu.Unlock()
			if c == nil {
				continue
			}
			if c.manual {
				c.onWritable()
				if ev.Events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 {
					p.interest(c, false) // no room will come: its caller learns it on its next call
				}
				continue
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
				c.onReadable()
			}
			if ev.Events&unix.EPOLLOUT != 0 {
				c.onWritable()
			}
		}
	}
}

// events is what the poller waits for on a connection: data, and room
// to write when a send is held back. Unless the device busy-polls: then
// CQ.Poll reads and sends what a full socket held back (pollOnce), and
// waking the poller for either would only take a CPU from the spinners
// and the connection's lock from the one that sends (issue 32: an RC
// Write stream of 1 MiB messages went from 0.43x raw TCP's goodput to
// 0.8x when the poller stopped waking for room); the poller waits only
// for the end of the connection.
func (p *rcPoller) events(out bool) uint32 {
	ev := uint32(unix.EPOLLRDHUP)
	if !p.busy {
		ev |= unix.EPOLLIN
		if out {
			ev |= unix.EPOLLOUT
		}
	}
	return ev
}

// pollOnce reads every RC connection without waiting (busy polling).
func (p *rcPoller) pollOnce() {
	if l := p.list.Load(); l != nil {
		for _, c := range *l {
			c.onReadable()
			if (c.ackMode || c.outWait.Load()) && c.mu.TryLock() {
				if c.wantOut {
					// Busy polling alone sends what the socket held back
					// (events): the poller's goroutine, woken by EPOLLOUT,
					// waited for a CPU behind the spinning threads (an RDMA
					// Write of 1 MiB that overfills the socket took 17 ms
					// where raw TCP takes 0.2: issue 32).
					c.pumpLocked()
				}
				c.completeLocked() // the peer's TCP may have acknowledged more
				c.mu.Unlock()
			}
		}
	}
}

// close stops the poller (Device.Close): it closes the listeners and
// every connection, waits for its goroutine and frees its descriptors.
func (p *rcPoller) close() {
	p.mu.Lock()
	p.closed = true
	ls := p.listeners
	p.listeners = nil
	conns := make([]*rcConn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	if p.wake >= 0 {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		unix.Write(p.wake, one[:])
	}
	p.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, c := range conns {
		c.shutdown()
	}
	p.wg.Wait()
	p.mu.Lock()
	if p.epoll >= 0 {
		p.file.Close() // the epoll instance
		unix.Close(p.wake)
		p.file, p.epoll, p.wake = nil, -1, -1
	}
	p.mu.Unlock()
}

// move follows c, a manual connection, to fd, another descriptor of its
// socket. The caller holds c's locks, so no system call uses the old one.
func (p *rcPoller) move(c *rcConn, fd int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns[c.fd] == c {
		delete(p.conns, c.fd)
		p.conns[fd] = c
	}
	if c.inEpoll && p.epoll >= 0 {
		unix.EpollCtl(p.epoll, unix.EPOLL_CTL_DEL, c.fd, nil)
		if unix.EpollCtl(p.epoll, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLOUT, Fd: int32(fd)}) != nil {
			c.inEpoll = false
		}
	}
	c.fd = fd
}
