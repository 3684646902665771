//go:build !purego

package crc32c

import "golang.org/x/sys/cpu"

// foldMin is the shortest buffer the kernel folds (crc32c_amd64.s:
// it starts with 128 bytes in four accumulators); below it, the crc32
// instruction over 8 bytes at a time, as hash/crc32 does below 504
// bytes. From 128 bytes folding is faster (BENCHMARKS.md, "CRC32c": the
// crossover table).
const foldMin = 128

const kernelName = "vpclmulqdq-avx2+crc32"

// The interleaved blocks. The carry-less multiplier and the crc32
// instruction run on different units, each near 8 bytes a cycle on the
// CPUs measured; a block keeps both busy at once: three crc32 streams of
// ilvL bytes each, then ilvV bytes that the vector folds, both advancing
// together ilvN times, ilvM crc32 instructions per stream for every 128
// bytes folded. At the block's end the three streams' CRCs are
// multiplied to the block's end and xored into the accumulators.
// ITER in crc32c_amd64.s unrolls ilvM: change the two together (the
// tests against hash/crc32 fail if they disagree).
const (
	ilvM     = 5
	ilvN     = 4
	ilvL     = 8 * ilvM * ilvN
	ilvV     = 128 * ilvN
	ilvBlock = 3*ilvL + ilvV
)

// The kernel steps 32 bytes at a time after the blocks: a block must be
// a whole number of them (ilvM·ilvN a multiple of 4).
var _ [0]struct{} = [ilvBlock % 32]struct{}{}

// useArch: the CPU has AVX2 with the OS saving YMM state, PCLMULQDQ,
// SSE4.2 (the crc32 instruction) and the VEX-encoded 256-bit VPCLMULQDQ.
// golang.org/x/sys/cpu reports VPCLMULQDQ only where AVX-512 is enabled
// (HasAVX512VPCLMULQDQ), but AVX2-only CPUs such as AMD Zen 3 have the
// 256-bit form, so its CPUID bit (leaf 7, ECX bit 10) is read here.
var useArch = cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42 && cpuid7ECX()&(1<<10) != 0

// foldConsts are the kernel's constants, in pairs for a fold by D bits:
// the multiplier of a lane's low qword (its high-degree half H, x^(D+64))
// then of its high qword (L, x^D), for D = 1024, 256, 128 and the jump
// over a block's scalar streams; then the multipliers that carry each
// stream's CRC (x^32 times its bytes) to the block's end.
var foldConsts = func() (k [12]uint64) {
	for i, d := range []int{1024, 256, 128, 8 * (3*ilvL + 128)} {
		k[2*i] = foldConst(d + 64)
		k[2*i+1] = foldConst(d)
	}
	for j := 1; j <= 3; j++ {
		k[7+j] = foldConst(8*((3-j)*ilvL+ilvV) - 64)
	}
	return k
}()

// cpuid7ECX returns ECX of CPUID leaf 7, subleaf 0. Called only where
// HasAVX2 holds, so the leaf exists.
func cpuid7ECX() uint32

// updateAVX2 returns the CRC state (not inverted) after p, starting from
// state crc: folding from foldMin bytes, the crc32 instruction below.
//
//go:noescape
func updateAVX2(crc uint32, p []byte, k *[12]uint64) uint32

func archUpdate(crc uint32, p []byte) uint32 { return updateAVX2(crc, p, &foldConsts) }
