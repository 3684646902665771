package perf

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

	"github.com/udiwarp/udiwarp/protect"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// The queue-pair modes as two halves. A run is a target End and an
// initiator End: the target serves (Serve: echoes for latency, counts
// for bandwidth, or only drives its device for the one-sided modes) and
// the initiator measures (DriveLatency, DriveBandwidth). udperf local
// runs both halves in one process (qpRun), udperf server the target and
// udperf client the initiator, so a figure means the same in both.
//
//   - Send modes (ud-send, rd-send, rc-send): the target keeps receives
//     posted and echoes (lat) or counts (bw) what arrives; rc-send's
//     stream is paced by credits the target sends back, a zero-byte Send
//     per creditBatch receives it reposted (RC has no receiver-not-ready:
//     a Send without a posted receive ends the connection).
//   - Write-Record (ud-wr, rd-wr): the target answers each record with a
//     Write-Record into the initiator's region (lat) or counts the bytes
//     recorded valid (bw). ud-wr targets offer a region per message slot.
//   - RDMA Write and Read (rd-write, rd-read, rc-write, rc-read): the
//     target only drives its device; the initiator measures, as the
//     completions of its own WRs tell it everything (RD completes on the
//     target's acknowledgement). rc-write lat is ib_write_lat's Write
//     ping-pong: the target watches the last byte of its region and
//     writes back.
//
// Each region holds the outgoing message at 0 and the incoming one (a
// peer's Write or Write-Record) at slot.

// creditBatch is how many reposted receives one rc-send credit message
// returns.
const creditBatch = 16

// onesidedDepth is how many Writes or Reads an initiator keeps
// outstanding.
const onesidedDepth = 16

// wrSlots is how many regions a ud-wr target offers, written round-robin
// (messages to different STags do not supersede each other, so each can
// run to its deadline and be delivered partial).
const wrSlots = 16

// Region is a registered region as a peer addresses it.
type Region struct {
	STag uint32 `json:"stag"`
	TO   uint64 `json:"to"`
}

// Offer is what an initiator needs of the target: its data address
// (UD, RD: its socket; RC: its listener), its QP, its region, the
// receives it posted (rc-send's credits) and ud-wr's slot regions.
type Offer struct {
	Addr    string
	QPN     uint32
	Region  Region
	Credits int
	Slots   []Region
}

// Peer is the initiator as the target knows it: its data address and QP
// (UD, RD: the target answers and counts only these; RC: only this host
// may connect) and its region, for the Writes and Write-Records back.
type Peer struct {
	Addr   netip.AddrPort
	QPN    uint32
	Region Region
}

// End is one end of a queue-pair run: a device, a region, a CQ and a QP
// of the mode's type, with the run's settings applied (the impairment
// layer's loss, the segment size, Write-Record's deadline and policy,
// metrics through Config.OnDevice).
type End struct {
	mode    Mode
	size    int
	slot    int
	depth   int // receives posted (Send modes)
	target  bool
	noCRC   bool
	lock    bool // busy polling, one pair: the latency loops keep their OS thread
	dev     *qp.Device
	pd      *qp.PD
	buf     []byte
	mr      *qp.MR
	cq      *qp.CQ
	q       *qp.QP
	sock    *qp.Socket     // UD, RD
	ln      *qp.RCListener // an RC target's, once Listen ran
	slots   []*qp.MR       // ud-wr target: one region per message slot
	foreign atomic.Uint64  // what the target dropped from elsewhere
	// The receive the loops post again and again, built in place: a WR
	// with an SGL literal per message would allocate.
	rwr       qp.RecvWR
	sges      [1]qp.SGE
	closeOnce sync.Once
}

