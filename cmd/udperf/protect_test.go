package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
)

// TestServerClientProtected: a client asks for -protect; the server's
// end runs the same mode (RD agreeing keys in its contact, UD with both
// ends' -psk), the row says so, and a UD run without a key is refused
// with the reason, at the client or at the server.
func TestServerClientProtected(t *testing.T) {
	psk := bytes.Repeat([]byte{0x5a}, 16)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		done <- serveOn(context.Background(), ln, serverOptions{stdout: io.Discard, stderr: io.Discard, psk: psk})
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	addr := ln.Addr().String()
	for _, tc := range []struct{ mode, prot, psk string }{
		{"rd-send", "auth", ""},
		{"ud-send", "aead", hex.EncodeToString(psk)},
		{"ud-wr", "auth", hex.EncodeToString(psk)},
	} {
		args := []string{"client", "-addr", addr, "-mode", tc.mode, "-protect", tc.prot, "-test", "lat", "-s", "100", "-n", "20", "-w", "2", "-json"}
		if tc.psk != "" {
			args = append(args, "-psk", tc.psk)
		}
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%s %s: exit %d: %s", tc.mode, tc.prot, code, errb.String())
		}
		var doc struct{ Results []map[string]any }
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil || len(doc.Results) != 1 {
			t.Fatalf("%s: %v %s", tc.mode, err, out.String())
		}
		if r := doc.Results[0]; r["protect"] != tc.prot || r["mode"] != tc.mode+"+"+tc.prot {
			t.Fatalf("row: %v", r)
		}
	}
	// No key at the client: refused before anything runs.
	var out, errb bytes.Buffer
	if code := run([]string{"client", "-addr", addr, "-mode", "ud-send", "-protect", "auth", "-test", "lat", "-n", "20"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "needs -psk") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}
