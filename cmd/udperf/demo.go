package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/qp"
)

// demo runs two devices in one process over loopback: UD Send/Recv
// latency and bandwidth, each beside the same measurement over plain UDP
// sockets, with the ratio.
func demo(args []string, stdout, stderr io.Writer) int {
	cmd := newCommand("demo", "udperf demo [-quick]", "Two devices in one process over loopback: UD Send/Recv beside plain UDP sockets, with ratios.")
	quick := cmd.fs.Bool("quick", false, "fewer iterations (for tests)")
	if code, ok := cmd.parse(args, stdout, stderr); !ok {
		return code
	}
	iters, dur := 5000, time.Second
	if *quick {
		iters, dur = 200, 100*time.Millisecond
	}
	const rounds = 3
	fmt.Fprintln(stdout, "udiwarp loopback demo: two devices in one process, UD Send/Recv beside plain UDP sockets")
	fmt.Fprintln(stdout, "latency is half the round trip (median, µs); bandwidth is receiver goodput (Gb/s);")
	fmt.Fprintf(stdout, "each figure the median of %d rounds, the two taking turns to go first\n", rounds)
	fmt.Fprintln(stdout)
	// Fixed widths: each row is printed as soon as it is measured.
	const line = "%9s  %5s  %5s  %14s  %14s  %5s  %6s\n"
	fmt.Fprintf(stdout, line, "test", "poll", "bytes", "raw-udp", "ud-send", "ratio", "spread")
	type row struct {
		test perf.Test
		poll qp.PollMode
		size int
	}
	rows := []row{
		{perf.TestLat, qp.PollEvent, 64}, {perf.TestLat, qp.PollEvent, 1024},
		{perf.TestLat, qp.PollBusy, 64}, {perf.TestLat, qp.PollBusy, 1024},
		{perf.TestBW, qp.PollEvent, 64000},
	}
	modes := []perf.Mode{perf.ModeRawUDP, perf.ModeUDSend}
	var warnings []string
	for _, r := range rows {
		var vals [2][]float64
		var ratios []float64
		for round := range rounds {
			var got [2]float64
			for k := range modes {
				i := k
				if round%2 == 1 { // alternate which goes first
					i = len(modes) - 1 - k
				}
				res, err := perf.Run(perf.Config{Mode: modes[i], Test: r.test, Poll: r.poll, Size: r.size, Iters: iters, Duration: dur})
				if err != nil {
					fmt.Fprintf(stderr, "udperf: %s %s: %v\n", modes[i], r.test, err)
					return 1
				}
				got[i] = res.Median
				if r.test == perf.TestBW {
					got[i] = res.Gbps
				}
				vals[i] = append(vals[i], got[i])
			}
			if got[0] > 0 {
				ratios = append(ratios, got[1]/got[0])
			}
		}
		name, unit := "latency", "µs"
		if r.test == perf.TestBW {
			name, unit = "bandwidth", "Gb/s"
		}
		ratio, spread := medianOf(ratios), 0.0
		if ratio > 0 {
			spread = 100 * (slices.Max(ratios) - slices.Min(ratios)) / ratio
		}
		fmt.Fprintf(stdout, line, name, r.poll, strconv.Itoa(r.size), fmt.Sprintf("%.2f %s", medianOf(vals[0][:]), unit),
			fmt.Sprintf("%.2f %s", medianOf(vals[1][:]), unit), fmt.Sprintf("%.2f", ratio), fmt.Sprintf("%.0f%%", spread))
		if spread > spreadWarning {
			warnings = append(warnings, fmt.Sprintf("udperf: %s %s %d B: the rounds' ratios disagree by %.0f%% ((max-min)/median); `udperf compare -rounds 7` or a quieter machine would tell",
				name, r.poll, r.size, spread))
		}
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, "ratio = ud-send / raw-udp, the median of the rounds' ratios: below 1 is better for latency, above 1 for")
	fmt.Fprintln(stdout, "bandwidth; spread = (max-min)/median of those ratios")
	for _, w := range warnings {
		fmt.Fprintln(stderr, w)
	}
	return 0
}

// medianOf is the median of v (0 for none); v is sorted in place.
func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}
