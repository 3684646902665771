// Package perf runs the measurements udperf reports and the benchmarks
// record: ping-pong latency and one-way bandwidth over UD, RD and RC queue
// pairs, and the same over plain UDP and TCP sockets written as fast as Go
// allows for each polling mode, so every figure has its baseline from the
// same run.
//
// Files: perf.go the harness (Config, Check, Run, results); end.go the
// queue-pair modes as two halves, a target End that serves and an
// initiator End that measures, which udperf local runs in one process
// and udperf server and client run in two; sock.go the plain-socket ends
// (UDPEnd, TCPEnd), which udperf's server and client run too, so both
// sides of every ratio poll alike in one process or two; raw.go and the
// end of rc.go the plain-socket runs in one process.
package perf

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/protect"

	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// Mode is what carries the messages.
type Mode string

const (
	ModeUDSend Mode = "ud-send" // UD Send/Recv through package qp
	ModeRawUDP Mode = "raw-udp" // plain UDP sockets, the baseline
	// ModeRawUDPUnconnected is the baseline on unconnected sockets, as a
	// UD QP's socket must be: sendto/recvfrom, or WriteTo/ReadFrom.
	ModeRawUDPUnconnected Mode = "raw-udp-unconn"
	// ModeUDWriteRecord is RDMA Write-Record over UD: no receive posted;
	// the target records what arrived.
	ModeUDWriteRecord Mode = "ud-wr"
	// ModeRDSend is Send/Recv over RD: reliable, in order, completed on
	// acknowledgement.
	ModeRDSend Mode = "rd-send"
	// ModeRDWrite is RDMA Write over RD; its latency is half the time from
	// posting a Write to its completion (the peer's acknowledgement).
	ModeRDWrite Mode = "rd-write"
	// ModeRDRead is RDMA Read over RD: latency from posting a Read to its
	// completion (the last response placed), halved; goodput of Reads.
	ModeRDRead Mode = "rd-read"
	// ModeRDWriteRecord is Write-Record over RD: reliable underneath.
	ModeRDWriteRecord Mode = "rd-wr"
	// RC: iWARP over TCP and MPA. rc-write latency is a Write ping-pong
	// watched in memory, as perftest's ib_write_lat (busy polling only);
	// rc-read latency is half a Read's round trip.
	ModeRCSend  Mode = "rc-send"
	ModeRCWrite Mode = "rc-write"
	ModeRCRead  Mode = "rc-read"
	// ModeRawTCP is plain Go TCP: the RC baseline.
	ModeRawTCP Mode = "raw-tcp"
	// RFC 7306 atomics, as perftest's ib_atomic_lat and ib_atomic_bw
	// (FetchAdd, the default there): each WR adds 1 to an 8-byte word of
	// the target and brings back its original value; lat is half the
	// time from posting to completion (as rd-read; ib_atomic_lat reports
	// the whole round trip), bw counts the completed atomics. -s is 8.
	ModeRDAtomic Mode = "rd-atomic"
	ModeRCAtomic Mode = "rc-atomic"
	// RDMA Write with Immediate Data: the Write lands in the target's
	// region and a posted receive completes with the value. lat is a
	// ping-pong of them (each side answers its receive's completion with
	// a Write with Immediate back); bw counts the target's completions.
	ModeRDWriteImm Mode = "rd-write-imm"
	ModeRCWriteImm Mode = "rc-write-imm"
	// ModeRawXDP is plain UDP over an AF_XDP socket with no stack above
	// it (LinkEnd on llp.XDP): the floor of the AF_XDP path, as raw-udp
	// is of the kernel socket's. It runs between two hosts or network
	// namespaces only (udperf server and client): AF_XDP never attaches
	// to loopback.
	ModeRawXDP Mode = "raw-xdp"
)

// The lower layers a run's datagram queue pairs can run on
// (Config.LLP).
const (
	LLPUDP = "udp" // kernel UDP sockets (the default)
	LLPXDP = "xdp" // AF_XDP sockets (qp.LowerXDP)
)

func (m Mode) rc() bool {
	return m == ModeRCSend || m == ModeRCWrite || m == ModeRCRead || m == ModeRCAtomic || m == ModeRCWriteImm
}

func (m Mode) reliable() bool {
	return m == ModeRDSend || m == ModeRDWrite || m == ModeRDRead || m == ModeRDWriteRecord || m == ModeRDAtomic || m == ModeRDWriteImm
}

