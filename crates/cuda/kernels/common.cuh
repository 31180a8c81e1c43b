// Shared helpers for every kernel family. No CUDA headers: the same text
// compiles under NVRTC (at run time, no include path) and nvcc/ptxas (CI).
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Programmatic dependent launch (PDL, sm_90). When the host launches a
// kernel with the programmatic-stream-serialization attribute (`--pdl`),
// the GPU may start it while the previous kernel of the stream still runs.
// `griddepcontrol.wait` then blocks until the previous grid has completed
// and its writes are visible; `griddepcontrol.launch_dependents` lets the
// next kernel be scheduled as soon as every block of this one has issued
// it. Both are no-ops for launches without the attribute. PTX, not the
// CUDA intrinsics: NVRTC here has no CUDA headers.
//
// What the early start buys is the time before the wait: a kernel whose
// weights are fixed (every GEMV, the DeltaNet state) pulls them into L2
// there (`l2_prefetch`), while its predecessor computes, so that after the
// wait its loads hit L2 instead of DRAM. Launch overlap alone measured
// slower (docs/what-did-not-work.md).
__device__ __forceinline__ void pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The statement of every `extern "C" __global__` kernel before its first
// access to memory a predecessor may write (only an L2 prefetch of
// read-only weights, or a hint read with `slot_hint`, may come before).
// Every kernel must wait (not only those that read a predecessor's
// output): a kernel that skips the wait could finish before its
// predecessor, breaking the completion chain the kernels after it rely on.
// The trigger comes after the wait: the next kernel is then launched while
// this one computes, so it prefetches during this kernel's work, and when
// a kernel starts every kernel two or more before it has completed (the
// routed experts' down GEMV may read its slots early). The trigger first
// let launches run further ahead and measured slower
// (docs/what-did-not-work.md).
#define PDL_PROLOGUE()            \
    do {                          \
        pdl_wait();               \
        pdl_launch_dependents();  \
    } while (0)

// Ask L2 for the bytes [p, p + n) (a hint: no fault, no data returned),
// one 128-byte line per instruction, the lines spread over the block's
// threads. Only for memory no kernel of the token writes, or whose stale
// lines L2 keeps coherent anyway (L2 is the point of coherence; L1 is not
// touched).
__device__ __forceinline__ void l2_prefetch_line(const void* p) {
    asm volatile("prefetch.L2 [%0];" ::"l"(p));
}
__device__ __forceinline__ void l2_prefetch(const void* p, u64 n) {
    if (n == 0) return;
    const u64 a = (u64)p, first = a >> 7, last = (a + n - 1) >> 7;
    for (u64 l = first + threadIdx.x; l <= last; l += blockDim.x)
        l2_prefetch_line((const void*)(l == first ? a : l << 7));
}

// The expert slot a GEMV block will read (i itself without a slot table),
// read before `griddepcontrol.wait` to aim its prefetch. Cached in L2 only
// (`.cg`), so that no stale line stays in this SM's L1 for the
// non-coherent loads after the wait. The value may be stale, so it only
// steers hints: the kernel two launches back has completed (the trigger
// comes after the wait), so the slots hold either this token's (the cache
// plan ran two or more kernels back) or the previous token's, both slots
// of the stack.
__device__ __forceinline__ u32 slot_hint(const u32* slots, int i) {
    if (!slots) return (u32)i;
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(slots + i));
    return v;
}
// No math headers under NVRTC: infinity by its bits.
#define INFINITY __int_as_float(0x7f800000)

// f16 bits -> f32 (exact), without cuda_fp16.h.
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16 bits, IEEE round to nearest even (overflow to infinity), for
// the f16 KV cache; the host's rounding (`half::f16::from_f32`) matches.
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Byte k (0..3) of a word, as an int.
__device__ __forceinline__ int byte_of(u32 w, int k) { return (w >> (8 * k)) & 0xff; }

// 8 consecutive f32 from a 32-byte-aligned address (two 128-bit loads).
__device__ __forceinline__ void load8(const float* __restrict__ p, float* v) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Exact small integer -> f32 without I2F (a quarter-rate instruction on
// sm_90, the bottleneck of the first GEMV version): byte k of w is placed in
// the low mantissa byte of 2^23 (one PRMT) and 2^23 is subtracted (one FADD).
// k must be a compile-time constant after unrolling.
__device__ __forceinline__ float ubyte_f(u32 w, int k) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | (u32)k)) - 8388608.0f;
}
// The same for a signed byte; `wx` is the word XOR 0x80808080.
__device__ __forceinline__ float sbyte_f(u32 wx, int k) {
    return __int_as_float(__byte_perm(wx, 0x4B000000u, 0x7540u | (u32)k)) - 8388736.0f;
}

