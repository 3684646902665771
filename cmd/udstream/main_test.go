package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestNotBuiltYet: udstream says it is not built, names the issue that
// will build it, blames nothing already done, and exits 2.
func TestNotBuiltYet(t *testing.T) {
	for _, args := range [][]string{nil, {"-h"}, {"send", "127.0.0.1:9000"}} {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		msg := errb.String()
		if code != 2 || out.Len() != 0 || strings.Count(msg, "\n") != 1 ||
			!strings.Contains(msg, "not built yet") || !strings.Contains(msg, "issue 17") ||
			strings.Contains(msg, "issue 3") || strings.Contains(msg, "issue 4") {
			t.Fatalf("udstream %q: exit %d, stdout %q, stderr %q", args, code, out.String(), msg)
		}
	}
}
