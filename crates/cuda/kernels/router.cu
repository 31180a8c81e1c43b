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
// thread. n <= ROUTER_MAX_N = 1024, 1 <= k <= min(n, 32).
// router_gemv_topk (at the end) computes the logits too, in one launch.
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
// crates/cuda/src/kernel_model/router.rs models this selection on the host and
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

__device__ __forceinline__ void router_topk_body(const float* __restrict__ logits, int n, int k,
                                                 int norm, const u32* __restrict__ slot_of,
                                                 u32* __restrict__ slots_out,
                                                 u32* __restrict__ experts_out,
                                                 float* __restrict__ w_out) {
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
    // L2 reads: in router_gemv_topk other blocks of the grid wrote them.
    const float x = valid ? __ldcg(logits + t) : -INFINITY;
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
        slots_out[lane] = slot_of ? __ldg(slot_of + me) : me;
        w_out[lane] = norm ? mp / s : mp;
    }
}

extern "C" __global__ void __launch_bounds__(ROUTER_MAX_N)
    router_topk(const float* __restrict__ logits, int n, int k, int norm,
                const u32* __restrict__ slot_of, u32* __restrict__ slots_out,
                u32* __restrict__ experts_out, float* __restrict__ w_out) {
    PDL_PROLOGUE();
    router_topk_body(logits, n, k, norm, slot_of, slots_out, experts_out, w_out);
}

