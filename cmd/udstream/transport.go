package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/socketshim"
	"github.com/udiwarp/udiwarp/validitymap"
)

// The transports. Four carry datagrams — each chunk of the stream one
// datagram (a Write-Record record, a UD Send, a UDP datagram) behind an
// 8-byte header — and one a byte stream (RC).
const (
	tWRUD   = "wr-ud"   // Write-Record over UD, partial delivery unless -discard
	tWRRD   = "wr-rd"   // Write-Record over RD: reliable
	tSendUD = "send-ud" // UD Send/Recv through socketshim.PacketConn
	tRC     = "rc"      // a byte stream over RC (TCP + MPA), as HTTP streaming over RC-iWARP
	tUDP    = "udp"     // plain kernel UDP sockets: the baseline
)

var transports = []string{tWRUD, tWRRD, tSendUD, tRC, tUDP}

// dgram is a datagram transport's socket as udstream uses it: read
// returns one datagram, or a partial Write-Record record with its valid
// ranges.
type dgram interface {
	write(b []byte, to netip.AddrPort) error
	read(b []byte) (n int, from netip.AddrPort, valid []validitymap.Range, partial bool, err error)
	SetReadDeadline(t time.Time) error
	LocalAddr() net.Addr
	Close() error
	// stats is what the transport counts beside the datagrams: records
	// dropped for want of credit, datagrams its device's impairment
	// dropped.
	stats() (dropped, impaired uint64)
}

// linkOpts are the settings an end applies to its transport.
type linkOpts struct {
	loss     float64 // the impairment layer's loss on what this end sends
	seed     uint64
	segment  int           // Write-Record segment payload
	partial  bool          // wr-ud: deliver partial records
	deadline time.Duration // wr-ud: a record's deadline
	slot     int           // the largest datagram
}

func (o linkOpts) device() qp.DeviceConfig {
	var dc qp.DeviceConfig
	if o.loss > 0 {
		dc.Impair = &qp.Impairment{Seed: o.seed, Loss: o.loss}
	}
	return dc
}

// listenDgram opens a datagram transport's socket on addr.
func listenDgram(transport, network, addr string, o linkOpts) (dgram, error) {
	switch transport {
	case tWRUD, tWRRD:
		c, err := socketshim.ListenWriteRecord(network, addr, &socketshim.WROptions{
			Reliable: transport == tWRRD, Partial: o.partial && transport == tWRUD, Deadline: o.deadline,
			Segment: o.segment, SlotSize: o.slot + 8, Slots: 64, CreditWait: 200 * time.Millisecond,
			HandshakeTimeout: 500 * time.Millisecond, // a receiver asks again every 200 ms until -wait
			Device:           o.device()})
		if err != nil {
			return nil, err
		}
		return wrDgram{c}, nil
	case tSendUD:
		c, err := socketshim.ListenPacket(network, addr, &socketshim.Options{RecvDepth: 1024, Device: o.device()})
		if err != nil {
			return nil, err
		}
		return &pcDgram{PacketConn: c}, nil
	case tUDP:
		la, err := net.ResolveUDPAddr(network, addr)
		if err != nil {
			return nil, err
		}
		c, err := net.ListenUDP(network, la)
		if err != nil {
			return nil, err
		}
		c.SetReadBuffer(8 << 20)
		c.SetWriteBuffer(8 << 20)
		u := &udpDgram{UDPConn: c}
		if o.loss > 0 { // no impairment layer under a kernel socket: the same seeded draw, here
			u.loss, u.rng = o.loss, rand.New(rand.NewPCG(o.seed, o.seed^0x9e3779b97f4a7c15))
		}
		return u, nil
	}
	return nil, fmt.Errorf("transport %q is not a datagram transport", transport)
}

type wrDgram struct{ *socketshim.WRConn }

func (w wrDgram) write(b []byte, to netip.AddrPort) error {
	_, err := w.WriteToUDPAddrPort(b, to)
	return err
}

func (w wrDgram) read(b []byte) (int, netip.AddrPort, []validitymap.Range, bool, error) {
	r, err := w.ReadRecord(b)
	return min(r.N, len(b)), r.Addr, r.Valid, r.Partial, err
}

func (w wrDgram) stats() (uint64, uint64) {
	return w.Stats().Dropped.Load(), w.Device().Stats().TxImpaired.Load()
}

type pcDgram struct{ *socketshim.PacketConn }

func (p *pcDgram) write(b []byte, to netip.AddrPort) error {
	_, err := p.WriteToUDPAddrPort(b, to)
	return err
}

func (p *pcDgram) read(b []byte) (int, netip.AddrPort, []validitymap.Range, bool, error) {
	n, from, err := p.ReadFromUDPAddrPort(b)
	return n, from, nil, false, err
}

func (p *pcDgram) stats() (uint64, uint64) { return 0, p.Device().Stats().TxImpaired.Load() }

type udpDgram struct {
	*net.UDPConn
	loss    float64
	rng     *rand.Rand
	dropped uint64
}

func (u *udpDgram) write(b []byte, to netip.AddrPort) error {
	if u.rng != nil && u.rng.Float64() < u.loss {
		u.dropped++
		return nil
	}
	_, err := u.WriteToUDPAddrPort(b, to)
	return err
}

func (u *udpDgram) read(b []byte) (int, netip.AddrPort, []validitymap.Range, bool, error) {
	n, from, err := u.ReadFromUDPAddrPort(b)
	return n, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), nil, false, err
}

func (u *udpDgram) stats() (uint64, uint64) { return 0, u.dropped }

// rcOpts is the RC stream's options on both ends.
func rcOpts(o linkOpts) *socketshim.RCOptions {
	return &socketshim.RCOptions{Device: o.device()}
}

// dialRC connects to the sender's RC listener, trying again until wait
// passes (the sender may start later).
func dialRC(ctx context.Context, addr string, wait time.Duration, o linkOpts) (*socketshim.RCConn, error) {
	end := time.Now().Add(wait)
	for {
		c, err := socketshim.DialRC(ctx, "tcp", addr, rcOpts(o))
		if err == nil || time.Now().After(end) || ctx.Err() != nil {
			return c, err
		}
		var oe *net.OpError
		if !errors.As(err, &oe) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
