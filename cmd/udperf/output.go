package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The output layer of the measuring commands (local, compare, client).
//
// A command opens a sink with newSink before its first run; it hands the
// sink each row as soon as the row is measured (compare: a size's rows
// once that size's rounds are done, since a ratio needs the baseline's
// median), and calls done once, at the end or after an interrupt:
//
//	out := newSink(stdout, f.format(), f.test, compare, doc)
//	for ... { if err := out.row(r); err != nil { ... } }
//	err := out.done(interrupted)
//
// The table and CSV print their header at once and each row when it is
// given, so what was measured is on the screen (or in the file) however
// the command ends; JSON is one document, written by done with the rows
// given so far. A sweep runs under interruptible, so that SIGINT ends it
// after the run in progress and the command still calls done (exit 130).

// sink receives a command's rows as they are measured.
type sink interface {
	// row prints (table, CSV) or keeps (JSON) one finished row.
	row(r row) error
	// done ends the output: JSON writes its document here, marked
	// "interrupted" when SIGINT ended the sweep. Call it once, also after
	// an interrupt or a failed run, so the output is complete and
	// well-formed.
	done(interrupted bool) error
}

// Output formats, from -json and -csv.
const (
	formatText = "text"
	formatCSV  = "csv"
	formatJSON = "json"
)

// newSink opens the output of a command whose rows are of test ("lat",
// "bw" or "rate"); compare adds the ratio and spread columns. doc is the
// JSON document's frame (command, flags, environment); its Results are
// the rows given.
func newSink(w io.Writer, format, test string, compare bool, doc document) sink {
	switch format {
	case formatJSON:
		doc.Results = []row{}
		return &jsonSink{w: w, doc: doc}
	case formatCSV:
		return &csvSink{w: csv.NewWriter(w), cols: tableColumns(test, compare)}
	}
	return &textSink{w: w, cols: tableColumns(test, compare), compare: compare}
}

// The table's and the CSV's header line goes out with the first row, so
// that a run refused before it measured anything (a busy server, a bad
// setting found late) prints its error alone.

// column is one column of the table and the CSV.
type column struct {
	text, csv string // header
	width     int    // the table's fixed width (perftest's are fixed too)
	left      bool   // aligned left (mode), else right
	get       func(row) (table, csv string)
}

// tableColumns are perftest's columns for test, with mode first (the
// table: compare only; CSV: always) and, for compare, the ratio to the
// first mode and the rounds' spread.
func tableColumns(test string, compare bool) []column {
	f2 := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	same := func(f func(row) string) func(row) (string, string) {
		return func(r row) (string, string) { s := f(r); return s, s }
	}
	col := func(name string, get func(row) string) column {
		return column{text: name, csv: name, width: max(len(name), 10), get: same(get)}
	}
	cols := []column{{text: "mode", csv: "mode", width: len("raw-udp-unconn"), left: true, get: same(func(r row) string { return r.Mode })}}
	if test == "lat" {
		cols = append(cols,
			col("bytes", func(r row) string { return strconv.Itoa(r.Bytes) }),
			col("iterations", func(r row) string { return strconv.Itoa(r.Iterations) }),
			col("t_min[usec]", func(r row) string { return f2(r.TMin) }),
			col("t_max[usec]", func(r row) string { return f2(r.TMax) }),
			col("t_typical[usec]", func(r row) string { return f2(r.TTypical) }),
			col("t_avg[usec]", func(r row) string { return f2(r.TAvg) }),
			col("t_stdev[usec]", func(r row) string { return f2(r.TStdev) }),
			col("99% percentile[usec]", func(r row) string { return f2(r.P99) }),
			col("99.9% percentile[usec]", func(r row) string { return f2(r.P999) }))
	} else {
		opt := func(v *uint64) string {
			if v == nil {
				return "-"
			}
			return strconv.FormatUint(*v, 10)
		}
		cols = append(cols,
			col("bytes", func(r row) string { return strconv.Itoa(r.Bytes) }),
			col("iterations", func(r row) string { return strconv.Itoa(r.Iterations) }),
			col("BW peak[Gb/sec]", func(r row) string { return f2(r.BWPeak) }),
			col("BW average[Gb/sec]", func(r row) string { return f2(r.BWAvg) }),
			col("MsgRate[Mpps]", func(r row) string { return strconv.FormatFloat(r.MsgRate, 'f', 4, 64) }),
			col("lost", func(r row) string { return opt(r.Lost) }),
			col("valid_bytes", func(r row) string { return opt(r.ValidBytes) }))
	}
	if compare {
		cols = append(cols,
			column{text: "ratio", csv: "ratio", width: 8, get: func(r row) (string, string) {
				if r.Ratio == nil {
					return "-", ""
				}
				return fmt.Sprintf("%.2fx", *r.Ratio), strconv.FormatFloat(*r.Ratio, 'f', 3, 64)
			}},
			column{text: "spread", csv: "spread_pct", width: 8, get: func(r row) (string, string) {
				if r.Spread == nil {
					return "-", ""
				}
				return fmt.Sprintf("%.1f%%", *r.Spread), strconv.FormatFloat(*r.Spread, 'f', 1, 64)
			}})
	} else {
		cols[0].width = 0 // the table of one mode has no mode column
	}
	return cols
}

// textSink is the table: fixed-width columns, a row per line as it comes.
type textSink struct {
	w       io.Writer
	cols    []column
	err     error
	headed  bool
	compare bool // a footer says what ratio and spread are
}

