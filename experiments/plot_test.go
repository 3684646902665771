package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Memory per peer is drawn on a log scale: a round that measured no
// bytes, or fewer than none (UD keeps no state per peer, and a process
// may give pages back), is left out of the plot rather than breaking it
// (gonum panics on a value at or below zero on a log axis, which ended a
// full run after every figure was measured).
func TestPlotMemoryNotPositive(t *testing.T) {
	var f *figure
	for _, x := range figures(true) {
		if x.ID == "fig-memory" {
			f = x
		}
	}
	if f == nil {
		t.Fatal("no fig-memory")
	}
	f.Series = []series{{Label: "UD, idle"}, {Label: "RD, idle"}} // the experiment names them as it runs
	var rows []row
	for r, v := range []float64{-61, 0, 12} { // UD idle at 1,000: noise around zero
		rows = append(rows, row{"figure": f.ID, "series": f.Series[0].Label, "x": 1000.0, "round": r + 1, "value": v})
	}
	for r, v := range []float64{1500, 1600, 1700} {
		rows = append(rows, row{"figure": f.ID, "series": f.Series[1].Label, "x": 1000.0, "round": r + 1, "value": v})
		rows = append(rows, row{"figure": f.ID, "series": f.Series[1].Label, "x": 10000.0, "round": r + 1, "value": v - 100})
	}
	dir := t.TempDir()
	if _, err := plotFigure(dir, f, rows); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, filepath.Join(dir, f.ID+".png"))
}

// TestAxisLabelsFit: each figure's y label fits the height of its data,
// beside which it is drawn, and its title the image's width; and the
// data of a log-scaled chart gets the height of a linear one (gonum's
// own y label, centred on the mean of a log axis's range, made it shrink
// fig-memory's axes to a third of its image).
func TestAxisLabelsFit(t *testing.T) {
	dc := draw.New(vgimg.New(chartWidth, chartHeight))
	data := func(title, x, y string, log bool) vg.Length {
		c := newChart(title, x, y)
		if err := c.series(0, "s", plotter.XYs{{X: 300, Y: 200}, {X: 1000, Y: 27000}}, nil); err != nil {
			t.Fatal(err)
		}
		if log {
			c.Y.Scale = plot.LogScale{}
		}
		return c.drawAxes(dc).Size().Y
	}
	for _, quick := range []bool{true, false} {
		for _, f := range figures(quick) {
			c := newChart(f.Title, f.XLabel, f.YLabel)
			if w := c.Y.Label.TextStyle.Width(f.YLabel); w > data(f.Title, f.XLabel, f.YLabel, false) {
				t.Errorf("%s: y label %q is %v long, longer than the data's height", f.ID, f.YLabel, w)
			}
			if w := c.Title.TextStyle.Width(f.Title); w > chartWidth {
				t.Errorf("%s: title %q is %v wide, the image %v", f.ID, f.Title, w, chartWidth)
			}
			if lin, log := data(f.Title, f.XLabel, f.YLabel, false), data(f.Title, f.XLabel, f.YLabel, true); log < lin {
				t.Errorf("%s: on a log scale the data is %v high, on a linear one %v", f.ID, log, lin)
			}
		}
	}
}

