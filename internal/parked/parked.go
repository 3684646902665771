// Package parked lets a test wait for the state it asserts about a
// blocked call instead of for a time: Wait returns once a goroutine whose
// stack holds a given function is parked (waiting on a channel, a select,
// a condition, a lock, a timer or the netpoller), so that "a deadline set
// now interrupts a blocked read" is tested on a read that is blocked, not
// on one that, on a loaded machine, had not started yet.
package parked

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// waiting are the goroutine states of a parked call.
var waiting = []string{"[select", "[chan receive", "[chan send", "[sync.Cond.Wait", "[sync.Mutex.Lock", "[semacquire",
	"[IO wait", "[sleep", "[syscall"}

// Wait returns once a goroutine whose stack holds fn (a function name as
// runtime.Stack prints it, "(*PacketConn).ReadFrom") is parked; it fails
// the test after a bound only a hung test reaches.
func Wait(t testing.TB, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if !strings.Contains(g, fn) {
				continue
			}
			head, _, _ := strings.Cut(g, "\n")
			for _, w := range waiting {
				if strings.Contains(head, w) {
					return
				}
			}
		}
		if time.Now().After(end) {
			t.Fatalf("no goroutine in %s parked within 30 s", fn)
		}
	}
}
