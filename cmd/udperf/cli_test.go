package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/qp"
)

// TestRefusedInOneLine: every flag or value refused is one line on
// stderr naming it, exit 2, nothing on stdout, and nothing measured.
func TestRefusedInOneLine(t *testing.T) {
	defer watchRuns(t)()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"local", "-bogus"}, "-bogus"},
		{[]string{"local", "--bogus"}, "-bogus"},
		{[]string{"local", "-s", "big"}, "-s"},
		{[]string{"local", "-D", "soon"}, "-D"},
		{[]string{"local", "-D", "-3"}, "-D"},
		{[]string{"local", "-n"}, "-n"},
		{[]string{"local", "-n", "0"}, "-n"},
		{[]string{"local", "-d", "mlx5_0"}, "no device to pick"},
		{[]string{"local", "-i", "1"}, "no device port"},
		{[]string{"client", "-d", "mlx5_0", "-addr", "127.0.0.1:1"}, "use -addr"},
		{[]string{"local", "-json", "-csv"}, "-json and -csv"},
		{[]string{"local", "-mode", "ud-send", "-test", "bw", "-s", "65536"}, "-s 65536: ud-send carries at most 65485 bytes"},
		{[]string{"local", "-mode", "raw-udp", "-s", "65508"}, "-s 65508: raw-udp"},
		// What perf.Config.Check refuses: settings a mode would ignore.
		{[]string{"local", "-mode", "raw-tcp", "-test", "bw", "-loss", "0.1"}, "-loss: raw-tcp has no impairment layer"},
		{[]string{"local", "-mode", "rc-send", "-test", "bw", "-loss", "0.1"}, "-loss: rc-send has no impairment layer"},
		{[]string{"local", "-mode", "rc-send", "-qps", "2"}, "-qps 2: rc-send runs one QP pair"},
		{[]string{"local", "-mode", "ud-send", "-partial"}, "-partial: only ud-wr"},
		{[]string{"local", "-mode", "ud-send", "-mtu", "1000"}, "-mtu: ud-send sends each message whole"},
		{[]string{"local", "-mode", "rc-write", "-poll", "event"}, "-poll: rc-write lat watches memory"},
		{[]string{"local", "-mode", "raw-tcp", "-nocrc"}, "no CRC: raw-tcp has none to skip"},
		{[]string{"compare", "-modes", "ud-wr,rc-write", "-test", "bw", "-loss", "0.1"}, "-loss: rc-write has no impairment layer"},
		{[]string{"local", "rd-send"}, "did you mean -mode rd-send?"},
		{[]string{"local", "-mode", "rd-send", "extra"}, `unexpected argument "extra"`},
		{[]string{"compare", "rd-send,ud-send"}, "did you mean -modes rd-send,ud-send?"},
		{[]string{"compare", "-modes", "raw-udp,ud-send,raw-tcp", "-s", "65500"}, "mode ud-send: -s 65500"},
		{[]string{"compare", "-modes", "ud-send,nope"}, `-modes: unknown mode "nope"`},
		{[]string{"compare"}, "-modes M1,M2,... is required"},
		{[]string{"compare", "-modes", "ud-send@64000,ud-wr@x", "-test", "bw"}, `"ud-wr@x": the size after @ is a number of bytes`},
		{[]string{"compare", "-modes", "ud-send@70000,ud-wr", "-test", "bw"}, "mode ud-send: -s 70000: ud-send carries at most 65485 bytes"},
		{[]string{"compare", "-modes", "ud-send@64,raw-udp", "-a"}, "a mode's own size and -a together"},
		{[]string{"local", "-mode", "ud-send", "-rate", "10"}, "-rate: paces datagram bandwidth runs"},
		{[]string{"local", "-mode", "rc-send", "-test", "bw", "-rate", "10"}, "-rate: paces datagram bandwidth runs"},
		{[]string{"local", "-mode", "ud-send", "-test", "bw", "-rate", "-1"}, "-rate -1"},
		{[]string{"compare", "-modes", "ud-send", "-rounds", "0"}, "-rounds"},
		{[]string{"local", "-e", "-poll", "busy"}, "-e (event polling) and -poll busy"},
		{[]string{"local", "-bidir"}, "-bidir is for -test bw and rate"},
		{[]string{"local", "-D", "3"}, "-D: a lat run is -n round trips"},
		{[]string{"local", "-test", "bw", "-n", "5", "-D", "1"}, "-n and -D: a bw or rate run sends -n messages or lasts -D, not both"},
		{[]string{"local", "-test", "throughput", "-n", "5"}, "-n: each trial of a throughput search lasts -D"},
		{[]string{"client", "-addr", "127.0.0.1:1", "-test", "bw", "-n", "5"}, "-n: a server times its bw and rate runs by -D"},
		{[]string{"local", "-test", "rate", "-w", "5"}, "-w: a bw or rate run has no warm-up"},
		{[]string{"local", "-a", "-s", "5"}, "-a and -s together"},
		{[]string{"local", "-mode", "ud-wr", "-deadline", "1s"}, "-deadline is the deadline of -partial"},
		{[]string{"local", "-mode", "ud-wr", "-seed", "3"}, "-seed seeds the losses of -loss"},
		{[]string{"local", "-llp", "xdp"}, "-llp xdp: AF_XDP never attaches to loopback"},
		{[]string{"local", "-mode", "raw-xdp"}, "raw-xdp: AF_XDP never attaches to loopback"},
		{[]string{"compare", "-modes", "raw-udp,ud-send", "-llp", "xdp"}, "AF_XDP never attaches to loopback"},
		{[]string{"local", "-llp-fallback"}, "-llp-fallback falls back from -llp xdp"},
		{[]string{"client", "-addr", "127.0.0.1:1", "-mode", "raw-udp", "-llp", "xdp"}, "-llp xdp: raw-udp is the kernel socket's baseline; AF_XDP's is raw-xdp"},
		{[]string{"client", "-addr", "127.0.0.1:1", "-llp", "dpdk"}, `-llp "dpdk": want udp or xdp`},
		{[]string{"server", "-llp", "dpdk"}, `-llp "dpdk": want udp or xdp`},
		{[]string{"server", "-llp-fallback"}, "-llp-fallback falls back from -llp xdp"},
		{[]string{"local", "rd-send,ud-send"}, "did you mean udperf compare -modes rd-send,ud-send?"},
		{[]string{"client", "-addr", "127.0.0.1:1", "-D", "3"}, "-D: a lat run"},
		{[]string{"local", "-mode", "nope"}, `unknown mode "nope"`},
		{[]string{"local", "-poll", "sometimes"}, "-poll"},
		{[]string{"local", "-loss", "2"}, "-loss"},
		{[]string{"client", "-addr", "127.0.0.1:1", "-qps", "2"}, "-qps does not apply to client"},
		{[]string{"client", "-addr", "127.0.0.1:1", "stray"}, `unexpected argument "stray"`},
		{[]string{"server", "-bogus"}, "-bogus"},
		{[]string{"server", "-d", "mlx5_0"}, "-d: udiwarp has no device to pick"},
		{[]string{"server", "extra"}, `unexpected argument "extra"`},
		{[]string{"demo", "-bogus"}, "-bogus"},
		{[]string{"decode", "-bogus"}, "-bogus"},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		if code != 2 || out.Len() != 0 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line saying %q", tc.args, code, out.String(), errb.String(), tc.says)
		}
	}
}

