package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// The queue-pair modes over server/client. Both ends open a qpEnd: a
// device, a region and a QP of the mode's type. The client sends its
// region's handle in the request, the server answers with its own, and
// then the client runs the mode:
//
//   - Send modes (ud-send, rd-send, rc-send): the server keeps receives
//     posted and echoes (lat) or counts (bw) what arrives; rc-send's
//     stream is paced by credits the server sends back, a zero-byte Send
//     per creditBatch receives it reposted (RC has no receiver-not-ready:
//     a Send without a posted receive ends the connection).
//   - Write-Record (ud-wr, rd-wr): the server answers each record with a
//     Write-Record into the client's region (lat) or counts the bytes
//     recorded valid (bw).
//   - RDMA Write and Read (rd-write, rd-read, rc-write, rc-read): the
//     server only drives its device; the client measures, as the
//     completions of its own WRs tell it everything (RD completes on the
//     target's acknowledgement). rc-write lat is ib_write_lat's Write
//     ping-pong: the server watches the last byte of its region and
//     writes back.
//
// Each region holds the outgoing message at 0 and the incoming one (a
// peer's Write or Write-Record) at slot.

// creditBatch is how many reposted receives one rc-send credit message
// returns.
const creditBatch = 16

// onesidedDepth is how many Writes or Reads a client keeps outstanding.
const onesidedDepth = 16

func qpTypeOf(m perf.Mode) qp.QPType {
	switch m {
	case perf.ModeUDSend, perf.ModeUDWriteRecord:
		return qp.UD
	case perf.ModeRCSend, perf.ModeRCWrite, perf.ModeRCRead:
		return qp.RC
	}
	return qp.RD
}

func sendMode(m perf.Mode) bool {
	return m == perf.ModeUDSend || m == perf.ModeRDSend || m == perf.ModeRCSend
}

// clientMeasured: modes whose bandwidth the client counts (completed WRs).
func clientMeasured(m perf.Mode) bool {
	return m == perf.ModeRDWrite || m == perf.ModeRDRead || m == perf.ModeRCWrite || m == perf.ModeRCRead
}

// remoteMaxSize is the largest message of a mode over server/client.
func remoteMaxSize(m perf.Mode) int {
	if m == perf.ModeUDSend || m == perf.ModeRawUDP || m == perf.ModeRawUDPUnconnected {
		return 65000
	}
	return 8 << 20
}

type qpEnd struct {
	mode  perf.Mode
	size  int
	slot  int
	depth int // receives posted (Send modes)
	dev   *qp.Device
	pd    *qp.PD
	buf   []byte
	mr    *qp.MR
	cq    *qp.CQ
	q     *qp.QP
	sock  *qp.Socket
	// slots: ud-wr's target regions, one per message slot, as local's
	// (messages to different STags do not supersede each other, so each
	// can run to its deadline and be delivered partial).
	slots []*qp.MR
}

// wrSlots is how many regions a ud-wr target offers (local's count).
const wrSlots = 16

// impairmentOf is what an end's impairment layer drops of a run's
// settings, as udperf local applies them: RD modes drop at both ends,
// data and acks (the client's end seeded with -seed, the server's with
// -seed+1); ud-send and ud-wr bandwidth at the sender, the client.
func impairmentOf(c perf.Config, server bool) *qp.Impairment {
	if c.Loss <= 0 {
		return nil
	}
	if qpTypeOf(c.Mode) == qp.RD {
		seed := c.Seed
		if server {
			seed++
		}
		return &qp.Impairment{Seed: seed, Loss: c.Loss}
	}
	if server {
		return nil // UD: the sender drops
	}
	return &qp.Impairment{Seed: c.Seed, Loss: c.Loss}
}