// router_gemv_topk: the router GEMV and the top-k above in one launch, so a
// MoE layer's chain has one dependent step fewer (the top-k kernel's launch
// and its wait for the GEMV's grid).
//   logits = W x   (W: `rows` x `cols` f32, row-major; rows >= n: the
//                   router's n rows first, then any stacked rows, e.g. the
//                   shared expert's gate)
//   then router_topk_body on logits[0..n) in the grid's last block.
// Each row is a dot product over RG_TPR = 128 threads (4 warps): thread u
// takes float4s u, u + 128, ... of the row; its first RG_V of them are
// loaded before the PDL wait (the weights do not depend on the previous
// kernel, so their DRAM latency overlaps its tail). The warp sums, then the
// 4 warps' sums in warp order: a fixed order, so the logits are the same
// bits in every launch.
// The last block: every block counts itself done on `counter` (atomicAdd
// after its logits and a fence); the block that sees gridDim.x - 1 is the
// last, so every logit is written and visible, and it resets the counter
// to 0 for the next launch (no other block of this launch touches it
// again, and the next launch on the stream waits for this one's grid).
// Launch: grid ceil(rows / (blockDim / 128)), blockDim = 128 *
// ceil(n / 128) (at least n threads for the top-k: one logit a thread),
// <= ROUTER_MAX_N; cols % 4 == 0 (16-byte row starts).
#define RG_TPR 128
#define RG_V 4
//
// With `norm_w` (else null), x is computed here rather than read: the
// layer's post-mixer RMSNorm, x = RMSNorm(resid + mix) * norm_w, in every
// block (the 8 KB of resid and mix are L2 reads; rms_norm_v8's arithmetic,
// a thread holding 8 consecutive values, so the same bits), into shared
// memory; block 0 also writes it to `x` and, with hq, as int8 activations
// (the shared expert and the routed gate|up read them). `resid` is left as
// it was: the combine adds mix to it (moe_combine_norm_v8's `mix`), since
// other blocks still read it here. Needs cols % 32 == 0 and cols <= 8 *
// blockDim, cols <= RG_MAX_D.
#define RG_MAX_D 4096
// Before the PDL wait: this thread's first RG_V float4s of its router row
// and (with the fused norm) its 8 norm weights, into registers. Both are
// model weights that no kernel writes, so reading them before the wait is
// safe, and their DRAM latency overlaps the previous kernel's tail.
__device__ __forceinline__ void router_gemv_prefetch(const float* __restrict__ w, int rows,
                                                     int cols, const float* __restrict__ norm_w,
                                                     float4* wv, float* wn) {
    const int t = threadIdx.x, u = t % RG_TPR;
    const int row = blockIdx.x * (blockDim.x / RG_TPR) + t / RG_TPR;
    const int n4 = cols >> 2;
    const float4* wr = reinterpret_cast<const float4*>(w + (u64)(row < rows ? row : 0) * cols);
#pragma unroll
    for (int v = 0; v < RG_V; v++) {
        const int i = u + v * RG_TPR;
        wv[v] = i < n4 ? __ldg(wr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (norm_w && 8 * t < cols) {
        load8(norm_w + 8 * t, wn);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) wn[e] = 0.f;
    }
}
// Kernel arguments, one struct passed by value (mirrored by
// `RouterGemvArgs` in src/ops/router.rs, #[repr(C)]: same field order and
// types). NVRTC applies `__restrict__` only to kernel parameters, so the
// read-only inputs are read through __ldg explicitly (load8 and the
// weight loads above already are; slot_of in router_topk_body too).
struct RouterGemvArgs {
    const float* w;
    float* x;
    float* logits;
    u32* counter;
    const u32* slot_of;
    u32* slots_out;
    u32* experts_out;
    float* w_out;
    const float* resid;
    const float* mix;
    const float* norm_w;
    signed char* hq;
    float* hqd;
    int rows, cols, n, k, norm;
    float eps;
};
static_assert(sizeof(RouterGemvArgs) == 128, "RouterGemvArgs: layout differs from src/ops/router.rs");

extern "C" __global__ void __launch_bounds__(ROUTER_MAX_N) router_gemv_topk(__grid_constant__ const RouterGemvArgs a) {
    float4 wv[RG_V];
    float wn[8];
    router_gemv_prefetch(a.w, a.rows, a.cols, a.norm_w, wv, wn);
    PDL_PROLOGUE();
    const float* w = a.w;
    float* x = a.x;
    const int rows = a.rows, cols = a.cols;
    const float* norm_w = a.norm_w;
    __shared__ float s_part[ROUTER_MAX_N / 32];
    __shared__ int s_last;
    __shared__ __align__(16) float s_x[RG_MAX_D];
    __shared__ double s_scratch[32];
    const int t = threadIdx.x, u = t % RG_TPR, lane = t & 31;
    const int row = blockIdx.x * (blockDim.x / RG_TPR) + t / RG_TPR;
    const bool live = row < rows;
    const int n4 = cols >> 2;
    const float4* wr = reinterpret_cast<const float4*>(w + (u64)(live ? row : 0) * cols);
    const int i8 = 8 * t;
    const bool act8 = norm_w && i8 < cols;
    const float4* xr = reinterpret_cast<const float4*>(x);
    if (norm_w) {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = 0.f;
        if (act8) {
            float m8[8];
            load8(a.resid + i8, v);
            load8(a.mix + i8, m8);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = __fadd_rn(v[e], m8[e]);
        }
        // norm8_store's arithmetic (the same bits as rms_norm_v8), into
        // shared memory (and x, hq: block 0)
        float o[8];
        norm8(v, wn, cols, a.eps, s_scratch, o);
        if (act8) st8(s_x + i8, o);
        if (blockIdx.x == 0) {
            if (act8) st8(x + i8, o);
            if (a.hq) quad_q8(o, i8, act8, a.hq, a.hqd);
        }
        __syncthreads();
        xr = reinterpret_cast<const float4*>(s_x);
    }
    float4 xv[RG_V];
#pragma unroll
    for (int v = 0; v < RG_V; v++) {
        const int i = u + v * RG_TPR;
        xv[v] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float acc = 0.f;
#pragma unroll
    for (int v = 0; v < RG_V; v++) {
        acc = fmaf(wv[v].x, xv[v].x, acc);
        acc = fmaf(wv[v].y, xv[v].y, acc);
        acc = fmaf(wv[v].z, xv[v].z, acc);
        acc = fmaf(wv[v].w, xv[v].w, acc);
    }
    for (int i = u + RG_V * RG_TPR; i < n4; i += RG_TPR) {
        const float4 wi = __ldg(wr + i), b = xr[i];
        acc = fmaf(wi.x, b.x, acc);
        acc = fmaf(wi.y, b.y, acc);
        acc = fmaf(wi.z, b.z, acc);
        acc = fmaf(wi.w, b.w, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) s_part[t >> 5] = acc;
    __syncthreads();
    if (u == 0 && live) {
        const int w0 = t >> 5;
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < RG_TPR / 32; q++) s += s_part[w0 + q];
        a.logits[row] = s;
        __threadfence();  // the logit before this block's count
    }
    __syncthreads();
    if (t == 0) s_last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    if (t == 0) *a.counter = 0u;
    __threadfence();  // the other blocks' logits after their counts
    router_topk_body(a.logits, a.n, a.k, a.norm, a.slot_of, a.slots_out, a.experts_out, a.w_out);
}

// router_topk over a chunk of tokens (prefill): block t takes the logits
// row logits + t*ld and writes its k choices at experts_out + t*k (and
// slots_out, w_out likewise). Grid tokens, block as router_topk.
extern "C" __global__ void __launch_bounds__(ROUTER_MAX_N)
    router_topk_chunk(const float* __restrict__ logits, long long ld, int n, int k, int norm,
                      u32* __restrict__ slots_out, u32* __restrict__ experts_out,
                      float* __restrict__ w_out) {
    PDL_PROLOGUE();
    const long long t = blockIdx.x;
    router_topk_body(logits + t * ld, n, k, norm, nullptr, slots_out + t * k, experts_out + t * k,
                     w_out + t * k);
}