// impairmentOf is what an end's impairment layer drops of a run's
// settings: the RD modes drop at both ends, data and acks (the
// initiator's end seeded with Seed, the target's with Seed+1); ud-send
// and ud-wr at the sender, the initiator.
func impairmentOf(c Config, target bool) *qp.Impairment {
	if c.Loss <= 0 {
		return nil
	}
	seed := c.Seed
	if c.Mode.reliable() {
		if target {
			seed++
		}
		return &qp.Impairment{Seed: seed, Loss: c.Loss}
	}
	if target {
		return nil
	}
	return &qp.Impairment{Seed: seed, Loss: c.Loss}
}

func (m Mode) qpType() qp.QPType {
	switch {
	case m == ModeUDSend || m == ModeUDWriteRecord:
		return qp.UD
	case m.rc():
		return qp.RC
	}
	return qp.RD
}

// sends says the target posts receives: Sends, and Writes with
// Immediate Data.
func (m Mode) sends() bool {
	return m == ModeUDSend || m == ModeRDSend || m == ModeRCSend || m.writeImm()
}

// credited says the initiator waits for credits: RC has no
// receiver-not-ready, so it sends only into receives it knows are posted.
func (m Mode) credited() bool { return m == ModeRCSend || m == ModeRCWriteImm }

// InitiatorMeasured says the initiator's completions give a bandwidth
// run's figures (RDMA Write and Read, atomics); otherwise the target
// counts.
func (m Mode) InitiatorMeasured() bool {
	return m == ModeRDWrite || m == ModeRDRead || m == ModeRCWrite || m == ModeRCRead || m.Atomic()
}

