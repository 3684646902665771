package main

import (
	"bytes"
	"encoding/json"
	"testing"
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
