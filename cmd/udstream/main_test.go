package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The stream every test sends: 4 s of ffmpeg's test pattern and a tone,
// MPEG-2 video and MP2 audio in MPEG-TS, made once by TestMain.
var (
	tsIn     string
	inFrames int
	noTS     string // why there is none
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "udstream-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if _, err := exec.LookPath("ffmpeg"); err != nil {
			noTS = "ffmpeg is not installed (Debian: apt-get install ffmpeg; .ci/run installs it)"
		} else {
			tsIn = filepath.Join(dir, "in.ts")
			out, err := exec.Command("ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25",
				"-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", "4",
				"-c:v", "mpeg2video", "-b:v", "1M", "-c:a", "mp2", "-f", "mpegts", tsIn).CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "ffmpeg: %v: %s\n", err, out)
				return 1
			}
			if inFrames, err = frames(tsIn); err != nil || inFrames < 90 {
				fmt.Fprintf(os.Stderr, "ffprobe of the input: %d frames, %v\n", inFrames, err)
				return 1
			}
		}
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines outlived the runs:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func needTS(t *testing.T) {
	t.Helper()
	if tsIn == "" {
		t.Skip(noTS)
	}
}

// frames is how many video frames ffprobe decodes from a TS file.
func frames(path string) (int, error) {
	out, err := exec.Command("ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
		"-show_entries", "stream=nb_read_frames", "-of", "default=nw=1:nk=1", path).Output()
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return 0, nil
	}
	return strconv.Atoi(f[0])
}

// decodeErrors is how many error lines ffmpeg prints decoding path.
func decodeErrors(t *testing.T, path string) int {
	out, _ := exec.Command("ffmpeg", "-v", "error", "-i", path, "-f", "null", "-").CombinedOutput()
	return strings.Count(string(out), "\n")
}

// freePort returns a port nothing listens on now (UDP and TCP).
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		u.Close()
		if l, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

type ended struct {
	code           int
	stdout, stderr string
}

func runCmd(args []string, stop <-chan struct{}) ended {
	var out, errb bytes.Buffer
	code := run(args, nil, &out, &errb, stop)
	return ended{code, out.String(), errb.String()}
}

// pair runs a sender and then a receiver of transport over loopback and
// returns both ends' results and the receiver's output file.
func pair(t *testing.T, transport string, sendArgs, recvArgs []string) (s, r ended, rs recvStats, out string) {
	t.Helper()
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	out = filepath.Join(t.TempDir(), "out.ts")
	var wg sync.WaitGroup
	wg.Go(func() {
		s = runCmd(append([]string{"send", "-t", transport, "-listen", addr, "-i", tsIn, "-speed", "8", "-json", "-q", "-wait", "20s"}, sendArgs...), nil)
	})
	time.Sleep(100 * time.Millisecond) // the sender listens first, as a server does
	r = runCmd(append([]string{"recv", "-t", transport, "-from", addr, "-o", out, "-json", "-q", "-wait", "20s"}, recvArgs...), nil)
	wg.Wait()
	if r.stdout != "" {
		if err := json.Unmarshal([]byte(r.stdout), &rs); err != nil {
			t.Fatalf("%s: the receiver's JSON: %v: %q", transport, err, r.stdout)
		}
	}
	return s, r, rs, out
}

// TestTransportsByteIdentical: over every transport at no loss, the
// receiver's output is the input, byte for byte, and decodes whole.
func TestTransportsByteIdentical(t *testing.T) {
	needTS(t)
	in, _ := os.ReadFile(tsIn)
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			s, r, rs, out := pair(t, tr, nil, nil)
			if s.code != 0 || r.code != 0 {
				t.Fatalf("send exit %d %q, recv exit %d %q", s.code, s.stderr, r.code, r.stderr)
			}
			got, _ := os.ReadFile(out)
			if !bytes.Equal(got, in) {
				t.Fatalf("output %d bytes, input %d: not identical (%+v)", len(got), len(in), rs)
			}
			if !rs.Ended || !rs.TS || rs.TSDropped != 0 || rs.ValidPct != 100 || rs.BytesSent != uint64(len(in)) || rs.InitialBufferingMs <= 0 {
				t.Fatalf("figures: %+v", rs)
			}
			if n, err := frames(out); err != nil || n != inFrames {
				t.Fatalf("ffprobe: %d frames of %d, %v", n, inFrames, err)
			}
		})
	}
}

// TestLossPartialBeatsWhole: at 1 % and 5 % loss (the impairment layer,
// seeded), Write-Record with partial delivery decodes strictly more
// frames than whole-message delivery, forwards only whole TS packets, and
// every transport's output still decodes; Write-Record over RD loses
// nothing.
func TestLossPartialBeatsWhole(t *testing.T) {
	needTS(t)
	in, _ := os.ReadFile(tsIn)
	for _, loss := range []string{"0.01", "0.05"} {
		t.Run("loss="+loss, func(t *testing.T) {
			lossy := []string{"-loss", loss, "-seed", "7"}
			_, r, partial, out := pair(t, tWRUD, lossy, nil)
			if r.code != 0 {
				t.Fatalf("wr-ud partial: exit %d %q", r.code, r.stderr)
			}
			pf, _ := frames(out)
			_, r, whole, out2 := pair(t, tWRUD, lossy, []string{"-discard"})
			if r.code != 0 {
				t.Fatalf("wr-ud discard: exit %d %q", r.code, r.stderr)
			}
			wf, _ := frames(out2)
			t.Logf("wr-ud at %s loss: partial %d frames (%.1f %% valid, %d TS packets dropped, %d decode errors), whole %d frames (%.1f %% valid, %d dropped, %d errors), of %d",
				loss, pf, partial.ValidPct, partial.TSDropped, decodeErrors(t, out), wf, whole.ValidPct, whole.TSDropped, decodeErrors(t, out2), inFrames)
			if pf <= wf || partial.ChunksPartial == 0 || whole.ChunksLost == 0 || partial.TSForwarded <= whole.TSForwarded {
				t.Fatalf("partial delivery %d frames against whole %d (partial %+v; whole %+v)", pf, wf, partial, whole)
			}
			if got, _ := os.ReadFile(out); len(got)%188 != 0 {
				t.Fatalf("the partial output holds %d bytes: not whole TS packets", len(got))
			}
			_, r, rd, out3 := pair(t, tWRRD, lossy, nil)
			got, _ := os.ReadFile(out3)
			if r.code != 0 || !bytes.Equal(got, in) || rd.TSDropped != 0 {
				t.Fatalf("wr-rd through %s loss: exit %d %q, %d of %d bytes, %+v", loss, r.code, r.stderr, len(got), len(in), rd)
			}
			for _, tr := range []string{tSendUD, tUDP} {
				_, r, rs, o := pair(t, tr, lossy, nil)
				n, err := frames(o)
				if r.code != 0 || err != nil || n == 0 || rs.ChunksLost == 0 {
					t.Fatalf("%s at %s loss: exit %d %q, %d frames %v, %+v", tr, loss, r.code, r.stderr, n, err, rs)
				}
				t.Logf("%s at %s loss: %d frames, %d chunks lost", tr, loss, n, rs.ChunksLost)
			}
		})
	}
}
