// MoE routing on the device (crates/model/src/blocks/moe.rs `route`):
// softmax over all n router logits (max-subtracted, sum in f64, p = e *
// (1/sum) rounded to f32), the top k by probability (ties to the lower
// expert index), renormalised to sum 1 when `norm` (the sum of the chosen
// p in f32, in selection order, as the CPU adds them). The chosen experts
// are written in ascending expert order (the order the CPU's per-expert
// loop adds them in): experts_out[i], w_out[i], and slots_out[i] =
// slot_of[expert] (the slot table; null: the identity, full residency).
//
// Launch: one block of 32 * ceil(n / 32) threads (grid 1), one logit per
// thread (router_topk_spread: any grid, see router_topk_body). n <=
// ROUTER_MAX_N = 1024, 1 <= k <= min(n, 32).
//
// The work is a chain of block barriers, so the design minimises barriers,
// not arithmetic (the old one-warp kernel did k serial rounds of a
// 32-wide scan plus a 5-step shuffle argmax: ~10 us):
//  - softmax: warp max -> shared -> max of the warp maxima; the f64 sum is
//    added in exactly the old kernel's order (lane L adds the logits L,
//    L+32, L+64, ... in turn, then an xor tree over the lanes), so every p
//    is bit-identical to the old kernel's (the selftest and the engine
//    parity compare against references that sum in yet other orders).
//  - selection: p >= 0, so its f32 bits, as an unsigned key, order like p
//    (NaN, only from NaN or infinite logits, is keyed as 0, the lowest:
//    garbage out, but k in-bounds expert ids). A bitwise search for the
//    k-th largest key, one __syncthreads_count per bit from the top bit of
//    max p (= 1/sum) down, stops as soon as exactly k keys are >= the
//    prefix found so far (the set is then decided: usually after ~10-15 of
//    the ~30 bits). If the bits run out with more than k keys >= the k-th
//    largest, those extra are ties at it: of the tied, the lowest indices
//    are taken (a block prefix count), the old kernel's tie rule.
//  - order: a block prefix count over the chosen puts them in ascending
//    expert order; then one warp, lane i holding chosen i, ranks them by
//    (p desc, index asc) = the old kernel's selection order, and every lane
//    adds the chosen p in that order for the renorm sum (as the CPU does).
// crates/cuda/src/kernel_model.rs models this selection on the host and
// checks it against a sort-based top-k.
#include "common.cuh"

#define ROUTER_MAX_N 1024
#define ROUTER_MAX_K 32

// p's order as an unsigned integer (p >= 0 or NaN; NaN lowest).
__device__ __forceinline__ u32 router_key(float p) { return p == p ? __float_as_uint(p) : 0u; }

// Over the block: how many threads before this one (in thread order) have
// `pred`. One barrier; `wc` (32 words) must not be read by anyone else
// until the block's next barrier, so each call needs its own `wc`.
__device__ __forceinline__ int router_count_before(bool pred, u32* wc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 b = __ballot_sync(0xffffffffu, pred);
    if (lane == 0) wc[warp] = __popc(b);
    __syncthreads();
    int before = __popc(b & ((1u << lane) - 1u));
    for (int w = 0; w < warp; w++) before += (int)wc[w];
    return before;
}

// The chosen experts' slot images into L2, this block's share of them
// (router_topk_spread): k experts x the three stacks' `stride` bytes, cut
// into 128-byte lines and dealt out to the grid's blocks in order, one
// prefetch per line. `chosen` (shared) holds the k experts.
__device__ __forceinline__ void router_prefetch_experts(const u32* chosen, int k,
                                                        const u32* __restrict__ slot_of,
                                                        const u8* g, const u8* u, const u8* d,
                                                        u64 sg, u64 su, u64 sd) {
    const u64 lg = (sg + 127) >> 7, lu = (su + 127) >> 7, ld = (sd + 127) >> 7;
    const u64 per = lg + lu + ld, total = per * (u64)k;
    const u64 share = (total + gridDim.x - 1) / gridDim.x;
    const u64 l0 = share * blockIdx.x, l1 = l0 + share < total ? l0 + share : total;
    for (u64 l = l0 + threadIdx.x; l < l1; l += blockDim.x) {
        const u64 e = l / per, r = l - e * per;
        const u32 id = chosen[e];
        const u64 slot = slot_of ? slot_of[id] : id;
        const u8* p = r < lg        ? g + slot * sg + (r << 7)
                      : r < lg + lu ? u + slot * su + ((r - lg) << 7)
                                    : d + slot * sd + ((r - lg - lu) << 7);
        l2_prefetch_line(p);
    }
}

