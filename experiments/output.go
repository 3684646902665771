package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
)

// lead are the first columns of runs.csv; every other key of any row
// follows, sorted.
var lead = []string{"figure", "series", "x", "round", "value", "unit", "loss_method", "loss_pct", "mode", "bytes", "command"}

// writeData writes runs.json (an array of rows) and runs.csv (a column
// per key any row has; empty where a row has none).
func writeData(dir string, rows []row) error {
	b, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "runs.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	keys := map[string]bool{}
	for _, r := range rows {
		for k := range r {
			keys[k] = true
		}
	}
	cols := slices.Clone(lead)
	var rest []string
	for k := range keys {
		if !slices.Contains(lead, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	cols = append(cols, rest...)
	f, err := os.Create(filepath.Join(dir, "runs.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write(cols)
	for _, r := range rows {
		rec := make([]string, len(cols))
		for i, c := range cols {
			rec[i] = cell(r[c])
		}
		w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func cell(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case int:
		return strconv.Itoa(v)
	case bool:
		return strconv.FormatBool(v)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// point is one series at one x: the median of its rounds and their
// min and max.
type point struct {
	x, median, min, max float64
	n                   int
}

// points summarises f's rows of one series, by x.
func points(rows []row, fig, s string) []point {
	by := map[float64][]float64{}
	for _, r := range rows {
		if r.str("figure") == fig && r.str("series") == s {
			by[r.num("x")] = append(by[r.num("x")], r.num("value"))
		}
	}
	var out []point
	for x, v := range by {
		sort.Float64s(v)
		m := v[len(v)/2]
		if len(v)%2 == 0 {
			m = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		out = append(out, point{x: x, median: m, min: v[0], max: v[len(v)-1], n: len(v)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].x < out[j].x })
	return out
}

// plotted is one image of a figure (a figure with panels has several).
type plotted struct {
	fig, name, title string
}

// plotFigure draws f (each panel) as PNG and SVG: a line per series
// through the medians, min–max error bars.
func plotFigure(dir string, f *figure, rows []row) ([]plotted, error) {
	panels := f.Panels
	if len(panels) == 0 {
		panels = [][2]float64{{math.Inf(-1), math.Inf(1)}}
	}
	var out []plotted
	for i, pn := range panels {
		title := f.Title
		name := f.ID
		if len(f.Panels) > 0 {
			part := []string{"small", "medium", "large"}[min(i, 2)]
			name += "-" + part
			title += " — " + part + " messages"
		}
		p := newChart(title, f.XLabel, f.YLabel)
		// Memory per peer is drawn on a log scale, where nothing at or
		// below zero has a place: a UD peer's bytes are within noise of
		// zero at 1,000 peers, and a round may measure less than none (the
		// process gave pages back). Such a median is left out of the plot
		// (the table has it); an error bar stops at half the smallest
		// positive value.
		logY := f.Test == "memory" || f.LogY
		floor := math.Inf(1)
		for _, r := range rows {
			if v := r.num("value"); r.str("figure") == f.ID && v > 0 {
				floor = min(floor, v/2)
			}
		}
		drawn := 0
		for k, s := range f.Series {
			var xys plotter.XYs
			var errs plotter.YErrors
			for _, pt := range points(rows, f.ID, s.Label) {
				if pt.x < pn[0] || pt.x >= pn[1] {
					continue
				}
				low := pt.median - pt.min
				if logY {
					if pt.median <= floor {
						continue
					}
					low = min(low, pt.median-floor)
				}
				xys = append(xys, plotter.XY{X: pt.x, Y: pt.median})
				errs = append(errs, struct{ Low, High float64 }{low, pt.max - pt.median})
			}
			if len(xys) == 0 {
				continue
			}
			if err := p.series(k, s.Label, xys, errs); err != nil {
				return nil, err
			}
			drawn++
		}
		if drawn == 0 {
			return nil, fmt.Errorf("panel %s has no data", name)
		}
		p.Y.Min = 0 // goodput and latency from zero: the eye reads ratios
		if logY {
			// Bytes per peer span two decades (UD's to RC's), and the
			// latencies of a LogY figure more: a log scale.
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = logTicks{}
			p.Y.Min = floor
		}
		p.headroom()
		// Sizes and counts of peers on a log scale, loss rates and bit
		// rates on a linear one; each ticked where it was measured.
		switch {
		case f.LossX || f.Test == "stream":
			p.tickAtData(false, number)
		case strings.Contains(f.XLabel, "bytes"):
			p.tickAtData(true, bytesLabel)
		default:
			p.tickAtData(true, number)
		}
		if err := p.save(dir, name); err != nil {
			return nil, err
		}
		out = append(out, plotted{fig: f.ID, name: name, title: title})
	}
	return out, nil
}

func withAlpha(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 160}
}