// Sum of one double per thread over the whole block (blockDim a multiple of
// 32, at most 1024); every thread gets the total. `scratch` holds 32
// doubles of shared memory; the call has two barriers, so every thread of
// the block must make it.
__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < nw; w++) t += scratch[w];
    return t;
}

// 8 consecutive f32 at a 32-byte-aligned address, plain loads (memory this
// kernel may write), and their store.
__device__ __forceinline__ void ld8_plain(const float* p, float* v) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void st8(float* p, const float* v) {
    const float4 a = {v[0], v[1], v[2], v[3]}, b = {v[4], v[5], v[6], v[7]};
    reinterpret_cast<float4*>(p)[0] = a;
    reinterpret_cast<float4*>(p)[1] = b;
}

// x * sigmoid(x), and sigmoid, with the CPU's operation order
// (crates/cpu/src/ops.rs): 1 / (1 + e^-x), IEEE division.
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return __fmul_rn(x, sigmoid_f(x)); }

// int8 activations for the GEMV kernels, written where a vector is produced
// (as quantize_q8.cu does): the 32 lanes of a full warp hold v for the 32
// consecutive, 32-aligned indices i; per 32: d = max|v| / 127, q = round(v/d).
__device__ __forceinline__ void warp_q8(float v, int i, signed char* __restrict__ q,
                                        float* __restrict__ qd) {
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float id = a > 0.f ? 127.f / a : 0.f;
    q[i] = (signed char)__float2int_rn(v * id);
    if ((i & 31) == 0) qd[i >> 5] = a / 127.f;
}

// The same quantization with 8 consecutive values per thread: the four
// lanes 4g..4g+3 of a warp hold values 32m..32m+31 (lane 4g+i values
// 32m+8i..), i = the index of this thread's first value (a multiple of 8).
// Every lane of the warp must call it (shuffles); `store` = whether this
// thread's values exist. Results as warp_q8's: d = max|v| / 127 per 32,
// q = round(v * 127 / max|v|).
__device__ __forceinline__ void quad_q8(const float* v, int i, bool store,
                                        signed char* __restrict__ q, float* __restrict__ qd) {
    float a = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) a = fmaxf(a, fabsf(v[e]));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
    const float id = a > 0.f ? 127.f / a : 0.f;
    u32 w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; e++)
        w[e >> 2] |= ((u32)(u8)(signed char)__float2int_rn(v[e] * id)) << (8 * (e & 3));
    if (!store) return;
    const uint2 packed = {w[0], w[1]};
    *reinterpret_cast<uint2*>(q + i) = packed;
    if ((i & 31) == 0) qd[i >> 5] = a / 127.f;
}

// The RMSNorm of the 8-values-a-thread kernels: this thread holds the
// row's values i..i+8 in v (zeros where it holds none) and their weights in
// w; the row's sum of squares in f64 over the block (every thread must
// call: block_sum_f64), then o = v * s * w with s = 1 / sqrt(mean + eps).
__device__ __forceinline__ void norm8(const float* v, const float* w, int d, float eps,
                                      double* scratch, float* o) {
    double ss = 0.0;
#pragma unroll
    for (int e = 0; e < 8; e++) ss += (double)v[e] * (double)v[e];
    ss = block_sum_f64(ss, scratch);
    const float s = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = __fmul_rn(__fmul_rn(v[e], s), w[e]);
}

// norm8 and its store (norm.cu rms_norm_v8, elementwise.cu
// moe_combine_norm_v8): out[i..i+8] (where act), and the same as int8
// (quad_q8) when q is given.
__device__ __forceinline__ void norm8_store(const float* v, const float* w, int d, float eps,
                                            int i, bool act, double* scratch,
                                            float* __restrict__ out, signed char* __restrict__ q,
                                            float* __restrict__ qd) {
    float o[8];
    norm8(v, w, d, eps, scratch, o);
    if (act) st8(out + i, o);
    if (q) quad_q8(o, i, act, q, qd);
}

// Tensor-core helpers of the prefill kernels (gemm_common.cuh, attn_chunk.cu).
// Two f32 -> one f16x2 word (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// D = A*B + D, m16n8k16, A row-major f16 (4 words), B column-major f16 (2
// words), f32 accumulators (4).
// ldmatrix .x4: four 8x8 b16 matrices from shared memory; lane l gives the
// address of row l%8 of matrix l/8 (16 bytes, 16-byte aligned) and gets
// the mma fragment layout (row l/4, columns 2(l%4), +1 of each matrix).
__device__ __forceinline__ void ldmatrix_x4(u32* r, const u16* row) {
    const u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// ldmatrix .x4 .trans: the same four matrices, each transposed on the
// way (lane l gets rows 2(l%4), +1 of column l/4: the B fragment of a
// row-major k x n tile).
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, const u16* row) {
    const u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// 16-byte asynchronous copy global -> shared (sm_80+; both addresses
// 16-byte aligned), its commit groups, and a wait until at most N groups
// of this thread are still in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
