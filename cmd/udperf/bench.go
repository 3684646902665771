package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/metrics"
	"github.com/udiwarp/udiwarp/protect"
	"github.com/udiwarp/udiwarp/qp"
	"golang.org/x/net/netutil"
)

// The measuring commands: `udperf local` runs one mode, server and client
// in one process over loopback; `udperf compare` runs several modes back
// to back, alternating, for several rounds, and gives each figure with its
// ratio to the first mode. Figures and columns follow perftest.

var allModes = perf.Modes()

// maxSize is the largest message a mode carries (for -a).
func maxSize(m perf.Mode) int {
	switch m {
	case perf.ModeUDSend, perf.ModeRDSend, perf.ModeRawUDP, perf.ModeRawUDPUnconnected:
		return 32768 // one datagram; powers of two
	case perf.ModeRawXDP:
		return 1024 // one datagram within an Ethernet MTU (AF_XDP takes no fragments)
	}
	return 8 << 20
}

type benchFlags struct {
	mode, modes string
	test        string
	size        int
	all         bool
	bidir       bool
	iters       int
	dur         time.Duration
	warmup      int
	poll        string
	qps         int
	mtu         int
	loss        float64
	rate        float64
	seed        uint64
	partial     bool
	nocrc       bool
	protect     string // -protect: none, auth or aead
	psk         string // -psk: hex
	pskBytes    []byte // -psk, or drawn for this process
	deadline    time.Duration
	rounds      int
	json, csv   bool
	metrics     string
	llp         string // -llp: udp or xdp
	llpFallback bool
	collector   *metrics.Collector
	cmd         *command // the command whose flags these are
	client      bool     // udperf client's
}

// clientNotFor are the flags `udperf client` shares with local but does
// not act on (yet): refused when given, absent from `client -h`. The
// server/client side removes a flag from here when it carries it.
var clientNotFor = map[string]string{
	"bidir": "it runs only in `udperf local` and `compare` for now",
	"qps":   "server/client runs one QP (or socket) pair",
	"nocrc": "it runs only in `udperf local` and `compare` for now",
}

