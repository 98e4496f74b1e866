#include "textflag.h"

// AVX2 row loops for rows_amd64.go. Each kernel handles n elements, n a
// multiple of 8; n may be 0. The reference loops are in rows.go and in the
// Go declarations of rows_amd64.go; the tests compare these kernels with
// them bit for bit.
//
// NaN operands: when both sources of an add or a multiply are NaN, x86
// returns the first source, quieted. The reference loops fix that choice in
// the source (add and mul in rows.go: acc in a sum, c in a product), so
// here acc and c are always the first source. In Go syntax the first
// source is the middle operand: VADDPS Yterm, Yacc, Yacc and
// VMULPS Yx, Yc, Yx. Multiply and add are separate instructions (never
// VFMADD): each product is rounded to fp32 before it is added. Go's scalar
// SSE code and these AVX instructions run under the same MXCSR (round to
// nearest even, no FTZ/DAZ), so every other result is identical too.

// WIDEN8 widens 8 bf16 at off(SI) to fp32 in Y (bits << 16).
#define WIDEN8(off, Y) \
	VPMOVZXWD off(SI), Y; \
	VPSLLD    $16, Y, Y

// func accSetBF16(acc *float32, src *uint16, n int)
TEXT ·accSetBF16(SB), NOSPLIT, $0-24
	MOVQ acc+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

set32:
	CMPQ CX, $32
	JB   set8
	WIDEN8(0, Y0)
	WIDEN8(16, Y1)
	WIDEN8(32, Y2)
	WIDEN8(48, Y3)
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $64, SI
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     set32

set8:
	TESTQ CX, CX
	JZ    setdone
	WIDEN8(0, Y0)
	VMOVUPS Y0, (DI)
	ADDQ    $16, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     set8

setdone:
	VZEROUPPER
	RET

// func accAddBF16(acc *float32, src *uint16, n int)
TEXT ·accAddBF16(SB), NOSPLIT, $0-24
	MOVQ acc+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

add32:
	CMPQ CX, $32
	JB   add8
	WIDEN8(0, Y0)
	WIDEN8(16, Y1)
	WIDEN8(32, Y2)
	WIDEN8(48, Y3)
	VMOVUPS (DI), Y4
	VMOVUPS 32(DI), Y5
	VMOVUPS 64(DI), Y6
	VMOVUPS 96(DI), Y7
	VADDPS  Y0, Y4, Y4
	VADDPS  Y1, Y5, Y5
	VADDPS  Y2, Y6, Y6
	VADDPS  Y3, Y7, Y7
	VMOVUPS Y4, (DI)
	VMOVUPS Y5, 32(DI)
	VMOVUPS Y6, 64(DI)
	VMOVUPS Y7, 96(DI)
	ADDQ    $64, SI
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     add32

add8:
	TESTQ CX, CX
	JZ    adddone
	WIDEN8(0, Y0)
	VMOVUPS (DI), Y4
	VADDPS  Y0, Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ    $16, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     add8

adddone:
	VZEROUPPER
	RET

// func accMulBF16(acc *float32, src *uint16, n int, c float32)
TEXT ·accMulBF16(SB), NOSPLIT, $0-28
	MOVQ         acc+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15

mul32:
	CMPQ CX, $32
	JB   mul8
	WIDEN8(0, Y0)
	WIDEN8(16, Y1)
	WIDEN8(32, Y2)
	WIDEN8(48, Y3)
	VMULPS  Y0, Y15, Y0
	VMULPS  Y1, Y15, Y1
	VMULPS  Y2, Y15, Y2
	VMULPS  Y3, Y15, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $64, SI
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     mul32

mul8:
	TESTQ CX, CX
	JZ    muldone
	WIDEN8(0, Y0)
	VMULPS  Y0, Y15, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $16, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     mul8

muldone:
	VZEROUPPER
	RET

// func accMulAddBF16(acc *float32, src *uint16, n int, c float32)
TEXT ·accMulAddBF16(SB), NOSPLIT, $0-28
	MOVQ         acc+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15

fma32:
	CMPQ CX, $32
	JB   fma8
	WIDEN8(0, Y0)
	WIDEN8(16, Y1)
	WIDEN8(32, Y2)
	WIDEN8(48, Y3)
	VMULPS  Y0, Y15, Y0
	VMULPS  Y1, Y15, Y1
	VMULPS  Y2, Y15, Y2
	VMULPS  Y3, Y15, Y3
	VMOVUPS (DI), Y4
	VADDPS  Y0, Y4, Y4
	VMOVUPS 32(DI), Y5
	VADDPS  Y1, Y5, Y5
	VMOVUPS 64(DI), Y6
	VADDPS  Y2, Y6, Y6
	VMOVUPS 96(DI), Y7
	VADDPS  Y3, Y7, Y7
	VMOVUPS Y4, (DI)
	VMOVUPS Y5, 32(DI)
	VMOVUPS Y6, 64(DI)
	VMOVUPS Y7, 96(DI)
	ADDQ    $64, SI
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     fma32

