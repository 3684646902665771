//go:build !purego

package crc32c

import "golang.org/x/sys/cpu"

// foldMin is the shortest buffer the folding kernel takes: below it
// hash/crc32's three interleaved crc32 streams are as fast or faster
// (BENCHMARKS.md, "CRC32c": the crossover table). The kernel itself
// needs 128 bytes.
const foldMin = 256

const kernelName = "vpclmulqdq-avx2"

// useFold: the CPU has AVX2 with the OS saving YMM state, PCLMULQDQ,
// SSE4.2 (the final reduction) and the VEX-encoded 256-bit VPCLMULQDQ.
// golang.org/x/sys/cpu reports VPCLMULQDQ only where AVX-512 is enabled
// (HasAVX512VPCLMULQDQ), but AVX2-only CPUs such as AMD Zen 3 have the
// 256-bit form, so its CPUID bit (leaf 7, ECX bit 10) is read here.
var useFold = cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42 && cpuid7ECX()&(1<<10) != 0

// cpuid7ECX returns ECX of CPUID leaf 7, subleaf 0. Called only where
// HasAVX2 holds, so the leaf exists.
func cpuid7ECX() uint32

// foldAVX2 returns the CRC state (not inverted) after p, starting from
// state crc. len(p) must be a multiple of 32 and at least 128.
//
//go:noescape
func foldAVX2(crc uint32, p []byte, k *[6]uint64) uint32

func fold(crc uint32, p []byte) uint32 { return foldAVX2(crc, p, &foldConsts) }
