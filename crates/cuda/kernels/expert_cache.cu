// The bounded device expert cache (issue 8), one MoE layer's slot pool at a
// time, decided and filled on the device so that a token stays one CUDA
// graph (no host round trip to learn the routing).
//
// Per layer: slot_of[n_expert] (NONE when not resident), expert_in[S],
// stamp[S] (the tick of the last use, LRU), used[S] (the tick of the last
// *routed* use) and pref[S] (1: brought in by a prefetch and not used yet).
// The tick is clock[1] (a token counter the host writes with the position,
// clock[0]); it starts at 1, so stamp 0 means "never used" and empty slots
// are evicted first.
//
// expert_plan (one warp): for the k chosen experts, in order, hits first
// (stamp = tick; routed: used = tick, slots_out[i] = slot), then each miss
// takes the slot with the smallest stamp among the eligible ones (ties to
// the lower slot): routed plans may not take a slot another routed expert
// of this token holds (used == tick); prefetch plans may not take one
// stamped this tick (what this prefetch just kept or brought). A prefetch
// with no eligible slot left stops. Every miss is appended to `miss`
// (miss[0] = count, then (expert, slot) pairs) for expert_fetch, and
// counted: counters[0] routed hits, [1] routed misses, [2] prefetches
// issued, [3] prefetches later used by a routed plan.
//
// expert_fetch (any grid): copies the listed experts' bytes of the three
// projections from their host copies (pinned, device-mapped: the kernel
// reads them over PCIe) into the slots, 16 bytes per thread per step with
// four loads in flight.
#include "common.cuh"

#define SLOT_NONE 0xffffffffu

extern "C" __global__ void __launch_bounds__(32)
    expert_plan(const u32* __restrict__ experts, int k, const int* __restrict__ clock,
                u32* slot_of, u32* expert_in, volatile u32* stamp, volatile u32* used, u32* pref,
                int n_slots, int prefetch, u32* __restrict__ slots_out,
                u32* __restrict__ miss, unsigned long long* __restrict__ counters) {
    PDL_PROLOGUE();
    const int lane = threadIdx.x;
    const u32 tick = (u32)clock[1];
    __shared__ u32 chosen[32];
    __shared__ u32 hit_slot[32];
    if (lane < k) {
        chosen[lane] = experts[lane];
        hit_slot[lane] = slot_of[experts[lane]];
    }
    __syncwarp();
    if (lane == 0) {
        unsigned long long hits = 0, pused = 0;
        for (int i = 0; i < k; i++) {
            const u32 s = hit_slot[i];
            if (s == SLOT_NONE) continue;
            stamp[s] = tick;
            if (!prefetch) {
                used[s] = tick;
                slots_out[i] = s;
                hits++;
                if (pref[s]) {
                    pref[s] = 0;
                    pused++;
                }
            }
        }
        if (hits) atomicAdd(&counters[0], hits);
        if (pused) atomicAdd(&counters[3], pused);
    }
    __syncwarp();
    int n_miss = 0;
    for (int i = 0; i < k; i++) {
        if (hit_slot[i] != SLOT_NONE) continue;
        // warp argmin of the eligible stamps, ties to the lower slot
        u32 best = SLOT_NONE, bs = SLOT_NONE;
        for (int s = lane; s < n_slots; s += 32) {
            const bool ok = prefetch ? stamp[s] != tick : used[s] != tick;
            if (ok && (stamp[s] < best || (stamp[s] == best && (u32)s < bs))) {
                best = stamp[s];
                bs = (u32)s;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const u32 ob = __shfl_xor_sync(0xffffffffu, best, o);
            const u32 os = __shfl_xor_sync(0xffffffffu, bs, o);
            if (ob < best || (ob == best && os < bs)) {
                best = ob;
                bs = os;
            }
        }
        if (bs == SLOT_NONE) break;  // prefetch only: every slot is taken this tick
        if (lane == 0) {
            const u32 e = chosen[i];
            const u32 old = expert_in[bs];
            if (old != SLOT_NONE) slot_of[old] = SLOT_NONE;
            expert_in[bs] = e;
            slot_of[e] = bs;
            stamp[bs] = tick;
            if (prefetch) {
                pref[bs] = 1;
            } else {
                used[bs] = tick;
                pref[bs] = 0;
                slots_out[i] = bs;
            }
            miss[1 + 2 * n_miss] = e;
            miss[2 + 2 * n_miss] = bs;
        }
        n_miss++;
        __syncwarp();
    }
    if (lane == 0) {
        miss[0] = (u32)n_miss;
        if (n_miss) atomicAdd(&counters[prefetch ? 2 : 1], (unsigned long long)n_miss);
    }
}

struct FetchProj {
    const u8* src;  // host copy (device-mapped), expert e at e * stride
    u8* dst;        // slot stack, slot s at s * stride
    u64 stride;     // bytes, a multiple of 16
};

extern "C" __global__ void __launch_bounds__(256)
    expert_fetch(const u32* __restrict__ miss, const u8* src0, u8* dst0, u64 stride0,
                 const u8* src1, u8* dst1, u64 stride1, const u8* src2, u8* dst2,
                 u64 stride2) {
    PDL_PROLOGUE();
    const FetchProj p0 = {src0, dst0, stride0}, p1 = {src1, dst1, stride1},
                    p2 = {src2, dst2, stride2};
    const u32 n = miss[0];
    if (n == 0) return;
    const u64 c0 = p0.stride / 16, c1 = p1.stride / 16, c2 = p2.stride / 16;
    const u64 per = c0 + c1 + c2;
    const u64 total = per * n;
    const u64 step = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < total; i += 4 * step) {
        uint4 v[4];
        const uint4* src[4];
        uint4* dst[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u64 idx = i + j * step;
            src[j] = nullptr;
            if (idx < total) {
                const u64 m = idx / per;
                u64 r = idx - m * per;
                const u64 e = miss[1 + 2 * m], s = miss[2 + 2 * m];
                const FetchProj* p = &p0;
                if (r >= c0) {
                    r -= c0;
                    p = &p1;
                    if (r >= c1) {
                        r -= c1;
                        p = &p2;
                    }
                }
                src[j] = (const uint4*)(p->src + e * p->stride) + r;
                dst[j] = (uint4*)(p->dst + s * p->stride) + r;
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (src[j]) v[j] = *src[j];
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (src[j]) *dst[j] = v[j];
    }
}