// register adds the measuring flags to c: name is "local", "compare" or
// "client".
func (f *benchFlags) register(c *command, name string) {
	f.cmd, f.client = c, name == "client"
	fs := c.fs
	if name == "compare" {
		fs.StringVar(&f.modes, "modes", "", "comma-separated modes, each MODE or MODE@SIZE (its own -s); the first is the baseline of the ratios")
		fs.IntVar(&f.rounds, "rounds", 3, "rounds; each runs every mode once, in alternating order; figures are medians")
	} else {
		fs.StringVar(&f.mode, "mode", string(perf.ModeUDSend), "what carries the messages: "+modeList())
	}
	fs.StringVar(&f.test, "test", "lat", "lat (ping-pong, half round trip), bw (one-way goodput), rate (message rate of -s messages) or throughput (the fastest lossless offered rate, RFC 2544: bw runs paced by -rate's search)")
	fs.IntVar(&f.size, "s", 64, "message size in bytes")
	fs.BoolVar(&f.all, "a", false, "every size: powers of two from 2 bytes to the mode's largest")
	fs.BoolVar(&f.bidir, "bidir", false, "bw, rate: two flows at once, one each way; figures are their sum")
	fs.IntVar(&f.iters, "n", 10000, "lat: round trips; bw, rate: messages each flow sends, instead of lasting -D (perftest's -n)")
	f.dur = time.Second
	fs.Var(secondsFlag{&f.dur}, "D", "duration of a bw or rate run, in `seconds` as perftest (3, 0.5) or a Go duration (500ms)")
	fs.IntVar(&f.warmup, "w", 1000, "warm-up iterations (lat)")
	fs.StringVar(&f.poll, "poll", "busy", "busy (spin on the CQ, as perftest does) or event")
	fs.IntVar(&f.qps, "qps", 1, "concurrent QPs or sockets (ud-send, rd-send, raw-udp, raw-udp-unconn, raw-tcp)")
	fs.IntVar(&f.mtu, "mtu", 0, "largest segment payload of Write-Record and RD segments (0: one datagram)")
	fs.Float64Var(&f.loss, "loss", 0, "datagram loss probability applied by the impairment layer (ud-send and ud-wr bw at the sender; RD both ways)")
	fs.Float64Var(&f.rate, "rate", 0, "bw: pace the sender at this many `Gb/s` of payload, split over its flows, whatever the message size (0: unpaced)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the impairment layer")
	fs.BoolVar(&f.partial, "partial", false, "Write-Record: deliver partial messages at the deadline")
	fs.StringVar(&f.protect, "protect", "none", "protect the UD and RD modes' datagrams: none, auth (authenticated, payload in clear) or aead (AES-128-GCM); in compare, a mode's own as MODE+auth or MODE+aead (docs/wire.md §12)")
	fs.StringVar(&f.psk, "psk", "", "pre-shared key in hex (16 bytes or more) for protected UD and Write-Record (RD agrees keys in its contact); default: one drawn for the run (udperf local and compare), none (client and server: give both the same)")
	fs.BoolVar(&f.nocrc, "nocrc", false, "no CRC32c: RC negotiates MPA without CRC (the C bit clear both ways), datagram segments carry none; plain-socket modes have none to skip (compare runs them as they are)")
	f.deadline = 5 * time.Millisecond
	fs.Var(secondsFlag{&f.deadline}, "deadline", "Write-Record deadline with -partial, in `seconds` or a Go duration (5ms)")
	fs.BoolVar(&f.json, "json", false, "one JSON document on stdout, at the end (docs/udperf.md)")
	fs.BoolVar(&f.csv, "csv", false, "CSV on stdout, a record per row as it is measured")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics at HOST:PORT/metrics while running")
	llpHelp := "lower layer of the UD and RD modes' queue pairs: udp (kernel sockets) or xdp (AF_XDP on the interface holding the end's address; needs root; the server's end too)"
	if name != "client" {
		llpHelp = "lower layer of the UD and RD modes' queue pairs: udp; xdp is refused here (AF_XDP never attaches to loopback: use udperf server and client in two namespaces, experiments/xdp.sh)"
	}
	fs.StringVar(&f.llp, "llp", perf.LLPUDP, llpHelp)
	fs.BoolVar(&f.llpFallback, "llp-fallback", false, "with -llp xdp: an end that cannot open AF_XDP runs on a kernel UDP socket instead, and says so on stderr")
	c.perftestHabits(&f.poll)
	if name == "client" {
		c.notFor = clientNotFor
	}
}

// protection is what -protect and -psk ask of mode m: in compare, the
// modes without datagrams to protect run as they are (as -nocrc does).
func (f *benchFlags) protection(m perf.Mode) (protect.Mode, []byte, error) {
	pm, err := protect.None, error(nil)
	if f.protect != "" {
		pm, err = protect.ParseMode(f.protect)
	}
	if err != nil {
		return pm, nil, fmt.Errorf("-protect: %w", err)
	}
	if pm != protect.None && !m.TakesLLP() && f.modes != "" {
		pm = protect.None
	}
	if pm == protect.None {
		return pm, nil, nil
	}
	if f.pskBytes == nil {
		switch {
		case f.psk != "":
			if f.pskBytes, err = hex.DecodeString(f.psk); err != nil || len(f.pskBytes) < protect.MinPSK {
				return pm, nil, fmt.Errorf("-psk: want %d or more bytes in hex", protect.MinPSK)
			}
		case !f.client:
			f.pskBytes = make([]byte, 32)
			rand.Read(f.pskBytes)
		case !reliableMode(string(m)):
			return pm, nil, fmt.Errorf("-protect %v: %s needs -psk, the same key as the server's -psk (RD modes agree keys in their contact)", pm, m)
		}
	}
	return pm, f.pskBytes, nil
}

// format is the output format -json and -csv ask for.
func (f *benchFlags) format() string {
	switch {
	case f.json:
		return formatJSON
	case f.csv:
		return formatCSV
	}
	return formatText
}

// metricsIdle is how long the -metrics server keeps a connection idle
// between requests; metricsConns how many it serves at once.
var metricsIdle = 30 * time.Second

const metricsConns = 64

