package udiwarp

import "strconv"

// RDMAPVersion is the RV of RFC 5040.
const RDMAPVersion = 1

// RDMAPControl is the second byte of every DDP segment, the first eight bits
// of RsvdULP that RDMAP uses: RV (2 bits), reserved (2 bits), OpCode (4 bits).
type RDMAPControl uint8

const (
	rdmapRVShift               = 6
	rdmapRsvdMask RDMAPControl = 0x30
	rdmapOpMask   RDMAPControl = 0x0F
)

// NewRDMAPControl builds a control byte with RV=1.
func NewRDMAPControl(op Opcode) RDMAPControl {
	return RDMAPControl(RDMAPVersion<<rdmapRVShift) | RDMAPControl(op)&rdmapOpMask
}

func (c RDMAPControl) Version() uint8  { return uint8(c >> rdmapRVShift) }
func (c RDMAPControl) Reserved() uint8 { return uint8(c & rdmapRsvdMask) }
func (c RDMAPControl) Opcode() Opcode  { return Opcode(c & rdmapOpMask) }

// Opcode is an RDMAP message type (RFC 5040 §4.2, RFC 7306 §9).
type Opcode uint8

const (
	OpWrite            Opcode = 0x0
	OpReadRequest      Opcode = 0x1
	OpReadResponse     Opcode = 0x2
	OpSend             Opcode = 0x3
	OpSendInvalidate   Opcode = 0x4
	OpSendSE           Opcode = 0x5
	OpSendSEInvalidate Opcode = 0x6
	OpTerminate        Opcode = 0x7
	OpImmediateData    Opcode = 0x8 // RFC 7306
	OpImmediateDataSE  Opcode = 0x9 // RFC 7306
	OpAtomicRequest    Opcode = 0xA // RFC 7306
	OpAtomicResponse   Opcode = 0xB // RFC 7306
	opcodeCount               = 0xC
)

var opcodeNames = [opcodeCount]string{
	"RDMA Write", "RDMA Read Request", "RDMA Read Response", "Send",
	"Send with Invalidate", "Send with SE", "Send with SE and Invalidate", "Terminate",
	"Immediate Data", "Immediate Data with SE", "Atomic Request", "Atomic Response",
}

func (o Opcode) String() string {
	if o < opcodeCount {
		return opcodeNames[o]
	}
	return "opcode " + strconv.Itoa(int(o))
}

// Known reports whether o is defined by RFC 5040 or RFC 7306.
func (o Opcode) Known() bool { return o < opcodeCount }

// Tagged reports whether the opcode travels in tagged DDP segments.
func (o Opcode) Tagged() bool { return o == OpWrite || o == OpReadResponse }

// Solicited reports whether the opcode carries a Solicited Event.
func (o Opcode) Solicited() bool {
	return o == OpSendSE || o == OpSendSEInvalidate || o == OpImmediateDataSE
}

// Invalidates reports whether the opcode carries an Invalidate STag.
func (o Opcode) Invalidates() bool { return o == OpSendInvalidate || o == OpSendSEInvalidate }

// Queue is an untagged DDP queue (RFC 5040 §5.1, RFC 7306 §8).
type Queue uint32

const (
	QueueSend           Queue = 0 // Send family and Immediate Data
	QueueReadRequest    Queue = 1 // RDMA Read Request and Atomic Request
	QueueTerminate      Queue = 2
	QueueAtomicResponse Queue = 3
)

func (q Queue) String() string {
	switch q {
	case QueueSend:
		return "send"
	case QueueReadRequest:
		return "read-request"
	case QueueTerminate:
		return "terminate"
	case QueueAtomicResponse:
		return "atomic-response"
	}
	return "queue " + strconv.Itoa(int(q))
}

// Queue returns the untagged queue an opcode's messages use; ok is false for
// tagged and unknown opcodes.
func (o Opcode) Queue() (q Queue, ok bool) {
	switch o {
	case OpSend, OpSendInvalidate, OpSendSE, OpSendSEInvalidate, OpImmediateData, OpImmediateDataSE:
		return QueueSend, true
	case OpReadRequest, OpAtomicRequest:
		return QueueReadRequest, true
	case OpTerminate:
		return QueueTerminate, true
	case OpAtomicResponse:
		return QueueAtomicResponse, true
	}
	return 0, false
}