// TestPlainTicks: a linear axis gets 4 to 9 labelled round values
// inside its range, labelled plainly.
func TestPlainTicks(t *testing.T) {
	for _, r := range [][2]float64{{0, 31}, {0, 4.2}, {0, 1}, {0, 0.07}, {0, 52}, {0, 1400}, {193, 27000}, {0, 100000}} {
		var labels []string
		for _, tk := range (plainTicks{}).Ticks(r[0], r[1]) {
			if tk.Value < r[0] || tk.Value > r[1] {
				t.Errorf("%v: a tick at %v", r, tk.Value)
			}
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if len(labels) < 4 || len(labels) > 9 {
			t.Errorf("%v: labels %q", r, labels)
		}
		t.Logf("%v: %q", r, labels)
	}
	for v, want := range map[float64]string{0: "0", 12.5: "12.5", 0.30000000000000004: "0.3", 100000: "100,000", -1500: "-1,500"} {
		if got := number(v); got != want {
			t.Errorf("number(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{64: "64", 1400: "1,400", 1024: "1K", 65536: "64K", 65000: "65,000", 8 << 20: "8M"} {
		if got := bytesLabel(v); got != want {
			t.Errorf("bytesLabel(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestTicksAtTheData: the x axis is marked at every x measured and
// labelled there unless a label would run into the one before (0, 0.1
// and 0.5 % of loss: 0.1 keeps its mark, unlabelled); a single x (a
// quick run's panel once had one) gets its label too, inside the range;
// and a quick run's fig15 panels each hold two sizes.
func TestTicksAtTheData(t *testing.T) {
	c := newChart("t", "packet loss (%)", "goodput (Gb/s)")
	if err := c.series(0, "s", plotter.XYs{{X: 0, Y: 1}, {X: 0.1, Y: 1}, {X: 0.5, Y: 1}, {X: 1, Y: 1}, {X: 2, Y: 1}, {X: 5, Y: 1}}, nil); err != nil {
		t.Fatal(err)
	}
	c.tickAtData(false, number)
	var got []string
	for _, tk := range c.X.Tick.Marker.Ticks(c.X.Min, c.X.Max) {
		got = append(got, tk.Label)
	}
	if want := []string{"0", "", "0.5", "1", "2", "5"}; !slices.Equal(got, want) {
		t.Errorf("loss ticks %q, want %q", got, want)
	}
	one := newChart("t", "message size (bytes)", "µs")
	if err := one.series(0, "s", plotter.XYs{{X: 64, Y: 6}}, nil); err != nil {
		t.Fatal(err)
	}
	one.tickAtData(true, bytesLabel)
	if ts := one.X.Tick.Marker.Ticks(one.X.Min, one.X.Max); len(ts) != 1 || ts[0].Label != "64" || one.X.Min >= 64 || one.X.Max <= 64 {
		t.Errorf("one size: ticks %v, range %v..%v", ts, one.X.Min, one.X.Max)
	}
	for _, f := range figures(true) {
		for _, pn := range f.Panels {
			n := 0
			for _, x := range f.X {
				if x >= pn[0] && x < pn[1] {
					n++
				}
			}
			if n < 2 {
				t.Errorf("%s: a quick run's panel %v holds %d sizes", f.ID, pn, n)
			}
		}
	}
}

// TestMemoryLine: the experiments log says what a memory run measured in
// the figure's terms, not a Go map of its benchmark's metrics (negative
// slab bytes and a heap above the total read as wrong).
func TestMemoryLine(t *testing.T) {
	got := memoryLine(map[string]float64{"B/idle-peer": 5733.6, "B/active-peer": 7194, "slab-B/idle-peer": -61, "heap-B/idle-peer": 9000})
	if want := "5,734 B per idle peer, 7,194 B per peer with an answer in flight (resident set + socket slab)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got := memoryLine(map[string]float64{"B/idle-peer": -175}); !strings.Contains(got, "-175 B per idle peer (below zero: ") {
		t.Errorf("a negative figure unexplained: %q", got)
	}
}

// TestHeadroomOutlier: one round far above the others does not flatten
// the lines: the axis stops at three times the largest median.
func TestHeadroomOutlier(t *testing.T) {
	c := newChart("t", "x", "µs")
	if err := c.series(0, "s", plotter.XYs{{X: 64, Y: 6}, {X: 1024, Y: 7}}, plotter.YErrors{{Low: 1, High: 2900}, {Low: 1, High: 1}}); err != nil {
		t.Fatal(err)
	}
	c.Y.Min = 0
	c.headroom()
	if c.Y.Max != 21 {
		t.Errorf("y up to %v, want 21", c.Y.Max)
	}
}
