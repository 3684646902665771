package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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
		cfg.OnDevice = c.Adder("run")
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
		`udiwarp_datagrams_total{device="run",direction="in"}`,
		`udiwarp_transferred_bytes_total{device="run",direction="out"}`,
		`udiwarp_dropped_total{device="run",reason="crc"}`,
		`udiwarp_rd_retransmissions_total{device="run"}`,
		`udiwarp_completions_total{device="run",status="success"}`,
		`udiwarp_completions_total{device="run",status="remote_access_error"}`,
		`udiwarp_write_record_messages_total{device="run",outcome="partial"}`,
		`udiwarp_write_record_in_progress{device="run"}`,
		`udiwarp_validity_map_ranges{device="run"}`,
		`udiwarp_dropped_total{device="run",reason="rd_over_budget"}`,
		`udiwarp_write_record_segments_total{device="run",fate="far_ahead"}`,
		`udiwarp_write_record_messages_total{device="run",outcome="displaced"}`,
		`udiwarp_replies_withheld_total{device="run"}`,
		`udiwarp_async_events_dropped_total{device="run",origin="remote"}`,
		`udiwarp_rd_frames_sent_total{device="run",kind="window_probe"}`,
		`udiwarp_impaired_datagrams_total{device="run",direction="out"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s in the scrape", want)
		}
	}
	// Values, not just names: traffic flowed, RD retransmitted under loss,
	// Write-Record delivered partial messages.
	for _, zero := range []string{`udiwarp_datagrams_total{device="run",direction="in"} 0`, `udiwarp_rd_retransmissions_total{device="run"} 0`,
		`udiwarp_write_record_messages_total{device="run",outcome="partial"} 0`, `udiwarp_completions_total{device="run",status="success"} 0`,
		`udiwarp_impaired_datagrams_total{device="run",direction="out"} 0`} {
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
	c.Add("run", open)
	for seed := range uint64(3) {
		cfg := perf.Config{Mode: perf.ModeUDSend, Test: perf.TestLat, Poll: qp.PollEvent, Size: 64, Iters: 50, Warmup: 5, Seed: seed}
		cfg.OnDevice = c.Adder("run")
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
			if strings.HasPrefix(l, `udiwarp_datagrams_total{device="run",direction="in"}`) {
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
	if want := `udiwarp_datagrams_total{device="run",direction="in"} 330`; first != want {
		t.Errorf("scrape: %q, want %q", first, want)
	}
	if again := scrape(); again != first {
		t.Errorf("a second scrape with no traffic: %q after %q", again, first)
	}
}

// TestEveryCounter: every counter qp.Stats has is a series of its own,
// and no series reads two: each counter set to a value of its own shows
// up exactly once among the series' readings.
func TestEveryCounter(t *testing.T) {
	var st qp.Stats
	v := reflect.ValueOf(&st).Elem()
	want := map[uint64]string{}
	next := uint64(1000)
	set := func(f reflect.Value, name string) {
		c, ok := f.Addr().Interface().(*atomic.Uint64)
		if !ok {
			return
		}
		next += 1000
		c.Store(next)
		want[next] = name
	}
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		if !sf.IsExported() {
			continue
		}
		if f.Kind() == reflect.Array { // indexed by a type: each value that names one
			var labels []string
			var named func(int) bool
			switch sf.Name {
			case "Completions":
				labels = statusLabel[:]
				named = func(j int) bool { return qp.Status(j).String() != fmt.Sprintf("status %d", j) }
			case "Events":
				labels = eventLabel[:]
				named = func(j int) bool { return qp.AsyncEventType(j).String() != fmt.Sprintf("async event %d", j) }
			default:
				t.Errorf("qp.Stats.%s: an array the collector does not know", sf.Name)
				continue
			}
			for j := range f.Len() {
				switch {
				case j < len(labels) && labels[j] != "":
					set(f.Index(j), fmt.Sprintf("%s[%d]", sf.Name, j))
				case named(j):
					t.Errorf("qp.Stats.%s[%d] has no label", sf.Name, j)
				}
			}
			continue
		}
		set(f, sf.Name)
	}
	seen := map[uint64]int{}
	for _, s := range table {
		if !s.gauge {
			seen[s.get(&snapshot{st: &st})]++
		}
	}
	for val, name := range want {
		if seen[val] != 1 {
			t.Errorf("qp.Stats.%s is read by %d series, want 1", name, seen[val])
		}
	}
}

// TestLint: the metrics follow Prometheus' conventions (names, units,
// help, label values in snake_case).
func TestLint(t *testing.T) {
	c := New()
	d, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c.Add("dev0", d)
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	for _, s := range table {
		if s.value != strings.ToLower(s.value) || strings.ContainsAny(s.value, " -") {
			t.Errorf("%s: label value %q is not snake_case", s.fam.name, s.value)
		}
	}
}

// TestKnownRun: a UD Send ping-pong of 50 + 5 round trips between two
// devices, each under its own label, scraped with CollectAndCompare.
func TestKnownRun(t *testing.T) {
	c := New()
	n := 0
	cfg := perf.Config{Mode: perf.ModeUDSend, Test: perf.TestLat, Poll: qp.PollEvent, Size: 64, Iters: 50, Warmup: 5,
		OnDevice: func(d *qp.Device) { c.Add(fmt.Sprintf("end%d", n), d); n++ }}
	if _, err := perf.Run(cfg); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d devices reported", n)
	}
	want := `
