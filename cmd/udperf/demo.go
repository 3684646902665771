package main

import (
	"fmt"
	"io"
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
	fmt.Fprintln(stdout, "udiwarp loopback demo: two devices in one process, UD Send/Recv beside plain UDP sockets")
	fmt.Fprintln(stdout, "latency is half the round trip (median, µs); bandwidth is receiver goodput (Gb/s)")
	fmt.Fprintln(stdout)
	// Fixed widths: each row is printed as soon as it is measured.
	const line = "%9s  %5s  %5s  %14s  %14s  %5s\n"
	fmt.Fprintf(stdout, line, "test", "poll", "bytes", "raw-udp", "ud-send", "ratio")
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
	for _, r := range rows {
		var vals [2]float64
		for i, m := range []perf.Mode{perf.ModeRawUDP, perf.ModeUDSend} {
			res, err := perf.Run(perf.Config{Mode: m, Test: r.test, Poll: r.poll, Size: r.size, Iters: iters, Duration: dur})
			if err != nil {
				fmt.Fprintf(stderr, "udperf: %s %s: %v\n", m, r.test, err)
				return 1
			}
			vals[i] = res.Median
			if r.test == perf.TestBW {
				vals[i] = res.Gbps
			}
		}
		name, unit := "latency", "µs"
		if r.test == perf.TestBW {
			name, unit = "bandwidth", "Gb/s"
		}
		ratio := 0.0
		if vals[0] > 0 {
			ratio = vals[1] / vals[0]
		}
		fmt.Fprintf(stdout, line, name, r.poll, strconv.Itoa(r.size), fmt.Sprintf("%.2f %s", vals[0], unit), fmt.Sprintf("%.2f %s", vals[1], unit), fmt.Sprintf("%.2f", ratio))
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, "ratio = ud-send / raw-udp: below 1 is better for latency, above 1 for bandwidth")
	return 0
}