// SPREAD (router_topk_spread): every block of the grid makes the same
// selection (the logits are 4 KB of L2 reads; the barriers are the
// cost, and the blocks run them side by side), then asks L2 for its share
// of the chosen experts' gate, up and down slot images, so that the
// routed GEMVs right after find them there: the prefetch is spread over
// the SMs (one block issuing all of it measured 34% slower,
// docs/what-did-not-work.md). Block 0 alone writes the outputs. The
// stacks' images are `sg`, `su`, `sd` bytes apart; at full residency
// (slot_of null) slot = expert.
template <bool SPREAD>
__device__ __forceinline__ void router_topk_body(const float* __restrict__ logits, int n, int k,
                                                 int norm, const u32* __restrict__ slot_of,
                                                 u32* __restrict__ slots_out,
                                                 u32* __restrict__ experts_out,
                                                 float* __restrict__ w_out, const u8* pg,
                                                 const u8* pu, const u8* pd, u64 sg, u64 su,
                                                 u64 sd) {
    __shared__ float s_e[ROUTER_MAX_N];
    __shared__ float s_wmax[32];
    __shared__ float s_inv;
    __shared__ u32 s_ties[32];
    __shared__ u32 s_chosen[32];
    __shared__ u32 s_win_e[ROUTER_MAX_K];
    __shared__ float s_win_p[ROUTER_MAX_K];
    __shared__ float s_ord_p[ROUTER_MAX_K];

    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int n_warps = blockDim.x >> 5;
    const bool valid = t < n;

    // max (fmaxf is exact in any order)
    const float x = valid ? logits[t] : -INFINITY;
    float mx = x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) s_wmax[warp] = mx;
    __syncthreads();
    mx = lane < n_warps ? s_wmax[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));

    // f64 sum in the old one-warp kernel's order (see the top)
    const float e = valid ? expf(x - mx) : 0.0f;
    s_e[t] = e;
    __syncthreads();
    if (warp == 0) {
        double sum = 0.0;
#pragma unroll
        for (int i = 0; i < ROUTER_MAX_N / 32; i++)
            if (lane + 32 * i < n) sum += (double)s_e[lane + 32 * i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) s_inv = (float)(1.0 / sum);
    }
    __syncthreads();
    const float inv = s_inv;
    const float p = __fmul_rn(e, inv);
    const u32 key = router_key(p);

    // The k-th largest key, bit by bit; every key <= key(inv) (e <= 1, so
    // p = e * inv <= inv), so the bits above inv's top bit are 0 in all.
    // `cnt` = how many keys are >= `thr`; stop once that is exactly k.
    u32 thr = 0;
    int cnt = n;
    const u32 key_max = router_key(inv);
    for (int b = key_max ? 31 - __clz(key_max) : -1; b >= 0 && cnt != k; b--) {
        const u32 c = thr | (1u << b);
        const int m = __syncthreads_count(valid && key >= c);  // block-uniform
        if (m >= k) {
            thr = c;
            cnt = m;
        }
    }
    bool chosen = valid && key >= thr;
    if (cnt != k) {
        // thr is the k-th largest key and more than k keys are >= it: the
        // ones above it, and of those equal to it the lowest indices.
        const int above = __syncthreads_count(valid && key > thr);
        const bool tie = valid && key == thr;
        const int ties_before = router_count_before(tie, s_ties);
        chosen = (valid && key > thr) || (tie && ties_before < k - above);
    }
    // exactly k chosen; in ascending expert order (`pos < k` only guards
    // the shared arrays, it holds by the argument above)
    const int pos = router_count_before(chosen, s_chosen);
    if (chosen && pos < k) {
        s_win_e[pos] = (u32)t;
        s_win_p[pos] = p;
    }
    __syncthreads();
    if (SPREAD) {
        router_prefetch_experts(s_win_e, k, slot_of, pg, pu, pd, sg, su, sd);
        if (blockIdx.x != 0) return;
    }
    if (warp != 0) return;

    // lane i: chosen i; its rank in selection order (p desc, then index asc;
    // the chosen are in index order, so a lower lane = a lower index)
    const bool act = lane < k;
    const u32 me = act ? s_win_e[lane] : 0u;
    const float mp = act ? s_win_p[lane] : 0.0f;
    const u32 mk = router_key(mp);
    int rank = 0;
    for (int j = 0; j < k; j++) {
        const u32 ok = __shfl_sync(0xffffffffu, mk, j);
        rank += (ok > mk || (ok == mk && j < lane)) ? 1 : 0;
    }
    if (act) s_ord_p[rank] = mp;
    __syncwarp();
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += s_ord_p[j];
    if (act) {
        experts_out[lane] = me;
        slots_out[lane] = slot_of ? slot_of[me] : me;
        w_out[lane] = norm ? mp / s : mp;
    }
}

