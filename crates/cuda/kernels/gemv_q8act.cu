// The int8-activation GEMV kernels (q8act.cuh has the formats and the
// body): every format of Q8_TYPES at 1, 2 and 4 rows per lane group.
#include "q8act.cuh"

#define GEMV_Q8_KERNEL(NAME, T, NR, SG)                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                               \
        NAME(const u8* __restrict__ w0, const u8* __restrict__ w1, int n_first, u64 mat_bytes,  \
             const u32* __restrict__ slots, const signed char* __restrict__ xq,                 \
             const float* __restrict__ xd, long long x_stride, float* __restrict__ y, int rows, \
             int nb, const NormTail* __restrict__ tail) {                                       \
        PDL_PROLOGUE();                                                                         \
        gemv_q8_body<T, NR, SG>(w0, w1, n_first, mat_bytes, slots, xq, xd, x_stride, y, rows,  \
                                nb, tail);                                                      \
    }

// `_q8s`: the IQ2_XXS grid copied to shared memory per block.
GEMV_Q8_KERNEL(gemv_iq2_xxs_q8_r1, Iq2Q8<false>, 1, false)
GEMV_Q8_KERNEL(gemv_iq2_xxs_q8_r2, Iq2Q8<false>, 2, false)
GEMV_Q8_KERNEL(gemv_iq2_xxs_q8_r4, Iq2Q8<false>, 4, false)
GEMV_Q8_KERNEL(gemv_iq2_xxs_q8s_r1, Iq2Q8<true>, 1, true)
GEMV_Q8_KERNEL(gemv_iq2_xxs_q8s_r2, Iq2Q8<true>, 2, true)
GEMV_Q8_KERNEL(gemv_iq2_xxs_q8s_r4, Iq2Q8<true>, 4, true)
GEMV_Q8_KERNEL(gemv_q8_0_q8_r1, Q80Q8, 1, false)
GEMV_Q8_KERNEL(gemv_q8_0_q8_r2, Q80Q8, 2, false)
GEMV_Q8_KERNEL(gemv_q8_0_q8_r4, Q80Q8, 4, false)
GEMV_Q8_KERNEL(gemv_q4_k_q8_r1, Q4KQ8, 1, false)
GEMV_Q8_KERNEL(gemv_q4_k_q8_r2, Q4KQ8, 2, false)
GEMV_Q8_KERNEL(gemv_q4_k_q8_r4, Q4KQ8, 4, false)
GEMV_Q8_KERNEL(gemv_iq4_nl_q8_r1, Iq4NlQ8, 1, false)
GEMV_Q8_KERNEL(gemv_iq4_nl_q8_r2, Iq4NlQ8, 2, false)
GEMV_Q8_KERNEL(gemv_iq4_nl_q8_r4, Iq4NlQ8, 4, false)
GEMV_Q8_KERNEL(gemv_q6_k_q8_r1, Q6KQ8, 1, false)
GEMV_Q8_KERNEL(gemv_q6_k_q8_r2, Q6KQ8, 2, false)
GEMV_Q8_KERNEL(gemv_q6_k_q8_r4, Q6KQ8, 4, false)
GEMV_Q8_KERNEL(gemv_iq2_xs_q8_r1, Iq2XsQ8, 1, false)
GEMV_Q8_KERNEL(gemv_iq2_xs_q8_r2, Iq2XsQ8, 2, false)
GEMV_Q8_KERNEL(gemv_iq2_xs_q8_r4, Iq2XsQ8, 4, false)
GEMV_Q8_KERNEL(gemv_iq1_m_q8_r1, Iq1MQ8, 1, false)
GEMV_Q8_KERNEL(gemv_iq1_m_q8_r2, Iq1MQ8, 2, false)
GEMV_Q8_KERNEL(gemv_iq1_m_q8_r4, Iq1MQ8, 4, false)
