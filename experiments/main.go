// Command experiments remakes the figures of seed 003 and ours in one
// run: `go run ./experiments` (full) or `go run ./experiments -quick`
// (CI-sized, about two minutes). It writes
// experiments/results/<date>-<host>/ (a quick run:
// experiments/results/quick/<date>-<host>-quick/, which git ignores) with
//
//   - runs.csv and runs.json: one row per measurement, with the udperf
//     command that made it and every setting udperf reports;
//   - a PNG and an SVG per figure (gonum.org/v1/plot): the median of the
//     rounds, and the rounds' min–max as error bars;
//   - report.md: each figure with its table, the seed's published result
//     beside ours, and why they differ where they do.
//
// Every measurement is one run of the udperf command (built from this
// tree), so each row carries exactly what udperf records and anyone can
// run it again by hand. Rounds alternate the order of a figure's series,
// as `udperf compare` does. Loss is made three ways, chosen with -loss:
// netem on a veth pair between two network namespaces where the kernel
// has sch_netem; nftables `numgen random` drops on the same veth pair
// where it does not; the stack's in-process impairment layer. auto picks
// the first available. With -server HOST the client side runs here
// against `udperf server` on HOST, and netem applies to -dev
// (experiments/README.md).
//
// Why a Go program and not a script: the plots need Go (gonum), the
// namespaces and the loss rules need careful setup and teardown, and a
// test (`go test ./experiments`) runs the quick mode and checks what it
// wrote.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type options struct {
	quick  bool
	out    string
	loss   string
	rounds int
	only   string
	server string
	dev    string
	udperf string
	replot string
	// plot: a shell experiment's results directory to draw (scripts.go).
	plot string
	// SIPp experiment: clients, transports, prebuilt preload libraries.
	sippClients, sippTransports, preload string
	sippRate                             int
	// The bottleneck experiment: the tbf's rate, and the congestion
	// control of the TCP flow beside RD ("": the host's default).
	bneckRate  int
	bneckTCPCC string
	// bneckTCPTime is how long RD and TCP share the bottleneck (0: the
	// plan's).
	bneckTCPTime time.Duration
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("experiments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.BoolVar(&o.quick, "quick", false, "CI-sized: few sizes and loss rates, short runs, 3 rounds (about 3 minutes on two cores; written under experiments/results/quick/, which git ignores)")
	fs.StringVar(&o.out, "out", "", "results directory (default experiments/results/<date>-<host>; -quick: experiments/results/quick/<date>-<host>-quick, ignored by git)")
	fs.StringVar(&o.loss, "loss", "auto", "how to lose packets: auto, netem, nft (nftables), inproc (the stack's impairment layer)")
	fs.IntVar(&o.rounds, "rounds", 0, "rounds per figure, modes alternating (default 3; at least 3)")
	fs.StringVar(&o.only, "only", "", "comma-separated figure IDs to make (default every figure)")
	fs.StringVar(&o.server, "server", "", "host mode: `HOST[:PORT]` running `udperf server`; the loss figures run against it")
	fs.StringVar(&o.dev, "dev", "", "host mode: the interface netem loses packets on (as root)")
	fs.StringVar(&o.udperf, "udperf", "", "a udperf binary to use (default: built from this tree)")
	fs.StringVar(&o.sippClients, "sipp-clients", "", "sipp: comma-separated client counts (default 1000,10000; quick 20,100)")
	fs.StringVar(&o.sippTransports, "sipp-transports", "", "sipp: comma-separated transports (default all: "+strings.Join(sippNames(), ",")+")")
	fs.IntVar(&o.sippRate, "sipp-rate", 0, "sipp: calls per second that open the clients (default 1000; quick 200)")
	fs.StringVar(&o.preload, "preload", "", "sipp: `DIR` holding a built libudiwarp_preload.so and libudiwarp_engine.so (default: built from this tree)")
	fs.IntVar(&o.bneckRate, "bottleneck-rate", 1000, "bottleneck: the tbf's rate in Mbit/s")
	fs.DurationVar(&o.bneckTCPTime, "bottleneck-tcp-time", 0, "bottleneck: how long RD and TCP share it (default 20 s, 3 s with -quick)")
	fs.StringVar(&o.bneckTCPCC, "bottleneck-tcp-cc", "", "bottleneck: the TCP flow's congestion control, iperf3 -C (cubic, bbr, reno; default: the host's)")
	fs.StringVar(&o.replot, "replot", "", "remake the plots and report.md of results `DIR` from its runs.json, measuring nothing")
	fs.StringVar(&o.plot, "plot", "", "draw the figures of a shell experiment's results `DIR` (fi-pingpong.sh, mpi-netpipe.sh, mpi-memory.sh) from its runs.csv, as PNG and SVG beside it, measuring nothing")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./experiments [-quick] [-loss auto|netem|nft|inproc] [-only IDs] [-server HOST -dev IF]\n\n")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nfigures: %s\n", strings.Join(figureIDs(), ", "))
		fmt.Fprintf(stderr, "figures of the shell experiments (-plot DIR): %s\n", strings.Join(scriptFigureIDs(), ", "))
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "experiments: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if o.plot != "" {
		if err := plotScripts(o.plot, stdout); err != nil {
			fmt.Fprintf(stderr, "experiments: -plot: %v\n", err)
			return 1
		}
		return 0
	}
	if o.rounds == 0 {
		o.rounds = 3
	}
	if o.rounds < 3 {
		fmt.Fprintln(stderr, "experiments: -rounds: at least 3 (every figure carries the spread of its rounds)")
		return 2
	}
	if o.server != "" && o.dev == "" && o.loss != "inproc" {
		fmt.Fprintln(stderr, "experiments: -server: name the interface netem loses packets on with -dev (or -loss inproc)")
		return 2
	}
	if o.replot != "" {
		if err := replot(o, stdout); err != nil {
			fmt.Fprintf(stderr, "experiments: %v\n", err)
			return 1
		}
		return 0
	}
	if err := do(o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "experiments: %v\n", err)
		return 1
	}
	return 0
}

