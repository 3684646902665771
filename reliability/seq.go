package reliability

// Sequence numbers are 32-bit and compared in serial-number arithmetic
// (RFC 1982): a comes before b when b is less than 2^31 ahead of it.

// Before reports whether a comes before b.
func Before(a, b uint32) bool { return int32(a-b) < 0 }

// AtOrBefore reports whether a == b or a comes before b.
func AtOrBefore(a, b uint32) bool { return int32(a-b) <= 0 }