// lossless says the mode's queue pairs deliver everything they accept:
// RD (acknowledged, retransmitted) and RC (TCP). A bandwidth run of one
// takes in what is still on its way before it counts (finish,
// Tally.Settle), so what it reports lost was really lost.
func (m Mode) lossless() bool { return m.reliable() || m.rc() }

// Atomic says the mode runs RFC 7306 atomics: its size is AtomicSize.
func (m Mode) Atomic() bool { return m == ModeRDAtomic || m == ModeRCAtomic }

func (m Mode) writeImm() bool { return m == ModeRDWriteImm || m == ModeRCWriteImm }

// AtomicSize is the message size of the atomic modes: one 64-bit word.
const AtomicSize = 8

// oneSided says the mode is an RDMA operation the target does not see.
func (m Mode) oneSided() bool { return m == ModeRDWrite || m == ModeRDRead || m == ModeRDWriteRecord }

// Test is what is measured.
type Test string

const (
	TestLat Test = "lat" // ping-pong; half the round trip
	TestBW  Test = "bw"  // one-way goodput
)

// Config is one measurement.
type Config struct {
	Mode Mode
	Test Test
	Poll qp.PollMode
	Size int // message bytes
	// Iters is the number of round trips (lat); Duration bounds a bw run,
	// unless Messages is set: then each flow (each QP pair, each
	// direction of Bidir) sends that many messages and stops, as
	// perftest's -n does for its bw tests.
	Iters    int
	Warmup   int
	Duration time.Duration
	Messages int
	QPs      int // concurrent QP pairs (or socket pairs, or connections)
	// NoCRC runs the queue pairs without CRC32c (both ends agree).
	NoCRC bool
	// Protect protects the UD and RD modes' datagrams (auth or aead,
	// qp.DeviceConfig.Protect), with PSK as the devices' pre-shared key
	// (UD and Write-Record need one; RD agrees keys in its contact).
	Protect protect.Mode
	PSK     []byte
	// Segment size of Write-Record and the RD one-sided modes (0: the
	// socket's largest); loss applied by the sender's impairment layer (a
	// probability; ud-wr and ud-send bandwidth) with its seed (RD modes:
	// by both ends', to data and acks); and Write-Record's
	// deliver-partial with its deadline (default: discard, 10 s). Check
	// says which mode acts on which.
	Segment  int
	Loss     float64
	Seed     uint64
	Partial  bool
	Deadline time.Duration
	// Bidir runs a bandwidth test as two flows at once, each with its own
	// pair of QPs or sockets (in one process, the two directions of a link
	// are two such flows), and reports their sum, as perftest's -b reports
	// both directions together.
	Bidir bool
	// Interval paces a Write-Record bandwidth run: one message per interval.
	Interval time.Duration
	// Rate paces a datagram bandwidth run at the sender: Rate Gb/s of
	// message payload offered in all (split evenly across its flows, QPs
	// and Bidir), whatever the mode and message size, so that modes of
	// different sizes offer the same load (0: as fast as the sender can).
	Rate float64
	// LLP is the lower layer of the datagram queue-pair modes' devices
	// (ud-*, rd-*): LLPUDP ("" too) or LLPXDP, AF_XDP on the interface
	// that holds the end's address, polled busy with -poll busy. With
	// LLPFallback a device that cannot open AF_XDP runs on a kernel
	// socket instead (End.Link says so and why).
	LLP         string
	LLPFallback bool
	// OnDevice, when set, is called with every device the run opens (for
	// metrics).
	OnDevice func(*qp.Device)
}

// XDP says the run asks for AF_XDP under its datagram queue pairs.
func (c Config) XDP() bool { return c.LLP == LLPXDP }

// openDevice opens a device for cfg's run.
func openDevice(cfg Config, dc qp.DeviceConfig) (*qp.Device, error) {
	if cfg.XDP() && cfg.Mode.takesLLP() {
		dc.Lower, dc.LowerFallback = qp.LowerXDP, cfg.LLPFallback
		dc.XDP.Busy = cfg.Poll == qp.PollBusy
	}
	d, err := qp.Open(dc)
	if err == nil && cfg.OnDevice != nil {
		cfg.OnDevice(d)
	}
	return d, err
}

var errStopped = errors.New("perf: stopped")

