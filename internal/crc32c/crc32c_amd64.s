//go:build !purego

#include "textflag.h"
#include "go_asm.h"

// func cpuid7ECX() uint32
TEXT ·cpuid7ECX(SB), NOSPLIT, $0-4
	MOVL $7, AX
	XORL CX, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET

// FOLD folds the two lanes of acc forward by the distance whose
// constants are in k (per lane: low qword times k's low, high qword
// times k's high) and xors the result into dst. Clobbers t.
#define FOLD(k, acc, t, dst) \
	VPCLMULQDQ $0x00, k, acc, t   \
	VPCLMULQDQ $0x11, k, acc, acc \
	VPXOR      t, acc, acc        \
	VPXOR      acc, dst, dst

// ITER folds the four accumulators by the constants in K onto the 128
// bytes at SI and runs ilvM crc32 instructions on each of the three
// streams at R12, const_ilvL and 2*const_ilvL (states AX, BX, R8).
#define ITER(K) \
	VPCLMULQDQ $0x00, K, Y0, Y4 \
	CRC32Q 0(R12), AX \
	VPCLMULQDQ $0x11, K, Y0, Y0 \
	CRC32Q (const_ilvL*1+0)(R12), BX \
	VPCLMULQDQ $0x00, K, Y1, Y5 \
	CRC32Q (const_ilvL*2+0)(R12), R8 \
	VPCLMULQDQ $0x11, K, Y1, Y1 \
	CRC32Q 8(R12), AX \
	VPCLMULQDQ $0x00, K, Y2, Y6 \
	CRC32Q (const_ilvL*1+8)(R12), BX \
	VPCLMULQDQ $0x11, K, Y2, Y2 \
	CRC32Q (const_ilvL*2+8)(R12), R8 \
	VPCLMULQDQ $0x00, K, Y3, Y7 \
	CRC32Q 16(R12), AX \
	VPCLMULQDQ $0x11, K, Y3, Y3 \
	CRC32Q (const_ilvL*1+16)(R12), BX \
	VPXOR (SI), Y4, Y4 \
	CRC32Q (const_ilvL*2+16)(R12), R8 \
	VPXOR 32(SI), Y5, Y5 \
	CRC32Q 24(R12), AX \
	VPXOR 64(SI), Y6, Y6 \
	CRC32Q (const_ilvL*1+24)(R12), BX \
	VPXOR 96(SI), Y7, Y7 \
	CRC32Q (const_ilvL*2+24)(R12), R8 \
	VPXOR Y4, Y0, Y0 \
	CRC32Q 32(R12), AX \
	VPXOR Y5, Y1, Y1 \
	CRC32Q (const_ilvL*1+32)(R12), BX \
	VPXOR Y6, Y2, Y2 \
	CRC32Q (const_ilvL*2+32)(R12), R8 \
	VPXOR Y7, Y3, Y3 \
	ADDQ $128, SI \
	ADDQ $(8*const_ilvM), R12

// func updateAVX2(crc uint32, p []byte, k *[12]uint64) uint32
//
// The method is in crc32c.go, the blocks in crc32c_amd64.go. Registers:
// SI the data the vector folds, CX the bytes left, DX the constants,
// Y0–Y3 the accumulators, Y8 the constants of a fold by 1024 bits (then
// 256), Y9 of the jump over a block's streams, Y15 zero, Y4–Y7 and
// X10–X14 scratch; R12 the streams, AX, BX and R8 their CRCs, DI the
// iterations left in a block.
TEXT ·updateAVX2(SB), NOSPLIT, $0-44
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), DX
	CMPQ CX, $const_foldMin
	JB   tail8

	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVD   AX, X4
	VPXOR   Y4, Y0, Y0
	ADDQ    $128, SI
	SUBQ    $128, CX

	VPXOR          Y15, Y15, Y15
	VBROADCASTI128 (DX), Y8
	VBROADCASTI128 48(DX), Y9
	CMPQ           CX, $const_ilvBlock
	JB             tail128

	PCALIGN $32
block:
	MOVQ SI, R12
	ADDQ $(3*const_ilvL), SI
	XORL AX, AX
	XORL BX, BX
	XORL R8, R8
	ITER(Y9)
	MOVQ $(const_ilvN-1), DI

inner:
	ITER(Y8)
	DECQ DI
	JNZ  inner

	// The streams' CRCs, carried to the block's end, into its last lane.
	VMOVQ        AX, X10
	VPINSRQ      $1, BX, X10, X10
	VMOVQ        R8, X11
	VPCLMULQDQ   $0x00, 64(DX), X10, X12
	VPCLMULQDQ   $0x11, 64(DX), X10, X13
	VPCLMULQDQ   $0x00, 80(DX), X11, X14
	VPXOR        X13, X12, X12
	VPXOR        X14, X12, X12
	VINSERTI128  $1, X12, Y15, Y12
	VPXOR        Y12, Y3, Y3
	SUBQ         $const_ilvBlock, CX
	CMPQ         CX, $const_ilvBlock
	JAE          block

tail128:
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

	// Fewer than 32 bytes left (or fewer than foldMin in all): on with
	// the crc32 instruction.
tail8:
	CMPQ   CX, $8
	JB     tail1
	CRC32Q (SI), AX
	ADDQ   $8, SI
	SUBQ   $8, CX
	JMP    tail8

tail1:
	TESTQ  CX, CX
	JZ     done
	CRC32B (SI), AX
	INCQ   SI
	DECQ   CX
	JMP    tail1

done:
	MOVL AX, ret+40(FP)
	RET
