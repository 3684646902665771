package perf

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// Write-Record: the target places what arrives in its region with no
// receive posted and records it; these runs measure it the way the UD
// Send/Recv runs measure Send.

const wrSlots = 16 // message slots in each region, written round-robin

type wrSide struct {
	dev  *qp.Device
	sock *qp.Socket
	pd   *qp.PD
	mr   *qp.MR
	cq   *qp.CQ
	q    *qp.QP
	// slots are one region per message slot: messages to different STags
	// do not supersede each other (one MSN in progress per source and
	// STag), so each can run to its deadline.
	slots []*qp.MR
}

func newWRSide(cfg Config, imp *qp.Impairment, slot int) (*wrSide, error) {
	dev, err := openDevice(cfg, qp.DeviceConfig{Poll: cfg.Poll, RecvBuffer: 32 << 20, NoCRC: cfg.NoCRC, Impair: imp})
	if err != nil {
		return nil, err
	}
	s := &wrSide{dev: dev, pd: dev.AllocPD()}
	fail := func(err error) (*wrSide, error) { dev.Close(); return nil, err }
	if s.sock, err = dev.Bind("udp4", "127.0.0.1:0"); err != nil {
		return fail(err)
	}
	if s.mr, err = s.pd.RegisterMemory(make([]byte, wrSlots*slot), qp.AccessLocalWrite|qp.AccessRemoteWrite); err != nil {
		return fail(err)
	}
	for i := range wrSlots {
		m, err := s.pd.RegisterMemory(s.mr.Bytes()[i*slot:(i+1)*slot], qp.AccessLocalWrite|qp.AccessRemoteWrite)
		if err != nil {
			return fail(err)
		}
		s.slots = append(s.slots, m)
	}
	if s.cq, err = dev.CreateCQ(4096); err != nil {
		return fail(err)
	}
	policy := writerecord.Discard
	if cfg.Partial {
		policy = writerecord.DeliverPartial
	}
	s.q, err = s.pd.CreateQP(qp.QPAttr{Type: qp.UD, SendCQ: s.cq, RecvCQ: s.cq,
		Caps:               qp.QPCaps{MaxSendWR: 1024, MaxSendSGE: 1},
		WriteRecordSegment: cfg.Segment,
		WriteRecord:        writerecord.Config{Timeout: cfg.Deadline, Policy: policy}})
	if err != nil {
		return fail(err)
	}
	if err := s.q.Activate(s.sock); err != nil {
		return fail(err)
	}
	return s, nil
}

func wrLatency(cfg Config) (Result, error) {
	slot := max(cfg.Size, 1)
	cli, err := newWRSide(cfg, nil, slot)
	if err != nil {
		return Result{}, err
	}
	defer cli.dev.Close()
	srv, err := newWRSide(cfg, nil, slot)
	if err != nil {
		return Result{}, err
	}
	defer srv.dev.Close()
	busy := cfg.Poll == qp.PollBusy
	toSrv, err := cli.pd.CreateAH(srv.sock.LocalAddr(), srv.q.QPN())
	if err != nil {
		return Result{}, err
	}
	toCli, err := srv.pd.CreateAH(cli.sock.LocalAddr(), cli.q.QPN())
	if err != nil {
		return Result{}, err
	}
	var stop atomic.Bool
	var server sync.WaitGroup
	server.Add(1)
	go func() { // echo each record back as a Write-Record of the same size
		defer server.Done()
		defer lockThread(cfg)()
		wc := make([]qp.WorkCompletion, 1)
		wr := qp.SendWR{Opcode: qp.OpWriteRecord, SGL: []qp.SGE{srv.mr.SGE(0, cfg.Size)}, AH: toCli, RemoteSTag: cli.mr.STag(), RemoteTO: cli.mr.Addr()}
		for next(srv.cq, busy, wc, &stop) {
			if wc[0].Opcode != qp.WCWriteRecord {
				continue
			}
			if err := srv.q.PostSend(&wr); err != nil {
				return
			}
		}
	}()
	defer lockThread(cfg)()
	wc := make([]qp.WorkCompletion, 1)
	wr := qp.SendWR{Opcode: qp.OpWriteRecord, SGL: []qp.SGE{cli.mr.SGE(0, cfg.Size)}, AH: toSrv, RemoteSTag: srv.mr.STag(), RemoteTO: srv.mr.Addr()}
	ns := make([]int64, 0, cfg.Iters)
	for it := range cfg.Warmup + cfg.Iters {
		t0 := time.Now()
		if err := cli.q.PostSend(&wr); err != nil {
			stop.Store(true)
			return Result{}, err
		}
		for {
			if !next(cli.cq, busy, wc, &stop) {
				return Result{}, errStopped
			}
			if wc[0].Opcode == qp.WCWriteRecord {
				break
			}
		}
		if it >= cfg.Warmup {
			ns = append(ns, int64(time.Since(t0))/2)
		}
	}
	stop.Store(true)
	cli.dev.Close()
	srv.dev.Close()
	server.Wait()
	return latResult(cfg, ns), nil
}

