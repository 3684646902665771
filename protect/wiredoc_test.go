package protect

import (
	"bytes"
	"crypto/ecdh"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

var protExampleRE = regexp.MustCompile("(?s)<!-- example: (prot-[a-z0-9-]+) -->\n```text\n(.*?)```")

// exampleSecret is the traffic secret of docs/wire.md §12.5: 00 01 … 1f.
func exampleSecret() []byte {
	s := make([]byte, 32)
	for i := range s {
		s[i] = byte(i)
	}
	return s
}

// protExamples builds the examples of docs/wire.md §12.5.
func protExamples() map[string][]byte {
	send := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: 6, QN: udiwarp.DatagramQN(5, udiwarp.QueueSend), MSN: 1})
	send = append(send, "hi"...)
	frame := append(append([]byte(nil), send...), 0, 0, 0, 0) // as the device hands it: a zero trailer
	sealed := func(m Mode) []byte {
		tx := newSendSA(0x0a0b0c0d, m, DefaultKeyUpdateAfter, exampleSecret())
		tx.pn.Store(5)
		return sealFrame(nil, [][]byte{frame}, len(frame), tx, nil)
	}
	g := newGen(0, exampleSecret())
	var nonce [12]byte
	g.nonce(5, &nonce)
	keys := append(append(expand(exampleSecret(), "udiwarp key", 16), g.iv[:]...), nonce[:]...)

	hello := reliability.Append(nil, &reliability.Fields{Type: reliability.Hello, Window: 256, DstQPN: 5, SrcQPN: 6,
		Epoch: 0x01020304, Init: true, Issued: 0x1111111111111111})
	priv, _ := ecdh.X25519().NewPrivateKey(bytes.Repeat([]byte{0x11}, 32))
	contact := make([]byte, HeaderSize+ShareSize)
	putHeader(contact, KindContact, AEAD, FlagShare, 0, 0, len(hello), priv.PublicKey().Bytes())
	contact = udiwarp.SealDatagram(append(contact, hello...), 0)
	refuse := udiwarp.SealDatagram(AppendRefuse(nil, &Refusal{Mode: AEAD, FromQP: 6, NameQP: 5, Token: 0x1111111111111111}), 0)
	return map[string][]byte{
		"prot-keys":        keys,
		"prot-sealed-auth": sealed(Auth),
		"prot-sealed-aead": sealed(AEAD),
		"prot-contact":     contact,
		"prot-refuse":      refuse,
		"prot-plain-ud":    udiwarp.SealDatagram(send, 0),
	}
}

// hexLines prints b as docs/wire.md's examples do.
func hexLines(b []byte) string {
	var sb strings.Builder
	for i := 0; i < len(b); i += 16 {
		fmt.Fprintf(&sb, "%04x ", i)
		for _, c := range b[i:min(i+16, len(b))] {
			fmt.Fprintf(&sb, " %02x", c)
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

// TestWireDocProtExamples checks docs/wire.md §12.5 byte for byte
// against the code, and that each sealed example opens.
func TestWireDocProtExamples(t *testing.T) {
	ex := protExamples()
	doc, err := os.ReadFile("../docs/wire.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range protExampleRE.FindAllSubmatch(doc, -1) {
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
			t.Errorf("example %s differs from the code; the code builds:\n%s", name, hexLines(want))
		}
	}
	for name, b := range ex {
		if !seen[name] {
			t.Errorf("docs/wire.md lacks example %s:\n%s", name, hexLines(b))
		}
	}
	for _, name := range []string{"prot-sealed-auth", "prot-sealed-aead"} {
		b := append([]byte(nil), ex[name]...)
		var h Header
		if err := h.Parse(b); err != nil {
			t.Fatal(err)
		}
		if !openIn(newGen(0, exampleSecret()), b, &h, new([12]byte)) {
			t.Errorf("%s does not open under the example's secret", name)
		}
	}
}
