#include "textflag.h"

// NEON row loops for rows_asm.go. Each kernel handles n elements, n a
// multiple of 8; n may be 0. The reference loops are in rows.go and in the
// Go declarations of rows_asm.go; the tests compare these kernels with
// them bit for bit. 32 elements a step, then 8: R0 the accumulator or
// destination, R1 the source, R2 the elements left, R3 where results are
// stored when R0 reads ahead. The NaN rules and the hand-encoded
// instructions are in neon_arm64.h.

#include "neon_arm64.h"

// LOAD32 loads 32 bf16 from R1 and widens them to fp32 in V4..V11.
#define LOAD32 \
	VLD1.P 64(R1), [V0.H8, V1.H8, V2.H8, V3.H8]; \
	WIDEN(V0, V4, V5); \
	WIDEN(V1, V6, V7); \
	WIDEN(V2, V8, V9); \
	WIDEN(V3, V10, V11)

// LOAD8 loads 8 bf16 from R1 and widens them to fp32 in V4, V5.
#define LOAD8 \
	VLD1.P 16(R1), [V0.H8]; \
	WIDEN(V0, V4, V5)

// ACC32 loads 32 fp32 from R0 into V12..V19; STORE32 stores them at R3.
#define ACC32 \
	VLD1.P 64(R0), [V12.S4, V13.S4, V14.S4, V15.S4]; \
	VLD1.P 64(R0), [V16.S4, V17.S4, V18.S4, V19.S4]
#define STORE32 \
	VST1.P [V12.S4, V13.S4, V14.S4, V15.S4], 64(R3); \
	VST1.P [V16.S4, V17.S4, V18.S4, V19.S4], 64(R3)

// F32SRC32 loads 32 fp32 from R1 into V4..V11; F32SRC8 8 into V4, V5.
#define F32SRC32 \
	VLD1.P 64(R1), [V4.S4, V5.S4, V6.S4, V7.S4]; \
	VLD1.P 64(R1), [V8.S4, V9.S4, V10.S4, V11.S4]
#define F32SRC8 \
	VLD1.P 32(R1), [V4.S4, V5.S4]

// WEIGHT broadcasts the float32 argument c (at off(FP)) into V27.
#define WEIGHT(off) \
	MOVWU off(FP), R4; \
	VDUP  R4, V27.S4

// func accSetBF16(acc *float32, src *uint16, n int)
TEXT ·accSetBF16(SB), NOSPLIT, $0-24
	MOVD acc+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	NEONCONSTS

set32:
	CMP $32, R2
	BLT set8
	LOAD32
	VST1.P [V4.S4, V5.S4, V6.S4, V7.S4], 64(R0)
	VST1.P [V8.S4, V9.S4, V10.S4, V11.S4], 64(R0)
	SUB    $32, R2
	B      set32

set8:
	CBZ    R2, setdone
	LOAD8
	VST1.P [V4.S4, V5.S4], 32(R0)
	SUB    $8, R2
	B      set8

setdone:
	RET

// func accAddBF16(acc *float32, src *uint16, n int)
TEXT ·accAddBF16(SB), NOSPLIT, $0-24
	MOVD acc+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	MOVD R0, R3
	NEONCONSTS

add32:
	CMP $32, R2
	BLT add8
	LOAD32
	ACC32
	ADDNAN8
	STORE32
	SUB $32, R2
	B   add32

add8:
	CBZ    R2, adddone
	LOAD8
	VLD1.P 32(R0), [V12.S4, V13.S4]
	ADDNAN(12, V12, 4)
	ADDNAN(13, V13, 5)
	VST1.P [V12.S4, V13.S4], 32(R3)
	SUB    $8, R2
	B      add8

adddone:
	RET

// func accMulBF16(acc *float32, src *uint16, n int, c float32)
TEXT ·accMulBF16(SB), NOSPLIT, $0-28
	MOVD acc+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	WEIGHT(c+24)
	NEONCONSTS

mul32:
	CMP $32, R2
	BLT mul8
	LOAD32
	SCALE8
	VST1.P [V4.S4, V5.S4, V6.S4, V7.S4], 64(R0)
	VST1.P [V8.S4, V9.S4, V10.S4, V11.S4], 64(R0)
	SUB    $32, R2
	B      mul32

mul8:
	CBZ    R2, muldone
	LOAD8
	FMUL4S(4, 27, 4)
	FMUL4S(5, 27, 5)
	VST1.P [V4.S4, V5.S4], 32(R0)
	SUB    $8, R2
	B      mul8

muldone:
	RET

// func accMulAddBF16(acc *float32, src *uint16, n int, c float32)
TEXT ·accMulAddBF16(SB), NOSPLIT, $0-28
	MOVD acc+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	MOVD R0, R3
	WEIGHT(c+24)
	NEONCONSTS

fma32:
	CMP $32, R2
	BLT fma8
	LOAD32
	SCALE8
	ACC32
	ADD8
	STORE32
	SUB $32, R2
	B   fma32

