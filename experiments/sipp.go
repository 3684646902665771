package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"

	"github.com/udiwarp/udiwarp/internal/memstat"
	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// The SIPp experiment (seed 003's SipStone test, issue 18): a SIPp UAS
// and a SIPp UAC, unmodified, run SIPp's built-in basic call scenarios
// (-sn uas, -sn uac) with N clients: N calls open at once, each on its
// own socket (-t un: a UDP socket per call; -t tn: a TCP connection per
// call), held open (-d) until all N are, then hung up. Each run reports
// SIPp's own figures — response times (INVITE sent to 200 OK received,
// from SIPp's message trace with µs timestamps, and SIPp's ms-resolution
// response-time trace beside them), calls completed and failed from its
// statistics file — and the memory of the whole: the resident set of
// both SIPp processes at the plateau plus the growth of the kernel's
// socket slab (internal/memstat), as the seed summed them.
//
// The transports are a list; a transport the stack cannot run yet is a
// row saying so ("not available: why"), found by a probe, never a number.

// sippTransport is one way to carry SIPp's traffic.
type sippTransport struct {
	Name  string // the series: kernel-udp, kernel-tcp, preload-ud, preload-rd, preload-rc
	Label string
	T     string // SIPp's transport: un (a UDP socket per call), tn (a TCP connection per call)
	// QP is the udiwarp QP type under the preload ("": the kernel's
	// sockets, no preload). The datagram types are asked for with
	// UDIWARP_PRELOAD_QP=ud|rd, and RD must be named in the engines'
	// stats ("qp":"rd"); RC carries SIPp's TCP (-t tn), and is there
	// when the engines' counters show they sent SIPp's requests.
	QP string
}

var sippTransports = []sippTransport{
	{Name: "kernel-udp", Label: "kernel UDP (-t un)", T: "un"},
	{Name: "kernel-tcp", Label: "kernel TCP (-t tn; the RC-iWARP stand-in)", T: "tn"},
	{Name: "preload-ud", Label: "preload, UD (-t un)", T: "un", QP: "ud"},
	{Name: "preload-rd", Label: "preload, RD (-t un)", T: "un", QP: "rd"},
	{Name: "preload-rc", Label: "preload, RC (-t tn)", T: "tn", QP: "rc"},
}

// sippSettings are a run's sizes: clients, the call rate that opens
// them, and how long the last one stays open.
type sippSettings struct {
	clients []int
	rate    int           // calls per second, all UACs together
	plateau time.Duration // all calls open at once, at least this long
}

func sippSizes(e *env, o options) (sippSettings, error) {
	s := sippSettings{clients: []int{1000, 10000}, rate: 1000, plateau: 2 * time.Second}
	if e.quick {
		s = sippSettings{clients: []int{20, 100}, rate: 200, plateau: 300 * time.Millisecond}
	}
	if o.sippRate > 0 {
		s.rate = o.sippRate
	}
	if o.sippClients != "" {
		s.clients = nil
		for _, f := range strings.Split(o.sippClients, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return s, fmt.Errorf("-sipp-clients %q: want a list of counts", o.sippClients)
			}
			s.clients = append(s.clients, n)
		}
	}
	return s, nil
}

func sippSelected(o options) ([]sippTransport, error) {
	if o.sippTransports == "" {
		return sippTransports, nil
	}
	var ts []sippTransport
	for _, n := range strings.Split(o.sippTransports, ",") {
		i := slices.IndexFunc(sippTransports, func(t sippTransport) bool { return t.Name == strings.TrimSpace(n) })
		if i < 0 {
			return nil, fmt.Errorf("-sipp-transports: no transport %q (%s)", n, strings.Join(sippNames(), ", "))
		}
		ts = append(ts, sippTransports[i])
	}
	return ts, nil
}

func sippNames() []string {
	var n []string
	for _, t := range sippTransports {
		n = append(n, t.Name)
	}
	return n
}

