//! Dot products: (1) the scalar reference against an f64 dot of the
//! gguf-checked dequantized row and dequantized activations; (2) the fast
//! (AVX2 where available) path against the reference. Many random rows at
//! several lengths per type.
//!
//! Errors are measured relative to `Σ|w_i·a_i|` (the magnitude a float dot
//! can be expected to resolve), using the dequantized values.

mod common;

use common::{random_acts, random_row, Rng, MY_TYPES};
use redlite_quant::{kernels, matvec, quantize_activations, GgmlType};

/// Budget for |reference − f64 dot| / Σ|w·a|.
///
/// The reference sums integer products exactly, so its error comes from a
/// few f32 roundings per block (the product of the two scales; for K-quants
/// also the sub-block scale and minimum terms) and from accumulating one
/// f32 per block. The dequantized values it is compared with carry their own
/// roundings (`d·sc` then `·q` then `− dmin·m`, each rounded once). With at
/// most 128 blocks a row that is ≲ (3 + 128)·2⁻²⁴ ≈ 8e-6 in the worst case;
/// random data sits far below. Float weights: the reference accumulates in
/// f64, so only the final f32 rounding remains.
fn ref_budget(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-7,
        _ => 1e-5,
    }
}

/// Budget for |fast − reference| / Σ|w·a|.
///
/// The AVX2 paths compute the same exact integer sums but convert partial
/// sums per lane and accumulate in 8-lane f32 vectors (different order and
/// per-lane scale products), so they differ from the reference only by f32
/// rounding in the accumulation: ≲ (blocks + lanes)·2⁻²⁴ ≈ 1e-5 for the
/// longest rows here. Float weights: the AVX2 path accumulates in f32 with
/// 32 lanes while the reference uses f64: up to (n/32 + 5)·2⁻²⁴ ≈ 1e-5 for
/// n = 4096.
fn fast_budget(_ty: GgmlType) -> f64 {
    2e-5
}

fn lengths(ty: GgmlType) -> &'static [usize] {
    match ty.block_size() {
        1 => &[1, 7, 8, 33, 64, 1000, 4096],
        32 => &[32, 64, 160, 1024, 4096],
        _ => &[256, 512, 1280, 4096],
    }
}

struct Case {
    row: Vec<u8>,
    act: Vec<u8>,
    exact: f64,
    mag: f64,
}

fn make_case(rng: &mut Rng, ty: GgmlType, n: usize) -> Case {
    let k = kernels(ty).unwrap();
    let row = random_row(rng, ty, n);
    let x = random_acts(rng, n);
    let act = quantize_activations(ty, &x).unwrap();
    let mut w = vec![0f32; n];
    (k.dequantize)(&row, &mut w);
    let mut a = vec![0f32; n];
    (kernels(k.vec_dot_type).unwrap().dequantize)(&act, &mut a);
    let exact = w.iter().zip(&a).map(|(&p, &q)| p as f64 * q as f64).sum();
    let mag = w
        .iter()
        .zip(&a)
        .map(|(&p, &q)| (p as f64 * q as f64).abs())
        .sum::<f64>()
        .max(f64::MIN_POSITIVE);
    Case {
        row,
        act,
        exact,
        mag,
    }
}

#[test]
fn reference_dot_matches_f64_of_dequantized() {
    let mut rng = Rng::new(1);
    for &ty in MY_TYPES {
        let k = kernels(ty).unwrap();
        let mut worst = 0f64;
        for &n in lengths(ty) {
            for _ in 0..40 {
                let c = make_case(&mut rng, ty, n);
                let r = (k.dot_reference)(&c.row, &c.act) as f64;
                let e = (r - c.exact).abs() / c.mag;
                worst = worst.max(e);
                assert!(
                    e <= ref_budget(ty),
                    "{ty} n={n}: reference {r} vs f64 {} (rel {e:e})",
                    c.exact
                );
            }
        }
        eprintln!("{ty:>5}: worst |ref - f64| / Σ|wa| = {worst:.2e}");
    }
}

#[test]
fn fast_dot_matches_reference() {
    let mut rng = Rng::new(2);
    for &ty in MY_TYPES {
        let k = kernels(ty).unwrap();
        let mut worst = 0f64;
        for &n in lengths(ty) {
            for _ in 0..40 {
                let c = make_case(&mut rng, ty, n);
                let r = (k.dot_reference)(&c.row, &c.act) as f64;
                let f = (k.dot_fast)(&c.row, &c.act) as f64;
                let e = (f - r).abs() / c.mag;
                worst = worst.max(e);
                assert!(
                    e <= fast_budget(ty),
                    "{ty} n={n}: fast {f} vs reference {r} (rel {e:e})"
                );
                // Unaligned rows and activations: same answer exactly.
                let mut rs = vec![0u8; c.row.len() + 1];
                rs[1..].copy_from_slice(&c.row);
                let mut as_ = vec![0u8; c.act.len() + 3];
                as_[3..].copy_from_slice(&c.act);
                assert_eq!(
                    (k.dot_fast)(&rs[1..], &as_[3..]).to_bits(),
                    (f as f32).to_bits(),
                    "{ty}: unaligned"
                );
            }
        }
        eprintln!("{ty:>5}: worst |fast - ref| / Σ|wa| = {worst:.2e}");
    }
}

