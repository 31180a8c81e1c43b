// Gated DeltaNet over a chunk of tokens (prefill), the sequential form in
// five launches (deltanet.cu's decode step, split so that only the state
// recurrence runs token after token):
//
// gdn_conv_chunk: the causal depthwise conv + SiLU of every (token,
//   channel) at once: token t (position pos0 + t) reads its window
//   positions pos0+t-K+1 .. pos0+t from the chunk's own inputs where they
//   lie in the chunk and from the ring (slot p % K) before it; zero before
//   position 0. The sum in tap order, oldest first, as the decode step.
//   Grid (ceil(cd / 256), tokens), block 256.
// gdn_ring_chunk: the ring after the chunk, as token-by-token steps leave
//   it: positions max(pos0, end-K) .. end-1 (end = pos0 + tokens) in their
//   slots. A launch of its own: the conv above still reads the old slots.
//   Grid (ceil(cd / 256), min(tokens, K)), block 256.
// gdn_qk_chunk: the L2 norms of every token's q and k (in place).
// gdn_recur_chunk_k{32,64,128,256}: per value head h and slice of W
//   columns (the state in registers for the whole chunk), token after
//   token: the gates, the state update
//       S <- e^g S;  u = S^T k;  delta = beta (v - u);  S <- S + k delta^T;
//   and o = S^T q (unnormalised) into raw[t][h*dv + j]. The state is read
//   once and written once per chunk. Grid n_v * dv/W, block 16*W (W <= 32).
// gdn_norm_chunk: the gated RMSNorm out = RMSNorm(raw) * norm_w * SiLU(z)
//   per (token, head). Grid (n_v, tokens), block 32*ceil(dv/32) (dv <= 1024).
#include "common.cuh"