fma8:
	TESTQ CX, CX
	JZ    fmadone
	WIDEN8(0, Y0)
	VMULPS  Y0, Y15, Y0
	VMOVUPS (DI), Y4
	VADDPS  Y0, Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ    $16, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     fma8

fmadone:
	VZEROUPPER
	RET

// func accAddF32(acc, src *float32, n int)
TEXT ·accAddF32(SB), NOSPLIT, $0-24
	MOVQ acc+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

fadd32:
	CMPQ CX, $32
	JB   fadd8
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VADDPS  (SI), Y0, Y0
	VADDPS  32(SI), Y1, Y1
	VADDPS  64(SI), Y2, Y2
	VADDPS  96(SI), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     fadd32

fadd8:
	TESTQ CX, CX
	JZ    fadddone
	VMOVUPS (DI), Y0
	VADDPS  (SI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     fadd8

fadddone:
	VZEROUPPER
	RET

// func accMulF32(dst, src *float32, n int, c float32)
TEXT ·accMulF32(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15

fmul32:
	CMPQ CX, $32
	JB   fmul8
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VMULPS  Y0, Y15, Y0
	VMULPS  Y1, Y15, Y1
	VMULPS  Y2, Y15, Y2
	VMULPS  Y3, Y15, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     fmul32

fmul8:
	TESTQ CX, CX
	JZ    fmuldone
	VMOVUPS (SI), Y0
	VMULPS  Y0, Y15, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     fmul8

fmuldone:
	VZEROUPPER
	RET

// func accMulAddF32(acc, src *float32, n int, c float32)
TEXT ·accMulAddF32(SB), NOSPLIT, $0-28
	MOVQ         acc+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15

ffma32:
	CMPQ CX, $32
	JB   ffma8
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VMULPS  Y0, Y15, Y0
	VMULPS  Y1, Y15, Y1
	VMULPS  Y2, Y15, Y2
	VMULPS  Y3, Y15, Y3
	VMOVUPS (DI), Y4
	VADDPS  Y0, Y4, Y4
	VMOVUPS 32(DI), Y5
	VADDPS  Y1, Y5, Y5
	VMOVUPS 64(DI), Y6
	VADDPS  Y2, Y6, Y6
	VMOVUPS 96(DI), Y7
	VADDPS  Y3, Y7, Y7
	VMOVUPS Y4, (DI)
	VMOVUPS Y5, 32(DI)
	VMOVUPS Y6, 64(DI)
	VMOVUPS Y7, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     ffma32

ffma8:
	TESTQ CX, CX
	JZ    ffmadone
	VMOVUPS (SI), Y0
	VMULPS  Y0, Y15, Y0
	VMOVUPS (DI), Y4
	VADDPS  Y0, Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     ffma8

ffmadone:
	VZEROUPPER
	RET

#include "bf16_amd64.h"

// func storeBF16(dst *uint16, src *float32, n int)
TEXT ·storeBF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	BF16CONSTS

st16:
	CMPQ CX, $16
	JB   st8
	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1
	ROUND8(Y0, Y2, Y3)
	ROUND8(Y1, Y4, Y5)
	VPACKUSDW Y1, Y0, Y0
	VPERMQ    $0xd8, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $64, SI
	ADDQ      $32, DI
	SUBQ      $16, CX
	JMP       st16

st8:
	TESTQ CX, CX
	JZ    stdone
	VMOVDQU (SI), Y0
	ROUND8(Y0, Y2, Y3)
	VEXTRACTI128 $1, Y0, X1
	VPACKUSDW    X1, X0, X0
	VMOVDQU      X0, (DI)

stdone:
	VZEROUPPER
	RET

// func scaleBF16(dst, src *uint16, n int, c float32)
TEXT ·scaleBF16(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15
	BF16CONSTS

sc16:
	CMPQ CX, $16
	JB   sc8
	WIDEN8(0, Y0)
	WIDEN8(16, Y1)
	VMULPS    Y0, Y15, Y0
	VMULPS    Y1, Y15, Y1
	ROUND8(Y0, Y2, Y3)
	ROUND8(Y1, Y4, Y5)
	VPACKUSDW Y1, Y0, Y0
	VPERMQ    $0xd8, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $32, SI
	ADDQ      $32, DI
	SUBQ      $16, CX
	JMP       sc16

sc8:
	TESTQ CX, CX
	JZ    scdone
	WIDEN8(0, Y0)
	VMULPS       Y0, Y15, Y0
	ROUND8(Y0, Y2, Y3)
	VEXTRACTI128 $1, Y0, X1
	VPACKUSDW    X1, X0, X0
	VMOVDQU      X0, (DI)

scdone:
	VZEROUPPER
	RET
