// Command rdflow moves data over RD for the bottleneck experiment
// (go run ./experiments -only bottleneck): RDMA Writes through the qp
// package's public API, with each flow's goodput counted in time bins,
// which udperf (one average per run) does not give.
//
//	rdflow sink -addr IP:PORT [-peers N] [-size B] [-segment B]
//	rdflow send -to IP:PORT -qpn Q -stag S [-flows K] [-size B] [-segment B] [-depth W] [-D 20s] [-bin 1s]
//
// The sink opens one device, one region and one RD QP that every flow
// writes into (RD: one QP serves every peer), prints what a sender needs
// as one JSON line ({"addr","qpn","stag","to"}), and serves until its
// standard input closes or it is signalled. Its peer caps are raised to
// -peers, as a server of that many clients would raise them.
//
// The sender opens -flows flows, each a device, a socket (its own port:
// a peer) and an RD QP of its own, and each keeps -depth RDMA Writes of
// -size bytes outstanding to the sink for -D, as udperf's rd-write does.
// A Write counts when it completes, which over RD is when the sink has
// acknowledged all of it: the bytes counted are delivered bytes. Writes
// still outstanding at the end are given -drain to complete and are
// counted in the bin they complete in. It prints one JSON document: the
// start time, the bin width, and per flow the bytes completed in each
// bin, its totals, and its device's RD counters (Data frames sent,
// retransmissions).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rdflow sink|send [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "sink":
		err = sink(os.Args[2:])
	case "send":
		err = send(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want sink or send)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdflow %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// Offer is what a sender needs of the sink.
type Offer struct {
	Addr string `json:"addr"`
	QPN  uint32 `json:"qpn"`
	STag uint32 `json:"stag"`
	TO   uint64 `json:"to"`
}

func sink(args []string) error {
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "UDP address to bind")
	peers := fs.Int("peers", 16, "the peers the QP must hold at once (its MaxPeers and MaxPeersPerAddr)")
	size := fs.Int("size", 512<<10, "largest Write a sender makes (the region's size)")
	segment := fs.Int("segment", 1400, "RD segment payload (udperf's -mtu)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dev, err := qp.Open(qp.DeviceConfig{Poll: qp.PollEvent, RecvBuffer: 32 << 20})
	if err != nil {
		return err
	}
	defer dev.Close()
	pd := dev.AllocPD()
	mr, err := pd.RegisterMemory(make([]byte, *size), qp.AccessLocalWrite|qp.AccessRemoteWrite)
	if err != nil {
		return err
	}
	cq, err := dev.CreateCQ(4096)
	if err != nil {
		return err
	}
	attr := qp.QPAttr{Type: qp.RD, SendCQ: cq, RecvCQ: cq, Caps: qp.QPCaps{MaxSendWR: 64, MaxRecvWR: 64}}
	attr.RD.Segment = *segment
	attr.RD.MaxPeers = max(1024, *peers)
	attr.RD.MaxPeersPerAddr = max(64, *peers)
	q, err := pd.CreateQP(attr)
	if err != nil {
		return err
	}
	sock, err := dev.Bind("udp4", *addr)
	if err != nil {
		return err
	}
	if err := q.Activate(sock); err != nil {
		return err
	}
	b, _ := json.Marshal(Offer{Addr: sock.LocalAddr().String(), QPN: q.QPN(), STag: mr.STag(), TO: mr.Addr()})
	fmt.Printf("%s\n", b)
	// The device receives and acknowledges on its own (event mode); the
	// sink only has to stay up, draining its CQ of anything that lands.
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	wcs := make([]qp.WorkCompletion, 64)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-sig:
			return nil
		case <-tick.C:
			cq.Poll(wcs)
		}
	}
}

// Flow is one sender QP's outcome.
type Flow struct {
	Local       string   `json:"local"`
	Bins        []uint64 `json:"bins_bytes"` // bytes completed in each bin
	Bytes       uint64   `json:"bytes"`      // all completed, drain included
	Posted      uint64   `json:"posted_wrs"`
	Completed   uint64   `json:"completed_wrs"`
	Failed      uint64   `json:"failed_wrs"`
	FirstError  string   `json:"first_error,omitempty"`
	DataFrames  uint64   `json:"rd_data_frames"`
	Retransmits uint64   `json:"rd_retransmits"`
	// Congestion is the sender's congestion control sampled every
	// -sample (QP.RDPeer): the time in each state, in samples, and the
	// samples themselves.
	Modes   map[string]int `json:"cc_modes,omitempty"`
	Samples []Sample       `json:"cc_samples,omitempty"`
}

