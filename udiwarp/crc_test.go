package udiwarp

import (
	"bytes"
	"encoding/hex"
	stdcrc "hash/crc32"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// RFC 3720 appendix B.4: the "CRC:" lines list the bytes as they go on the
// wire, which are the little-endian bytes of the CRC-32C value.
func TestCRC32cRFC3720Vectors(t *testing.T) {
	inc, dec := make([]byte, 32), make([]byte, 32)
	for i := range inc {
		inc[i], dec[i] = byte(i), byte(31-i)
	}
	scsiRead := unhex(t, `01 c0 00 00 00 00 00 00 00 00 00 00 00 00 00 00
		14 00 00 00 00 00 04 00 00 00 00 14 00 00 00 18
		28 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00`)
	for _, tc := range []struct {
		name string
		in   []byte
		wire string
	}{
		{"32 bytes of zeros", make([]byte, 32), "aa 36 91 8a"},
		{"32 bytes of ones", bytes.Repeat([]byte{0xff}, 32), "43 ab a8 62"},
		{"32 incrementing bytes", inc, "4e 79 dd 46"},
		{"32 decrementing bytes", dec, "5c db 3f 11"},
		{"iSCSI SCSI Read (10) command PDU", scsiRead, "56 3a 96 d9"},
		{"123456789", []byte("123456789"), "83 92 06 e3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := unhex(t, tc.wire)
			var got [4]byte
			PutCRC(got[:], CRC32c(tc.in))
			if !bytes.Equal(got[:], want) {
				t.Fatalf("wire CRC = % x, want % x", got, want)
			}
			// Split computation must agree: headers and payloads live apart.
			if c := UpdateCRC32c(CRC32c(tc.in[:5]), tc.in[5:]); c != CRC32c(tc.in) {
				t.Fatalf("incremental CRC %#x != one-shot %#x", c, CRC32c(tc.in))
			}
			if c := stdcrc.Checksum(tc.in, stdcrc.MakeTable(stdcrc.Castagnoli)); c != CRC32c(tc.in) {
				t.Fatalf("hash/crc32 says %#x, we say %#x", c, CRC32c(tc.in))
			}
		})
	}
}

func TestUDFrameNoCRC(t *testing.T) {
	seg := dgmSend(1, 2, 3, OpSend, []byte("payload"))
	d := append(append([]byte(nil), seg...), 0, 0, 0, 0)
	if _, err := ParseUDFrame(d); !isErr(err, ErrCRC) {
		t.Fatalf("a zero trailer passed the CRC check: %v", err)
	}
	s, err := ParseUDFrameNoCRC(d)
	if err != nil || string(s.Payload) != "payload" {
		t.Fatalf("ParseUDFrameNoCRC: %v", err)
	}
	if _, err := ParseUDFrameNoCRC(d[:len(d)-14]); err == nil {
		t.Fatal("a segment cut into its header was accepted")
	}
}

func TestDatagramTrailer(t *testing.T) {
	frame := []byte{0x42, 0x43, 1, 2, 3}
	d := SealDatagram(append([]byte(nil), frame...), 0)
	if len(d) != len(frame)+CRCSize {
		t.Fatalf("sealed length %d", len(d))
	}
	got, err := OpenDatagram(d)
	if err != nil || !bytes.Equal(got, frame) {
		t.Fatalf("OpenDatagram = % x, %v", got, err)
	}
	for i := range d {
		bad := append([]byte(nil), d...)
		bad[i] ^= 0x10
		if _, err := OpenDatagram(bad); !isErr(err, ErrCRC) {
			t.Fatalf("flipping byte %d: err = %v, want ErrCRC", i, err)
		}
	}
}