func do(o options, stdout, stderr io.Writer) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	figs := figures(o.quick)
	if o.only != "" {
		want := strings.Split(o.only, ",")
		figs = slices.DeleteFunc(figs, func(f *figure) bool { return !slices.Contains(want, f.ID) })
		if len(figs) == 0 {
			return fmt.Errorf("-only %q: no such figure (%s)", o.only, strings.Join(figureIDs(), ", "))
		}
	}
	work, err := os.MkdirTemp("", "udiwarp-experiments-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := o.udperf
	// The SIPp, memory and bottleneck experiments run sipp, qp's harness
	// and rdflow, not udperf: -only sipp,fig-memory,bottleneck needs no
	// build of it.
	if bin == "" && slices.ContainsFunc(figs, func(f *figure) bool { return f.Test != "sipp" && f.Test != "memory" && f.Test != "bottleneck" }) {
		bin = filepath.Join(work, "udperf")
		if out, err := goCmd(root, "build", "-o", bin, "./cmd/udperf").CombinedOutput(); err != nil {
			return fmt.Errorf("building udperf: %v\n%s", err, out)
		}
	}
	out := o.out
	if out == "" {
		host, _ := os.Hostname()
		out = defaultOut(root, o.quick, time.Now(), host)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	// The log is written from here and by the programs' output copiers
	// (udperf server's stderr): one writer at a time.
	stderr = &syncWriter{w: stderr}
	e := &env{bin: bin, root: root, work: work, out: out, log: stderr, quick: o.quick}
	if e.method, err = chooseLoss(o, needsKernel(figs)); err != nil {
		return err
	}
	// SIGINT and SIGTERM tear the namespaces down before exiting.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() {
		if _, ok := <-sig; ok {
			e.close()
			os.Exit(130)
		}
	}()
	defer e.close()
	if o.server != "" {
		e.host, e.dev = o.server, o.dev
	}
	fmt.Fprintf(stderr, "experiments: %d figures, %d rounds, loss by %s, into %s\n", len(figs), o.rounds, e.method, out)
	start := time.Now()
	var rows []row
	for _, f := range figs {
		t0 := time.Now()
		got, err := e.measure(f, o)
		if err != nil {
			return fmt.Errorf("%s: %w", f.ID, err)
		}
		rows = append(rows, got...)
		fmt.Fprintf(stderr, "experiments: %s: %d runs in %v\n", f.ID, len(got), time.Since(t0).Round(time.Second))
	}
	if err := writeData(out, rows); err != nil {
		return err
	}
	m := runMeta(e, o, time.Since(start))
	if !slices.ContainsFunc(figs, func(f *figure) bool { return f.LossX }) {
		m.Loss = "none (no figure of this run loses packets)"
	}
	if err := m.save(out); err != nil {
		return err
	}
	if err := finish(out, figs, rows, m); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", filepath.Join(out, "report.md"))
	return nil
}

