// Row units of the GPU data path's kernels (ep.cu, onelaunch.cu): rows
// move in units of unit bytes (16 when the row bytes and every base
// address allow, else 4, 2 or 1; package gpu's unitOf picks it).
#ifndef GOEP_GPU_UNITS_CUH
#define GOEP_GPU_UNITS_CUH

#include <stdint.h>

namespace goep_units {  // named, not anonymous: keeps the PTX independent of the checkout path

// zero_unit zeroes unit u (of unit bytes) of dst.
__device__ __forceinline__ void zero_unit(uint8_t *dst, int64_t u, int32_t unit)
{
	switch (unit) {
	case 16:
		((uint4 *)dst)[u] = make_uint4(0, 0, 0, 0);
		break;
	case 4:
		((uint32_t *)dst)[u] = 0;
		break;
	case 2:
		((uint16_t *)dst)[u] = 0;
		break;
	default:  // 1: fp8 rows at an odd address
		dst[u] = 0;
		break;
	}
}

}  // namespace goep_units

#endif  // GOEP_GPU_UNITS_CUH
