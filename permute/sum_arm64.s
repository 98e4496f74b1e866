#include "textflag.h"

// Multi-row sums for sum_asm.go, NEON: 32 elements at a time (16 for
// sumGroupsBF16), every row of the sum streamed in turn into eight
// accumulators V12..V19, then rounded and stored once. R0 dst, R1 the row
// addresses, R2 the weights, R3 the number of rows, R4 the elements left,
// R5 the chunk's byte offset in every row, R6 the row, R7 its address
// plus R5. The NaN rules and the hand-encoded instructions are in
// neon_arm64.h; multiply and add are separate instructions.

#include "neon_arm64.h"

// ROW sets R7 to the chunk of row R6.
#define ROW \
	MOVD (R1)(R6<<3), R7; \
	ADD  R5, R7, R7

// BF16ROW loads 32 bf16 at R7 and widens them into Va..Vh.
#define BF16ROW(va, vb, vc, vd, ve, vf, vg, vh) \
	VLD1 (R7), [V0.H8, V1.H8, V2.H8, V3.H8]; \
	WIDEN(V0, va, vb); \
	WIDEN(V1, vc, vd); \
	WIDEN(V2, ve, vf); \
	WIDEN(V3, vg, vh)

// F32ROW loads 32 fp32 at R7 into V4..V11 (R7 moves).
#define F32ROW \
	VLD1.P 64(R7), [V4.S4, V5.S4, V6.S4, V7.S4]; \
	VLD1   (R7), [V8.S4, V9.S4, V10.S4, V11.S4]

// MOVEACC moves V4..V11 into the accumulators V12..V19.
#define MOVEACC \
	VORR V4.B16, V4.B16, V12.B16; \
	VORR V5.B16, V5.B16, V13.B16; \
	VORR V6.B16, V6.B16, V14.B16; \
	VORR V7.B16, V7.B16, V15.B16; \
	VORR V8.B16, V8.B16, V16.B16; \
	VORR V9.B16, V9.B16, V17.B16; \
	VORR V10.B16, V10.B16, V18.B16; \
	VORR V11.B16, V11.B16, V19.B16

// WEIGHT broadcasts row R6's weight into V27.
#define WEIGHT \
	MOVWU (R2)(R6<<2), R8; \
	VDUP  R8, V27.S4

// STOREBF16 rounds V12..V19 to bf16 and stores 64 bytes at R0 (R0 moves).
#define STOREBF16 \
	ROUND(12, V12, V4, 5, V5); \
	ROUND(13, V13, V6, 7, V7); \
	ROUND(14, V14, V8, 9, V9); \
	ROUND(15, V15, V10, 11, V11); \
	ROUND(16, V16, V4, 5, V5); \
	ROUND(17, V17, V6, 7, V7); \
	ROUND(18, V18, V8, 9, V9); \
	ROUND(19, V19, V10, 11, V11); \
	NARROW(V12, V13, V0); \
	NARROW(V14, V15, V1); \
	NARROW(V16, V17, V2); \
	NARROW(V18, V19, V3); \
	VST1.P [V0.H8, V1.H8, V2.H8, V3.H8], 64(R0)

#define STOREF32 \
	VST1.P [V12.S4, V13.S4, V14.S4, V15.S4], 64(R0); \
	VST1.P [V16.S4, V17.S4, V18.S4, V19.S4], 64(R0)

// func sumBF16(dst *uint16, rows *unsafe.Pointer, nrows, n int)
TEXT ·sumBF16(SB), NOSPLIT, $0-32
	MOVD dst+0(FP), R0
	MOVD rows+8(FP), R1
	MOVD nrows+16(FP), R3
	MOVD n+24(FP), R4
	NEONCONSTS
	MOVD $0, R5

sb_chunk:
	CMP  $32, R4
	BLT  sb_done
	MOVD $0, R6
	ROW
	BF16ROW(V12, V13, V14, V15, V16, V17, V18, V19)
	MOVD $1, R6

