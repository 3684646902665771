package udiwarp

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every parse error wraps exactly one of them, so callers
// test with errors.Is and read the details from the *FieldError.
var (
	// ErrTruncated: fewer bytes arrived than the header or a declared length needs.
	ErrTruncated = errors.New("truncated")
	// ErrTooLong: more bytes than the frame may carry.
	ErrTooLong = errors.New("too long")
	// ErrVersion: DDP, RDMAP or MPA version this profile does not speak.
	ErrVersion = errors.New("unsupported version")
	// ErrReserved: a reserved field that this profile requires to be zero is not.
	ErrReserved = errors.New("reserved field not zero")
	// ErrOpcode: an RDMAP opcode unknown here or carried by the wrong DDP model.
	ErrOpcode = errors.New("unexpected opcode")
	// ErrQueue: an untagged queue number that does not match the opcode, or a QP number out of range.
	ErrQueue = errors.New("invalid queue number")
	// ErrOffset: an MO, TO or message length that is inconsistent or wraps.
	ErrOffset = errors.New("invalid offset")
	// ErrLastFlag: the L flag disagrees with the segment's place in its message.
	ErrLastFlag = errors.New("inconsistent last flag")
	// ErrCRC: the CRC32c does not match the bytes it covers.
	ErrCRC = errors.New("CRC mismatch")
	// ErrFrameType: a UDP datagram that is neither a datagram-DDP segment nor an RD frame.
	ErrFrameType = errors.New("unknown frame type")
	// ErrMarker: an MPA marker whose FPDU pointer disagrees with the framing.
	ErrMarker = errors.New("marker and ULPDU length mismatch")
	// ErrMPAFrame: an MPA Request/Reply frame with a bad key or inconsistent field.
	ErrMPAFrame = errors.New("invalid MPA request/reply frame")
)

// FieldError says which field of which frame was wrong, with the value that
// arrived and what was expected. It unwraps to one of the sentinel errors.
type FieldError struct {
	Frame string // e.g. "DDP tagged header"
	Field string // e.g. "DV"
	Value uint64 // the value that arrived
	Want  string // what the field must be, e.g. "2" or ">= 14"
	Err   error  // the sentinel
	// Code is the RFC 5040/5041/5044 error a Terminate (or, on datagram
	// QPs, an error message) reports for this fault.
	Code ErrorCode
}

func (e *FieldError) Error() string {
	if e.Err == ErrCRC {
		return fmt.Sprintf("udiwarp: %s: %s is %#08x, want %s: %v", e.Frame, e.Field, e.Value, e.Want, e.Err)
	}
	return fmt.Sprintf("udiwarp: %s: %s is %d, want %s: %v", e.Frame, e.Field, e.Value, e.Want, e.Err)
}

func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(frame, field string, value uint64, want string, err error, code ErrorCode) error {
	return &FieldError{Frame: frame, Field: field, Value: value, Want: want, Err: err, Code: code}
}

func truncated(frame string, have, need int, code ErrorCode) error {
	return &FieldError{Frame: frame, Field: "length", Value: uint64(have), Want: fmt.Sprintf(">= %d bytes", need), Err: ErrTruncated, Code: code}
}

// CodeOf returns the Terminate error code carried by err, if it is (or
// wraps) a *FieldError.
func CodeOf(err error) (ErrorCode, bool) {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.Code, true
	}
	return 0, false
}
