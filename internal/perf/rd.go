package perf

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// RDMA Write over RD. The target posts nothing and sees nothing: a Write
// is done when the source's completion says the target acknowledged it.

// oneSidedRun is a source and a target for one-sided operations: a
// region of the run's size at the target, and the source's handle for it.
type oneSidedRun struct {
	src, dst *udSide
	region   *qp.MR
	ah       *qp.AH
}

func (r *oneSidedRun) close() { r.src.dev.Close(); r.dst.dev.Close() }

// rdWriteSides opens a source and a target with a region of size bytes.
func rdWriteSides(cfg Config, size int) (*oneSidedRun, error) {
	src, err := newUDSide(cfg, max(size, 1))
	if err != nil {
		return nil, err
	}
	dst, err := newUDSide(Config{Mode: cfg.Mode, Poll: cfg.Poll, QPs: 1, NoCRC: cfg.NoCRC, Loss: cfg.Loss, Seed: cfg.Seed + 1, Segment: cfg.Segment, OnDevice: cfg.OnDevice}, 1)
	if err != nil {
		src.dev.Close()
		return nil, err
	}
	r := &oneSidedRun{src: src, dst: dst}
	if r.region, err = dst.pd.RegisterMemory(make([]byte, max(size, 1)), qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessRemoteRead); err != nil {
		r.close()
		return nil, err
	}
	if r.ah, err = src.pd.CreateAH(dst.socks[0].LocalAddr(), dst.qps[0].QPN()); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// serveTarget polls the target's CQ: a busy-polled device receives only
// when its CQ is polled, and Write-Record records must be taken off it.
// It returns a function that stops it.
func serveTarget(cfg Config, dst *udSide) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		wc := make([]qp.WorkCompletion, 16)
		for !done.Load() {
			if dst.cqs[0].Poll(wc) == 0 && cfg.Poll != qp.PollBusy {
				waitBriefly(dst.cqs[0])
			}
		}
	}()
	return func() { done.Store(true); wg.Wait() }
}

// rdWriteLatency: post a signaled Write, wait for its completion; half
// that time is the sample (the Write one way, its ack the other).
func rdWriteLatency(cfg Config) (Result, error) {
	run, err := rdWriteSides(Config{Mode: cfg.Mode, Poll: cfg.Poll, QPs: 1, NoCRC: cfg.NoCRC, Loss: cfg.Loss, Seed: cfg.Seed, Segment: cfg.Segment, OnDevice: cfg.OnDevice}, cfg.Size)
	if err != nil {
		return Result{}, err
	}
	defer run.close()
	src := run.src
	defer serveTarget(cfg, run.dst)()
	defer lockThread(cfg)()
	busy := cfg.Poll == qp.PollBusy
	var stop atomic.Bool
	wr := oneSidedWR(cfg, run)
	wc := make([]qp.WorkCompletion, 1)
	ns := make([]int64, 0, cfg.Iters)
	for it := range cfg.Warmup + cfg.Iters {
		t0 := time.Now()
		if err := src.qps[0].PostSend(&wr); err != nil {
			return Result{}, err
		}
		if !next(src.cqs[0], busy, wc, &stop) {
			return Result{}, errStopped
		}
		if wc[0].Status != qp.Success {
			return Result{}, errors.New("perf: write completion " + wc[0].Status.String())
		}
		if it >= cfg.Warmup {
			ns = append(ns, int64(time.Since(t0))/2)
		}
	}
	return latResult(cfg, ns), nil
}

// rdWriteDepth is how many Writes a bandwidth run keeps outstanding.
const rdWriteDepth = 16

// rdWriteBandwidth keeps rdWriteDepth Writes of cfg.Size in flight and
// counts the bytes of those completed: completed means acknowledged,
// which means placed at the target.
func rdWriteBandwidth(cfg Config) (Result, error) {
	run, err := rdWriteSides(cfg, cfg.Size)
	if err != nil {
		return Result{}, err
	}
	defer run.close()
	src := run.src
	defer serveTarget(cfg, run.dst)()
	busy := cfg.Poll == qp.PollBusy
	var sending, stop atomic.Bool
	var sent, done, ended atomic.Uint64 // ended: completions of any status
	var first, last atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	sending.Store(true)
	wg.Add(1)
	go func() {
		defer wg.Done()
		q, cq := src.qps[0], src.cqs[0]
		wr := oneSidedWR(cfg, run)
		wcs := make([]qp.WorkCompletion, rdWriteDepth)
		out := 0
		for !stop.Load() {
			for sending.Load() && out < rdWriteDepth {
				if err := q.PostSend(&wr); err != nil {
					break
				}
				out++
				sent.Add(1)
			}
			n := cq.Poll(wcs)
			if n == 0 {
				if !busy {
					waitBriefly(cq)
				}
				continue
			}
			now := time.Now().UnixNano()
			first.CompareAndSwap(0, now)
			last.Store(now)
			ended.Add(uint64(n))
			for _, wc := range wcs[:n] {
				out--
				if wc.Status != qp.Success {
					failed.Store(wc.Status.String())
					continue
				}
				done.Add(1)
			}
		}
	}()
	start := finish(cfg, &sending, &stop, &wg, func() bool { return ended.Load() >= sent.Load() }) // every WR completes
	if f := failed.Load(); f != nil {
		return Result{}, errors.New("perf: write completed with " + f.(string))
	}
	return bwResult(cfg, start, sent.Load(), done.Load(), time.Unix(0, first.Load()), time.Unix(0, last.Load())), nil
}

// oneSidedWR is the WR a one-sided mode posts: a Write or Write-Record
// from the source's buffer, or a Read into it (which then needs remote
// write access: the source side's MR is registered with it).
func oneSidedWR(cfg Config, run *oneSidedRun) qp.SendWR {
	wr := qp.SendWR{Opcode: qp.OpWrite, Flags: qp.FlagSignaled, SGL: []qp.SGE{run.src.mr.SGE(0, cfg.Size)}, AH: run.ah,
		RemoteSTag: run.region.STag(), RemoteTO: run.region.Addr()}
	switch cfg.Mode {
	case ModeRDRead:
		wr.Opcode = qp.OpRead
	case ModeRDWriteRecord:
		wr.Opcode = qp.OpWriteRecord
	}
	return wr
}