// sippFigure makes every run of the SIPp experiment.
func sippFigure(e *env, f *figure, o options) ([]row, error) {
	if e.host != "" {
		fmt.Fprintln(e.log, "experiments: sipp: runs on one machine, not against -server: skipped")
		return nil, nil
	}
	if _, err := exec.LookPath("sipp"); err != nil {
		fmt.Fprintln(e.log, "experiments: sipp: no sipp (Debian package sip-tester; .ci/run installs it): skipped")
		return nil, nil
	}
	set, err := sippSizes(e, o)
	if err != nil {
		return nil, err
	}
	ts, err := sippSelected(o)
	if err != nil {
		return nil, err
	}
	f.Series, f.X = nil, nil
	for _, t := range ts {
		f.Series = append(f.Series, series{Label: t.Name, Mode: t.Name})
	}
	for _, n := range set.clients {
		f.X = append(f.X, float64(n))
	}
	raiseNoFile(slices.Max(set.clients) + sippFDMargin)
	// Which transports can run at all: the preload's other modes than UD
	// by a probe (UD's runs show for themselves whether it works).
	unavailable := map[string]string{}
	for _, t := range ts {
		if t.QP == "" || t.QP == "ud" {
			continue
		}
		why, err := e.sippProbe(t, o)
		if err != nil {
			return nil, fmt.Errorf("%s probe: %w", t.Name, err)
		}
		if why != "" {
			unavailable[t.Name] = why
			fmt.Fprintf(e.log, "experiments: sipp: %s not available: %s\n", t.Name, why)
		}
	}
	var rows []row
	for _, n := range set.clients {
		for r := range o.rounds {
			for k := range ts {
				t := ts[(k+r)%len(ts)]
				if why := unavailable[t.Name]; why != "" || sippLimit(t, n) != "" {
					if why == "" {
						why = sippLimit(t, n)
					}
					if r == 0 { // one row says so, not one per round
						rows = append(rows, row{"figure": f.ID, "series": t.Name, "x": float64(n), "round": 1, "clients": n,
							"value": 0.0, "unit": "MiB", "loss_method": "none", "loss_pct": 0.0, "mode": t.Name,
							"not_available": why, "command": "(not run)"})
					}
					continue
				}
				got, err := e.sippRun(t, n, set, r, o)
				if err != nil {
					return rows, fmt.Errorf("%s, %d clients, round %d: %w", t.Name, n, r+1, err)
				}
				got["figure"], got["series"], got["x"], got["round"] = f.ID, t.Name, float64(n), r+1
				got["loss_method"], got["loss_pct"], got["mode"] = "none", 0.0, t.Name
				rt := "no responses"
				if _, ok := got["rt_median_ms"]; ok {
					rt = fmt.Sprintf("response median %.3f ms p99 %.3f ms", got.num("rt_median_ms"), got.num("rt_p99_ms"))
				}
				fmt.Fprintf(e.log, "experiments: sipp: %s, %d clients, round %d: %.1f MiB, %s, %v completed, %v failed%s\n",
					t.Name, n, r+1, got.num("value"), rt, got["completed"], got["failed_calls"],
					func() string {
						if s := got.str("failed"); s != "" {
							return " (" + s + ")"
						}
						return ""
					}())
				rows = append(rows, got)
			}
		}
	}
	return rows, nil
}

// sippFDMargin is what a SIPp process keeps open besides its calls'
// sockets (its main, control and media sockets, logs, stdio).
const sippFDMargin = 256

// sippPerProcess is how many clients one SIPp UAC can hold: one
// descriptor each, under the hard RLIMIT_NOFILE (SIPp raises its soft
// limit to the hard one itself). Raising the hard limit needs
// CAP_SYS_RESOURCE; where this process has it, sippFigure's caller
// raised it.
func sippPerProcess() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 1024 - sippFDMargin
	}
	return int(min(rl.Max, 1<<30)) - sippFDMargin
}

// raiseNoFile raises the hard and soft RLIMIT_NOFILE to n where this
// process may (CAP_SYS_RESOURCE); the SIPp processes inherit it.
func raiseNoFile(n int) {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) != nil || rl.Max >= uint64(n) {
		return
	}
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: uint64(n), Max: uint64(n)})
}

// sippLimit says why n clients cannot run over t here ("" when they
// can): over TCP the UAS accepts a connection per client, and one
// process cannot hold more descriptors than its hard limit.
func sippLimit(t sippTransport, n int) string {
	per := sippPerProcess()
	if t.T == "tn" && n > per {
		return fmt.Sprintf("the UAS holds a TCP connection per client: %d descriptors in one process, over this host's hard RLIMIT_NOFILE (%d; raising it needs CAP_SYS_RESOURCE)",
			n+sippFDMargin, per+sippFDMargin)
	}
	return ""
}

