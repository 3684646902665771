package reliability

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/udiwarp/udiwarp/udiwarp"
)

var rdExampleRE = regexp.MustCompile("(?s)<!-- example: (rd-[a-z0-9-]+) -->\n```text\n(.*?)```")

// rdExamples builds the RD examples of docs/wire.md §11.4.
func rdExamples() map[string][]byte {
	tok1, tok2 := uint64(0x1111111111111111), uint64(0x2222222222222222)
	hello := Append(nil, &Fields{Type: Hello, Window: 256, DstQPN: 5, SrcQPN: 6, Epoch: 0x01020304, Init: true, Issued: tok1})
	data := Append(nil, &Fields{Type: Data, Window: 256, DstQPN: 5, SrcQPN: 6, Epoch: 0x01020304, Token: tok2, Seq: 7,
		Init: true, Issued: tok1, Ack: &AckBlock{Cumulative: 3, Delay: 25, Ranges: []Range{{5, 2}}, Errors: []AckError{{1, CodeRemoteAccess}}}})
	data = udiwarp.AppendUntagged(data, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: 6, QN: udiwarp.DatagramQN(5, udiwarp.QueueSend), MSN: 1})
	data = append(data, "hi"...)
	ack := Append(nil, &Fields{Type: Ack, Window: 256, DstQPN: 6, SrcQPN: 5, Epoch: 0x0a0b0c0d, Token: tok1, RNR: true,
		Ack: &AckBlock{Cumulative: 10}})
	return map[string][]byte{
		"rd-hello": udiwarp.SealDatagram(hello, 0),
		"rd-data":  udiwarp.SealDatagram(data, 0),
		"rd-ack":   udiwarp.SealDatagram(ack, 0),
	}
}

// TestWireDocRDExamples checks the RD examples in docs/wire.md byte for
// byte against the code, and that each parses back.
func TestWireDocRDExamples(t *testing.T) {
	ex := rdExamples()
	doc, err := os.ReadFile("../docs/wire.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range rdExampleRE.FindAllSubmatch(doc, -1) {
		name := string(m[1])
		want, ok := ex[name]
		if !ok {
			t.Errorf("docs/wire.md has example %q that the test does not build", name)
			continue
		}
		seen[name] = true
		var got []byte
		for _, line := range strings.Split(strings.TrimSpace(string(m[2])), "\n") {
			f := strings.Fields(line)
			b, err := hex.DecodeString(strings.Join(f[1:], ""))
			if err != nil {
				t.Fatalf("example %s: %v", name, err)
			}
			got = append(got, b...)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("example %s in docs/wire.md differs from the code; it must read:\n%s", name, hexLines(want))
		}
		frame, err := udiwarp.OpenDatagram(want)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var h Header
		if err := h.Parse(frame); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for name := range ex {
		if !seen[name] {
			t.Errorf("docs/wire.md lacks example %q", name)
		}
	}
}

func hexLines(b []byte) string {
	var s strings.Builder
	for off := 0; off < len(b); off += 16 {
		fmt.Fprintf(&s, "%04x ", off)
		for _, c := range b[off:min(off+16, len(b))] {
			fmt.Fprintf(&s, " %02x", c)
		}
		s.WriteString("\n")
	}
	return s.String()
}
