// The decode attention kernels' arguments (attention.cu, attention_mma.cu),
// one struct passed by value, mirrored by `AttnSplitArgs` in
// src/ops/attention.rs (#[repr(C)]: same field order and types; the caches
// are float or u16 (f16 bits) by kernel). NVRTC applies `__restrict__`
// only to kernel parameters, so the bodies read q, pos and the caches
// through __ldg or cp.async.
#pragma once
struct AttnSplitArgs {
    const float* q;
    const void* kc;
    const void* vc;
    const int* pos_p;
    float* part_o;
    float* part_ml;
    int n_head, n_kv, nsplit;
    float scale;
};
static_assert(sizeof(AttnSplitArgs) == 64, "AttnSplitArgs: layout differs from src/ops/attention.rs");
