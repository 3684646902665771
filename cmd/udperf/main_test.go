package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"UD send", []string{"decode", "42 43 00 00 00 06 00 00 00 14 00 00 00 01 00 00 00 00 68 69 8f fc cd 02"}, 0,
			"Send DV=2 L dstQP=5 queue=send srcQP=6 MSN=1 MO=0 payload=2", ""},
		{"bad CRC", []string{"decode", "42430000000600000015000000010000000068698ffccd02"}, 1,
			"", "CRC mismatch"},
		{"stream read request", []string{"decode", "-stream",
			"41 41 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 00 00 0a 01 00 00 7f 00 00 00 10 00 00 00 10 00 00 00 0b 02 00 00 7f 00 00 20 00 00"}, 0,
			"RDMA Read Request DV=1 L QN=1 MSN=1 MO=0 sink=0x00000a01@0x7f0000001000 size=4096", ""},
		{"standard segment on UDP", []string{"decode", "4143000000000000000000000001000000000000"}, 1,
			"", "DV=1 segments travel only on MPA/TCP"},
		{"RD frame", []string{"decode", "07 03 01 00 00 00 00 05 00 00 00 06 01 02 03 04 22 22 22 22 22 22 22 22 00 00 00 07 11 11 11 11 11 11 11 11 00 00 00 03 00 19 01 01 00 02 00 02 00 00 00 01 01 00 00 00 42 43 00 00 00 06 00 00 00 14 00 00 00 01 00 00 00 00 68 69 b5 db 9d 3c"}, 0,
			"RD Data: QP 6 -> QP 5, epoch 0x01020304, token 0x2222222222222222, window 256, seq 7", ""},
		{"RD frame, bad CRC", []string{"decode", "0300000000"}, 1, "", "CRC"},
		{"not hex", []string{"decode", "zz"}, 2, "", "is not hex"},
		{"unknown command", []string{"nope"}, 2, "", "unknown command"},
		{"a mode for a command", []string{"rd-send"}, 2, "", "did you mean udperf local -mode rd-send?"},
		{"usage", []string{"-h"}, 0, "udperf decode", ""},
		{"demo", []string{"demo", "-quick"}, 0, "the median of 3 rounds, the two taking turns", ""},
		{"demo has a spread", []string{"demo", "-quick"}, 0, "ratio  spread", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
			}
		})
	}
}

// TestLocalAndCompare runs every mode for a few iterations through
// `local` and a pair through `compare`, and checks the JSON.
func TestLocalAndCompare(t *testing.T) {
	for _, m := range []string{"ud-send", "ud-wr", "rd-send", "rd-write", "rd-read", "rd-wr", "rc-send", "rc-write", "rc-read", "raw-udp", "raw-udp-unconn", "raw-tcp"} {
		for _, test := range []string{"lat", "bw"} {
			if test == "bw" && m == "raw-udp-unconn" {
				continue // latency only
			}
			t.Run(m+"/"+test, func(t *testing.T) {
				var out, errb bytes.Buffer
				poll := "event"
				if m == "rc-write" && test == "lat" {
					poll = "busy" // ib_write_lat watches memory
				}
				args := append([]string{"local", "-mode", m, "-test", test, "-s", "1024", "-poll", poll, "-json"}, runLength(test, 50, 5, "100ms")...)
				if code := run(args, &out, &errb); code != 0 {
					t.Fatalf("exit %d: %s", code, errb.String())
				}
				var doc document
				if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
					t.Fatalf("%v: %s", err, out.String())
				}
				if len(doc.Results) != 1 || doc.GoVersion == "" || doc.Flags["mode"] != m {
					t.Fatalf("%+v", doc)
				}
				r := doc.Results[0]
				if r.Mode != m || r.Bytes != 1024 || r.Iterations == 0 {
					t.Fatalf("%+v", r)
				}
				if test == "lat" && !(r.TMin > 0 && r.TMin <= r.TTypical && r.TTypical <= r.TMax) {
					t.Fatalf("latencies %+v", r)
				}
				if test == "bw" && (r.BWAvg <= 0 || r.Lost == nil || (reliableMode(m) && *r.Lost != 0)) {
					t.Fatalf("bandwidth %+v", r)
				}
			})
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"compare", "-modes", "ud-send,rd-send", "-n", "50", "-w", "5", "-rounds", "2", "-a", "-csv"}, &out, &errb); code != 0 {
		t.Fatalf("compare: exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1+2*15 || !strings.HasPrefix(lines[0], "mode,bytes,") || !strings.HasPrefix(lines[1], "ud-send,2,") || strings.Split(lines[1], ",")[10] != "1.000" {
		t.Fatalf("compare CSV:\n%s", out.String())
	}
}