// watchRuns makes any measurement fail the test (for tests of what is
// refused before anything runs); the returned function restores measure.
func watchRuns(t *testing.T) func() {
	old := measure
	measure = func(c perf.Config) (perf.Result, error) {
		t.Errorf("%s %d B ran; it should have been refused", c.Mode, c.Size)
		return perf.Result{}, fmt.Errorf("refused")
	}
	return func() { measure = old }
}

// TestHelp: -h prints the command's usage on stdout, listing only the
// flags it acts on, and exits 0.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		cmd        string
		has, hasnt []string
	}{
		{"local", []string{"-mode", "-D seconds", "-e", "-F", "-report_gbits", "-bidir", "-loss"}, []string{"-modes", "-rounds", "-addr", "-d\n", "-i\n"}},
		{"compare", []string{"-modes", "-rounds", "-D seconds"}, []string{"-mode ", "-addr"}},
		{"client", []string{"-addr", "-mode", "-s", "-D seconds", "-e", "-loss", "-seed", "-partial", "-deadline", "-metrics", "-mtu", "-llp", "raw-xdp"}, []string{"-bidir", "-qps", "-modes"}},
		{"server", []string{"-addr", "-once", "-metrics", "-llp", "-llp-fallback"}, []string{"-mode", "-s "}},
		{"decode", []string{"-stream", "xxd -p"}, []string{"-mode"}},
		{"demo", []string{"-quick"}, []string{"-mode"}},
	} {
		var out, errb bytes.Buffer
		if code := run([]string{tc.cmd, "-h"}, &out, &errb); code != 0 || errb.Len() != 0 {
			t.Errorf("%s -h: exit %d, stderr %q", tc.cmd, code, errb.String())
		}
		for _, s := range tc.has {
			if !strings.Contains(out.String(), s) {
				t.Errorf("%s -h lacks %q:\n%s", tc.cmd, s, out.String())
			}
		}
		for _, s := range tc.hasnt {
			if strings.Contains(out.String(), s) {
				t.Errorf("%s -h lists %q:\n%s", tc.cmd, s, out.String())
			}
		}
	}
}

