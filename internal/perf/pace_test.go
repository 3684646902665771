package perf

import (
	"math"
	"testing"
	"time"
)

// TestThroughputSearch checks the RFC 2544 search against links of known
// capacity: one that drops above 10 Gb/s, and one that never drops but
// falls behind above it (a reliable mode), each found within the
// search's resolution; a mode that cannot be paced is refused before
// anything runs.
func TestThroughputSearch(t *testing.T) {
	const capacity = 10.0
	for _, tc := range []struct {
		name string
		run  func(c Config) (Result, error)
	}{
		{"drops above", func(c Config) (Result, error) {
			r := Result{Config: c, Sent: 1000, Received: 1000, Gbps: c.Rate}
			if c.Rate == 0 { // unpaced: what the receiver took, with losses
				r.Gbps, r.Received, r.Lost = 20, 500, 500
			} else if c.Rate > capacity {
				r.Gbps, r.Received, r.Lost = capacity, 900, 100
			}
			return r, nil
		}},
		{"falls behind above", func(c Config) (Result, error) {
			g := capacity
			if c.Rate > 0 {
				g = math.Min(c.Rate, capacity)
			}
			return Result{Config: c, Sent: 1000, Received: 1000, Gbps: g}, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			trials := 0
			run := func(c Config) (Result, error) { trials++; return tc.run(c) }
			cfg := Config{Mode: ModeUDSend, Test: TestBW, Size: 64000, Duration: time.Second}
			r, err := Throughput(cfg, run)
			if err != nil {
				t.Fatal(err)
			}
			probe, _ := tc.run(Config{})
			ceiling := 1.2 * probe.Gbps
			if step := ceiling / (1 << ThroughputSteps); r.Rate > capacity/0.97 || r.Rate < capacity-step || r.Gbps < 0.97*r.Rate {
				t.Fatalf("found %.3f Gb/s (goodput %.3f), want within %.3f of %.0f (a trial passes at 97 %% of its rate)", r.Rate, r.Gbps, step, capacity)
			}
			if trials != 1+ThroughputSteps {
				t.Fatalf("%d runs, want the probe and %d trials", trials, ThroughputSteps)
			}
		})
	}
	if _, err := Throughput(Config{Mode: ModeRCSend, Test: TestBW, Size: 1000}, func(Config) (Result, error) {
		t.Fatal("ran a search -rate cannot pace")
		return Result{}, nil
	}); err == nil {
		t.Fatal("rc-send's search was not refused")
	}
}
