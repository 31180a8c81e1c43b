//! The kernel sources (`kernels/*.cu`, one family per file) and their
//! compilation.
//!
//! Kernels are compiled at run time by NVRTC for `sm_90`, not by nvcc in
//! `build.rs`: the build then needs no CUDA toolkit (here there is none, and
//! PyPI's `nvidia-cuda-nvcc-cu12` wheel carries `ptxas` but no `nvcc`), and
//! the GPU machine's NVRTC (CUDA 13.0) always matches its driver, so the PTX
//! always loads. The cost is a compile at start-up (the files compile in
//! parallel). CI compiles the same expanded text with PyPI's NVRTC 12.9 and
//! assembles it with `ptxas -arch=sm_90` (`scripts/check-cuda-kernels.sh`).

use crate::error::{CudaError, Result};

/// One `.cu` file and the kernels it defines.
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
    pub kernels: &'static [&'static str],
}

macro_rules! kernel_dir {
    ($f:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/", $f))
    };
}

/// The headers `#include "..."` may name.
const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", kernel_dir!("common.cuh")),
    ("attn_args.cuh", kernel_dir!("attn_args.cuh")),
    ("gemv_common.cuh", kernel_dir!("gemv_common.cuh")),
    ("gemm_common.cuh", kernel_dir!("gemm_common.cuh")),
    ("iq_tables.cuh", kernel_dir!("iq_tables.cuh")),
    ("iq4nl.cuh", kernel_dir!("iq4nl.cuh")),
    ("gemv_q8act.cuh", kernel_dir!("gemv_q8act.cuh")),
];

/// The f32-activation GEMV kernels of one family (`GEMV_KERNELS` in
/// `gemv_common.cuh`): rows per warp 1, 2, 4, one or two chunks per step.
/// With the family's prefill GEMMs (`GEMM_KERNEL` in `gemm_common.cuh`).
macro_rules! gemv_f32_names {
    ($p:literal $(, $gemm:literal)*) => {
        &[
            concat!($p, "_r1"),
            concat!($p, "_r2"),
            concat!($p, "_r4"),
            concat!($p, "_r1x2"),
            concat!($p, "_r2x2"),
            concat!($p, "_r4x2"),
            $($gemm,)*
        ]
    };
}

