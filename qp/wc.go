package qp

import (
	"net/netip"
	"strconv"

	"github.com/udiwarp/udiwarp/validitymap"
)

// Status is the outcome of a work request, as ibv_wc_status names them.
type Status uint8

const (
	Success Status = iota
	// LocalLengthError: the message does not fit the receive buffers, or a
	// send is longer than a datagram can carry.
	LocalLengthError
	// LocalQPOperationError: an internal inconsistency of the QP.
	LocalQPOperationError
	// LocalProtectionError: an SGE names an invalid lkey, an MR of another
	// PD, lacks local-write access for a receive, or runs past its MR.
	LocalProtectionError
	// WRFlushError: the WR was flushed because the QP entered ERROR or was destroyed.
	WRFlushError
	// RemoteAccessError: the target refused the STag, bounds or access.
	RemoteAccessError
	// RemoteOperationError: the target could not carry out the operation.
	RemoteOperationError
	// RetryExceededError: the peer did not acknowledge within the retry limit.
	RetryExceededError
	// GeneralError: anything else; the device's counters say more.
	GeneralError
	// RemoteInvalidRequestError: the target found the request invalid
	// (a Send longer than the posted receive, an operation it does not take).
	RemoteInvalidRequestError
	// RNRRetryExceededError: the target had no receive posted through
	// every receiver-not-ready retry.
	RNRRetryExceededError
	// RemoteAbortedError: the peer restarted (a new epoch) while the WR
	// was in flight; it may or may not have been carried out.
	RemoteAbortedError
	// ProtectionModeError: the RD peer refused contact because it
	// protects its datagrams in another mode (DeviceConfig.Protect);
	// nothing was sent to it.
	ProtectionModeError
)

var statusNames = [...]string{
	Success: "success", LocalLengthError: "local length error", LocalQPOperationError: "local QP operation error",
	LocalProtectionError: "local protection error", WRFlushError: "WR flushed", RemoteAccessError: "remote access error",
	RemoteOperationError: "remote operation error", RetryExceededError: "retry exceeded", GeneralError: "general error",
	RemoteInvalidRequestError: "remote invalid request", RNRRetryExceededError: "receiver-not-ready retry exceeded",
	RemoteAbortedError: "remote aborted (peer restarted)", ProtectionModeError: "peer refused contact: protection modes differ",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "status " + strconv.Itoa(int(s))
}

// WCOpcode says which kind of work request a completion is for.
type WCOpcode uint8

const (
	WCSend WCOpcode = iota
	WCRecv
	WCWriteRecord
	WCRDMAWrite
	WCRDMARead
	WCAtomicFetchAdd // ibv's IBV_WC_FETCH_ADD
	WCAtomicCmpSwap  // IBV_WC_COMP_SWAP
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "send"
	case WCRecv:
		return "recv"
	case WCWriteRecord:
		return "write-record"
	case WCRDMAWrite:
		return "rdma-write"
	case WCRDMARead:
		return "rdma-read"
	case WCAtomicFetchAdd:
		return "atomic-fetch-add"
	case WCAtomicCmpSwap:
		return "atomic-cmp-swap"
	}
	return "wc opcode " + strconv.Itoa(int(o))
}

// WorkCompletion reports one finished work request (ibv_wc). For datagram
// receives it names the source: its IP:port and QP number (seed 003).
type WorkCompletion struct {
	ID        uint64 // the WR's ID
	Status    Status
	Opcode    WCOpcode
	Len       uint32 // bytes received (receives) or sent
	QPN       uint32 // the local QP
	Solicited bool   // the sender asked for a solicited event
	Source    netip.AddrPort
	SourceQPN uint32
	// MSN is the message's sequence number as the sender numbered it.
	MSN uint32
	// Write-Record at the target: the region and the message's first byte
	// (Len is its length). Partial says the message's deadline passed
	// with bytes missing; Valid then lists exactly the ranges that arrived.
	// TO and Valid are tagged offsets; regions are zero-based (MR.Addr()
	// is 0), so they are also offsets into the region, the same numbers
	// the region's validity map (MR.TrackValidity) holds.
	STag    uint32
	TO      uint64
	Partial bool
	Valid   []validitymap.Range
	// Invalidated is the local STag a Send with Invalidate revoked for
	// remote access (RC).
	Invalidated uint32
	// WithImm says an Immediate Data message (RFC 7306) consumed this
	// receive, and Imm is its value (IBV_WC_WITH_IMM; iWARP's immediate
	// data is 8 bytes). Len is then 0: the value is not in the buffer.
	WithImm bool
	Imm     uint64

	srqQP *QP // the QP holding an SRQ receive until this is polled
}
