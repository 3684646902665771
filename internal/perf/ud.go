package perf

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// udSide is one device with its socket, PD, MR and QPs.
type udSide struct {
	dev   *qp.Device
	socks []*qp.Socket
	pd    *qp.PD
	mr    *qp.MR
	qps   []*qp.QP
	cqs   []*qp.CQ
}

// recvDepth receives stay posted per QP.
const recvDepth = 256

func newUDSide(cfg Config, slot int) (*udSide, error) {
	dc := qp.DeviceConfig{Poll: cfg.Poll, RecvBuffer: 32 << 20, NoCRC: cfg.NoCRC}
	typ := qp.UD
	if cfg.Mode.reliable() {
		typ = qp.RD
	}
	// RD: both ends drop, data and acks; UD: the sender's end (udBandwidth
	// gives the receiver none), as Write-Record's runs do.
	if cfg.Loss > 0 {
		dc.Impair = &qp.Impairment{Seed: cfg.Seed, Loss: cfg.Loss}
	}
	dev, err := openDevice(cfg, dc)
	if err != nil {
		return nil, err
	}
	s := &udSide{dev: dev, pd: dev.AllocPD()}
	access := qp.AccessLocalWrite
	if cfg.Mode == ModeRDRead {
		access |= qp.AccessRemoteWrite // the sink of Read Responses
	}
	if s.mr, err = s.pd.RegisterMemory(make([]byte, cfg.QPs*recvDepth*slot), access); err != nil {
		dev.Close()
		return nil, err
	}
	// A socket per QP, as the baseline has a socket pair per flow: each
	// flow gets its own kernel receive queue. (QPs may share a socket;
	// then one receive path serves them all.)
	for range cfg.QPs {
		sock, err := dev.Bind("udp4", "127.0.0.1:0")
		if err != nil {
			dev.Close()
			return nil, err
		}
		s.socks = append(s.socks, sock)
		cq, err := dev.CreateCQ(4 * recvDepth)
		if err != nil {
			dev.Close()
			return nil, err
		}
		q, err := s.pd.CreateQP(qp.QPAttr{Type: typ, SendCQ: cq, RecvCQ: cq,
			Caps: qp.QPCaps{MaxSendWR: 1024, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1},
			RD:   qp.RDConfig{Segment: cfg.Segment}})
		if err != nil {
			dev.Close()
			return nil, err
		}
		if err := q.Activate(sock); err != nil {
			dev.Close()
			return nil, err
		}
		s.qps = append(s.qps, q)
		s.cqs = append(s.cqs, cq)
	}
	return s, nil
}

// postRecvs posts QP i's receives: slot-byte buffers in its part of the MR.
func (s *udSide) postRecvs(i, slot int) error {
	for k := range recvDepth {
		off := (i*recvDepth + k) * slot
		if err := s.qps[i].PostRecv(&qp.RecvWR{ID: uint64(off), SGL: []qp.SGE{s.mr.SGE(off, slot)}}); err != nil {
			return err
		}
	}
	return nil
}

// next waits for one completion on cq: spinning in busy mode, parked in
// event mode. It returns false once stop is set or the device closes.
func next(cq *qp.CQ, busy bool, wc []qp.WorkCompletion, stop *atomic.Bool) bool {
	for k := 1; ; k++ {
		if cq.Poll(wc[:1]) == 1 {
			return true
		}
		if k%1024 == 0 {
			runtime.Gosched() // as the baseline does: spinners may outnumber cores
		}
		if stop.Load() {
			return false
		}
		if !busy {
			if err := cq.Wait(context.Background()); err != nil {
				return false
			}
		}
	}
}

