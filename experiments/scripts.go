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

// The figures of the shell experiments (issue 34): fi-pingpong.sh,
// mpi-netpipe.sh and mpi-memory.sh measure, write runs.csv (a row per
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
