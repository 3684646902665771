package udiwarp

import (
	"encoding/binary"
	"math"
)

// MPA framing for RC queue pairs over TCP (RFC 5044 §4).
//
// An FPDU is ULPDU_Length (2 bytes), the ULPDU (a DDP segment), 0-3 pad
// bytes that make the FPDU a multiple of four, and a CRC32c (4 bytes; zero
// when CRC was not negotiated). When the peer asked for markers, a 4-byte
// marker sits at every 512th octet of the stream counted from the first
// FPDU of full operation; it holds FPDUPTR, the distance back to the
// ULPDU_Length field of the FPDU it sits in. A marker that falls exactly
// between two FPDUs belongs to the following one, with FPDUPTR 0. Markers
// are covered by the CRC of the FPDU that contains them and are not counted
// in ULPDU_Length or in the pad.

const (
	MPAHeaderSize     = 2
	MPAMarkerSize     = 4
	MPAMarkerInterval = 512
	// MaxULPDU is the largest ULPDU_Length.
	MaxULPDU = math.MaxUint16
)

// MPAPad returns the pad after a ULPDU of n bytes.
func MPAPad(n int) int { return (4 - (MPAHeaderSize+n)%4) % 4 }

// FPDUSize returns the size of an FPDU without markers.
func FPDUSize(ulpdu int) int { return MPAHeaderSize + ulpdu + MPAPad(ulpdu) + CRCSize }

// markersIn counts marker positions (multiples of 512) in [from, to).
func markersIn(from, to uint64) uint64 {
	if to <= from {
		return 0
	}
	return (to+MPAMarkerInterval-1)/MPAMarkerInterval - (from+MPAMarkerInterval-1)/MPAMarkerInterval
}

// MPAFramer builds the FPDUs of one direction of an MPA connection. Its
// zero value sends without markers and with a zero CRC field.
type MPAFramer struct {
	Markers bool   // insert markers (the peer set M)
	CRC     bool   // compute the CRC (either side set C)
	pos     uint64 // stream octets sent since full operation began
}

// StreamOffset returns the number of stream octets framed so far.
func (f *MPAFramer) StreamOffset() uint64 { return f.pos }

// WireSize returns the stream octets the next FPDU of a ulpdu-byte ULPDU takes.
func (f *MPAFramer) WireSize(ulpdu int) int {
	n := FPDUSize(ulpdu)
	if !f.Markers {
		return n
	}
	_, end := mpaLayout(f.pos, ulpdu, true)
	return int(end - f.pos)
}

// mpaLayout walks an FPDU of an n-byte ULPDU that starts at stream offset
// pos, with markers, and returns where its CRC field starts and where it
// ends. Markers and FPDUs are both 4-byte aligned, so a marker is never cut.
func mpaLayout(pos uint64, n int, markers bool) (crcAt, end uint64) {
	body := uint64(MPAHeaderSize + n + MPAPad(n))
	if !markers {
		return pos + body, pos + body + CRCSize
	}
	p := pos
	if p%MPAMarkerInterval == 0 {
		p += MPAMarkerSize
	}
	// Every marker boundary in (p, p+body+4m] adds a marker; the fixed
	// point of m is the count.
	m := uint64(0)
	for {
		mm := markersIn(p+1, p+body+4*m+1)
		if mm == m {
			break
		}
		m = mm
	}
	crcAt = p + body + 4*m
	return crcAt, crcAt + CRCSize
}

// Append appends the FPDU carrying hdr followed by payload (one ULPDU, so a
// DDP header and its payload need not be contiguous) to dst.
func (f *MPAFramer) Append(dst, hdr, payload []byte) ([]byte, error) {
	n := len(hdr) + len(payload)
	if n > MaxULPDU {
		return dst, fieldErr("MPA FPDU", "ULPDU_Length", uint64(n), "<= 65535", ErrTooLong, MPALocalCatastrophic)
	}
	start := len(dst)
	var lenField [MPAHeaderSize]byte
	binary.BigEndian.PutUint16(lenField[:], uint16(n))
	var pad [3]byte
	fpduStart := f.pos // where ULPDU_Length will sit; moves past a leading marker
	if f.Markers && f.pos%MPAMarkerInterval == 0 {
		dst = binary.BigEndian.AppendUint32(dst, 0) // FPDUPTR 0: belongs to this FPDU
		f.pos += MPAMarkerSize
		fpduStart = f.pos
	}
	dst = f.appendStream(dst, lenField[:], fpduStart)
	dst = f.appendStream(dst, hdr, fpduStart)
	dst = f.appendStream(dst, payload, fpduStart)
	dst = f.appendStream(dst, pad[:MPAPad(n)], fpduStart)
	if f.Markers && f.pos%MPAMarkerInterval == 0 {
		// A marker right after the pad is inside this FPDU and its CRC.
		dst = binary.BigEndian.AppendUint32(dst, uint32(f.pos-fpduStart)&0xFFFF)
		f.pos += MPAMarkerSize
	}
	var crc uint32
	if f.CRC {
		crc = CRC32c(dst[start:])
	}
	dst = AppendCRC(dst, crc)
	f.pos += CRCSize
	return dst, nil
}