// runLength is how long a test's run is: -n and -w for lat, -D for bw
// (each is refused with the other test).
func runLength(test string, n, w int, d string) []string {
	if test == "lat" {
		return []string{"-n", strconv.Itoa(n), "-w", strconv.Itoa(w)}
	}
	return []string{"-D", d}
}

// TestBidir: two flows at once carry about twice one flow's messages, and
// the reliable modes lose nothing.
func TestBidir(t *testing.T) {
	for _, m := range []string{"ud-send", "rd-write", "rc-send", "raw-tcp"} {
		t.Run(m, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run([]string{"local", "-mode", m, "-test", "bw", "-bidir", "-s", "4096", "-D", "100ms", "-poll", "event", "-json"}, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var doc document
			if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
				t.Fatal(err)
			}
			r := doc.Results[0]
			if doc.Flags["bidir"] != true || r.BWAvg <= 0 || r.Iterations == 0 || (reliableMode(m) && *r.Lost != 0) {
				t.Fatalf("%+v", r)
			}
		})
	}
}

func TestMetricsFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"local", "-mode", "rd-send", "-n", "50", "-w", "5", "-metrics", "127.0.0.1:0"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "/metrics") {
		t.Fatalf("stderr %q", errb.String())
	}
	if code := run([]string{"local", "-metrics", "256.0.0.1:1"}, &out, &errb); code != 2 {
		t.Fatalf("a bad -metrics address: exit %d", code)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"local", "-mode", "nope"},
		{"local", "-test", "nope"},
		{"local", "-poll", "sometimes"},
		{"local", "-loss", "2"},
		{"local", "-n", "0"},
		{"local", "-bidir"},
		{"local", "-bogus"},
		{"compare"},
		{"compare", "-modes", "ud-send,nope"},
	} {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		if code != 2 || errb.Len() == 0 || strings.Contains(errb.String(), "goroutine") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// TestServerClient runs every server/client mode against a server in this
// process over loopback, and checks the figures.
func TestServerClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		done <- serveOn(context.Background(), ln, serverOptions{stdout: io.Discard, stderr: io.Discard})
	}()
	defer func() { ln.Close(); <-done }()
	for _, m := range []string{"ud-send", "ud-wr", "rd-send", "rd-write", "rd-read", "rd-wr", "rc-send", "rc-write", "rc-read", "raw-udp", "raw-udp-unconn", "raw-tcp"} {
		for _, test := range []string{"lat", "bw"} {
			t.Run(m+"/"+test, func(t *testing.T) {
				var out, errb bytes.Buffer
				poll := "event"
				if m == "rc-write" && test == "lat" {
					poll = "busy" // ib_write_lat watches memory
				}
				args := append([]string{"client", "-addr", ln.Addr().String(), "-mode", m, "-test", test, "-s", "1000", "-poll", poll, "-json"}, runLength(test, 100, 10, "100ms")...)
				if code := run(args, &out, &errb); code != 0 {
					t.Fatalf("exit %d: %s", code, errb.String())
				}
				var doc document
				if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
					t.Fatalf("%v: %s", err, out.String())
				}
				r := doc.Results[0]
				if r.Mode != m || r.Bytes != 1000 {
					t.Fatalf("%+v", r)
				}
				if test == "lat" && (r.Iterations != 100 || r.TTypical <= 0) {
					t.Fatalf("%+v", r)
				}
				if test == "bw" && (r.BWAvg <= 0 || r.Iterations == 0) {
					t.Fatalf("%+v", r)
				}
			})
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"client", "-addr", ln.Addr().String(), "-mode", "rc-write", "-poll", "event"}, &out, &errb); code != 2 {
		t.Fatalf("rc-write lat in event mode: exit %d", code)
	}
	if code := run([]string{"client", "-addr", "127.0.0.1:1", "-mode", "ud-send", "-n", "10"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "refused") {
		t.Fatalf("an unreachable server: exit %d, %q", code, errb.String())
	}
}