pub const FILES: &[KernelFile] = &[
    KernelFile {
        name: "gemv_q4k.cu",
        source: kernel_dir!("gemv_q4k.cu"),
        kernels: gemv_f32_names!("gemv_q4_k", "gemm_q4_k"),
    },
    KernelFile {
        name: "gemv_q6k.cu",
        source: kernel_dir!("gemv_q6k.cu"),
        kernels: gemv_f32_names!("gemv_q6_k", "gemm_q6_k"),
    },
    KernelFile {
        name: "gemv_iq2_xxs.cu",
        source: kernel_dir!("gemv_iq2_xxs.cu"),
        kernels: gemv_f32_names!("gemv_iq2_xxs", "gemm_iq2_xxs"),
    },
    KernelFile {
        name: "gemv_q8_0.cu",
        source: kernel_dir!("gemv_q8_0.cu"),
        kernels: gemv_f32_names!("gemv_q8_0", "gemm_q8_0"),
    },
    KernelFile {
        name: "gemv_q5_0.cu",
        source: kernel_dir!("gemv_q5_0.cu"),
        kernels: gemv_f32_names!("gemv_q5_0", "gemm_q5_0"),
    },
    KernelFile {
        name: "gemv_q5k.cu",
        source: kernel_dir!("gemv_q5k.cu"),
        kernels: gemv_f32_names!("gemv_q5_k", "gemm_q5_k"),
    },
    KernelFile {
        name: "gemv_iq4_nl.cu",
        source: kernel_dir!("gemv_iq4_nl.cu"),
        kernels: gemv_f32_names!("gemv_iq4_nl", "gemm_iq4_nl"),
    },
    KernelFile {
        name: "gemv_iq2_xs.cu",
        source: kernel_dir!("gemv_iq2_xs.cu"),
        kernels: gemv_f32_names!("gemv_iq2_xs", "gemm_iq2_xs"),
    },
    KernelFile {
        name: "gemv_iq1_m.cu",
        source: kernel_dir!("gemv_iq1_m.cu"),
        kernels: gemv_f32_names!("gemv_iq1_m", "gemm_iq1_m"),
    },
    KernelFile {
        name: "gemv_f32.cu",
        source: kernel_dir!("gemv_f32.cu"),
        kernels: gemv_f32_names!("gemv_f32", "gemm_f32h", "gemm_f32"),
    },
    KernelFile {
        name: "norm.cu",
        source: kernel_dir!("norm.cu"),
        kernels: &["rms_norm", "rms_norm_v8"],
    },
    KernelFile {
        name: "attn_prep.cu",
        source: kernel_dir!("attn_prep.cu"),
        kernels: &[
            "attn_prep",
            "attn_prep_kvf16",
            "attn_prep_chunk",
            "attn_prep_chunk_kvf16",
        ],
    },
    KernelFile {
        name: "attention.cu",
        source: kernel_dir!("attention.cu"),
        kernels: &[
            "attn_split_g1_d2",
            "attn_split_g2_d2",
            "attn_split_g4_d2",
            "attn_split_g8_d2",
            "attn_split_g1_d4",
            "attn_split_g2_d4",
            "attn_split_g4_d4",
            "attn_split_g8_d4",
            "attn_split_g1_d8",
            "attn_split_g2_d8",
            "attn_split_g4_d8",
            "attn_split_g8_d8",
            "attn_merge",
        ],
    },
    KernelFile {
        name: "attention_mma.cu",
        source: kernel_dir!("attention_mma.cu"),
        kernels: &[
            "attn_split_mma_kvf16_d2",
            "attn_split_mma_kvf16_d4",
            "attn_split_mma_kvf16_d8",
        ],
    },
    KernelFile {
        name: "deltanet.cu",
        source: kernel_dir!("deltanet.cu"),
        kernels: &["gdn_step_c4", "gdn_step_c2", "gdn_step_c1"],
    },
    KernelFile {
        name: "deltanet_chunk.cu",
        source: kernel_dir!("deltanet_chunk.cu"),
        kernels: &[
            "gdn_conv_chunk",
            "gdn_ring_chunk",
            "gdn_qk_chunk",
            "gdn_recur_chunk_k32",
            "gdn_recur_chunk_k64",
            "gdn_recur_chunk_k128",
            "gdn_recur_chunk_k256",
            "gdn_norm_chunk",
        ],
    },
    KernelFile {
        name: "deltanet_wy.cu",
        source: kernel_dir!("deltanet_wy.cu"),
        kernels: &[
            "gdn_wy_prep",
            "gdn_wy_state_k32",
            "gdn_wy_state_k64",
            "gdn_wy_state_k128",
        ],
    },
    KernelFile {
        name: "attn_chunk.cu",
        source: kernel_dir!("attn_chunk.cu"),
        kernels: &[
            "attn_chunk_d64",
            "attn_chunk_d128",
            "attn_chunk_d256",
            "attn_chunk_kvf16_d64",
            "attn_chunk_kvf16_d128",
            "attn_chunk_kvf16_d256",
            "attn_flash_d64",
            "attn_flash_d128",
            "attn_flash_d256",
            "attn_flash_kvf16_d64",
            "attn_flash_kvf16_d128",
            "attn_flash_kvf16_d256",
            "attn_flash_merge_d64",
            "attn_flash_merge_d128",
            "attn_flash_merge_d256",
        ],
    },
    KernelFile {
        name: "router.cu",
        source: kernel_dir!("router.cu"),
        kernels: &["router_topk", "router_gemv_topk", "router_topk_chunk"],
    },
    KernelFile {
        name: "route_tiles.cu",
        source: kernel_dir!("route_tiles.cu"),
        kernels: &["route_tiles"],
    },
    KernelFile {
        name: "elementwise.cu",
        source: kernel_dir!("elementwise.cu"),
        kernels: &[
            "swiglu",
            "add_inplace",
            "moe_combine",
            "moe_combine_norm",
            "moe_combine_norm_v8",
            "add_bias_rows",
            "to_f16_rows",
            "moe_combine_chunk",
        ],
    },
    KernelFile {
        name: "expert_cache.cu",
        source: kernel_dir!("expert_cache.cu"),
        kernels: &["expert_plan", "expert_fetch"],
    },
    KernelFile {
        name: "quantize_q8.cu",
        source: kernel_dir!("quantize_q8.cu"),
        kernels: &["quantize_q8_32"],
    },
    KernelFile {
        name: "gemv_q8act.cu",
        source: kernel_dir!("gemv_q8act.cu"),
        kernels: &[
            "gemv_iq2_xxs_q8_r1",
            "gemv_iq2_xxs_q8_r2",
            "gemv_iq2_xxs_q8_r4",
            "gemv_iq2_xxs_q8s_r1",
            "gemv_iq2_xxs_q8s_r2",
            "gemv_iq2_xxs_q8s_r4",
            "gemv_q8_0_q8_r1",
            "gemv_q8_0_q8_r2",
            "gemv_q8_0_q8_r4",
            "gemv_q4_k_q8_r1",
            "gemv_q4_k_q8_r2",
            "gemv_q4_k_q8_r4",
            "gemv_iq4_nl_q8_r1",
            "gemv_iq4_nl_q8_r2",
            "gemv_iq4_nl_q8_r4",
            "gemv_q6_k_q8_r1",
            "gemv_q6_k_q8_r2",
            "gemv_q6_k_q8_r4",
            "gemv_iq2_xs_q8_r1",
            "gemv_iq2_xs_q8_r2",
            "gemv_iq2_xs_q8_r4",
            "gemv_iq1_m_q8_r1",
            "gemv_iq1_m_q8_r2",
            "gemv_iq1_m_q8_r4",
        ],
    },
];

