//go:build !purego

#include "textflag.h"

// func cpuid7ECX() uint32
TEXT ·cpuid7ECX(SB), NOSPLIT, $0-4
	MOVL $7, AX
	XORL CX, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET

// FOLD256 folds the two lanes of acc forward by the distance whose
// constants are in k (per lane: low qword times k's low, high qword
// times k's high) and xors the result into dst. Clobbers t.
#define FOLD(k, acc, t, dst) \
	VPCLMULQDQ $0x00, k, acc, t   \
	VPCLMULQDQ $0x11, k, acc, acc \
	VPXOR      t, acc, acc        \
	VPXOR      acc, dst, dst

// func foldAVX2(crc uint32, p []byte, k *[6]uint64) uint32
//
// The method is in crc32c.go. Registers: SI the data, CX the bytes left,
// DX the constants, Y0–Y3 the accumulators, Y8 the constants of the
// current distance, Y4–Y7 scratch.
TEXT ·foldAVX2(SB), NOSPLIT, $0-44
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), DX

	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVD   AX, X4
	VPXOR   Y4, Y0, Y0
	ADDQ    $128, SI
	SUBQ    $128, CX

	VBROADCASTI128 (DX), Y8
	CMPQ CX, $128
	JB   reduce

	PCALIGN $32
loop128:
	VPCLMULQDQ $0x00, Y8, Y0, Y4
	VPCLMULQDQ $0x11, Y8, Y0, Y0
	VPCLMULQDQ $0x00, Y8, Y1, Y5
	VPCLMULQDQ $0x11, Y8, Y1, Y1
	VPCLMULQDQ $0x00, Y8, Y2, Y6
	VPCLMULQDQ $0x11, Y8, Y2, Y2
	VPCLMULQDQ $0x00, Y8, Y3, Y7
	VPCLMULQDQ $0x11, Y8, Y3, Y3
	VPXOR      (SI), Y4, Y4
	VPXOR      32(SI), Y5, Y5
	VPXOR      64(SI), Y6, Y6
	VPXOR      96(SI), Y7, Y7
	VPXOR      Y4, Y0, Y0
	VPXOR      Y5, Y1, Y1
	VPXOR      Y6, Y2, Y2
	VPXOR      Y7, Y3, Y3
	ADDQ       $128, SI
	SUBQ       $128, CX
	CMPQ       CX, $128
	JAE        loop128

reduce:
	// Four accumulators onto one, 256 bits at a time.
	VBROADCASTI128 16(DX), Y8
	FOLD(Y8, Y0, Y4, Y1)
	FOLD(Y8, Y1, Y4, Y2)
	FOLD(Y8, Y2, Y4, Y3)

loop32:
	CMPQ    CX, $32
	JB      lanes
	VMOVDQU (SI), Y5
	FOLD(Y8, Y3, Y4, Y5)
	VMOVDQA Y5, Y3
	ADDQ    $32, SI
	SUBQ    $32, CX
	JMP     loop32

lanes:
	// The low lane onto the high one, 128 bits.
	VMOVDQU      32(DX), X8
	VEXTRACTI128 $1, Y3, X1
	VPCLMULQDQ   $0x00, X8, X3, X4
	VPCLMULQDQ   $0x11, X8, X3, X3
	VPXOR        X4, X3, X3
	VPXOR        X1, X3, X3

	// The CRC of the last 16 bytes from a zero state is the whole's.
	XORL    AX, AX
	VMOVQ   X3, BX
	VPEXTRQ $1, X3, R8
	CRC32Q  BX, AX
	CRC32Q  R8, AX
	VZEROUPPER
	MOVL    AX, ret+40(FP)
	RET