// finish draws every figure that has data and writes the report.
func finish(out string, figs []*figure, rows []row, m meta) error {
	var made []plotted
	for _, f := range figs {
		if !hasRows(rows, f.ID) {
			continue // not made (fig19 without ffmpeg)
		}
		plotf := plotFigure
		if f.Plot != nil {
			plotf = f.Plot
		}
		p, err := plotf(out, f, rows)
		if err != nil {
			return fmt.Errorf("%s: plot: %w", f.ID, err)
		}
		made = append(made, p...)
	}
	return writeReport(out, figs, rows, made, m)
}

func hasRows(rows []row, fig string) bool {
	for _, r := range rows {
		if r.str("figure") == fig {
			return true
		}
	}
	return false
}

// replot remakes the plots and the report of a results directory from
// its runs.json: the figures as this tree defines them, their x values
// and series as the data has them.
func replot(o options, stdout io.Writer) error {
	b, err := os.ReadFile(filepath.Join(o.replot, "runs.json"))
	if err != nil {
		return err
	}
	var rows []row
	if err := json.Unmarshal(b, &rows); err != nil {
		return fmt.Errorf("runs.json: %w", err)
	}
	o.quick = strings.HasSuffix(filepath.Clean(o.replot), "-quick")
	figs := figures(o.quick)
	for _, f := range figs {
		var labels []string
		f.X, labels = dataOf(f.ID, rows)
		if f.External != nil {
			f.Series = nil
			for _, l := range labels {
				f.Series = append(f.Series, series{Label: l, Mode: l})
			}
		}
	}
	var m meta
	if b, err := os.ReadFile(filepath.Join(o.replot, "meta.json")); err != nil || json.Unmarshal(b, &m) != nil {
		return fmt.Errorf("%s: no meta.json to say how the runs were made", o.replot)
	}
	if err := finish(o.replot, figs, rows, m); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", filepath.Join(o.replot, "report.md"))
	return nil
}

// dataOf returns what rows hold of figure id: its x values, sorted, and
// its series' labels in the order they first come.
func dataOf(id string, rows []row) (xs []float64, labels []string) {
	for _, r := range rows {
		if r.str("figure") != id {
			continue
		}
		if x := r.num("x"); !slices.Contains(xs, x) {
			xs = append(xs, x)
		}
		if l := r.str("series"); !slices.Contains(labels, l) {
			labels = append(labels, l)
		}
	}
	slices.Sort(xs)
	return xs, labels
}

// moduleRoot is the directory of this module's go.mod.
func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run from inside the udiwarp module (go run ./experiments)")
	}
	return filepath.Dir(mod), nil
}

func goCmd(dir string, args ...string) *exec.Cmd {
	c := exec.Command("go", args...)
	c.Dir = dir
	return c
}

// meta is how a results directory was made: the head of its report.
type meta struct {
	Date, Host, Command, Mode, Took, Loss, Machine, Tree string
	Rounds                                               int
}

func runMeta(e *env, o options, took time.Duration) meta {
	host, _ := os.Hostname()
	mode := "full"
	if o.quick {
		mode = "quick (CI-sized: few points, short runs)"
	}
	return meta{
		Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), Host: host,
		Command: strings.TrimSpace("go run ./experiments " + strings.Join(flagsOf(o), " ")),
		Mode:    mode, Rounds: o.rounds, Took: took.Round(time.Second).String(), Loss: lossText(e),
		Machine: fmt.Sprintf("%s, %d CPUs, kernel %s, %s", cpuModel(), runtime.NumCPU(), uname(), runtime.Version()),
		Tree:    commit(e.root),
	}
}

func (m meta) save(dir string) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "meta.json"), append(b, '\n'), 0o644)
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// defaultOut is where a run writes without -out: a full run beside the
// committed results, a quick one, a check rather than a result to keep,
// under results/quick/, which .gitignore ignores.
func defaultOut(root string, quick bool, now time.Time, host string) string {
	name := now.UTC().Format("2006-01-02") + "-" + host
	if quick {
		return filepath.Join(root, "experiments", "results", "quick", name+"-quick")
	}
	return filepath.Join(root, "experiments", "results", name)
}
