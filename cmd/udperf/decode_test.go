package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// cafeSend is how decode describes cafeFrame.
const cafeSend = "Send DV=2 L dstQP=5 queue=send srcQP=6 MSN=9 MO=0 payload=18"

// TestDecodeDumps: each tool's real dump of a frame, through stdin ("-")
// and as an argument, gives the frame's bytes back exactly: offsets and
// ASCII columns taken off (one of which reads "cafe", "00" and "0x42"),
// and a capture's Ethernet, IP and UDP headers too.
func TestDecodeDumps(t *testing.T) {
	want := cafeFrame()
	for _, d := range cafeDumps {
		t.Run(d.tool, func(t *testing.T) {
			b, err := parseHex(d.text)
			if p, _, ok := udpPayload(b); err == nil && ok {
				b = p
			}
			if err != nil || !bytes.Equal(b, want) {
				t.Fatalf("parseHex: %v\n got % x\nwant % x", err, b, want)
			}
			var out, errb bytes.Buffer
			if code := decodeFrom([]string{"-"}, strings.NewReader(d.text), &out, &errb); code != 0 || !strings.Contains(out.String(), cafeSend) {
				t.Fatalf("decode -: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
			}
			if strings.HasPrefix(d.tool, "tshark -x") && !strings.Contains(out.String(), ":40000 -> ") {
				t.Fatalf("decode - did not say what it took off: %q", out.String())
			}
			out.Reset()
			if code := run([]string{"decode", d.text}, &out, &errb); code != 0 || !strings.Contains(out.String(), cafeSend) {
				t.Fatalf("decode HEX: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
			}
		})
	}
}

// TestDecodeWireExamples: docs/wire.md's datagram examples, pasted with
// their offset column (and their Markdown fence and comment), decode.
func TestDecodeWireExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/wire.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ example, args, want string }{
		{"ud-send", "", "Send DV=2 L dstQP=5 queue=send srcQP=6 MSN=1 MO=0 payload=2"},
		{"ud-write-record", "", "MsgLen=5"},
		{"rd-data", "", "RD Data: QP 6 -> QP 5"},
		{"rd-ack", "", "RD Ack: QP 5 -> QP 6"},
		{"read-request", "-stream", "RDMA Read Request DV=1 L QN=1 MSN=1 MO=0 sink=0x00000a01@0x7f0000001000 size=4096"},
		{"prot-sealed-auth", "", "Sealed (auth): key ID 0x0a0b0c0d, packet number 5, key phase 0, 20 of 20 frame bytes in clear"},
		{"prot-sealed-aead", "", "the payload, 2 bytes, is encrypted): Send DV=2 L dstQP=5 queue=send srcQP=6 MSN=1"},
		{"prot-contact", "", "RD Hello: QP 6 -> QP 5"},
		{"prot-refuse", "", "Refuse: this side runs aead; the Hello of QP 6 to QP 5"},
	} {
		t.Run(tc.example, func(t *testing.T) {
			m := regexp.MustCompile("(?s)<!-- example: " + regexp.QuoteMeta(tc.example) + " -->\n```text\n.*?```\n").Find(doc)
			if m == nil {
				t.Fatalf("no example %s in docs/wire.md", tc.example)
			}
			args := []string{"decode"}
			if tc.args != "" {
				args = append(args, tc.args)
			}
			var out, errb bytes.Buffer
			if code := run(append(args, string(m)), &out, &errb); code != 0 || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
			}
		})
	}
}

// TestDecodeHexShapes: plain hex in the shapes people type.
func TestDecodeHexShapes(t *testing.T) {
	const ud = "Send DV=2 L dstQP=5 queue=send srcQP=6 MSN=1 MO=0 payload=2"
	for _, in := range []string{
		"42 43 00 00 00 06 00 00 00 14 00 00 00 01 00 00 00 00 68 69 8f fc cd 02",
		"0x42, 0x43, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x68, 0x69, 0x8f, 0xfc, 0xcd, 0x02",
		"0x42,0x43,0x0,0x0,0x0,0x6,0x0,0x0,0x0,0x14,0x0,0x0,0x0,0x1,0x0,0x0,0x0,0x0,0x68,0x69,0x8f,0xfc,0xcd,0x2",
		"42:43:00:00:00:06:00:00:00:14:00:00:00:01:00:00:00:00:68:69:8f:fc:cd:02",
		"4243 0000 0006 0000 0014 0000 0001 0000 0000 6869 8ffc cd02",
		"0000: 42 43 00 00 00 06 00 00 00 14 00 00 00 01 00 00\n0010: 00 00 68 69 8f fc cd 02",
		"00: 42 43 00 00 00 06 00 00\n08: 00 14 00 00 00 01 00 00\n10: 00 00 68 69 8f fc cd 02\n",
		"0000  42 43 00 00 00 06 00 00 00 14 00 00 00 01 00 00\r\n0010  00 00 68 69 8f fc cd 02\r\n",
	} {
		var out, errb bytes.Buffer
		if code := run([]string{"decode", in}, &out, &errb); code != 0 || !strings.Contains(out.String(), ud) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", in, code, out.String(), errb.String())
		}
	}
	// Hex split over several arguments, as a shell gives it.
	var out, errb bytes.Buffer
	if code := run(strings.Fields("decode 4243 0000 0006 0000 0014 0000 0001 0000 0000 6869 8ffc cd02"), &out, &errb); code != 0 || !strings.Contains(out.String(), ud) {
		t.Errorf("several arguments: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// TestDecodeRefused: what decode cannot read is one line on stderr and
// exit 2; no argument prints the usage on stderr.
func TestDecodeRefused(t *testing.T) {
	for _, tc := range []struct {
		name, in, stderr string
	}{
		{"not hex", "zz", `"zz" is not hex`},
		{"odd digits", "42 4 300", `"4": an odd number of hex digits`},
		{"a line missing from a dump", "0000  42 43 00 00 00 06 00 00 00 14 00 00 00 01 00 00\n0020  00 00 68 69 8f fc cd 02", "line 2: offset 0020, but 16 bytes (0x10) come before it"},
		{"two packets", "0000  42 43\n0000  42 43\n", "line 2: a second dump starts here, after 2 bytes"},
		{"od's repeated lines", "0000000 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00\n*\n0000040\n", "od -v"},
		{"nothing", "  \n", "no bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := decodeFrom([]string{"-"}, strings.NewReader(tc.in), &out, &errb)
			if code != 2 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("exit %d, stderr %q; want 2 and one line with %q", code, errb.String(), tc.stderr)
			}
		})
	}
	var out, errb bytes.Buffer
	if code := run([]string{"decode"}, &out, &errb); code != 2 || !strings.HasPrefix(errb.String(), "usage: udperf decode") || out.Len() != 0 {
		t.Fatalf("decode without arguments: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// TestDecodeDatagramCRCError: a datagram with a bad CRC32c trailer is
// reported with the Terminate code iWARP has for it, MPA's, and decode
// says that no MPA is involved.
func TestDecodeDatagramCRCError(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(strings.Fields("decode 42 41 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00"), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "CRC32c is 0x00000000") || !strings.Contains(errb.String(), "no MPA is involved") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}
