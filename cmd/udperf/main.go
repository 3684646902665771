package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/udiwarp/udiwarp/protect"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage:
  udperf                           the loopback demo: UD Send/Recv beside plain UDP
  udperf demo [-quick]             the same
  udperf local [flags]             one mode, server and client in this process over loopback
  udperf compare -modes M1,M2 ...  several modes back to back, alternating, with ratios to M1
                                   (flags: udperf local -h; JSON schema: docs/udperf.md)
  udperf server [-addr :18515]     the far end of client runs (another process, host or namespace)
  udperf client -addr HOST:PORT    a run or an -a sweep against a server, every mode (one session);
                                   -llp xdp runs the UD and RD modes on AF_XDP at both ends, and
                                   -mode raw-xdp is plain UDP on AF_XDP, that path's floor
                                   (two namespaces or hosts, root; experiments/xdp.sh)
  udperf decode [-stream] HEX|-    check and describe a udiwarp datagram (or, with
                                   -stream, a DDP segment as MPA carries it); hex or
                                   a dump (xxd, od, tshark -x), "-" for stdin

udperf COMMAND -h lists a command's flags.`)
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return demo(nil, stdout, stderr)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	case "demo":
		return demo(args[1:], stdout, stderr)
	case "decode":
		return decode(args[1:], stdout, stderr)
	case "local":
		return local(args[1:], stdout, stderr)
	case "compare":
		return compare(args[1:], stdout, stderr)
	case "server":
		return server(args[1:], stdout, stderr)
	case "client":
		return client(args[1:], stdout, stderr)
	}
	if _, err := parseMode(args[0]); err == nil {
		fmt.Fprintf(stderr, "udperf: unknown command %q: did you mean udperf local -mode %s?\n", args[0], args[0])
	} else {
		fmt.Fprintf(stderr, "udperf: unknown command %q (commands: demo, local, compare, server, client, decode; udperf -h)\n", args[0])
	}
	return 2
}

// decodeAbout is `udperf decode -h`'s text.
const decodeAbout = `Checks one udiwarp datagram (a UD frame or an RD frame; with -stream, a DDP segment as MPA
carries it) against docs/wire.md and prints its fields, or the field that is wrong and the
Terminate it would draw.

HEX is the frame's bytes: plain hex in one run or groups, with spaces, commas, colons or 0x
prefixes, or a dump with its offset column and ASCII column as docs/wire.md, xxd, hexdump -C,
od -tx1 and tshark -x print them. "-" reads it from stdin:

  xxd -p frame.bin | udperf decode -
  tshark -r cap.pcap -x -c 1 | udperf decode -      (Ethernet, IP and UDP headers are taken off)`

func decode(args []string, stdout, stderr io.Writer) int {
	return decodeFrom(args, os.Stdin, stdout, stderr)
}

// decodeFrom is decode with stdin given.
func decodeFrom(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := newCommand("decode", "udperf decode [-stream] HEX... | -", decodeAbout)
	cmd.positional = true
	stream := cmd.fs.Bool("stream", false, "decode a standard (DV=1) DDP segment without datagram framing")
	if code, ok := cmd.parse(args, stdout, stderr); !ok {
		return code
	}
	if cmd.fs.NArg() == 0 {
		cmd.usage(stderr)
		return 2
	}
	text := strings.Join(cmd.fs.Args(), " ")
	if cmd.fs.NArg() == 1 && cmd.fs.Arg(0) == "-" {
		in, err := io.ReadAll(io.LimitReader(stdin, 1<<20))
		if err != nil {
			fmt.Fprintf(stderr, "udperf decode: stdin: %v\n", err)
			return 2
		}
		text = string(in)
	}
	b, err := parseHex(text)
	if err == nil && len(b) == 0 {
		err = errors.New("no bytes given")
	}
	if err != nil {
		fmt.Fprintf(stderr, "udperf decode: %v\n", err)
		return 2
	}
	var seg udiwarp.Segment
	if *stream {
		seg, err = udiwarp.ParseSegment(b, udiwarp.ProfileStream)
	} else {
		if p, what, ok := udpPayload(b); ok {
			fmt.Fprintln(stdout, what)
			b = p
		}
		var t udiwarp.FrameType
		if t, err = udiwarp.Classify(b); err == nil && t == udiwarp.FrameRD {
			return decodeRD(b, stdout, stderr)
		}
		if err == nil && t == udiwarp.FrameEnvelope {
			return decodeEnvelope(b, stdout, stderr)
		}
		seg, err = udiwarp.ParseUDFrame(b)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		if code, ok := udiwarp.CodeOf(err); ok {
			note := ""
			if code == udiwarp.MPACRCError && !*stream {
				// RFC 5040 has one CRC error code, MPA's; a datagram's bad
				// trailer reports it too (docs/wire.md §9), with no MPA in
				// the frame.
				note = ": the one CRC error code iWARP defines, which datagrams use too; no MPA is involved"
			}
			fmt.Fprintf(stderr, "a Terminate would report: %s (layer %d, etype %d, ecode %#02x)%s\n", code, code.Layer(), code.EType(), code.ECode(), note)
		}
		return 1
	}
	fmt.Fprintln(stdout, seg)
	return 0
}

