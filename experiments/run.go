package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// env is where the runs happen: the udperf binary, and the loss method
// with its namespaces (or the remote host).
type env struct {
	bin, root, work string
	out             string // the results directory
	log             io.Writer
	quick           bool
	method          string // netem, nft, inproc
	topo            *topology
	host, dev       string // host mode: udperf server's address, netem's interface
	mu              sync.Mutex
}

// row is one measurement: udperf's JSON row (every setting it reports)
// and ours: figure, series, x, round, the loss method and rate, the
// figure's value and unit, and the command that made it.
type row map[string]any

func (r row) str(k string) string {
	s, _ := r[k].(string)
	return s
}

func (r row) num(k string) float64 {
	switch v := r[k].(type) {
	case float64:
		return v
	case int:
		return float64(v)
	case uint64:
		return float64(v)
	case int64:
		return float64(v)
	}
	return 0
}

const (
	srvAddr  = "10.77.0.1"
	cliAddr  = "10.77.0.2"
	ctlPort  = "18515"
	lossPoll = "event" // two processes on two cores: neither spins
)

// unreliable reports whether mode runs over UD, where a datagram the
// kernel drops is gone.
func unreliable(mode string) bool { return strings.HasPrefix(mode, "ud") }

// measure makes every run of f: for each x, rounds × series, each round
// starting at the next series (the order alternates, as udperf compare's
// rounds do).
func (e *env) measure(f *figure, o options) ([]row, error) {
	if f.External != nil {
		return f.External(e, f, o)
	}
	var rows []row
	for _, x := range f.X {
		if f.LossX {
			if err := e.setLoss(x); err != nil {
				return rows, err
			}
		}
		for r := range o.rounds {
			for k := range f.Series {
				s := f.Series[(k+r)%len(f.Series)]
				got, err := e.runOne(f, s, x, r)
				if err != nil && !(f.LossX && x > 0) && unreliable(s.Mode) {
					// A UD run on a lossless link can still lose a datagram
					// (a socket buffer full while its reader was off the CPU:
					// both ends share two cores); the round trip or the run
					// then never finishes. It is run once more, and the row
					// says so; a second failure ends the figure.
					fmt.Fprintf(e.log, "experiments: %s: %s at %v, round %d failed, run again: %v\n", f.ID, s.Label, x, r+1, err)
					first := err
					if got, err = e.runOne(f, s, x, r); err == nil && got != nil {
						got["retried_after"] = first.Error()
					}
				}
				if err != nil && f.LossX && x > 0 {
					// Under loss a run may not finish (a reliable mode's
					// drain limit): it is a point of the figure, at zero,
					// and the report counts it.
					fmt.Fprintf(e.log, "experiments: %s: %s at %v %%, round %d failed: %v\n", f.ID, s.Label, x, r+1, err)
					got = row{"figure": f.ID, "series": s.Label, "x": x, "round": r + 1, "loss_pct": x, "loss_method": e.method,
						"mode": s.Mode, "value": 0.0, "unit": "Gb/s", "failed": err.Error()}
					err = nil
				}
				if err != nil {
					return rows, fmt.Errorf("%s at %v, round %d: %w", s.Label, x, r+1, err)
				}
				if got != nil {
					rows = append(rows, got)
				}
			}
		}
	}
	if len(f.X) > 0 && f.LossX {
		return rows, e.setLoss(0)
	}
	return rows, nil
}

// runOne runs one series at one x; nil when the series does not apply
// there (UD Send latency above one datagram; RC under in-process loss).
func (e *env) runOne(f *figure, s series, x float64, round int) (row, error) {
	size := int(x)
	lossPct := 0.0
	if f.LossX {
		size, lossPct = f.Size, x
	}
	args := []string{"-mode", s.Mode, "-test", f.Test, "-json"}
	chunk := 0
	if size > 0 && s.MaxSize > 0 && size > s.MaxSize {
		if f.Test == "lat" {
			return nil, nil // one datagram at most: no latency of a larger UD Send
		}
		chunk = s.MaxSize // the application segments, as the seed's UD Send did
	}
	if size > 0 {
		n := size
		if chunk > 0 {
			n = chunk
		}
		args = append(args, "-s", strconv.Itoa(n))
	}
	switch f.Test {
	case "lat":
		n := max(20, min(5000, 200_000_000/max(size, 1)))
		if e.quick {
			n = max(20, min(300, 20_000_000/max(size, 1)))
		}
		args = append(args, "-n", strconv.Itoa(n), "-w", strconv.Itoa(max(5, n/10)))
	default:
		d := "1s"
		if e.quick {
			d = "150ms"
		}
		args = append(args, "-D", d)
	}
	args = append(args, s.Flags...)
	var cmd []string
	switch {
	case !f.LossX:
		// Latency spins, as perftest's ping-pongs do; bandwidth waits on
		// events: on two cores a spinning receiver starves the sender's
		// kernel work (RC Send of 1 MiB: 0.9 Gb/s busy, 12 event).
		poll := "event"
		if f.Test == "lat" {
			poll = "busy"
		}
		cmd = append([]string{e.bin, "local", "-poll", poll}, args...)
	case e.method == "inproc":
		if strings.HasPrefix(s.Mode, "rc-") && lossPct > 0 {
			return nil, nil // TCP cannot drop on request: RC needs the kernel's loss
		}
		cmd = append([]string{e.bin, "local", "-poll", lossPoll}, args...)
		if lossPct > 0 {
			cmd = append(cmd, "-loss", strconv.FormatFloat(lossPct/100, 'g', -1, 64), "-seed", strconv.Itoa(round+1))
		}
	default:
		cmd = append(e.clientPrefix(), e.bin, "client", "-addr", e.serverAddr(), "-poll", lossPoll)
		cmd = append(cmd, args...)
	}
	out, err := e.exec(cmd)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc.Results) != 1 {
		return nil, fmt.Errorf("%s: not one udperf result (%v): %.300s", strings.Join(cmd, " "), err, out)
	}
	r := row(doc.Results[0])
	r["figure"], r["series"], r["x"], r["round"] = f.ID, s.Label, x, round+1
	r["loss_pct"], r["loss_method"] = lossPct, "none"
	if f.LossX {
		r["loss_method"] = e.method
	}
	r["chunk_bytes"], r["message_bytes"] = chunk, size
	r["command"] = strings.Join(cmd, " ")
	switch f.Test {
	case "lat":
		r["value"], r["unit"] = r.num("t_typical_us"), "us"
	default:
		r["value"], r["unit"] = r.num("bw_avg_gbps"), "Gb/s"
	}
	return r, nil
}