// ErrXDPLoopback refuses AF_XDP in one process: both ends would be on
// loopback, where AF_XDP never attaches.
var ErrXDPLoopback = errors.New("AF_XDP never attaches to loopback, where one process runs both ends: run udperf server and client in two network namespaces or hosts (experiments/xdp.sh)")

func (c *Config) fill() {
	if c.Iters <= 0 {
		c.Iters = 10000
	}
	if c.Warmup < 0 {
		c.Warmup = 0
	} else if c.Warmup == 0 {
		c.Warmup = 1000
	}
	if c.Duration <= 0 {
		c.Duration = time.Second
	}
	if c.Mode.Atomic() {
		c.Size = AtomicSize
	}
	if c.QPs <= 0 {
		c.QPs = 1
	}
}

// Result is one measurement's outcome. Latencies are one-way (half the
// round trip) in microseconds.
type Result struct {
	Config
	Samples int
	Min     float64
	Max     float64
	Median  float64
	Avg     float64
	Stdev   float64
	P99     float64
	P999    float64

	// The lower layer each end ran on (llp.Caps Kind: "udp", "xdp",
	// "tcp") and, where known, how (its Detail): this end's (Link) and
	// the far end's (Peer, as udperf server reports it).
	Link, LinkDetail, PeerLink, PeerLinkDetail string

	// Bandwidth: goodput at the receiver, and messages.
	Gbps     float64
	Mpps     float64
	Sent     uint64
	Received uint64
	Lost     uint64

	// Write-Record bandwidth: messages recorded partial, bytes recorded
	// valid (whole and partial), bytes of whole messages, bytes sent.
	Partial    uint64
	ValidBytes uint64
	WholeBytes uint64
	SentBytes  uint64
}

// MaxSize is the largest message mode carries in one run over IPv4 (as
// udperf local runs): a datagram mode's message is one datagram, 65,507
// bytes of UDP payload less its headers (UD Send: DDP's untagged header
// and the CRC; RD Send: also the largest RD header). The other modes
// segment, and have no limit of their own (0).
func MaxSize(m Mode) int {
	switch m {
	case ModeRawUDP, ModeRawUDPUnconnected, ModeRawXDP:
		return maxUDPv4 // raw-xdp: its link's MaxDatagram at run time (LinkEnd)
	case ModeUDSend:
		return maxUDPv4 - udiwarp.DDPUntaggedHeaderSize - udiwarp.CRCSize
	}
	return 0
}

// maxUDPv4 is the largest UDP payload over IPv4.
const maxUDPv4 = 65507

var (
	knownModes = []Mode{ModeUDSend, ModeUDWriteRecord, ModeRDSend, ModeRDWrite, ModeRDRead, ModeRDWriteRecord,
		ModeRCSend, ModeRCWrite, ModeRCRead, ModeRawUDP, ModeRawUDPUnconnected, ModeRawTCP,
		ModeRDAtomic, ModeRCAtomic, ModeRDWriteImm, ModeRCWriteImm, ModeRawXDP}
	// multiQP: the modes that run Config.QPs pairs at once.
	multiQP = []Mode{ModeUDSend, ModeRDSend, ModeRawUDP, ModeRawUDPUnconnected, ModeRawTCP}
)

// Modes returns every mode, in the order udperf lists them.
func Modes() []Mode { return slices.Clone(knownModes) }

// HasCRC reports whether m's segments carry a CRC32c that Config.NoCRC
// can leave out: every mode but the plain-socket baselines.
func (m Mode) HasCRC() bool { return !m.raw() }

func (m Mode) raw() bool {
	return m == ModeRawUDP || m == ModeRawUDPUnconnected || m == ModeRawTCP || m == ModeRawXDP
}

// takesLLP says m's queue pairs run on a datagram lower layer that
// Config.LLP chooses: UD and RD. The plain-socket modes are their own
// lower layer (raw-xdp is AF_XDP's), RC runs over TCP.
func (m Mode) takesLLP() bool { return !m.raw() && !m.rc() }

// TakesLLP is takesLLP for udperf: m runs on -llp's lower layer.
func (m Mode) TakesLLP() bool { return m.takesLLP() }

