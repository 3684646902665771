package llp

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
)

// MemNet is an in-memory network of Mem links: a datagram written to an
// address is copied into the queue of the link open there, or dropped
// (counted) when none is or its queue is full, as a UDP port drops what
// its buffer cannot hold. No system call, no timer: it is how tests and
// simulations run the stack alone (BenchmarkRoundTripCPU measures the
// stack's own cost over it), and the link under the RD simulation.
type MemNet struct {
	// QueueLen is the most datagrams a link queues unread (default 4096).
	QueueLen int
	// MaxDatagram is the largest datagram the network carries (default
	// 65507).
	MaxDatagram int

	mu       sync.Mutex
	links    map[netip.AddrPort]*Mem
	nextPort uint16
	// Dropped counts datagrams no link took: nobody at the address, or a
	// full queue.
	Dropped atomic.Uint64
}

// NewMemNet returns an empty network.
func NewMemNet() *MemNet {
	return &MemNet{QueueLen: 4096, MaxDatagram: maxUDPv4, links: map[netip.AddrPort]*Mem{}, nextPort: 49152}
}

// Open opens a link at addr; port 0 picks a free one.
func (n *MemNet) Open(addr netip.AddrPort) (*Mem, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !addr.Addr().IsValid() {
		return nil, fmt.Errorf("llp: no address")
	}
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	if addr.Port() == 0 {
		for range 1 << 16 {
			n.nextPort++
			if n.nextPort < 49152 {
				n.nextPort = 49152
			}
			if _, used := n.links[netip.AddrPortFrom(addr.Addr(), n.nextPort)]; !used {
				addr = netip.AddrPortFrom(addr.Addr(), n.nextPort)
				break
			}
		}
	}
	if _, used := n.links[addr]; used || addr.Port() == 0 {
		return nil, fmt.Errorf("llp: %v is in use", addr)
	}
	m := &Mem{net: n, local: addr, wake: make(chan struct{}, 1), done: make(chan struct{})}
	m.q = make([]memDatagram, 0, 64)
	n.links[addr] = m
	return m, nil
}

// Mem is a link on a MemNet.
type Mem struct {
	net   *MemNet
	local netip.AddrPort
	mu    sync.Mutex
	q     []memDatagram // unread, oldest first
	head  int
	wake  chan struct{} // a datagram was queued while waiters > 0
	// waiters counts the goroutines in WaitReadable: a datagram queued
	// when none waits signals nobody (a busy reader's ping-pong pays no
	// channel operation).
	waiters atomic.Int32
	done    chan struct{} // closed by Close
	once    sync.Once
	// Received and Sent count datagrams.
	Received, Sent atomic.Uint64
	// last is the link the last datagram went to: a ping-pong's peer is
	// found without the network's lock.
	last atomic.Pointer[Mem]
}

type memDatagram struct {
	b   *[]byte
	src netip.AddrPort
}

var memBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

func (m *Mem) LocalAddr() netip.AddrPort { return m.local }

func (m *Mem) Caps() Caps {
	return Caps{Kind: "mem", MaxDatagram: m.net.MaxDatagram, MaxTrain: MaxTrain, Detail: "in-memory network"}
}

func (m *Mem) closed() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

func (m *Mem) Read(ms []Msg) (int, error) {
	if m.closed() {
		return 0, ErrClosed
	}
	m.mu.Lock()
	k := 0
	for ; k < len(ms) && m.head < len(m.q); k++ {
		d := m.q[m.head]
		m.q[m.head] = memDatagram{}
		m.head++
		g := &ms[k]
		g.N = Scatter(g.Bufs, *d.b)
		g.Trunc = g.N < len(*d.b)
		g.Addr, g.Segment = d.src, 0
		g.SetDst(m.local.Addr(), true)
		*d.b = (*d.b)[:0]
		memBufs.Put(d.b)
	}
	if m.head == len(m.q) {
		m.q, m.head = m.q[:0], 0
	}
	m.mu.Unlock()
	m.Received.Add(uint64(k))
	return k, nil
}

// Write copies each datagram into its destination's queue; a train is
// cut into its datagrams.
func (m *Mem) Write(ms []Msg) (int, error) {
	if m.closed() {
		return 0, ErrClosed
	}
	for i := range ms {
		g := &ms[i]
		total := g.Len()
		if g.Segment == 0 && total > m.net.MaxDatagram || g.Segment > m.net.MaxDatagram {
			return i, fmt.Errorf("llp: a %d-byte datagram, the network carries %d", max(total, g.Segment), m.net.MaxDatagram)
		}
		dst := m.peer(g.Addr)
		seg := total
		if g.Segment > 0 {
			seg = g.Segment
		}
		bufs, off := g.Bufs, 0 // where the next datagram starts
		for left := total; ; {
			k := min(seg, left)
			bp := memBufs.Get().(*[]byte)
			b := (*bp)[:0]
			for need := k; need > 0; {
				c := bufs[0][off:]
				c = c[:min(len(c), need)]
				b = append(b, c...)
				need -= len(c)
				if off += len(c); off == len(bufs[0]) {
					bufs, off = bufs[1:], 0
				}
			}
			*bp = b
			if dst == nil || !dst.queue(bp, m.local) {
				m.net.Dropped.Add(1)
				*bp = (*bp)[:0]
				memBufs.Put(bp)
			}
			m.Sent.Add(1)
			if left -= k; left <= 0 {
				break
			}
			for len(bufs) > 0 && off == len(bufs[0]) {
				bufs, off = bufs[1:], 0
			}
		}
		g.N = total
	}
	return len(ms), nil
}

// peer finds the link open at addr, or nil.
func (m *Mem) peer(addr netip.AddrPort) *Mem {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	if p := m.last.Load(); p != nil && p.local == addr && !p.closed() {
		return p
	}
	m.net.mu.Lock()
	p := m.net.links[addr]
	m.net.mu.Unlock()
	if p != nil {
		m.last.Store(p)
	}
	return p
}

func (m *Mem) queue(b *[]byte, src netip.AddrPort) bool {
	m.mu.Lock()
	if m.closed() || len(m.q)-m.head >= m.net.QueueLen {
		m.mu.Unlock()
		return false
	}
	m.q = append(m.q, memDatagram{b, src})
	m.mu.Unlock()
	if m.waiters.Load() > 0 {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
	return true
}

func (m *Mem) WaitReadable() error {
	m.waiters.Add(1)
	defer m.waiters.Add(-1)
	for {
		// (waiters is raised before the queue is looked at: a datagram
		// queued after the look finds it raised and signals.)
		m.mu.Lock()
		ready := m.head < len(m.q)
		m.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-m.wake:
		case <-m.done:
			return ErrClosed
		}
	}
}

// WaitWritable returns at once: the network never pushes back, it drops.
func (m *Mem) WaitWritable() error {
	if m.closed() {
		return ErrClosed
	}
	return nil
}

// Close takes the link off the network and drops what it had queued.
func (m *Mem) Close() error {
	m.once.Do(func() {
		m.net.mu.Lock()
		delete(m.net.links, m.local)
		m.net.mu.Unlock()
		m.mu.Lock()
		close(m.done)
		m.q, m.head = nil, 0
		m.mu.Unlock()
	})
	return nil
}
