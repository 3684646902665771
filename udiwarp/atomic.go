package udiwarp

import (
	"encoding/binary"
	"strconv"
)

// RFC 7306 header sizes, after the untagged DDP header.
const (
	AtomicRequestSize  = 52
	AtomicResponseSize = 12
	ImmediateDataSize  = 8
)

// AtomicOp is the AOpCode of an Atomic Request (RFC 7306 §5.2.1, §10.1).
// RFC 7306 assigns FetchAdd=0x0 and CmpSwap=0x2; 0x1 is reserved and
// there is no Swap code (libraries that number CmpSwap 1 do not follow it).
type AtomicOp uint8

const (
	AtomicFetchAdd AtomicOp = 0x0
	AtomicCmpSwap  AtomicOp = 0x2
)

func (o AtomicOp) String() string {
	switch o {
	case AtomicFetchAdd:
		return "FetchAdd"
	case AtomicCmpSwap:
		return "CmpSwap"
	}
	return "atomic op " + strconv.Itoa(int(o))
}

// AtomicRequest is a view of the Atomic Request header:
//
//	0        4       8        12       20        28        36        44        52
//	+--------+-------+--------+--------+---------+---------+---------+---------+
//	|rsvd|AOp| ReqID | STag   | TO     | Add/Swap| Add/Swap| Compare | Compare |
//	|        |       |        |        | Data    | Mask    | Data    | Mask    |
//	+--------+-------+--------+--------+---------+---------+---------+---------+
type AtomicRequest []byte

// AtomicRequestFields holds every field of an Atomic Request header.
type AtomicRequestFields struct {
	Op          AtomicOp
	RequestID   uint32
	STag        uint32
	TO          uint64
	SwapAddData uint64
	SwapAddMask uint64
	CompareData uint64
	CompareMask uint64
}

func (a AtomicRequest) Op() AtomicOp        { return AtomicOp(a[3] & 0x0F) }
func (a AtomicRequest) Reserved() uint32    { return binary.BigEndian.Uint32(a[0:]) >> 4 }
func (a AtomicRequest) RequestID() uint32   { return binary.BigEndian.Uint32(a[4:]) }
func (a AtomicRequest) STag() uint32        { return binary.BigEndian.Uint32(a[8:]) }
func (a AtomicRequest) TO() uint64          { return binary.BigEndian.Uint64(a[12:]) }
func (a AtomicRequest) SwapAddData() uint64 { return binary.BigEndian.Uint64(a[20:]) }
func (a AtomicRequest) SwapAddMask() uint64 { return binary.BigEndian.Uint64(a[28:]) }
func (a AtomicRequest) CompareData() uint64 { return binary.BigEndian.Uint64(a[36:]) }
func (a AtomicRequest) CompareMask() uint64 { return binary.BigEndian.Uint64(a[44:]) }

// Encode writes every field; a must be at least AtomicRequestSize long.
func (a AtomicRequest) Encode(f *AtomicRequestFields) {
	_ = a[AtomicRequestSize-1]
	binary.BigEndian.PutUint32(a[0:], uint32(f.Op&0x0F))
	binary.BigEndian.PutUint32(a[4:], f.RequestID)
	binary.BigEndian.PutUint32(a[8:], f.STag)
	binary.BigEndian.PutUint64(a[12:], f.TO)
	binary.BigEndian.PutUint64(a[20:], f.SwapAddData)
	binary.BigEndian.PutUint64(a[28:], f.SwapAddMask)
	binary.BigEndian.PutUint64(a[36:], f.CompareData)
	binary.BigEndian.PutUint64(a[44:], f.CompareMask)
}

// AtomicResponse is a view of the Atomic Response header: the original
// Request Identifier (4 bytes) and the original remote value (8 bytes).
type AtomicResponse []byte

func (a AtomicResponse) RequestID() uint32 { return binary.BigEndian.Uint32(a[0:]) }
func (a AtomicResponse) Value() uint64     { return binary.BigEndian.Uint64(a[4:]) }

// Encode writes both fields; a must be at least AtomicResponseSize long.
func (a AtomicResponse) Encode(requestID uint32, value uint64) {
	_ = a[AtomicResponseSize-1]
	binary.BigEndian.PutUint32(a[0:], requestID)
	binary.BigEndian.PutUint64(a[4:], value)
}

// ImmediateData is a view of the 8 bytes of an Immediate Data message.
type ImmediateData []byte

func (d ImmediateData) Value() uint64     { return binary.BigEndian.Uint64(d) }
func (d ImmediateData) SetValue(v uint64) { binary.BigEndian.PutUint64(d, v) }