// Check says whether c's mode acts on every setting c has: nil, or an
// error of one line naming the first setting the mode would ignore or
// cannot carry, by the udperf flag that sets it (-s, -loss, -qps, -mtu,
// ...), since udperf is where settings come from. Run calls it first and refuses; udperf calls it before
// anything runs. The zero values and plain defaults pass for every mode
// (Loss 0, QPs 0 or 1, Partial false, Segment 0, Interval 0, Rate 0, Bidir
// false, NoCRC false, any Seed; Deadline, read only with Partial, any
// value that is not negative; Iters, Warmup and Duration, which Run
// fills in when not positive; Messages 0). The rules:
//
//   - Mode and Test are known, Poll is busy or event; rc-write lat
//     watches memory for the peer's Write, as ib_write_lat does: it needs
//     busy polling and at least 1 byte.
//   - Size is not negative, and at most MaxSize for a datagram mode;
//     rd-atomic and rc-atomic take 8 (or 0, which Run makes 8).
//   - Loss, a probability in [0, 1), needs an impairment layer that
//     drops: ud-send and ud-wr bandwidth (the sender's), and the RD modes
//     (both ends', data and acks). Plain sockets have none, TCP (raw-tcp,
//     RC) cannot lose, and a UD ping-pong would stop at its first loss.
//   - QPs > 1: ud-send, rd-send, raw-udp, raw-udp-unconn and raw-tcp.
//   - Partial and Interval: ud-wr (Interval: bw). Segment: the modes
//     that segment a message over datagrams, ud-wr, rd-send, rd-write,
//     rd-read, rd-wr.
//   - Bidir and Messages: bandwidth only. NoCRC: not on the plain-socket
//     modes.
//   - Rate: the datagram modes' bandwidth runs (not RC, raw-tcp or the
//     atomics), and not with Interval.
//   - LLP: "", udp or xdp; xdp only for the UD and RD modes (raw-udp is
//     the kernel socket's baseline, raw-xdp AF_XDP's; RC is TCP), and
//     LLPFallback only with xdp.
func (c Config) Check() error {
	m := c.Mode
	switch {
	case !slices.Contains(knownModes, m):
		return fmt.Errorf("unknown mode %q", m)
	case c.Test != TestLat && c.Test != TestBW:
		return fmt.Errorf("unknown test %q (lat or bw)", c.Test)
	case c.Poll != qp.PollBusy && c.Poll != qp.PollEvent:
		return fmt.Errorf("unknown polling mode %v (busy or event)", c.Poll)
	case c.Size < 0:
		return fmt.Errorf("-s %d: not negative", c.Size)
	case m.Atomic() && c.Size != AtomicSize && c.Size != 0:
		return fmt.Errorf("-s %d: an atomic is one 8-byte word (-s 8)", c.Size)
	case MaxSize(m) > 0 && c.Size > MaxSize(m):
		return fmt.Errorf("-s %d: %s carries at most %d bytes (one UDP datagram over IPv4, less its headers)", c.Size, m, MaxSize(m))
	case m == ModeRCWrite && c.Test == TestLat && c.Poll != qp.PollBusy:
		return errors.New("-poll: rc-write lat watches memory for the peer's Write, as ib_write_lat does: it needs busy polling")
	case m == ModeRCWrite && c.Test == TestLat && c.Size < 1:
		return errors.New("-s 0: rc-write lat needs at least 1 byte: its last byte tells the Write arrived")
	case c.Loss < 0 || c.Loss >= 1 || math.IsNaN(c.Loss):
		return fmt.Errorf("-loss %v: want a probability in [0, 1)", c.Loss)
	case c.Loss > 0 && (m.raw() || m.rc()):
		return fmt.Errorf("-loss: %s has no impairment layer (plain sockets and TCP do not drop on request)", m)
	case c.Loss > 0 && (m == ModeUDSend || m == ModeUDWriteRecord) && c.Test == TestLat:
		return fmt.Errorf("-loss: a %s ping-pong would stop at its first lost message (loss acts on %s bw, and on the RD modes)", m, m)
	case c.QPs > 1 && !slices.Contains(multiQP, m):
		return fmt.Errorf("-qps %d: %s runs one QP pair (several: ud-send, rd-send, raw-udp, raw-udp-unconn, raw-tcp)", c.QPs, m)
	case c.Partial && m != ModeUDWriteRecord:
		return fmt.Errorf("-partial: only ud-wr delivers partial messages, not %s", m)
	case c.Deadline < 0:
		return fmt.Errorf("-deadline %v: not negative", c.Deadline)
	case c.Segment < 0:
		return fmt.Errorf("-mtu %d: not negative", c.Segment)
	case c.Segment > 0 && !m.oneSided() && m != ModeUDWriteRecord && m != ModeRDSend:
		return fmt.Errorf("-mtu: %s sends each message whole (segments: ud-wr, rd-write, rd-read, rd-wr)", m)
	case c.Interval < 0:
		return fmt.Errorf("interval %v: not negative", c.Interval)
	case c.Interval > 0 && (m != ModeUDWriteRecord || c.Test != TestBW):
		return fmt.Errorf("interval: only ud-wr bw is paced, not %s %s", m, c.Test)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("-rate %v: want Gb/s, 0 (unpaced) or more", c.Rate)
	case c.Rate > 0 && (c.Test != TestBW || m.rc() || m == ModeRawTCP || m.Atomic()):
		return fmt.Errorf("-rate: paces datagram bandwidth runs (-test bw, raw-udp, ud-*, rd-*), not %s %s", m, c.Test)
	case c.Rate > 0 && c.Interval > 0:
		return errors.New("-rate and an interval together: one pacing")
	case c.Bidir && c.Test != TestBW:
		return errors.New("-bidir: bandwidth only (-test bw or rate)")
	case c.Messages < 0:
		return fmt.Errorf("-n %d: a bw run's messages, not negative", c.Messages)
	case c.Messages > 0 && c.Test != TestBW:
		return errors.New("messages: a bw run's count (a lat run's is Iters)")
	case c.NoCRC && m.raw():
		return fmt.Errorf("no CRC: %s has none to skip", m)
	case c.Protect > protect.AEAD:
		return errors.New("-protect: want none, auth or aead")
	case c.Protect != protect.None && !m.takesLLP():
		return fmt.Errorf("-protect %v: protects the UD and RD modes' datagrams, not %s", c.Protect, m)
	case c.Protect != protect.None && c.NoCRC:
		return errors.New("-protect and -nocrc together: a protected datagram's tag replaces the CRC")
	case c.LLP != "" && c.LLP != LLPUDP && c.LLP != LLPXDP:
		return fmt.Errorf("-llp %q: want udp or xdp", c.LLP)
	case c.XDP() && (m == ModeRawUDP || m == ModeRawUDPUnconnected):
		return fmt.Errorf("-llp xdp: %s is the kernel socket's baseline; AF_XDP's is raw-xdp", m)
	case c.XDP() && (m.rc() || m == ModeRawTCP):
		return fmt.Errorf("-llp xdp: %s runs over TCP (AF_XDP carries the datagram modes, ud-* and rd-*)", m)
	case c.LLPFallback && (!c.XDP() || m == ModeRawXDP):
		return errors.New("-llp-fallback: falls back from -llp xdp's queue pairs to kernel sockets: give -llp xdp (raw-xdp has no fallback: it is AF_XDP)")
	}
	return nil
}