// Sample is the sender's congestion control at one moment.
type Sample struct {
	T          float64 `json:"t_s"`
	Mode       string  `json:"mode"`
	Cwnd       int     `json:"cwnd_bytes"`
	InFlight   int     `json:"inflight_frames"`
	SRTTus     int64   `json:"srtt_us"`
	MinRTTus   int64   `json:"min_rtt_us"`
	PacingMbps float64 `json:"pacing_mbps"`
	BwMbps     float64 `json:"bw_mbps"`
	// The sender's retransmissions so far: all, for losses by the
	// packet and the time thresholds, and those shown needless.
	Retransmits uint64 `json:"retransmits"`
	LostByCount uint64 `json:"lost_by_count"`
	LostByTime  uint64 `json:"lost_by_time"`
	Spurious    uint64 `json:"spurious"`
}

// Report is what send prints.
type Report struct {
	StartUnixNano int64   `json:"start_unix_ns"`
	BinSeconds    float64 `json:"bin_s"`
	Seconds       float64 `json:"duration_s"`
	Size          int     `json:"size"`
	Segment       int     `json:"segment"`
	Depth         int     `json:"depth"`
	Flows         []Flow  `json:"flows"`
}

type flow struct {
	dev  *qp.Device
	cq   *qp.CQ
	q    *qp.QP
	wr   qp.SendWR
	bins []atomic.Uint64
	out  Flow
}

