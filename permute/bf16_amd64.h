// bf16 rounding for the AVX2 kernels of this package, included by
// rows_amd64.s and sum_amd64.s. The DATA symbols are file-local (<>), so each
// including file gets its own copy of the constants.

DATA bf16abs<>+0(SB)/4, $0x7fffffff
GLOBL bf16abs<>(SB), RODATA|NOPTR, $4
DATA bf16inf<>+0(SB)/4, $0x7f800000
GLOBL bf16inf<>(SB), RODATA|NOPTR, $4
DATA bf16half<>+0(SB)/4, $0x7fff
GLOBL bf16half<>(SB), RODATA|NOPTR, $4
DATA bf16one<>+0(SB)/4, $1
GLOBL bf16one<>(SB), RODATA|NOPTR, $4
DATA bf16quiet<>+0(SB)/4, $0x40
GLOBL bf16quiet<>(SB), RODATA|NOPTR, $4

// BF16CONSTS loads the constants of ROUND8 with VEX instructions only (a
// legacy SSE instruction here, after a VEX.256 one, would pay the AVX-SSE
// transition).
#define BF16CONSTS \
	VPBROADCASTD bf16abs<>(SB), Y10; \
	VPBROADCASTD bf16inf<>(SB), Y11; \
	VPBROADCASTD bf16half<>(SB), Y12; \
	VPBROADCASTD bf16one<>(SB), Y13; \
	VPBROADCASTD bf16quiet<>(SB), Y14

// ROUND8 rounds the 8 fp32 in Y to bf16 in the low 16 bits of each lane of
// Y, as device.Float32ToBF16:
//	if u&0x7fffffff > 0x7f800000 { return u>>16 | 0x40 }
//	return (u + 0x7fff + (u>>16)&1) >> 16
// T1 and T2 are scratch.
#define ROUND8(Y, T1, T2) \
	VPSRLD    $16, Y, T1; \
	VPAND     Y13, T1, T2; \
	VPADDD    T2, Y, T2; \
	VPADDD    Y12, T2, T2; \
	VPSRLD    $16, T2, T2; \
	VPOR      Y14, T1, T1; \
	VPAND     Y10, Y, Y; \
	VPCMPGTD  Y11, Y, Y; \
	VPBLENDVB Y, T1, T2, Y
