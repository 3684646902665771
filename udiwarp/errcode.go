package udiwarp

import "strconv"

// ErrorCode is a Terminate error: Layer (4 bits), EType (4 bits) and Error
// Code (8 bits), exactly as the first 16 bits of the Terminate control
// word carry them (RFC 5040 §4.8).
type ErrorCode uint16

// Layer is the layer that detected the error.
type Layer uint8

const (
	LayerRDMAP Layer = 0
	LayerDDP   Layer = 1
	LayerLLP   Layer = 2 // MPA, or the reliability layer of RD
)

func (l Layer) String() string {
	switch l {
	case LayerRDMAP:
		return "RDMAP"
	case LayerDDP:
		return "DDP"
	case LayerLLP:
		return "LLP"
	}
	return "layer " + strconv.Itoa(int(l))
}

// NewErrorCode builds a code from its three fields.
func NewErrorCode(l Layer, etype, ecode uint8) ErrorCode {
	return ErrorCode(l&0xF)<<12 | ErrorCode(etype&0xF)<<8 | ErrorCode(ecode)
}

func (c ErrorCode) Layer() Layer { return Layer(c >> 12) }
func (c ErrorCode) EType() uint8 { return uint8(c>>8) & 0xF }
func (c ErrorCode) ECode() uint8 { return uint8(c) }

// RDMAP errors (RFC 5040 §7; IANA RDMAP error registry).
const (
	RDMAPLocalCatastrophic    ErrorCode = 0x0000 // EType 0; any ECode
	RDMAPInvalidSTag          ErrorCode = 0x0100 // Remote Protection
	RDMAPBaseBounds           ErrorCode = 0x0101
	RDMAPAccessRights         ErrorCode = 0x0102
	RDMAPSTagNotAssociated    ErrorCode = 0x0103
	RDMAPTOWrap               ErrorCode = 0x0104
	RDMAPProtCannotInvalidate ErrorCode = 0x0109
	RDMAPProtUnspecified      ErrorCode = 0x01FF
	RDMAPInvalidVersion       ErrorCode = 0x0205 // Remote Operation
	RDMAPUnexpectedOpcode     ErrorCode = 0x0206
	RDMAPCatastrophicStream   ErrorCode = 0x0207
	RDMAPCatastrophicGlobal   ErrorCode = 0x0208
	RDMAPOpCannotInvalidate   ErrorCode = 0x0209
	RDMAPOpUnspecified        ErrorCode = 0x02FF
)

// DDP errors (RFC 5041 §7.2).
const (
	DDPLocalCatastrophic       ErrorCode = 0x1000
	DDPTaggedInvalidSTag       ErrorCode = 0x1100
	DDPTaggedBaseBounds        ErrorCode = 0x1101
	DDPTaggedSTagNotAssociated ErrorCode = 0x1102
	DDPTaggedTOWrap            ErrorCode = 0x1103
	DDPTaggedInvalidVersion    ErrorCode = 0x1104
	DDPUntaggedInvalidQN       ErrorCode = 0x1201
	DDPUntaggedNoBuffer        ErrorCode = 0x1202
	DDPUntaggedMSNRange        ErrorCode = 0x1203
	DDPUntaggedInvalidMO       ErrorCode = 0x1204
	DDPUntaggedTooLong         ErrorCode = 0x1205
	DDPUntaggedInvalidVersion  ErrorCode = 0x1206
)

// LLP errors, EType 0 = MPA (RFC 5044 §8, RFC 6581 §8).
const (
	MPAConnectionLost      ErrorCode = 0x2001
	MPACRCError            ErrorCode = 0x2002
	MPAMarkerMismatch      ErrorCode = 0x2003
	MPAInvalidRequestReply ErrorCode = 0x2004
	MPALocalCatastrophic   ErrorCode = 0x2005
	MPAInsufficientIRD     ErrorCode = 0x2006
	MPANoMatchingRTR       ErrorCode = 0x2007
)

var errorCodeNames = map[ErrorCode]string{
	RDMAPInvalidSTag:           "RDMAP remote protection: invalid STag",
	RDMAPBaseBounds:            "RDMAP remote protection: base or bounds violation",
	RDMAPAccessRights:          "RDMAP remote protection: access rights violation",
	RDMAPSTagNotAssociated:     "RDMAP remote protection: STag not associated with RDMAP stream",
	RDMAPTOWrap:                "RDMAP remote protection: TO wrap",
	RDMAPProtCannotInvalidate:  "RDMAP remote protection: STag cannot be invalidated",
	RDMAPProtUnspecified:       "RDMAP remote protection: unspecified error",
	RDMAPInvalidVersion:        "RDMAP remote operation: invalid RDMAP version",
	RDMAPUnexpectedOpcode:      "RDMAP remote operation: unexpected OpCode",
	RDMAPCatastrophicStream:    "RDMAP remote operation: catastrophic error, localized to RDMAP stream",
	RDMAPCatastrophicGlobal:    "RDMAP remote operation: catastrophic error, global",
	RDMAPOpCannotInvalidate:    "RDMAP remote operation: STag cannot be invalidated",
	RDMAPOpUnspecified:         "RDMAP remote operation: unspecified error",
	DDPTaggedInvalidSTag:       "DDP tagged buffer: invalid STag",
	DDPTaggedBaseBounds:        "DDP tagged buffer: base or bounds violation",
	DDPTaggedSTagNotAssociated: "DDP tagged buffer: STag not associated with DDP stream",
	DDPTaggedTOWrap:            "DDP tagged buffer: TO wrap",
	DDPTaggedInvalidVersion:    "DDP tagged buffer: invalid DDP version",
	DDPUntaggedInvalidQN:       "DDP untagged buffer: invalid QN",
	DDPUntaggedNoBuffer:        "DDP untagged buffer: invalid MSN, no buffer available",
	DDPUntaggedMSNRange:        "DDP untagged buffer: invalid MSN, MSN range",
	DDPUntaggedInvalidMO:       "DDP untagged buffer: invalid MO",
	DDPUntaggedTooLong:         "DDP untagged buffer: DDP message too long for available buffer",
	DDPUntaggedInvalidVersion:  "DDP untagged buffer: invalid DDP version",
	MPAConnectionLost:          "MPA: TCP connection closed, terminated or lost",
	MPACRCError:                "MPA: CRC error",
	MPAMarkerMismatch:          "MPA: marker and ULPDU length field mismatch",
	MPAInvalidRequestReply:     "MPA: invalid MPA request or reply frame",
	MPALocalCatastrophic:       "MPA: local catastrophic error",
	MPAInsufficientIRD:         "MPA: insufficient IRD resources",
	MPANoMatchingRTR:           "MPA: no matching RTR option",
}

func (c ErrorCode) String() string {
	if s, ok := errorCodeNames[c]; ok {
		return s
	}
	// Local catastrophic errors carry any ECode (RFC 5040 §7.1).
	if c.EType() == 0 && (c.Layer() == LayerRDMAP || c.Layer() == LayerDDP) {
		return c.Layer().String() + " local catastrophic error"
	}
	return c.Layer().String() + " etype " + strconv.Itoa(int(c.EType())) + " ecode 0x" + strconv.FormatUint(uint64(c.ECode()), 16)
}
