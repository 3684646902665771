package qp

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRCWiresharkDecode is an independent check of the RC wire format:
// it captures the RC traffic of a run on the loopback interface with
// tshark and decodes it with Wireshark's iWARP dissectors (MPA, then
// DDP/RDMAP). Every operation is there — Sends of several sizes, Send
// with Solicited Event and with Invalidate, RDMA Writes, RDMA Reads, RFC
// 7306 FetchAdd and CmpSwap with their responses, Immediate Data alone,
// after a Send and after a Write, the MPA Request/Reply and the RTR —
// over connections with markers and
// without, CRC on and off, MPA revisions 1 and 2. No frame may decode as
// malformed, with a bad CRC, or with an error-level expert note. It runs
// where tshark is installed (Debian package tshark; .ci/run installs it)
// and capture is allowed (root).
func TestRCWiresharkDecode(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("needs tshark (Debian package tshark; .ci/run installs it)")
	}
	if os.Geteuid() != 0 {
		t.Skip("capturing on lo needs root")
	}
	b := newRCSide(t, DeviceConfig{})
	l, err := b.dev.ListenRC("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().Port()
	file := filepath.Join(t.TempDir(), "rc.pcapng")
	if d := os.Getenv("UDIWARP_PCAP"); d != "" {
		file = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	capture := exec.CommandContext(ctx, tshark, "-i", "lo", "-w", file, "-f", fmt.Sprintf("tcp port %d", port))
	capture.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test process
	stderr, _ := capture.StderrPipe()
	if err := capture.Start(); err != nil {
		t.Skipf("cannot start tshark: %v", err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			if !sent && strings.Contains(sc.Text(), "Capture started") {
				ready <- true
				sent = true
			}
		}
		if !sent {
			ready <- false
		}
	}()
	if !<-ready {
		capture.Wait()
		t.Skip("tshark could not capture on lo")
	}

	configs := []RCConfig{
		{Revision: 2, Markers: true},
		{Revision: 2},
		{Revision: 1, Markers: true},
		{Revision: 1, NoCRC: true},
	}
	for i, cfg := range configs {
		a := newRCSide(t, DeviceConfig{})
		bq := b.newQP(t)
		done := make(chan error, 1)
		go func() {
			r, err := l.Next(context.Background())
			if err == nil {
				err = r.Accept(bq, RCConfig{Markers: cfg.Markers, NoCRC: cfg.NoCRC, PrivateData: []byte("accept")})
			}
			done <- err
		}()
		if _, err := a.q.Connect(context.Background(), l.Addr().String(), cfg); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		inv, _ := b.pd.RegisterMemory(make([]byte, 16), AccessLocalWrite|AccessRemoteWrite|AccessRemoteInvalidate)
		sizes := []int{0, 1, 61, 1000, 70000}
		for k := range sizes {
			mustPost(t, bq.PostRecv(&RecvWR{ID: uint64(k), SGL: []SGE{b.mr.SGE(k*100000, 100000)}}))
		}
		mustPost(t, bq.PostRecv(&RecvWR{ID: 99, SGL: []SGE{b.mr.SGE(900000, 100)}}))
		for k := range 4 { // Immediate Data alone, Send with Immediate (two), Write with Immediate
			mustPost(t, bq.PostRecv(&RecvWR{ID: 300 + uint64(k), SGL: []SGE{b.mr.SGE(950000+k*100, 100)}}))
		}
		word, _ := b.pd.RegisterMemory(make([]byte, 8), AccessLocalWrite|AccessRemoteAtomic)
		for k, n := range sizes {
			fill(a.buf[:n], k+i)
			flags := FlagSignaled
			if k%2 == 1 {
				flags |= FlagSolicited
			}
			mustPost(t, a.q.PostSend(&SendWR{ID: uint64(k), Flags: flags, SGL: []SGE{a.mr.SGE(0, n)}}))
			mustPost(t, a.q.PostSend(&SendWR{ID: 100 + uint64(k), Opcode: OpWrite, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, n)},
				RemoteSTag: b.mr.STag(), RemoteTO: b.mr.Addr() + 2<<20}))
			mustPost(t, a.q.PostSend(&SendWR{ID: 200 + uint64(k), Opcode: OpRead, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(4<<20, n)},
				RemoteSTag: b.mr.STag(), RemoteTO: b.mr.Addr() + 2<<20}))
		}
		mustPost(t, a.q.PostSend(&SendWR{ID: 99, Opcode: OpSendInvalidate, Flags: FlagSignaled, Inline: []byte("invalidate"), InvalidateSTag: inv.STag()}))
		atomics := []*SendWR{
			{ID: 300, Opcode: OpAtomicFetchAdd, SGL: []SGE{a.mr.SGE(0, 8)}, RemoteSTag: word.STag(), CompareAdd: 5},
			{ID: 301, Opcode: OpAtomicCmpSwap, SGL: []SGE{a.mr.SGE(8, 8)}, RemoteSTag: word.STag(), CompareAdd: 5, Swap: 9},
			{ID: 302, Opcode: OpImmediate, Flags: FlagSolicited, Imm: 0x0102030405060708},
			{ID: 303, Opcode: OpSendImm, Inline: []byte("send, then immediate"), Imm: 7},
			{ID: 304, Opcode: OpWriteImm, SGL: []SGE{a.mr.SGE(0, 1000)}, RemoteSTag: b.mr.STag(), RemoteTO: 3 << 20, Imm: 8},
		}
		for _, wr := range atomics {
			wr.Flags |= FlagSignaled
			if err := a.q.PostSend(wr); err != nil {
				t.Fatal(err)
			}
		}
		for _, wc := range collect(t, a.cq, 3*len(sizes)+1+len(atomics), 10*time.Second) {
			if wc.Status != Success {
				t.Fatalf("connection %d: %+v", i, wc)
			}
		}
		collect(t, b.cq, len(sizes)+1+4, 5*time.Second)
	}
	time.Sleep(200 * time.Millisecond) // the last segments reach the capture
	capture.Process.Signal(syscall.SIGINT)
	capture.Wait()

	// Decode. RPC-over-RDMA and SMB Direct would try to read our test
	// payloads as theirs: they are turned off, the iWARP dissectors are not.
	out, err := exec.Command(tshark, "-r", file, "-V", "-o", "tcp.desegment_tcp_streams:TRUE",
		"--disable-protocol", "rpcordma", "--disable-protocol", "smb_direct").CombinedOutput()
	if err != nil {
		t.Fatalf("tshark -r: %v\n%s", err, out)
	}
	text := string(out)
	good := strings.Count(text, "(Good CRC32)")
	// TCP's own analysis notes (Warning/Sequence: a window filling up)
	// are about the transport, not the frames; anything else is not.
	for _, bad := range []string{"Malformed", "Bad CRC", "Expert Info (Error", "Expert Info (Warning/Protocol", "Expert Info (Warning/Malformed"} {
		if n := strings.Count(text, bad); n > 0 {
			i := strings.Index(text, bad)
			t.Errorf("%d × %q in the decode, first at:\n%s", n, bad, text[max(0, i-1500):min(len(text), i+200)])
		}
	}
	opcodes := map[string]int{}
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, "= OpCode: "); i >= 0 {
			opcodes[strings.TrimSpace(line[i+len("= OpCode: "):])]++
		}
	}
	t.Logf("%d MPA frames, %d FPDUs with a good CRC; RDMAP opcodes decoded: %v",
		strings.Count(text, "iWARP Marker Protocol data unit Aligned framing"), good, opcodes)
	// Wireshark 4.0 decodes RFC 7306's atomics by name; Immediate Data
	// (0x8, 0x9) it knows only by number (and decodes the DDP header and
	// CRC around it, checked above).
	for _, op := range []string{"Write (0x0)", "Read Request (0x1)", "Read Response (0x2)", "Send (0x3)", "Send with Invalidate (0x4)", "Send with SE (0x5)",
		"Atomic Request (0xa)", "Atomic Response (0xb)"} {
		if opcodes[op] == 0 {
			t.Errorf("no %s decoded: Wireshark did not see every operation (%v)", op, opcodes)
		}
	}
	if good == 0 {
		t.Error("no FPDU CRC was checked")
	}
	for _, f := range []string{"Add Data: 5\n", "Swap Data: 9\n", "Compare Data: 5\n", "OpCode: FetchAdd (0)", "OpCode: CmpSwap (2)"} {
		if !strings.Contains(text, f) {
			t.Errorf("no %q in the decode of the atomics", f)
		}
	}
	if !strings.Contains(text, "Markers") || !strings.Contains(text, "FPDU back pointer") {
		t.Error("no MPA marker decoded")
	}
}
