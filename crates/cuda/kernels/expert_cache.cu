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

// expert_plan's arguments, one struct passed by value (mirrored by
// `ExpertPlanArgs` in src/expert_cache.rs, #[repr(C)]: same field order and
// types). NVRTC applies `__restrict__` only to kernel parameters, so the
// two read-only inputs (experts, clock) are read through __ldg explicitly;
// the tables are read and written and keep plain (stamp, used: volatile)
// accesses.
struct ExpertPlanArgs {
    const u32* experts;
    const int* clock;
    u32* slot_of;
    u32* expert_in;
    volatile u32* stamp;
    volatile u32* used;
    u32* pref;
    u32* slots_out;
    u32* miss;
    unsigned long long* counters;
    int k, n_slots, prefetch, pad;
};
static_assert(sizeof(ExpertPlanArgs) == 96, "ExpertPlanArgs: layout differs from src/expert_cache.rs");

extern "C" __global__ void __launch_bounds__(32)
    expert_plan(__grid_constant__ const ExpertPlanArgs a) {
    PDL_PROLOGUE();
    const int lane = threadIdx.x;
    const u32* experts = a.experts;
    u32* slot_of = a.slot_of;
    u32* expert_in = a.expert_in;
    volatile u32* stamp = a.stamp;
    volatile u32* used = a.used;
    u32* pref = a.pref;
    u32* slots_out = a.slots_out;
    u32* miss = a.miss;
    unsigned long long* counters = a.counters;
    const int k = a.k, n_slots = a.n_slots, prefetch = a.prefetch;
    const u32 tick = (u32)__ldg(&a.clock[1]);
    __shared__ u32 chosen[32];
    __shared__ u32 hit_slot[32];
    if (lane < k) {
        const u32 e = __ldg(&experts[lane]);
        chosen[lane] = e;
        hit_slot[lane] = slot_of[e];
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

// expert_fetch's arguments (mirrored by `ExpertFetchArgs` in
// src/expert_cache.rs): the miss list and the three projections. The miss
// list is read through __ldg (it was a restrict-qualified parameter); the
// host copies keep plain loads, as before.
struct ExpertFetchArgs {
    const u32* miss;
    FetchProj proj[3];
};
static_assert(sizeof(FetchProj) == 24 && sizeof(ExpertFetchArgs) == 80,
              "ExpertFetchArgs: layout differs from src/expert_cache.rs");

extern "C" __global__ void __launch_bounds__(256)
    expert_fetch(__grid_constant__ const ExpertFetchArgs a) {
    PDL_PROLOGUE();
    const u32* miss = a.miss;
    const FetchProj p0 = a.proj[0], p1 = a.proj[1], p2 = a.proj[2];
    const u32 n = __ldg(&miss[0]);
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
                const u64 e = __ldg(&miss[1 + 2 * m]), s = __ldg(&miss[2 + 2 * m]);
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