// exec runs cmd and returns its stdout; a failure carries its stderr.
func (e *env) exec(cmd []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %s", strings.Join(cmd, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (e *env) clientPrefix() []string {
	if e.topo != nil {
		return []string{"ip", "netns", "exec", e.topo.cli}
	}
	return nil
}

func (e *env) serverAddr() string {
	if e.host != "" {
		if strings.Contains(e.host, ":") && !strings.HasSuffix(e.host, "]") {
			return e.host
		}
		return e.host + ":" + ctlPort
	}
	return srvAddr + ":" + ctlPort
}

// setLoss makes the kernel (or nothing, in process) lose pct % of the
// packets each way.
func (e *env) setLoss(pct float64) error {
	switch e.method {
	case "inproc":
		return nil
	case "netem":
		if e.host != "" {
			return netem("", e.dev, pct)
		}
		if err := e.ensureTopology(); err != nil {
			return err
		}
		for _, ns := range [][2]string{{e.topo.srv, "ux0"}, {e.topo.cli, "ux1"}} {
			if err := netem(ns[0], ns[1], pct); err != nil {
				return err
			}
		}
		return nil
	case "nft":
		if e.host != "" {
			return nftLoss("", pct)
		}
		if err := e.ensureTopology(); err != nil {
			return err
		}
		for _, ns := range []string{e.topo.srv, e.topo.cli} {
			if err := nftLoss(ns, pct); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown loss method %q", e.method)
}

// netem sets (pct > 0) or removes the netem qdisc of dev in namespace ns
// ("": this one).
func netem(ns, dev string, pct float64) error {
	args := []string{"qdisc", "del", "dev", dev, "root"}
	if pct > 0 {
		args = []string{"qdisc", "replace", "dev", dev, "root", "netem", "loss", strconv.FormatFloat(pct, 'f', -1, 64) + "%"}
	}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	out, err := exec.Command("tc", args...).CombinedOutput()
	if err != nil && pct > 0 {
		return fmt.Errorf("tc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// nftLoss drops pct % of the UDP and TCP packets a namespace receives,
// at random (nftables numgen; in permille, as the rule counts). The
// chain runs before IP reassembly (priority -450, defragmentation is
// -400), so each fragment of a datagram over the MTU is lost on its own,
// as netem loses packets on the wire; at the input hook a whole datagram
// would be dropped or kept at once.
func nftLoss(ns string, pct float64) error {
	pm := int(pct*10 + 0.5)
	rules := "flush ruleset\n"
	if pm > 0 {
		rules += fmt.Sprintf("table inet udiwarp_loss {\n chain in {\n  type filter hook prerouting priority -450; policy accept;\n"+
			"  meta l4proto { udp, tcp } numgen random mod 1000 < %d drop\n }\n}\n", pm)
	}
	cmd := exec.Command("nft", "-f", "-")
	if ns != "" {
		cmd = exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	}
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	return nil
}

// topology is two network namespaces joined by a veth pair (ux0 in srv
// at 10.77.0.1, ux1 in cli at 10.77.0.2, MTU 1500 as an Ethernet link)
// with `udperf server` running in srv.
type topology struct {
	srv, cli string
	server   *exec.Cmd
}

func (e *env) ensureTopology() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.topo != nil {
		return nil
	}
	id := strconv.Itoa(os.Getpid())
	t := &topology{srv: "udiwarp-exp-srv-" + id, cli: "udiwarp-exp-cli-" + id}
	steps := [][]string{
		{"netns", "add", t.srv}, {"netns", "add", t.cli},
		{"-n", t.srv, "link", "set", "lo", "up"}, {"-n", t.cli, "link", "set", "lo", "up"},
		{"-n", t.srv, "link", "add", "ux0", "type", "veth", "peer", "name", "ux1", "netns", t.cli},
		{"-n", t.srv, "addr", "add", srvAddr + "/24", "dev", "ux0"}, {"-n", t.cli, "addr", "add", cliAddr + "/24", "dev", "ux1"},
		{"-n", t.srv, "link", "set", "ux0", "up"}, {"-n", t.cli, "link", "set", "ux1", "up"},
	}
	e.topo = t // close deletes what was made, even half of it
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	// IP reassembly: a datagram over the MTU is fragments, and under loss
	// many never complete. With the defaults (4 MiB of fragments held
	// 30 s) the incomplete ones of one run fill the memory and every
	// later datagram over the MTU is dropped, lossless runs included; 256
	// MiB held 1 s keeps one run's leftovers out of the next.
	for _, ns := range []string{t.srv, t.cli} {
		args := []string{"netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ipfrag_high_thresh=268435456",
			"net.ipv4.ipfrag_low_thresh=201326592", "net.ipv4.ipfrag_time=1"}
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.server = exec.Command("ip", "netns", "exec", t.srv, e.bin, "server", "-addr", srvAddr+":"+ctlPort)
	stdout, err := t.server.StdoutPipe() // "udperf server: control at ...", then a line per run
	if err != nil {
		return err
	}
	t.server.Stderr = e.log
	if err := t.server.Start(); err != nil {
		return err
	}
	listening := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), ctlPort) {
				listening <- true
				said = true
			}
		}
		if !said {
			listening <- false
		}
	}()
	select {
	case ok := <-listening:
		if !ok {
			return errors.New("udperf server did not start in the namespace")
		}
	case <-time.After(10 * time.Second):
		return errors.New("udperf server did not say it listens within 10 s")
	}
	return nil
}

func (e *env) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.topo; t != nil {
		if t.server != nil && t.server.Process != nil {
			t.server.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { t.server.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.server.Process.Kill()
				<-done // its output copied out: nothing writes to the log after close
			}
		}
		exec.Command("ip", "netns", "del", t.srv).Run()
		exec.Command("ip", "netns", "del", t.cli).Run()
		e.topo = nil
	}
	if e.host != "" && e.method == "netem" {
		netem("", e.dev, 0)
	}
	if e.host != "" && e.method == "nft" {
		nftLoss("", 0)
	}
}

