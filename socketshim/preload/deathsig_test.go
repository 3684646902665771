package preload_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestChildDiesWithTheTest: a program a test starts (start) dies with the
// test process even when that process is killed and runs no Cleanup. The
// test runs itself as a helper that starts `sleep`, prints its pid and
// waits; it kills the helper with SIGKILL and waits for the sleep to be
// gone.
func TestChildDiesWithTheTest(t *testing.T) {
	if os.Getenv("UDIWARP_DEATHSIG_HELPER") != "" {
		p := start(t, context.Background(), "", false, "sleep", "300")
		os.Stdout.WriteString("child " + strconv.Itoa(p.cmd.Process.Pid) + "\n")
		time.Sleep(5 * time.Minute) // killed long before
		return
	}
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("needs sleep(1)")
	}
	helper := exec.Command(os.Args[0], "-test.run=^TestChildDiesWithTheTest$", "-test.v")
	helper.Env = append(os.Environ(), "UDIWARP_DEATHSIG_HELPER=1")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer helper.Wait()
	pid := 0
	sc := bufio.NewScanner(out)
	for pid == 0 && sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "child "); ok {
			pid, _ = strconv.Atoi(rest)
		}
	}
	if pid == 0 {
		helper.Process.Kill()
		t.Fatal("the helper did not start its child")
	}
	defer syscall.Kill(pid, syscall.SIGKILL) // only if the test fails
	helper.Process.Signal(syscall.SIGKILL)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return
		}
		// A zombie (the helper's, reaped by init) counts as gone.
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the child %d outlived its test process by 30 s", pid)
		}
	}
}