#[test]
fn registry_dot_and_matvec_agree_with_kernels() {
    let mut rng = Rng::new(3);
    for &ty in MY_TYPES {
        let k = kernels(ty).unwrap();
        let n = 512;
        let rows = 7;
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(&mut rng, ty, n))
            .collect();
        let x = random_acts(&mut rng, n);
        let act = quantize_activations(ty, &x).unwrap();
        let mut out = vec![0f32; rows];
        matvec(ty, &w, rows, n, &act, &mut out).unwrap();
        let rb = w.len() / rows;
        for (r, &o) in out.iter().enumerate() {
            let row = &w[r * rb..(r + 1) * rb];
            let d = redlite_quant::dot(ty, row, &act).unwrap();
            assert_eq!(d.to_bits(), o.to_bits(), "{ty} row {r}");
            let reference = (k.dot_reference)(row, &act);
            let fast = (k.dot_fast)(row, &act);
            assert!(d.to_bits() == reference.to_bits() || d.to_bits() == fast.to_bits());
        }
        // Shape errors are reported, not panics.
        assert!(matvec(ty, &w[..w.len() - 1], rows, n, &act, &mut out).is_err());
        assert!(matvec(ty, &w, rows, n, &act[..act.len() - 1], &mut out).is_err());
    }
}

/// `dot_multi` (one row × up to `MULTI_MAX` records, strided and unaligned)
/// against `dot_fast` per record: bit-for-bit for every tile (each
/// record's arithmetic in the single-row kernel's order), and within
/// `fast_budget` of the reference. The registry entry point with a type
/// that has no `dot_multi` loops over `dot_fast`.
#[test]
fn dot_multi_matches_dot_fast_and_reference() {
    let mut rng = Rng::new(4);
    let with_multi = [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    for &ty in MY_TYPES {
        let k = kernels(ty).unwrap();
        assert_eq!(
            k.dot_multi.is_some(),
            with_multi.contains(&ty),
            "{ty}: dot_multi entry"
        );
        for &len in lengths(ty) {
            let row = random_row(&mut rng, ty, len);
            for n in 0..=redlite_quant::MULTI_MAX {
                let acts: Vec<Vec<u8>> = (0..n)
                    .map(|_| quantize_activations(ty, &random_acts(&mut rng, len)).unwrap())
                    .collect();
                let act_len = acts.first().map_or(0, |a| a.len());
                // Records at an odd stride and an odd offset.
                let stride = act_len + 5;
                let mut buf = vec![0u8; 3 + n * stride];
                for (t, a) in acts.iter().enumerate() {
                    buf[3 + t * stride..3 + t * stride + act_len].copy_from_slice(a);
                }
                let mut rs = vec![0u8; row.len() + 1];
                rs[1..].copy_from_slice(&row);
                let mut out = vec![f32::NAN; n];
                redlite_quant::dot_multi(ty, &rs[1..], &buf[3..], stride, &mut out).unwrap();
                if let Some(f) = k.dot_multi {
                    let mut direct = vec![f32::NAN; n];
                    f(&rs[1..], &buf[3..], stride, &mut direct);
                    for t in 0..n {
                        assert_eq!(direct[t].to_bits(), out[t].to_bits(), "{ty}: registry");
                    }
                }
                for (t, a) in acts.iter().enumerate() {
                    let fast = (k.dot_fast)(&row, a);
                    assert_eq!(
                        out[t].to_bits(),
                        fast.to_bits(),
                        "{ty} len {len} n {n} record {t}: multi {} vs fast {fast}",
                        out[t]
                    );
                    let mut w = vec![0f32; len];
                    (k.dequantize)(&row, &mut w);
                    let mut av = vec![0f32; len];
                    (kernels(k.vec_dot_type).unwrap().dequantize)(a, &mut av);
                    let mag = w
                        .iter()
                        .zip(&av)
                        .map(|(&p, &q)| (p as f64 * q as f64).abs())
                        .sum::<f64>()
                        .max(f64::MIN_POSITIVE);
                    let r = (k.dot_reference)(&row, a) as f64;
                    let e = (out[t] as f64 - r).abs() / mag;
                    assert!(
                        e <= fast_budget(ty),
                        "{ty} len {len} n {n} record {t}: multi {} vs reference {r} (rel {e:e})",
                        out[t]
                    );
                }
            }
        }
    }
    // Shape errors are reported, not panics.
    let ty = GgmlType::Q8_0;
    let row = random_row(&mut rng, ty, 64);
    let act = quantize_activations(ty, &random_acts(&mut rng, 64)).unwrap();
    let mut out = [0f32; 2];
    assert!(redlite_quant::dot_multi(ty, &row, &act, act.len(), &mut out).is_err());
    assert!(redlite_quant::dot_multi(ty, &row, &act, 1, &mut out[..1]).is_err());
    let mut too_many = [0f32; redlite_quant::MULTI_MAX + 1];
    assert!(redlite_quant::dot_multi(ty, &row, &act, 0, &mut too_many).is_err());
}
