package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// A chart is a gonum plot drawn the way every figure of a run is: its
// legend in a strip under the axes, where it can cover no data (a legend
// inside the axes sat on the lines of one figure or another, whatever
// corner it was given), the x axis ticked and labelled at the x values
// measured, its range padded so that the outermost points and their
// labels stay inside the image, and plain numbers on the y axis.
type chart struct {
	*plot.Plot
	entries []legendEntry
	xs      []float64 // every x value drawn
	top     float64   // the largest y of a line's points (a median)
}

type legendEntry struct {
	label  string
	thumbs []plot.Thumbnailer
}

// Chart image size: the axes' part; the legend's strip is added under it.
const (
	chartWidth  = 8 * vg.Inch
	chartHeight = 5 * vg.Inch
)

func newChart(title, xLabel, yLabel string) *chart {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	p.X.Tick.Marker, p.Y.Tick.Marker = plainTicks{}, plainTicks{}
	p.Add(plotter.NewGrid())
	return &chart{Plot: p}
}

// legend adds an entry to the legend.
func (c *chart) legend(label string, thumbs ...plot.Thumbnailer) {
	c.entries = append(c.entries, legendEntry{label, thumbs})
}

// series draws series k: a line through xys in the k-th colour and marks,
// errs as error bars (nil: none), and its legend entry.
func (c *chart) series(k int, label string, xys plotter.XYs, errs plotter.YErrors) error {
	line, marks, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	col := seriesColor(k)
	line.Color, marks.Color = col, col
	marks.Shape = plotutil.Shape(k)
	c.Add(line, marks)
	if errs != nil {
		bars, err := plotter.NewYErrorBars(struct {
			plotter.XYs
			plotter.YErrors
		}{xys, errs})
		if err != nil {
			return err
		}
		bars.Color = withAlpha(col)
		c.Add(bars)
	}
	c.legend(label, line, marks)
	for _, p := range xys {
		c.top = max(c.top, p.Y)
		if !slices.Contains(c.xs, p.X) {
			c.xs = append(c.xs, p.X)
		}
	}
	return nil
}

// seriesColor is series k's colour: gonum's seven soft colours, then its
// seven dark ones, so that up to fourteen lines differ in colour and not
// only in their marks (fi-pingpong draws nine).
func seriesColor(k int) color.Color {
	n := len(plotutil.SoftColors)
	if (k/n)%2 == 1 {
		return plotutil.DarkColors[k%n]
	}
	return plotutil.SoftColors[k%n]
}

// tickAtData ticks the x axis at the x values drawn, labelled by label,
// on a log scale when log is set, and pads its range: a twentieth of the
// span each side (on a log scale, of the decades), or a fixed margin
// around a single value, so that no point sits on the frame and no
// label is cut at the image's edge.
func (c *chart) tickAtData(log bool, label func(float64) string) {
	xs := slices.Clone(c.xs)
	slices.Sort(xs)
	if len(xs) == 0 {
		return
	}
	lo, hi := xs[0], xs[len(xs)-1]
	if log {
		c.X.Scale = plot.LogScale{}
		f := math.Pow(hi/lo, 0.05)
		if hi == lo {
			f = 2
		}
		c.X.Min, c.X.Max = lo/f, hi*f
	} else {
		d := (hi - lo) / 20
		if hi == lo {
			d = math.Max(math.Abs(lo)/2, 1)
		}
		c.X.Min, c.X.Max = lo-d, hi+d
	}
	c.X.Tick.Marker = dataTicks{xs: xs, label: label, log: log}
}

// headroom raises the y axis's top a little above the data (a log
// axis's by a fifth), so that no point or error bar touches the frame;
// a linear axis stops at three times the largest median: one round of a
// loaded host far above the others (an error bar to 2,900 µs over
// latencies of 6) would flatten every line to the floor. Its bar runs
// off the top without a cap.
func (c *chart) headroom() {
	if _, log := c.Y.Scale.(plot.LogScale); log {
		c.Y.Max *= 1.2
		return
	}
	c.Y.Max += (c.Y.Max - c.Y.Min) * 0.05
	if c.top > 0 && c.Y.Max > 3*c.top {
		c.Y.Max = 3 * c.top
	}
}

