package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// writeReport writes report.md: the setting of the run, then each figure
// with its plots, its table (median and min–max of the rounds), the
// seed's published result and ours beside it.
func writeReport(dir string, figs []*figure, rows []row, made []plotted, m meta) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# udiwarp experiments: %s on %s\n\n", m.Date, m.Host)
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| command | `%s` |\n", m.Command)
	fmt.Fprintf(&b, "| mode | %s; %d rounds per point, series alternating; %s |\n", m.Mode, m.Rounds, m.Took)
	fmt.Fprintf(&b, "| loss | %s |\n", m.Loss)
	fmt.Fprintf(&b, "| machine | %s |\n", m.Machine)
	fmt.Fprintf(&b, "| tree | %s |\n", m.Tree)
	fmt.Fprintf(&b, "| data | [runs.csv](runs.csv), [runs.json](runs.json): one row per run, with its udperf (or udstream) command and every setting; [meta.json](meta.json): this table |\n\n")
	b.WriteString("Each point is the median of its rounds; the error bars and the brackets give the rounds' min–max (a linear axis stops at " +
		"three times the largest median: a bar that runs off its top, without a cap, is one round far above the others; the table has its value). " +
		"Lossless figures run both ends in one process on loopback (`udperf local`; latency busy-polls as perftest does, " +
		"bandwidth waits on events); the loss figures run " +
		"`udperf client` and `udperf server` in two network namespaces joined by a veth pair (MTU 1,500), event polling, " +
		"losing packets both ways (each fragment of a datagram over the MTU on its own; IP reassembly may hold 256 MiB for 1 s, " +
		"so one run's incomplete datagrams do not starve the next).\n\n")
	for _, f := range figs {
		fmt.Fprintf(&b, "## %s: %s\n\n", f.ID, f.Title)
		n := 0
		for _, p := range made {
			if p.fig == f.ID {
				fmt.Fprintf(&b, "![%s](%s.png)\n\n", p.title, p.name)
				n++
			}
		}
		if n == 0 {
			fmt.Fprintf(&b, "Not made in this run (%s).\n\n", skippedWhy(f))
			continue
		}
		if f.Table != nil {
			f.Table(&b, f, rows)
		} else {
			table(&b, f, rows)
		}
		if n := failed(rows, f.ID); n > 0 && f.LossX {
			fmt.Fprintf(&b, "%d runs under loss did not finish (their `failed` field in runs.csv says why) and count as 0.\n\n", n)
		}
		fmt.Fprintf(&b, "**Seed 003:** %s\n\n", f.Seed)
		if s := ours(f, rows); s != "" {
			fmt.Fprintf(&b, "**Ours:** %s\n\n", s)
		}
		fmt.Fprintf(&b, "**Why they may differ:** %s\n\n", f.Differs)
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), b.Bytes(), 0o644)
}

func failed(rows []row, fig string) int {
	n := 0
	for _, r := range rows {
		if r.str("figure") == fig && r.str("failed") != "" {
			n++
		}
	}
	return n
}

func flagsOf(o options) []string {
	var f []string
	if o.quick {
		f = append(f, "-quick")
	}
	if o.loss != "auto" {
		f = append(f, "-loss", o.loss)
	}
	if o.only != "" {
		f = append(f, "-only", o.only)
	}
	if o.sippClients != "" {
		f = append(f, "-sipp-clients", o.sippClients)
	}
	if o.sippRate > 0 {
		f = append(f, "-sipp-rate", strconv.Itoa(o.sippRate))
	}
	if o.preload != "" {
		f = append(f, "-preload", o.preload)
	}
	if o.sippTransports != "" {
		f = append(f, "-sipp-transports", o.sippTransports)
	}
	if o.server != "" {
		f = append(f, "-server", o.server, "-dev", o.dev)
	}
	if o.bneckRate != 1000 && o.bneckRate > 0 {
		f = append(f, "-bottleneck-rate", strconv.Itoa(o.bneckRate))
	}
	if o.bneckTCPCC != "" {
		f = append(f, "-bottleneck-tcp-cc", o.bneckTCPCC)
	}
	if o.bneckTCPTime > 0 {
		f = append(f, "-bottleneck-tcp-time", o.bneckTCPTime.String())
	}
	return f
}