// TestPerftestHabits: -D 3 is 3 seconds and -D 500ms half of one; -e is
// -poll event; -F and --report_gbits are accepted; long forms work. The
// settings reach the run (seen by measure) and the JSON.
func TestPerftestHabits(t *testing.T) {
	old := measure
	defer func() { measure = old }()
	var got []perf.Config
	measure = func(c perf.Config) (perf.Result, error) {
		got = append(got, c)
		return perf.Result{Config: c, Received: 1, Gbps: 1, Mpps: 1}, nil
	}
	for _, tc := range []struct {
		args []string
		dur  time.Duration
		poll qp.PollMode
	}{
		{[]string{"-D", "3"}, 3 * time.Second, qp.PollBusy},
		{[]string{"-D", "0.25"}, 250 * time.Millisecond, qp.PollBusy},
		{[]string{"-D", "500ms"}, 500 * time.Millisecond, qp.PollBusy},
		{[]string{"--D=2", "-e"}, 2 * time.Second, qp.PollEvent},
		{[]string{"-e", "-poll", "event", "-F", "--report_gbits"}, time.Second, qp.PollEvent},
		{[]string{"--poll", "event"}, time.Second, qp.PollEvent},
	} {
		got = nil
		var out, errb bytes.Buffer
		args := append([]string{"local", "-test", "bw", "-json"}, tc.args...)
		if code := run(args, &out, &errb); code != 0 || len(got) != 1 || got[0].Duration != tc.dur || got[0].Poll != tc.poll {
			t.Errorf("%q: exit %d, stderr %q, ran %+v", tc.args, code, errb.String(), got)
			continue
		}
		var doc struct {
			Flags   map[string]any
			Results []map[string]any
		}
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.Flags["D"] != tc.dur.Seconds() || doc.Flags["poll"] != tc.poll.String() || doc.Results[0]["duration_s"] != tc.dur.Seconds() || doc.Results[0]["poll"] != tc.poll.String() {
			t.Errorf("%q: flags %v, row %v", tc.args, doc.Flags, doc.Results[0])
		}
	}
}

