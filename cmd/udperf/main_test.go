package main

import (
	"bytes"
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
		{"not hex", []string{"decode", "zz"}, 2, "", "invalid byte"},
		{"unknown command", []string{"nope"}, 2, "", "unknown command"},
		{"usage", []string{"-h"}, 0, "udperf decode", ""},
		{"demo", []string{"demo", "-quick"}, 0, "ratio", ""},
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
