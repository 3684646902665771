package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// TestPlotScripts: -plot draws every figure of the shell experiments that
// has rows in a runs.csv as the scripts write it (quoted series with
// semicolons, commands with commas, a failed run's NaN left out, a series
// no figure lists drawn after the listed ones), and names the PNGs.
func TestPlotScripts(t *testing.T) {
	dir := t.TempDir()
	csv := `figure,series,x,round,value,unit,provider,endpoint,iterations,command
fi-pingpong,"udiwarp -e dgram",64,1,10.5,us,"udiwarp",dgram,200,"FI_PROVIDER=^ofi_rxd,ofi_rxm fi_pingpong -p udiwarp"
fi-pingpong,"udiwarp -e dgram",64,2,11.5,us,"udiwarp",dgram,200,"x"
fi-pingpong,"udiwarp -e dgram",65536,1,NaN,us,"udiwarp",dgram,200,"x"
fi-pingpong,"udiwarp -e dgram",4096,1,13,us,"udiwarp",dgram,200,"x"
fi-pingpong,"udp;ofi_rxd -e rdm",64,1,15,us,"udp;ofi_rxd",rdm,200,"x"
fi-pingpong,"udp;ofi_rxd -e rdm",65536,1,250,us,"udp;ofi_rxd",rdm,200,"x"
fi-pingpong,"a provider no list names -e rdm",4096,1,40,us,"x",rdm,200,"x"
mpi-latency,"udiwarp RDM (native)",1,1,20.5,us,udiwarp,,100,"mpirun --mca btl tcp,self"
mpi-latency,"udiwarp RDM (native)",1048576,1,2300,us,udiwarp,,100,"x"
mpi-latency,"Open MPI TCP BTL",1,1,9.3,us,tcp-btl,,100,"x"
mpi-latency,"Open MPI TCP BTL",1048576,1,205,us,tcp-btl,,100,"x"
mpi-bibw,"udiwarp;ofi_rxm",1,1,0.001,Gb/s,udiwarp-rxm,,100,"x"
mpi-bibw,"udiwarp;ofi_rxm",1048576,1,35,Gb/s,udiwarp-rxm,,100,"x"
mpi-memory,"udiwarp RDM (native)",2,1,32.1,MiB,udiwarp,,,"x"
mpi-memory,"udiwarp RDM (native)",8,1,33.5,MiB,udiwarp,,,"x"
mpi-memory-growth,"udiwarp RDM (native)",2,1,0.8,MiB,udiwarp,,,"x"
mpi-memory-growth,"udiwarp RDM (native)",8,1,1.9,MiB,udiwarp,,,"x"
xdp-latency,"raw-udp (kernel sockets)",64,1,9.8,us,raw-udp,udp,,"udperf client -poll busy -mode raw-udp -test lat -s 64 -n 20000 -w 2000"
xdp-latency,"raw-xdp (AF_XDP, no stack)",64,1,2.9,us,raw-xdp,xdp,,"x"
xdp-latency,"UD Send, AF_XDP",64,1,3.5,us,ud-send,xdp,,"x"
xdp-latency,"UD Send, AF_XDP",1400,1,6.1,us,ud-send,xdp,,"x"
xdp-latency,"RD Send, AF_XDP",4096,1,14.2,us,rd-send,xdp,,"x"
xdp-latency,"RD Send, sockets",4096,1,31,us,rd-send,udp,,"x"
xdp-goodput,"UD Write-Record, AF_XDP",1400,1,1.9,Gb/s,ud-wr,xdp,,"x"
xdp-goodput,"UD Write-Record, AF_XDP",1048576,1,3.2,Gb/s,ud-wr,xdp,,"x"
xdp-goodput,"RD Write, sockets",1400,1,0.9,Gb/s,rd-write,udp,,"x"
xdp-goodput,"RD Write, sockets",1048576,1,2.4,Gb/s,rd-write,udp,,"x"
`
	if err := os.WriteFile(filepath.Join(dir, "runs.csv"), []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	rows, err := readRunsCSV(filepath.Join(dir, "runs.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 26 {
		t.Errorf("%d rows, want 26 (the NaN run left out)", len(rows))
	}
	if r := rows[0]; r.str("series") != "udiwarp -e dgram" || r.num("x") != 64 || r.num("value") != 10.5 || !strings.Contains(r.str("command"), "ofi_rxd,ofi_rxm") {
		t.Errorf("first row %v", r)
	}
	var out bytes.Buffer
	if err := plotScripts(dir, &out); err != nil {
		t.Fatal(err)
	}
	for _, id := range scriptFigureIDs() {
		p := filepath.Join(dir, id+".png")
		if !strings.Contains(out.String(), p+"\n") {
			t.Errorf("-plot did not name %s:\n%s", p, &out)
		}
		checkPNG(t, p)
		if _, err := os.Stat(filepath.Join(dir, id+".svg")); err != nil {
			t.Error(err)
		}
	}

	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "runs.csv"), []byte("figure,series,x,round,value,unit\nfig15,a,1,1,2,us\n"), 0o644)
	if err := plotScripts(empty, &out); err == nil || !strings.Contains(err.Error(), "no rows of") {
		t.Errorf("a runs.csv of no script's figure: %v", err)
	}
	if err := plotScripts(t.TempDir(), &out); err == nil {
		t.Error("no runs.csv: no error")
	}
}

// TestScriptFigureLabelsFit: each script figure's title fits the image's
// width and its y label the data's height, as TestAxisLabelsFit checks
// the run's figures.
func TestScriptFigureLabelsFit(t *testing.T) {
	dc := draw.New(vgimg.New(chartWidth, chartHeight))
	for _, f := range scriptFigures() {
		c := newChart(f.Title, f.XLabel, f.YLabel)
		if err := c.series(0, "s", plotter.XYs{{X: 64, Y: 10}, {X: 1024, Y: 100}}, nil); err != nil {
			t.Fatal(err)
		}
		if w := c.Title.TextStyle.Width(f.Title); w > chartWidth {
			t.Errorf("%s: title %q is %v wide, the image %v", f.ID, f.Title, w, chartWidth)
		}
		if w, h := c.Y.Label.TextStyle.Width(f.YLabel), c.drawAxes(dc).Size().Y; w > h {
			t.Errorf("%s: y label %q is %v long, the data %v high", f.ID, f.YLabel, w, h)
		}
	}
}