// Run performs one measurement, once cfg.Check has passed.
func Run(cfg Config) (Result, error) {
	if err := cfg.Check(); err != nil {
		return Result{}, fmt.Errorf("perf: %w", err)
	}
	cfg.fill()
	if cfg.Bidir && cfg.Test == TestBW {
		return bidir(cfg)
	}
	return run(cfg)
}

// bidir runs two flows of cfg at once and adds them up.
func bidir(cfg Config) (Result, error) {
	cfg.Bidir = false
	var rs [2]Result
	var errs [2]error
	var wg sync.WaitGroup
	for i := range rs {
		c := cfg
		c.Seed += uint64(i) * 1000 // the impairment layer's draws differ per flow
		wg.Go(func() { rs[i], errs[i] = run(c) })
	}
	wg.Wait()
	if err := errors.Join(errs[0], errs[1]); err != nil {
		return Result{}, err
	}
	r := rs[0]
	r.Bidir = true
	b := rs[1]
	r.Gbps += b.Gbps
	r.Mpps += b.Mpps
	r.Sent += b.Sent
	r.Received += b.Received
	r.Lost += b.Lost
	r.Partial += b.Partial
	r.ValidBytes += b.ValidBytes
	r.WholeBytes += b.WholeBytes
	r.SentBytes += b.SentBytes
	return r, nil
}