sb_row:
	CMP R3, R6
	BGE sb_store
	ROW
	BF16ROW(V4, V5, V6, V7, V8, V9, V10, V11)
	ADDNAN8
	ADD $1, R6
	B   sb_row

sb_store:
	STOREBF16
	ADD $64, R5
	SUB $32, R4
	B   sb_chunk

sb_done:
	RET

// func sumScaledBF16(dst *uint16, rows *unsafe.Pointer, c *float32, nrows, n int)
TEXT ·sumScaledBF16(SB), NOSPLIT, $0-40
	MOVD dst+0(FP), R0
	MOVD rows+8(FP), R1
	MOVD c+16(FP), R2
	MOVD nrows+24(FP), R3
	MOVD n+32(FP), R4
	NEONCONSTS
	MOVD $0, R5

ssb_chunk:
	CMP  $32, R4
	BLT  ssb_done
	MOVD $0, R6
	ROW
	WEIGHT
	BF16ROW(V4, V5, V6, V7, V8, V9, V10, V11)
	SCALE8
	MOVEACC
	MOVD $1, R6

ssb_row:
	CMP R3, R6
	BGE ssb_store
	ROW
	WEIGHT
	BF16ROW(V4, V5, V6, V7, V8, V9, V10, V11)
	SCALE8
	ADD8
	ADD $1, R6
	B   ssb_row

ssb_store:
	STOREBF16
	ADD $64, R5
	SUB $32, R4
	B   ssb_chunk

ssb_done:
	RET

// func sumF32(dst *float32, rows *unsafe.Pointer, nrows, n int)
TEXT ·sumF32(SB), NOSPLIT, $0-32
	MOVD dst+0(FP), R0
	MOVD rows+8(FP), R1
	MOVD nrows+16(FP), R3
	MOVD n+24(FP), R4
	NEONCONSTS
	MOVD $0, R5

sf_chunk:
	CMP  $32, R4
	BLT  sf_done
	MOVD $0, R6
	ROW
	F32ROW
	MOVEACC
	MOVD $1, R6

sf_row:
	CMP R3, R6
	BGE sf_store
	ROW
	F32ROW
	ADDNAN8
	ADD $1, R6
	B   sf_row

sf_store:
	STOREF32
	ADD $128, R5
	SUB $32, R4
	B   sf_chunk

sf_done:
	RET

// func sumScaledF32(dst *float32, rows *unsafe.Pointer, c *float32, nrows, n int)
TEXT ·sumScaledF32(SB), NOSPLIT, $0-40
	MOVD dst+0(FP), R0
	MOVD rows+8(FP), R1
	MOVD c+16(FP), R2
	MOVD nrows+24(FP), R3
	MOVD n+32(FP), R4
	MOVD $0, R5

ssf_chunk:
	CMP  $32, R4
	BLT  ssf_done
	MOVD $0, R6
	ROW
	WEIGHT
	F32ROW
	SCALE8
	MOVEACC
	MOVD $1, R6

ssf_row:
	CMP R3, R6
	BGE ssf_store
	ROW
	WEIGHT
	F32ROW
	SCALE8
	ADD8
	ADD $1, R6
	B   ssf_row

ssf_store:
	STOREF32
	ADD $128, R5
	SUB $32, R4
	B   ssf_chunk

ssf_done:
	RET

// BF16ROW16 loads 16 bf16 at R7 and widens them into Va..Vd.
#define BF16ROW16(va, vb, vc, vd) \
	VLD1 (R7), [V0.H8, V1.H8]; \
	WIDEN(V0, va, vb); \
	WIDEN(V1, vc, vd)

