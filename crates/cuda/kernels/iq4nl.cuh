// IQ4_NL's value lookup, shared by gemv_iq4_nl.cu (f32 activations) and
// gemv_q8act.cu (int8). The table lives in four registers
// (KVALUES_IQ4NL_W*, generated from the Rust table): one __byte_perm looks
// up four indices' low-3-bit entry in each half of the table, bit 3 picks
// the half.
#pragma once
#define WANT_KVALUES_IQ4NL
#include "iq_tables.cuh"

// Four nibble indices (bytes 0..15 of `q`) -> their four int8 values.
__device__ __forceinline__ u32 iq4nl_lookup(u32 q) {
    const u32 t = (q & 0x07070707u) | ((q & 0x07070707u) >> 4);
    const u32 sel = (t & 0xffu) | ((t >> 8) & 0xff00u);
    const u32 lo = __byte_perm(KVALUES_IQ4NL_W0, KVALUES_IQ4NL_W1, sel);
    const u32 hi = __byte_perm(KVALUES_IQ4NL_W2, KVALUES_IQ4NL_W3, sel);
    const u32 m = ((q >> 3) & 0x01010101u) * 0xffu;
    return (lo & ~m) | (hi & m);
}