// serveMetrics starts the -metrics server, and makes every run of runs
// report its devices to it under the label device="name"; the returned
// function stops it.
func (f *benchFlags) serveMetrics(stderr io.Writer, name string, runs ...[]perf.Config) (func(), error) {
	if f.metrics == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", f.metrics)
	if err != nil {
		return nil, fmt.Errorf("-metrics %s: %w", f.metrics, err)
	}
	f.collector = metrics.New()
	for _, cfgs := range runs {
		for i := range cfgs {
			cfgs[i].OnDevice = f.collector.Adder(name)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", f.collector.Handler())
	// Anyone who can reach the port may connect: a connection idle
	// between requests is closed after metricsIdle, a request must come
	// whole within 10 s and its answer be taken within 30 s, and at most
	// metricsConns are served at once (the next wait in the backlog).
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: metricsIdle}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(netutil.LimitListener(ln, metricsConns)) }()
	fmt.Fprintf(stderr, "udperf: metrics at http://%s/metrics\n", ln.Addr())
	return func() { srv.Close(); <-done }, nil
}

func modeList() string {
	var s []string
	for _, m := range allModes {
		s = append(s, string(m))
	}
	return strings.Join(s, ", ")
}

func parseMode(s string) (perf.Mode, error) {
	for _, m := range allModes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown mode %q (modes: %s)", s, modeList())
}

