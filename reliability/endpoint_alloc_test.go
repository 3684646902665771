package reliability

import (
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// lHost is a Host that allocates nothing: its frames go into a ring of
// buffers it reuses, and it counts what it is told.
type lHost struct {
	addr      netip.AddrPort
	out       *lNet
	delivered int
	completed int
	failed    int
}

type lFrame struct {
	from, to netip.AddrPort
	b        []byte
}

// lNet is a network of fixed buffers between endpoints.
type lNet struct {
	frames []lFrame
	n      int
	drop   bool // frames sent are lost
}

func (l *lNet) put(from, to netip.AddrPort, parts ...[]byte) {
	if l.drop {
		return
	}
	f := &l.frames[l.n]
	l.n++
	f.from, f.to, f.b = from, to, f.b[:0]
	for _, p := range parts {
		f.b = append(f.b, p...)
	}
}

var lPayload [12]byte

func (h *lHost) SegmentSize(uint64, uint32) int { return len(lPayload) }
func (h *lHost) Send(f *Frame[uint64, struct{}]) error {
	if f.Type == Data {
		h.out.put(h.addr, f.Dst, f.Header, lPayload[:])
	} else {
		h.out.put(h.addr, f.Dst, f.Header)
	}
	return nil
}
func (h *lHost) Deliver(*Peer[struct{}], uint32, []byte) (bool, Code) { h.delivered++; return true, 0 }
func (h *lHost) Hold(_ *Peer[struct{}], _ uint32, seg []byte, _ HoldState) ([]byte, bool, HoldVerdict) {
	return append([]byte(nil), seg...), false, HoldKeep
}
func (h *lHost) Complete(_ *Peer[struct{}], _ uint64, err error) {
	if err != nil {
		h.failed++
	}
	h.completed++
}
func (h *lHost) Event(*Peer[struct{}], Event) {}

type lPair struct {
	now   time.Time
	net   lNet
	spare []lFrame
	eps   map[netip.AddrPort]*Endpoint[uint64, struct{}]
	host  map[netip.AddrPort]*lHost
}

func newLPair(cfg EndpointConfig) *lPair {
	p := &lPair{now: time.Unix(1000, 0), eps: map[netip.AddrPort]*Endpoint[uint64, struct{}]{}, host: map[netip.AddrPort]*lHost{}}
	p.net.frames, p.spare = make([]lFrame, 4096), make([]lFrame, 4096)
	for i := range p.net.frames {
		p.net.frames[i].b = make([]byte, 0, MaxHeaderSize+64)
		p.spare[i].b = make([]byte, 0, MaxHeaderSize+64)
	}
	cfg.QPN = 1
	for _, a := range []netip.AddrPort{tA, tB} {
		h := &lHost{addr: a, out: &p.net}
		p.host[a], p.eps[a] = h, NewEndpoint[uint64, struct{}](cfg, h)
	}
	return p
}

// run delivers what is on the network, one batch per endpoint, until
// nothing is left. Frames sent meanwhile go into the other of two rings
// of buffers.
func (p *lPair) run() {
	for p.net.n > 0 {
		batch := p.net.frames[:p.net.n]
		p.net.frames, p.spare = p.spare, p.net.frames
		p.net.n = 0
		for i := range batch {
			f := &batch[i]
			p.eps[f.to].Receive(p.now, f.from, f.b)
		}
		for _, e := range p.eps {
			e.EndBatch(p.now)
		}
	}
}

// TestEndpointSteadyStateAllocs: a peer that sends messages, each
// delivered, acknowledged and completed, allocates nothing per message
// once its state exists: the Message is reused (Endpoint.freeMessage),
// the array of posted messages is compacted rather than grown, and the
// rings stay.
func TestEndpointSteadyStateAllocs(t *testing.T) {
	p := newLPair(EndpointConfig{Config: Config{Congestion: CongestionNone}})
	a := p.eps[tA]
	k := PeerKey{tB, 1}
	step := func() {
		for range 4 {
			if _, err := a.Post(p.now, k, 1, 1, 0); err != nil {
				t.Fatal(err)
			}
		}
		p.run()
		p.now = p.now.Add(2 * time.Millisecond) // the receiver's delayed ack
		for _, e := range p.eps {
			e.Tick(p.now)
		}
		p.run()
	}
	for range 100 {
		step()
	}
	if h := p.host[tA]; h.completed != 400 || h.failed != 0 || p.host[tB].delivered != 400 {
		t.Fatalf("completed %d (failed %d), delivered %d: the harness does not carry messages", h.completed, h.failed, p.host[tB].delivered)
	}
	if allocs := testing.AllocsPerRun(200, step); allocs != 0 {
		t.Fatalf("%v allocations per 4 messages", allocs)
	}
}

// BenchmarkEndpointPeerMemory reports the heap a peer's state costs an
// endpoint: with a full window of frames in flight to it (its sender's
// ring at its largest), and with its receiver's ring grown to the window
// by frames ahead of a gap since filled (the most a peer can make us keep
// without our sending anything; the frames themselves are budgeted apart,
// MaxHeldBytes). An idle peer is qp's BenchmarkRDPeerMemory.
func BenchmarkEndpointPeerMemory(b *testing.B) {
	var before, after runtime.MemStats
	for b.Loop() {
		p := newLPair(EndpointConfig{Config: Config{Congestion: CongestionNone}})
		a := p.eps[tA]
		k := PeerKey{tB, 1}
		if _, err := a.Post(p.now, k, 0, 1, 0); err != nil {
			b.Fatal(err)
		}
		p.run() // contact, and one message
		w := a.Config().Window
		p.net.drop = true
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := a.Post(p.now, k, 1, uint32(w), 0)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if err != nil {
			b.Fatal(err)
		}
		if pi, _ := a.Info(k); pi.InFlight != w {
			b.Fatalf("%d in flight, want %d", pi.InFlight, w)
		}
		b.ReportMetric(float64(after.HeapAlloc)-float64(before.HeapAlloc), "bytes/busy-peer")
		runtime.KeepAlive(p)
	}
}