// preloadLibs builds the LD_PRELOAD library and its engine once (or
// takes them from -preload DIR).
func (e *env) preloadLibs(o options) (string, error) {
	if o.preload != "" {
		for _, n := range []string{"libudiwarp_preload.so", "libudiwarp_engine.so"} {
			if _, err := os.Stat(filepath.Join(o.preload, n)); err != nil {
				return "", fmt.Errorf("-preload: %w", err)
			}
		}
		return o.preload, nil
	}
	dir := filepath.Join(e.work, "preload")
	if _, err := os.Stat(filepath.Join(dir, "libudiwarp_engine.so")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	src := filepath.Join(e.root, "socketshim", "preload")
	steps := [][]string{
		{"gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", filepath.Join(dir, "libudiwarp_preload.so"), "c/preload.c", "-ldl", "-lpthread"},
		{"go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "libudiwarp_engine.so"), "./engine"},
	}
	for _, s := range steps {
		c := exec.Command(s[0], s[1:]...)
		c.Dir = src
		c.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := c.CombinedOutput(); err != nil {
			return "", fmt.Errorf("building the preload: %s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	return dir, nil
}

// sippProc is one SIPp process of a run.
type sippProc struct {
	name  string // uas, uac0, uac1, ...
	args  []string
	cmd   *exec.Cmd
	out   *os.File
	stats string // the preload engine's stats file
	done  chan struct{}
	err   error
}

func (e *env) sippStart(dir, name string, t sippTransport, libs string, args []string) (*sippProc, error) {
	p := &sippProc{name: name, args: append([]string{"sipp"}, args...), done: make(chan struct{})}
	var err error
	if p.out, err = os.Create(filepath.Join(dir, name+".out")); err != nil {
		return nil, err
	}
	p.cmd = exec.Command("sipp", args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = os.Environ()
	if t.QP != "" {
		p.stats = filepath.Join(dir, name+"-engine.json")
		p.cmd.Env = append(p.cmd.Env, "LD_PRELOAD="+filepath.Join(libs, "libudiwarp_preload.so"),
			"UDIWARP_ENGINE="+filepath.Join(libs, "libudiwarp_engine.so"), "UDIWARP_PRELOAD_STATS="+p.stats)
		if t.T == "un" {
			p.cmd.Env = append(p.cmd.Env, "UDIWARP_PRELOAD_QP="+t.QP)
		} else {
			p.cmd.Env = append(p.cmd.Env, "UDIWARP_PRELOAD_TCP="+t.QP) // rc: TCP sockets over RC
		}
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		p.out.Close()
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); p.out.Close(); close(p.done) }()
	return p, nil
}

func (p *sippProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *sippProc) kill() {
	if !p.exited() {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

// stop ends a UAS once its calls are over: SIGINT (SIPp exits at once,
// with status 0; its SIGUSR1 soft exit lingers 4 s), killed after 5 s.
func (p *sippProc) stop() {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.kill()
	}
}

func (p *sippProc) tail() string {
	b, _ := os.ReadFile(p.out.Name())
	b = bytes.TrimSpace(b)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}

// engineStats reads the preload engine's counters (nil without the
// preload or when it wrote none).
func (p *sippProc) engineStats() map[string]any {
	if p.stats == "" {
		return nil
	}
	b, err := os.ReadFile(p.stats)
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// sippPort returns a loopback port free for UDP and TCP now.
func sippPort() (int, error) {
	for range 20 {
		u, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return port, nil
		}
	}
	return 0, errors.New("no free port")
}

// sippProbe says why the preload cannot carry t ("" when it can): ten
// calls between a preloaded UAS and UAC must complete; for RD the
// engines must say (their stats' "qp") that they ran RD QPs, for RC the
// UAC's engine must have sent SIPp's thirty requests (its counters
// named *sent*, but bytes).
func (e *env) sippProbe(t sippTransport, o options) (string, error) {
	libs, err := e.preloadLibs(o)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(e.work, "sipp-probe-"+t.Name+"-")
	if err != nil {
		return "", err
	}
	got, err := e.sippRun(t, 10, sippSettings{rate: 100, plateau: 100 * time.Millisecond}, 0, o, dir, libs)
	if err != nil {
		return "", err
	}
	if s := got.str("failed"); s != "" && t.QP != "rc" {
		return "the preload did not carry ten calls: " + s, nil
	}
	if t.QP == "rc" {
		if n, _ := got["engine_uac0_streams"].(float64); n < 10 {
			return fmt.Sprintf("the UAC's engine ran %v of the ten calls' TCP connections over RC (UDIWARP_PRELOAD_TCP=rc)", n), nil
		}
		return "", nil
	}
	if q, _ := got["engine_qp"].(string); q != t.QP {
		return fmt.Sprintf("the preload has no %s mode: asked with UDIWARP_PRELOAD_QP=%s, its engines report no \"qp\":%q (UD only today)",
			strings.ToUpper(t.QP), t.QP, t.QP), nil
	}
	return "", nil
}

// sippRun is one run: n clients over t. A run that ends badly (SIPp
// exits with an error, calls fail or never complete, memory over the
// cap) is a row with "failed" saying what happened and what was
// measured until then; an error is returned only when the harness
// itself cannot go on. dirLibs optionally names the run's directory and
// the preload's.
func (e *env) sippRun(t sippTransport, n int, set sippSettings, round int, o options, dirLibs ...string) (row, error) {
	var dir, libs string
	var err error
	if len(dirLibs) == 2 {
		dir, libs = dirLibs[0], dirLibs[1]
	} else {
		if dir, err = os.MkdirTemp(e.work, fmt.Sprintf("sipp-%s-%d-%d-", t.Name, n, round+1)); err != nil {
			return nil, err
		}
		if t.QP != "" {
			if libs, err = e.preloadLibs(o); err != nil {
				return nil, err
			}
		}
	}
	per := sippPerProcess()
	uacs := (n + per - 1) / per
	port, err := sippPort()
	if err != nil {
		return nil, err
	}
	// Each call stays open twice the time the rate takes to open them all
	// (a UAC that falls behind the rate still has them all open at once)
	// and the plateau more; they hang up at the rate they were opened.
	ramp := time.Duration(float64(n) / float64(set.rate) * float64(time.Second))
	hold := 2*ramp + set.plateau
	timeout := 2*ramp + hold + 30*time.Second
	r := row{"clients": n, "uac_processes": uacs, "rate_cps": set.rate, "hold_ms": hold.Milliseconds(), "transport": t.Label,
		"sipp_transport": t.T, "timeout_s": int(timeout.Seconds()), "port": port}
	fail := func(s string) {
		if prev := r.str("failed"); prev != "" {
			s = prev + "; " + s
		}
		r["failed"] = s
	}

	r["loadavg"] = loadAvg()
	shrinkSlabs()
	slab0, slabErr := memstat.ReadSlab()
	uasArgs := []string{"-sn", "uas", "-t", t.T, "-i", "127.0.0.1", "-p", strconv.Itoa(port), "-nostdin",
		"-max_socket", strconv.Itoa(min(n, per) + 64), "-trace_stat", "-stf", "uas.csv", "-fd", "1"}
	uas, err := e.sippStart(dir, "uas", t, libs, uasArgs)
	if err != nil {
		return nil, err
	}
	defer uas.kill()
	up := time.Now().Add(10 * time.Second)
	for !(t.T == "un" && netnstest.UDPBound(0, port)) && !(t.T == "tn" && netnstest.TCPListening(0, port)) {
		if uas.exited() || time.Now().After(up) {
			return nil, fmt.Errorf("the UAS did not listen on port %d: %v\n%s", port, uas.err, uas.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	var procs []*sippProc
	var cmds []string
	cmds = append(cmds, strings.Join(uas.args, " "))
	for j := range uacs {
		calls := n / uacs
		if j < n%uacs {
			calls++
		}
		rate := max(1, set.rate/uacs)
		args := []string{"-sn", "uac", "-t", t.T, "-i", fmt.Sprintf("127.0.0.%d", 2+j), "-bind_local", fmt.Sprintf("127.0.0.1:%d", port),
			"-r", strconv.Itoa(rate), "-l", strconv.Itoa(calls), "-m", strconv.Itoa(calls), "-d", strconv.FormatInt(hold.Milliseconds(), 10),
			"-nostdin", "-max_socket", strconv.Itoa(calls + 64), "-trace_stat", "-stf", fmt.Sprintf("uac%d.csv", j), "-fd", "1",
			"-trace_rtt", "-rtt_freq", "1", "-trace_shortmsg", "-shortmessage_file", fmt.Sprintf("uac%d-short.log", j),
			"-timeout", fmt.Sprintf("%ds", int(timeout.Seconds())), "-timeout_error"}
		p, err := e.sippStart(dir, fmt.Sprintf("uac%d", j), t, libs, args)
		if err != nil {
			return nil, err
		}
		defer p.kill()
		procs = append(procs, p)
		cmds = append(cmds, strings.Join(p.args, " "))
	}
	r["command"] = strings.Join(cmds, " & ")

	// Sample memory until every UAC exits; the peak of both SIPp
	// processes' resident sets plus the socket slab's growth is the
	// plateau. Over the cap, the run is stopped.
	limit := memCap()
	var peak struct {
		total, uas, uac int64
		slab            memstat.Slab
		fds             int
	}
	deadline := time.Now().Add(timeout + 10*time.Second)
	for samples := 0; ; samples++ {
		all := true
		for _, p := range procs {
			all = all && p.exited()
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			fail("the UACs did not exit within their -timeout: killed")
			break
		}
		var uacRSS int64
		fds := 0
		for _, p := range procs {
			if v, err := memstat.RSS(p.cmd.Process.Pid); err == nil {
				uacRSS += v
			}
			if samples%5 == 0 { // listing 100,000 descriptors costs a core's tenth: once a second
				if d, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)); err == nil {
					fds += len(d)
				}
			}
		}
		uasRSS, _ := memstat.RSS(uas.cmd.Process.Pid)
		total := uasRSS + uacRSS
		var slab memstat.Slab
		if slabErr == nil {
			if s, err := memstat.ReadSlab(); err == nil {
				slab = s.Sub(slab0)
				total += slab.Sockets()
			}
		}
		if total > peak.total {
			peak.total, peak.uas, peak.uac, peak.slab = total, uasRSS, uacRSS, slab
		}
		peak.fds = max(peak.fds, fds)
		if uasRSS+uacRSS > limit {
			fail(fmt.Sprintf("stopped: the SIPp processes' resident sets reached %.0f MiB, over the cap of %.0f MiB (half this host's memory)",
				mib(uasRSS+uacRSS), mib(limit)))
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range procs {
		p.kill() // a no-op for those that exited
		if p.err != nil {
			fail(fmt.Sprintf("%s: %v: %s", p.name, p.err, p.why()))
		}
	}
	uas.stop()
	r["value"], r["unit"] = mib(peak.total), "MiB"
	r["rss_uas_mib"], r["rss_uac_mib"] = mib(peak.uas), mib(peak.uac)
	r["uac_fds_peak"] = peak.fds
	if slabErr != nil {
		r["slab_note"] = slabErr.Error()
	} else {
		r["slab_sockets_mib"], r["slab_total_mib"] = mib(peak.slab.Sockets()), mib(peak.slab.Total)
		for _, c := range []string{"UDP", "TCP", "sock_inode_cache", "filp", "eventpoll_epi", "tw_sock_TCP"} {
			if v := peak.slab.Caches[c]; v != 0 {
				r["slab_"+c+"_kib"] = float64(v) / 1024
			}
		}
	}

	// SIPp's own figures: calls from its statistics files, response
	// times from its message trace (µs) and its response-time trace (ms).
	var created, ok, failed, open, retrans float64
	var rts, invs, rtds []float64 // BYE to 200 OK, INVITE to 200 OK (µs), SIPp's rtd (ms)
	for j, p := range procs {
		st, err := sippStats(filepath.Join(dir, fmt.Sprintf("uac%d.csv", j)))
		if err != nil {
			fail(fmt.Sprintf("%s: no statistics: %v", p.name, err))
			continue
		}
		created += st["TotalCallCreated"]
		ok += st["SuccessfulCall(C)"]
		failed += st["FailedCall(C)"]
		retrans += st["Retransmissions(C)"]
		open += st["max CurrentCall"]
		bye, inv, err := sippResponses(filepath.Join(dir, fmt.Sprintf("uac%d-short.log", j)))
		if err != nil {
			fail(fmt.Sprintf("%s: message trace: %v", p.name, err))
		}
		rts, invs = append(rts, bye...), append(invs, inv...)
		m, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("*_%d_rtt.csv", p.cmd.Process.Pid)))
		for _, f := range m {
			got, err := sippRTT(f)
			if err != nil {
				fail(fmt.Sprintf("%s: %v", p.name, err))
			}
			rtds = append(rtds, got...)
		}
	}
	r["calls"], r["created"], r["completed"], r["failed_calls"] = n, created, ok, failed
	r["not_completed"] = float64(n) - ok - failed
	r["retransmissions"] = retrans
	r["max_open_calls"] = open
	r["responses"], r["invite_responses"], r["sipp_rtds"] = len(rts), len(invs), len(rtds)
	if len(rts) > 0 {
		r["rt_median_ms"], r["rt_p99_ms"] = quantile(rts, 0.5), quantile(rts, 0.99)
	}
	if len(invs) > 0 {
		r["invite_rt_median_ms"], r["invite_rt_p99_ms"] = quantile(invs, 0.5), quantile(invs, 0.99)
	}
	if len(rtds) > 0 {
		r["sipp_rtd_median_ms"], r["sipp_rtd_p99_ms"] = quantile(rtds, 0.5), quantile(rtds, 0.99)
	}
	if ok < float64(n) {
		fail(fmt.Sprintf("%.0f of %d calls completed, %.0f failed", ok, n, failed))
	}
	if open < float64(n) && ok == float64(n) {
		r["note"] = fmt.Sprintf("at most %.0f of %d calls were open at once (SIPp's statistics, sampled each second)", open, n)
	}

	// Under the preload, both engines must have carried the calls.
	if t.QP != "" {
		var qp string
		for _, p := range append([]*sippProc{uas}, procs...) {
			st := p.engineStats()
			if st == nil {
				fail(p.name + ": the preload's engine wrote no stats (did it load?)")
				continue
			}
			for k, v := range st { // sent, received, sockets, the receive pool's figures: whatever the engine reports
				if k != "pid" {
					r["engine_"+p.name+"_"+k] = v
				}
			}
			if s, _ := st["sent"].(float64); s == 0 && t.T == "un" {
				fail(p.name + ": its engine sent nothing: the traffic went around udiwarp")
			}
			if s, _ := st["streams"].(float64); s == 0 && t.T == "tn" {
				fail(p.name + ": its engine ran no TCP connection over RC: the traffic went around udiwarp")
			}
			if q, _ := st["qp"].(string); q != "" {
				qp = q
			}
		}
		r["engine_qp"] = qp
	}
	return r, nil
}

// why is what a SIPp that failed said: its first error (SIPp prints
// them among its screens, after a date, a time and the epoch, tab
// separated), else the first line that names an errno, with the open
// sockets its last screen counted; else its output's last line.
func (p *sippProc) why() string {
	b, _ := os.ReadFile(p.out.Name())
	var sipp, other, socks string
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSpace(l)
		if f := strings.Split(l, "\t"); sipp == "" && len(f) == 3 && strings.Contains(f[2], ": ") {
			sipp = strings.TrimSpace(f[2][strings.Index(f[2], ": ")+2:])
		} else if other == "" && strings.Contains(l, "errno") {
			other = l
		}
		if i := strings.Index(l, " open sockets"); i > 0 {
			socks = strings.TrimSpace(l[:i])
		}
	}
	msg := sipp
	if msg == "" {
		msg = other
	}
	if msg == "" {
		s := strings.TrimSpace(string(b))
		if i := strings.LastIndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
		msg = strings.TrimSpace(s)
	}
	if socks != "" {
		msg += " (" + socks + " sockets open)"
	}
	return msg
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// shrinkSlabs has the kernel release the empty slabs of the socket
// caches (root), so that the sockets of the run before, freed but still
// counted in their caches' slabs, do not make this run's growth smaller.
func shrinkSlabs() {
	for _, c := range memstat.SocketCaches {
		os.WriteFile("/sys/kernel/slab/"+c+"/shrink", []byte("1"), 0)
	}
}

// loadAvg is /proc/loadavg's first three fields: how busy the host was
// (other work on it shows here).
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// memCap is the resident memory the SIPp processes of a run may reach
// together: half of this host's.
func memCap() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		for l := range strings.Lines(string(b)) {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					return v << 10 / 2
				}
			}
		}
	}
	return 4 << 30
}

// sippStats reads a SIPp statistics file (-trace_stat -stf): the last
// line's counters by column name, and "max CurrentCall" over the lines.
func sippStats(path string) (map[string]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rd := csv.NewReader(f)
	rd.Comma, rd.FieldsPerRecord, rd.LazyQuotes = ';', -1, true
	recs, err := rd.ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) < 2 {
		return nil, fmt.Errorf("%s: no statistics line", path)
	}
	head, last := recs[0], recs[len(recs)-1]
	m := map[string]float64{}
	for i, h := range head {
		if i < len(last) {
			if v, err := strconv.ParseFloat(last[i], 64); err == nil {
				m[h] = v
			}
		}
	}
	cur := slices.Index(head, "CurrentCall")
	for _, rec := range recs[1:] {
		if cur >= 0 && cur < len(rec) {
			if v, err := strconv.ParseFloat(rec[cur], 64); err == nil {
				m["max CurrentCall"] = max(m["max CurrentCall"], v)
			}
		}
	}
	return m, nil
}

// sippResponses reads SIPp's short message trace (-trace_shortmsg: a
// line per message, tab-separated: date, time, epoch seconds with µs, S
// or R, Call-ID, CSeq, first line) and returns each call's response
// times in ms: its first BYE sent to the first 200 OK to it received,
// and its first INVITE sent to the first 200 OK to that — what SIPp's
// own response time (rtd) measures, at µs. SIPp logs no INVITE it sends
// on a TCP connection it is opening (-t tn), so over TCP only the BYE's
// request and response are there.
func sippResponses(path string) (bye, invite []float64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	type key struct{ id, cseq string }
	sent := map[key]float64{}
	done := map[key]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) < 7 || (fs[5] != "CSeq:1 INVITE" && fs[5] != "CSeq:2 BYE") {
			continue
		}
		ts, err := strconv.ParseFloat(fs[2], 64)
		if err != nil {
			continue
		}
		k := key{fs[4], fs[5]}
		switch {
		case fs[3] == "S" && !strings.HasPrefix(fs[6], "SIP/"):
			if _, ok := sent[k]; !ok {
				sent[k] = ts
			}
		case fs[3] == "R" && strings.HasPrefix(fs[6], "SIP/2.0 200"):
			if t0, ok := sent[k]; ok && !done[k] {
				done[k] = true
				if k.cseq == "CSeq:2 BYE" {
					bye = append(bye, (ts-t0)*1000)
				} else {
					invite = append(invite, (ts-t0)*1000)
				}
			}
		}
	}
	return bye, invite, sc.Err()
}