func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	to := fs.String("to", "", "the sink's IP:PORT")
	qpn := fs.Uint("qpn", 0, "the sink's QP number")
	stag := fs.Uint("stag", 0, "the sink region's STag")
	rto := fs.Uint64("rto", 0, "the sink region's tagged offset")
	bind := fs.String("bind", "0.0.0.0", "local IP each flow binds (a port each)")
	flows := fs.Int("flows", 1, "flows: a device, a socket and an RD QP each")
	size := fs.Int("size", 512<<10, "bytes per RDMA Write")
	segment := fs.Int("segment", 1400, "RD segment payload (udperf's -mtu)")
	depth := fs.Int("depth", 16, "Writes each flow keeps outstanding (udperf's rd-write: 16)")
	dur := fs.Duration("D", 10*time.Second, "how long each flow posts Writes")
	bin := fs.Duration("bin", time.Second, "goodput bin width")
	drain := fs.Duration("drain", 10*time.Second, "how long outstanding Writes may take to complete after -D")
	buf := fs.Int("sockbuf", 0, "socket buffers per flow, bytes (0: the device's defaults)")
	sample := fs.Duration("sample", 100*time.Millisecond, "how often each flow samples its congestion control (0: never)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dst, err := netip.ParseAddrPort(*to)
	if err != nil {
		return fmt.Errorf("-to: %w", err)
	}
	if *flows < 1 || *flows > 1000 || *depth < 1 || *size < 1 || *dur <= 0 || *dur > time.Hour || *bin <= 0 {
		return errors.New("-flows 1..1000, -depth, -size, -bin above 0, -D up to 1h")
	}
	nbins := int((*dur + *drain + *bin - 1) / *bin)
	fl := make([]*flow, *flows)
	defer func() {
		for _, f := range fl {
			if f != nil && f.dev != nil {
				f.dev.Close()
			}
		}
	}()
	for i := range fl {
		f := &flow{bins: make([]atomic.Uint64, nbins)}
		fl[i] = f
		if f.dev, err = qp.Open(qp.DeviceConfig{Poll: qp.PollEvent, RecvBuffer: *buf, SendBuffer: *buf}); err != nil {
			return err
		}
		pd := f.dev.AllocPD()
		mr, err := pd.RegisterMemory(make([]byte, *size), qp.AccessLocalWrite)
		if err != nil {
			return err
		}
		if f.cq, err = f.dev.CreateCQ(max(64, 2**depth)); err != nil {
			return err
		}
		attr := qp.QPAttr{Type: qp.RD, SendCQ: f.cq, RecvCQ: f.cq, Caps: qp.QPCaps{MaxSendWR: max(64, 2**depth), MaxRecvWR: 16}}
		attr.RD.Segment = *segment
		if f.q, err = pd.CreateQP(attr); err != nil {
			return err
		}
		sock, err := f.dev.Bind("udp4", *bind+":0")
		if err != nil {
			return err
		}
		if err := f.q.Activate(sock); err != nil {
			return err
		}
		f.out.Local = sock.LocalAddr().String()
		ah, err := pd.CreateAH(dst, uint32(*qpn))
		if err != nil {
			return err
		}
		f.wr = qp.SendWR{Opcode: qp.OpWrite, Flags: qp.FlagSignaled, AH: ah, SGL: []qp.SGE{mr.SGE(0, *size)},
			RemoteSTag: uint32(*stag), RemoteTO: *rto}
	}
	start := time.Now()
	end := start.Add(*dur)
	giveUp := end.Add(*drain)
	var wg sync.WaitGroup
	for _, f := range fl {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.run(*depth, uint64(*size), start, end, giveUp, *bin, *sample)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	rep := Report{StartUnixNano: start.UnixNano(), BinSeconds: bin.Seconds(), Seconds: took.Seconds(),
		Size: *size, Segment: *segment, Depth: *depth}
	for _, f := range fl {
		st := f.dev.Stats()
		f.out.DataFrames, f.out.Retransmits = st.RDDataSent.Load(), st.RDRetransmits.Load()
		last := 0
		for i := range f.bins {
			if f.bins[i].Load() > 0 {
				last = i + 1
			}
		}
		last = max(last, int(*dur / *bin))
		for i := range f.bins[:min(last, len(f.bins))] {
			f.out.Bins = append(f.out.Bins, f.bins[i].Load())
		}
		rep.Flows = append(rep.Flows, f.out)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Printf("%s\n", b)
	return nil
}

// run keeps depth Writes outstanding until end, then waits for those
// still out until giveUp; each completed Write's bytes go to the bin of
// the time it completed.
func (f *flow) run(depth int, size uint64, start, end, giveUp time.Time, bin, sample time.Duration) {
	wcs := make([]qp.WorkCompletion, 64)
	out := 0
	next := start
	for {
		now := time.Now()
		if sample > 0 && !now.Before(next) && now.Before(end) {
			next = now.Add(sample)
			if pi, ok := f.q.RDPeer(f.wr.AH); ok {
				if f.out.Modes == nil {
					f.out.Modes = map[string]int{}
				}
				f.out.Modes[pi.Congestion]++
				f.out.Samples = append(f.out.Samples, Sample{T: now.Sub(start).Seconds(), Mode: pi.Congestion, Cwnd: pi.CongestionWindow,
					InFlight: pi.InFlight, SRTTus: pi.SRTT.Microseconds(), MinRTTus: pi.MinRTT.Microseconds(),
					PacingMbps: pi.PacingRate * 8 / 1e6, BwMbps: pi.BottleneckBandwidth * 8 / 1e6,
					Retransmits: pi.Retransmits, LostByCount: pi.LostByCount, LostByTime: pi.LostByTime, Spurious: pi.Spurious})
			}
		}
		if now.After(giveUp) || (out == 0 && !now.Before(end)) {
			return
		}
		for now.Before(end) && out < depth {
			if err := f.q.PostSend(&f.wr); err != nil {
				if f.out.FirstError == "" {
					f.out.FirstError = "post: " + err.Error()
				}
				break
			}
			out++
			f.out.Posted++
		}
		n := f.cq.Poll(wcs)
		if n == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			f.cq.Wait(ctx)
			cancel()
			continue
		}
		at := time.Now()
		for _, wc := range wcs[:n] {
			if wc.Opcode != qp.WCRDMAWrite {
				continue
			}
			out--
			if wc.Status != qp.Success {
				f.out.Failed++
				if f.out.FirstError == "" {
					f.out.FirstError = wc.Status.String()
				}
				continue
			}
			f.out.Completed++
			f.out.Bytes += size
			if k := int(at.Sub(start) / bin); k < len(f.bins) {
				f.bins[k].Add(size)
			}
		}
		if f.out.Failed > 0 && out == 0 {
			return // the peer was given up: nothing more will complete
		}
	}
}
