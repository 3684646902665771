package main

import (
	"path/filepath"
	"testing"
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