// openQPEnd opens one end of c's run, with the settings an end applies
// (as udperf local does: the impairment layer's loss, the segment size of
// -mtu, Write-Record's deadline and policy, metrics through c.OnDevice);
// local is the address to bind (UD, RD) or "" for RC, which connects or
// accepts later.
func openQPEnd(c perf.Config, server bool, network, local string) (*qpEnd, error) {
	m, size := c.Mode, c.Size
	e := &qpEnd{mode: m, size: size, slot: max(size, 1)}
	var err error
	if e.dev, err = qp.Open(qp.DeviceConfig{Poll: c.Poll, RecvBuffer: 32 << 20, Impair: impairmentOf(c, server)}); err != nil {
		return nil, err
	}
	if c.OnDevice != nil {
		c.OnDevice(e.dev)
	}
	fail := func(err error) (*qpEnd, error) { e.dev.Close(); return nil, err }
	e.pd = e.dev.AllocPD()
	n := 2 * e.slot
	if sendMode(m) {
		e.depth = max(4, min(256, (32<<20)/e.slot))
		n = e.depth * e.slot
	}
	if m == perf.ModeUDWriteRecord {
		n = max(n, wrSlots*e.slot)
	}
	e.buf = make([]byte, n)
	if e.mr, err = e.pd.RegisterMemory(e.buf, qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessRemoteRead); err != nil {
		return fail(err)
	}
	if m == perf.ModeUDWriteRecord {
		for i := range wrSlots {
			mr, err := e.pd.RegisterMemory(e.buf[i*e.slot:(i+1)*e.slot], qp.AccessLocalWrite|qp.AccessRemoteWrite)
			if err != nil {
				return fail(err)
			}
			e.slots = append(e.slots, mr)
		}
	}
	if e.cq, err = e.dev.CreateCQ(4096); err != nil {
		return fail(err)
	}
	attr := qp.QPAttr{Type: qpTypeOf(m), SendCQ: e.cq, RecvCQ: e.cq, WriteRecordSegment: c.Segment,
		Caps: qp.QPCaps{MaxSendWR: 1024, MaxRecvWR: max(e.depth, 64)}}
	if attr.Type == qp.RD {
		attr.RD.Segment = c.Segment
	}
	if m == perf.ModeUDWriteRecord { // as local's ud-wr ends
		attr.WriteRecord = writerecord.Config{Timeout: c.Deadline, Policy: writerecord.Discard}
		if c.Partial {
			attr.WriteRecord.Policy = writerecord.DeliverPartial
		}
	}
	if e.q, err = e.pd.CreateQP(attr); err != nil {
		return fail(err)
	}
	if attr.Type == qp.RC {
		if err := e.q.Modify(qp.ModifyAttr{State: qp.StateInit}); err != nil {
			return fail(err)
		}
	} else {
		if e.sock, err = e.dev.Bind(network, local); err != nil {
			return fail(err)
		}
		if err := e.q.Activate(e.sock); err != nil {
			return fail(err)
		}
	}
	for k := range e.depth {
		if err := e.q.PostRecv(&qp.RecvWR{ID: uint64(k * e.slot), SGL: []qp.SGE{e.mr.SGE(k*e.slot, e.slot)}}); err != nil {
			return fail(err)
		}
	}
	return e, nil
}

func (e *qpEnd) repost(wc *qp.WorkCompletion) {
	e.q.PostRecv(&qp.RecvWR{ID: wc.ID, SGL: []qp.SGE{e.mr.SGE(int(wc.ID), e.slot)}})
}

// wait polls the CQ for the next completion, parking in event mode; false
// when stop is set.
func (e *qpEnd) wait(wc []qp.WorkCompletion, busy bool, stop *atomic.Bool) bool {
	for k := 1; !stop.Load(); k++ {
		if e.cq.Poll(wc[:1]) == 1 {
			return true
		}
		if busy {
			if k%1024 == 0 {
				runtime.Gosched()
			}
			continue
		}
		e.park(20 * time.Millisecond)
	}
	return false
}

// park waits up to d for the CQ to have a completion (event mode).
func (e *qpEnd) park(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	e.cq.Wait(ctx)
	cancel()
}

