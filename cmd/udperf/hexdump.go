package main

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// parseHex reads the bytes of a frame from hex in the shapes people paste
// and tools print:
//
//   - plain hex, in one run or in groups, separated by spaces, tabs,
//     newlines, commas or colons, with or without 0x prefixes (xxd -p,
//     od -An -tx1, tshark -T fields -e udp.payload, a C array);
//   - dumps with an offset column: docs/wire.md's examples and tshark -x
//     ("0000  42 43 ..."), xxd and hexdump -C ("00000000: 4243 ...",
//     "00000000  42 43 ..."), "00:" or "0000:" columns, and od's default
//     octal offsets ("0000000 42 43 ...", od -tx1).
//
// It is tolerant of the shape but never guesses: an offset column is
// recognised only at the start of a line, where it is a run of hex digits
// followed by a colon, by two spaces or a tab (4 to 8 digits), or od's
// 7-digit octal offset followed by a space, and only if its value is the
// number of bytes read before it (so hex data is never taken for an
// offset, and a dump with a line missing is refused). On a line that has
// an offset column, the ASCII column of xxd, hexdump -C and tshark is
// dropped only when it is exactly the rendering of the line's bytes (each
// printable byte itself, any other '.'), so data is never dropped for a
// gutter. A hex group must have an even number of digits (a lone 0xN is
// the byte 0N).
func parseHex(text string) ([]byte, error) {
	var out []byte
	dump := false // an offset column has been seen
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	for n, line := range lines {
		n++
		if strings.TrimSpace(line) == "" {
			continue
		}
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "<!--") && strings.HasSuffix(t, "-->") {
			continue // a Markdown fence or comment around a pasted example
		}
		if strings.TrimSpace(line) == "*" {
			return nil, fmt.Errorf("line %d: od's '*' stands for repeated lines: print every byte (od -v, or xxd)", n)
		}
		rest, offset, err := cutOffset(line, len(out), dump)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if offset {
			dump = true
			if strings.TrimSpace(rest) == "" {
				continue // od's and hexdump's last line: the total length
			}
			if b, ok := withGutter(rest); ok {
				out = append(out, b...)
				continue
			}
		}
		b, err := hexBytes(rest)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, b...)
	}
	return out, nil
}

// cutOffset removes line's offset column, if it has one whose value is
// at, the bytes read before it. With dump (earlier lines had offsets), a
// line that starts like an offset of another value is refused.
func cutOffset(line string, at int, dump bool) (rest string, ok bool, err error) {
	i := 0
	for i < len(line) && isHexDigit(line[i]) {
		i++
	}
	if i == 0 {
		return line, false, nil
	}
	digits, after := line[:i], line[i:]
	check := func(base int, rest string) (string, bool, error) {
		v, err := strconv.ParseUint(digits, base, 64)
		if err != nil || v != uint64(at) {
			if dump && err == nil && v == 0 {
				return "", false, fmt.Errorf("a second dump starts here, after %d bytes: give one frame (tshark -c 1, or the lines of one packet)", at)
			}
			if dump {
				return "", false, fmt.Errorf("offset %s, but %d bytes (%#x) come before it: is a line missing?", digits, at, at)
			}
			return line, false, nil // not an offset: hex data
		}
		return rest, true, nil
	}
	switch {
	case strings.HasPrefix(after, ":") && (len(after) == 1 || after[1] == ' ' || after[1] == '\t'):
		// xxd's "00000000:", "0000:", "00:".
		return check(16, after[1:])
	case len(digits) == 7 && isOctal(digits) && (after == "" || after[0] == ' '):
		// od's octal offset: an odd number of digits is never hex data.
		return check(8, after)
	case len(digits)%2 == 0 && len(digits) >= 4 && len(digits) <= 8 && (after == "" || strings.HasPrefix(after, "  ") || after[0] == '\t'):
		// docs/wire.md's, tshark's and hexdump -C's "0000  ".
		if after == "" && !dump {
			return line, false, nil // a lone group on the first line is data
		}
		return check(16, after)
	}
	return line, false, nil
}

// withGutter splits a dump line's rest into its hex and its ASCII column,
// if it has one: the text after a run of two or more spaces that renders
// exactly the bytes before it.
func withGutter(rest string) ([]byte, bool) {
	for i := 0; i+1 < len(rest); i++ {
		if rest[i] != ' ' || rest[i+1] != ' ' || strings.TrimSpace(rest[:i]) == "" {
			continue
		}
		b, err := hexBytes(rest[:i])
		if err != nil {
			continue
		}
		// The column starts after two spaces or more; it may start with
		// spaces of its own (bytes 0x20).
		for j := i + 2; j <= len(rest) && (j == i+2 || rest[j-1] == ' '); j++ {
			if renders(rest[j:], b) {
				return b, true
			}
		}
	}
	return nil, false
}

