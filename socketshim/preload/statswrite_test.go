package preload_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A program's close(2) of a socket the engine carries does no file
// system work: the stats file is the engine's goroutine's to write, every
// 200 ms and at exit. It was written at every close, by the program's
// own thread — a create, a write and a rename, and ext4 flushes the data
// of a file renamed over another — so a SIP UAC with a socket per call
// (SIPp's -t un) spent most of its time in the file system as its calls
// ended, and answered its calls' 200 OKs hundreds of milliseconds late
// at 30,000 clients. manysock churn opens and closes 500 sockets; the
// test counts the stats file's writes (renames onto it, by inotify) over
// the program's whole life, which the ticker bounds by its lifetime.
func TestCloseWritesNoStats(t *testing.T) {
	dir := built(t)
	const n = 500
	statsDir := t.TempDir()
	stats := filepath.Join(statsDir, "stats.json")
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	// The temporary file's creation between two renames keeps the kernel
	// from merging them into one event (it merges an event identical to
	// the last one queued).
	if _, err := unix.InotifyAddWatch(in, statsDir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	p := startEnv(t, ctx, dir, false, []string{"LD_PRELOAD=" + filepath.Join(dir, "libudiwarp_preload.so"),
		"UDIWARP_ENGINE=" + filepath.Join(dir, "libudiwarp_engine.so"), "UDIWARP_PRELOAD_STATS=" + stats},
		filepath.Join(dir, "manysock"), "churn", "500")
	if out := p.wait(t); out != "closed 500\n" {
		t.Fatalf("manysock churn: %q", out)
	}
	life := time.Since(began)
	p.stats = stats
	if st := p.readStats(t); st.Sockets != n || st.Live != 0 {
		t.Fatalf("the engine adopted %d sockets and has %d open after the program closed them, want %d and 0", st.Sockets, st.Live, n)
	}
	writes, overflow := 0, false
	buf := make([]byte, 64<<10)
	for {
		m, err := unix.Read(in, buf)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for b := buf[:m]; len(b) >= unix.SizeofInotifyEvent; {
			mask := binary.NativeEndian.Uint32(b[4:8])
			l := int(binary.NativeEndian.Uint32(b[12:16]))
			name := bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00")
			overflow = overflow || mask&unix.IN_Q_OVERFLOW != 0
			if mask&unix.IN_MOVED_TO != 0 && string(name) == "stats.json" {
				writes++
			}
			b = b[unix.SizeofInotifyEvent+l:]
		}
	}
	// One at the engine's start, one a tick, one at exit.
	most := int(life/(200*time.Millisecond)) + 2
	t.Logf("%d sockets opened and closed in %v: the stats file was written %d times (at most %d)", n, life, writes, most)
	if overflow || writes > most {
		t.Fatalf("closing %d sockets wrote the stats file %d times in %v (inotify overflow %v), want at most %d: one at start, one each 200 ms, one at exit",
			n, writes, life, overflow, most)
	}
	if writes < 2 {
		t.Fatalf("the stats file was written %d times, want at least at start and at exit", writes)
	}
}
