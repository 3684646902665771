package llp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// refSum is the RFC 1071 checksum the slow way, 16 bits at a time.
func refSum(parts ...[]byte) uint16 {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	if len(b)%2 == 1 {
		b = append(b, 0)
	}
	var s uint32
	for i := 0; i < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func testFrame(v6 bool, payload []byte) []byte {
	h := frameHdr{
		DstMAC: [6]byte{2, 0, 0, 0, 0, 2}, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1},
		Src: netip.MustParseAddrPort("10.1.2.1:4791"), Dst: netip.MustParseAddrPort("10.1.2.2:5000"), ID: 7,
	}
	if v6 {
		h.Src = netip.MustParseAddrPort("[fd00::1]:4791")
		h.Dst = netip.MustParseAddrPort("[fd00::2]:5000")
	}
	hl := frameHdrLen(v6)
	b := make([]byte, hl+len(payload))
	copy(b[hl:], payload)
	n := buildFrame(b, &h, len(payload))
	return b[:n]
}

func TestFrameRoundTrip(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, n := range []int{0, 1, 2, 3, 31, 32, 33, 64, 1400, 1472} {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(i*7 + n)
			}
			b := testFrame(v6, p)
			f, r := parseFrame(b)
			if r != dropNone {
				t.Fatalf("v6=%v n=%d: dropped: %v", v6, n, r)
			}
			if !bytes.Equal(b[f.Payload:f.Payload+f.PayloadLen], p) {
				t.Fatalf("v6=%v n=%d: payload differs", v6, n)
			}
			if f.Src.Port() != 4791 || f.Dst.Port() != 5000 || f.Src.Addr().Is6() != v6 {
				t.Fatalf("v6=%v: addresses %v %v", v6, f.Src, f.Dst)
			}
			// The checksums against a reference implementation.
			var udp, pseudo []byte
			if v6 {
				ip := b[ethHdrLen:]
				udp = ip[ipv6HdrLen:]
				pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, byte(len(udp)>>8), byte(len(udp)), 0, 0, 0, protoUDP)
			} else {
				ip := b[ethHdrLen:]
				if refSum(ip[:ipv4HdrLen]) != 0 {
					t.Fatalf("n=%d: IPv4 header checksum wrong", n)
				}
				udp = ip[ipv4HdrLen:]
				pseudo = append(append([]byte{}, ip[12:20]...), 0, protoUDP, byte(len(udp)>>8), byte(len(udp)))
			}
			if refSum(pseudo, udp) != 0 {
				t.Fatalf("v6=%v n=%d: UDP checksum wrong", v6, n)
			}
		}
	}
}

func TestFrameRejects(t *testing.T) {
	p := []byte("hello, world")
	for _, v6 := range []bool{false, true} {
		l3 := ethHdrLen
		cases := []struct {
			name string
			mod  func(b []byte) []byte
			want dropReason
		}{
			{"short", func(b []byte) []byte { return b[:10] }, dropEth},
			{"arp", func(b []byte) []byte { b[12], b[13] = 0x08, 0x06; return b }, dropEth},
			{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, dropIP},
			{"udp-csum", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, dropUDPChecksum},
			{"version", func(b []byte) []byte { b[l3] ^= 0xc0; return b }, dropIP},
		}
		if v6 {
			cases = append(cases,
				struct {
					name string
					mod  func(b []byte) []byte
					want dropReason
				}{"zero-udp-csum", func(b []byte) []byte { b[l3+ipv6HdrLen+6], b[l3+ipv6HdrLen+7] = 0, 0; return b }, dropUDPChecksum},
				struct {
					name string
					mod  func(b []byte) []byte
					want dropReason
				}{"udp-len", func(b []byte) []byte { b[l3+ipv6HdrLen+5]--; return b }, dropUDPLength},
			)
		} else {
			cases = append(cases,
				struct {
					name string
					mod  func(b []byte) []byte
					want dropReason
				}{"ip-csum", func(b []byte) []byte { b[l3+10] ^= 0x10; return b }, dropIPChecksum},
				struct {
					name string
					mod  func(b []byte) []byte
					want dropReason
				}{"udp-len", func(b []byte) []byte { b[l3+ipv4HdrLen+5]--; return b }, dropUDPLength},
				struct {
					name string
					mod  func(b []byte) []byte
					want dropReason
				}{"fragment", func(b []byte) []byte {
					b[l3+6] |= 0x20 // MF
					fixIPv4Checksum(b[l3:])
					return b
				}, dropIP},
			)
		}
		for _, c := range cases {
			b := c.mod(testFrame(v6, p))
			if _, r := parseFrame(b); r != c.want {
				t.Errorf("v6=%v %s: got %v, want %v", v6, c.name, r, c.want)
			}
		}
	}
	// A zero UDP checksum over IPv4 means none: accepted.
	b := testFrame(false, p)
	b[ethHdrLen+ipv4HdrLen+6], b[ethHdrLen+ipv4HdrLen+7] = 0, 0
	if _, r := parseFrame(b); r != dropNone {
		t.Errorf("IPv4 without a UDP checksum: %v", r)
	}
	// Ethernet padding past the IP length is ignored.
	b = append(testFrame(false, []byte{1}), make([]byte, 20)...)
	if f, r := parseFrame(b); r != dropNone || f.PayloadLen != 1 {
		t.Errorf("padded frame: %v %d", r, f.PayloadLen)
	}
	// One 802.1Q tag.
	b = testFrame(false, p)
	b = append(b[:12], append([]byte{0x81, 0x00, 0x00, 0x05}, b[12:]...)...)
	if f, r := parseFrame(b); r != dropNone || string(b[f.Payload:f.Payload+f.PayloadLen]) != string(p) {
		t.Errorf("tagged frame: %v", r)
	}
}

func fixIPv4Checksum(ip []byte) {
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:12], refSum(ip[:int(ip[0]&0xf)*4]))
}

func FuzzParseFrame(f *testing.F) {
	f.Add(testFrame(false, []byte("x")))
	f.Add(testFrame(true, []byte("hello")))
	f.Add(testFrame(false, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		fi, r := parseFrame(b)
		if r != dropNone {
			return
		}
		if fi.Payload < 0 || fi.PayloadLen < 0 || fi.Payload+fi.PayloadLen > len(b) {
			t.Fatalf("payload [%d,+%d) outside %d bytes", fi.Payload, fi.PayloadLen, len(b))
		}
		if fi.Src.Addr().Is4() != fi.Dst.Addr().Is4() {
			t.Fatalf("mixed families %v %v", fi.Src, fi.Dst)
		}
		// What parses rebuilds into a frame that parses the same.
		p := b[fi.Payload : fi.Payload+fi.PayloadLen]
		if fi.PayloadLen > 0xffff-ipv6HdrLen-udpHdrLen {
			return
		}
		v6 := fi.Dst.Addr().Is6()
		nb := make([]byte, frameHdrLen(v6)+len(p))
		copy(nb[frameHdrLen(v6):], p)
		h := frameHdr{Src: fi.Src, Dst: fi.Dst}
		n := buildFrame(nb, &h, len(p))
		g, r := parseFrame(nb[:n])
		if r != dropNone || g.Src != fi.Src || g.Dst != fi.Dst || !bytes.Equal(nb[g.Payload:g.Payload+g.PayloadLen], p) {
			t.Fatalf("rebuilt frame: %v %+v vs %+v", r, g, fi)
		}
	})
}
