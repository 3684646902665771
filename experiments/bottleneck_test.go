package main

import (
	"bytes"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBottleneckQuick runs the bottleneck experiment's reduced version
// (-quick: one round, 2-3 s flows, 10 peers) through a real tbf between
// namespaces and checks the harness: every measurement moved data through
// the bottleneck, the qdisc's counters were read and saw the packets, the
// TCP run (where iperf3 is installed) has both flows, and the plots and
// the table are made. It checks nothing of RD's speed: that is what the
// experiment measures, not what the harness must hold.
func TestBottleneckQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the bottleneck's quick run takes about 15 s")
	}
	if why := probeTbf(); why != "" {
		t.Skip("the bottleneck cannot be built here: " + why)
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	e := &env{root: root, work: t.TempDir(), log: &syncWriter{w: &log}, quick: true}
	f := bottleneckFig(t)
	rows, err := bottleneckFigure(e, f, options{quick: true, rounds: 3, bneckRate: 1000})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	_, iperfErr := exec.LookPath("iperf3")
	sums := map[string]row{}
	bins := map[string]int{}
	for _, r := range rows {
		if s := r.str("series"); strings.HasPrefix(s, "summary: ") {
			sums[r.str("test")] = r
		} else if r.num("x") > 0 {
			bins[s]++
		}
	}
	for _, test := range []string{"alone", "tcp", "two", "many"} {
		s, ok := sums[test]
		if !ok {
			t.Fatalf("no summary of %q", test)
		}
		if test == "tcp" && iperfErr != nil {
			if s.str("not_available") == "" {
				t.Errorf("tcp without iperf3: not marked not available: %v", s)
			}
			continue
		}
		// The counters were read, and the bottleneck saw the run's packets.
		if s.num("qdisc_packets_seen") < 100 || s.num("qdisc_bytes_sent") < 100*1400 {
			t.Errorf("%s: the qdisc saw %v packets, sent %v B: counters not read, or the flows did not cross it",
				test, s["qdisc_packets_seen"], s["qdisc_bytes_sent"])
		}
		if _, ok := s["qdisc_drop_pct"]; !ok {
			t.Errorf("%s: no drop percentage", test)
		}
	}
	if g := sums["alone"].num("goodput_gbps"); g <= 0 || g > 1.05 {
		t.Errorf("alone: goodput %v Gb/s: none, or more than the 1 Gbit/s bottleneck lets through", g)
	}
	if f1, f2 := sums["two"].num("flow1_gbps"), sums["two"].num("flow2_gbps"); f1 <= 0 || f2 <= 0 {
		t.Errorf("two flows: %v and %v Gb/s: a flow moved nothing", f1, f2)
	}
	if j := sums["two"].num("jain"); j < 0.5 || j > 1 || math.IsNaN(j) {
		t.Errorf("two flows: Jain's index %v outside [0.5, 1] (two flows)", j)
	}
	many := 0
	for _, r := range rows {
		if r.str("test") == "many" && strings.HasPrefix(r.str("series"), "many: peer ") {
			many++
			if r.num("completed_wrs") == 0 {
				t.Errorf("%s completed no Write: %v", r.str("series"), r)
			}
		}
	}
	if many != 10 || sums["many"].num("total_gbps") <= 0 {
		t.Errorf("many: %d peers' rows, total %v Gb/s", many, sums["many"]["total_gbps"])
	}
	if iperfErr == nil {
		if s := sums["tcp"]; s.num("rd_gbps") <= 0 || s.num("tcp_gbps") <= 0 {
			t.Errorf("beside TCP: RD %v, TCP %v Gb/s: a flow moved nothing", s["rd_gbps"], s["tcp_gbps"])
		}
		if bins["tcp: RD"] != 3 || bins["tcp: TCP (iperf3, "+sums["tcp"].str("tcp_congestion_control")+")"] != 3 {
			t.Errorf("beside TCP: want 3 one-second bins per flow, have %v", bins)
		}
	}
	if bins["alone: RD"] != 2 || bins["two: RD flow 1"] != 3 || bins["two: RD flow 2"] != 3 {
		t.Errorf("want a bin per second of each run: %v", bins)
	}
	dir := t.TempDir()
	made, err := bottleneckPlot(dir, f, rows)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"bottleneck-two", "bottleneck-alone"}
	if iperfErr == nil {
		names = append(names, "bottleneck-tcp")
	}
	for _, n := range names {
		checkPNG(t, filepath.Join(dir, n+".png"))
	}
	if len(made) != len(names) {
		t.Errorf("made %d plots, want %d", len(made), len(names))
	}
	var b bytes.Buffer
	bottleneckTable(&b, f, rows)
	if !strings.Contains(b.String(), "a. RD alone") || strings.Contains(b.String(), "not run") {
		t.Errorf("table:\n%s", b.String())
	}
}

func bottleneckFig(t *testing.T) *figure {
	for _, f := range figures(true) {
		if f.ID == "bottleneck" {
			return f
		}
	}
	t.Fatal("no bottleneck figure")
	return nil
}

// The counters' parsers: tc's JSON (iproute2 6.1's, a tbf with drops)
// and /proc/net/snmp; and Jain's index.
func TestBottleneckParsers(t *testing.T) {
	q, err := parseQdisc([]byte(`[{"kind":"tbf","handle":"8010:","root":true,"refcnt":3,"options":{"rate":125000000,"burst":62500,"lat":4476},` +
		`"bytes":1514000,"packets":1000,"drops":20,"overlimits":7,"requeues":0,"backlog":3028,"qlen":2}]`))
	if err != nil || q.Kind != "tbf" || q.Packets != 1000 || q.Drops != 20 || q.Bytes != 1514000 || q.Backlog != 3028 {
		t.Fatalf("parseQdisc: %+v, %v", q, err)
	}
	if _, err := parseQdisc([]byte(`[{"kind":"noqueue","root":false}]`)); err == nil {
		t.Fatal("parseQdisc: no root qdisc, no error")
	}
	snmp := "Ip: Forwarding DefaultTTL\nIp: 1 64\n" +
		"Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"Udp: 10 0 3 12 3 0 0 0 0\n" +
		"UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"UdpLite: 0 0 0 0 9 0 0 0 0\n"
	if v, err := snmpField([]byte(snmp), "Udp", "RcvbufErrors"); err != nil || v != 3 {
		t.Fatalf("snmpField: %v, %v", v, err)
	}
	for _, c := range []struct {
		x    []float64
		want float64
	}{{[]float64{1, 1}, 1}, {[]float64{1, 0}, 0.5}, {[]float64{3, 1}, 0.8}, {[]float64{0, 0}, 0}} {
		if got := jain(c.x); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("jain(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}