// func sumGroupsBF16(dst *uint16, rows *unsafe.Pointer, c *float32, ends *int, ngroups, n int)
//
// 16 elements at a time: V12..V15 the sum over groups, V16..V19 a group's
// weighted sum (rounded to bf16 and widened back before it is added),
// V4..V7 a term, V8..V11 rounding scratch. R9 the group, R10 the number of
// groups, R11 the group ends, R13 the group's end row.
TEXT ·sumGroupsBF16(SB), NOSPLIT, $0-48
	MOVD dst+0(FP), R0
	MOVD rows+8(FP), R1
	MOVD c+16(FP), R2
	MOVD ends+24(FP), R11
	MOVD ngroups+32(FP), R10
	MOVD n+40(FP), R4
	NEONCONSTS
	MOVD $0, R5

sg_chunk:
	CMP  $16, R4
	BLT  sg_done
	MOVD $0, R6
	MOVD $0, R9
	VEOR V12.B16, V12.B16, V12.B16
	VEOR V13.B16, V13.B16, V13.B16
	VEOR V14.B16, V14.B16, V14.B16
	VEOR V15.B16, V15.B16, V15.B16

sg_group:
	CMP  R10, R9
	BGE  sg_store
	MOVD (R11)(R9<<3), R13
	VEOR V16.B16, V16.B16, V16.B16
	VEOR V17.B16, V17.B16, V17.B16
	VEOR V18.B16, V18.B16, V18.B16
	VEOR V19.B16, V19.B16, V19.B16
	CMP  R13, R6
	BGE  sg_round // an empty group adds +0
	ROW
	WEIGHT
	BF16ROW16(V16, V17, V18, V19)
	FMUL4S(16, 27, 16)
	FMUL4S(17, 27, 17)
	FMUL4S(18, 27, 18)
	FMUL4S(19, 27, 19)
	ADD  $1, R6

sg_term:
	CMP R13, R6
	BGE sg_round
	ROW
	WEIGHT
	BF16ROW16(V4, V5, V6, V7)
	FMUL4S(4, 27, 4)
	FMUL4S(5, 27, 5)
	FMUL4S(6, 27, 6)
	FMUL4S(7, 27, 7)
	FADD4S(16, 16, 4)
	FADD4S(17, 17, 5)
	FADD4S(18, 18, 6)
	FADD4S(19, 19, 7)
	ADD $1, R6
	B   sg_term

sg_round:
	// Round the group's sum to bf16, then widen it back: clear the low
	// halves.
	ROUND(16, V16, V8, 9, V9)
	ROUND(17, V17, V10, 11, V11)
	ROUND(18, V18, V8, 9, V9)
	ROUND(19, V19, V10, 11, V11)
	VUSHR $16, V16.S4, V16.S4
	VUSHR $16, V17.S4, V17.S4
	VUSHR $16, V18.S4, V18.S4
	VUSHR $16, V19.S4, V19.S4
	VSHL  $16, V16.S4, V16.S4
	VSHL  $16, V17.S4, V17.S4
	VSHL  $16, V18.S4, V18.S4
	VSHL  $16, V19.S4, V19.S4
	CBNZ  R9, sg_add
	VORR  V16.B16, V16.B16, V12.B16
	VORR  V17.B16, V17.B16, V13.B16
	VORR  V18.B16, V18.B16, V14.B16
	VORR  V19.B16, V19.B16, V15.B16
	ADD   $1, R9
	B     sg_group

sg_add:
	// A rounded group sum is never a signalling NaN: no ADDNAN.
	FADD4S(12, 12, 16)
	FADD4S(13, 13, 17)
	FADD4S(14, 14, 18)
	FADD4S(15, 15, 19)
	ADD $1, R9
	B   sg_group

sg_store:
	ROUND(12, V12, V8, 9, V9)
	ROUND(13, V13, V10, 11, V11)
	ROUND(14, V14, V8, 9, V9)
	ROUND(15, V15, V10, 11, V11)
	NARROW(V12, V13, V0)
	NARROW(V14, V15, V1)
	VST1.P [V0.H8, V1.H8], 32(R0)
	ADD    $32, R5
	SUB    $16, R4
	B      sg_chunk

sg_done:
	RET