// TestJSONTypes: the flags are JSON numbers and booleans, and each row
// records its poll and the settings that shaped it.
func TestJSONTypes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"local", "-mode", "ud-wr", "-test", "lat", "-s", "300", "-n", "30", "-w", "3", "-poll", "event", "-mtu", "100", "-partial", "-deadline", "20ms", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct {
		Flags   map[string]any
		Results []map[string]any
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"s": 300.0, "n": 30.0, "w": 3.0, "mtu": 100.0, "loss": 0.0, "seed": 1.0, "partial": true, "deadline": 0.02,
		"bidir": false, "json": true, "csv": false, "mode": "ud-wr", "poll": "event", "test": "lat", "qps": 1.0, "a": false, "metrics": ""}
	for k, v := range want {
		if doc.Flags[k] != v {
			t.Errorf("flags[%q] = %#v, want %#v", k, doc.Flags[k], v)
		}
	}
	for _, k := range []string{"e", "F", "report_gbits", "d", "i", "D"} { // -D: a latency run does not act on it
		if _, ok := doc.Flags[k]; ok {
			t.Errorf("flags has %q: %v", k, doc.Flags)
		}
	}
	r := doc.Results[0]
	wantRow := map[string]any{"mode": "ud-wr", "test": "lat", "poll": "event", "bytes": 300.0, "n": 30.0, "warmup": 3.0, "qps": 1.0, "mtu": 100.0,
		"loss": 0.0, "seed": 1.0, "partial": true, "deadline_s": 0.02, "bidir": false}
	for k, v := range wantRow {
		if r[k] != v {
			t.Errorf("row[%q] = %#v, want %#v", k, r[k], v)
		}
	}
	if _, ok := r["duration_s"]; ok {
		t.Errorf("a latency row has a duration: %v", r)
	}

	// Loss and its seed, on a mode that acts on them, and a bandwidth
	// row's duration.
	out.Reset()
	if code := run([]string{"local", "-mode", "rd-send", "-test", "bw", "-s", "1000", "-D", "200ms", "-loss", "0.01", "-seed", "7", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	doc.Flags, doc.Results = nil, nil
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"loss": 0.01, "seed": 7.0, "D": 0.2, "test": "bw"} {
		if doc.Flags[k] != v {
			t.Errorf("flags[%q] = %#v, want %#v", k, doc.Flags[k], v)
		}
	}
	r = doc.Results[0]
	for k, v := range map[string]any{"mode": "rd-send", "loss": 0.01, "seed": 7.0, "duration_s": 0.2, "bytes": 1000.0} {
		if r[k] != v {
			t.Errorf("bw row[%q] = %#v, want %#v", k, r[k], v)
		}
	}
	if _, ok := r["n"]; ok {
		t.Errorf("a bandwidth row has an iteration count setting: %v", r)
	}
}

// recorder is a stdout that notes, with each write, how many runs had
// started: the order of runs and output, without a clock.
type recorder struct {
	mu     sync.Mutex
	runs   int
	writes []write
}

type write struct {
	runs int // runs started when the write came
	text string
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, write{r.runs, string(b)})
	return len(b), nil
}

// counting wraps measure so that rec counts the runs started.
func counting(rec *recorder) func() {
	old := measure
	measure = func(c perf.Config) (perf.Result, error) {
		rec.mu.Lock()
		rec.runs++
		rec.mu.Unlock()
		return old(c)
	}
	return func() { measure = old }
}

// lines is what rec received, line by line, each with the runs started
// when its write came.
func (r *recorder) lines() []write {
	var out []write
	for _, w := range r.writes {
		for _, l := range strings.SplitAfter(w.text, "\n") {
			if l != "" {
				out = append(out, write{w.runs, strings.TrimSuffix(l, "\n")})
			}
		}
	}
	return out
}

