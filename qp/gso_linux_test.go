package qp

import (
	"testing"

	"github.com/udiwarp/udiwarp/udiwarp"
)

// TestGSOSegmentsNear4GiB counts the segments one GSO send may carry for a
// Write-Record message whose remaining length is close to 4 GiB: the
// count of segments left is computed without wrapping 32 bits, so such a
// message is batched like any other (it went one datagram per call when
// length+seg-1 wrapped).
func TestGSOSegmentsNear4GiB(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	s := n.sock
	const seg = 1000
	perSend := s.maxDatagram / (udiwarp.WriteRecordHeaderSize + seg + udiwarp.CRCSize)
	want := min(maxGSOSegments, perSend)
	for _, tc := range []struct {
		name        string
		length, off uint32
		want        int
	}{
		{"small", 10 * seg, 0, 10},
		{"one left", 10 * seg, 9*seg + 1, 1},
		{"4 GiB - 1", 0xFFFF_FFFF, 0, want},
		{"4 GiB - 1, partly sent", 0xFFFF_FFFF, 12345, want},
		{"last bytes of 4 GiB - 1", 0xFFFF_FFFF, 0xFFFF_FFFF - 2*seg + 1, 2},
		{"wraps at seg-1", 0xFFFF_FFFF - seg + 2, 0, want},
	} {
		w := &sendWQE{nsge: 1, length: tc.length, off: tc.off}
		if got := n.qp.gsoSegments(s, w, seg); got != tc.want {
			t.Errorf("%s: length %d from %d: %d segments per send, want %d", tc.name, tc.length, tc.off, got, tc.want)
		}
	}
}