func udLatency(cfg Config) (Result, error) {
	slot := max(cfg.Size, 1)
	cli, err := newUDSide(cfg, slot)
	if err != nil {
		return Result{}, err
	}
	defer cli.dev.Close()
	srv, err := newUDSide(cfg, slot)
	if err != nil {
		return Result{}, err
	}
	defer srv.dev.Close()
	busy := cfg.Poll == qp.PollBusy
	var stop atomic.Bool
	var wg, clients sync.WaitGroup
	samples := make([][]int64, cfg.QPs)
	errs := make([]error, 2*cfg.QPs)
	for i := range cfg.QPs {
		if err := srv.postRecvs(i, slot); err != nil {
			return Result{}, err
		}
		if err := cli.postRecvs(i, slot); err != nil {
			return Result{}, err
		}
		toSrv, err := cli.pd.CreateAH(srv.socks[i].LocalAddr(), srv.qps[i].QPN())
		if err != nil {
			return Result{}, err
		}
		toCli, err := srv.pd.CreateAH(cli.socks[i].LocalAddr(), cli.qps[i].QPN())
		if err != nil {
			return Result{}, err
		}
		wg.Add(1)
		clients.Add(1)
		go func() { // server: echo every message back
			defer wg.Done()
			defer lockThread(cfg)()
			q, cq := srv.qps[i], srv.cqs[i]
			wc := make([]qp.WorkCompletion, 1)
			send := qp.SendWR{SGL: []qp.SGE{srv.mr.SGE(0, cfg.Size)}, AH: toCli}
			recv := qp.RecvWR{SGL: make([]qp.SGE, 1)}
			for next(cq, busy, wc, &stop) {
				if wc[0].Status != qp.Success {
					errs[2*i] = errors.New("perf: server completion " + wc[0].Status.String())
					return
				}
				recv.ID = wc[0].ID
				recv.SGL[0] = srv.mr.SGE(int(wc[0].ID), slot)
				if err := q.PostRecv(&recv); err != nil {
					errs[2*i] = err
					return
				}
				if err := q.PostSend(&send); err != nil {
					errs[2*i] = err
					return
				}
			}
		}()
		go func() { // client: timed ping-pongs
			defer clients.Done()
			defer lockThread(cfg)()
			q, cq := cli.qps[i], cli.cqs[i]
			wc := make([]qp.WorkCompletion, 1)
			send := qp.SendWR{SGL: []qp.SGE{cli.mr.SGE(0, cfg.Size)}, AH: toSrv}
			recv := qp.RecvWR{SGL: make([]qp.SGE, 1)}
			ns := make([]int64, 0, cfg.Iters)
			for it := range cfg.Warmup + cfg.Iters {
				t0 := time.Now()
				if err := q.PostSend(&send); err != nil {
					errs[2*i+1] = err
					return
				}
				if !next(cq, busy, wc, &stop) {
					errs[2*i+1] = errors.New("perf: client stopped")
					return
				}
				rtt := time.Since(t0)
				if wc[0].Status != qp.Success || wc[0].Len != uint32(cfg.Size) {
					errs[2*i+1] = errors.New("perf: client completion " + wc[0].Status.String())
					return
				}
				recv.ID = wc[0].ID
				recv.SGL[0] = cli.mr.SGE(int(wc[0].ID), slot)
				if err := q.PostRecv(&recv); err != nil {
					errs[2*i+1] = err
					return
				}
				if it >= cfg.Warmup {
					ns = append(ns, int64(rtt)/2)
				}
			}
			samples[i] = ns
		}()
	}
	clients.Wait()
	stop.Store(true) // and the servers stop
	cli.dev.Close()
	srv.dev.Close()
	wg.Wait()
	var all []int64
	for i := range cfg.QPs {
		if errs[2*i+1] != nil {
			return Result{}, errs[2*i+1]
		}
		all = append(all, samples[i]...)
	}
	return latResult(cfg, all), nil
}

func udBandwidth(cfg Config) (Result, error) {
	slot := max(cfg.Size, 1)
	tx, err := newUDSide(Config{Mode: cfg.Mode, Poll: cfg.Poll, QPs: cfg.QPs, NoCRC: cfg.NoCRC, Loss: cfg.Loss, Seed: cfg.Seed + 1, OnDevice: cfg.OnDevice}, slot)
	if err != nil {
		return Result{}, err
	}
	defer tx.dev.Close()
	rxCfg := cfg
	if !cfg.Mode.reliable() {
		rxCfg.Loss = 0 // UD: the sender's impairment layer drops
	}
	rx, err := newUDSide(rxCfg, slot)
	if err != nil {
		return Result{}, err
	}
	defer rx.dev.Close()
	busy := cfg.Poll == qp.PollBusy
	var stop, sending atomic.Bool
	var sent, received atomic.Uint64
	var first, last atomic.Int64
	var wg sync.WaitGroup
	sending.Store(true)
	for i := range cfg.QPs {
		if err := rx.postRecvs(i, slot); err != nil {
			return Result{}, err
		}
		ah, err := tx.pd.CreateAH(rx.socks[i].LocalAddr(), rx.qps[i].QPN())
		if err != nil {
			return Result{}, err
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			q, cq := rx.qps[i], rx.cqs[i]
			wcs := make([]qp.WorkCompletion, 64)
			recv := qp.RecvWR{SGL: make([]qp.SGE, 1)}
			for !stop.Load() {
				n := cq.Poll(wcs)
				if n == 0 {
					if !busy {
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
						cq.Wait(ctx)
						cancel()
					}
					continue
				}
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				for _, wc := range wcs[:n] {
					if wc.Status == qp.Success {
						received.Add(1)
					}
					recv.ID = wc.ID
					recv.SGL[0] = rx.mr.SGE(int(wc.ID), slot)
					q.PostRecv(&recv)
				}
			}
		}()
		go func() {
			defer wg.Done()
			q, cq := tx.qps[i], tx.cqs[i]
			send := qp.SendWR{SGL: []qp.SGE{tx.mr.SGE(0, cfg.Size)}, AH: ah}
			wcs := make([]qp.WorkCompletion, 64)
			// A busy-polled device receives only in CQ.Poll: an RD sender
			// takes its peer's challenge and acks there.
			// It polls until the run ends, not only while it sends: the
			// acks of its last messages still come in after that (a
			// reliable run drains, finish), and unread they would make
			// the sender retransmit until it gives the peer up.
			pollTx := busy && cfg.Mode.reliable()
			for {
				if pollTx {
					cq.Poll(wcs)
				}
				if !sending.Load() {
					if !pollTx || stop.Load() {
						return
					}
					continue
				}
				if err := q.PostSend(&send); err != nil {
					runtime.Gosched() // send queue full: the datamover is behind
					continue
				}
				sent.Add(1)
			}
		}()
	}
	var drained func() bool
	if cfg.Mode.reliable() {
		drained = func() bool { return received.Load() >= sent.Load() }
	}
	start := finish(cfg, &sending, &stop, &wg, drained)
	return bwResult(cfg, start, sent.Load(), received.Load(), time.Unix(0, first.Load()), time.Unix(0, last.Load())), nil
}