// TestRowsAsTheyFinish: the table and the CSV print the header before the
// first run and each row once its run is done, before the next begins;
// compare prints a size's rows once that size's rounds are done; JSON is
// one document at the end.
func TestRowsAsTheyFinish(t *testing.T) {
	for _, format := range []string{"", "-csv"} {
		t.Run("local"+format, func(t *testing.T) {
			rec := &recorder{}
			defer counting(rec)()
			args := []string{"local", "-mode", "raw-udp", "-a", "-n", "20", "-w", "2", "-poll", "event"}
			if format != "" {
				args = append(args, format)
			}
			var errb bytes.Buffer
			if code := run(args, rec, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			ls := rec.lines()
			// The header goes out with the first row (a run refused before it
			// measured anything prints its error alone).
			if len(ls) != 1+15 || ls[0].runs != 1 {
				t.Fatalf("%d lines; the header after %d runs: %+v", len(ls), ls[0].runs, ls)
			}
			for i, l := range ls[1:] {
				if l.runs != i+1 {
					t.Fatalf("row %d (%q) was printed after %d runs had started, want %d", i+1, l.text, l.runs, i+1)
				}
			}
			if format == "-csv" {
				recs, err := csv.NewReader(strings.NewReader(joinLines(ls))).ReadAll()
				if err != nil || recs[0][0] != "mode" || recs[1][0] != "raw-udp" || recs[1][1] != "2" || recs[15][1] != "32768" {
					t.Fatalf("CSV %v: %v", err, recs)
				}
			} else if f := strings.Fields(ls[1].text); len(f) != 9 || f[0] != "2" || f[1] != "20" {
				t.Fatalf("table row %q", ls[1].text)
			}
		})
	}
	t.Run("compare", func(t *testing.T) {
		rec := &recorder{}
		defer counting(rec)()
		var errb bytes.Buffer
		if code := run([]string{"compare", "-modes", "raw-udp,ud-send", "-rounds", "2", "-a", "-n", "20", "-w", "2", "-poll", "event", "-csv"}, rec, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		ls := rec.lines()
		if len(ls) != 1+2*15 || ls[0].text != "mode,bytes,iterations,t_min[usec],t_max[usec],t_typical[usec],t_avg[usec],t_stdev[usec],99% percentile[usec],99.9% percentile[usec],ratio,spread_pct" {
			t.Fatalf("%+v", ls)
		}
		for i, l := range ls[1:] {
			size := i / 2
			if want := (size + 1) * 4; l.runs != want { // 2 modes x 2 rounds per size
				t.Fatalf("row %d (%q) was printed after %d runs, want %d", i+1, l.text, l.runs, want)
			}
			f := strings.Split(l.text, ",")
			if f[0] != []string{"raw-udp", "ud-send"}[i%2] || f[1] != strconv.Itoa(2<<size) || (i%2 == 0 && f[10] != "1.000") {
				t.Fatalf("row %d: %q", i+1, l.text)
			}
			if _, err := strconv.ParseFloat(f[11], 64); err != nil {
				t.Fatalf("row %d: spread %q", i+1, f[11])
			}
		}
	})
	t.Run("json", func(t *testing.T) {
		rec := &recorder{}
		defer counting(rec)()
		var errb bytes.Buffer
		if code := run([]string{"local", "-mode", "raw-udp", "-a", "-n", "20", "-w", "2", "-poll", "event", "-json"}, rec, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		var doc document
		if len(rec.writes) != 1 || rec.writes[0].runs != 15 || json.Unmarshal([]byte(rec.writes[0].text), &doc) != nil || len(doc.Results) != 15 {
			t.Fatalf("%d writes: %+v", len(rec.writes), rec.writes)
		}
	})
}

func joinLines(ls []write) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

// TestSpreadWarning: rounds that disagree by more than 20 % are named on
// stderr, and every row carries its spread.
func TestSpreadWarning(t *testing.T) {
	old := measure
	defer func() { measure = old }()
	round := 0
	measure = func(c perf.Config) (perf.Result, error) {
		r, err := old(c)
		if c.Mode == perf.ModeUDSend {
			round++
			r.Median = float64(round) // 1, 2, 3: (3-1)/2 = 100 %
		} else {
			r.Median = 5 // no spread
		}
		return r, err
	}
	var out, errb bytes.Buffer
	if code := run([]string{"compare", "-modes", "raw-udp,ud-send", "-rounds", "3", "-n", "20", "-w", "2", "-poll", "event", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if errb.String() != "udperf compare: ud-send 64 B: its 3 rounds disagree by 100% ((max-min)/median); more -rounds or a quieter machine would tell\n" {
		t.Fatalf("stderr %q", errb.String())
	}
	var doc document
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if r := doc.Results; len(r) != 2 || *r[0].Spread != 0 || *r[1].Spread != 100 || *r[1].Ratio != 0.4 || r[1].Rounds != 3 {
		t.Fatalf("%+v", r)
	}
}

// TestInterrupt: SIGINT in the middle of a sweep ends it after the run in
// progress; the rows measured are printed (the table: well-formed rows;
// JSON: a valid document marked interrupted with at least one result),
// and the exit code is 130.
func TestInterrupt(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "udperf")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	for _, format := range []string{"table", "json", "compare"} {
		t.Run(format, func(t *testing.T) {
			args := []string{"local", "-a", "-mode", "raw-udp", "-test", "lat", "-n", "2000"}
			switch format {
			case "json":
				args = append(args, "-json")
			case "compare":
				args = []string{"compare", "-a", "-modes", "raw-udp,raw-udp-unconn", "-rounds", "2", "-test", "lat", "-n", "2000", "-csv"}
			}
			cmd := exec.Command(bin, args...)
			var errb bytes.Buffer
			cmd.Stderr = &errb
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			defer func() { cmd.Process.Kill(); <-done }()
			lines := make(chan string, 100)
			var all bytes.Buffer
			go func() {
				defer close(done)
				defer close(lines)
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					all.WriteString(sc.Text() + "\n")
					lines <- sc.Text()
				}
			}()
			// The table: wait for the header and a row. JSON prints at the
			// end: wait until a run has opened its sockets (the handler is
			// installed before the first run).
			deadline := time.After(2 * time.Minute) // only a hung run gets here
			if format != "json" {
				for n := 0; n < 2; n++ {
					select {
					case _, ok := <-lines:
						if !ok {
							t.Fatalf("stdout ended early: %s", errb.String())
						}
					case <-deadline:
						t.Fatal("no row")
					}
				}
			} else {
				for !hasSocket(cmd.Process.Pid) {
					select {
					case <-deadline:
						t.Fatal("no run started")
					case <-time.After(time.Millisecond):
					}
				}
			}
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			for range lines {
			}
			err = cmd.Wait()
			if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
				t.Fatalf("exit %d (%v), want 130; stderr %q, stdout:\n%s", code, err, errb.String(), all.String())
			}
			if !strings.Contains(errb.String(), "interrupted") {
				t.Fatalf("stderr %q", errb.String())
			}
			if format == "json" {
				var doc document
				if err := json.Unmarshal(all.Bytes(), &doc); err != nil || !doc.Interrupted || len(doc.Results) < 1 || len(doc.Results) >= 15 {
					t.Fatalf("%v: %s", err, all.String())
				}
				for i, r := range doc.Results {
					if r.Bytes != 2<<i || r.Iterations != 2000 || r.TTypical <= 0 {
						t.Fatalf("result %d: %+v", i, r)
					}
				}
				return
			}
			ls := strings.Split(strings.TrimSuffix(all.String(), "\n"), "\n")
			if format == "compare" {
				// Whole sizes: each with both modes.
				recs, err := csv.NewReader(strings.NewReader(all.String())).ReadAll()
				if err != nil || len(recs) < 3 || len(recs)%2 != 1 || len(recs) >= 1+2*15 {
					t.Fatalf("%v: %s", err, all.String())
				}
				for i, r := range recs[1:] {
					if r[0] != []string{"raw-udp", "raw-udp-unconn"}[i%2] || r[1] != strconv.Itoa(2<<(i/2)) || r[2] != "2000" {
						t.Fatalf("row %d: %q", i+1, r)
					}
				}
				return
			}
			if len(ls) < 2 || len(ls) >= 16 || !strings.HasPrefix(strings.TrimSpace(ls[0]), "bytes") {
				t.Fatalf("stdout:\n%s", all.String())
			}
			for i, l := range ls[1:] {
				f := strings.Fields(l)
				if len(f) != 9 || f[0] != strconv.Itoa(2<<i) || f[1] != "2000" {
					t.Fatalf("row %d %q", i+1, l)
				}
				for _, v := range f[2:] {
					if _, err := strconv.ParseFloat(v, 64); err != nil {
						t.Fatalf("row %d %q", i+1, l)
					}
				}
			}
		})
	}
}

// hasSocket says whether process pid has a socket open.
func hasSocket(pid int) bool {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			return true
		}
	}
	return false
}

