package mpegts

import "encoding/binary"

// RTPPayload returns the transport stream packets an RTP datagram
// carries (RFC 3550's fixed header, its CSRC list, header extension and
// padding stripped; RFC 2250's MP2T payload is whole TS packets), and
// whether d is such a datagram. A datagram that starts with a sync byte
// is plain MPEG-TS over UDP, not RTP; an RTP one whose payload does not
// start with a sync byte is not taken as carrying TS.
func RTPPayload(d []byte) ([]byte, bool) {
	if len(d) < 12 || d[0] == Sync || d[0]>>6 != 2 {
		return nil, false
	}
	h := 12 + 4*int(d[0]&0x0f)
	if d[0]&0x10 != 0 { // a header extension: 4 bytes, then its length in words
		if len(d) < h+4 {
			return nil, false
		}
		h += 4 + 4*int(binary.BigEndian.Uint16(d[h+2:]))
	}
	end := len(d)
	if d[0]&0x20 != 0 { // padding: its length is the last byte
		end -= int(d[len(d)-1])
	}
	if h > end || (h < end && d[h] != Sync) {
		return nil, false
	}
	return d[h:end], true
}
