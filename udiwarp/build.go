package udiwarp

import "slices"

// Append-style builders: each appends one header to b and returns the
// extended slice, allocating only when b lacks capacity (quic-go's style).

func extend(b []byte, n int) ([]byte, []byte) {
	b = slices.Grow(b, n)
	l := len(b)
	b = b[:l+n]
	return b, b[l:]
}

// AppendTagged appends a 14-byte tagged DDP header.
func AppendTagged(b []byte, f *TaggedFields) []byte {
	b, h := extend(b, DDPTaggedHeaderSize)
	DDPTagged(h).Encode(f)
	return b
}

// AppendWriteRecord appends a 34-byte Write-Record header.
func AppendWriteRecord(b []byte, f *WriteRecordFields) []byte {
	b, h := extend(b, WriteRecordHeaderSize)
	WriteRecordHeader(h).Encode(f)
	return b
}

// AppendUntagged appends an 18-byte untagged DDP header.
func AppendUntagged(b []byte, f *UntaggedFields) []byte {
	b, h := extend(b, DDPUntaggedHeaderSize)
	DDPUntagged(h).Encode(f)
	return b
}

// AppendReadRequest appends the 28-byte Read Request header.
func AppendReadRequest(b []byte, f *ReadRequestFields) []byte {
	b, h := extend(b, ReadRequestSize)
	ReadRequest(h).Encode(f)
	return b
}

// AppendAtomicRequest appends the 52-byte Atomic Request header.
func AppendAtomicRequest(b []byte, f *AtomicRequestFields) []byte {
	b, h := extend(b, AtomicRequestSize)
	AtomicRequest(h).Encode(f)
	return b
}

// AppendAtomicResponse appends the 12-byte Atomic Response header.
func AppendAtomicResponse(b []byte, requestID uint32, value uint64) []byte {
	b, h := extend(b, AtomicResponseSize)
	AtomicResponse(h).Encode(requestID, value)
	return b
}

// AppendImmediateData appends the 8 bytes of an Immediate Data message.
func AppendImmediateData(b []byte, v uint64) []byte {
	b, h := extend(b, ImmediateDataSize)
	ImmediateData(h).SetValue(v)
	return b
}
