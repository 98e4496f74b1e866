// NEON helpers for the arm64 kernels of this package, included by
// rows_arm64.s and sum_arm64.s.
//
// Go's arm64 assembler has no vector floating-point arithmetic, so the
// three instructions below are encoded by hand (A64: FADD, FMUL and FCMEQ,
// vector, 4S; d, n, m are register numbers). Go's disassembler shows them
// by name (go tool objdump).
//
// NaN operands: with FPCR.DN clear (Linux's default, which Go keeps), a
// NEON add or multiply of two NaNs returns the first operand quieted,
// unless the second is signalling and the first quiet: then the second,
// quieted. The reference loops (add and mul in rows.go) return the first
// (acc in a sum, c in a product) whenever it is NaN. A product's NaN is
// always quiet, so adding a product needs nothing more; adding an element
// itself (an unweighted sum, whose element may be a signalling NaN) goes
// through ADDNAN, and a NaN weight takes the reference loop (the Go
// wrappers). Multiply and add are separate instructions (never FMLA): each
// product is rounded to fp32 before it is added, as in the reference.

// Vd = Vn + Vm
#define FADD4S(d, n, m) WORD $(0x4E20D400 | ((m)<<16) | ((n)<<5) | (d))
// Vd = Vn * Vm
#define FMUL4S(d, n, m) WORD $(0x6E20DC00 | ((m)<<16) | ((n)<<5) | (d))
// Vd = all ones in each lane where Vn == Vm (ordered), else 0
#define FCMEQ4S(d, n, m) WORD $(0x4E20E400 | ((m)<<16) | ((n)<<5) | (d))

// NEONCONSTS loads the constants: V31 zero (the low halves of widened
// bf16), V30 1, V29 0x7fff (rounding to bf16), V28 the quiet bit 0x00400000
// (it quiets an fp32 NaN, and is bf16's quiet bit 0x40 once shifted).
#define NEONCONSTS \
	VEOR  V31.B16, V31.B16, V31.B16; \
	MOVW  $1, R16; \
	VDUP  R16, V30.S4; \
	MOVW  $0x7fff, R16; \
	VDUP  R16, V29.S4; \
	MOVW  $0x00400000, R16; \
	VDUP  R16, V28.S4

// WIDEN widens the 8 bf16 of Vx to fp32 in Vlo (elements 0..3) and Vhi
// (4..7): each element becomes the high half of a lane whose low half is 0.
#define WIDEN(x, lo, hi) \
	VZIP1 x.H8, V31.H8, lo.H8; \
	VZIP2 x.H8, V31.H8, hi.H8

// ADDNAN is add(acc, t) of rows.go on 4 lanes: Va = Va + Vt, except that a
// NaN in Va gives Va quieted (NEON would return a signalling NaN of Vt
// over a quiet one of Va). a and t are register numbers, va the register
// a names; V26 and V25 are scratch.
#define ADDNAN(a, va, t) \
	FCMEQ4S(25, a, a); \
	VORR   V28.B16, va.B16, V26.B16; \
	FADD4S(a, a, t); \
	VBIF   V25.B16, V26.B16, va.B16

// ROUND rounds the 4 fp32 of Va to bf16 in the high half of each lane, as
// device.Float32ToBF16:
//	if u&0x7fffffff > 0x7f800000 { return u>>16 | 0x40 }
//	return (u + 0x7fff + (u>>16)&1) >> 16
// a is the register number of va; vt and vm (register m) are scratch.
#define ROUND(a, va, vt, m, vm) \
	VUSHR  $16, va.S4, vt.S4; \
	VAND   V30.B16, vt.B16, vt.B16; \
	VADD   vt.S4, va.S4, vt.S4; \
	VADD   V29.S4, vt.S4, vt.S4; \
	FCMEQ4S(m, a, a); \
	VORR   V28.B16, va.B16, va.B16; \
	VBIT   vm.B16, vt.B16, va.B16

// NARROW packs the high halves of Va's and Vb's lanes (Va's first) into
// the 8 bf16 of Vd.
#define NARROW(va, vb, vd) \
	VUZP2 vb.H8, va.H8, vd.H8

// The kernels hold 32 elements of a term in V4..V11 and of the
// accumulators in V12..V19, a weight in V27.

// SCALE8 multiplies V4..V11 by the weight in V27 (weight first).
#define SCALE8 \
	FMUL4S(4, 27, 4); \
	FMUL4S(5, 27, 5); \
	FMUL4S(6, 27, 6); \
	FMUL4S(7, 27, 7); \
	FMUL4S(8, 27, 8); \
	FMUL4S(9, 27, 9); \
	FMUL4S(10, 27, 10); \
	FMUL4S(11, 27, 11)

// ADD8 adds the products V4..V11 to V12..V19 (accumulator first); ADDNAN8
// adds elements, with ADDNAN's rule.
#define ADD8 \
	FADD4S(12, 12, 4); \
	FADD4S(13, 13, 5); \
	FADD4S(14, 14, 6); \
	FADD4S(15, 15, 7); \
	FADD4S(16, 16, 8); \
	FADD4S(17, 17, 9); \
	FADD4S(18, 18, 10); \
	FADD4S(19, 19, 11)
#define ADDNAN8 \
	ADDNAN(12, V12, 4); \
	ADDNAN(13, V13, 5); \
	ADDNAN(14, V14, 6); \
	ADDNAN(15, V15, 7); \
	ADDNAN(16, V16, 8); \
	ADDNAN(17, V17, 9); \
	ADDNAN(18, V18, 10); \
	ADDNAN(19, V19, 11)
