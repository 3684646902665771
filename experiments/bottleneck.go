package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// The bottleneck experiment (issue 31 §4): RD through a real rate limit,
// alone, beside TCP, beside another RD flow and as 100 peers at once.
//
// The path is three network namespaces in a line, each link a veth pair
// with MTU 1,500:
//
//	snd 10.78.1.2 — bn0 ══ bn1 — rtr 10.78.1.1 | 10.78.2.1 — bn2 ══ bn3 — rcv 10.78.2.2
//
// rtr forwards, and the bottleneck is a tbf qdisc on rtr's bn2, the
// egress towards rcv: rate R (default 1 Gbit/s), a bucket (burst) of
// 0.5 ms at R (62,500 B at 1 Gbit/s) and a queue limit of 5 ms at R
// (625,000 B). It sits on a router and not on the sender's own interface
// because a qdisc on the sending host pushes back on its sockets (TCP's
// small-queue limit holds TCP's packets in the socket; a UDP socket
// blocks once its send buffer is in the qdisc), so a sender there is
// throttled before the queue fills and never meets the drops a router's
// full queue deals out. Acknowledgements return through rtr unlimited.
//
// Senders run in snd, receivers in rcv: RD flows are experiments/rdflow
// (the qp package's public API: RDMA Writes of -size bytes, 16
// outstanding per flow as udperf's rd-write keeps, 1,400-byte segments,
// each flow its own device, socket and QP; goodput is what completed,
// which over RD is what the receiver acknowledged, counted in 1 s bins),
// TCP is iperf3 (the receiver's 1 s intervals, from --get-server-output).
// Before and after each run the harness reads the qdisc's counters (tc
// -s -j qdisc show) and rcv's UDP receive-buffer drops (/proc/net/snmp),
// so drops anywhere but the bottleneck show up too.

const (
	bnSndAddr = "10.78.1.2"
	bnRcvAddr = "10.78.2.2"
	bnIperf   = 5201
)

// bneckPlan is the four measurements' lengths and sizes.
type bneckPlan struct {
	rateMbit       int
	alone, tcp     time.Duration
	two, many      time.Duration
	peers, rounds  int
	jainFrom       time.Duration
	size, manySize int
}

func bneckPlanFor(o options) bneckPlan {
	p := bneckPlan{rateMbit: o.bneckRate, alone: 10 * time.Second, tcp: 20 * time.Second, two: 10 * time.Second,
		many: 10 * time.Second, peers: 100, rounds: o.rounds, jainFrom: 5 * time.Second, size: 512 << 10, manySize: 64 << 10}
	if p.rateMbit <= 0 {
		p.rateMbit = 1000
	}
	if o.quick {
		p.alone, p.tcp, p.two, p.many, p.peers, p.rounds = 2*time.Second, 3*time.Second, 3*time.Second, 2*time.Second, 10, 1
		p.jainFrom = time.Second
	}
	if o.bneckTCPTime > 0 {
		p.tcp = o.bneckTCPTime
	}
	return p
}

// probeTbf says why the bottleneck cannot be built here ("" when it
// can): it needs root, ip and tc, and a kernel with tbf, tried on a veth
// in a scratch namespace.
func probeTbf() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces, tc)"
	}
	for _, t := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(t); err != nil {
			return "needs " + t + " (iproute2)"
		}
	}
	ns := "udiwarp-bn-probe-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return "cannot make a network namespace: " + strings.TrimSpace(string(out))
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1").CombinedOutput(); err != nil {
		return "cannot make a veth pair: " + strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "tbf", "rate", "1gbit", "burst", "62500", "limit", "625000").CombinedOutput(); err != nil {
		return "this kernel or tc has no tbf: " + strings.TrimSpace(string(out))
	}
	return ""
}

// bneckNet is the three namespaces and the tbf.
type bneckNet struct {
	snd, rtr, rcv string
	rateBits      int64
	burst, limit  int
}

