//! The CUDA backend's tuning switches, parsed once.
//!
//! Every knob that A/B runs on the GPU machine turn without a rebuild is a
//! field of [`CudaTuning`]. The crate never reads the environment: the CLI
//! calls [`CudaTuning::from_lookup`] once with `std::env::var`, tests and
//! library callers set the fields. Each field names the variable the CLI
//! maps to it ([`CudaTuning::VARS`] lists them); the defaults are the
//! measured winners (bench/RESULTS.md, docs/cuda.md).

use crate::error::{CudaError, Result};
use crate::gemv::{q8_chunks_per_block, Q8Variant, Variant, DEFAULT_NR};
use crate::kernels;
use crate::layout::DeviceLayout;

/// At most 16 lanes a row in the decode graph's int8 GEMVs: a 2048-wide
/// row's 32 chunks go two to a lane, so the big launches (q|k|v, the
/// routed gate|up: 1,000-1,500 blocks of 8 rows) need half the blocks and
/// fit in one wave of resident blocks. +3% decode on the H200 against 32
/// lanes, and 8 lanes -10% (bench/RESULTS.md, fifth pass).
pub const DECODE_Q8_LANES: u32 = 16;

/// At most 32 lanes a row for the 4096-wide rows (the mixers' output
/// projections): two chunks a lane, as the narrow rows at 16, in one loop
/// step. +2.7% decode on the H200 against 16 (bench/RESULTS.md, sixth
/// pass).
pub const DECODE_Q8_LANES_WIDE: u32 = 32;

/// The lane caps the int8 GEMVs are compiled for.
const LANE_CHOICES: [u32; 4] = [4, 8, 16, 32];

/// Rows per lane group the int8 GEMVs are compiled for.
const NR_CHOICES: [u32; 3] = [1, 2, 4];

/// The tuning switches of the CUDA backend (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaTuning {
    /// `REDLITE_CUDA_F32_GEMV` (`r1`, `r2`, `r4`, `r1x2`, `r2x2`, `r4x2`):
    /// the variant of the f32 GEMVs (the routers, 512 x 2048 in
    /// Qwen3-Next, and any matrix of a format without a kernel,
    /// dequantized to F32 at upload). Default r1x2: a warp per row, both
    /// of a lane's chunks loaded at once, twice the blocks of r2 for the
    /// routers' 513 rows (+3.3% decode on the H200, bench/RESULTS.md).
    pub f32_gemv: Variant,
    /// `REDLITE_CUDA_Q8_NR` (1, 2, 4): rows per lane group of the int8
    /// GEMVs (default [`DEFAULT_NR`]; 4 and 1 measured slower).
    pub q8_nr: u32,
    /// `REDLITE_CUDA_Q8_LANES` (4, 8, 16, 32): at most this many lanes
    /// serve one row of at most 32 lane chunks (default
    /// [`DECODE_Q8_LANES`]).
    pub q8_lanes: u32,
    /// `REDLITE_CUDA_Q8_LANES_WIDE` (4, 8, 16, 32): the cap for rows of
    /// more than 32 lane chunks, 4096-wide inputs (default
    /// [`DECODE_Q8_LANES_WIDE`]).
    pub q8_lanes_wide: u32,
    /// `REDLITE_CUDA_ABLATE` (comma-separated): a measuring tool, timing
    /// only, the outputs are wrong. The kernel classes whose labels (the
    /// rows of `bench model --profile`, e.g. "top-k", "DeltaNet: fused")
    /// contain one of these substrings are left out of the token's graph,
    /// so the tok/s difference is what those kernels cost in the launch
    /// chain as it runs (the event profile cannot say that with PDL: its
    /// events break the chain).
    pub ablate: Vec<String>,
    /// `REDLITE_CUDA_DEFINES` (space-separated `NAME=INTEGER`): NVRTC `-D`
    /// options (as `-DNAME=INTEGER`) overriding the kernels' `#ifndef`
    /// tuning constants, applied when [`crate::Gpu::with_defines`]
    /// compiles the kernels.
    pub defines: Vec<String>,
}

impl Default for CudaTuning {
    fn default() -> Self {
        Self {
            f32_gemv: Variant::new(1, true),
            q8_nr: DEFAULT_NR,
            q8_lanes: DECODE_Q8_LANES,
            q8_lanes_wide: DECODE_Q8_LANES_WIDE,
            ablate: Vec::new(),
            defines: Vec::new(),
        }
    }
}

