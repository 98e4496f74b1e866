// Test kernels for internal/cuda. go generate ./internal/cuda builds them:
//
//	nvcc -ptx -arch=compute_90 -o kernels.ptx kernels.cu (testdata/gen.sh)
//
// Parameters of mixed sizes on purpose: a launch that passed every argument
// at 8 bytes would shift the later ones and fail the tests.
#include <stdint.h>

// goep_test_add adds add to x[0..n).
extern "C" __global__ void goep_test_add(int32_t add, int32_t *x, int64_t n)
{
	int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	int64_t stride = (int64_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride) {
		x[i] += add;
	}
}

// goep_test_args stores its scalar arguments into out, one per 8-byte slot:
// out[0] = a, out[1] = b, out[2] = c (bits), out[3] = d, out[4] = e.
extern "C" __global__ void goep_test_args(int32_t a, uint32_t b, float c, uint64_t d,
					  int64_t e, uint64_t *out)
{
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		out[0] = (uint64_t)(int64_t)a;
		out[1] = b;
		out[2] = __float_as_uint(c);
		out[3] = d;
		out[4] = (uint64_t)e;
	}
}
