package doccmds

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docs are the documents whose fenced sh blocks a reader runs.
var docs = []string{"README.md", "docs/preload.md", "docs/sockets.md", "docs/udperf.md", "docs/udstream.md", "docs/verbs.md",
	"docs/wire.md", "docs/libfabric.md", "experiments/README.md"}

// A command is run by the test as written (in the module's root, or in
// a scratch directory with what it reads made first), or not, for the
// reason given.
type command struct {
	run     bool
	scratch bool     // run in a scratch directory (the module's root otherwise)
	needs   []string // programs it needs: absent, the test skips it, saying so
	prepare func(t *testing.T, dir string)
	why     string // why it is not run here
}

const (
	long     = "runs for minutes: the experiments' own test (go test ./experiments) runs the quick mode"
	root     = "needs root and builds network namespaces or touches a host's interfaces: covered by the tests that do it in their own namespaces"
	terminal = "a step of a walkthrough across terminals (a server, a player, a live feed that runs until stopped): cmd/udstream's tests run the same pipeline"
	remote   = "runs against a second host the reader has"
)

// commands is every shell command of the docs, by its text without a
// trailing comment.
var commands = map[string]command{
	"go get github.com/udiwarp/udiwarp@latest": {why: "fetches the published module from the network, which a test may not reach"},
	"go run ./cmd/udperf":                      {run: true},
	"go test -race -count=1 ./...":             {why: "is the suite this test is part of"},
	"sudo go run ./experiments -quick":         {why: long},
	"go run ./cmd/udperf decode 42 43 00 00 00 06 00 00 00 14 00 00 00 01 00 00 00 00 68 69 8f fc cd 02":                                      {run: true},
	"gcc -O2 -shared -fPIC -o libudiwarp_preload.so c/preload.c -ldl -lpthread":                                                               {why: "is run by socketshim/preload's Makefile, which its tests call"},
	"go build -buildmode=c-shared -o libudiwarp_engine.so ./engine":                                                                           {why: "is run by socketshim/preload's Makefile, which its tests call"},
	"LD_PRELOAD=$PWD/libudiwarp_preload.so sockperf server -i 127.0.0.1":                                                                      {why: "a server that runs until stopped: TestSockperf runs it with its client"},
	"go run ./cmd/udperf local -mode rd-write -test bw -s 524288":                                                                             {run: true},
	"go run ./cmd/udperf compare -modes raw-tcp,rc-send -test lat -a -json":                                                                   {why: "takes about 50 s: TestSweepScalesIterations checks how its sizes are run"},
	"go run ./cmd/udperf decode 42 43 00 00 ...":                                                                                              {why: "an elided frame, to show the form"},
	"xxd -p frame.bin | go run ./cmd/udperf decode -":                                                                                         {run: true, needs: []string{"xxd"}, prepare: writeFrame},
	"xxd -p frame.bin | udperf decode -":                                                                                                      {why: "the same with udperf installed on PATH"},
	"tshark -r cap.pcap -x -c 1 | udperf decode -":                                                                                            {why: "needs a capture of the reader's and udperf on PATH: TestRCWiresharkDecode captures and decodes"},
	"go build -o udstream ./cmd/udstream":                                                                                                     {run: true},
	"ffmpeg -f lavfi -i testsrc=size=640x360:rate=25 -f lavfi -i sine=frequency=440 -t 30 -c:v mpeg2video -b:v 2M -c:a mp2 -f mpegts test.ts": {run: true, scratch: true, needs: []string{"ffmpeg"}},
	"./udstream send -i test.ts -listen 127.0.0.1:5004":                                                                                       {why: terminal},
	"vlc udp://@127.0.0.1:1234":                                                                                                               {why: terminal},
	"./udstream recv -from 127.0.0.1:5004 -o udp://127.0.0.1:1234":                                                                            {why: terminal},
	"./udstream send -i test.ts -loss 0.05 &":                                                                                                 {why: terminal + " (paced at the stream's own rate: 30 s a run)"},
	"./udstream recv -o partial.ts -json":                                                                                                     {why: terminal},
	"./udstream recv -o whole.ts -discard -json":                                                                                              {why: terminal},
	"ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames partial.ts":                                       {run: true, scratch: true, needs: []string{"ffmpeg", "ffprobe"}, prepare: tsFile("partial.ts")},
	"ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames whole.ts":                                         {run: true, scratch: true, needs: []string{"ffmpeg", "ffprobe"}, prepare: tsFile("whole.ts")},
	"./udstream send -i udp://127.0.0.1:5000 -listen 127.0.0.1:5004 &":                                                                        {why: terminal},
	"ffmpeg -re -i test.ts -c copy -f mpegts 'udp://127.0.0.1:5000?pkt_size=1316'":                                                            {why: terminal},
	"ffmpeg -re -i test.ts -c copy -f rtp_mpegts 'rtp://127.0.0.1:5000?pkt_size=1328'":                                                        {why: terminal},
	"sudo go run ./experiments":                                                                                                               {why: long},
	"sudo go run ./experiments -only bottleneck":                                                                                              {why: long},
	"sudo go run ./experiments -only bottleneck -quick":                                                                                       {why: root},
	"sudo go run ./experiments -only bottleneck -bottleneck-rate 500":                                                                         {why: long},
	"sudo go run ./experiments -only bottleneck -bottleneck-tcp-cc cubic":                                                                     {why: long},
	"go test -run TestBottleneck ./experiments":                                                                                               {why: "is part of the suite this test is part of"},
	"sudo go run ./experiments -only sipp":                                                                                                    {why: long},
	"sudo go run ./experiments -only sipp -quick":                                                                                             {why: "runs SIPp for 30 s: the experiments' own test runs the quick mode, SIPp included"},
	"sudo go run ./experiments -only sipp -sipp-clients 100000 -sipp-rate 4000 -sipp-transports kernel-udp,kernel-tcp":                        {why: long},
	"go build -o udperf ./cmd/udperf":                                                                                                         {run: true},
	"./udperf server -addr :18515":                                                                                                            {why: remote},
	"tc qdisc replace dev eth1 root netem loss 1%":                                                                                            {why: remote},
	"sudo go run ./experiments -server 192.0.2.10 -dev eth1 -only fig17,fig18,fig-rdma-loss":                                                  {why: remote},
	"experiments/fi-pingpong.sh":                                                                                                              {why: long},
	"experiments/mpi-netpipe.sh":                                                                                                              {why: long},
	"experiments/mpi-memory.sh":                                                                                                               {why: long},
	"OUT=experiments/results/$(date -u +%F)-issue34-fi experiments/fi-pingpong.sh":                                                            {why: long},
	"go run ./experiments -plot DIR":                                                                                                          {why: "DIR stands for a results directory of the reader's: the experiments' TestPlotScripts draws one"},
	"apt-get install libfabric-dev libfabric-bin gcc":                                                                                         {why: "installs packages: .ci/run installs them"},
	"make -C libfabric":                                                                {run: true, needs: []string{"gcc", "fi_info", "make"}},
	"export FI_PROVIDER_PATH=$PWD/libfabric":                                           {why: "sets the shell's environment for the lines after it"},
	"fi_info -p udiwarp":                                                               {why: "needs FI_PROVIDER_PATH from the line before: libfabric's TestInfo runs it so"},
	"fi_pingpong -p udiwarp -e dgram":                                                  {why: "a server that waits for its client: libfabric's TestPingpong runs each pair"},
	"fi_pingpong -p udiwarp -e dgram HOST_A":                                           {why: remote},
	`fi_pingpong -p "udiwarp;ofi_rxd" -e rdm HOST_A`:                                   {why: remote},
	"fi_pingpong -p udiwarp -e msg HOST_A":                                             {why: remote},
	`fi_pingpong -p "udiwarp;ofi_rxm" -e rdm HOST_A`:                                   {why: remote},
	"FI_PROVIDER='^ofi_rxd,ofi_rxm,ofi_mrail' fi_pingpong -p udiwarp -e rdm -m tagged": {why: "a server that waits for its client: libfabric's TestPingpong runs the pair (rdm-tagged)"},
	"mpirun --allow-run-as-root -np 2 --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include udiwarp --mca opal_common_ofi_provider_include udiwarp -x FI_PROVIDER_PATH=$PWD/libfabric -x FI_PROVIDER='^ofi_rxd,ofi_rxm,ofi_mrail' NPopenmpi -u 1048576":             {why: "libfabric's TestOpenMPI runs it, with fewer repetitions and the provider Open MPI chose checked"},
	"mpirun --allow-run-as-root -np 2 --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include 'udiwarp;ofi_rxm' --mca opal_common_ofi_provider_include 'udiwarp;ofi_rxm' -x FI_PROVIDER_PATH=$PWD/libfabric -x FI_PROVIDER='^ofi_rxd,ofi_mrail' NPopenmpi -u 1048576": {why: "libfabric's TestOpenMPI/rxm runs it, with fewer repetitions and the provider Open MPI chose checked"},
}