// decodeEnvelope describes a protection envelope (docs/wire.md §12): its
// header, and the frame inside as far as it travels in clear.
func decodeEnvelope(b []byte, stdout, stderr io.Writer) int {
	if b[0] == byte(protect.KindRefuse)<<2 {
		var r protect.Refusal
		_, err := udiwarp.OpenDatagram(b)
		if err == nil {
			err = r.Parse(b)
		}
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stdout, "Refuse: this side runs %v; the Hello of QP %d to QP %d (token %#016x) is refused\n", r.Mode, r.FromQP, r.NameQP, r.Token)
		return 0
	}
	var h protect.Header
	if err := h.Parse(b); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if h.Kind == protect.KindContact {
		f, err := udiwarp.OpenDatagram(b)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stdout, "Contact (%v): X25519 share %x\n", h.Mode, h.Share)
		return decodeRD(udiwarp.SealDatagram(append([]byte(nil), f[h.Size:]...), 0), stdout, stderr)
	}
	phase := 0
	if h.Flags&protect.FlagPhase != 0 {
		phase = 1
	}
	frame := b[h.Size : len(b)-protect.TagSize]
	fmt.Fprintf(stdout, "Sealed (%v): key ID %#08x, packet number %d, key phase %d, %d of %d frame bytes in clear, tag %x\n",
		h.Mode, h.KeyID, h.PN, phase, h.ClearLen, len(frame), b[len(b)-protect.TagSize:])
	if h.Flags&protect.FlagInitial != 0 {
		s := h.Share
		fmt.Fprintf(stdout, "  initial block: opener share %x, Hello token %x, keyed token %x, QP %d -> QP %d, opener epoch %x\n",
			s[:32], s[32:40], s[40:48], binary.BigEndian.Uint32(s[48:]), binary.BigEndian.Uint32(s[52:]), s[56:60])
	}
	if h.ClearLen < len(frame) {
		fmt.Fprintf(stdout, "  frame (its headers; the payload, %d bytes, is encrypted): ", len(frame)-h.ClearLen)
	} else {
		fmt.Fprint(stdout, "  frame: ")
	}
	inner := append(append([]byte(nil), frame...), 0, 0, 0, 0)
	if frame[0]&3 == 3 {
		return decodeRD(udiwarp.SealDatagram(inner[:len(frame)], 0), stdout, stderr)
	}
	seg, err := udiwarp.ParseUDFrameNoCRC(inner)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, seg)
	return 0
}

// decodeRD describes an RD frame: its reliability header (docs/wire.md
// §11) and, in a Data frame, the DDP segment it carries.
func decodeRD(b []byte, stdout, stderr io.Writer) int {
	frame, err := udiwarp.OpenDatagram(b)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	var h reliability.Header
	if err := h.Parse(frame); err != nil {
		fmt.Fprintf(stderr, "RD header: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "RD %v: QP %d -> QP %d, epoch %#08x, token %#016x, window %d", h.Type, h.SrcQPN, h.DstQPN, h.Epoch, h.Token, h.Window)
	if h.Type == reliability.Data {
		fmt.Fprintf(stdout, ", seq %d", h.Seq)
	}
	if h.HasInit {
		fmt.Fprintf(stdout, ", issues token %#016x", h.Issued)
	}
	if h.WantsAck {
		fmt.Fprint(stdout, ", ack now")
	}
	fmt.Fprintln(stdout)
	if h.HasAck {
		fmt.Fprintf(stdout, "  ack: cumulative %d, delay %d µs", h.Ack.Cumulative, h.Ack.Delay)
		for _, r := range h.Ack.Ranges {
			fmt.Fprintf(stdout, ", [%d, %d)", r.Start, r.Start+r.Len)
		}
		for _, e := range h.Ack.Errors {
			fmt.Fprintf(stdout, ", error %d on %d", e.Code, e.Seq)
		}
		if h.HasRNR {
			fmt.Fprint(stdout, ", receiver not ready")
		}
		fmt.Fprintln(stdout)
	}
	if h.Type != reliability.Data {
		return 0
	}
	seg, err := udiwarp.ParseSegment(frame[h.Size:], udiwarp.ProfileDatagram)
	if err != nil {
		fmt.Fprintf(stderr, "its DDP segment: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "  %v\n", seg)
	return 0
}
