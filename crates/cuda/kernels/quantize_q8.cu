// Activation quantization for the int8 GEMV kernels (gemv_*_q8): x (f32,
// n a multiple of 32) -> blocks of 32 int8 q (q[n], one byte per value) and
// one f32 scale per block (d[n/32]), q = round(x / d), d = max|x| / 127
// (Q8_1-style blocks without the sum: IQ2_XXS weights are symmetric, so no
// Σx term is needed). One warp per block; launched once per activation
// vector and shared by every matrix that reads it.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
    quantize_q8_32(const float* __restrict__ x, signed char* __restrict__ q,
                   float* __restrict__ d, int n) {
    PDL_PROLOGUE();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ((i & ~31) >= n) return;  // whole warps only (n % 32 == 0)
    const float v = x[i];
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float id = a > 0.f ? 127.f / a : 0.f;
    q[i] = (signed char)__float2int_rn(v * id);
    if ((i & 31) == 0) d[i >> 5] = a / 127.f;
}
