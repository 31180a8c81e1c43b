//! Host models of the bit manipulation in the Q5_0, Q5_K, IQ4_NL, IQ2_XS
//! and IQ1_M GEMV kernels (`kernels/gemv_{q5_0,q5k,iq4_nl,iq2_xs,iq1_m}.cu`),
//! word for word, checked against `redlite_quant`'s dequantization, and of
//! the Q6_K, IQ2_XS and IQ1_M int8-activation kernels (`gemv_q8act.cuh`),
//! checked against `redlite_quant`'s Q8_K dot and a dequantized f64 dot:
//! the integer logic is tested here without a GPU; `redlite selftest` tests
//! the kernels themselves. Also models of the block-parallel router top-k
//! (`kernels/router.cu`, against a sort-based top-k) and of the device-built
//! routed tile lists (`kernels/route_tiles.cu`, against the host's
//! `route_tiles`), and of the prefill GEMM's f16 decode of the integer-coded
//! formats (`codes_h2`). One file each: `gemv`, `router`, `route`,
//! `gemm_codes`.

mod attention_mma;
mod gemm_codes;
mod gemv;
mod route;
mod router;