// appendStream appends b, inserting a marker at each 512-octet boundary
// reached before one of its bytes.
func (f *MPAFramer) appendStream(dst, b []byte, fpduStart uint64) []byte {
	for len(b) > 0 {
		if f.Markers && f.pos%MPAMarkerInterval == 0 {
			dst = binary.BigEndian.AppendUint32(dst, uint32(f.pos-fpduStart)&0xFFFF)
			f.pos += MPAMarkerSize
		}
		k := len(b)
		if f.Markers {
			if room := MPAMarkerInterval - f.pos%MPAMarkerInterval; uint64(k) > room {
				k = int(room)
			}
		}
		dst = append(dst, b[:k]...)
		f.pos += uint64(k)
		b = b[k:]
	}
	return dst
}

// MPADeframer parses the FPDUs of one direction of an MPA connection.
type MPADeframer struct {
	Markers bool // expect markers (we set M)
	CRC     bool // check the CRC (either side set C)
	// MaxULPDU rejects longer FPDUs; zero means 65535.
	MaxULPDU int
	pos      uint64
}

// StreamOffset returns the number of stream octets consumed so far.
func (d *MPADeframer) StreamOffset() uint64 { return d.pos }

// Next parses the FPDU at the front of buf, which must start where the
// previous FPDU ended. It returns the ULPDU and the number of stream octets
// the FPDU took. When buf does not yet hold the whole FPDU it returns n = 0,
// no error, and need, the octets buf must hold for another try.
//
// With markers, Next removes them by moving the ULPDU's bytes down inside
// buf; the returned ULPDU is a view of buf. Any error leaves the stream
// unusable, as RFC 5044 says it must.
func (d *MPADeframer) Next(buf []byte) (ulpdu []byte, n, need int, err error) {
	const frame = "MPA FPDU"
	lenAt := 0
	if d.Markers && d.pos%MPAMarkerInterval == 0 {
		lenAt = MPAMarkerSize
	}
	if len(buf) < lenAt+MPAHeaderSize {
		return nil, 0, lenAt + MPAHeaderSize, nil
	}
	if lenAt > 0 {
		if ptr := binary.BigEndian.Uint16(buf[2:]); ptr != 0 {
			return nil, 0, 0, fieldErr(frame, "FPDUPTR of the leading marker", uint64(ptr), "0", ErrMarker, MPAMarkerMismatch)
		}
	}
	l := int(binary.BigEndian.Uint16(buf[lenAt:]))
	max := d.MaxULPDU
	if max <= 0 || max > MaxULPDU {
		max = MaxULPDU
	}
	if l > max {
		return nil, 0, 0, fieldErr(frame, "ULPDU_Length", uint64(l), "<= "+itoa(uint64(max)), ErrTooLong, MPALocalCatastrophic)
	}
	crcAt, end := mpaLayout(d.pos, l, d.Markers)
	total := int(end - d.pos)
	if len(buf) < total {
		return nil, 0, total, nil
	}
	crcIdx := int(crcAt - d.pos)
	if d.CRC {
		if got, want := WireCRC(buf[crcIdx:]), CRC32c(buf[:crcIdx]); got != want {
			return nil, 0, 0, &FieldError{Frame: frame, Field: "CRC32c", Value: uint64(got), Want: crcWant(want), Err: ErrCRC, Code: MPACRCError}
		}
	}
	start := lenAt + MPAHeaderSize
	if !d.Markers {
		d.pos += uint64(total)
		return buf[start : start+l], total, 0, nil
	}
	// Check each marker's FPDUPTR, then squeeze the markers out.
	fpdu := d.pos + uint64(lenAt)
	w := start
	for r := start; r < crcIdx; {
		p := d.pos + uint64(r)
		if p%MPAMarkerInterval == 0 {
			if ptr := binary.BigEndian.Uint16(buf[r+2:]); uint64(ptr) != (p-fpdu)&0xFFFF {
				return nil, 0, 0, fieldErr(frame, "FPDUPTR", uint64(ptr), itoa((p-fpdu)&0xFFFF), ErrMarker, MPAMarkerMismatch)
			}
			r += MPAMarkerSize
			continue
		}
		k := min(crcIdx-r, int(MPAMarkerInterval-p%MPAMarkerInterval))
		w += copy(buf[w:], buf[r:r+k])
		r += k
	}
	d.pos += uint64(total)
	return buf[start : start+l], total, 0, nil
}
