// Package crc32c computes the CRC-32C (Castagnoli) that every udiwarp
// datagram and MPA FPDU carries, as fast as the CPU allows: where the CPU
// has VPCLMULQDQ, one assembly call that folds buffers of foldMin bytes
// and more with the carry-less multiply, interleaved with the crc32
// instruction, and runs the crc32 instruction alone below that (the
// crossover is measured: BENCHMARKS.md); the standard library's
// hash/crc32 on every other CPU or architecture.
//
// # Why it is written here
//
// hash/crc32 and github.com/klauspost/crc32 fold with PCLMULQDQ only for
// the IEEE polynomial; for Castagnoli both stop at the crc32 instruction,
// 14–17 GB/s on this project's machines, below the speed of the copy that
// every byte udiwarp carries also costs. No maintained Go library folds
// Castagnoli with the vector carry-less multiply (November 2026), so the
// kernel is the project's own.
//
// # The method
//
// Folding, after Gopal et al., "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction" (Intel, 2009), in the
// bit-reflected form the Castagnoli CRC uses, as the Linux kernel's
// crc-pclmul-template (6.15 and later), libdeflate and zlib-ng apply it
// with 256- and 512-bit VPCLMULQDQ. A 128-bit lane A of the message
// stands for the polynomial A(x) = H(x)·x⁶⁴ + L(x); moving it D bits
// further along the message multiplies it by x^D, and modulo the CRC
// polynomial P
//
//	A(x)·x^D ≡ H(x)·(x^(D+64) mod P) + L(x)·(x^D mod P),
//
// two 64×64 carry-less products that fit in 128 bits. Xored onto the
// lane D bits ahead, they leave a message with the same CRC that is 128
// bits shorter. The kernel keeps four 256-bit accumulators (eight lanes)
// and folds them 1024 bits at a time over the buffer, then onto each
// other (256 bits) and lane onto lane (128 bits). What remains, one
// 128-bit lane, is reduced by two crc32 instructions from a zero state,
// since the CRC of those 16 bytes is the CRC of the whole; the crc32
// instruction takes the fewer than 32 bytes left after them. The initial
// CRC enters by xoring it into the first four bytes, the usual
// equivalence for n ≥ 4. Blocks interleave three crc32 streams with the
// folding, and carry their CRCs to the block's end by one carry-less
// product each (crc32c_amd64.go).
//
// In the reflected domain a carry-less product lands one bit lower than
// the polynomial product, so each constant is x^(e−1) mod P; foldConsts
// derives them from P at start-up rather than listing magic numbers.
//
// # Sources
//
//   - V. Gopal, E. Ozturk, J. Guilford, G. Wolrich, W. Feghali, M. Dixon,
//     D. Karakoyunlu: Fast CRC Computation for Generic Polynomials Using
//     PCLMULQDQ Instruction, Intel white paper 323102, 2009.
//   - E. Biggers: "x86/crc: ... VPCLMULQDQ" series, Linux 6.15–6.17
//     (arch/x86/lib/crc-pclmul-template.S) and libdeflate's
//     lib/x86/crc32_pclmul_template.h.
//   - RFC 3720, Appendix B.4: the test vectors.
package crc32c

import (
	"hash/crc32"
	"math/bits"
)

var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// Update returns the CRC-32C of the bytes crc was computed over followed
// by p: Update(Checksum(a), b) == Checksum(a+b).
func Update(crc uint32, p []byte) uint32 {
	if useArch {
		return ^archUpdate(^crc, p)
	}
	return crc32.Update(crc, table, p)
}

// Kernel names what Update uses on this CPU: "vpclmulqdq-avx2+crc32"
// (the folding kernel from foldMin bytes, the crc32 instruction below)
// or "hash/crc32".
func Kernel() string {
	if useArch {
		return kernelName
	}
	return "hash/crc32"
}

// poly is the Castagnoli polynomial x³² + … + 1 without its x³² term, in
// the normal (unreflected) bit order: bit i is the coefficient of xⁱ.
const poly = 0x1EDC6F41

// xPowModP returns x^e mod P, bit i the coefficient of xⁱ.
func xPowModP(e int) uint32 {
	r := uint64(1)
	for ; e > 0; e-- {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= 1<<32 | poly
		}
	}
	return uint32(r)
}

// foldConst is the 64-bit operand that, carry-less multiplied by a
// reflected 64-bit half of a lane, gives that half times x^e mod P in
// the reflected 128-bit lane: x^(e−1) mod P reflected into the top half
// (bit j of the operand is the coefficient of x^(63−j)).
func foldConst(e int) uint64 {
	return uint64(bits.Reverse32(xPowModP(e-1))) << 32
}