// configs turns the flags into one Config per size, each checked by
// checkConfig: whatever the mode cannot do as asked is refused here,
// before anything runs.
func (f *benchFlags) configs(m perf.Mode) ([]perf.Config, error) {
	if f.json && f.csv {
		return nil, errors.New("-json and -csv together: choose one output")
	}
	test := perf.TestLat
	switch f.test {
	case "lat":
	case "bw", "rate", "throughput":
		test = perf.TestBW
	default:
		return nil, fmt.Errorf("-test %q: want lat, bw, rate or throughput", f.test)
	}
	// Flags that would do nothing beside the others given.
	if c := f.cmd; c != nil {
		for _, r := range []struct {
			bad bool
			why string
		}{
			{c.set("e") && c.set("poll") && f.poll != "event", fmt.Sprintf("-e (event polling) and -poll %s contradict each other", f.poll)},
			{test == perf.TestLat && c.set("D"), "-D: a lat run is -n round trips; -D is for -test bw and rate"},
			{test == perf.TestBW && c.set("n") && c.set("D"), "-n and -D: a bw or rate run sends -n messages or lasts -D, not both"},
			{f.test == "throughput" && c.set("n"), "-n: each trial of a throughput search lasts -D"},
			{test == perf.TestBW && c.set("n") && f.client, "-n: a server times its bw and rate runs by -D; -n messages run in `udperf local` and `compare`"},
			{test == perf.TestBW && c.set("w"), "-w: a bw or rate run has no warm-up round trips; -w is for -test lat"},
			{f.all && c.set("s"), "-a and -s together: -a runs every size"},
			{c.set("deadline") && !f.partial, "-deadline is the deadline of -partial: give both"},
			{c.set("seed") && f.loss == 0, "-seed seeds the losses of -loss: give both"},
			{f.llpFallback && f.llp != perf.LLPXDP, "-llp-fallback falls back from -llp xdp: give both"},
		} {
			if r.bad {
				return nil, errors.New(r.why)
			}
		}
	}
	poll := qp.PollBusy
	switch f.poll {
	case "busy":
	case "event":
		poll = qp.PollEvent
	default:
		return nil, fmt.Errorf("-poll %q: want busy or event", f.poll)
	}
	for _, c := range []struct {
		name string
		bad  bool
		want string
	}{
		{"s", f.size < 0, "a size in bytes, 0 or more"},
		{"n", f.iters <= 0, "a positive number of iterations"},
		{"qps", f.qps <= 0, "a positive number of QPs"},
		{"w", f.warmup < 0, "a number of warm-up iterations, 0 or more"},
		{"mtu", f.mtu < 0, "a segment payload in bytes, 0 (one datagram) or more"},
	} {
		if c.bad {
			return nil, fmt.Errorf("-%s: want %s", c.name, c.want)
		}
	}
	if f.bidir && test != perf.TestBW {
		return nil, errors.New("-bidir is for -test bw and rate")
	}
	if f.loss < 0 || f.loss >= 1 {
		return nil, fmt.Errorf("-loss %v: want a probability in [0, 1)", f.loss)
	}
	if f.llp != "" && f.llp != perf.LLPUDP && f.llp != perf.LLPXDP {
		return nil, fmt.Errorf("-llp %q: want udp or xdp", f.llp)
	}
	if !f.client && (f.llp == perf.LLPXDP || m == perf.ModeRawXDP) {
		what := "-llp xdp"
		if m == perf.ModeRawXDP {
			what = "raw-xdp"
		}
		return nil, fmt.Errorf("%s: %w", what, perf.ErrXDPLoopback)
	}
	sizes := []int{f.size}
	if m.Atomic() && (f.cmd == nil || !f.cmd.set("s")) {
		sizes = []int{perf.AtomicSize} // an atomic's word, whatever -s defaults to
	}
	if f.all && m.Atomic() {
		return nil, fmt.Errorf("-a: %s has one size, %d bytes", m, perf.AtomicSize)
	}
	if f.all {
		sizes = nil
		for s := 2; s <= maxSize(m); s *= 2 {
			sizes = append(sizes, s)
		}
	}
	messages := 0 // a bw run lasts -D unless -n is given
	if test == perf.TestBW && f.cmd != nil && f.cmd.set("n") {
		messages = f.iters
	}
	prot, psk, err := f.protection(m)
	if err != nil {
		return nil, err
	}
	var out []perf.Config
	for _, s := range sizes {
		iters, warm := f.iters, f.warmup
		if f.all {
			iters, warm = sweepIters(iters, s), sweepIters(warm, s)
		}
		c := perf.Config{Mode: m, Test: test, Poll: poll, Size: s, Iters: iters, Warmup: warmup(warm), Protect: prot, PSK: psk,
			Duration: f.dur, Messages: messages, QPs: f.qps, Bidir: f.bidir, Segment: f.mtu, Loss: f.loss, Seed: f.seed, Partial: f.partial, Deadline: f.deadline, Rate: f.rate,
			NoCRC: f.nocrc && (m.HasCRC() || f.modes == "")}
		if f.llp == perf.LLPXDP && (m.TakesLLP() || f.modes == "") {
			c.LLP, c.LLPFallback = f.llp, f.llpFallback
		}
		if err := checkConfig(c); err != nil {
			return nil, err
		}
		if f.test == "throughput" {
			if err := throughputCheck(c); err != nil {
				return nil, fmt.Errorf("-test throughput: %w", err)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// sweepBytes bounds the bytes one size of an -a latency sweep moves
// each way: -n round trips up to it, fewer above (never under
// sweepMinIters), as perftest caps its iterations by size. With the
// default -n 10000 a size of 64 KiB and below runs all of them, 1 MiB
// 625, 8 MiB 100.
const (
	sweepBytes    = 10000 << 16
	sweepMinIters = 100
)

// sweepIters is n for a message of size bytes in an -a sweep (0 stays 0:
// no warm-up).
func sweepIters(n, size int) int {
	if n == 0 {
		return 0
	}
	return min(n, max(sweepMinIters, sweepBytes/max(size, 1)))
}

// throughputCheck refuses a throughput search of a mode -rate cannot pace.
func throughputCheck(c perf.Config) error {
	c.Rate = max(c.Rate, 1)
	return c.Check()
}

// searching makes run a throughput search when test is "throughput".
func searching(test string, run func(perf.Config) (perf.Result, error)) func(perf.Config) (perf.Result, error) {
	if test != "throughput" {
		return run
	}
	return func(c perf.Config) (perf.Result, error) { return perf.Throughput(c, run) }
}

// checkConfig refuses a run its mode cannot make as asked, before
// anything runs: perf.Config.Check is the one home of "this mode ignores
// this setting, or cannot carry this size".
func checkConfig(c perf.Config) error { return c.Check() }

// row is one (mode, size) figure set, with the settings that shaped it:
// the JSON schema of docs/udperf.md.
type row struct {
	Mode       string   `json:"mode"`
	Test       string   `json:"test"`
	Poll       string   `json:"poll"`
	Bytes      int      `json:"bytes"`
	Iterations int      `json:"iterations"`
	TMin       float64  `json:"t_min_us,omitempty"`
	TTypical   float64  `json:"t_typical_us,omitempty"`
	TAvg       float64  `json:"t_avg_us,omitempty"`
	TMax       float64  `json:"t_max_us,omitempty"`
	TStdev     float64  `json:"t_stdev_us,omitempty"`
	P99        float64  `json:"p99_us,omitempty"`
	P999       float64  `json:"p999_us,omitempty"`
	BWPeak     float64  `json:"bw_peak_gbps,omitempty"`
	BWAvg      float64  `json:"bw_avg_gbps,omitempty"`
	MsgRate    float64  `json:"msg_rate_mpps,omitempty"`
	Lost       *uint64  `json:"lost,omitempty"`
	ValidBytes *uint64  `json:"valid_bytes,omitempty"`
	Ratio      *float64 `json:"ratio,omitempty"`
	Spread     *float64 `json:"spread_pct,omitempty"`
	Rounds     int      `json:"rounds,omitempty"`
	// compare: each round's figure (t_typical, BW average or MsgRate) and
	// its ratio to the first mode's in the same round; ratio is the
	// median of RoundRatios, not the ratio of the medians.
	RoundFigures []float64 `json:"round_figures,omitempty"`
	RoundRatios  []float64 `json:"round_ratios,omitempty"`
	// The settings of the run (lat: n and warmup; bw, rate: duration, or
	// n, the messages each flow sends).
	N        int     `json:"n,omitempty"`
	Warmup   *int    `json:"warmup,omitempty"`
	Duration float64 `json:"duration_s,omitempty"`
	QPs      int     `json:"qps"`
	MTU      int     `json:"mtu"`
	Loss     float64 `json:"loss"`
	Rate     float64 `json:"rate_gbps,omitempty"`
	Seed     uint64  `json:"seed"`
	Partial  bool    `json:"partial"`
	NoCRC    bool    `json:"no_crc"`
	Protect  string  `json:"protect,omitempty"`
	Deadline float64 `json:"deadline_s"`
	Bidir    bool    `json:"bidir"`
	// The lower layer asked for (-llp xdp; absent: kernel sockets), and
	// what each end ran on (udperf client: "udp", "xdp" or "tcp", with
	// how; a fallback from AF_XDP says why).
	LLP              string `json:"llp,omitempty"`
	Link             string `json:"link,omitempty"`
	LinkDetail       string `json:"link_detail,omitempty"`
	ServerLink       string `json:"server_link,omitempty"`
	ServerLinkDetail string `json:"server_link_detail,omitempty"`
}

func reliableMode(m string) bool {
	return strings.HasPrefix(m, "rd-") || strings.HasPrefix(m, "rc-") || m == string(perf.ModeRawTCP)
}

func rowOf(test string, r perf.Result) row {
	c := r.Config
	w := row{Mode: string(r.Mode), Test: test, Poll: c.Poll.String(), Bytes: r.Size,
		QPs: max(c.QPs, 1), MTU: c.Segment, Loss: c.Loss, Rate: c.Rate, Seed: c.Seed, Partial: c.Partial, NoCRC: c.NoCRC, Deadline: c.Deadline.Seconds(), Bidir: c.Bidir,
		LLP: c.LLP, Link: r.Link, LinkDetail: r.LinkDetail, ServerLink: r.PeerLink, ServerLinkDetail: r.PeerLinkDetail}
	if c.Protect != protect.None {
		w.Mode += "+" + c.Protect.String()
		w.Protect = c.Protect.String()
	}
	if r.Test == perf.TestLat {
		warm := max(c.Warmup, 0)
		w.N, w.Warmup = c.Iters, &warm
		w.Iterations = r.Samples
		w.TMin, w.TTypical, w.TAvg, w.TMax, w.TStdev, w.P99, w.P999 = r.Min, r.Median, r.Avg, r.Max, r.Stdev, r.P99, r.P999
		return w
	}
	if c.Messages > 0 {
		w.N = c.Messages
	} else {
		w.Duration = c.Duration.Seconds()
	}
	w.Iterations = int(r.Received)
	w.BWPeak, w.BWAvg, w.MsgRate = r.Gbps, r.Gbps, r.Mpps
	lost := r.Lost
	if reliableMode(w.Mode) {
		lost = 0 // in flight when the run stopped, not lost
	}
	w.Lost = &lost
	if !reliableMode(w.Mode) {
		vb := r.ValidBytes
		if vb == 0 {
			vb = r.Received * uint64(r.Size)
		}
		w.ValidBytes = &vb
	}
	return w
}

// figure is the figure compare's ratios and spreads are of.
func figure(test string, r row) float64 {
	switch test {
	case "lat":
		return r.TTypical
	case "rate":
		return r.MsgRate
	}
	return r.BWAvg
}

// roundRatios are a mode's per-round ratios to the baseline, in round
// order (rounds where the baseline's figure is 0 left out): the figure
// over the baseline's in the same round, the two run back to back, so a
// machine that drifts between rounds (shared hosts do, by a factor of
// two) moves both and not their ratio. compare's ratio is their median.
func roundRatios(test string, rs, base []row) []float64 {
	var v []float64
	for r := range min(len(rs), len(base)) {
		if b := figure(test, base[r]); b > 0 {
			v = append(v, figure(test, rs[r])/b)
		}
	}
	return v
}

// median merges the rows of several rounds of one (mode, size), with the
// rounds' spread: (max - min) / median of the figure, in percent.
func median(test string, rs []row) row {
	out := rs[0]
	med := func(get func(row) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	out.TMin = med(func(r row) float64 { return r.TMin })
	out.TTypical = med(func(r row) float64 { return r.TTypical })
	out.TAvg = med(func(r row) float64 { return r.TAvg })
	out.TMax = med(func(r row) float64 { return r.TMax })
	out.TStdev = med(func(r row) float64 { return r.TStdev })
	out.P99 = med(func(r row) float64 { return r.P99 })
	out.P999 = med(func(r row) float64 { return r.P999 })
	out.BWAvg = med(func(r row) float64 { return r.BWAvg })
	out.MsgRate = med(func(r row) float64 { return r.MsgRate })
	for _, r := range rs {
		out.BWPeak = max(out.BWPeak, r.BWPeak)
	}
	lo, hi := figure(test, rs[0]), figure(test, rs[0])
	for _, r := range rs {
		lo, hi = min(lo, figure(test, r)), max(hi, figure(test, r))
	}
	spread := 0.0
	if m := figure(test, out); m > 0 {
		spread = (hi - lo) / m * 100
	}
	out.Spread = &spread
	out.Rounds = len(rs)
	return out
}

// spreadWarning is the spread beyond which compare warns that its rounds
// disagree.
const spreadWarning = 20.0

// document is the JSON output.
type document struct {
	Command   string         `json:"command"`
	Flags     map[string]any `json:"flags"`
	GoVersion string         `json:"go_version"`
	CPU       string         `json:"cpu"`
	Kernel    string         `json:"kernel"`
	// Interrupted: SIGINT ended the sweep; Results are the rows finished.
	Interrupted bool  `json:"interrupted,omitempty"`
	Results     []row `json:"results"`
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return fmt.Sprintf("%s (%d CPUs)", strings.TrimSpace(v), runtime.NumCPU())
			}
		}
	}
	return fmt.Sprintf("%s (%d CPUs)", runtime.GOARCH, runtime.NumCPU())
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// flagMap is the JSON "flags": every flag the command acts on, given or
// defaulted, numbers and booleans as JSON numbers and booleans, durations
// in seconds.
func flagMap(c *command) map[string]any {
	m := map[string]any{}
	c.fs.VisitAll(func(f *flag.Flag) {
		if _, hidden := c.notFor[f.Name]; hidden {
			return
		}
		switch f.Value.(type) {
		case *refusedFlag, *noopFlag, eventFlag:
			return // -poll says what -e did
		}
		v := any(f.Value.String())
		if g, ok := f.Value.(flag.Getter); ok {
			v = g.Get()
		}
		if d, ok := v.(time.Duration); ok {
			v = d.Seconds()
		}
		m[f.Name] = v
	})
	return m
}

// newDocument is the frame of a command's JSON document.
// Its flags are those the command acts on: a latency run's -n and -w, or
// a bw or rate run's -D or -n (whichever bounds it), not the others.
func newDocument(name string, f *benchFlags) document {
	flags := flagMap(f.cmd)
	switch {
	case f.test == "lat":
		delete(flags, "D")
	case f.cmd.set("n"):
		delete(flags, "D")
		delete(flags, "w")
	default:
		delete(flags, "n")
		delete(flags, "w")
	}
	return document{Command: name, Flags: flags, GoVersion: runtime.Version(), CPU: cpuModel(), Kernel: kernel()}
}

// measure runs one measurement (a variable for the tests that watch the
// order of runs and output).
var measure = perf.Run

// local is `udperf local`.
func local(args []string, stdout, stderr io.Writer) int {
	c := newCommand("local", "udperf local [flags]",
		"One mode, server and client in this process over loopback; perftest's figures and columns.\nJSON and CSV schema: docs/udperf.md.")
	var f benchFlags
	f.register(c, "local")
	if code, ok := c.parse(args, stdout, stderr); !ok {
		return code
	}
	fail := func(err error) int { fmt.Fprintf(stderr, "udperf local: %v\n", err); return 2 }
	m, err := parseMode(f.mode)
	if err != nil {
		return fail(err)
	}
	cfgs, err := f.configs(m)
	if err != nil {
		return fail(err)
	}
	stop, err := f.serveMetrics(stderr, "local", cfgs)
	if err != nil {
		return fail(err)
	}
	defer stop()
	ctx, release := interruptible("local", stderr)
	defer release()
	out := &printer{out: newSink(stdout, f.format(), f.test, false, newDocument("local", &f)), bar: newBar(stderr, len(cfgs))}
	interrupted, runErr := sweep(ctx, out, f.test, cfgs, searching(f.test, measure))
	return finish("local", stderr, out.out, interrupted, runErr)
}

// sweep measures cfgs one after another, handing out each row as it
// finishes, until they are done, one fails, or ctx ends (SIGINT: the run
// in progress ends first). It says whether it was interrupted, and the
// failure.
func sweep(ctx context.Context, out *printer, test string, cfgs []perf.Config, measure func(perf.Config) (perf.Result, error)) (interrupted bool, err error) {
	out.bar.draw()
	defer out.bar.clear()
	for _, cfg := range cfgs {
		if ctx.Err() != nil {
			return true, nil
		}
		r, err := measure(cfg)
		if err != nil {
			return false, fmt.Errorf("%s %s %d B: %w", cfg.Mode, test, cfg.Size, err)
		}
		out.bar.tick()
		if err := out.row(rowOf(test, r)); err != nil {
			return false, err
		}
	}
	return false, nil
}

// finish ends a sweep's output and gives its exit code: 130 after an
// interrupt, 1 after a failed run (the rows before it are kept), else 0.
func finish(cmd string, stderr io.Writer, out sink, interrupted bool, runErr error) int {
	if err := out.done(interrupted); err != nil && runErr == nil {
		runErr = err
	}
	switch {
	case runErr != nil:
		fmt.Fprintf(stderr, "udperf %s: %v\n", cmd, runErr)
		return 1
	case interrupted:
		fmt.Fprintf(stderr, "udperf %s: interrupted: the rows above are those measured before it\n", cmd)
		return exitInterrupted
	}
	return 0
}

// parseModeSpec reads compare's MODE[+PROTECT][@SIZE]: -1 when no size
// is given, and prot "" when no protection is.
func parseModeSpec(s string) (perf.Mode, string, int, error) {
	spec, sz, ok := strings.Cut(s, "@")
	name, prot, _ := strings.Cut(spec, "+")
	m, err := parseMode(name)
	if err == nil && prot != "" {
		var pm protect.Mode
		if pm, err = protect.ParseMode(prot); err == nil && (pm == protect.None || !m.TakesLLP()) {
			err = fmt.Errorf("%q: +auth or +aead protects a UD or RD mode's datagrams", s)
		}
	}
	if err != nil || !ok {
		return m, prot, -1, err
	}
	size, err := strconv.Atoi(sz)
	if err != nil || size < 0 {
		return m, prot, -1, fmt.Errorf("%q: the size after @ is a number of bytes, 0 or more", s)
	}
	return m, prot, size, nil
}

// compare is `udperf compare`.
func compare(args []string, stdout, stderr io.Writer) int {
	c := newCommand("compare", "udperf compare -modes M1,M2,... [flags]",
		"The modes back to back, each round in alternating order; each figure is the median of the rounds,\nwith its ratio to M1 and the rounds' spread ((max-min)/median). JSON and CSV schema: docs/udperf.md.")
	var f benchFlags
	f.register(c, "compare")
	if code, ok := c.parse(args, stdout, stderr); !ok {
		return code
	}
	fail := func(err error) int { fmt.Fprintf(stderr, "udperf compare: %v\n", err); return 2 }
	if f.modes == "" {
		return fail(errors.New("-modes M1,M2,... is required"))
	}
	if f.rounds <= 0 {
		return fail(errors.New("-rounds: want a positive number of rounds"))
	}
	var modes []perf.Mode
	var sizes []int // a mode's own size (MODE@SIZE), or -1
	var prots []string
	for _, s := range strings.Split(f.modes, ",") {
		m, prot, size, err := parseModeSpec(strings.TrimSpace(s))
		if err != nil {
			return fail(fmt.Errorf("-modes: %w", err))
		}
		prots = append(prots, prot)
		if size >= 0 && f.all {
			return fail(fmt.Errorf("-modes %s: a mode's own size and -a together: -a runs every size", s))
		}
		modes, sizes = append(modes, m), append(sizes, size)
	}
	// Every mode must run every setting given: one that cannot is named.
	byMode := make([][]perf.Config, len(modes))
	global := f.protect
	for i, m := range modes {
		f.protect = global
		if prots[i] != "" {
			f.protect = prots[i]
		}
		cfgs, err := f.configs(m)
		f.protect = global
		if err == nil && sizes[i] >= 0 {
			cfgs[0].Size = sizes[i]
			err = checkConfig(cfgs[0])
		}
		if err != nil {
			return fail(fmt.Errorf("mode %s: %w", m, err))
		}
		byMode[i] = cfgs
	}
	stop, err := f.serveMetrics(stderr, "local", byMode...)
	if err != nil {
		return fail(err)
	}
	defer stop()
	// Sizes common to every mode (with -a, the smallest maximum wins).
	nsizes := len(byMode[0])
	for _, c := range byMode {
		nsizes = min(nsizes, len(c))
	}
	ctx, release := interruptible("compare", stderr)
	defer release()
	out := &printer{out: newSink(stdout, f.format(), f.test, true, newDocument("compare", &f)), bar: newBar(stderr, f.rounds*nsizes*len(modes))}
	interrupted := false
	var runErr error
	out.bar.draw()
	// Size by size, so that a size's rows are printed once its rounds are
	// done; within a size, round by round, alternating the order of the
	// modes so that neither always runs first.
	// printSize prints a size's rows from the rounds measured: all of
	// them, or, after an interrupt, those done if every mode has one.
	printSize := func(samples [][]row) error {
		for _, rs := range samples {
			if len(rs) == 0 {
				return nil
			}
		}
		for i := range modes {
			w := median(f.test, samples[i])
			w.RoundRatios = roundRatios(f.test, samples[i], samples[0])
			ratio := medianOf(slices.Clone(w.RoundRatios)) // medianOf sorts: the JSON keeps round order
			w.Ratio = &ratio
			for _, r := range samples[i] {
				w.RoundFigures = append(w.RoundFigures, figure(f.test, r))
			}
			if *w.Spread > spreadWarning {
				out.bar.clear()
				fmt.Fprintf(stderr, "udperf compare: %s %d B: its %d rounds disagree by %.0f%% ((max-min)/median); more -rounds or a quieter machine would tell\n",
					w.Mode, w.Bytes, w.Rounds, *w.Spread)
			}
			if err := out.row(w); err != nil {
				return err
			}
		}
		return nil
	}
sizes:
	for s := range nsizes {
		samples := make([][]row, len(modes)) // [mode][round]
		for r := range f.rounds {
			for k := range modes {
				if ctx.Err() != nil {
					interrupted = true
					runErr = printSize(samples)
					break sizes
				}
				i := k
				if r%2 == 1 {
					i = len(modes) - 1 - k
				}
				res, err := searching(f.test, measure)(byMode[i][s])
				if err != nil {
					runErr = fmt.Errorf("%s %s %d B: %w", modes[i], f.test, byMode[i][s].Size, err)
					break sizes
				}
				samples[i] = append(samples[i], rowOf(f.test, res))
				out.bar.tick()
			}
		}
		if err := printSize(samples); err != nil {
			runErr = err
			break
		}
	}
	out.bar.clear()
	return finish("compare", stderr, out.out, interrupted, runErr)
}

// warmup maps -w to perf.Config.Warmup, where 0 means the default and a
// negative value none.
func warmup(w int) int {
	if w == 0 {
		return -1
	}
	return w
}