/// `src` with every `#include "x.cuh"` replaced by the header's text (each
/// header once; `#pragma once` lines dropped), so NVRTC needs no include
/// path.
pub fn expand(src: &str) -> Result<String> {
    let mut out = String::new();
    let mut seen = Vec::new();
    expand_into(src, &mut out, &mut seen)?;
    Ok(out)
}

fn expand_into(src: &str, out: &mut String, seen: &mut Vec<&'static str>) -> Result<()> {
    for line in src.lines() {
        let t = line.trim();
        if t == "#pragma once" {
            continue;
        }
        if let Some(rest) = t.strip_prefix("#include") {
            let name = rest.trim().trim_matches('"');
            let (hname, htext) = HEADERS
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| CudaError::Compile(format!("unknown kernel header {name:?}")))?;
            if !seen.contains(hname) {
                seen.push(hname);
                expand_into(htext, out, seen)?;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

/// `REDLITE_CUDA_DEFINES`: space-separated `NAME=VALUE` macro overrides
/// for the kernels (tuning constants guarded by `#ifndef`, for A/B runs
/// without a rebuild, e.g. `CMB_MAXV=8`); names are identifiers, values
/// integers.
pub fn parse_defines(v: Option<&str>) -> Result<Vec<String>> {
    let Some(v) = v else { return Ok(Vec::new()) };
    v.split_whitespace()
        .map(|d| {
            let ok = d.split_once('=').is_some_and(|(n, val)| {
                !n.is_empty()
                    && !n.starts_with(|c: char| c.is_ascii_digit())
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && val.parse::<i64>().is_ok()
            });
            if ok {
                Ok(format!("-D{d}"))
            } else {
                Err(CudaError::Invalid(format!(
                    "REDLITE_CUDA_DEFINES: {d:?} is not NAME=INTEGER"
                )))
            }
        })
        .collect()
}

/// The NVRTC options every file is compiled with (`defines`: from
/// [`parse_defines`]).
pub fn nvrtc_options(name: &str, defines: &[String]) -> cudarc::nvrtc::CompileOptions {
    let mut options = vec!["--std=c++17".to_string()];
    options.extend(defines.iter().cloned());
    cudarc::nvrtc::CompileOptions {
        arch: Some("sm_90"),
        name: Some(name.to_string()),
        options,
        ..Default::default()
    }
}

/// Compile one file to PTX with NVRTC (loads libnvrtc at run time).
pub fn compile(file: &KernelFile, defines: &[String]) -> Result<cudarc::nvrtc::Ptx> {
    let src = expand(file.source)?;
    match cudarc::nvrtc::compile_ptx_with_opts(&src, nvrtc_options(file.name, defines)) {
        Ok(ptx) => Ok(ptx),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(CudaError::Compile(
            format!("NVRTC failed on {}:\n{}", file.name, log.to_string_lossy()),
        )),
        Err(e) => Err(CudaError::Compile(format!(
            "NVRTC failed on {}: {e:?}",
            file.name
        ))),
    }
}

/// Every file compiled (in parallel threads), in [`FILES`] order, with
/// `defines` (from [`parse_defines`]: [`crate::tuning::CudaTuning::defines`]).
pub fn compile_all(defines: &[String]) -> Result<Vec<cudarc::nvrtc::Ptx>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = FILES
            .iter()
            .map(|f| s.spawn(move || compile(f, defines)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| CudaError::Compile("NVRTC thread panicked".into()))?
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_expands_and_names_its_kernels() {
        for f in FILES {
            let src = expand(f.source).unwrap();
            assert!(!src.contains("#include"), "{}", f.name);
            assert!(src.contains("__device__ __forceinline__ float h2f"));
            for k in f.kernels {
                let prefix = k.rsplit_once("_r").map_or(*k, |p| p.0);
                let attn = k
                    .strip_prefix("attn_split_")
                    .map(|r| r.strip_prefix("kvf16_").unwrap_or(r))
                    .and_then(|r| r.strip_prefix('g'))
                    .and_then(|r| r.split_once("_d"))
                    .is_some_and(|(g, d)| src.contains(&format!("ATTN_SPLIT({g}, {d})")));
                let attn_mma = k
                    .strip_prefix("attn_split_mma_kvf16_d")
                    .is_some_and(|d| src.contains(&format!("ATTN_SPLIT_MMA({d})")));
                assert!(
                    src.contains(&format!("GEMV_KERNELS({prefix},"))
                        || src.contains(k)
                        || attn
                        || attn_mma,
                    "{k}"
                );
            }
        }
        assert!(expand("#include \"nope.cuh\"").is_err());
    }

    /// Whether a kernel body opens with `PDL_PROLOGUE();`, or with one
    /// call of a `*_prefetch` helper (L2 hints of read-only weights, see
    /// `l2_prefetch` in common.cuh, or their loads into registers) and
    /// then `PDL_PROLOGUE();`; declarations without an initializer (no
    /// `(`, `=`, `++`, `--` or braces: they touch no memory) may come
    /// first.
    fn prologue_first(body: &str) -> bool {
        let skip = |t: &str| {
            t.trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
                .to_string()
        };
        let mut body = body.to_string();
        while let Some((stmt, rest)) = body.split_once(';') {
            let touches =
                stmt.contains(['(', '=', '{', '}']) || stmt.contains("++") || stmt.contains("--");
            if stmt.trim().is_empty() || touches {
                break;
            }
            body = skip(rest);
        }
        if body.starts_with("PDL_PROLOGUE();") {
            return true;
        }
        let name_end = body
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(0);
        if !body[..name_end].ends_with("_prefetch") {
            return false;
        }
        body.split_once(';')
            .is_some_and(|(_, rest)| skip(rest).starts_with("PDL_PROLOGUE();"))
    }

    #[test]
    fn prologue_rule_accepts_only_a_prefetch_before_the_wait() {
        assert!(prologue_first("PDL_PROLOGUE(); x();"));
        assert!(prologue_first(
            "gemv_prefetch<T, 2>(w, n); \\\n PDL_PROLOGUE();"
        ));
        assert!(!prologue_first("y[0] = 1; PDL_PROLOGUE();"));
        assert!(!prologue_first(
            "gemv_prefetch<T>(w); y[0] = 1; PDL_PROLOGUE();"
        ));
        assert!(!prologue_first("pdl_wait();"));
        assert!(prologue_first(
            "float4 wv[4];\n    float wn[8];\n    router_gemv_prefetch(w, wv, wn);\n    PDL_PROLOGUE();"
        ));
        assert!(!prologue_first("float a[2]; a[0] = 1.f; PDL_PROLOGUE();"));
        assert!(!prologue_first("float a[2]; y[0] = a[1]; PDL_PROLOGUE();"));
        assert!(!prologue_first("float a = x[0]; PDL_PROLOGUE();"));
        assert!(!prologue_first("int n; y[0]++; PDL_PROLOGUE();"));
    }

    /// PDL (`Gpu::pdl`) is only correct if every kernel waits for its
    /// predecessor before touching memory: each `__global__` definition
    /// (in a file or in a macro of a header) must open with `PDL_PROLOGUE`,
    /// at most after one L2 prefetch helper.
    #[test]
    fn every_kernel_opens_with_the_pdl_prologue() {
        let texts = FILES
            .iter()
            .map(|f| (f.name, f.source))
            .chain(HEADERS.iter().copied());
        let mut n = 0;
        for (name, text) in texts {
            let mut at = 0;
            while let Some(i) = text[at..].find("__global__") {
                let i = at + i;
                at = i + 1;
                let line_start = text[..i].rfind('\n').map_or(0, |p| p + 1);
                if text[line_start..i].trim_start().starts_with("//") {
                    continue;
                }
                let open = i + text[i..].find('{').expect("a kernel body");
                let body =
                    text[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                assert!(
                    prologue_first(body),
                    "{name}: a kernel does not start with PDL_PROLOGUE() (after at most a prefetch):\n{}",
                    &text[line_start..(open + 80).min(text.len())]
                );
                n += 1;
            }
        }
        // 13 definitions today (several are macros); a count this low means
        // the scan itself broke.
        assert!(n >= 13, "only {n} kernel definitions found");
    }

    #[test]
    fn defines_parse_and_reach_the_options() {
        assert!(parse_defines(None).unwrap().is_empty());
        let d = parse_defines(Some(" CMB_MAXV=8  X_2=-1 ")).unwrap();
        assert_eq!(d, ["-DCMB_MAXV=8", "-DX_2=-1"]);
        let o = nvrtc_options("x.cu", &d).options;
        assert!(o.contains(&"-DCMB_MAXV=8".to_string()));
        for bad in ["CMB_MAXV", "=3", "A=b", "2A=1", "A-B=1", "A=1;B=2"] {
            let e = parse_defines(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("REDLITE_CUDA_DEFINES"), "{bad}: {e}");
        }
    }

    #[test]
    fn every_kernel_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".cu") {
                assert!(FILES.iter().any(|f| f.name == name), "{name} not in FILES");
            } else {
                assert!(
                    HEADERS.iter().any(|(h, _)| *h == name),
                    "{name} not in HEADERS"
                );
            }
        }
    }
}