// sippRTT reads SIPp's response-time trace (-trace_rtt -rtt_freq 1:
// "Date_ms;response_time_ms;rtd_no", whole ms).
func sippRTT(path string) ([]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []float64
	for i, l := range strings.Split(string(b), "\n") {
		fs := strings.Split(strings.TrimSpace(l), ";")
		if i == 0 || len(fs) < 2 {
			continue
		}
		if v, err := strconv.ParseFloat(fs[1], 64); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// quantile of v (nearest rank; v not empty).
func quantile(v []float64, q float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// sippOK are f's rows of series s at x that ran and did not fail; when
// every round failed, those rounds (what they measured until they
// stopped), and failed says so.
func sippOK(rows []row, fig, s string, x float64) (got []row, failed bool) {
	var bad []row
	for _, r := range rows {
		if r.str("figure") != fig || r.str("series") != s || r.num("x") != x || r.str("not_available") != "" {
			continue
		}
		if r.str("failed") != "" {
			bad = append(bad, r)
			continue
		}
		got = append(got, r)
	}
	if len(got) == 0 && len(bad) > 0 {
		return bad, true
	}
	return got, false
}

// sippMedian is the median over rows of field k (false when no row has it).
func sippMedian(rows []row, k string) (float64, float64, float64, bool) {
	var v []float64
	for _, r := range rows {
		if _, ok := r[k]; ok {
			v = append(v, r.num(k))
		}
	}
	if len(v) == 0 {
		return 0, 0, 0, false
	}
	sort.Float64s(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return m, v[0], v[len(v)-1], true
}

// sippPlot draws memory (sipp.png) and the median response time
// (sipp-response.png) against clients, from the runs that completed.
func sippPlot(dir string, f *figure, rows []row) ([]plotted, error) {
	var mem, rt []row
	for _, r := range rows {
		if r.str("figure") != f.ID || r.str("not_available") != "" || r.str("failed") != "" {
			continue
		}
		mem = append(mem, r)
		if _, ok := r["rt_median_ms"]; ok {
			c := maps(r)
			c["figure"], c["value"] = f.ID+"-response", r.num("rt_median_ms")
			rt = append(rt, c)
		}
	}
	if len(mem) == 0 {
		return nil, errors.New("no SIPp run completed: nothing to draw")
	}
	out, err := plotFigure(dir, f, mem)
	if err != nil {
		return nil, err
	}
	if len(rt) > 0 {
		p, err := sippResponsePlot(dir, f, rt)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// sippResponsePlot draws the median response time per transport against
// clients, the rounds' min–max as bars, both axes logarithmic: one
// round of a loaded host can be a hundred times the others.
func sippResponsePlot(dir string, f *figure, rows []row) (plotted, error) {
	id := f.ID + "-response"
	p := newChart("SIPp basic call: median response time (BYE to 200 OK, SIPp's message trace)", f.XLabel, "median response time (ms, log scale)")
	lo, hi := math.Inf(1), 0.0
	for k, s := range f.Series {
		var xys plotter.XYs
		var errs plotter.YErrors
		for _, pt := range points(rows, id, s.Label) {
			xys = append(xys, plotter.XY{X: pt.x, Y: pt.median})
			errs = append(errs, struct{ Low, High float64 }{pt.median - pt.min, pt.max - pt.median})
			lo, hi = min(lo, pt.min), max(hi, pt.max)
		}
		if len(xys) == 0 {
			continue
		}
		if err := p.series(k, s.Label, xys, errs); err != nil {
			return plotted{}, err
		}
	}
	if hi == 0 {
		return plotted{}, errors.New("no response times to draw")
	}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{}
	p.Y.Min, p.Y.Max = lo/2, hi*2
	p.tickAtData(true, number)
	if err := p.save(dir, id); err != nil {
		return plotted{}, err
	}
	return plotted{fig: f.ID, name: id, title: p.Title.Text}, nil
}

func maps(r row) row {
	c := make(row, len(r))
	for k, v := range r {
		c[k] = v
	}
	return c
}

// sippTable writes the SIPp table: per client count and transport, the
// memory (median of the rounds, [min–max]) and its parts, response
// times, calls; then ours beside the seed's two figures.
func sippTable(b *bytes.Buffer, f *figure, rows []row) {
	b.WriteString("| clients | transport | memory (MiB) | UAS RSS | UAC RSS | socket slab | response median (ms) | response p99 (ms) | " +
		"SIPp rtd median / p99 (ms) | open at once | calls completed / failed / of |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	xs := map[float64]bool{}
	for _, r := range rows {
		if r.str("figure") == f.ID {
			xs[r.num("x")] = true
		}
	}
	val := func(rs []row, k string, ranged bool) string {
		m, lo, hi, ok := sippMedian(rs, k)
		switch {
		case !ok:
			return "–"
		case ranged && len(rs) > 1:
			return fmt.Sprintf("%s [%s–%s]", fmtV(m), fmtV(lo), fmtV(hi))
		}
		return fmtV(m)
	}
	var notes []string
	for _, x := range sortedKeys(xs) {
		for _, s := range f.Series {
			na := ""
			for _, r := range rows {
				if r.str("figure") == f.ID && r.str("series") == s.Label && r.num("x") == x && r.str("not_available") != "" {
					na = r.str("not_available")
				}
			}
			if na != "" {
				fmt.Fprintf(b, "| %d | %s | not available: %s | | | | | | | | |\n", int(x), s.Label, na)
				continue
			}
			rs, failed := sippOK(rows, f.ID, s.Label, x)
			if len(rs) == 0 {
				continue
			}
			var done, bad, of float64
			for _, r := range rows {
				if r.str("figure") == f.ID && r.str("series") == s.Label && r.num("x") == x && r.str("not_available") == "" {
					done += r.num("completed")
					bad += r.num("failed_calls")
					of += r.num("calls")
					if fl := r.str("failed"); fl != "" {
						notes = append(notes, fmt.Sprintf("%s, %d clients, round %d: %s", s.Label, int(x), int(r.num("round")), fl))
					}
				}
			}
			label := s.Label
			if failed {
				label += " (every round failed: what it measured)"
			}
			openMin, _, _, _ := sippMedian(rs, "max_open_calls")
			for _, r := range rs {
				openMin = min(openMin, r.num("max_open_calls"))
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s / %s | %.0f | %.0f / %.0f / %.0f |\n", int(x), label,
				val(rs, "value", true), val(rs, "rss_uas_mib", false), val(rs, "rss_uac_mib", false), val(rs, "slab_sockets_mib", false),
				val(rs, "rt_median_ms", true), val(rs, "rt_p99_ms", true), val(rs, "sipp_rtd_median_ms", false), val(rs, "sipp_rtd_p99_ms", false),
				openMin, done, bad, of)
		}
	}
	b.WriteString("\nMemory is the peak, sampled every 200 ms, of both SIPp processes' resident sets (VmRSS: the whole process, " +
		"the preload's engine included) plus the growth of the kernel's socket slab caches since before the UAS started " +
		"(internal/memstat.SocketCaches; root only). Response time is each call's BYE sent to its 200 OK received, from " +
		"SIPp's own message trace (-trace_shortmsg, µs): a request and its response on the call's own socket, for UDP and TCP alike " +
		"(SIPp does not log an INVITE it sends while its TCP connection opens; runs.csv has INVITE to 200 OK for UDP). " +
		"SIPp's rtd is its own response-time statistic, INVITE to 200 OK (-trace_rtt), in whole milliseconds of SIPp's own " +
		"clock, which it reads once per scheduling loop: 0 is a response in the same tick, and the other values are the " +
		"ticks' multiples (on this host 4 ms), not measurements finer than that; the µs columns before it are the measure. " +
		"Open at once: the fewest, over the rounds, of the most calls SIPp's statistics (each second) saw open together; " +
		"calls that all open and close between two of its samples (few clients at hundreds of calls a second) show 0. " +
		"Calls: SIPp's statistics file, summed over the rounds.\n\n")
	if len(notes) > 0 {
		b.WriteString("What went wrong:\n\n")
		for _, n := range notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
		b.WriteString("\n")
	}
	// Ours beside the seed's: datagram against the stream (RC) transport.
	var cmp []string
	for _, x := range sortedKeys(xs) {
		// The seed's comparison (datagram against RC, both through the
		// socket interface), then each against plain kernel TCP.
		for _, pair := range [][2]string{{"preload-ud", "preload-rc"}, {"preload-rd", "preload-rc"}, {"kernel-udp", "kernel-tcp"},
			{"preload-ud", "kernel-tcp"}, {"preload-rd", "kernel-tcp"}, {"preload-rc", "kernel-tcp"}} {
			d, failed := sippOK(rows, f.ID, pair[0], x)
			base, bfailed := sippOK(rows, f.ID, pair[1], x)
			if failed || bfailed || len(d) == 0 || len(base) == 0 {
				continue
			}
			m1, _, _, ok1 := sippMedian(d, "value")
			m2, _, _, ok2 := sippMedian(base, "value")
			r1, _, _, ok3 := sippMedian(d, "rt_median_ms")
			r2, _, _, ok4 := sippMedian(base, "rt_median_ms")
			if ok1 && ok2 && m2 > 0 {
				line := fmt.Sprintf("%d clients, %s against %s: memory %+.1f %%", int(x), pair[0], pair[1], (m1/m2-1)*100)
				if ok3 && ok4 && r2 > 0 {
					line += fmt.Sprintf(", median response time %+.1f %%", (r1/r2-1)*100)
				}
				cmp = append(cmp, line)
			}
		}
	}
	if len(cmp) > 0 {
		b.WriteString("Datagram against stream (seed 003: datagram-iWARP −24.1 % memory at 10,000 clients, −43.1 % response time " +
			"under light load, against RC-iWARP):\n\n")
		for _, c := range cmp {
			fmt.Fprintf(b, "- %s\n", c)
		}
		b.WriteString("\n")
	}
}