extern "C" __global__ void __launch_bounds__(ROUTER_MAX_N)
    router_topk(const float* __restrict__ logits, int n, int k, int norm,
                const u32* __restrict__ slot_of, u32* __restrict__ slots_out,
                u32* __restrict__ experts_out, float* __restrict__ w_out) {
    PDL_PROLOGUE();
    router_topk_body<false>(logits, n, k, norm, slot_of, slots_out, experts_out, w_out, nullptr,
                            nullptr, nullptr, 0, 0, 0);
}

// Launch: as router_topk, on a grid of any number of blocks.
extern "C" __global__ void __launch_bounds__(ROUTER_MAX_N)
    router_topk_spread(const float* __restrict__ logits, int n, int k, int norm,
                       const u32* __restrict__ slot_of, u32* __restrict__ slots_out,
                       u32* __restrict__ experts_out, float* __restrict__ w_out, const u8* pg,
                       const u8* pu, const u8* pd, u64 sg, u64 su, u64 sd) {
    PDL_PROLOGUE();
    router_topk_body<true>(logits, n, k, norm, slot_of, slots_out, experts_out, w_out, pg, pu, pd,
                           sg, su, sd);
}

// router_topk_warp: the same selection and outputs, bit for bit, on one
// warp with no barrier, for n <= 32 * ROUTER_WARP_V = 512. Lane L holds
// logits L, L + 32, ... in registers, so the f64 sum is added in the block
// kernel's order (its warp 0 adds them the same way). Selection: k rounds
// of a warp arg-max over (key, then the lower index), each lane offering
// its best live value; the winner's lane retires it. The rounds pick the
// experts in the block kernel's selection order (p desc, index asc), so the
// renorm sum is added in that order as they come; the k winners (lane r
// holding winner r) are then put in ascending expert order. Launch: one
// block of 32 threads.
#define ROUTER_WARP_V 16
// (key, index) as one orderable word: a larger key first, then the lower
// index; 0 = nothing (every real entry is larger: its index is < 2^31).
__device__ __forceinline__ u64 router_rank(u32 key, u32 idx) {
    return ((u64)key << 32) | (u64)(0xffffffffu - idx);
}

extern "C" __global__ void __launch_bounds__(32)
    router_topk_warp(const float* __restrict__ logits, int n, int k, int norm,
                     const u32* __restrict__ slot_of, u32* __restrict__ slots_out,
                     u32* __restrict__ experts_out, float* __restrict__ w_out) {
    PDL_PROLOGUE();
    const int lane = threadIdx.x;
    float p[ROUTER_WARP_V];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTER_WARP_V; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n ? logits[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < ROUTER_WARP_V; i++) {
        const bool valid = lane + 32 * i < n;
        p[i] = valid ? expf(p[i] - mx) : 0.0f;
        if (valid) sum += (double)p[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
    u32 alive = 0;
#pragma unroll
    for (int i = 0; i < ROUTER_WARP_V; i++) {
        p[i] = __fmul_rn(p[i], inv);
        if (lane + 32 * i < n) alive |= 1u << i;
    }
    // This lane's best live entry.
    auto best_of = [&]() {
        u64 b = 0;
#pragma unroll
        for (int i = 0; i < ROUTER_WARP_V; i++) {
            const u64 c = (alive >> i) & 1u ? router_rank(router_key(p[i]), lane + 32 * i) : 0ull;
            b = c > b ? c : b;
        }
        return b;
    };
    u64 mine = best_of();
    u32 my_e = 0;
    float my_p = 0.0f, s = 0.0f;
    for (int r = 0; r < k; r++) {
        u64 b = mine;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const u64 other = __shfl_xor_sync(0xffffffffu, b, o);
            b = other > b ? other : b;
        }
        const u32 idx = 0xffffffffu - (u32)b;
        const int owner = (int)(idx & 31u), slot = (int)(idx >> 5);
        float wp = 0.0f;
        if (lane == owner) {
#pragma unroll
            for (int i = 0; i < ROUTER_WARP_V; i++)
                if (i == slot) wp = p[i];
            alive &= ~(1u << slot);
            mine = best_of();
        }
        wp = __shfl_sync(0xffffffffu, wp, owner);
        s += wp;
        if (lane == r) {
            my_e = idx;
            my_p = wp;
        }
    }
    // ascending expert order
    const bool act = lane < k;
    int pos = 0;
    for (int j = 0; j < k; j++) pos += __shfl_sync(0xffffffffu, my_e, j) < my_e ? 1 : 0;
    if (act) {
        experts_out[pos] = my_e;
        slots_out[pos] = slot_of ? slot_of[my_e] : my_e;
        w_out[pos] = norm ? my_p / s : my_p;
    }
}