func run(cfg Config) (Result, error) {
	switch {
	case (cfg.Mode == ModeRawUDP || cfg.Mode == ModeRawUDPUnconnected) && cfg.Test == TestLat:
		return rawLatency(cfg)
	case (cfg.Mode == ModeRawUDP || cfg.Mode == ModeRawUDPUnconnected) && cfg.Test == TestBW:
		return rawBandwidth(cfg)
	case cfg.Mode == ModeRawTCP && cfg.Test == TestLat:
		return rawTCPLatency(cfg)
	case cfg.Mode == ModeRawTCP && cfg.Test == TestBW:
		return rawTCPBandwidth(cfg)
	case cfg.Mode == ModeRawXDP || cfg.XDP():
		return Result{}, ErrXDPLoopback
	}
	return qpRun(cfg) // every queue-pair mode: a target and an initiator (end.go)
}

func latResult(cfg Config, ns []int64) Result {
	r := Result{Config: cfg, Samples: len(ns)}
	if len(ns) == 0 {
		return r
	}
	slices.Sort(ns)
	us := func(v float64) float64 { return v / 1e3 }
	var sum float64
	for _, v := range ns {
		sum += float64(v)
	}
	avg := sum / float64(len(ns))
	var sq float64
	for _, v := range ns {
		d := float64(v) - avg
		sq += d * d
	}
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(ns)))) - 1
		return us(float64(ns[max(0, min(i, len(ns)-1))]))
	}
	r.Min, r.Max = us(float64(ns[0])), us(float64(ns[len(ns)-1]))
	r.Median = pct(0.5)
	r.Avg = us(avg)
	r.Stdev = us(math.Sqrt(sq / float64(len(ns))))
	r.P99, r.P999 = pct(0.99), pct(0.999)
	return r
}

// DrainLimit bounds how long a reliable bandwidth run waits, once its
// senders stop, for the messages still on their way (here and at a
// udperf server).
const DrainLimit = 30 * time.Second

// WaitUntil checks cond every millisecond until it holds or limit has
// passed, and reports whether it held.
func WaitUntil(limit time.Duration, cond func() bool) bool {
	for end := time.Now().Add(limit); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// finish ends a bandwidth run: senders stop after cfg.Duration, or, with
// cfg.Messages, once each has sent its count (wg: the senders); receivers
// 50 ms later, to take in what is still on its way, or, for a transport
// that loses nothing (drained non-nil), once drained reports that every
// message sent has arrived, within DrainLimit. So a reliable run reports
// as lost only what was really lost, however slowly a loaded machine
// (or a lossy link's retransmissions) brings in its last messages.
// It returns when the run started (give or take the goroutines' start).
func finish(cfg Config, sending, stop *atomic.Bool, wg *sync.WaitGroup, drained func() bool) (start time.Time) {
	start = time.Now()
	if cfg.Messages > 0 {
		wg.Wait()
	} else {
		time.Sleep(cfg.Duration)
	}
	sending.Store(false)
	time.Sleep(50 * time.Millisecond)
	if drained != nil {
		WaitUntil(DrainLimit, drained)
	}
	stop.Store(true)
	wg.Wait()
	return start
}

// more says whether a bandwidth sender that has sent sent messages goes
// on: until end, or, with cfg.Messages, until it has sent them.
func (c *Config) more(sent uint64, end time.Time) bool {
	if c.Messages > 0 {
		return sent < uint64(c.Messages)
	}
	return time.Now().Before(end)
}

// bwResult turns a bandwidth run's counts into a Result: goodput over
// the messages after the first, from the first arrival to the last. When
// every message arrived at once (one batch of completions: a slow
// receiver, or few large messages), that span is empty and the run's whole
// span from its start stands in: a lower bound, never a zero for data
// that arrived.
func bwResult(cfg Config, start time.Time, sent, received uint64, first, last time.Time) Result {
	r := Result{Config: cfg, Sent: sent, Received: received}
	if sent > received {
		r.Lost = sent - received
	}
	if el := last.Sub(first).Seconds(); received > 1 && el > 0 {
		r.Gbps = float64(received-1) * float64(cfg.Size) * 8 / el / 1e9
		r.Mpps = float64(received-1) / el / 1e6
	} else if el := last.Sub(start).Seconds(); received > 0 && el > 0 {
		r.Gbps = float64(received) * float64(cfg.Size) * 8 / el / 1e9
		r.Mpps = float64(received) / el / 1e6
	}
	return r
}

// Summarize turns half-round-trip samples (nanoseconds) into a latency
// Result, as Run does; for measurements made outside Run (udperf client).
func Summarize(cfg Config, ns []int64) Result { return latResult(cfg, ns) }