// wrBandwidth blasts Write-Record messages of cfg.Size and counts, at the
// target, the bytes recorded valid: whole messages, and with -partial the
// valid ranges of incomplete ones.
func wrBandwidth(cfg Config) (Result, error) {
	slot := max(cfg.Size, 1)
	var imp *qp.Impairment
	if cfg.Loss > 0 {
		imp = &qp.Impairment{Seed: cfg.Seed, Loss: cfg.Loss}
	}
	tx, err := newWRSide(cfg, imp, slot)
	if err != nil {
		return Result{}, err
	}
	defer tx.dev.Close()
	rx, err := newWRSide(cfg, nil, slot)
	if err != nil {
		return Result{}, err
	}
	defer rx.dev.Close()
	ah, err := tx.pd.CreateAH(rx.sock.LocalAddr(), rx.q.QPN())
	if err != nil {
		return Result{}, err
	}
	busy := cfg.Poll == qp.PollBusy
	var sending, stop atomic.Bool
	var sent, complete, partial, validBytes, wholeBytes atomic.Uint64
	var first, last atomic.Int64
	var wg sync.WaitGroup
	sending.Store(true)
	wg.Add(2)
	go func() {
		defer wg.Done()
		wcs := make([]qp.WorkCompletion, 64)
		for !stop.Load() {
			n := rx.cq.Poll(wcs)
			if n == 0 {
				if !busy {
					waitBriefly(rx.cq)
				}
				continue
			}
			now := time.Now().UnixNano()
			first.CompareAndSwap(0, now)
			last.Store(now)
			for _, wc := range wcs[:n] {
				if wc.Opcode != qp.WCWriteRecord {
					continue
				}
				if !wc.Partial {
					complete.Add(1)
					validBytes.Add(uint64(wc.Len))
					wholeBytes.Add(uint64(wc.Len))
					continue
				}
				partial.Add(1)
				for _, r := range wc.Valid {
					validBytes.Add(r.Len())
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		wr := qp.SendWR{Opcode: qp.OpWriteRecord, SGL: []qp.SGE{tx.mr.SGE(0, cfg.Size)}, AH: ah}
		next := time.Now()
		for i := 0; sending.Load(); {
			dst := rx.slots[i%wrSlots]
			wr.RemoteSTag, wr.RemoteTO = dst.STag(), dst.Addr()
			if err := tx.q.PostSend(&wr); err != nil {
				runtime.Gosched() // send queue full: the datamover is behind
				continue
			}
			sent.Add(1)
			i++
			if cfg.Interval > 0 { // paced: the loss is the link's, not the receiver's
				next = next.Add(cfg.Interval)
				time.Sleep(time.Until(next))
			}
		}
	}()
	time.Sleep(cfg.Duration)
	sending.Store(false)
	time.Sleep(max(50*time.Millisecond, 2*cfg.Deadline)) // deadlines pass: partial records come in
	stop.Store(true)
	wg.Wait()
	r := Result{Config: cfg, Sent: sent.Load(), Received: complete.Load(), Partial: partial.Load(),
		ValidBytes: validBytes.Load(), WholeBytes: wholeBytes.Load(), SentBytes: sent.Load() * uint64(cfg.Size)}
	if r.Sent > r.Received {
		r.Lost = r.Sent - r.Received
	}
	if el := time.Duration(last.Load() - first.Load()).Seconds(); el > 0 {
		r.Gbps = float64(r.ValidBytes) * 8 / el / 1e9
		r.Mpps = float64(r.Received+r.Partial) / el / 1e6
	}
	return r, nil
}