impl CudaTuning {
    /// The environment variables [`CudaTuning::from_lookup`] reads.
    pub const VARS: [&'static str; 6] = [
        "REDLITE_CUDA_F32_GEMV",
        "REDLITE_CUDA_Q8_NR",
        "REDLITE_CUDA_Q8_LANES",
        "REDLITE_CUDA_Q8_LANES_WIDE",
        "REDLITE_CUDA_ABLATE",
        "REDLITE_CUDA_DEFINES",
    ];

    /// Parse the switches from `get(name)` (the CLI passes
    /// `|n| std::env::var(n).ok()`); a variable that is not set keeps its
    /// default. A value that names no choice is an error naming the
    /// variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let d = Self::default();
        let f32_gemv = match get("REDLITE_CUDA_F32_GEMV") {
            None => d.f32_gemv,
            Some(v) => parse_f32_variant(&v).ok_or_else(|| {
                CudaError::Invalid(format!(
                    "REDLITE_CUDA_F32_GEMV: {v:?}: expected r1, r2, r4, r1x2, r2x2 or r4x2"
                ))
            })?,
        };
        let choice = |name: &str, default: u32, allowed: &[u32]| -> Result<u32> {
            match get(name) {
                None => Ok(default),
                Some(v) => v
                    .parse()
                    .ok()
                    .filter(|n| allowed.contains(n))
                    .ok_or_else(|| {
                        CudaError::Invalid(format!("{name}: {v:?}: expected one of {allowed:?}"))
                    }),
            }
        };
        let t = Self {
            f32_gemv,
            q8_nr: choice("REDLITE_CUDA_Q8_NR", d.q8_nr, &NR_CHOICES)?,
            q8_lanes: choice("REDLITE_CUDA_Q8_LANES", d.q8_lanes, &LANE_CHOICES)?,
            q8_lanes_wide: choice("REDLITE_CUDA_Q8_LANES_WIDE", d.q8_lanes_wide, &LANE_CHOICES)?,
            ablate: parse_ablation(get("REDLITE_CUDA_ABLATE").as_deref().unwrap_or("")),
            defines: kernels::parse_defines(get("REDLITE_CUDA_DEFINES").as_deref())?,
        };
        t.check()?;
        Ok(t)
    }

    /// Whether every field holds a value the kernels are compiled for (a
    /// struct set by hand); the error names the field.
    pub fn check(&self) -> Result<()> {
        let bad = |what: &str| Err(CudaError::Invalid(format!("CudaTuning::{what}")));
        if !Variant::ALL.contains(&self.f32_gemv) {
            return bad("f32_gemv: rows per warp must be 1, 2 or 4");
        }
        if !NR_CHOICES.contains(&self.q8_nr) {
            return bad("q8_nr: expected 1, 2 or 4");
        }
        if !LANE_CHOICES.contains(&self.q8_lanes) {
            return bad("q8_lanes: expected 4, 8, 16 or 32");
        }
        if !LANE_CHOICES.contains(&self.q8_lanes_wide) {
            return bad("q8_lanes_wide: expected 4, 8, 16 or 32");
        }
        if self.defines.iter().any(|d| !d.starts_with("-D")) {
            return bad("defines: each entry is an NVRTC -DNAME=INTEGER option");
        }
        Ok(())
    }

    /// The int8-activation GEMVs' configuration in the decode graph for a
    /// matrix of `layout` with `cols` columns: [`CudaTuning::q8_nr`] rows
    /// per lane group, at most [`CudaTuning::q8_lanes`] lanes a row, or
    /// [`CudaTuning::q8_lanes_wide`] for rows of more than 32 lane chunks.
    pub fn q8_config(&self, layout: &DeviceLayout, cols: usize) -> Result<Q8Variant> {
        let nch = layout.blocks_per_row(cols)? * q8_chunks_per_block(layout.ty);
        Ok(Q8Variant {
            max_lanes: if nch > 32 {
                self.q8_lanes_wide
            } else {
                self.q8_lanes
            },
            ..Q8Variant::from(self.q8_nr)
        })
    }
}

/// A value of `REDLITE_CUDA_F32_GEMV`; None for one that names no variant.
fn parse_f32_variant(s: &str) -> Option<Variant> {
    let (nr, x2) = match s.strip_suffix("x2") {
        Some(r) => (r, true),
        None => (s, false),
    };
    let nr: u32 = nr.strip_prefix('r')?.parse().ok()?;
    matches!(nr, 1 | 2 | 4).then(|| Variant::new(nr, x2))
}