fma8:
	CBZ    R2, fmadone
	LOAD8
	FMUL4S(4, 27, 4)
	FMUL4S(5, 27, 5)
	VLD1.P 32(R0), [V12.S4, V13.S4]
	FADD4S(12, 12, 4)
	FADD4S(13, 13, 5)
	VST1.P [V12.S4, V13.S4], 32(R3)
	SUB    $8, R2
	B      fma8

fmadone:
	RET

// func accAddF32(acc, src *float32, n int)
TEXT ·accAddF32(SB), NOSPLIT, $0-24
	MOVD acc+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	MOVD R0, R3
	NEONCONSTS

fadd32:
	CMP $32, R2
	BLT fadd8
	F32SRC32
	ACC32
	ADDNAN8
	STORE32
	SUB $32, R2
	B   fadd32

fadd8:
	CBZ    R2, fadddone
	F32SRC8
	VLD1.P 32(R0), [V12.S4, V13.S4]
	ADDNAN(12, V12, 4)
	ADDNAN(13, V13, 5)
	VST1.P [V12.S4, V13.S4], 32(R3)
	SUB    $8, R2
	B      fadd8

fadddone:
	RET

// func accMulF32(dst, src *float32, n int, c float32)
TEXT ·accMulF32(SB), NOSPLIT, $0-28
	MOVD dst+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	WEIGHT(c+24)

fmul32:
	CMP $32, R2
	BLT fmul8
	F32SRC32
	SCALE8
	VST1.P [V4.S4, V5.S4, V6.S4, V7.S4], 64(R0)
	VST1.P [V8.S4, V9.S4, V10.S4, V11.S4], 64(R0)
	SUB    $32, R2
	B      fmul32

fmul8:
	CBZ    R2, fmuldone
	F32SRC8
	FMUL4S(4, 27, 4)
	FMUL4S(5, 27, 5)
	VST1.P [V4.S4, V5.S4], 32(R0)
	SUB    $8, R2
	B      fmul8

fmuldone:
	RET

// func accMulAddF32(acc, src *float32, n int, c float32)
TEXT ·accMulAddF32(SB), NOSPLIT, $0-28
	MOVD acc+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	MOVD R0, R3
	WEIGHT(c+24)

ffma32:
	CMP $32, R2
	BLT ffma8
	F32SRC32
	SCALE8
	ACC32
	ADD8
	STORE32
	SUB $32, R2
	B   ffma32

ffma8:
	CBZ    R2, ffmadone
	F32SRC8
	FMUL4S(4, 27, 4)
	FMUL4S(5, 27, 5)
	VLD1.P 32(R0), [V12.S4, V13.S4]
	FADD4S(12, 12, 4)
	FADD4S(13, 13, 5)
	VST1.P [V12.S4, V13.S4], 32(R3)
	SUB    $8, R2
	B      ffma8

ffmadone:
	RET

// ROUND16 rounds the 16 fp32 of V4..V7 to bf16 in V0, V1.
#define ROUND16 \
	ROUND(4, V4, V8, 9, V9); \
	ROUND(5, V5, V10, 11, V11); \
	ROUND(6, V6, V8, 9, V9); \
	ROUND(7, V7, V10, 11, V11); \
	NARROW(V4, V5, V0); \
	NARROW(V6, V7, V1)

// func storeBF16(dst *uint16, src *float32, n int)
TEXT ·storeBF16(SB), NOSPLIT, $0-24
	MOVD dst+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	NEONCONSTS

st16:
	CMP    $16, R2
	BLT    st8
	VLD1.P 64(R1), [V4.S4, V5.S4, V6.S4, V7.S4]
	ROUND16
	VST1.P [V0.H8, V1.H8], 32(R0)
	SUB    $16, R2
	B      st16

st8:
	CBZ    R2, stdone
	VLD1.P 32(R1), [V4.S4, V5.S4]
	ROUND(4, V4, V8, 9, V9)
	ROUND(5, V5, V10, 11, V11)
	NARROW(V4, V5, V0)
	VST1   [V0.H8], (R0)

stdone:
	RET

// func scaleBF16(dst, src *uint16, n int, c float32)
TEXT ·scaleBF16(SB), NOSPLIT, $0-28
	MOVD dst+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	WEIGHT(c+24)
	NEONCONSTS

sc16:
	CMP    $16, R2
	BLT    sc8
	VLD1.P 32(R1), [V2.H8, V3.H8]
	WIDEN(V2, V4, V5)
	WIDEN(V3, V6, V7)
	FMUL4S(4, 27, 4)
	FMUL4S(5, 27, 5)
	FMUL4S(6, 27, 6)
	FMUL4S(7, 27, 7)
	ROUND16
	VST1.P [V0.H8, V1.H8], 32(R0)
	SUB    $16, R2
	B      sc16

sc8:
	CBZ    R2, scdone
	LOAD8
	FMUL4S(4, 27, 4)
	FMUL4S(5, 27, 5)
	ROUND(4, V4, V8, 9, V9)
	ROUND(5, V5, V10, 11, V11)
	NARROW(V4, V5, V0)
	VST1   [V0.H8], (R0)

scdone:
	RET