// OpenEnd opens one end of c's run; local is the address to bind (UD,
// RD; RC connects or listens later). A target of a Send mode has its
// receives posted.
func OpenEnd(c Config, target bool, network, local string) (*End, error) {
	m, size := c.Mode, c.Size
	e := &End{mode: m, size: size, slot: max(size, 1), target: target, noCRC: c.NoCRC, lock: c.Poll == qp.PollBusy && c.QPs <= 1}
	var err error
	dc := qp.DeviceConfig{Poll: c.Poll, RecvBuffer: 32 << 20, NoCRC: c.NoCRC, Impair: impairmentOf(c, target),
		Protect: protect.Config{Mode: c.Protect, PSK: c.PSK}}
	if e.dev, err = openDevice(c, dc); err != nil {
		return nil, err
	}
	fail := func(err error) (*End, error) { e.dev.Close(); return nil, err }
	e.pd = e.dev.AllocPD()
	n := 2 * e.slot
	if m.sends() {
		e.depth = max(4, min(recvDepth, (32<<20)/e.slot))
		if m.rc() {
			e.depth = rcDepth(e.slot)
		}
		n = max(n, e.depth*e.slot)
	}
	if m == ModeUDWriteRecord && target {
		n = max(n, wrSlots*e.slot)
	}
	e.buf = make([]byte, n)
	access := qp.AccessLocalWrite | qp.AccessRemoteWrite | qp.AccessRemoteRead
	if m.Atomic() {
		access |= qp.AccessRemoteAtomic // the word at offset 0
	}
	if e.mr, err = e.pd.RegisterMemory(e.buf, access); err != nil {
		return fail(err)
	}
	if m == ModeUDWriteRecord && target {
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
	attr := qp.QPAttr{Type: m.qpType(), SendCQ: e.cq, RecvCQ: e.cq, WriteRecordSegment: c.Segment,
		Caps: qp.QPCaps{MaxSendWR: 1024, MaxRecvWR: max(e.depth, 64)}}
	if attr.Type == qp.RD {
		attr.RD.Segment = c.Segment
	}
	if m == ModeUDWriteRecord {
		// The deadline is -partial's: without it a message takes as long
		// as it takes (the engine's own DefaultTimeout), where a 5 ms
		// deadline discarded an 8 MiB ping-pong's first message and the
		// run stalled.
		attr.WriteRecord = writerecord.Config{Policy: writerecord.Discard}
		if c.Partial {
			attr.WriteRecord = writerecord.Config{Timeout: c.Deadline, Policy: writerecord.DeliverPartial}
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

// Close closes the end: its listener and its device (which flushes the
// QP, so a Serve loop returns).
func (e *End) Close() {
	e.closeOnce.Do(func() {
		if e.ln != nil {
			e.ln.Close()
		}
		e.dev.Close()
	})
}

// Listen makes an RC target listen on host (a TCP port the kernel picks);
// other modes need not.
func (e *End) Listen(host string) error {
	if e.sock != nil || e.ln != nil {
		return nil
	}
	l, err := e.dev.ListenRC(net.JoinHostPort(host, "0"))
	if err != nil {
		return err
	}
	e.ln = l
	return nil
}

// Offer is what the target tells the initiator.
func (e *End) Offer() Offer {
	o := Offer{Region: Region{STag: e.mr.STag(), TO: e.mr.Addr()}, Credits: e.depth - 2}
	switch {
	case e.sock != nil:
		o.Addr, o.QPN = e.sock.LocalAddr().String(), e.q.QPN()
	case e.ln != nil:
		o.Addr = e.ln.Addr().String()
	}
	for _, mr := range e.slots {
		o.Slots = append(o.Slots, Region{STag: mr.STag(), TO: mr.Addr()})
	}
	return o
}

// Peer is what the initiator tells the target; RC's address is only a
// host (the connection's port is the kernel's).
func (e *End) Peer(host netip.Addr) Peer {
	p := Peer{Addr: netip.AddrPortFrom(host, 0), Region: Region{STag: e.mr.STag(), TO: e.mr.Addr()}}
	if e.sock != nil {
		p.Addr, p.QPN = e.sock.LocalAddr(), e.q.QPN()
	}
	return p
}

// Link says what the end runs on: its socket's lower layer (kind
// "udp" or "xdp", and how; a fallback from AF_XDP says why), or "tcp"
// for RC.
func (e *End) Link() llp.Caps {
	if e.sock != nil {
		return e.sock.Link()
	}
	return llp.Caps{Kind: "tcp", Detail: "RC: TCP + MPA"}
}

// Foreign is how many datagrams, completions or connections the target
// dropped for coming from elsewhere than its Peer.
func (e *End) Foreign() uint64 { return e.foreign.Load() }

func (e *End) repost(wc *qp.WorkCompletion) {
	e.sges[0] = e.mr.SGE(int(wc.ID), e.slot)
	e.rwr = qp.RecvWR{ID: wc.ID, SGL: e.sges[:1]}
	e.q.PostRecv(&e.rwr)
}

// park waits up to d for the CQ to have a completion (event mode).
func (e *End) park(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	e.cq.Wait(ctx)
	cancel()
}

// wait polls the CQ for the next completion, parking in event mode; false
// when stop is set.
func (e *End) wait(wc []qp.WorkCompletion, busy bool, stop *atomic.Bool) bool {
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

// Serve is the target's loop, until stop or the end closes: an RC
// target first accepts the peer's connection (its host only), then it
// echoes (lat) or counts into t (bw). UD and RD: only the peer's QP is
// answered and counted; completions from elsewhere are dropped and
// counted in Foreign.
func (e *End) Serve(p Peer, lat bool, t *Tally, stop *atomic.Bool) {
	cfgBusy := e.dev.Config().Poll == qp.PollBusy
	var ah *qp.AH
	if e.sock != nil {
		var err error
		if ah, err = e.pd.CreateAH(p.Addr, p.QPN); err != nil {
			return
		}
	}
	for e.ln != nil { // RC: the peer's host only
		r, err := e.ln.Next(context.Background())
		if err != nil {
			return
		}
		if r.Peer().Addr().Unmap() != p.Addr.Addr() {
			e.foreign.Add(1)
			r.Reject(nil)
			continue
		}
		if r.Accept(e.q, qp.RCConfig{NoCRC: e.noCRC}) != nil {
			return
		}
		break
	}
	if serveStart != nil {
		serveStart()
	}
	if lat && e.lock {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	wcs := make([]qp.WorkCompletion, 64)
	// The answers, built once: a Send echoes the received buffer (its
	// SGE set per message); a Write or Write-Record goes back from 0 to
	// the peer's slot.
	var sgl [1]qp.SGE
	echo := qp.SendWR{AH: ah, SGL: sgl[:]}
	back := qp.SendWR{Opcode: qp.OpWriteRecord, AH: ah, SGL: []qp.SGE{e.mr.SGE(0, e.size)},
		RemoteSTag: p.Region.STag, RemoteTO: p.Region.TO + uint64(e.slot)}
	if e.mode == ModeRCWrite {
		back.Opcode, back.AH = qp.OpWrite, nil
	}
	if e.mode.writeImm() { // the answer to a Write with Immediate: one back
		echo = qp.SendWR{Opcode: qp.OpWriteImm, AH: ah, SGL: []qp.SGE{e.mr.SGE(0, e.size)}, RemoteSTag: p.Region.STag, RemoteTO: p.Region.TO}
	}
	watch := e.mode == ModeRCWrite && lat
	in := e.slot + e.size - 1
	reposted := 0
	for it := 0; !stop.Load(); {
		if watch && e.size > 0 && e.buf[in] == WriteMark(it) {
			e.buf[e.size-1] = WriteMark(it)
			e.q.PostSend(&back)
			it++
		}
		n := e.cq.Poll(wcs)
		if n == 0 {
			if !cfgBusy {
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
				(netip.AddrPortFrom(wc.Source.Addr().Unmap(), wc.Source.Port()) != p.Addr || wc.SourceQPN != p.QPN) {
				e.foreign.Add(1)
				if wc.Opcode == qp.WCRecv {
					e.repost(wc)
				}
				continue
			}
			switch wc.Opcode {
			case qp.WCRecv:
				e.repost(wc)
				if lat {
					if !e.mode.writeImm() {
						sgl[0] = e.mr.SGE(int(wc.ID), int(wc.Len))
					}
					e.q.PostSend(&echo)
					continue
				}
				n := int(wc.Len)
				if wc.WithImm {
					n = e.size // the Write's bytes, placed before the value came
				}
				t.Note(n)
				if reposted++; e.mode.credited() && reposted%creditsPer(e.slot) == 0 {
					e.q.PostSend(&qp.SendWR{}) // creditBatch more receives are posted
				}
			case qp.WCWriteRecord:
				switch {
				case lat:
					e.q.PostSend(&back)
				case wc.Partial: // deliver-partial: its valid ranges
					var valid uint64
					for _, r := range wc.Valid {
						valid += r.Len()
					}
					t.NotePartial(valid)
				default:
					t.Note(int(wc.Len))
				}
			}
		}
	}
}

// OnRCConnected, when set (by tests), learns whether each RC connection
// an initiator made negotiated MPA CRC.
var OnRCConnected func(crc bool)

// serveStart, when set (by tests), runs as a target's Serve loop starts
// (an RC target's once it accepted): a target that gets the CPU late, as
// on a loaded machine.
var serveStart func()

// connect points the initiator at the target: an AH (UD, RD) or an RC
// connection, from host.
func (e *End) connect(o Offer) (*qp.AH, error) {
	if e.sock == nil {
		_, err := e.q.Connect(context.Background(), o.Addr, qp.RCConfig{NoCRC: e.noCRC})
		if p, ok := e.q.RCParams(); ok && OnRCConnected != nil {
			OnRCConnected(p.CRC)
		}
		return nil, err
	}
	to, err := netip.ParseAddrPort(o.Addr)
	if err != nil {
		return nil, err
	}
	return e.pd.CreateAH(to, o.QPN)
}

// wr is the WR the initiator posts, and the completion that ends a
// round trip.
func (e *End) wr(cfg Config, ah *qp.AH, o Offer) (qp.SendWR, qp.WCOpcode) {
	wr := qp.SendWR{SGL: []qp.SGE{e.mr.SGE(0, cfg.Size)}, AH: ah, RemoteSTag: o.Region.STag, RemoteTO: o.Region.TO}
	want := qp.WCRecv
	switch e.mode {
	case ModeUDWriteRecord, ModeRDWriteRecord:
		wr.Opcode, want = qp.OpWriteRecord, qp.WCWriteRecord
	case ModeRDWrite, ModeRCWrite:
		wr.Opcode, wr.Flags, want = qp.OpWrite, qp.FlagSignaled, qp.WCRDMAWrite
		wr.RemoteTO += uint64(e.slot)
	case ModeRDRead, ModeRCRead:
		wr.Opcode, wr.Flags, want = qp.OpRead, qp.FlagSignaled, qp.WCRDMARead
	case ModeRDAtomic, ModeRCAtomic:
		// Add 1 to the target's word 0; the original value lands in ours.
		wr.Opcode, wr.Flags, wr.CompareAdd, want = qp.OpAtomicFetchAdd, qp.FlagSignaled, 1, qp.WCAtomicFetchAdd
	case ModeRDWriteImm, ModeRCWriteImm:
		wr.Opcode = qp.OpWriteImm // want: the peer's answer, a receive
	}
	return wr, want
}

// DriveLatency connects to the target o describes and times cfg's round
// trips: it returns half of each, warm-up left out.
func (e *End) DriveLatency(cfg Config, o Offer) ([]int64, error) {
	ah, err := e.connect(o)
	if err != nil {
		return nil, err
	}
	busy := cfg.Poll == qp.PollBusy
	if e.lock {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	wcs := make([]qp.WorkCompletion, 64)
	wr, want := e.wr(cfg, ah, o)
	in := e.slot + cfg.Size - 1
	ping := func(it int) error {
		if e.mode == ModeRCWrite {
			e.buf[cfg.Size-1] = WriteMark(it)
		}
		if err := e.q.PostSend(&wr); err != nil {
			return err
		}
		end := time.Now().Add(2 * time.Second)
		if e.mode == ModeRCWrite { // ib_write_lat: watch the last byte
			for k := 0; e.buf[in] != WriteMark(it); k++ {
				for _, wc := range wcs[:e.cq.Poll(wcs)] {
					if wc.Status != qp.Success {
						return errors.New(wc.Status.String())
					}
				}
				if k%1024 == 0 && time.Now().After(end) {
					return os.ErrDeadlineExceeded
				}
			}
			return nil
		}
		for k := 1; ; k++ {
			if e.cq.Poll(wcs[:1]) == 0 {
				if busy && k%1024 != 0 {
					continue // the clock only now and then: it costs a poll's time
				}
				if time.Now().After(end) {
					return os.ErrDeadlineExceeded
				}
				if busy {
					runtime.Gosched()
				} else {
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
	}
	ns := make([]int64, 0, cfg.Iters)
	for it := range max(cfg.Warmup, 0) + cfg.Iters {
		t0 := time.Now()
		if err := ping(it); err != nil {
			return ns, fmt.Errorf("round trip %d: %w", it, err)
		}
		if it >= cfg.Warmup {
			ns = append(ns, int64(time.Since(t0))/2)
		}
	}
	return ns, nil
}

// DriveBandwidth connects to the target o describes and sends for
// cfg.Duration, or cfg.Messages messages. For the modes the initiator
// measures it keeps onesidedDepth WRs outstanding and counts the
// completed ones (draining those still out at the end); for the others it
// only counts what it sent (Result.Sent), and the target's Tally has the
// figures. A run that makes no progress for DrainLimit (no completion; no
// message accepted for sending) fails.
func (e *End) DriveBandwidth(cfg Config, o Offer) (Result, error) {
	res := Result{Config: cfg}
	ah, err := e.connect(o)
	if err != nil {
		return res, err
	}
	busy := cfg.Poll == qp.PollBusy
	wcs := make([]qp.WorkCompletion, 64)
	wr, _ := e.wr(cfg, ah, o)
	pace := newPacer(cfg.FlowRate())
	end := time.Now().Add(cfg.Duration)
	if e.mode.InitiatorMeasured() {
		var first, last time.Time
		var completed atomic.Uint64
		// What is out completes (RD: acknowledged; RC: placed), each
		// within DrainLimit of the one before, or the run fails.
		var late atomic.Bool
		w := watchStall(completed.Load, &late)
		defer w.stop()
		out := 0
		for out > 0 || cfg.more(res.Sent, end) {
			for cfg.more(res.Sent, end) && out < onesidedDepth && e.q.PostSend(&wr) == nil {
				out++
				res.Sent++
				pace.pace(cfg.Size)
			}
			if out == 0 {
				continue
			}
			if !e.wait(wcs, busy, &late) {
				return res, fmt.Errorf("%d WRs outstanding, none completed in %v", out, DrainLimit)
			}
			out--
			if wcs[0].Status != qp.Success {
				return res, errors.New(wcs[0].Status.String())
			}
			last = time.Now()
			if first.IsZero() {
				first = last
			}
			completed.Add(1)
		}
		done := completed.Load()
		res.Received = done
		if res.Sent > done {
			res.Lost = res.Sent - done
		}
		res.ValidBytes = done * uint64(cfg.Size)
		if el := last.Sub(first).Seconds(); el > 0 && done > 1 {
			res.Gbps = float64((done-1)*uint64(cfg.Size)) * 8 / el / 1e9
			res.Mpps = float64(done-1) / el / 1e6
		}
		return res, nil
	}
	credits := o.Credits
	next := time.Now()
	pollEach := e.mode.reliable() || e.mode.rc()
	var held stall
	for i := 0; cfg.more(res.Sent, end); {
		if len(o.Slots) > 0 { // ud-wr: a region per message slot, round-robin
			s := o.Slots[i%len(o.Slots)]
			wr.RemoteSTag, wr.RemoteTO = s.STag, s.TO
		}
		// Poll: credits come back (rc-send), a busy-polled device
		// receives only here (an RD sender's acks), and completions must
		// not pile up. A busy UD sender expects nothing back: a poll would
		// cost it a receive system call per message, so it polls only now
		// and then.
		if !busy || pollEach || i%256 == 0 {
			for _, wc := range wcs[:e.cq.Poll(wcs)] {
				if wc.Opcode == qp.WCRecv && wc.Status == qp.Success {
					e.repost(&wc)
					credits += creditsPer(e.slot)
				}
			}
		}
		if e.mode.credited() && credits <= 0 {
			if held.stuck(res.Sent) {
				return res, fmt.Errorf("no credit back from the target in %v", DrainLimit)
			}
			if !busy {
				e.park(time.Millisecond)
			}
			continue
		}
		if e.q.PostSend(&wr) != nil {
			if held.stuck(res.Sent) {
				return res, fmt.Errorf("the send queue stayed full for %v", DrainLimit)
			}
			runtime.Gosched() // send queue full: the datamover is behind
			continue
		}
		res.Sent++
		credits--
		i++
		pace.pace(cfg.Size)
		if cfg.Interval > 0 { // paced: the loss is the link's, not the receiver's
			next = next.Add(cfg.Interval)
			time.Sleep(time.Until(next))
		}
	}
	res.SentBytes = res.Sent * uint64(cfg.Size)
	return res, nil
}

// stall tells a sender waiting for room or credit that it has waited
// DrainLimit with nothing sent: stuck is called only where it waits, with
// the count of messages sent so far.
type stall struct {
	at   time.Time
	sent uint64
}

func (s *stall) stuck(sent uint64) bool {
	now := time.Now()
	if s.at.IsZero() || sent != s.sent {
		s.at, s.sent = now, sent
		return false
	}
	return now.Sub(s.at) > DrainLimit
}

// stallWatch sets late when progress has not moved for DrainLimit.
type stallWatch struct {
	mu       sync.Mutex
	t        *time.Timer
	last     uint64
	progress func() uint64
	late     *atomic.Bool
	stopped  bool
}

func watchStall(progress func() uint64, late *atomic.Bool) *stallWatch {
	w := &stallWatch{progress: progress, late: late, last: progress()}
	w.mu.Lock()
	w.t = time.AfterFunc(DrainLimit, w.check)
	w.mu.Unlock()
	return w
}

func (w *stallWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if p := w.progress(); p != w.last {
		w.last = p
		w.t.Reset(DrainLimit)
		return
	}
	w.late.Store(true)
}

func (w *stallWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	w.t.Stop()
	w.mu.Unlock()
}

// Drain drives the end's device until stop, after DriveBandwidth: a
// busy-polled device receives only in CQ.Poll, and an RD sender's acks
// of its last messages still come in while the target settles; unread,
// they would make it retransmit until it gives the peer up. An
// event-mode device receives on its own: Drain returns at once.
func (e *End) Drain(stop *atomic.Bool) {
	if e.dev.Config().Poll != qp.PollBusy {
		return
	}
	wcs := make([]qp.WorkCompletion, 64)
	for k := 1; !stop.Load(); k++ {
		e.cq.Poll(wcs)
		if k%1024 == 0 {
			runtime.Gosched()
		}
	}
}

// Tally is what a target counts in a bandwidth run: whole messages and
// their bytes, Write-Records delivered partial and their valid bytes,
// and when the first and last arrived.
type Tally struct {
	start                               time.Time
	received, bytes, partial, validPart atomic.Uint64
	first, last                         atomic.Int64
}

// NewTally starts a count now.
func NewTally() *Tally { return &Tally{start: time.Now()} }

func (t *Tally) mark() {
	now := time.Now().UnixNano()
	t.first.CompareAndSwap(0, now)
	t.last.Store(now)
}

// Note counts one whole message of n bytes.
func (t *Tally) Note(n int) { t.NoteN(1, n) }

// NoteN counts k whole messages of n bytes in all.
func (t *Tally) NoteN(k, n int) {
	t.mark()
	t.received.Add(uint64(k))
	t.bytes.Add(uint64(n))
}

// NoteBytes counts n bytes of a stream of size-byte messages.
func (t *Tally) NoteBytes(n, size int) {
	t.mark()
	t.received.Store(t.bytes.Add(uint64(n)) / uint64(max(size, 1)))
}

// NotePartial counts a Write-Record delivered partial, with its valid
// bytes.
func (t *Tally) NotePartial(valid uint64) {
	t.mark()
	t.partial.Add(1)
	t.validPart.Add(valid)
}

// Bytes is what has arrived so far.
func (t *Tally) Bytes() uint64 { return t.bytes.Load() + t.validPart.Load() }

// Figures are the run's figures as the target measured them: messages
// whole and partial, the bytes valid, and goodput from the first arrival
// to the last (or, if all came at once, from the start: a lower bound,
// never a zero for data that arrived).
func (t *Tally) Figures() (received, partial, valid uint64, gbps, mpps float64) {
	received, partial, valid = t.received.Load(), t.partial.Load(), t.Bytes()
	n := received + partial
	el := time.Duration(t.last.Load() - t.first.Load()).Seconds()
	if el <= 0 || n <= 1 {
		el = time.Unix(0, t.last.Load()).Sub(t.start).Seconds()
	}
	if el > 0 && n > 0 {
		gbps = float64(valid) * 8 / el / 1e9
		mpps = float64(n) / el / 1e6
	}
	return
}

// Settle waits, after a bandwidth run's sender stopped having sent sent
// messages, for what is still on its way: a lossless mode (RD, RC) loses
// nothing, so until every message is in, counted in messages, not bytes,
// so that zero-byte messages are too (bounded by DrainLimit, and by
// closing); ud-wr until the deadlines pass and partial records come in;
// the others 50 ms.
func (t *Tally) Settle(cfg Config, sent uint64, closing func() bool) {
	wait := 50 * time.Millisecond
	if cfg.Mode == ModeUDWriteRecord {
		wait = max(wait, 2*cfg.Deadline)
	}
	time.Sleep(wait)
	if cfg.Mode.lossless() && !cfg.Mode.InitiatorMeasured() {
		WaitUntil(DrainLimit, func() bool { return (closing != nil && closing()) || t.received.Load() >= sent })
	}
}

// qpRun is udperf local's run of a queue-pair mode: cfg.QPs pairs of a
// target and an initiator End in this process, each pair its own two
// devices, driven at once; lat pools their round trips, bw sums them.
func qpRun(cfg Config) (Result, error) {
	tally := NewTally()
	var stop atomic.Bool
	var serving, targets sync.WaitGroup // targets: the Serve loops, which note into tally
	var ends []*End
	defer func() {
		stop.Store(true)
		for _, e := range ends {
			e.Close()
		}
		serving.Wait()
		targets.Wait()
	}()
	type pair struct {
		ini   *End
		offer Offer
		cfg   Config
	}
	var pairs []pair
	host := netip.MustParseAddr("127.0.0.1")
	for i := range cfg.QPs {
		c := cfg
		c.Seed += uint64(2 * i) // each pair's impairment draws its own
		tgt, err := OpenEnd(c, true, "udp4", "127.0.0.1:0")
		if err != nil {
			return Result{}, err
		}
		ends = append(ends, tgt)
		ini, err := OpenEnd(c, false, "udp4", "127.0.0.1:0")
		if err != nil {
			return Result{}, err
		}
		ends = append(ends, ini)
		if err := tgt.Listen(host.String()); err != nil {
			return Result{}, err
		}
		peer := ini.Peer(host)
		targets.Go(func() { tgt.Serve(peer, cfg.Test == TestLat, tally, &stop) })
		pairs = append(pairs, pair{ini, tgt.Offer(), c})
	}
	var drivers sync.WaitGroup
	samples := make([][]int64, len(pairs))
	results := make([]Result, len(pairs))
	errs := make([]error, len(pairs))
	for i, p := range pairs {
		drivers.Go(func() {
			if cfg.Test == TestLat {
				samples[i], errs[i] = p.ini.DriveLatency(p.cfg, p.offer)
				return
			}
			results[i], errs[i] = p.ini.DriveBandwidth(p.cfg, p.offer)
		})
	}
	drivers.Wait()
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	var drained atomic.Bool
	for _, p := range pairs {
		serving.Go(func() { p.ini.Drain(&drained) })
	}
	defer drained.Store(true)
	if cfg.Test == TestLat {
		var all []int64
		for _, s := range samples {
			all = append(all, s...)
		}
		return latResult(cfg, all), nil
	}
	r := Result{Config: cfg}
	for _, x := range results {
		r.Sent += x.Sent
		r.SentBytes += x.SentBytes
		r.Received += x.Received
		r.ValidBytes += x.ValidBytes
		r.Gbps += x.Gbps
		r.Mpps += x.Mpps
	}
	if !cfg.Mode.InitiatorMeasured() {
		tally.Settle(cfg, r.Sent, nil)
		// The targets stop counting before the tally is read: its figures
		// are several counters, and a record noted between two reads
		// would make them disagree.
		stop.Store(true)
		targets.Wait()
		r.Received, r.Partial, r.ValidBytes, r.Gbps, r.Mpps = tally.Figures()
		r.WholeBytes = tally.bytes.Load()
	}
	if r.Sent > r.Received {
		r.Lost = r.Sent - r.Received
	}
	return r, nil
}
