package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A SIPp that failed is reported by the error it printed among its
// screens (these lines are a real SIPp 3.6.1's, out of descriptors under
// the preload) and the sockets its last screen counted.
func TestSIPpWhy(t *testing.T) {
	out := "Resolving remote host '127.0.0.1'... Done.\n" +
		"udiwarp preload[3490]: the engine refused socket 19995 (errno 24); it stays on the kernel\n" +
		"2026-11-24\t20:09:44.802733\t1795550984.802733: Unable to get a UDP socket (3), errno = 24 (Too many open files)\n" +
		"  4995 open sockets                       0/0/0 UDP errors (send/recv/cong)\n" +
		"------------------------------ Test Terminated --------------------------------\n"
	f, err := os.Create(filepath.Join(t.TempDir(), "uac0.out"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(out)
	f.Close()
	p := &sippProc{out: f}
	want := "Unable to get a UDP socket (3), errno = 24 (Too many open files) (4995 sockets open)"
	if got := p.why(); got != want {
		t.Fatalf("why() = %q, want %q", got, want)
	}
}
