#include "textflag.h"

// Multi-row sums for sum_amd64.go: 32 elements at a time, every row of the
// sum streamed in turn into four YMM accumulators, then rounded and stored
// once. Operand order follows rows_amd64.s (acc and c are the first
// source: the middle operand in Go syntax); multiply and add are separate
// instructions. BF16CONSTS and ROUND8 come from bf16_amd64.h.

#include "bf16_amd64.h"

// LOADBF16 widens 32 bf16 at DX(SI) into Y a..d.
#define LOADBF16(a, b, c, d) \
	VPMOVZXWD 0(SI)(DX*1), a; \
	VPMOVZXWD 16(SI)(DX*1), b; \
	VPMOVZXWD 32(SI)(DX*1), c; \
	VPMOVZXWD 48(SI)(DX*1), d; \
	VPSLLD    $16, a, a; \
	VPSLLD    $16, b, b; \
	VPSLLD    $16, c, c; \
	VPSLLD    $16, d, d

// LOADF32 loads 32 fp32 at DX(SI) into Y a..d.
#define LOADF32(a, b, c, d) \
	VMOVUPS 0(SI)(DX*1), a; \
	VMOVUPS 32(SI)(DX*1), b; \
	VMOVUPS 64(SI)(DX*1), c; \
	VMOVUPS 96(SI)(DX*1), d

// ADDTERMS adds Y4..Y7 to the accumulators Y0..Y3 (accumulator first).
#define ADDTERMS \
	VADDPS Y4, Y0, Y0; \
	VADDPS Y5, Y1, Y1; \
	VADDPS Y6, Y2, Y2; \
	VADDPS Y7, Y3, Y3

// SCALE multiplies Y a..d by the weight in Y15 (weight first).
#define SCALE(a, b, c, d) \
	VMULPS a, Y15, a; \
	VMULPS b, Y15, b; \
	VMULPS c, Y15, c; \
	VMULPS d, Y15, d

// STOREBF16 rounds Y0..Y3 to bf16 and stores 64 bytes at DI.
#define STOREBF16 \
	ROUND8(Y0, Y4, Y5); \
	ROUND8(Y1, Y6, Y7); \
	VPACKUSDW Y1, Y0, Y0; \
	VPERMQ    $0xd8, Y0, Y0; \
	VMOVDQU   Y0, (DI); \
	ROUND8(Y2, Y4, Y5); \
	ROUND8(Y3, Y6, Y7); \
	VPACKUSDW Y3, Y2, Y2; \
	VPERMQ    $0xd8, Y2, Y2; \
	VMOVDQU   Y2, 32(DI)

#define STOREF32 \
	VMOVUPS Y0, (DI); \
	VMOVUPS Y1, 32(DI); \
	VMOVUPS Y2, 64(DI); \
	VMOVUPS Y3, 96(DI)

// func sumBF16(dst *uint16, rows *unsafe.Pointer, nrows, n int)
TEXT ·sumBF16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ rows+8(FP), BX
	MOVQ nrows+16(FP), R9
	MOVQ n+24(FP), CX
	BF16CONSTS
	XORQ DX, DX

sb_chunk:
	CMPQ CX, $32
	JB   sb_done
	MOVQ (BX), SI
	LOADBF16(Y0, Y1, Y2, Y3)
	MOVQ $1, R8

sb_row:
	CMPQ R8, R9
	JAE  sb_store
	MOVQ (BX)(R8*8), SI
	LOADBF16(Y4, Y5, Y6, Y7)
	ADDTERMS
	INCQ R8
	JMP  sb_row

sb_store:
	STOREBF16
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $32, CX
	JMP  sb_chunk

sb_done:
	VZEROUPPER
	RET