// TestCompareNoCRC: compare -nocrc runs the plain-socket baseline as it
// is and the RC mode without MPA CRC, which the RC connection itself
// negotiated (its FPDUs carry no CRC: the row's no_crc, and the devices'
// bad-CRC counter never moves, are not enough, so the test asks the
// connection).
func TestCompareNoCRC(t *testing.T) {
	var out, errb bytes.Buffer
	var negotiated []bool
	perf.OnRCConnected = func(crc bool) { negotiated = append(negotiated, crc) }
	defer func() { perf.OnRCConnected = nil }()
	if code := run([]string{"compare", "-modes", "raw-tcp,rc-send", "-nocrc", "-test", "lat", "-s", "64", "-n", "20", "-w", "2", "-rounds", "1", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct{ Results []map[string]any }
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, r := range doc.Results {
		got[r["mode"].(string)] = r["no_crc"]
	}
	if got["raw-tcp"] != false || got["rc-send"] != true {
		t.Fatalf("no_crc by mode: %v", got)
	}
	if len(negotiated) == 0 {
		t.Fatal("no RC connection reported its CRC: the test does not reach the negotiation")
	}
	for _, crc := range negotiated {
		if crc {
			t.Fatalf("an RC connection of compare -nocrc negotiated CRC: %v", negotiated)
		}
	}
}

// TestSweepScalesIterations: an -a latency sweep caps each size's round
// trips by the bytes they move, as perftest does (8 MiB: 100 where -n is
// 10000), so a sweep of every size ends in about a minute, not in more
// than 13; and with stderr a file (a log), not a terminal, it says run by
// run how far it is, where -json prints nothing until the end.
func TestSweepScalesIterations(t *testing.T) {
	f := benchFlags{iters: 10000, warmup: 1000, all: true, test: "lat", poll: "busy", qps: 1, rounds: 1}
	cfgs, err := f.configs(perf.ModeRawTCP)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfgs {
		want := 10000
		switch c.Size {
		case 1 << 20:
			want = 625
		case 8 << 20:
			want = 100
		}
		if c.Size <= 64<<10 && c.Iters != 10000 || (c.Size == 1<<20 || c.Size == 8<<20) && c.Iters != want {
			t.Errorf("%d B: %d iterations, want %d", c.Size, c.Iters, want)
		}
		if c.Iters < 100 || c.Warmup > c.Iters {
			t.Errorf("%d B: %d iterations, %d warm-up", c.Size, c.Iters, c.Warmup)
		}
	}
	log, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := run([]string{"compare", "-modes", "raw-udp,ud-send", "-s", "64", "-n", "20", "-w", "2", "-rounds", "2", "-json"}, &out, log); code != 0 {
		t.Fatalf("exit %d", code)
	}
	b, _ := os.ReadFile(log.Name())
	if !strings.Contains(string(b), "udperf: 4 of 4 runs done") {
		t.Fatalf("stderr, a file: %q", b)
	}
}

// TestJSONFlagsOfABandwidthRun: a bw run's JSON flags hold -D, which it
// acts on, and not -n and -w, which it does not.
func TestJSONFlagsOfABandwidthRun(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"local", "-mode", "raw-udp", "-test", "bw", "-D", "0.1", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct{ Flags map[string]any }
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Flags["D"] != 0.1 {
		t.Errorf("flags[D] = %v", doc.Flags["D"])
	}
	for _, k := range []string{"n", "w"} {
		if _, ok := doc.Flags[k]; ok {
			t.Errorf("a bw run's flags list -%s: %v", k, doc.Flags)
		}
	}
}

// TestBandwidthRunOfMessages: -n bounds a bw run as perftest's does: the
// JSON row carries n and no duration, the flags list -n and not -D, and
// every message sent (rd-send loses none) is received, in local and in
// compare.
func TestBandwidthRunOfMessages(t *testing.T) {
	for _, args := range [][]string{
		{"local", "-mode", "rd-send", "-test", "bw", "-s", "1000", "-n", "700", "-json"},
		{"compare", "-modes", "raw-tcp,rd-send", "-rounds", "1", "-test", "rate", "-s", "1000", "-n", "700", "-json"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		var doc struct {
			Flags map[string]any
			Rows  []map[string]any `json:"results"`
		}
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.Flags["n"] != 700.0 {
			t.Errorf("%v: flags[n] = %v", args, doc.Flags["n"])
		}
		if _, ok := doc.Flags["D"]; ok {
			t.Errorf("%v: a run of -n messages lists -D: %v", args, doc.Flags)
		}
		if len(doc.Rows) == 0 {
			t.Fatalf("%v: no rows: %s", args, out.String())
		}
		for _, r := range doc.Rows {
			if r["n"] != 700.0 || r["iterations"] != 700.0 {
				t.Errorf("%v: row n %v, iterations %v, want 700 each: %v", args, r["n"], r["iterations"], r)
			}
			if _, ok := r["duration_s"]; ok {
				t.Errorf("%v: row has a duration: %v", args, r)
			}
		}
	}
}

// TestCompareRatioIsOfRounds: compare's ratio is the median of the
// per-round ratios, kept in the JSON beside each round's figure, and the
// table's footer says so (a ratio that is not the ratio of the medians
// printed beside it looked wrong to a new user).
func TestCompareRatioIsOfRounds(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"compare", "-modes", "raw-udp,ud-send", "-s", "64", "-n", "30", "-w", "2", "-rounds", "3", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct {
		Results []struct {
			Mode         string
			Ratio        float64
			TTypical     float64   `json:"t_typical_us"`
			RoundFigures []float64 `json:"round_figures"`
			RoundRatios  []float64 `json:"round_ratios"`
		}
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	base := doc.Results[0]
	for _, r := range doc.Results {
		if len(r.RoundFigures) != 3 || len(r.RoundRatios) != 3 {
			t.Fatalf("%s: %v, %v", r.Mode, r.RoundFigures, r.RoundRatios)
		}
		v := slices.Clone(r.RoundRatios)
		slices.Sort(v)
		if r.Ratio != v[1] {
			t.Fatalf("%s: ratio %v, per-round ratios %v", r.Mode, r.Ratio, r.RoundRatios)
		}
		for i := range 3 {
			if want := r.RoundFigures[i] / base.RoundFigures[i]; math.Abs(r.RoundRatios[i]-want) > 1e-9 {
				t.Fatalf("%s round %d: ratio %v, figures say %v", r.Mode, i, r.RoundRatios[i], want)
			}
		}
	}
	out.Reset()
	if code := run([]string{"compare", "-modes", "raw-udp,ud-send", "-s", "64", "-n", "30", "-w", "2", "-rounds", "3"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "ratio: the median of the rounds' ratios") {
		t.Fatalf("exit %d, table:\n%s", code, out.String())
	}
}
