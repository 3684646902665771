package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/qp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestScrape runs traffic through real devices and scrapes the collector.
func TestScrape(t *testing.T) {
	c := New()
	for _, cfg := range []perf.Config{
		{Mode: perf.ModeUDSend, Test: perf.TestLat, Poll: qp.PollEvent, Size: 64, Iters: 100, Warmup: 10},
		{Mode: perf.ModeUDWriteRecord, Test: perf.TestBW, Size: 100000, Segment: 10000, Duration: 50 * time.Millisecond, Loss: 0.05, Seed: 1, Partial: true, Deadline: 2 * time.Millisecond},
		{Mode: perf.ModeRDSend, Test: perf.TestBW, Size: 1000, Duration: 50 * time.Millisecond, Loss: 0.05, Seed: 2},
	} {
		cfg.OnDevice = c.Add
		if _, err := perf.Run(cfg); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	text := string(b)
	for _, want := range []string{
		`udiwarp_datagrams_total{direction="in"}`,
		`udiwarp_transferred_bytes_total{direction="out"}`,
		`udiwarp_dropped_total{reason="crc"}`,
		`udiwarp_retransmissions_total`,
		`udiwarp_completions_total{status="success"}`,
		`udiwarp_write_record_messages_total{outcome="partial"}`,
		`udiwarp_write_record_in_progress`,
		`udiwarp_validity_map_ranges`,
		`udiwarp_dropped_total{reason="over_budget"}`,
		`udiwarp_write_record_segments_dropped_total{reason="far_ahead"}`,
		`udiwarp_write_record_messages_total{outcome="displaced"}`,
		`udiwarp_replies_withheld_total`,
		`udiwarp_async_events_dropped_total{origin="remote"}`,
		`udiwarp_rd_window_probes_total`,
		`udiwarp_impaired_datagrams_total{direction="out"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s in the scrape", want)
		}
	}
	// Values, not just names: traffic flowed, RD retransmitted under loss,
	// Write-Record delivered partial messages.
	for _, zero := range []string{`udiwarp_datagrams_total{direction="in"} 0`, "udiwarp_retransmissions_total 0",
		`udiwarp_write_record_messages_total{outcome="partial"} 0`, `udiwarp_completions_total{status="success"} 0`,
		`udiwarp_impaired_datagrams_total{direction="out"} 0`} {
		if strings.Contains(text, zero+"\n") {
			t.Errorf("%s: the counter did not count", zero)
		}
	}
}

// TestClosedDevicesLetGo: a collector in a long-lived process (udperf
// server -metrics) lets go of the devices that closed, and their counts
// stay in the totals, scrape after scrape.
func TestClosedDevicesLetGo(t *testing.T) {
	c := New()
	open, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	c.Add(open)
	for seed := range uint64(3) {
		cfg := perf.Config{Mode: perf.ModeUDSend, Test: perf.TestLat, Poll: qp.PollEvent, Size: 64, Iters: 50, Warmup: 5, Seed: seed}
		cfg.OnDevice = c.Add
		if _, err := perf.Run(cfg); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	scrape := func() string {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, `udiwarp_datagrams_total{direction="in"}`) {
				return l
			}
		}
		t.Fatal("no udiwarp_datagrams_total in the scrape")
		return ""
	}
	first := scrape()
	if n := c.Devices(); n != 1 {
		t.Errorf("the collector holds %d devices after a scrape; want 1, the one still open", n)
	}
	// 3 runs of 55 round trips, two devices each: 330 datagrams in.
	if want := `udiwarp_datagrams_total{direction="in"} 330`; first != want {
		t.Errorf("scrape: %q, want %q", first, want)
	}
	if again := scrape(); again != first {
		t.Errorf("a second scrape with no traffic: %q after %q", again, first)
	}
}