// renders says whether gutter is the ASCII column of b, as xxd, hexdump
// -C (between bars) and tshark print it. Trailing spaces may have been
// trimmed away by an editor.
func renders(gutter string, b []byte) bool {
	if len(gutter) >= 2 && gutter[0] == '|' && strings.HasSuffix(gutter, "|") {
		gutter = gutter[1 : len(gutter)-1]
	}
	if gutter == "" || len(gutter) > len(b) {
		return false
	}
	for i, c := range b {
		want := byte('.')
		if c >= 0x20 && c < 0x7f {
			want = c
		}
		if i >= len(gutter) {
			if want != ' ' {
				return false
			}
			continue
		}
		if gutter[i] != want {
			return false
		}
	}
	return true
}

// hexBytes decodes hex groups separated by spaces, tabs, commas or
// colons, each with or without a 0x prefix.
func hexBytes(s string) ([]byte, error) {
	var out []byte
	for _, g := range strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(" \t,:;", r) }) {
		digits := g
		if strings.HasPrefix(g, "0x") || strings.HasPrefix(g, "0X") {
			digits = g[2:]
			if len(digits) == 1 {
				digits = "0" + digits // 0x7: the byte 07
			}
		}
		for _, c := range []byte(digits) {
			if !isHexDigit(c) {
				return nil, fmt.Errorf("%q is not hex", g)
			}
		}
		if digits == "" || len(digits)%2 != 0 {
			return nil, fmt.Errorf("%q: an odd number of hex digits (a byte is two)", g)
		}
		b, _ := hex.DecodeString(digits)
		out = append(out, b...)
	}
	return out, nil
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isOctal(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}

// udpPayload finds the UDP payload of a captured packet (tshark -x prints
// the whole frame): Ethernet (with 802.1Q tags), Linux cooked (SLL, SLL2)
// or a bare IP packet, then IPv4 or IPv6 without extension headers, then
// UDP. Every length must agree, so a udiwarp datagram is never taken for
// one. It describes what it took off.
func udpPayload(b []byte) ([]byte, string, bool) {
	try := func(link string, off int, etype uint16) ([]byte, string, bool) {
		if off > len(b) {
			return nil, "", false
		}
		p := b[off:]
		var src, dst netip.Addr
		var udp []byte
		switch etype {
		case 0x0800:
			h, err := ipv4.ParseHeader(p)
			if err != nil || h.Version != 4 || h.Protocol != 17 || h.TotalLen > len(p) || h.TotalLen < h.Len+8 || h.FragOff != 0 || h.Flags&ipv4.MoreFragments != 0 {
				return nil, "", false
			}
			src, _ = netip.AddrFromSlice(h.Src.To4())
			dst, _ = netip.AddrFromSlice(h.Dst.To4())
			udp = p[h.Len:h.TotalLen] // what follows is the link's padding
		case 0x86dd:
			h, err := ipv6.ParseHeader(p)
			if err != nil || h.Version != 6 || h.NextHeader != 17 || ipv6.HeaderLen+h.PayloadLen != len(p) || h.PayloadLen < 8 {
				return nil, "", false
			}
			src, _ = netip.AddrFromSlice(h.Src)
			dst, _ = netip.AddrFromSlice(h.Dst)
			udp = p[ipv6.HeaderLen:]
		default:
			return nil, "", false
		}
		if int(binary.BigEndian.Uint16(udp[4:])) != len(udp) {
			return nil, "", false
		}
		sport, dport := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:])
		desc := fmt.Sprintf("%s: UDP %s -> %s, %d-byte payload",
			link, netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport), len(udp)-8)
		return udp[8:], desc, true
	}
	be16 := func(i int) uint16 {
		if i+2 > len(b) {
			return 0
		}
		return binary.BigEndian.Uint16(b[i:])
	}
	// Ethernet II, with up to two VLAN tags.
	for off := 12; off <= 20; off += 4 {
		if t := be16(off); t != 0x8100 && t != 0x88a8 {
			if p, d, ok := try("Ethernet", off+2, t); ok {
				return p, d, ok
			}
			break
		}
	}
	if p, d, ok := try("Linux cooked capture", 16, be16(14)); ok {
		return p, d, ok
	}
	if p, d, ok := try("Linux cooked capture v2", 20, be16(0)); ok {
		return p, d, ok
	}
	if len(b) > 0 && b[0]>>4 == 4 {
		return try("IPv4", 0, 0x0800)
	}
	if len(b) > 0 && b[0]>>4 == 6 {
		return try("IPv6", 0, 0x86dd)
	}
	return nil, "", false
}
