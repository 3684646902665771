package main

import (
	"encoding/csv"
	"encoding/json"
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
	"text/tabwriter"
	"time"

	"github.com/udiwarp/udiwarp/internal/metrics"
	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/qp"
)

// The measuring commands: `udperf local` runs one mode, server and client
// in one process over loopback; `udperf compare` runs several modes back
// to back, alternating, for several rounds, and gives each figure with its
// ratio to the first mode. Figures and columns follow perftest.

var allModes = []perf.Mode{perf.ModeUDSend, perf.ModeUDWriteRecord, perf.ModeRDSend, perf.ModeRDWrite, perf.ModeRDRead,
	perf.ModeRDWriteRecord, perf.ModeRCSend, perf.ModeRCWrite, perf.ModeRCRead, perf.ModeRawUDP, perf.ModeRawUDPUnconnected, perf.ModeRawTCP}

// maxSize is the largest message a mode carries (for -a).
func maxSize(m perf.Mode) int {
	switch m {
	case perf.ModeUDSend, perf.ModeRDSend, perf.ModeRawUDP, perf.ModeRawUDPUnconnected:
		return 32768 // one datagram; powers of two
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
	seed        uint64
	partial     bool
	deadline    time.Duration
	rounds      int
	json, csv   bool
	metrics     string
	collector   *metrics.Collector
}

func (f *benchFlags) register(fs *flag.FlagSet, multi bool) {
	if multi {
		fs.StringVar(&f.modes, "modes", "", "comma-separated modes; the first is the baseline of the ratios")
		fs.IntVar(&f.rounds, "rounds", 3, "rounds; each runs every mode once, in alternating order; figures are medians")
	} else {
		fs.StringVar(&f.mode, "mode", string(perf.ModeUDSend), "what carries the messages: "+modeList())
	}
	fs.StringVar(&f.test, "test", "lat", "lat (ping-pong, half round trip), bw (one-way goodput) or rate (message rate of -s messages)")
	fs.IntVar(&f.size, "s", 64, "message size in bytes")
	fs.BoolVar(&f.all, "a", false, "every size: powers of two from 2 bytes to the mode's largest")
	fs.BoolVar(&f.bidir, "bidir", false, "bw, rate: two flows at once, one each way; figures are their sum")
	fs.IntVar(&f.iters, "n", 10000, "iterations (lat)")
	fs.DurationVar(&f.dur, "D", time.Second, "duration of a bw or rate run")
	fs.IntVar(&f.warmup, "w", 1000, "warm-up iterations (lat)")
	fs.StringVar(&f.poll, "poll", "busy", "busy (spin on the CQ, as perftest does) or event")
	fs.IntVar(&f.qps, "qps", 1, "concurrent QPs (UD and raw-udp modes)")
	fs.IntVar(&f.mtu, "mtu", 0, "largest segment payload of Write-Record and RD segments (0: one datagram)")
	fs.Float64Var(&f.loss, "loss", 0, "datagram loss probability applied by the impairment layer (ud-wr at the sender; RD both ways)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the impairment layer")
	fs.BoolVar(&f.partial, "partial", false, "Write-Record: deliver partial messages at the deadline")
	fs.DurationVar(&f.deadline, "deadline", 5*time.Millisecond, "Write-Record deadline with -partial")
	fs.BoolVar(&f.json, "json", false, "one JSON document on stdout (docs/udperf.md)")
	fs.BoolVar(&f.csv, "csv", false, "CSV on stdout")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics at HOST:PORT/metrics while running")
}

// serveMetrics starts the -metrics server; the returned function stops it.
func (f *benchFlags) serveMetrics(stderr io.Writer) (func(), error) {
	if f.metrics == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", f.metrics)
	if err != nil {
		return nil, fmt.Errorf("-metrics %s: %w", f.metrics, err)
	}
	f.collector = metrics.New()
	mux := http.NewServeMux()
	mux.Handle("/metrics", f.collector.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
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

// configs turns the flags into one Config per size.
func (f *benchFlags) configs(m perf.Mode) ([]perf.Config, error) {
	test := perf.TestLat
	switch f.test {
	case "lat":
	case "bw", "rate":
		test = perf.TestBW
	default:
		return nil, fmt.Errorf("-test %q: want lat, bw or rate", f.test)
	}
	poll := qp.PollBusy
	switch f.poll {
	case "busy":
	case "event":
		poll = qp.PollEvent
	default:
		return nil, fmt.Errorf("-poll %q: want busy or event", f.poll)
	}
	if f.size < 0 || f.iters <= 0 || f.qps <= 0 || f.dur <= 0 || f.warmup < 0 || f.mtu < 0 {
		return nil, errors.New("sizes, counts and durations must be positive")
	}
	if f.bidir && test != perf.TestBW {
		return nil, errors.New("-bidir is for -test bw and rate")
	}
	if f.loss < 0 || f.loss >= 1 {
		return nil, fmt.Errorf("-loss %v: want a probability in [0, 1)", f.loss)
	}
	sizes := []int{f.size}
	if f.all {
		sizes = nil
		for s := 2; s <= maxSize(m); s *= 2 {
			sizes = append(sizes, s)
		}
	}
	var out []perf.Config
	for _, s := range sizes {
		c := perf.Config{Mode: m, Test: test, Poll: poll, Size: s, Iters: f.iters, Warmup: warmup(f.warmup),
			Duration: f.dur, QPs: f.qps, Bidir: f.bidir, Segment: f.mtu, Loss: f.loss, Seed: f.seed, Partial: f.partial, Deadline: f.deadline}
		if f.collector != nil {
			c.OnDevice = f.collector.Add
		}
		out = append(out, c)
	}
	return out, nil
}

// row is one (mode, size) figure set: the JSON schema of docs/udperf.md.
type row struct {
	Mode       string   `json:"mode"`
	Test       string   `json:"test"`
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
}

func reliableMode(m string) bool {
	return strings.HasPrefix(m, "rd-") || strings.HasPrefix(m, "rc-") || m == string(perf.ModeRawTCP)
}

func rowOf(test string, r perf.Result) row {
	w := row{Mode: string(r.Mode), Test: test, Bytes: r.Size}
	if r.Test == perf.TestLat {
		w.Iterations = r.Samples
		w.TMin, w.TTypical, w.TAvg, w.TMax, w.TStdev, w.P99, w.P999 = r.Min, r.Median, r.Avg, r.Max, r.Stdev, r.P99, r.P999
		return w
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

// median merges the rows of several rounds of one (mode, size).
func median(rs []row) row {
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
	return out
}

// document is the JSON output.
type document struct {
	Command   string         `json:"command"`
	Flags     map[string]any `json:"flags"`
	GoVersion string         `json:"go_version"`
	CPU       string         `json:"cpu"`
	Kernel    string         `json:"kernel"`
	Results   []row          `json:"results"`
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

func flagMap(fs *flag.FlagSet) map[string]any {
	m := map[string]any{}
	fs.VisitAll(func(f *flag.Flag) { m[f.Name] = f.Value.String() })
	return m
}

// local is `udperf local`.
func local(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f benchFlags
	f.register(fs, false)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	m, err := parseMode(f.mode)
	if err != nil {
		fmt.Fprintf(stderr, "udperf local: %v\n", err)
		return 2
	}
	stop, err := f.serveMetrics(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "udperf local: %v\n", err)
		return 2
	}
	defer stop()
	cfgs, err := f.configs(m)
	if err != nil {
		fmt.Fprintf(stderr, "udperf local: %v\n", err)
		return 2
	}
	var rows []row
	for i, c := range cfgs {
		progress(stderr, i, len(cfgs))
		r, err := perf.Run(c)
		if err != nil {
			fmt.Fprintf(stderr, "udperf local: %s %s %d B: %v\n", c.Mode, f.test, c.Size, err)
			return 1
		}
		rows = append(rows, rowOf(f.test, r))
	}
	progressDone(stderr, len(cfgs))
	return emit(stdout, stderr, "local", fs, &f, rows)
}

// compare is `udperf compare`.
func compare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f benchFlags
	f.register(fs, true)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if f.modes == "" || f.rounds <= 0 {
		fmt.Fprintln(stderr, "udperf compare: -modes M1,M2,... is required, and -rounds must be positive")
		return 2
	}
	var modes []perf.Mode
	for _, s := range strings.Split(f.modes, ",") {
		m, err := parseMode(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintf(stderr, "udperf compare: %v\n", err)
			return 2
		}
		modes = append(modes, m)
	}
	stop, err := f.serveMetrics(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "udperf compare: %v\n", err)
		return 2
	}
	defer stop()
	byMode := make([][]perf.Config, len(modes))
	for i, m := range modes {
		cfgs, err := f.configs(m)
		if err != nil {
			fmt.Fprintf(stderr, "udperf compare: %v\n", err)
			return 2
		}
		byMode[i] = cfgs
	}
	// Sizes common to every mode (with -a, the smallest maximum wins).
	nsizes := len(byMode[0])
	for _, c := range byMode {
		nsizes = min(nsizes, len(c))
	}
	samples := make([][][]row, len(modes)) // [mode][size][round]
	for i := range modes {
		samples[i] = make([][]row, nsizes)
	}
	total, done := f.rounds*nsizes*len(modes), 0
	for r := range f.rounds {
		for s := range nsizes {
			for k := range modes {
				i := k
				if r%2 == 1 { // alternate the order: neither mode always runs first
					i = len(modes) - 1 - k
				}
				progress(stderr, done, total)
				res, err := perf.Run(byMode[i][s])
				if err != nil {
					fmt.Fprintf(stderr, "udperf compare: %s %s %d B: %v\n", modes[i], f.test, byMode[i][s].Size, err)
					return 1
				}
				samples[i][s] = append(samples[i][s], rowOf(f.test, res))
				done++
			}
		}
	}
	progressDone(stderr, total)
	var rows []row
	for s := range nsizes {
		base := median(samples[0][s])
		for i := range modes {
			w := median(samples[i][s])
			var ratio float64
			if f.test == "lat" {
				if base.TTypical > 0 {
					ratio = w.TTypical / base.TTypical
				}
			} else if f.test == "rate" {
				if base.MsgRate > 0 {
					ratio = w.MsgRate / base.MsgRate
				}
			} else if base.BWAvg > 0 {
				ratio = w.BWAvg / base.BWAvg
			}
			w.Ratio = &ratio
			rows = append(rows, w)
		}
	}
	return emit(stdout, stderr, "compare", fs, &f, rows)
}

func emit(stdout, stderr io.Writer, cmd string, fs *flag.FlagSet, f *benchFlags, rows []row) int {
	switch {
	case f.json:
		doc := document{Command: cmd, Flags: flagMap(fs), GoVersion: runtime.Version(), CPU: cpuModel(), Kernel: kernel(), Results: rows}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(doc); err != nil {
			fmt.Fprintf(stderr, "udperf: %v\n", err)
			return 1
		}
	case f.csv:
		w := csv.NewWriter(stdout)
		hdr, get := columns(f.test)
		if cmd == "compare" {
			hdr = append([]string{"mode"}, append(hdr, "ratio")...)
		}
		w.Write(hdr)
		for _, r := range rows {
			rec := get(r)
			if cmd == "compare" {
				rec = append([]string{r.Mode}, append(rec, strconv.FormatFloat(*r.Ratio, 'f', 3, 64))...)
			}
			w.Write(rec)
		}
		w.Flush()
	default:
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		hdr, get := columns(f.test)
		if cmd == "compare" {
			hdr = append([]string{"mode"}, append(hdr, "ratio")...)
		}
		fmt.Fprintln(tw, strings.Join(hdr, "\t")+"\t")
		for _, r := range rows {
			rec := get(r)
			if cmd == "compare" {
				rec = append([]string{r.Mode}, append(rec, fmt.Sprintf("%.2fx", *r.Ratio))...)
			}
			fmt.Fprintln(tw, strings.Join(rec, "\t")+"\t")
		}
		tw.Flush()
	}
	return 0
}

// columns are perftest's, per test.
func columns(test string) ([]string, func(row) []string) {
	f2 := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	if test == "lat" {
		return []string{"bytes", "iterations", "t_min[usec]", "t_max[usec]", "t_typical[usec]", "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]", "99.9% percentile[usec]"},
			func(r row) []string {
				return []string{strconv.Itoa(r.Bytes), strconv.Itoa(r.Iterations), f2(r.TMin), f2(r.TMax), f2(r.TTypical), f2(r.TAvg), f2(r.TStdev), f2(r.P99), f2(r.P999)}
			}
	}
	return []string{"bytes", "iterations", "BW peak[Gb/sec]", "BW average[Gb/sec]", "MsgRate[Mpps]", "lost", "valid_bytes"},
		func(r row) []string {
			lost, valid := "-", "-"
			if r.Lost != nil {
				lost = strconv.FormatUint(*r.Lost, 10)
			}
			if r.ValidBytes != nil {
				valid = strconv.FormatUint(*r.ValidBytes, 10)
			}
			return []string{strconv.Itoa(r.Bytes), strconv.Itoa(r.Iterations), f2(r.BWPeak), f2(r.BWAvg), strconv.FormatFloat(r.MsgRate, 'f', 4, 64), lost, valid}
		}
}

// progress draws a bar on stderr for sweeps, only when stderr is a terminal.
func progress(w io.Writer, done, total int) {
	if total < 3 || !isTerminal(w) {
		return
	}
	const width = 30
	n := done * width / total
	fmt.Fprintf(w, "\r[%s%s] %d/%d", strings.Repeat("#", n), strings.Repeat(".", width-n), done, total)
}

func progressDone(w io.Writer, total int) {
	if total >= 3 && isTerminal(w) {
		fmt.Fprint(w, "\r\033[K")
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// warmup maps -w to perf.Config.Warmup, where 0 means the default and a
// negative value none.
func warmup(w int) int {
	if w == 0 {
		return -1
	}
	return w
}