# HELP udiwarp_datagrams_total UDP datagrams, by direction.
# TYPE udiwarp_datagrams_total counter
udiwarp_datagrams_total{device="end0",direction="in"} 55
udiwarp_datagrams_total{device="end0",direction="out"} 55
udiwarp_datagrams_total{device="end1",direction="in"} 55
udiwarp_datagrams_total{device="end1",direction="out"} 55
# HELP udiwarp_dropped_total Received datagrams dropped, by reason (qp.Stats).
# TYPE udiwarp_dropped_total counter
`
	for _, dev := range []string{"end0", "end1"} {
		for _, s := range table {
			if s.fam == &dropped {
				want += fmt.Sprintf("udiwarp_dropped_total{device=%q,reason=%q} 0\n", dev, s.value)
			}
		}
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "udiwarp_datagrams_total", "udiwarp_dropped_total"); err != nil {
		t.Fatal(err)
	}
}

// TestGauges: the gauges of qp.Device.Levels, scraped.
func TestGauges(t *testing.T) {
	d, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pd := d.AllocPD()
	mr, err := pd.RegisterMemory(make([]byte, 256), qp.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd.CreateSRQ(4, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := srq.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{mr.SGE(i*64, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	c := New()
	c.Add("d", d)
	want := `
# HELP udiwarp_srq_receives Receives posted to shared receive queues and not yet taken.
# TYPE udiwarp_srq_receives gauge
udiwarp_srq_receives{device="d"} 2
# HELP udiwarp_srq_capacity Receives the shared receive queues hold when full.
# TYPE udiwarp_srq_capacity gauge
udiwarp_srq_capacity{device="d"} 4
# HELP udiwarp_srq_held Receives the shared receive queues' QPs hold: taken by a message, not yet polled from a CQ.
# TYPE udiwarp_srq_held gauge
udiwarp_srq_held{device="d"} 0
# HELP udiwarp_rd_peers Peer states the RD QPs hold now.
# TYPE udiwarp_rd_peers gauge
udiwarp_rd_peers{device="d"} 0
# HELP udiwarp_rc_connections RC QPs with a live connection now.
# TYPE udiwarp_rc_connections gauge
udiwarp_rc_connections{device="d"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "udiwarp_srq_receives", "udiwarp_srq_capacity", "udiwarp_srq_held", "udiwarp_rd_peers", "udiwarp_rc_connections"); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(srq)
}

// TestDocumented: docs/udperf.md's table lists every family, so the
// documentation cannot fall behind the collector.
func TestDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/udperf.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if !strings.Contains(string(doc), "| `"+f.name+"` |") {
			t.Errorf("docs/udperf.md does not list %s", f.name)
		}
	}
}