// serveQP is the server's loop: echo or count, until stop.
// UD and RD: only the client's QP (ah, at from) is answered and counted;
// completions from elsewhere are dropped and counted in foreign.
func (e *qpEnd) serveQP(req runRequest, ah *qp.AH, from netip.AddrPort, echo, busy bool, note func(int), notePartial func(uint64), foreign *atomic.Uint64, stop *atomic.Bool) {
	wcs := make([]qp.WorkCompletion, 64)
	watch := e.mode == perf.ModeRCWrite && echo
	in := e.slot + e.size - 1
	reposted := 0
	for it := 0; !stop.Load(); {
		if watch && e.size > 0 && e.buf[in] == perf.WriteMark(it) {
			e.buf[e.size-1] = perf.WriteMark(it)
			e.q.PostSend(&qp.SendWR{Opcode: qp.OpWrite, SGL: []qp.SGE{e.mr.SGE(0, e.size)}, RemoteSTag: req.STag, RemoteTO: req.TO + uint64(e.slot)})
			it++
		}
		n := e.cq.Poll(wcs)
		if n == 0 {
			if !busy {
				e.park(20 * time.Millisecond)
			}
			continue
		}
		for i := range wcs[:n] {
			wc := &wcs[i]
			if wc.Status == qp.WRFlushError {
				return
			}
			if wc.Status != qp.Success {
				continue
			}
			if ah != nil && (wc.Opcode == qp.WCRecv || wc.Opcode == qp.WCWriteRecord) &&
				(netip.AddrPortFrom(wc.Source.Addr().Unmap(), wc.Source.Port()) != from || wc.SourceQPN != req.QPN) {
				foreign.Add(1)
				if wc.Opcode == qp.WCRecv {
					e.repost(wc)
				}
				continue
			}
			switch wc.Opcode {
			case qp.WCRecv:
				e.repost(wc)
				if echo {
					wr := qp.SendWR{SGL: []qp.SGE{e.mr.SGE(int(wc.ID), int(wc.Len))}, AH: ah}
					e.q.PostSend(&wr)
					continue
				}
				note(int(wc.Len))
				if reposted++; e.mode == perf.ModeRCSend && reposted%creditBatch == 0 {
					e.q.PostSend(&qp.SendWR{}) // creditBatch more receives are posted
				}
			case qp.WCWriteRecord:
				if !echo && wc.Partial { // -partial: its valid ranges
					var valid uint64
					for _, r := range wc.Valid {
						valid += r.Len()
					}
					notePartial(valid)
					continue
				}
				if !echo {
					note(int(wc.Len))
					continue
				}
				e.q.PostSend(&qp.SendWR{Opcode: qp.OpWriteRecord, SGL: []qp.SGE{e.mr.SGE(0, e.size)}, AH: ah,
					RemoteSTag: req.STag, RemoteTO: req.TO + uint64(e.slot)})
			}
		}
	}
}