// save writes the chart as name.png and name.svg in dir.
func (c *chart) save(dir, name string) error {
	cols, strip := c.legendLayout()
	for _, ext := range []string{"png", "svg"} {
		cv, err := draw.NewFormattedCanvas(chartWidth, chartHeight+strip, ext)
		if err != nil {
			return err
		}
		dc := draw.New(cv)
		c.drawAxes(draw.Crop(dc, 0, 0, strip, 0))
		x := dc.Min.X + legendMargin
		for _, l := range cols {
			col := draw.Crop(dc, 0, 0, 0, 0)
			col.Min.X, col.Max.Y = x, dc.Min.Y+strip-legendGap
			l.Draw(col)
			x += l.Rectangle(col).Size().X + legendGap
		}
		f, err := os.Create(filepath.Join(dir, name+"."+ext))
		if err != nil {
			return err
		}
		if _, err := cv.WriteTo(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// drawAxes draws the plot into area, and returns the canvas its data
// went into. The y axis's label is drawn here, centred on the data:
// gonum centres it on the mean of the axis's range, which on a log scale
// is near the top, and then shrinks the axes to make room for it above
// them (fig-memory's data took two thirds of its image).
func (c *chart) drawAxes(area draw.Canvas) (data draw.Canvas) {
	label := c.Y.Label.Text
	if label == "" {
		c.Draw(area)
		return c.DataCanvas(area)
	}
	sty := c.Y.Label.TextStyle
	room := sty.Height(label) + c.Y.Label.Padding
	c.Y.Label.Text = ""
	defer func() { c.Y.Label.Text = label }()
	axes := draw.Crop(area, room, 0, 0, 0)
	c.Draw(axes)
	data = c.DataCanvas(axes)
	rot := sty
	rot.Rotation += math.Pi / 2
	area.FillText(rot, vg.Point{X: area.Min.X + sty.Height(label) - sty.FontExtents().Descent, Y: data.Center().Y}, label)
	return data
}

const (
	legendMargin = vg.Length(28) // from the image's left edge
	legendGap    = vg.Length(18) // between columns, and above the strip
)

// legendLayout splits the legend into as many columns as fit the
// image's width side by side (the fewest rows), and returns them with the
// height of the strip they need.
func (c *chart) legendLayout() ([]*plot.Legend, vg.Length) {
	n := len(c.entries)
	if n == 0 {
		return nil, 0
	}
	dc := draw.Canvas{Rectangle: vg.Rectangle{Max: vg.Point{X: chartWidth, Y: chartHeight}}}
	var best []*plot.Legend
	for k := 1; k <= n; k++ {
		rows := (n + k - 1) / k
		var cols []*plot.Legend
		width := legendMargin
		for i := 0; i < n; i += rows {
			l := plot.NewLegend()
			l.Top, l.Left, l.Padding = true, true, vg.Points(3)
			for _, e := range c.entries[i:min(i+rows, n)] {
				l.Add(e.label, e.thumbs...)
			}
			cols = append(cols, &l)
			width += l.Rectangle(dc).Size().X + legendGap
		}
		if best != nil && width > chartWidth {
			break
		}
		best = cols
	}
	h := vg.Length(0)
	for _, l := range best {
		h = max(h, l.Rectangle(dc).Size().Y)
	}
	return best, h + 2*legendGap
}

// dataTicks marks the x values measured, with labels where they do not
// run into the one before (an axis of 0, 0.1 and 0.5 % keeps its mark at
// 0.1, unlabelled).
type dataTicks struct {
	xs    []float64
	label func(float64) string
	log   bool
}

func (t dataTicks) Ticks(lo, hi float64) []plot.Tick {
	// Where a label sits along the axis, as a fraction of it, and how
	// much of the axis a label of n characters takes (about 6.5 inches
	// of axis, characters of about 0.09 inch).
	pos := func(x float64) float64 {
		if t.log {
			return math.Log(x/lo) / math.Log(hi/lo)
		}
		return (x - lo) / (hi - lo)
	}
	width := func(s string) float64 { return (float64(len(s))*0.09 + 0.12) / 6.5 }
	var out []plot.Tick
	end := math.Inf(-1) // where the last label ends
	for _, x := range t.xs {
		if x < lo || x > hi {
			continue
		}
		l := t.label(x)
		p, w := pos(x), width(l)
		if p-w/2 < end {
			l = "" // a mark without its label: it would overlap the last
		} else {
			end = p + w/2
		}
		out = append(out, plot.Tick{Value: x, Label: l})
	}
	return out
}

// plainTicks mark a linear axis at 4 to 9 round values (a step of 1,
// 2 or 5 times a power of ten), labelled without trailing zeros (12.5,
// not 12.50), with a minor mark between each two: gonum's default
// labels 2 or 3 values, which left 0 and 25 on an axis of goodput.
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: number(lo)}}
	}
	p := math.Pow(10, math.Floor(math.Log10((hi-lo)/5)))
	step := p
	for _, m := range []float64{1, 2, 5, 10} {
		if step = m * p; (hi-lo)/step <= 8 {
			break
		}
	}
	var out []plot.Tick
	for k := math.Ceil(lo / step * 2); k/2*step <= hi*(1+1e-12); k++ {
		v := k / 2 * step
		if int64(k)%2 == 0 {
			out = append(out, plot.Tick{Value: v, Label: number(v)})
		} else {
			out = append(out, plot.Tick{Value: v})
		}
	}
	return out
}

// logTicks mark a log axis at 1, 2 and 5 times each power of ten
// (labelled), and the other digits (not): gonum's log ticks label only
// the powers of ten, one or two on an axis of two decades.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for d := 1.0; d <= 9; d++ {
			v := d * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if d == 1 || d == 2 || d == 5 {
				t.Label = number(v)
			}
			out = append(out, t)
		}
	}
	return out
}

// number prints v plainly: digits grouped by thousands, no trailing
// zeros, no float noise.
func number(v float64) string {
	v = math.Round(v*1e9) / 1e9
	s := strconv.FormatFloat(math.Abs(v), 'f', -1, 64)
	whole, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, d := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	return b.String()
}

// bytesLabel prints a message size as the figures' x axes mark it: in
// KiB or MiB where it is a whole number of them (64K, 1M), in bytes
// otherwise (64, 1,400).
func bytesLabel(v float64) string {
	n := int64(v)
	switch {
	case float64(n) != v || n < 1024:
		return number(v)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return number(v)
}