// chooseLoss picks the loss method: netem where the kernel has it, else
// nftables, else the impairment layer; an explicit choice that cannot
// run here is an error.
func chooseLoss(o options, kernel bool) (string, error) {
	have := map[string]string{"inproc": ""}
	if why := probeNetem(o); why == "" {
		have["netem"] = ""
	} else {
		have["netem"] = why
	}
	if why := probeNft(o); why == "" {
		have["nft"] = ""
	} else {
		have["nft"] = why
	}
	switch o.loss {
	case "auto":
		if !kernel {
			return "inproc", nil
		}
		for _, m := range []string{"netem", "nft", "inproc"} {
			if have[m] == "" {
				return m, nil
			}
		}
	case "netem", "nft", "inproc":
		if why := have[o.loss]; why != "" {
			return "", fmt.Errorf("-loss %s: %s", o.loss, why)
		}
		return o.loss, nil
	}
	return "", fmt.Errorf("-loss %q: want auto, netem, nft or inproc", o.loss)
}

// probeNetem says why netem cannot be used here ("" when it can): it
// tries the qdisc in a namespace of its own (or trusts -dev in host
// mode, where the first rate tells).
func probeNetem(o options) string {
	return probe(o, "tc", "needs tc (iproute2)", func(ns string) string {
		if out, err := exec.Command("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "loss", "1%").CombinedOutput(); err != nil {
			return "this kernel has no netem (" + strings.TrimSpace(string(out)) + ")"
		}
		return ""
	})
}

// probeNft says why nftables drops cannot be used here ("" when they can).
func probeNft(o options) string {
	return probe(o, "nft", "needs nft (nftables)", func(ns string) string {
		if err := nftLoss(ns, 1); err != nil {
			return err.Error()
		}
		return ""
	})
}

// probe checks root and tool, then runs try in a scratch namespace.
func probe(o options, tool, missing string, try func(ns string) string) string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	if _, err := exec.LookPath(tool); err != nil {
		return missing
	}
	if o.server != "" {
		return ""
	}
	ns := "udiwarp-exp-probe-" + strconv.Itoa(os.Getpid())
	if err := exec.Command("ip", "netns", "add", ns).Run(); err != nil {
		return "cannot make a network namespace"
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	return try(ns)
}

// tool builds a command of this tree once, into the work directory.
func (e *env) tool(name string) (string, error) {
	bin := filepath.Join(e.work, name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if out, err := goCmd(e.root, "build", "-o", bin, "./cmd/"+name).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", name, err, out)
	}
	return bin, nil
}
