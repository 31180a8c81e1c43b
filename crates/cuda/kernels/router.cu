// MoE routing on the device (crates/model/src/blocks/moe.rs `route`):
// softmax over all n router logits (max-subtracted, sum in f64, p = e *
// (1/sum) rounded to f32), the top k by probability (ties to the lower
// expert index), renormalised to sum 1 when `norm` (the sum of the chosen
// p in f32, in selection order, as the CPU adds them). The chosen experts
// are written in ascending expert order (the order the CPU's per-expert
// loop adds them in): experts_out[i], w_out[i], and slots_out[i] =
// slot_of[expert] (the slot table; null: the identity, full residency).
//
// Launch: one warp (grid 1, block 32). n <= 32*ROUTER_PER_LANE, k <= 32.
#include "common.cuh"

#define ROUTER_PER_LANE 32

extern "C" __global__ void __launch_bounds__(32)
    router_topk(const float* __restrict__ logits, int n, int k, int norm,
                const u32* __restrict__ slot_of, u32* __restrict__ slots_out,
                u32* __restrict__ experts_out, float* __restrict__ w_out) {
    PDL_PROLOGUE();
    const int lane = threadIdx.x;
    float v[ROUTER_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++) {
        const int e = lane + 32 * i;
        v[i] = e < n ? logits[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++) {
        const int e = lane + 32 * i;
        v[i] = e < n ? expf(v[i] - mx) : -1.0f;
        if (e < n) sum += (double)v[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++)
        if (lane + 32 * i < n) v[i] = __fmul_rn(v[i], inv);
    // k rounds of a warp argmax; the winner's entry is set to -1 (p >= 0).
    u32 sel_e[32];
    float sel_p[32];
    for (int r = 0; r < k; r++) {
        float best = -2.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ROUTER_PER_LANE; i++) {
            if (v[i] > best) {  // ascending index within a lane: ties keep the lower
                best = v[i];
                bi = lane + 32 * i;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) {
                best = ob;
                bi = oi;
            }
        }
        sel_e[r] = (u32)bi;
        sel_p[r] = best;
#pragma unroll
        for (int i = 0; i < ROUTER_PER_LANE; i++)
            if (lane + 32 * i == bi) v[i] = -1.0f;
    }
    if (lane != 0) return;
    float s = 0.0f;
    for (int r = 0; r < k; r++) s += sel_p[r];
    // insertion sort by expert id
    for (int a = 1; a < k; a++) {
        const u32 e = sel_e[a];
        const float p = sel_p[a];
        int b = a - 1;
        while (b >= 0 && sel_e[b] > e) {
            sel_e[b + 1] = sel_e[b];
            sel_p[b + 1] = sel_p[b];
            b--;
        }
        sel_e[b + 1] = e;
        sel_p[b + 1] = p;
    }
    for (int r = 0; r < k; r++) {
        experts_out[r] = sel_e[r];
        slots_out[r] = slot_of ? slot_of[sel_e[r]] : sel_e[r];
        w_out[r] = norm ? sel_p[r] / s : sel_p[r];
    }
}
