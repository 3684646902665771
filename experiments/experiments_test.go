package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQuick runs `go run ./experiments -quick` (in process), then
// -replot on what it wrote, and checks the files: runs.csv parses and has rows for every figure, runs.json
// is the same rows, every plot is a PNG that decodes and is not blank
// and an SVG, and report.md shows every plot. Kernel loss needs root and
// nftables (netem where the kernel has it); without them the run takes
// the in-process impairment layer, as -loss auto does.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the quick experiments take about a minute")
	}
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-quick", "-out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	t.Log(stderr.String())
	// The plots and the report again, from the data alone.
	if code := run([]string{"-replot", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("-replot: exit %d\n%s", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(out, "meta.json")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(out, "runs.csv"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	b, err := os.ReadFile(filepath.Join(out, "runs.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rows); err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(rows)+1 {
		t.Fatalf("runs.csv has %d records, runs.json %d rows", len(recs)-1, len(rows))
	}
	perFig := map[string]int{}
	for _, r := range rows {
		perFig[r["figure"].(string)]++
		if r["command"] == "" || r["unit"] == "" {
			t.Fatalf("a row without its command or unit: %v", r)
		}
	}
	_, ffmpegErr := exec.LookPath("ffmpeg")
	_, sippErr := exec.LookPath("sipp")
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, fig := range figures(true) {
		if fig.ID == "fig19" && ffmpegErr != nil || fig.ID == "sipp" && sippErr != nil || fig.ID == "bottleneck" && probeTbf() != "" {
			continue
		}
		if perFig[fig.ID] < 3*len(fig.Series) && fig.External == nil {
			t.Errorf("%s: %d runs", fig.ID, perFig[fig.ID])
		}
		names := []string{fig.ID}
		if len(fig.Panels) > 0 {
			names = []string{fig.ID + "-small", fig.ID + "-medium", fig.ID + "-large"}
		}
		if fig.ID == "bottleneck" {
			names = []string{"bottleneck-two", "bottleneck-alone"}
			if _, err := exec.LookPath("iperf3"); err == nil {
				names = append(names, "bottleneck-tcp")
			}
		}
		for _, n := range names {
			checkPNG(t, filepath.Join(out, n+".png"))
			svg, err := os.ReadFile(filepath.Join(out, n+".svg"))
			if err != nil || !bytes.Contains(svg, []byte("<svg")) {
				t.Errorf("%s.svg: %v", n, err)
			}
			if !strings.Contains(string(report), "]("+n+".png)") {
				t.Errorf("report.md does not show %s.png", n)
			}
		}
	}
}

// checkPNG decodes a plot and wants more than background, axes and text:
// colored lines.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	colored := 0
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y += 2 {
		for x := bounds.Min.X; x < bounds.Max.X; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			if max(r, g, b)-min(r, g, b) > 0x3000 { // not a gray: a series' color
				colored++
			}
		}
	}
	if bounds.Dx() < 400 || colored < 50 {
		t.Errorf("%s: %v, %d colored pixels: an empty plot", path, bounds, colored)
	}
}

var _ image.Image

// TestQuickRunsOutOfTheTree: a quick run without -out writes where git
// ignores it, a full run beside the committed results, which git sees.
func TestQuickRunsOutOfTheTree(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: it is what says what the tree ignores")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("git", "-C", root, "rev-parse").Run(); err != nil {
		t.Skip("not in a git checkout: nothing to ignore files")
	}
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	quick, full := defaultOut(root, true, at, "h"), defaultOut(root, false, at, "h")
	ignored := func(dir string) bool {
		return exec.Command("git", "-C", root, "check-ignore", "-q", filepath.Join(dir, "report.md")).Run() == nil
	}
	if !ignored(quick) {
		t.Errorf("a quick run's %s is not ignored by git", quick)
	}
	if ignored(full) {
		t.Errorf("a full run's %s is ignored by git", full)
	}
}

// TestFig19SaysHowItRan: fig19's "why they may differ" matches the run:
// a quick run's stream is unpaced, and its text must not describe the
// full run's paced 500 ms.
func TestFig19SaysHowItRan(t *testing.T) {
	for _, quick := range []bool{false, true} {
		for _, f := range figures(quick) {
			if f.ID != "fig19" {
				continue
			}
			if unpaced := strings.Contains(f.Differs, "unpaced"); unpaced != quick {
				t.Errorf("quick %v: %q", quick, f.Differs)
			}
		}
	}
}