func (s *textSink) row(r row) error {
	if s.err != nil {
		return s.err
	}
	if !s.headed {
		s.headed = true
		if _, s.err = fmt.Fprintln(s.w, s.line(func(c column) string { return c.text })); s.err != nil {
			return s.err
		}
	}
	_, s.err = fmt.Fprintln(s.w, s.line(func(c column) string { t, _ := c.get(r); return t }))
	return s.err
}

// line lays out one line of the table: each column at its fixed width,
// two spaces apart.
func (s *textSink) line(cell func(column) string) string {
	var b strings.Builder
	for _, c := range s.cols {
		if c.width == 0 {
			continue // not in the table
		}
		if b.Len() > 0 {
			b.WriteString("  ")
		}
		if c.left {
			fmt.Fprintf(&b, "%-*s", c.width, cell(c))
		} else {
			fmt.Fprintf(&b, "%*s", c.width, cell(c))
		}
	}
	return b.String()
}

func (s *textSink) done(bool) error {
	if s.compare && s.headed && s.err == nil {
		_, s.err = fmt.Fprintln(s.w, "ratio: the median of the rounds' ratios to the first mode (each round's figure over the first mode's\n"+
			"in the same round), which can differ from the ratio of the medians above; spread: (max-min)/median of the\n"+
			"mode's rounds. Each round's figures and ratios: -json (round_figures, round_ratios).")
	}
	return s.err
}

// csvSink is CSV: the header, then a record per row, flushed as it comes.
type csvSink struct {
	w      *csv.Writer
	cols   []column
	err    error
	headed bool
}

func (s *csvSink) row(r row) error {
	if s.err != nil {
		return s.err
	}
	if !s.headed {
		s.headed = true
		hdr := make([]string, len(s.cols))
		for i, c := range s.cols {
			hdr[i] = c.csv
		}
		s.w.Write(hdr)
	}
	rec := make([]string, len(s.cols))
	for i, c := range s.cols {
		_, rec[i] = c.get(r)
	}
	s.w.Write(rec)
	s.w.Flush()
	s.err = s.w.Error()
	return s.err
}

func (s *csvSink) done(bool) error { return s.err }

// jsonSink keeps the rows and writes the document at the end.
type jsonSink struct {
	w   io.Writer
	doc document
}

func (s *jsonSink) row(r row) error {
	s.doc.Results = append(s.doc.Results, r)
	return nil
}

func (s *jsonSink) done(interrupted bool) error {
	s.doc.Interrupted = interrupted
	enc := json.NewEncoder(s.w)
	enc.SetIndent("", "  ")
	return enc.Encode(s.doc)
}

// bar is the progress of a sweep of at least 3 runs on stderr: a bar
// when stderr is a terminal, else (a file or a pipe: a log) a line per
// run done, so that a sweep whose rows wait for its end (-json) is never
// silent; nothing when stderr is not a file (a caller's buffer). Rows go
// to stdout, which may be the same terminal: the command clears the bar
// before it prints a row and draws it again after (clear and draw are
// no-ops when no bar is drawn).
type bar struct {
	w           io.Writer
	on, lines   bool
	done, total int
	started     time.Time
}

func newBar(stderr io.Writer, total int) *bar {
	_, file := stderr.(*os.File)
	term := isTerminal(stderr)
	return &bar{w: stderr, on: total >= 3 && term, lines: total >= 3 && file && !term, total: total, started: time.Now()}
}

// tick counts a run done and shows it: the bar redrawn, or a line.
func (b *bar) tick() {
	b.done++
	if b.lines {
		fmt.Fprintf(b.w, "udperf: %d of %d runs done, %s\n", b.done, b.total, time.Since(b.started).Round(time.Second))
	}
	b.draw()
}

// draw draws the bar at its count of runs done.
func (b *bar) draw() {
	if !b.on {
		return
	}
	const width = 30
	n := b.done * width / b.total
	fmt.Fprintf(b.w, "\r[%s%s] %d/%d", strings.Repeat("#", n), strings.Repeat(".", width-n), b.done, b.total)
}

// clear erases the bar's line, before a row or a message is printed.
func (b *bar) clear() {
	if b.on {
		fmt.Fprint(b.w, "\r\033[K")
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// printer serialises a command's rows and the bar: it clears the bar,
// hands the row to the sink and draws the bar again.
type printer struct {
	out sink
	bar *bar
}

func (p *printer) row(r row) error {
	p.bar.clear()
	err := p.out.row(r)
	p.bar.draw()
	return err
}

// exitInterrupted is the exit code of a sweep ended by SIGINT (128 + 2,
// as a shell reports a process killed by it).
const exitInterrupted = 130

// interruptible returns a context that ends at the first SIGINT, for a
// sweep to stop after its run in progress, and the function that releases
// the signal (call it before returning). After the first SIGINT the
// default action is back: a second one ends the process at once (the rows
// printed so far stay printed; a JSON document is lost). stderr is told.
func interruptible(cmd string, stderr io.Writer) (context.Context, func()) {
	ctx, stopSignal := signal.NotifyContext(context.Background(), os.Interrupt)
	var mu sync.Mutex
	released := false
	stopAfter := context.AfterFunc(ctx, func() {
		stopSignal() // a second SIGINT kills
		mu.Lock()
		defer mu.Unlock()
		if !released {
			if isTerminal(stderr) {
				fmt.Fprint(stderr, "\r\033[K") // the bar's line
			}
			fmt.Fprintf(stderr, "udperf %s: interrupted: stopping after the run in progress (interrupt again to abandon it)\n", cmd)
		}
	})
	return ctx, func() {
		mu.Lock()
		released = true
		mu.Unlock()
		stopAfter()
		stopSignal()
	}
}
