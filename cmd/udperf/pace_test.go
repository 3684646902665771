package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/udiwarp/udiwarp/internal/perf"
)

// TestCompareOwnSizesPaced runs compare with each mode at its own size
// and one offered rate (the issue-16 comparison of Write-Record 512 KiB
// against UD Send 64000 B, paced identically): each row carries its own
// size and the rate, and no paced sender offered more than the rate (a
// pacer that did not hold would let a 1 Gb/s run carry what loopback
// carries unpaced, ten times more).
func TestCompareOwnSizesPaced(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"compare", "-modes", "raw-udp@64000,ud-send@64000,ud-wr@262144", "-test", "bw", "-D", "0.3", "-rate", "1", "-rounds", "1", "-poll", "event", "-json"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct {
		Results []struct {
			Mode  string  `json:"mode"`
			Bytes int     `json:"bytes"`
			Rate  float64 `json:"rate_gbps"`
			BW    float64 `json:"bw_avg_gbps"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"raw-udp": 64000, "ud-send": 64000, "ud-wr": 262144}
	if len(doc.Results) != 3 {
		t.Fatalf("%d rows: %s", len(doc.Results), out.String())
	}
	for _, r := range doc.Results {
		if r.Bytes != want[r.Mode] || r.Rate != 1 {
			t.Errorf("row %+v: want %d bytes at 1 Gb/s", r, want[r.Mode])
		}
		if r.BW > 1.5 {
			t.Errorf("%s carried %.2f Gb/s paced at 1", r.Mode, r.BW)
		}
	}
}

// TestCompareRatioPerRound: compare's ratio is the median of the rounds'
// ratios, each to the baseline's figure in the same round, not the ratio
// of two medians, which a machine whose speed drifts between rounds makes
// meaningless: here the baseline's third round ran slow and the mode's
// fast (the ratio of medians would say 2.5x; every round but that one
// says 0.9x).
func TestCompareRatioPerRound(t *testing.T) {
	old := measure
	defer func() { measure = old }()
	figures := map[perf.Mode][]float64{perf.ModeRawUDP: {10, 40, 12}, perf.ModeUDSend: {9, 36, 30}}
	calls := map[perf.Mode]int{}
	measure = func(c perf.Config) (perf.Result, error) {
		g := figures[c.Mode][calls[c.Mode]]
		calls[c.Mode]++
		return perf.Result{Config: c, Gbps: g, Received: 100, Sent: 100}, nil
	}
	var out, errb bytes.Buffer
	if code := run([]string{"compare", "-modes", "raw-udp,ud-send", "-test", "bw", "-s", "64000", "-rounds", "3", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct {
		Results []struct {
			Mode  string  `json:"mode"`
			BW    float64 `json:"bw_avg_gbps"`
			Ratio float64 `json:"ratio"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 2 || doc.Results[1].Ratio < 0.899 || doc.Results[1].Ratio > 0.901 || doc.Results[1].BW != 30 {
		t.Fatalf("%+v: want ud-send's median 30 Gb/s at 0.9x (the median of its rounds' ratios)", doc.Results)
	}
}

// TestThroughputRuns searches ud-send's and ud-wr's throughput over
// loopback under a 2 Gb/s ceiling: each row is the fastest trial that
// lost nothing, so its rate is at most the ceiling, and a row with a
// figure lost nothing. (What rate passes depends on the machine; that
// the search finds a rate a trial passed at is TestThroughputSearch's.)
func TestThroughputRuns(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"compare", "-modes", "ud-send@64000,ud-wr@262144", "-test", "throughput", "-rate", "2", "-D", "0.2", "-rounds", "1", "-poll", "event", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct {
		Results []struct {
			Mode string  `json:"mode"`
			Rate float64 `json:"rate_gbps"`
			BW   float64 `json:"bw_avg_gbps"`
			Lost uint64  `json:"lost"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 2 {
		t.Fatalf("%s", out.String())
	}
	for _, r := range doc.Results {
		t.Logf("%s: %.2f Gb/s lossless (offered %.2f)", r.Mode, r.BW, r.Rate)
		if r.Rate > 2 || (r.BW > 0 && r.Lost != 0) {
			t.Errorf("%+v: want a lossless rate under the 2 Gb/s ceiling", r)
		}
	}
	var errb2 bytes.Buffer
	if code := run([]string{"local", "-mode", "rc-send", "-test", "throughput"}, &out, &errb2); code != 2 || !strings.Contains(errb2.String(), "-test throughput: -rate: paces datagram bandwidth runs") {
		t.Errorf("rc-send's search: exit %d, %q", code, errb2.String())
	}
}
