// Package mpegts holds the little of MPEG-2 transport streams (ISO/IEC
// 13818-1) that udstream needs: the 188-byte packet with its 0x47 sync
// byte, the program clock reference (PCR) in a packet's adaptation field
// for pacing and buffering by the stream's own clock, and a scan that
// finds the whole packets inside a byte range, resynchronising on sync
// bytes, so that a receiver forwards only packets that arrived whole.
package mpegts

import "time"

const (
	// PacketSize is a transport stream packet's size.
	PacketSize = 188
	// Sync is every packet's first byte.
	Sync = 0x47
	// pcrHz is the PCR's clock: 27 MHz (a 33-bit base at 90 kHz times 300
	// plus a 9-bit extension).
	pcrHz = 27_000_000
)

// PCR returns the program clock reference p carries, if it has one: the
// packet's adaptation field (adaptation_field_control 2 or 3) with its
// PCR_flag set.
func PCR(p []byte) (pcr uint64, ok bool) {
	if len(p) < PacketSize || p[0] != Sync || p[3]&0x20 == 0 {
		return 0, false
	}
	afl := int(p[4])
	if afl < 7 || afl > PacketSize-5 || p[5]&0x10 == 0 {
		return 0, false
	}
	b := p[6:12]
	base := uint64(b[0])<<25 | uint64(b[1])<<17 | uint64(b[2])<<9 | uint64(b[3])<<1 | uint64(b[4])>>7
	ext := uint64(b[4]&1)<<8 | uint64(b[5])
	return base*300 + ext, true
}

// Since is the stream time from PCR a to PCR b (b after a; the 33-bit
// base wraps after about 26.5 hours, and so does this).
func Since(a, b uint64) time.Duration {
	const wrap = (1 << 33) * 300
	d := (b + wrap - a) % wrap
	return time.Duration(d * 1000 / (pcrHz / 1_000_000))
}

// Looks reports whether b begins like a transport stream: sync bytes at
// the start of each of its first packets (up to four, at least one).
func Looks(b []byte) bool {
	n := min(len(b)/PacketSize, 4)
	if n == 0 {
		return false
	}
	for i := range n {
		if b[i*PacketSize] != Sync {
			return false
		}
	}
	return true
}

// Packets calls f with the offset of every whole packet in b[lo:hi]. A
// packet is expected every PacketSize bytes from base (where the sender
// cut its chunks), and one whose sync byte is there counts. Where the
// expected sync byte is missing (the source's stream is out of step),
// the scan resynchronises on the next sync byte that a packet boundary
// confirms (a sync byte PacketSize later, or the range's end). It
// returns how many it found.
func Packets(b []byte, base, lo, hi int, f func(off int)) int {
	hi = min(hi, len(b))
	p := lo + ((base-lo)%PacketSize+PacketSize)%PacketSize // the first expected start at or after lo
	n := 0
	for p+PacketSize <= hi {
		if b[p] == Sync { // where a packet is expected: its sync byte suffices
			f(p)
			n++
			p += PacketSize
			continue
		}
		// Out of step: the next sync byte a following one confirms.
		q := p + 1
		for ; q+PacketSize <= hi; q++ {
			if b[q] == Sync && (q+PacketSize == hi || b[q+PacketSize] == Sync) {
				break
			}
		}
		p = q
	}
	return n
}
