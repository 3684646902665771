package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// The figures of the shell experiments (issues 34 and 35): fi-pingpong.sh,
// mpi-netpipe.sh, mpi-memory.sh and xdp.sh measure, write runs.csv (a row per
// run, the columns of lead) into their results directory, and then draw
// it with `go run ./experiments -plot DIR`, which draws every figure below
// that has rows there, through plotFigure: the chart of every other
// figure (medians of the rounds, min-max bars, ticks at the x measured).
// The series are listed in the order their colours are given; a series
// in the data and not listed (a transport a later script adds) is drawn
// after them.
func scriptFigures() []*figure {
	mpi := []series{
		{Label: "udiwarp RDM (native)"},
		{Label: "udiwarp;ofi_rxm"},
		{Label: "Open MPI TCP BTL"},
		{Label: "tcp;ofi_rxm"},
		{Label: "udp;ofi_rxd"},
	}
	mpiSeed := "Seed 003 compared MPI (MVAPICH-Aptus's hybrid UD/RC channel) over datagram-iWARP and over RC-iWARP, both " +
		"software iWARP on 10 GbE: MPI over UD had the lower ping-pong latency (FIG 5) and the higher bidirectional " +
		"bandwidth for most message sizes (FIG 6); it published the curves without numbers."
	// xdp.sh's series, in one list for both figures so that a series has
	// the same colour in each: the kernel socket's beside AF_XDP's.
	xdp := []series{
		{Label: "raw-udp (kernel sockets)"},
		{Label: "raw-xdp (AF_XDP, no stack)"},
		{Label: "UD Send, sockets"},
		{Label: "UD Send, AF_XDP"},
		{Label: "UD Write-Record, sockets"},
		{Label: "UD Write-Record, AF_XDP"},
		{Label: "RD Send, sockets"},
		{Label: "RD Send, AF_XDP"},
		{Label: "RD Write, sockets"},
		{Label: "RD Write, AF_XDP"},
	}
	xdpDiffers := "Seed 003's FIG 15 and 16 ran between two hosts with NetEffect 10 GbE cards; ours is one VM's two cores (server on " +
		"CPU 0, client on CPU 1, busy polling) and a veth pair between two network namespaces, MTU 1,500, where AF_XDP runs in " +
		"copy mode (the veth has no zero-copy queues): every datagram is still copied into and out of the UMEM. An AF_XDP " +
		"link takes no IP fragments, so UD Send and the raw modes stop at 1,400 B, and Write-Record and RD carry larger " +
		"messages in 1,400-byte segments (-mtu 1400), over the kernel's sockets too, to compare like with like."
	return []*figure{
		{
			ID: "fi-pingpong", Title: "fi_pingpong over udiwarp beside libfabric's own providers (issue 34)", Test: "lat",
			XLabel: "message size (bytes)", YLabel: "one-way latency (µs a transfer, first exchange left out)", LogY: true,
			Series: []series{
				{Label: "udiwarp -e dgram"},
				{Label: "udp -e dgram"},
				{Label: "udiwarp -e rdm (native RD)"},
				{Label: "udp;ofi_rxd -e rdm"},
				{Label: "udiwarp;ofi_rxd -e rdm"},
				{Label: "udiwarp -e msg"},
				{Label: "tcp -e msg"},
				{Label: "udiwarp;ofi_rxm -e rdm"},
				{Label: "tcp;ofi_rxm -e rdm"},
			},
		},
		{
			// One plot on a log scale, as fi-pingpong: the transports are
			// a hundredfold apart at a megabyte.
			ID: "mpi-latency", Title: "MPI ping-pong latency: NetPIPE, two Open MPI ranks (seed 003 FIG 5)", Test: "lat",
			XLabel: "message size (bytes)", YLabel: "latency, half round trip (µs)", LogY: true,
			Series: mpi, Seed: mpiSeed,
		},
		{
			ID: "mpi-bibw", Title: "MPI bidirectional bandwidth: NetPIPE -2, two Open MPI ranks (seed 003 FIG 6)", Test: "bw",
			XLabel: "message size, each direction (bytes)", YLabel: "bandwidth, both directions (Gb/s)",
			Series: mpi, Seed: mpiSeed,
		},
		{
			ID: "mpi-memory", Title: "Memory of an MPI rank that has talked to every other rank (seed 003 FIG 8)", Test: "mpi-memory",
			XLabel: "ranks (one host, every pair exchanging)", YLabel: "VmRSS per rank (MiB)",
			Series: mpi[:3],
			Seed: "Seed 003 measured the memory pages of MPI jobs (NPB, SMG2000, Radix) over datagram-iWARP and RC-iWARP and " +
				"published the saving in percent as the processes grew; MVAPICH posts 95 receive buffers of 8 KB to every RC " +
				"connection, about 800 KB per connection per process.",
		},
		{
			ID: "mpi-memory-growth", Title: "What talking to every other rank added to a rank's memory (seed 003 FIG 8)", Test: "mpi-memory",
			XLabel: "ranks (one host, every pair exchanging)", YLabel: "VmRSS growth per rank (MiB)",
			Series: mpi[:3],
		},
		{
			ID: "xdp-latency", Title: "Latency over a veth, AF_XDP beside kernel sockets (seed 003 FIG 15, issue 35)", Test: "lat",
			XLabel: "message size (bytes)", YLabel: "latency, half round trip (µs, t_typical)",
			Series: xdp,
			Seed: "Seed 003 FIG 15: UD Send/Recv and UD Write-Record 27-28 µs under 128 B, RC about 33 µs (two hosts, 10 GbE " +
				"NetEffect cards, software iWARP over the kernel's sockets).",
			Differs: xdpDiffers,
		},
		{
			ID: "xdp-goodput", Title: "Goodput over a veth, AF_XDP beside kernel sockets (seed 003 FIG 16, issue 35)", Test: "bw",
			XLabel: "message size (bytes)", YLabel: "goodput at the server (Gb/s)",
			Series: xdp,
			Seed: "Seed 003 FIG 16: UD Send/Recv up to 33.4 % above RC Send/Recv (at 256 KB), UD Write-Record 256 % above RC RDMA " +
				"Write at 512 KB (two hosts, 10 GbE NetEffect cards, software iWARP over the kernel's sockets).",
			Differs: xdpDiffers,
		},
	}
}