fn parse_ablation(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlite_gguf::GgmlType;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<CudaTuning> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaTuning::from_lookup(|n| m.get(n).cloned())
    }

    #[test]
    fn nothing_set_is_the_measured_defaults() {
        let t = parse(&[]).unwrap();
        assert_eq!(t, CudaTuning::default());
        // docs/cuda.md: r1x2, 2 rows per lane group, 16 / 32 lanes.
        assert_eq!(t.f32_gemv, Variant::new(1, true));
        assert_eq!((t.q8_nr, t.q8_lanes, t.q8_lanes_wide), (2, 16, 32));
        assert!(t.ablate.is_empty() && t.defines.is_empty());
    }

    #[test]
    fn every_variable_reaches_its_field() {
        let t = parse(&[
            ("REDLITE_CUDA_F32_GEMV", "r4"),
            ("REDLITE_CUDA_Q8_NR", "4"),
            ("REDLITE_CUDA_Q8_LANES", "8"),
            ("REDLITE_CUDA_Q8_LANES_WIDE", "16"),
            ("REDLITE_CUDA_ABLATE", " top-k, ,DeltaNet: fused "),
            ("REDLITE_CUDA_DEFINES", "CMB_MAXV=8"),
        ])
        .unwrap();
        assert_eq!(t.f32_gemv, Variant::new(4, false));
        assert_eq!((t.q8_nr, t.q8_lanes, t.q8_lanes_wide), (4, 8, 16));
        assert_eq!(t.ablate, ["top-k", "DeltaNet: fused"]);
        assert_eq!(t.defines, ["-DCMB_MAXV=8"]);
        assert_eq!(
            parse(&[("REDLITE_CUDA_F32_GEMV", "r2x2")])
                .unwrap()
                .f32_gemv,
            Variant::new(2, true)
        );
    }

    #[test]
    fn bad_values_name_their_variable() {
        let cases = [
            (
                "REDLITE_CUDA_F32_GEMV",
                ["", "r3", "2", "r1x3", "rx2", "r8x2"].as_slice(),
            ),
            ("REDLITE_CUDA_Q8_NR", &["", "3", "8", "r2", "-1"]),
            ("REDLITE_CUDA_Q8_LANES", &["", "2", "64", "sixteen"]),
            ("REDLITE_CUDA_Q8_LANES_WIDE", &["", "12", "0"]),
            ("REDLITE_CUDA_DEFINES", &["CMB_MAXV", "A=b"]),
        ];
        for (name, bad) in cases {
            for v in bad {
                let e = parse(&[(name, v)]).unwrap_err().to_string();
                assert!(e.contains(name), "{name}={v:?}: {e}");
            }
        }
    }

    #[test]
    fn check_names_the_field_set_by_hand() {
        let mut t = CudaTuning {
            q8_nr: 3,
            ..Default::default()
        };
        assert!(t.check().unwrap_err().to_string().contains("q8_nr"));
        t.q8_nr = 2;
        t.q8_lanes_wide = 64;
        assert!(t.check().unwrap_err().to_string().contains("q8_lanes_wide"));
        t.q8_lanes_wide = 32;
        t.f32_gemv = Variant::new(8, false);
        assert!(t.check().unwrap_err().to_string().contains("f32_gemv"));
        t.f32_gemv = Variant::new(2, false);
        t.defines = vec!["CMB_MAXV=8".into()];
        assert!(t.check().unwrap_err().to_string().contains("defines"));
        t.defines.clear();
        t.check().unwrap();
    }

    #[test]
    fn q8_config_caps_wide_rows_apart() {
        let t = CudaTuning {
            q8_lanes: 8,
            q8_lanes_wide: 4,
            q8_nr: 1,
            ..Default::default()
        };
        // Q8_0: one 32-value chunk per block, so 2048 columns are 64
        // chunks (wide) and 1024 columns 32 (narrow).
        let l = crate::layout::layout(GgmlType::Q8_0).unwrap();
        let wide = t.q8_config(&l, 2048).unwrap();
        let narrow = t.q8_config(&l, 1024).unwrap();
        assert_eq!((wide.max_lanes, wide.nr), (4, 1));
        assert_eq!((narrow.max_lanes, narrow.nr), (8, 1));
    }
}