// newQPEndpoint is the server's end of a queue-pair mode: c is the run
// the request asks for (with the server's OnDevice).
// from is the client's data end (its UD or RD QP at from, req.QPN; RC:
// from's host); foreignOf is pointed at the count of what the run dropped
// from elsewhere.
func newQPEndpoint(req runRequest, c perf.Config, host string, from netip.AddrPort, note func(int), notePartial func(uint64), result func() runReply, foreignOf *func() uint64) (*endpoint, error) {
	poll := c.Poll
	network := "udp4"
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() && !a.Is4In6() {
		network = "udp6"
	}
	e, err := openQPEnd(c, true, network, net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	ep := &endpoint{stag: e.mr.STag(), to: e.mr.Addr(), credits: e.depth - 2}
	for _, mr := range e.slots {
		ep.slots = append(ep.slots, regionRef{STag: mr.STag(), TO: mr.Addr()})
	}
	var l *qp.RCListener
	if e.sock == nil {
		if l, err = e.dev.ListenRC(net.JoinHostPort(host, "0")); err != nil {
			e.dev.Close()
			return nil, err
		}
		ep.addr = l.Addr().String()
	} else {
		ep.addr, ep.qpn = e.sock.LocalAddr().String(), e.q.QPN()
	}
	var foreign atomic.Uint64
	*foreignOf = foreign.Load
	var ah *qp.AH
	if e.sock != nil {
		if ah, err = e.pd.CreateAH(from, req.QPN); err != nil {
			e.dev.Close()
			return nil, err
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for l != nil { // RC: the client's host only
			r, err := l.Next(context.Background())
			if err != nil {
				return
			}
			if r.Peer().Addr().Unmap() != from.Addr() {
				foreign.Add(1)
				r.Reject(nil)
				continue
			}
			if r.Accept(e.q, qp.RCConfig{}) != nil {
				return
			}
			break
		}
		e.serveQP(req, ah, from, req.Test == "lat", poll == qp.PollBusy, note, notePartial, &foreign, &stop)
	}()
	ep.close = func() {
		stop.Store(true)
		if l != nil {
			l.Close()
		}
		e.dev.Close()
		wg.Wait()
	}
	ep.stop = func() runReply {
		wait := 50 * time.Millisecond // what is still on its way arrives
		if c.Mode == perf.ModeUDWriteRecord {
			wait = max(wait, 2*c.Deadline) // deadlines pass: partial records come in (as local)
		}
		time.Sleep(wait)
		return result()
	}
	return ep, nil
}

// connect points the client's end at the server's: an AH (UD, RD) or an
// RC connection; it returns the AH.
func (e *qpEnd) connect(rep runReply) (*qp.AH, error) {
	if e.sock == nil {
		_, err := e.q.Connect(context.Background(), rep.Addr, qp.RCConfig{})
		return nil, err
	}
	to, err := netip.ParseAddrPort(rep.Addr)
	if err != nil {
		return nil, err
	}
	return e.pd.CreateAH(to, rep.QPN)
}

// driveQP runs the client's end of a queue-pair mode against the server
// that answered rep.
func (e *qpEnd) driveQP(cfg perf.Config, test string, rep runReply) (perf.Result, error) {
	res := perf.Result{Config: cfg}
	ah, err := e.connect(rep)
	if err != nil {
		return res, err
	}
	busy := cfg.Poll == qp.PollBusy
	var stop atomic.Bool
	wcs := make([]qp.WorkCompletion, 64)
	wr := qp.SendWR{SGL: []qp.SGE{e.mr.SGE(0, cfg.Size)}, AH: ah, RemoteSTag: rep.STag, RemoteTO: rep.TO}
	want := qp.WCRecv
	switch e.mode {
	case perf.ModeUDWriteRecord, perf.ModeRDWriteRecord:
		wr.Opcode, want = qp.OpWriteRecord, qp.WCWriteRecord
	case perf.ModeRDWrite, perf.ModeRCWrite:
		wr.Opcode, wr.Flags, want = qp.OpWrite, qp.FlagSignaled, qp.WCRDMAWrite
		wr.RemoteTO += uint64(e.slot)
	case perf.ModeRDRead, perf.ModeRCRead:
		wr.Opcode, wr.Flags, want = qp.OpRead, qp.FlagSignaled, qp.WCRDMARead
	}
	if test == "lat" {
		in := e.slot + cfg.Size - 1
		ping := func(it int) error {
			if e.mode == perf.ModeRCWrite {
				e.buf[cfg.Size-1] = perf.WriteMark(it)
			}
			if err := e.q.PostSend(&wr); err != nil {
				return err
			}
			end := time.Now().Add(2 * time.Second)
			if e.mode == perf.ModeRCWrite { // ib_write_lat: watch the last byte
				for k := 0; e.buf[in] != perf.WriteMark(it); k++ {
					e.cq.Poll(wcs)
					if k%1024 == 0 && time.Now().After(end) {
						return os.ErrDeadlineExceeded
					}
				}
				return nil
			}
			for time.Now().Before(end) {
				n := e.cq.Poll(wcs[:1])
				if n == 0 {
					if !busy {
						e.park(20 * time.Millisecond)
					}
					continue
				}
				if wcs[0].Opcode == qp.WCRecv {
					e.repost(&wcs[0])
				}
				if wcs[0].Status != qp.Success {
					return errors.New(wcs[0].Status.String())
				}
				if wcs[0].Opcode == want {
					return nil
				}
			}
			return os.ErrDeadlineExceeded
		}
		ns := make([]int64, 0, cfg.Iters)
		for it := range max(cfg.Warmup, 0) + cfg.Iters {
			t0 := time.Now()
			if err := ping(it); err != nil {
				return res, fmt.Errorf("round trip %d: %w", it, err)
			}
			if it >= cfg.Warmup {
				ns = append(ns, int64(time.Since(t0))/2)
			}
		}
		return perf.Summarize(cfg, ns), nil
	}
	end := time.Now().Add(cfg.Duration)
	if clientMeasured(e.mode) {
		// Keep onesidedDepth WRs outstanding; goodput is what completed.
		var first, last time.Time
		var done uint64
		out := 0
		for time.Now().Before(end) {
			for out < onesidedDepth && e.q.PostSend(&wr) == nil {
				out++
				res.Sent++
			}
			if !e.wait(wcs, busy, &stop) {
				break
			}
			out--
			if wcs[0].Status != qp.Success {
				return res, errors.New(wcs[0].Status.String())
			}
			last = time.Now()
			if first.IsZero() {
				first = last
			}
			done++
		}
		res.Received = done
		if el := last.Sub(first).Seconds(); el > 0 && done > 1 {
			res.Gbps = float64((done-1)*uint64(cfg.Size)) * 8 / el / 1e9
			res.Mpps = float64(done-1) / el / 1e6
		}
		return res, nil
	}
	credits := rep.Credits
	for i := 0; time.Now().Before(end); {
		if len(rep.Slots) > 0 { // ud-wr: a region per message slot, round-robin
			s := rep.Slots[i%len(rep.Slots)]
			wr.RemoteSTag, wr.RemoteTO = s.STag, s.TO
		}
		for _, wc := range wcs[:e.cq.Poll(wcs)] {
			if wc.Opcode == qp.WCRecv && wc.Status == qp.Success {
				e.repost(&wc)
				credits += creditBatch
			}
		}
		if e.mode == perf.ModeRCSend && credits <= 0 {
			if !busy {
				e.park(time.Millisecond)
			}
			continue
		}
		if e.q.PostSend(&wr) == nil {
			res.Sent++
			credits--
			i++
		}
	}
	return res, nil
}