// func sumScaledBF16(dst *uint16, rows *unsafe.Pointer, c *float32, nrows, n int)
TEXT ·sumScaledBF16(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ rows+8(FP), BX
	MOVQ c+16(FP), AX
	MOVQ nrows+24(FP), R9
	MOVQ n+32(FP), CX
	BF16CONSTS
	XORQ DX, DX

ssb_chunk:
	CMPQ CX, $32
	JB   ssb_done
	MOVQ         (BX), SI
	VBROADCASTSS (AX), Y15
	LOADBF16(Y0, Y1, Y2, Y3)
	SCALE(Y0, Y1, Y2, Y3)
	MOVQ         $1, R8

ssb_row:
	CMPQ         R8, R9
	JAE          ssb_store
	MOVQ         (BX)(R8*8), SI
	VBROADCASTSS (AX)(R8*4), Y15
	LOADBF16(Y4, Y5, Y6, Y7)
	SCALE(Y4, Y5, Y6, Y7)
	ADDTERMS
	INCQ         R8
	JMP          ssb_row

ssb_store:
	STOREBF16
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $32, CX
	JMP  ssb_chunk

ssb_done:
	VZEROUPPER
	RET

// func sumF32(dst *float32, rows *unsafe.Pointer, nrows, n int)
TEXT ·sumF32(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ rows+8(FP), BX
	MOVQ nrows+16(FP), R9
	MOVQ n+24(FP), CX
	XORQ DX, DX

sf_chunk:
	CMPQ CX, $32
	JB   sf_done
	MOVQ (BX), SI
	LOADF32(Y0, Y1, Y2, Y3)
	MOVQ $1, R8

sf_row:
	CMPQ R8, R9
	JAE  sf_store
	MOVQ (BX)(R8*8), SI
	LOADF32(Y4, Y5, Y6, Y7)
	ADDTERMS
	INCQ R8
	JMP  sf_row

sf_store:
	STOREF32
	ADDQ $128, DX
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  sf_chunk

sf_done:
	VZEROUPPER
	RET

// func sumScaledF32(dst *float32, rows *unsafe.Pointer, c *float32, nrows, n int)
TEXT ·sumScaledF32(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ rows+8(FP), BX
	MOVQ c+16(FP), AX
	MOVQ nrows+24(FP), R9
	MOVQ n+32(FP), CX
	XORQ DX, DX

ssf_chunk:
	CMPQ         CX, $32
	JB           ssf_done
	MOVQ         (BX), SI
	VBROADCASTSS (AX), Y15
	LOADF32(Y0, Y1, Y2, Y3)
	SCALE(Y0, Y1, Y2, Y3)
	MOVQ         $1, R8

ssf_row:
	CMPQ         R8, R9
	JAE          ssf_store
	MOVQ         (BX)(R8*8), SI
	VBROADCASTSS (AX)(R8*4), Y15
	LOADF32(Y4, Y5, Y6, Y7)
	SCALE(Y4, Y5, Y6, Y7)
	ADDTERMS
	INCQ         R8
	JMP          ssf_row

ssf_store:
	STOREF32
	ADDQ $128, DX
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  ssf_chunk

ssf_done:
	VZEROUPPER
	RET

// func sumGroupsBF16(dst *uint16, rows *unsafe.Pointer, c *float32, ends *int, ngroups, n int)
//
// 16 elements at a time: Y0, Y1 the sum over groups, Y2, Y3 a group's
// weighted sum (rounded to bf16 and widened back before it is added),
// Y4, Y5 a term, Y6..Y9 rounding scratch, Y15 the term's weight.
TEXT ·sumGroupsBF16(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ rows+8(FP), BX
	MOVQ c+16(FP), AX
	MOVQ ends+24(FP), R10
	MOVQ ngroups+32(FP), R11
	MOVQ n+40(FP), CX
	BF16CONSTS
	XORQ DX, DX

sg_chunk:
	CMPQ  CX, $16
	JB    sg_done
	XORQ  R8, R8      // row
	XORQ  R12, R12    // group
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1

sg_group:
	CMPQ  R12, R11
	JAE   sg_store
	MOVQ  (R10)(R12*8), R13 // the group's end row
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	CMPQ  R8, R13
	JAE   sg_round    // an empty group adds +0
	MOVQ         (BX)(R8*8), SI
	VBROADCASTSS (AX)(R8*4), Y15
	VPMOVZXWD    0(SI)(DX*1), Y2
	VPMOVZXWD    16(SI)(DX*1), Y3
	VPSLLD       $16, Y2, Y2
	VPSLLD       $16, Y3, Y3
	VMULPS       Y2, Y15, Y2
	VMULPS       Y3, Y15, Y3
	INCQ         R8

sg_term:
	CMPQ         R8, R13
	JAE          sg_round
	MOVQ         (BX)(R8*8), SI
	VBROADCASTSS (AX)(R8*4), Y15
	VPMOVZXWD    0(SI)(DX*1), Y4
	VPMOVZXWD    16(SI)(DX*1), Y5
	VPSLLD       $16, Y4, Y4
	VPSLLD       $16, Y5, Y5
	VMULPS       Y4, Y15, Y4
	VMULPS       Y5, Y15, Y5
	VADDPS       Y4, Y2, Y2
	VADDPS       Y5, Y3, Y3
	INCQ         R8
	JMP          sg_term

sg_round:
	ROUND8(Y2, Y6, Y7)
	ROUND8(Y3, Y8, Y9)
	VPSLLD $16, Y2, Y2
	VPSLLD $16, Y3, Y3
	CMPQ   R12, $0
	JNE    sg_add
	VMOVAPS Y2, Y0
	VMOVAPS Y3, Y1
	INCQ   R12
	JMP    sg_group

sg_add:
	VADDPS Y2, Y0, Y0
	VADDPS Y3, Y1, Y1
	INCQ   R12
	JMP    sg_group

sg_store:
	ROUND8(Y0, Y6, Y7)
	ROUND8(Y1, Y8, Y9)
	VPACKUSDW Y1, Y0, Y0
	VPERMQ    $0xd8, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $32, DX
	ADDQ      $32, DI
	SUBQ      $16, CX
	JMP       sg_chunk

sg_done:
	VZEROUPPER
	RET