func lossText(e *env) string {
	switch e.method {
	case "netem":
		return "netem (`tc qdisc ... netem loss P%`) on both ends of the veth pair"
	case "nft":
		return "nftables `numgen random` drops of UDP and TCP packets, each fragment on its own (prerouting, before reassembly), in both namespaces (this kernel has no netem)"
	}
	return "the stack's in-process impairment layer (`udperf -loss`; RC, which TCP carries, is not measured under loss this way)"
}

func skippedWhy(f *figure) string {
	if f.Needs != "" {
		return f.Needs + ", and runs on one machine"
	}
	if f.External != nil {
		return "needs ffmpeg, and runs on one machine"
	}
	return "no data"
}

// table prints f's points: a row per x, a column per series.
func table(b *bytes.Buffer, f *figure, rows []row) {
	unit := "µs"
	switch f.Test {
	case "bw":
		unit = "Gb/s"
	case "stream":
		unit = "ms"
	case "memory":
		unit = "B/peer"
	}
	fmt.Fprintf(b, "| %s |", f.XLabel)
	for _, s := range f.Series {
		fmt.Fprintf(b, " %s (%s) |", s.Label, unit)
	}
	b.WriteString("\n|---|")
	for range f.Series {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	xs := map[float64]bool{}
	for _, r := range rows {
		if r.str("figure") == f.ID {
			xs[r.num("x")] = true
		}
	}
	for _, xv := range sortedKeys(xs) {
		fmt.Fprintf(b, "| %s |", fmtX(xv, f.LossX || f.Test == "stream"))
		for _, s := range f.Series {
			cellv := "–"
			for _, p := range points(rows, f.ID, s.Label) {
				if p.x == xv {
					cellv = fmt.Sprintf("%s [%s–%s]", fmtV(p.median), fmtV(p.min), fmtV(p.max))
				}
			}
			fmt.Fprintf(b, " %s |", cellv)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

func sortedKeys(m map[float64]bool) []float64 {
	var k []float64
	for x := range m {
		k = append(k, x)
	}
	for i := 1; i < len(k); i++ {
		for j := i; j > 0 && k[j] < k[j-1]; j-- {
			k[j], k[j-1] = k[j-1], k[j]
		}
	}
	return k
}

func fmtX(x float64, loss bool) string {
	if loss {
		return fmt.Sprintf("%g", x)
	}
	switch n := int(x); {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d", int(x))
}

func fmtV(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// median of series s of f at x, and whether there is one.
func at(rows []row, f *figure, s string, x float64) (float64, bool) {
	for _, p := range points(rows, f.ID, s) {
		if p.x == x {
			return p.median, true
		}
	}
	return 0, false
}

// ours states our run's figure for what the seed states.
func ours(f *figure, rows []row) string {
	label := func(mode string) string {
		for _, s := range f.Series {
			if s.Mode == mode {
				return s.Label
			}
		}
		return ""
	}
	// mean ratio a/b over f's x values in [lo, hi].
	ratio := func(a, b string, lo, hi float64) (float64, int) {
		sum, n := 0.0, 0
		for _, x := range f.X {
			if x < lo || x > hi {
				continue
			}
			va, oka := at(rows, f, a, x)
			vb, okb := at(rows, f, b, x)
			if oka && okb && vb > 0 {
				sum += va / vb
				n++
			}
		}
		if n == 0 {
			return 0, 0
		}
		return sum / float64(n), n
	}
	switch f.ID {
	case "fig15":
		r1, n1 := ratio(label("ud-send"), label("rc-send"), 0, 2048)
		r2, n2 := ratio(label("ud-wr"), label("rc-write"), 0, 2048)
		if n1 == 0 || n2 == 0 {
			return ""
		}
		return fmt.Sprintf("up to 2 KB (%d sizes), UD Send/Recv latency is %.2fx RC Send/Recv's (%+.1f %%) and UD Write-Record %.2fx "+
			"RC RDMA Write's (%+.1f %%).", n1, r1, (r1-1)*100, r2, (r2-1)*100)
	case "fig16":
		var parts []string
		best, bestX := 0.0, 0.0
		for _, x := range f.X {
			if x < 128<<10 {
				continue
			}
			a, oka := at(rows, f, label("ud-send"), x)
			c, okc := at(rows, f, label("rc-send"), x)
			if oka && okc && c > 0 && a/c > best {
				best, bestX = a/c, x
			}
		}
		if best > 0 {
			parts = append(parts, fmt.Sprintf("above 128 KB, UD Send/Recv (64 KB chunks) reaches %.2fx RC Send/Recv (%+.1f %%, at %s)", best, (best-1)*100, fmtX(bestX, false)))
		}
		for _, x := range []float64{512 << 10, 1 << 20} {
			a, oka := at(rows, f, label("ud-wr"), x)
			c, okc := at(rows, f, label("rc-write"), x)
			if oka && okc && c > 0 {
				parts = append(parts, fmt.Sprintf("at %s UD Write-Record is %.2fx RC RDMA Write (%+.1f %%)", fmtX(x, false), a/c, (a/c-1)*100))
				break
			}
		}
		return strings.Join(parts, "; ") + "."
	case "fig17":
		if len(f.X) < 2 || len(f.Series) == 0 {
			return ""
		}
		hi := f.X[len(f.X)-1]
		var parts []string
		for _, sr := range []series{f.Series[0], f.Series[len(f.Series)-1]} {
			z, ok0 := at(rows, f, sr.Label, 0)
			v, ok1 := at(rows, f, sr.Label, hi)
			if ok0 && ok1 && z > 0 {
				parts = append(parts, fmt.Sprintf("%s keeps %.0f %% of its lossless goodput at %g %% loss", sr.Label, 100*v/z, hi))
			}
		}
		return strings.Join(parts, "; ") + "."
	case "fig18", "fig-rdma-loss":
		var parts []string
		for _, x := range f.X {
			best, bv := "", -1.0
			for _, sr := range f.Series {
				if v, ok := at(rows, f, sr.Label, x); ok && v > bv {
					best, bv = sr.Label, v
				}
			}
			if best != "" {
				parts = append(parts, fmt.Sprintf("%g %%: %s (%s Gb/s)", x, best, fmtV(bv)))
			}
		}
		return "best per loss rate — " + strings.Join(parts, "; ") + "."
	case "fig-shim":
		var parts []string
		for _, x := range f.X {
			a, oka := at(rows, f, f.Series[0].Label, x)
			u, oku := at(rows, f, f.Series[1].Label, x)
			if oka && oku && u > 0 {
				parts = append(parts, fmt.Sprintf("%g Mb/s: %.2fx (%+.1f ms)", x, a/u, a-u))
			}
		}
		if len(parts) > 0 {
			return "pre-buffering through the shim against kernel sockets — " + strings.Join(parts, "; ") + "."
		}
	case "fig19":
		a, oka := at(rows, f, "wr-ud", 0)
		c, okc := at(rows, f, "rc", 0)
		if oka && okc && c > 0 {
			return fmt.Sprintf("without loss, Write-Record over UD buffered in %.2fx the time RC took (%+.1f %%).", a/c, (a/c-1)*100)
		}
	}
	return ""
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.Index(l, ":"); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return runtime.GOARCH
}

func uname() string {
	b, err := exec.Command("uname", "-r").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

func commit(root string) string {
	c := exec.Command("git", "rev-parse", "--short", "HEAD")
	c.Dir = root
	b, err := c.Output()
	if err != nil {
		return "(not a git tree)"
	}
	s := strings.TrimSpace(string(b))
	c = exec.Command("git", "status", "--porcelain", "--untracked-files=no")
	c.Dir = root
	if d, _ := c.Output(); len(d) > 0 {
		s += " (with uncommitted changes)"
	}
	return s
}