// plotScripts draws the figures of scriptFigures that have rows in
// dir/runs.csv, as PNG and SVG in dir, and prints the files' paths.
func plotScripts(dir string, stdout io.Writer) error {
	rows, err := readRunsCSV(filepath.Join(dir, "runs.csv"))
	if err != nil {
		return err
	}
	drawn := 0
	for _, f := range scriptFigures() {
		var labels []string
		if f.X, labels = dataOf(f.ID, rows); len(f.X) == 0 {
			continue
		}
		for _, l := range labels {
			if !slices.ContainsFunc(f.Series, func(s series) bool { return s.Label == l }) {
				f.Series = append(f.Series, series{Label: l})
			}
		}
		made, err := plotFigure(dir, f, rows)
		if err != nil {
			return fmt.Errorf("%s: %w", f.ID, err)
		}
		for _, p := range made {
			fmt.Fprintf(stdout, "%s\n", filepath.Join(dir, p.name+".png"))
			drawn++
		}
	}
	if drawn == 0 {
		return fmt.Errorf("%s: no rows of %v", filepath.Join(dir, "runs.csv"), scriptFigureIDs())
	}
	return nil
}

func scriptFigureIDs() []string {
	var ids []string
	for _, f := range scriptFigures() {
		ids = append(ids, f.ID)
	}
	return ids
}

// readRunsCSV reads a runs.csv as rows: x, round and value as numbers,
// every other column as text. A run that failed (value NaN or empty) is
// left out: it has no place in a median.
func readRunsCSV(path string) ([]row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	head := recs[0]
	for _, k := range []string{"figure", "series", "x", "value"} {
		if !slices.Contains(head, k) {
			return nil, fmt.Errorf("%s: no column %q (columns: %v)", path, k, head)
		}
	}
	var rows []row
	for i, rec := range recs[1:] {
		r := row{}
		for j, k := range head {
			if j >= len(rec) {
				break
			}
			switch k {
			case "x", "round", "value":
				v, err := strconv.ParseFloat(rec[j], 64)
				if err != nil && !(k == "value" && (rec[j] == "" || rec[j] == "NaN")) {
					return nil, fmt.Errorf("%s: line %d: %s %q: %w", path, i+2, k, rec[j], err)
				}
				if err != nil {
					v = math.NaN()
				}
				r[k] = v
			default:
				r[k] = rec[j]
			}
		}
		if v := r.num("value"); math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		rows = append(rows, r)
	}
	return rows, nil
}
