package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/udiwarp/udiwarp/internal/memstat"
)

// memoryFigure measures memory per peer as peers grow, seed 003's first
// argument for datagram-iWARP: one RD and one UD QP serving N clients at
// distinct addresses (idle, and with an answer in flight), and an RC QP
// per connection. The measurement is qp's own benchmark harness
// (BenchmarkPeerMemory, BenchmarkRCConnectionMemory in
// qp/scale_mem_test.go): the server runs in a child process, and its
// whole resident set plus the growth of the kernel's socket slab is
// divided by N (internal/memstat), as the seed measured its SIPp runs.
// It is run here rather than reimplemented, so that the figure and the
// benchmark are one measurement.
func memoryFigure(e *env, f *figure, o options) ([]row, error) {
	if _, err := memstat.ReadSlab(); err != nil {
		fmt.Fprintf(e.log, "experiments: %s: skipped: %v\n", f.ID, err)
		return nil, nil
	}
	bin := filepath.Join(e.work, "qp.test")
	if out, err := goCmd(e.root, "test", "-c", "-o", bin, "./qp").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building qp's tests: %v\n%s", err, out)
	}
	peers := []int{1000, 10000, 100000}
	conns := []int{1000, 10000}
	if e.quick {
		peers, conns = []int{300, 1000}, []int{300, 1000}
	}
	f.X = nil
	for _, n := range peers {
		f.X = append(f.X, float64(n))
	}
	f.Series = []series{
		{Label: "RD, idle peer", Mode: "rd-idle-peer"}, {Label: "RD, answer in flight", Mode: "rd-active-peer"},
		{Label: "UD, idle peer", Mode: "ud-idle-peer"}, {Label: "UD, answer in flight", Mode: "ud-active-peer"},
		{Label: "RC, per connection", Mode: "rc-conn"},
	}
	type job struct {
		bench, kind string
		n           int
	}
	var jobs []job
	for _, n := range peers {
		jobs = append(jobs, job{"BenchmarkPeerMemory", "rd", n}, job{"BenchmarkPeerMemory", "ud", n})
	}
	for _, n := range conns {
		jobs = append(jobs, job{"BenchmarkRCConnectionMemory", "rc", n})
	}
	var rows []row
	for r := range o.rounds {
		for k := range jobs {
			j := jobs[(k+r)%len(jobs)] // kinds alternate across rounds
			sub := fmt.Sprintf("%s/peers=%d", j.kind, j.n)
			if j.kind == "rc" {
				sub = fmt.Sprintf("conns=%d", j.n)
			}
			args := []string{"-test.run", "^$", "-test.bench", "^" + j.bench + "$/^" + strings.ReplaceAll(sub, "/", "$/^") + "$",
				"-test.benchtime", "1x", "-test.count", "1"}
			cmd := exec.Command(bin, args...)
			cmd.Dir = filepath.Join(e.root, "qp")
			env := fmt.Sprintf("UDIWARP_SCALE_PEERS=%d", j.n)
			if j.kind == "rc" {
				env = fmt.Sprintf("UDIWARP_SCALE_CONNS=%d", j.n)
			}
			cmd.Env = append(os.Environ(), env)
			out, err := cmd.CombinedOutput()
			if err != nil {
				return rows, fmt.Errorf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
			}
			metrics, err := benchMetrics(out)
			if err != nil {
				return rows, fmt.Errorf("%s: %w\n%s", sub, err, out)
			}
			fmt.Fprintf(e.log, "experiments: %s: %s, round %d: %s\n", f.ID, sub, r+1, memoryLine(metrics))
			for _, what := range []string{"idle-peer", "active-peer", "conn"} {
				v, ok := metrics["B/"+what]
				if !ok {
					continue
				}
				mode := j.kind + "-" + what
				label := ""
				for _, s := range f.Series {
					if s.Mode == mode {
						label = s.Label
					}
				}
				rows = append(rows, row{"figure": f.ID, "series": label, "mode": mode, "x": float64(j.n), "round": r + 1,
					"loss_pct": 0.0, "loss_method": "none", "value": v, "unit": "B per peer",
					"rss_bytes_per_peer": metrics["rss-B/"+what], "slab_bytes_per_peer": metrics["slab-B/"+what],
					"heap_bytes_per_peer": metrics["heap-B/"+what], "peers": j.n,
					"command": "cd qp && go test -c -o qp.test && " + env + " ./qp.test " + strings.Join(args, " ")})
			}
		}
	}
	return rows, nil
}

// memoryLine says what a memory benchmark measured, in the figure's
// terms: bytes per peer (or connection), the server's resident set plus
// the growth of the socket slab. (The benchmark also reports the two
// parts and the Go heap: the slab's growth can be below zero, the kernel
// freeing other slab pages meanwhile, and the heap above the total, heap
// that was resident before the peers came. They are kept in runs.csv,
// not printed where they would read as a sum.)
func memoryLine(m map[string]float64) string {
	var parts []string
	for _, w := range []struct{ key, what string }{
		{"idle-peer", "idle peer"}, {"active-peer", "peer with an answer in flight"}, {"conn", "RC connection"},
	} {
		if v, ok := m["B/"+w.key]; ok {
			p := fmt.Sprintf("%s B per %s", number(math.Round(v)), w.what)
			if v < 0 {
				p += " (below zero: the server gave back more pages than the peers took, noise around a cost near none)"
			}
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return "no bytes-per-peer figure"
	}
	return strings.Join(parts, ", ") + " (resident set + socket slab)"
}

// benchMetrics reads the metrics of the one benchmark line in out
// ("BenchmarkX/y-2  1  123 ns/op  2552 B/idle-peer ...").
var benchLine = regexp.MustCompile(`^Benchmark\S+\s+\d+\s+(.*)$`)

func benchMetrics(out []byte) (map[string]float64, error) {
	m := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		g := benchLine.FindStringSubmatch(sc.Text())
		if g == nil {
			continue
		}
		f := strings.Fields(g[1])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("benchmark line %q", sc.Text())
			}
			m[f[i+1]] = v
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("no benchmark result")
	}
	return m, nil
}