__device__ __forceinline__ float softplus_c(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

extern "C" __global__ void __launch_bounds__(256)
    gdn_conv_chunk(const float* __restrict__ in, long long ld_in, const float* __restrict__ ring,
                   const float* __restrict__ conv_w, float* __restrict__ y, int cd, int K,
                   int pos0) {
    PDL_PROLOGUE();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    const int t = blockIdx.y, pos = pos0 + t;
    const float* wc = conv_w + (long long)ch * K;
    float s = 0.0f;
    for (int k = 0; k < K; k++) {
        const int q = pos - (K - 1) + k;
        float x = 0.0f;
        if (q >= pos0)
            x = in[(long long)(q - pos0) * ld_in + ch];
        else if (q >= 0)
            x = ring[(long long)(q % K) * cd + ch];
        s = __fadd_rn(s, __fmul_rn(wc[k], x));
    }
    y[(long long)t * cd + ch] = silu_f(s);
}

extern "C" __global__ void __launch_bounds__(256)
    gdn_ring_chunk(const float* __restrict__ in, long long ld_in, float* __restrict__ ring, int cd,
                   int K, int pos0, int tokens) {
    PDL_PROLOGUE();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    const int end = pos0 + tokens;
    const int first = max(pos0, end - K);
    const int q = first + (int)blockIdx.y;
    if (q >= end) return;
    ring[(long long)(q % K) * cd + ch] = in[(long long)(q - pos0) * ld_in + ch];
}

// q and k of every (token, key head) L2-normed in place in the conv
// output (rows of cd floats; sums of squares in f64, as the decode step:
// k*sb and (q*sa)*1/sqrt(dk)), so the recurrence reads them ready. Grid
// (n_k, tokens), block 32*ceil(dk/32) (dk <= 256).
extern "C" __global__ void __launch_bounds__(256)
    gdn_qk_chunk(float* __restrict__ conv, long long cd, int n_k, int dk, float l2_eps) {
    PDL_PROLOGUE();
    __shared__ double scratch[32];
    const int kh = blockIdx.x, i = threadIdx.x;
    float* q = conv + (long long)blockIdx.y * cd + (long long)kh * dk;
    float* k = q + (long long)n_k * dk;
    const float qv = i < dk ? q[i] : 0.0f, kv = i < dk ? k[i] : 0.0f;
    const double a = block_sum_f64((double)qv * qv, scratch);
    const double b = block_sum_f64((double)kv * kv, scratch);
    if (i >= dk) return;
    const float sa = (float)(1.0 / sqrt(a + (double)l2_eps));
    const float sb = (float)(1.0 / sqrt(b + (double)l2_eps));
    const float qscale = 1.0f / sqrtf((float)dk);
    q[i] = __fmul_rn(__fmul_rn(qv, sa), qscale);
    k[i] = __fmul_rn(kv, sb);
}

// The state recurrence over the chunk. Block (h, c): columns j0 = c*W ..
// j0+W-1 of value head h, two columns a warp, lane l holding rows l,
// l+32, ... (RPL = dk/32 of them) of both in registers for the whole
// chunk: u = S^T k and o = S^T q are warp sums (shuffles), no block
// barrier inside a token. One barrier a token publishes the next token's
// k, q, v and gates, which every thread loaded into registers before the
// current token's math (double-buffered in shared memory).
#define GDN_MAXE 4
template <int RPL>
__device__ __forceinline__ void gdn_recur_body(const float* __restrict__ conv,
                                               const float* __restrict__ ba, long long ld_ba,
                                               const float* __restrict__ dt_bias,
                                               const float* __restrict__ ssm_a,
                                               float* __restrict__ state, float* __restrict__ raw,
                                               int n_k, int n_v, int dk, int dv, int W,
                                               int tokens) {
    __shared__ float sk[2][256], sq[2][256], sv[2][64], sg[2][2];
    const int C = dv / W;
    const int h = blockIdx.x / C, c = blockIdx.x % C;
    const int r = n_v / n_k, kh = h / r, jj = h % r;
    const int kd = n_k * dk, cd = 2 * kd + n_v * dv;
    const int j0 = c * W;
    const int t = threadIdx.x, w = t >> 5, l = t & 31;
    const int ja = j0 + 2 * w;  // this warp's two columns: ja, ja + 1
    float* st = state + (long long)h * dk * dv;
    float S[RPL][2];
#pragma unroll
    for (int q = 0; q < RPL; q++)
#pragma unroll
        for (int cc = 0; cc < 2; cc++) S[q][cc] = st[(long long)(l + 32 * q) * dv + ja + cc];
    const float dtb = __ldg(&dt_bias[h]), sa_h = __ldg(&ssm_a[h]);
    // Staging: element e < dk: k[e]; < 2dk: q; < 2dk+W: v; == 2dk+W: the
    // gates (b, a).
    auto fetch = [&](int tok, float* reg) {
        const float* x = conv + (long long)tok * cd;
#pragma unroll
        for (int m = 0; m < GDN_MAXE; m++) {
            const int e = t + m * (int)blockDim.x;
            float v = 0.0f;
            if (e < dk)
                v = __ldg(&x[kd + kh * dk + e]);
            else if (e < 2 * dk)
                v = __ldg(&x[kh * dk + (e - dk)]);
            else if (e < 2 * dk + W)
                v = __ldg(&x[2 * kd + h * dv + j0 + (e - 2 * dk)]);
            else if (e == 2 * dk + W)
                v = __ldg(&ba[(long long)tok * ld_ba + kh * 2 * r + jj]);
            reg[m] = v;
        }
    };
    auto publish = [&](int tok, int buf, const float* reg) {
#pragma unroll
        for (int m = 0; m < GDN_MAXE; m++) {
            const int e = t + m * (int)blockDim.x;
            if (e < dk)
                sk[buf][e] = reg[m];
            else if (e < 2 * dk)
                sq[buf][e - dk] = reg[m];
            else if (e < 2 * dk + W)
                sv[buf][e - 2 * dk] = reg[m];
            else if (e == 2 * dk + W) {
                const float a_in = __ldg(&ba[(long long)tok * ld_ba + kh * 2 * r + r + jj]);
                sg[buf][0] = sigmoid_f(reg[m]);
                const float g = __fmul_rn(sa_h, softplus_c(__fadd_rn(a_in, dtb)));
                sg[buf][1] = expf(g);
            }
        }
    };
    float reg[GDN_MAXE];
    fetch(0, reg);
    publish(0, 0, reg);
    __syncthreads();
    for (int tok = 0; tok < tokens; tok++) {
        const int cur = tok & 1;
        if (tok + 1 < tokens) fetch(tok + 1, reg);
        const float beta = sg[cur][0], decay = sg[cur][1];
        float kk[RPL], qq[RPL];
#pragma unroll
        for (int q = 0; q < RPL; q++) {
            kk[q] = sk[cur][l + 32 * q];
            qq[q] = sq[cur][l + 32 * q];
        }
        float u[2] = {0.0f, 0.0f};
#pragma unroll
        for (int q = 0; q < RPL; q++)
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                S[q][cc] = __fmul_rn(S[q][cc], decay);
                u[cc] = fmaf(S[q][cc], kk[q], u[cc]);
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int cc = 0; cc < 2; cc++) u[cc] += __shfl_xor_sync(0xffffffffu, u[cc], o);
        float ov[2] = {0.0f, 0.0f};
#pragma unroll
        for (int cc = 0; cc < 2; cc++) {
            const float dj = __fmul_rn(beta, __fsub_rn(sv[cur][2 * w + cc], u[cc]));
#pragma unroll
            for (int q = 0; q < RPL; q++) {
                S[q][cc] = fmaf(kk[q], dj, S[q][cc]);
                ov[cc] = fmaf(S[q][cc], qq[q], ov[cc]);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int cc = 0; cc < 2; cc++) ov[cc] += __shfl_xor_sync(0xffffffffu, ov[cc], o);
        if (l < 2) raw[(long long)tok * n_v * dv + h * dv + ja + l] = l == 0 ? ov[0] : ov[1];
        if (tok + 1 < tokens) publish(tok + 1, cur ^ 1, reg);
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < RPL; q++)
#pragma unroll
        for (int cc = 0; cc < 2; cc++) st[(long long)(l + 32 * q) * dv + ja + cc] = S[q][cc];
}

// gdn_recur_chunk_k*'s arguments, one struct passed by value (mirrored by
// `GdnRecurArgs` in src/ops/chunk.rs, #[repr(C)]: same field order and
// types). NVRTC applies `__restrict__` only to kernel parameters, so
// gdn_recur_body reads conv, ba, dt_bias and ssm_a through __ldg.
struct GdnRecurArgs {
    const float* conv;
    const float* ba;
    long long ld_ba;
    const float* dt_bias;
    const float* ssm_a;
    float* state;
    float* raw;
    int n_k, n_v, dk, dv, W, tokens;
};
static_assert(sizeof(GdnRecurArgs) == 80, "GdnRecurArgs: layout differs from src/ops/chunk.rs");

#define GDN_RECUR(NAME, RPL)                                                                      \
    extern "C" __global__ void __launch_bounds__(512) NAME(__grid_constant__ const GdnRecurArgs a) { \
        PDL_PROLOGUE();                                                                           \
        gdn_recur_body<RPL>(a.conv, a.ba, a.ld_ba, a.dt_bias, a.ssm_a, a.state, a.raw, a.n_k,     \
                            a.n_v, a.dk, a.dv, a.W, a.tokens);                                    \
    }

// RPL = dk / 32 rows a lane (the launcher picks W and the variant:
// gdn_chunk_split).
GDN_RECUR(gdn_recur_chunk_k32, 1)
GDN_RECUR(gdn_recur_chunk_k64, 2)
GDN_RECUR(gdn_recur_chunk_k128, 4)
GDN_RECUR(gdn_recur_chunk_k256, 8)

extern "C" __global__ void __launch_bounds__(1024)
    gdn_norm_chunk(const float* __restrict__ raw, const float* __restrict__ z, long long ld_z,
                   const float* __restrict__ norm_w, float* __restrict__ out, int n_v, int dv,
                   float eps) {
    PDL_PROLOGUE();
    __shared__ double scratch[32];
    const int h = blockIdx.x, t = blockIdx.y, j = threadIdx.x;
    const long long at = (long long)t * n_v * dv + (long long)h * dv;
    const float o = j < dv ? raw[at + j] : 0.0f;
    const double ss = block_sum_f64((double)o * o, scratch);
    if (j >= dv) return;
    const float s = (float)(1.0 / sqrt(ss / (double)dv + (double)eps));
    const float zz = z[(long long)t * ld_z + (long long)h * dv + j];
    out[at + j] = __fmul_rn(__fmul_rn(__fmul_rn(o, s), norm_w[j]), silu_f(zz));
}