var fence = regexp.MustCompile("(?s)```(?:sh|bash|shell)\n(.*?)```")

// docCommands returns every command of doc: its fenced sh blocks, lines
// joined at a trailing backslash, comments and blank lines dropped.
func docCommands(t *testing.T, root, doc string) []string {
	b, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
		text := strings.ReplaceAll(m[1], "\\\n", " ")
		for _, line := range strings.Split(text, "\n") {
			if i := strings.Index(line, "  #"); i >= 0 {
				line = line[:i]
			}
			line = strings.Join(strings.Fields(line), " ")
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			out = append(out, line)
		}
	}
	return out
}

func TestDocCommands(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen, ran := map[string]bool{}, map[string]bool{}
	for _, doc := range docs {
		for _, c := range docCommands(t, root, doc) {
			seen[c] = true
			cmd, ok := commands[c]
			if !ok {
				t.Errorf("%s: %q: a command this test does not know: run it here, or say why it cannot run in a test", doc, c)
				continue
			}
			if !cmd.run || ran[c] {
				continue // not here, or run for another document already
			}
			ran[c] = true
			t.Run(doc+": "+c, func(t *testing.T) {
				for _, p := range cmd.needs {
					if _, err := exec.LookPath(p); err != nil {
						t.Skipf("%s is not installed (.ci/run installs it)", p)
					}
				}
				dir := root
				if cmd.scratch || cmd.prepare != nil {
					dir = t.TempDir()
				}
				if cmd.prepare != nil {
					cmd.prepare(t, dir)
				}
				line := c
				if dir != root {
					// The command as written; go run and go build find the
					// module through GOFLAGS=-C... they cannot: run those
					// from the root, the rest here.
					line = strings.ReplaceAll(line, "go run ./cmd/udperf", "go run -C "+root+" ./cmd/udperf")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				sh := exec.CommandContext(ctx, "sh", "-c", line)
				sh.Dir = dir
				out, err := sh.CombinedOutput()
				if err != nil {
					t.Fatalf("%s: %v\n%s", line, err, out)
				}
				if dir == root && strings.HasPrefix(c, "go build -o ") {
					os.Remove(filepath.Join(root, strings.Fields(c)[3])) // the binary it built (.gitignore'd)
				}
			})
		}
	}
	for c := range commands {
		if !seen[c] {
			t.Errorf("%q is listed here but no document has it any more: take it out", c)
		}
	}
}

// writeFrame writes frame.bin: the UD Send of README.md's decode example.
func writeFrame(t *testing.T, dir string) {
	frame := []byte{0x42, 0x43, 0, 0, 0, 6, 0, 0, 0, 0x14, 0, 0, 0, 1, 0, 0, 0, 0, 0x68, 0x69, 0x8f, 0xfc, 0xcd, 0x02}
	if err := os.WriteFile(filepath.Join(dir, "frame.bin"), frame, 0o644); err != nil {
		t.Fatal(err)
	}
}

// tsFile makes name: a second of ffmpeg's test pattern in MPEG-TS.
func tsFile(name string) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		out, err := exec.Command("ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=25", "-t", "1",
			"-c:v", "mpeg2video", "-f", "mpegts", filepath.Join(dir, name)).CombinedOutput()
		if err != nil {
			t.Fatalf("ffmpeg: %v\n%s", err, out)
		}
	}
}