func newBneckNet(rateMbit int) (*bneckNet, error) {
	id := strconv.Itoa(os.Getpid())
	n := &bneckNet{snd: "udiwarp-bn-snd-" + id, rtr: "udiwarp-bn-rtr-" + id, rcv: "udiwarp-bn-rcv-" + id,
		rateBits: int64(rateMbit) * 1e6}
	bytesPerSec := n.rateBits / 8
	n.burst = int(max(3028, bytesPerSec/2000)) // 0.5 ms at the rate, at least two full frames
	n.limit = int(max(15140, bytesPerSec/200)) // 5 ms at the rate, at least ten full frames
	steps := [][]string{
		{"netns", "add", n.snd}, {"netns", "add", n.rtr}, {"netns", "add", n.rcv},
		{"-n", n.snd, "link", "set", "lo", "up"}, {"-n", n.rtr, "link", "set", "lo", "up"}, {"-n", n.rcv, "link", "set", "lo", "up"},
		{"-n", n.snd, "link", "add", "bn0", "mtu", "1500", "type", "veth", "peer", "name", "bn1", "mtu", "1500", "netns", n.rtr},
		{"-n", n.rtr, "link", "add", "bn2", "mtu", "1500", "type", "veth", "peer", "name", "bn3", "mtu", "1500", "netns", n.rcv},
		{"-n", n.snd, "addr", "add", bnSndAddr + "/24", "dev", "bn0"},
		{"-n", n.rtr, "addr", "add", "10.78.1.1/24", "dev", "bn1"},
		{"-n", n.rtr, "addr", "add", "10.78.2.1/24", "dev", "bn2"},
		{"-n", n.rcv, "addr", "add", bnRcvAddr + "/24", "dev", "bn3"},
		{"-n", n.snd, "link", "set", "bn0", "up"}, {"-n", n.rtr, "link", "set", "bn1", "up"},
		{"-n", n.rtr, "link", "set", "bn2", "up"}, {"-n", n.rcv, "link", "set", "bn3", "up"},
		{"-n", n.snd, "route", "add", "default", "via", "10.78.1.1"},
		{"-n", n.rcv, "route", "add", "default", "via", "10.78.2.1"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			n.close()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	if out, err := exec.Command("ip", "netns", "exec", n.rtr, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		n.close()
		return nil, fmt.Errorf("rtr: ip_forward: %v: %s", err, out)
	}
	tc := []string{"-n", n.rtr, "qdisc", "replace", "dev", "bn2", "root", "tbf", "rate", strconv.FormatInt(n.rateBits, 10) + "bit",
		"burst", strconv.Itoa(n.burst), "limit", strconv.Itoa(n.limit)}
	if out, err := exec.Command("tc", tc...).CombinedOutput(); err != nil {
		n.close()
		return nil, fmt.Errorf("tc %s: %v: %s", strings.Join(tc, " "), err, out)
	}
	return n, nil
}

func (n *bneckNet) close() {
	for _, ns := range []string{n.snd, n.rtr, n.rcv} {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

func (n *bneckNet) describe() string {
	return fmt.Sprintf("tbf rate %s burst %d B limit %d B (%.1f ms of queue) on the router's egress to the receiver; MTU 1500",
		rateText(n.rateBits), n.burst, n.limit, float64(n.limit)*8/float64(n.rateBits)*1000)
}

func rateText(bits int64) string {
	if bits%1e9 == 0 {
		return fmt.Sprintf("%d Gbit/s", bits/1e9)
	}
	return fmt.Sprintf("%d Mbit/s", bits/1e6)
}

// qdiscCounts are the bottleneck's counters (tc -s -j qdisc show).
type qdiscCounts struct {
	Kind    string `json:"kind"`
	Bytes   uint64 `json:"bytes"`
	Packets uint64 `json:"packets"`
	Drops   uint64 `json:"drops"`
	Over    uint64 `json:"overlimits"`
	Backlog uint64 `json:"backlog"`
}

func (n *bneckNet) qdisc() (qdiscCounts, error) {
	out, err := exec.Command("tc", "-n", n.rtr, "-s", "-j", "qdisc", "show", "dev", "bn2").Output()
	if err != nil {
		return qdiscCounts{}, fmt.Errorf("tc -s -j qdisc show: %w", err)
	}
	return parseQdisc(out)
}

// parseQdisc reads the root qdisc's counters from tc's JSON.
func parseQdisc(b []byte) (qdiscCounts, error) {
	var qs []struct {
		qdiscCounts
		Root bool `json:"root"`
	}
	if err := json.Unmarshal(b, &qs); err != nil {
		return qdiscCounts{}, fmt.Errorf("tc's JSON: %w: %.200s", err, b)
	}
	for _, q := range qs {
		if q.Root {
			return q.qdiscCounts, nil
		}
	}
	return qdiscCounts{}, fmt.Errorf("no root qdisc in %.200s", b)
}

// udpCounter is one of namespace ns's UDP counters (/proc/net/snmp,
// Udp: field), such as RcvbufErrors.
func udpCounter(ns, field string) (uint64, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").Output()
	if err != nil {
		return 0, err
	}
	return snmpField(out, "Udp", field)
}

func snmpField(b []byte, proto, field string) (uint64, error) {
	var head []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		if i := slices.Index(head, field); i > 0 && i < len(f) {
			return strconv.ParseUint(f[i], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/net/snmp: no %s %s", proto, field)
}

// bneckCounters are read before and after each run.
type bneckCounters struct {
	q      qdiscCounts
	rcvbuf uint64 // the receiver's UDP datagrams dropped for a full socket buffer
	sndbuf uint64 // the sender's UDP datagrams the kernel refused (ENOBUFS, a full send buffer)
}

func (n *bneckNet) counters() (bneckCounters, error) {
	q, err := n.qdisc()
	if err != nil {
		return bneckCounters{}, err
	}
	c := bneckCounters{q: q}
	if c.rcvbuf, err = udpCounter(n.rcv, "RcvbufErrors"); err != nil {
		return c, err
	}
	c.sndbuf, err = udpCounter(n.snd, "SndbufErrors")
	return c, err
}

// rdReport is rdflow send's output.
type rdReport struct {
	StartUnixNano int64   `json:"start_unix_ns"`
	BinSeconds    float64 `json:"bin_s"`
	Flows         []struct {
		Local       string   `json:"local"`
		Bins        []uint64 `json:"bins_bytes"`
		Bytes       uint64   `json:"bytes"`
		Posted      uint64   `json:"posted_wrs"`
		Completed   uint64   `json:"completed_wrs"`
		Failed      uint64   `json:"failed_wrs"`
		FirstError  string   `json:"first_error"`
		DataFrames  uint64   `json:"rd_data_frames"`
		Retransmits uint64   `json:"rd_retransmits"`
		// The sender's congestion-control states, in samples (rdflow
		// -sample).
		Modes map[string]int `json:"cc_modes"`
	} `json:"flows"`
}

// ccModes summarizes a flow's congestion-control states: the share of
// samples in "compete" (BBR competing with a loss-based flow), and every
// state with its count, in a stable order.
func ccModes(m map[string]int) (compete float64, all string) {
	n := 0
	var names []string
	for k, v := range m {
		n += v
		names = append(names, k)
	}
	if n == 0 {
		return 0, ""
	}
	slices.Sort(names)
	var b strings.Builder
	for _, k := range names {
		fmt.Fprintf(&b, "%s:%d ", k, m[k])
	}
	return float64(m["compete"]) / float64(n), strings.TrimSpace(b.String())
}

// rdSink runs rdflow sink in rcv; closing its stdin ends it.
type rdSink struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	offer struct {
		Addr string `json:"addr"`
		QPN  uint32 `json:"qpn"`
		STag uint32 `json:"stag"`
		TO   uint64 `json:"to"`
	}
}

func startSink(e *env, bin string, n *bneckNet, peers int) (*rdSink, error) {
	s := &rdSink{cmd: exec.Command("ip", "netns", "exec", n.rcv, bin, "sink", "-addr", bnRcvAddr+":0", "-peers", strconv.Itoa(peers))}
	s.cmd.Stderr = e.log
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	line := make(chan []byte, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- slices.Clone(sc.Bytes())
		}
		close(line)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case b, ok := <-line:
		if ok && json.Unmarshal(b, &s.offer) == nil && s.offer.Addr != "" {
			return s, nil
		}
		s.stop()
		return nil, fmt.Errorf("rdflow sink said %q", b)
	case <-time.After(10 * time.Second):
		s.stop()
		return nil, errors.New("rdflow sink did not start within 10 s")
	}
}

func (s *rdSink) stop() {
	s.stdin.Close()
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

// sendArgs is the rdflow send command towards s.
func (s *rdSink) sendArgs(bin string, n *bneckNet, flows, size int, d time.Duration, extra ...string) []string {
	args := []string{"ip", "netns", "exec", n.snd, bin, "send", "-to", s.offer.Addr, "-qpn", strconv.FormatUint(uint64(s.offer.QPN), 10),
		"-stag", strconv.FormatUint(uint64(s.offer.STag), 10), "-rto", strconv.FormatUint(s.offer.TO, 10), "-bind", bnSndAddr,
		"-flows", strconv.Itoa(flows), "-size", strconv.Itoa(size), "-segment", "1400", "-D", d.String(), "-bin", "1s"}
	return append(args, extra...)
}

// runCmd runs cmd to its end (bounded by limit) and returns its stdout.
func runCmd(cmd []string, limit time.Duration, log io.Writer) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	var stderr bytes.Buffer
	c.Stderr = io.MultiWriter(&stderr, log)
	out, err := c.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %v: %s", strings.Join(cmd, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// flowSeries is one flow's goodput per 1 s bin over the run, in Gb/s.
type flowSeries struct {
	label string
	gbps  []float64
	extra row
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// jain is Jain's fairness index of x: (Σx)² / (n Σx²), 1 when all equal.
func jain(x []float64) float64 {
	s, q := 0.0, 0.0
	for _, v := range x {
		s += v
		q += v * v
	}
	if q == 0 {
		return 0
	}
	return s * s / (float64(len(x)) * q)
}

// rdSeries turns rdflow's report into per-flow series over d's bins.
func rdSeries(rep rdReport, d time.Duration, label func(i int) string) []flowSeries {
	nb := int(d / time.Second)
	var out []flowSeries
	for i, f := range rep.Flows {
		s := flowSeries{label: label(i), extra: row{"local": f.Local, "posted_wrs": f.Posted, "completed_wrs": f.Completed,
			"failed_wrs": f.Failed, "first_error": f.FirstError, "rd_data_frames": f.DataFrames, "rd_retransmits": f.Retransmits,
			"bytes_incl_drain": f.Bytes}}
		for k := range nb {
			var b uint64
			if k < len(f.Bins) {
				b = f.Bins[k]
			}
			s.gbps = append(s.gbps, float64(b)*8/rep.BinSeconds/1e9)
		}
		out = append(out, s)
	}
	return out
}

// bottleneckFigure makes the four measurements, o.rounds rounds each
// (one in -quick), and returns a row per flow per second and a summary
// row per measurement and round.
func bottleneckFigure(e *env, f *figure, o options) ([]row, error) {
	if why := probeTbf(); why != "" {
		fmt.Fprintf(e.log, "experiments: %s: skipped: %s\n", f.ID, why)
		return nil, nil
	}
	p := bneckPlanFor(o)
	bin, err := e.rdflow()
	if err != nil {
		return nil, err
	}
	n, err := newBneckNet(p.rateMbit)
	if err != nil {
		return nil, err
	}
	defer n.close()
	fmt.Fprintf(e.log, "experiments: %s: %s\n", f.ID, n.describe())
	iperf, iperfErr := exec.LookPath("iperf3")
	cc := strings.TrimSpace(string(must(exec.Command("ip", "netns", "exec", n.snd, "sysctl", "-n", "net.ipv4.tcp_congestion_control").Output())))
	if o.bneckTCPCC != "" {
		cc = o.bneckTCPCC // iperf3 -C: the flow's own, whatever the host's default
	}
	var rows []row
	rate := float64(n.rateBits) / 1e9
	base := func(test string, r int) row {
		return row{"figure": f.ID, "test": test, "round": r + 1, "loss_method": "none", "loss_pct": 0.0,
			"bottleneck_gbps": rate, "tbf_burst_bytes": n.burst, "tbf_limit_bytes": n.limit, "segment": 1400}
	}
	// add records the series and a summary row for one run.
	add := func(test string, r int, series []flowSeries, before, after bneckCounters, cmd string, sum row) {
		for _, s := range series {
			for k, g := range s.gbps {
				b := base(test, r)
				b["series"], b["x"], b["value"], b["unit"], b["command"] = test+": "+s.label, float64(k+1), g, "Gb/s", cmd
				rows = append(rows, b)
			}
			m := base(test, r)
			m["series"], m["x"], m["value"], m["unit"], m["command"] = test+": "+s.label+" (mean)", 0.0, mean(s.gbps), "Gb/s", cmd
			for k, v := range s.extra {
				m[k] = v
			}
			rows = append(rows, m)
		}
		seen := (after.q.Packets - before.q.Packets) + (after.q.Drops - before.q.Drops)
		drops := after.q.Drops - before.q.Drops
		sum["series"], sum["x"], sum["command"] = "summary: "+test, 0.0, cmd
		sum["qdisc_packets_seen"], sum["qdisc_drops"], sum["qdisc_bytes_sent"] = seen, drops, after.q.Bytes-before.q.Bytes
		sum["qdisc_drop_pct"] = 0.0
		if seen > 0 {
			sum["qdisc_drop_pct"] = float64(drops) / float64(seen) * 100
		}
		sum["rcv_udp_rcvbuf_errors"] = after.rcvbuf - before.rcvbuf
		sum["snd_udp_sndbuf_errors"] = after.sndbuf - before.sndbuf
		// Other work on the host takes the same two cores: the load when
		// the run ended says how much.
		if b, err := os.ReadFile("/proc/loadavg"); err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				sum["loadavg_1m"], _ = strconv.ParseFloat(f[0], 64)
			}
		}
		for k, v := range base(test, r) {
			if _, ok := sum[k]; !ok {
				sum[k] = v
			}
		}
		rows = append(rows, sum)
		fmt.Fprintf(e.log, "experiments: %s: %s, round %d: %s\n", f.ID, test, r+1, summaryText(sum))
	}
	// rdRun runs rdflow with flows flows for d against a fresh sink.
	rdRun := func(flows, size int, d time.Duration, extra ...string) (rdReport, string, bneckCounters, bneckCounters, error) {
		var rep rdReport
		sink, err := startSink(e, bin, n, flows)
		if err != nil {
			return rep, "", bneckCounters{}, bneckCounters{}, err
		}
		defer sink.stop()
		cmd := sink.sendArgs(bin, n, flows, size, d, extra...)
		before, err := n.counters()
		if err != nil {
			return rep, "", before, before, err
		}
		out, err := runCmd(cmd, d+time.Minute, e.log)
		if err != nil {
			return rep, "", before, before, err
		}
		after, err := n.counters()
		if err != nil {
			return rep, "", before, after, err
		}
		if err := json.Unmarshal(out, &rep); err != nil || len(rep.Flows) != flows {
			return rep, "", before, after, fmt.Errorf("rdflow send: not %d flows (%v): %.300s", flows, err, out)
		}
		return rep, strings.Join(cmd[4:], " "), before, after, nil
	}
	for r := range p.rounds {
		// a. RD alone.
		{
			rep, cmd, before, after, err := rdRun(1, p.size, p.alone)
			if err != nil {
				return rows, fmt.Errorf("alone: %w", err)
			}
			s := rdSeries(rep, p.alone, func(int) string { return "RD" })
			g := mean(s[0].gbps)
			sum := base("alone", r)
			sum["value"], sum["unit"] = g, "Gb/s"
			sum["goodput_gbps"], sum["share_of_bottleneck"] = g, g/rate
			sum["rd_data_frames"], sum["rd_retransmits"] = rep.Flows[0].DataFrames, rep.Flows[0].Retransmits
			if d := after.q.Drops - before.q.Drops; rep.Flows[0].DataFrames > 0 {
				sum["drop_pct_of_rd_frames"] = float64(d) / float64(rep.Flows[0].DataFrames) * 100
			}
			sum["duration_s"] = p.alone.Seconds()
			add("alone", r, s, before, after, cmd, sum)
		}
		// b. RD beside an iperf3 TCP flow.
		if iperfErr != nil {
			if r == 0 {
				sum := base("tcp", r)
				sum["series"], sum["x"], sum["value"], sum["unit"] = "summary: tcp", 0.0, 0.0, "ratio"
				sum["not_available"] = "needs iperf3"
				rows = append(rows, sum)
			}
		} else if err := bneckTCP(e, bin, iperf, n, p, r, cc, add, base); err != nil {
			return rows, fmt.Errorf("beside TCP: %w", err)
		}
		// c. Two RD flows from two QPs.
		{
			rep, cmd, before, after, err := rdRun(2, p.size, p.two)
			if err != nil {
				return rows, fmt.Errorf("two flows: %w", err)
			}
			s := rdSeries(rep, p.two, func(i int) string { return "RD flow " + strconv.Itoa(i+1) })
			from := min(int(p.jainFrom/time.Second), len(s[0].gbps)-1)
			var means []float64
			for _, fs := range s {
				means = append(means, mean(fs.gbps[from:]))
			}
			sum := base("two", r)
			sum["value"], sum["unit"] = jain(means), "Jain index"
			sum["jain"], sum["jain_from_s"], sum["duration_s"] = jain(means), float64(from), p.two.Seconds()
			sum["flow1_gbps"], sum["flow2_gbps"] = means[0], means[1]
			sum["total_gbps"] = means[0] + means[1]
			sum["share_of_bottleneck"] = (means[0] + means[1]) / rate
			sum["rd_retransmits"] = rep.Flows[0].Retransmits + rep.Flows[1].Retransmits
			sum["rd_data_frames"] = rep.Flows[0].DataFrames + rep.Flows[1].DataFrames
			add("two", r, s, before, after, cmd, sum)
		}
		// d. Many RD peers through the one bottleneck. Their Writes are
		// smaller (64 KiB, 4 outstanding), so that what a peer has half
		// done at the end is a small part of what it moved.
		{
			rep, cmd, before, after, err := rdRun(p.peers, p.manySize, p.many, "-depth", "4", "-sockbuf", strconv.Itoa(1<<20))
			if err != nil {
				return rows, fmt.Errorf("%d peers: %w", p.peers, err)
			}
			s := rdSeries(rep, p.many, func(i int) string { return "peer " + strconv.Itoa(i+1) })
			total := make([]float64, len(s[0].gbps))
			var means []float64
			var retx, frames, failed uint64
			for i, fs := range s {
				for k, g := range fs.gbps {
					total[k] += g
				}
				means = append(means, mean(fs.gbps))
				retx += rep.Flows[i].Retransmits
				frames += rep.Flows[i].DataFrames
				failed += rep.Flows[i].Failed
			}
			g := mean(total)
			sum := base("many", r)
			sum["value"], sum["unit"] = g/rate, "share of bottleneck"
			sum["peers"], sum["total_gbps"], sum["share_of_bottleneck"] = p.peers, g, g/rate
			sum["jain"], sum["peer_min_gbps"], sum["peer_max_gbps"] = jain(means), slices.Min(means), slices.Max(means)
			sum["rd_data_frames"], sum["rd_retransmits"], sum["failed_wrs"] = frames, retx, failed
			sum["size"], sum["depth"], sum["duration_s"] = p.manySize, 4, p.many.Seconds()
			// The peers one by one would be 100 lines a second: the
			// total goes in as a series, each peer's mean in its row.
			add("many", r, []flowSeries{{label: "total of " + strconv.Itoa(p.peers) + " peers", gbps: total}}, before, after, cmd, sum)
			for _, fs := range s {
				m := base("many", r)
				m["series"], m["x"], m["value"], m["unit"], m["command"] = "many: "+fs.label+" (mean)", 0.0, mean(fs.gbps), "Gb/s", cmd
				for k, v := range fs.extra {
					m[k] = v
				}
				rows = append(rows, m)
			}
		}
	}
	return rows, nil
}

func must(b []byte, _ error) []byte { return b }

// bneckTCP runs iperf3 (TCP, the namespace's default congestion control)
// and one RD flow through the bottleneck at once for p.tcp.
func bneckTCP(e *env, bin, iperf string, n *bneckNet, p bneckPlan, r int, cc string,
	add func(string, int, []flowSeries, bneckCounters, bneckCounters, string, row), base func(string, int) row) error {
	srv := exec.Command("ip", "netns", "exec", n.rcv, iperf, "-s", "-1", "-J", "-B", bnRcvAddr, "-p", strconv.Itoa(bnIperf))
	srv.Stdout, srv.Stderr = io.Discard, e.log
	if err := srv.Start(); err != nil {
		return err
	}
	srvDone := make(chan struct{})
	go func() { srv.Wait(); close(srvDone) }()
	defer func() {
		select {
		case <-srvDone:
		case <-time.After(5 * time.Second):
			srv.Process.Kill()
			<-srvDone
		}
	}()
	// ip netns exec execs iperf3: the pid is iperf3's, in rcv.
	deadline := time.Now().Add(10 * time.Second)
	for !netnstest.TCPListening(srv.Process.Pid, bnIperf) {
		if time.Now().After(deadline) {
			srv.Process.Kill()
			return errors.New("iperf3 -s did not listen within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	sink, err := startSink(e, bin, n, 1)
	if err != nil {
		srv.Process.Kill()
		return err
	}
	defer sink.stop()
	secs := int(p.tcp / time.Second)
	tcpCmd := []string{"ip", "netns", "exec", n.snd, iperf, "-c", bnRcvAddr, "-p", strconv.Itoa(bnIperf), "-t", strconv.Itoa(secs),
		"-i", "1", "-J", "--get-server-output", "-C", cc}
	rdCmd := sink.sendArgs(bin, n, 1, p.size, p.tcp)
	before, err := n.counters()
	if err != nil {
		return err
	}
	type result struct {
		out []byte
		err error
	}
	tcpc, rdc := make(chan result, 1), make(chan result, 1)
	go func() { out, err := runCmd(tcpCmd, p.tcp+time.Minute, e.log); tcpc <- result{out, err} }()
	go func() { out, err := runCmd(rdCmd, p.tcp+time.Minute, e.log); rdc <- result{out, err} }()
	tr, rr := <-tcpc, <-rdc
	if tr.err != nil {
		return tr.err
	}
	if rr.err != nil {
		return rr.err
	}
	after, err := n.counters()
	if err != nil {
		return err
	}
	var rep rdReport
	if err := json.Unmarshal(rr.out, &rep); err != nil || len(rep.Flows) != 1 {
		return fmt.Errorf("rdflow send: %v: %.300s", err, rr.out)
	}
	// The RD sender's report, its congestion control sampled every
	// 100 ms included, for whoever wants to see how it shared the queue.
	if err := os.WriteFile(filepath.Join(e.out, fmt.Sprintf("bottleneck-tcp-%s-round%d-rdflow.json", cc, r)), rr.out, 0o644); err != nil {
		return err
	}
	tcpBins, err := iperfReceived(tr.out, secs)
	if err != nil {
		return err
	}
	s := rdSeries(rep, p.tcp, func(int) string { return "RD" })
	s = append(s, flowSeries{label: "TCP (iperf3, " + cc + ")", gbps: tcpBins})
	rd, tcp := mean(s[0].gbps), mean(tcpBins)
	sum := base("tcp", r)
	sum["value"], sum["unit"] = 0.0, "ratio RD/TCP"
	if tcp > 0 {
		sum["value"] = rd / tcp
	}
	sum["ratio_rd_tcp"], sum["rd_gbps"], sum["tcp_gbps"] = sum["value"], rd, tcp
	sum["rd_share"], sum["tcp_share"] = rd/(float64(n.rateBits)/1e9), tcp/(float64(n.rateBits)/1e9)
	sum["tcp_congestion_control"], sum["duration_s"] = cc, p.tcp.Seconds()
	sum["rd_retransmits"], sum["rd_data_frames"] = rep.Flows[0].Retransmits, rep.Flows[0].DataFrames
	sum["rd_compete_share"], sum["rd_cc_modes"] = ccModes(rep.Flows[0].Modes)
	sum["tcp_command"] = strings.Join(tcpCmd[4:], " ")
	add("tcp", r, s, before, after, strings.Join(rdCmd[4:], " ")+" & "+strings.Join(tcpCmd[4:], " "), sum)
	return nil
}

// iperfReceived is the receiver's goodput (Gb/s) in each of the first
// secs 1 s intervals, from iperf3 -J --get-server-output.
func iperfReceived(b []byte, secs int) ([]float64, error) {
	var doc struct {
		Error  string `json:"error"`
		Server struct {
			Intervals []struct {
				Sum struct {
					Start, End float64
					Bytes      float64 `json:"bytes"`
				} `json:"sum"`
			} `json:"intervals"`
		} `json:"server_output_json"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("iperf3's JSON: %w: %.200s", err, b)
	}
	if doc.Error != "" {
		return nil, fmt.Errorf("iperf3: %s", doc.Error)
	}
	if len(doc.Server.Intervals) == 0 {
		return nil, fmt.Errorf("iperf3: no server intervals (--get-server-output): %.200s", b)
	}
	out := make([]float64, secs)
	for _, iv := range doc.Server.Intervals {
		if k := int(iv.Sum.Start + 0.5); k < secs {
			out[k] += iv.Sum.Bytes * 8 / 1e9 // a 1 s interval: Gb/s
		}
	}
	return out, nil
}

func summaryText(s row) string {
	var parts []string
	for _, k := range []string{"goodput_gbps", "rd_gbps", "tcp_gbps", "ratio_rd_tcp", "flow1_gbps", "flow2_gbps", "jain", "total_gbps",
		"share_of_bottleneck", "qdisc_drop_pct", "rd_retransmits", "rcv_udp_rcvbuf_errors", "snd_udp_sndbuf_errors", "loadavg_1m"} {
		if v, ok := s[k]; ok {
			if f, ok := v.(float64); ok {
				v = strconv.FormatFloat(f, 'g', 3, 64) // the log's reading; runs.csv keeps every digit
			}
			parts = append(parts, fmt.Sprintf("%s %s", k, cell(v)))
		}
	}
	return strings.Join(parts, ", ")
}

// rdflow builds experiments/rdflow once, into the work directory.
func (e *env) rdflow() (string, error) {
	bin := filepath.Join(e.work, "rdflow")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if out, err := goCmd(e.root, "build", "-o", bin, "./experiments/rdflow").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building rdflow: %v\n%s", err, out)
	}
	return bin, nil
}

// bottleneckPlot draws, for the first round, each flow's goodput over
// time beside TCP (b) and beside another RD flow (c), and RD alone (a)
// with the 100 peers' total (d), the bottleneck's rate as a dashed line.
func bottleneckPlot(dir string, f *figure, rows []row) ([]plotted, error) {
	var out []plotted
	panels := []struct{ test, name, title string }{
		{"tcp", "bottleneck-tcp", "RD beside a TCP flow (iperf3) through one bottleneck"},
		{"two", "bottleneck-two", "Two RD flows (two QPs) through one bottleneck"},
		{"alone", "bottleneck-alone", "RD alone, and the total of many RD peers, through one bottleneck"},
	}
	for _, pn := range panels {
		tests := []string{pn.test}
		if pn.test == "alone" {
			tests = append(tests, "many")
		}
		var labels []string
		by := map[string]plotter.XYs{}
		rate := 0.0
		for _, r := range rows {
			if r.str("figure") != f.ID || r.num("round") != 1 || !slices.Contains(tests, r.str("test")) || r.num("x") == 0 {
				continue
			}
			l := r.str("series")
			if !slices.Contains(labels, l) {
				labels = append(labels, l)
			}
			by[l] = append(by[l], plotter.XY{X: r.num("x"), Y: r.num("value")})
			rate = r.num("bottleneck_gbps")
		}
		if len(labels) == 0 {
			continue
		}
		p := newChart(pn.title, "time (s; each point the second ending there)", "goodput (Gb/s)")
		maxX := 0.0
		for k, l := range labels {
			xys := by[l]
			slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
			maxX = max(maxX, xys[len(xys)-1].X)
			_, short, _ := strings.Cut(l, ": ")
			if err := p.series(k, short, xys, nil); err != nil {
				return nil, err
			}
		}
		if rate > 0 {
			line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: rate}, {X: maxX, Y: rate}})
			if err != nil {
				return nil, err
			}
			line.Color = color.Gray{Y: 100}
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
			p.Add(line)
			p.legend(fmt.Sprintf("bottleneck (%g Gb/s)", rate), line)
		}
		// Seconds are many: gonum's ticks, from 0; room above the
		// bottleneck's line.
		p.Y.Min, p.Y.Max, p.X.Min = 0, math.Max(rate*1.1, p.Y.Max*1.05), 0
		if err := p.save(dir, pn.name); err != nil {
			return nil, err
		}
		out = append(out, plotted{fig: f.ID, name: pn.name, title: p.Title.Text})
	}
	if len(out) == 0 {
		return nil, errors.New("no bottleneck run to draw")
	}
	return out, nil
}

// bottleneckTable writes the summary per measurement: the median of the
// rounds and their range, beside issue 31's targets.
func bottleneckTable(b *bytes.Buffer, f *figure, rows []row) {
	var sums []row
	for _, r := range rows {
		if r.str("figure") == f.ID && strings.HasPrefix(r.str("series"), "summary: ") {
			sums = append(sums, r)
		}
	}
	if len(sums) > 0 {
		fmt.Fprintf(b, "Bottleneck: tbf %g Gbit/s, burst %d B, queue limit %d B, on a router namespace between sender and receiver "+
			"(MTU 1,500); RD Writes in 1,400-byte segments (experiments/rdflow); TCP is iperf3.\n\n",
			sums[0].num("bottleneck_gbps"), int(sums[0].num("tbf_burst_bytes")), int(sums[0].num("tbf_limit_bytes")))
	}
	b.WriteString("| measurement | figure (median [min–max] of rounds) | bottleneck drops (% of packets it saw) | RD retransmits | issue 31 target |\n|---|---|---|---|---|\n")
	type m struct{ test, what, key, target string }
	for _, x := range []m{
		{"alone", "a. RD alone: goodput (Gb/s)", "goodput_gbps", ">= 0.9 Gbit/s, drops <= 2 % of what RD sent"},
		{"tcp", "b. RD beside TCP: RD / TCP goodput", "ratio_rd_tcp", "between 0.5x and 2x"},
		{"tcp", "b. RD beside TCP: RD, TCP (Gb/s)", "rd_gbps,tcp_gbps", "each 1/3 to 2/3 of the bottleneck"},
		{"two", "c. two RD flows: Jain's index after 5 s", "jain", ">= 0.95"},
		{"two", "c. two RD flows: flow 1, flow 2 (Gb/s)", "flow1_gbps,flow2_gbps", ""},
		{"many", "d. 100 RD peers: total / bottleneck", "share_of_bottleneck", ">= 0.8"},
	} {
		var rs []row
		na := ""
		for _, r := range sums {
			if r.str("test") == x.test {
				if r.str("not_available") != "" {
					na = r.str("not_available")
					continue
				}
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			if na == "" {
				na = "not run"
			}
			fmt.Fprintf(b, "| %s | not available: %s | | | %s |\n", x.what, na, x.target)
			continue
		}
		var vals []string
		for _, k := range strings.Split(x.key, ",") {
			vals = append(vals, medRange(rs, k))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", x.what, strings.Join(vals, ", "), medRange(rs, "qdisc_drop_pct"), medRange(rs, "rd_retransmits"), x.target)
	}
	b.WriteString("\nGoodput is what completed in each second: for RD, Writes the receiver acknowledged; for TCP, the bytes iperf3's " +
		"server received. Drops are the tbf's own (`tc -s -j qdisc show`) over every packet it saw in the run; the receiver's UDP " +
		"receive-buffer drops are `rcv_udp_rcvbuf_errors` in runs.csv, the sender's refused sends `snd_udp_sndbuf_errors`, " +
		"and `loadavg_1m` the host's load when the run ended. The plots show the first round.\n\n")
}

// medRange is the median of key over rs and the range.
func medRange(rs []row, key string) string {
	var v []float64
	for _, r := range rs {
		if _, ok := r[key]; ok {
			v = append(v, r.num(key))
		}
	}
	if len(v) == 0 {
		return "–"
	}
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	if len(v) == 1 {
		return fmtV(m)
	}
	return fmt.Sprintf("%s [%s–%s]", fmtV(m), fmtV(v[0]), fmtV(v[len(v)-1]))
}
