package udiwarp

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var printWireDoc = flag.Bool("wiredoc.print", false, "print the hex blocks docs/wire.md must hold")

// wireDocExamples builds every example frame of docs/wire.md from the code.
func wireDocExamples(t testing.TB) map[string][]byte {
	ex := map[string][]byte{}
	seal := func(b []byte) []byte { return SealDatagram(b, 0) }

	ex["ud-send"] = seal(dgmSend(5, 6, 1, OpSend, []byte("hi")))
	ex["ud-send-se"] = seal(dgmSend(0x012345, 6, 2, OpSendSE, []byte("ping")))
	wr := WriteRecordFields{Last: true, STag: 0x00012a9c, TO: 0x1000, MSN: 1, MO: 0, MessageLength: 5, DstQPN: 5, SrcQPN: 6}
	ex["ud-write-record"] = seal(dgmWriteRecord(wr, []byte("hello")))
	mid := WriteRecordFields{STag: 0x00012a9c, TO: 0x2004, MSN: 2, MO: 4, MessageLength: 12, DstQPN: 5, SrcQPN: 6}
	ex["ud-write-record-middle"] = seal(dgmWriteRecord(mid, []byte("5678")))

	bad := dgmWriteRecord(WriteRecordFields{Last: true, STag: 0x00012a00, TO: 0x1000, MSN: 3, MessageLength: 5, DstQPN: 5, SrcQPN: 6}, nil)
	errmsg := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DatagramDDPVersion, RDMAP: NewRDMAPControl(OpTerminate),
		ULP: 5, QN: DatagramQN(6, QueueTerminate), MSN: 1})
	errmsg, err := AppendTerminate(errmsg, &TerminateFields{Code: DDPTaggedInvalidSTag, SegmentLengthValid: true,
		DDPSegmentLength: WriteRecordHeaderSize + 5, DDPHeader: bad})
	if err != nil {
		t.Fatal(err)
	}
	ex["ud-error"] = seal(errmsg)

	rr := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpReadRequest), QN: 1, MSN: 1})
	rr = AppendReadRequest(rr, &ReadRequestFields{SinkSTag: 0x00000a01, SinkTO: 0x7f0000001000, Size: 4096, SourceSTag: 0x00000b02, SourceTO: 0x7f0000200000})
	ex["read-request"] = rr

	term := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpTerminate), QN: 2, MSN: 1})
	term, _ = AppendTerminate(term, &TerminateFields{Code: RDMAPInvalidSTag, SegmentLengthValid: true, DDPSegmentLength: 46,
		DDPHeader: rr[:DDPUntaggedHeaderSize], RDMAHeader: rr[DDPUntaggedHeaderSize:]})
	ex["terminate"] = term

	atom := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpAtomicRequest), QN: 1, MSN: 2})
	ex["atomic-request"] = AppendAtomicRequest(atom, &AtomicRequestFields{Op: AtomicFetchAdd, RequestID: 1, STag: 0x00000c03, TO: 0x40,
		SwapAddData: 1, SwapAddMask: ^uint64(0), CompareData: 0, CompareMask: ^uint64(0)})
	resp := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpAtomicResponse), QN: 3, MSN: 1})
	ex["atomic-response"] = AppendAtomicResponse(resp, 1, 41)
	imm := AppendUntagged(nil, &UntaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpImmediateData), QN: 0, MSN: 3})
	ex["immediate-data"] = AppendImmediateData(imm, 0x0102030405060708)

	req, _ := AppendMPAFrame(nil, &MPAFrameFields{Revision: 2, Enhanced: true, CRC: true, Markers: true,
		IRDORD: IRDORD{PeerToPeer: true, WriteRTR: true, ReadRTR: true, IRD: 16, ORD: 16}, PrivateData: []byte("udiwarp")})
	ex["mpa-request"] = req
	rep, _ := AppendMPAFrame(nil, &MPAFrameFields{Reply: true, Revision: 2, Enhanced: true, CRC: true,
		IRDORD: IRDORD{PeerToPeer: true, WriteRTR: true, IRD: 16, ORD: 8}})
	ex["mpa-reply"] = rep
	rej, _ := AppendMPAFrame(nil, &MPAFrameFields{Reply: true, Reject: true, Revision: 1, PrivateData: []byte("busy")})
	ex["mpa-reject"] = rej

	write := AppendTagged(nil, &TaggedFields{Last: true, DV: DDPVersion, RDMAP: NewRDMAPControl(OpWrite), STag: 0x00000d04, TO: 0x10})
	plain := MPAFramer{CRC: true}
	ex["fpdu-write"], _ = plain.Append(nil, write, []byte("abcde"))
	marked := MPAFramer{Markers: true, CRC: true}
	ex["fpdu-write-first-with-markers"], _ = marked.Append(nil, write, []byte("abcde"))
	return ex
}

func hexBlock(b []byte) string {
	var s strings.Builder
	for i := 0; i < len(b); i += 16 {
		fmt.Fprintf(&s, "%04x  % x\n", i, b[i:min(i+16, len(b))])
	}
	return s.String()
}

var exampleRE = regexp.MustCompile("(?s)<!-- example: ([a-z0-9-]+) -->\\s*```text\\n(.*?)```")

// TestWireDocExamples holds docs/wire.md to the code: every hex example in
// it is rebuilt here and must match byte for byte, and must parse.
func TestWireDocExamples(t *testing.T) {
	ex := wireDocExamples(t)
	if *printWireDoc {
		names := make([]string, 0, len(ex))
		for n := range ex {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Printf("<!-- example: %s -->\n```text\n%s```\n\n", n, hexBlock(ex[n]))
		}
	}
	doc, err := os.ReadFile("../docs/wire.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range exampleRE.FindAllSubmatch(doc, -1) {
		name := string(m[1])
		if strings.HasPrefix(name, "rd-") || strings.HasPrefix(name, "prot-") {
			continue // RD frames and protected segments: packages reliability and protect check them
		}
		want, ok := ex[name]
		if !ok {
			t.Errorf("docs/wire.md has example %q that the test does not build", name)
			continue
		}
		seen[name] = true
		var got []byte
		for _, line := range strings.Split(strings.TrimSpace(string(m[2])), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				t.Fatalf("example %s: bad line %q", name, line)
			}
			b, err := hex.DecodeString(strings.Join(f[1:], ""))
			if err != nil {
				t.Fatalf("example %s: %v", name, err)
			}
			got = append(got, b...)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("example %s in docs/wire.md differs from the code; it must read:\n%s", name, hexBlock(want))
		}
	}
	for name := range ex {
		if !seen[name] {
			t.Errorf("docs/wire.md lacks example %q:\n%s", name, hexBlock(ex[name]))
		}
	}
	// Every datagram example parses as a UD frame, every segment as a
	// stream segment, every FPDU deframes.
	for name, b := range ex {
		var err error
		switch {
		case strings.HasPrefix(name, "ud-"):
			_, err = ParseUDFrame(b)
		case strings.HasPrefix(name, "mpa-"):
			_, _, _, err = ParseMPAFrame(b)
		case strings.HasPrefix(name, "fpdu-"):
			d := MPADeframer{CRC: true, Markers: strings.Contains(name, "markers")}
			var u []byte
			if u, _, _, err = d.Next(append([]byte(nil), b...)); err == nil {
				_, err = ParseSegment(u, ProfileStream)
			}
		default:
			_, err = ParseSegment(b, ProfileStream)
		}
		if err != nil {
			t.Errorf("example %s does not parse: %v", name, err)
		}
	}
}
