package udiwarp

import (
	"encoding/binary"

	"github.com/udiwarp/udiwarp/internal/crc32c"
)

// CRCSize is the size of the CRC32c trailer of a datagram and of an FPDU.
const CRCSize = 4

// CRC32c returns the CRC-32C (Castagnoli) of b: internal/crc32c, which
// folds large buffers with VPCLMULQDQ where the CPU has it.
func CRC32c(b []byte) uint32 { return crc32c.Checksum(b) }

// UpdateCRC32c extends crc with b, so a CRC can run over a header and a
// payload that live in different buffers.
func UpdateCRC32c(crc uint32, b []byte) uint32 { return crc32c.Update(crc, b) }

// PutCRC writes crc in the byte order MPA and iSCSI put it on the wire: the
// little-endian bytes of the CRC-32C value (RFC 3720 App. B.4 lists the
// digests in this order; Linux siw sends them the same way).
func PutCRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// WireCRC reads a CRC written by PutCRC.
func WireCRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// AppendCRC appends the wire bytes of crc to b.
func AppendCRC(b []byte, crc uint32) []byte { return binary.LittleEndian.AppendUint32(b, crc) }
