//! Two sequences against each other (any two backends, or two paths of
//! one): the logits of every teacher-forced step (max |Δlogit|, KL,
//! argmax), the chosen experts, then the greedy tokens of each; a state
//! carried from one to the other ([`state_handoff`]).

use redlite_model::sequence::Sequence;
use redlite_model::{KvData, LayerImage, ModelError, StateImage};

/// One step's comparison of two logit vectors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LogitCmp {
    pub max_abs: f64,
    pub kl: f64,
    pub argmax_equal: bool,
}

/// The index of the largest value (the first of equals).
pub fn argmax(v: &[f32]) -> usize {
    let mut b = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[b] {
            b = i;
        }
    }
    b
}

/// max |a - b|, KL(softmax a || softmax b) in f64, argmax agreement. A
/// non-finite value in `b` makes max |a - b| infinite.
pub fn compare_logits(a: &[f32], b: &[f32]) -> LogitCmp {
    let lse = |v: &[f32]| {
        let m = v
            .iter()
            .map(|&x| x as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        m + v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (la, lb) = (lse(a), lse(b));
    let mut kl = 0f64;
    let mut max_abs = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        let (lpa, lpb) = (x as f64 - la, y as f64 - lb);
        kl += lpa.exp() * (lpa - lpb);
        max_abs = max_abs.max((x as f64 - y as f64).abs());
        if !y.is_finite() {
            max_abs = f64::INFINITY;
        }
    }
    LogitCmp {
        max_abs,
        kl: if kl.is_nan() {
            f64::INFINITY
        } else {
            kl.max(0.0)
        },
        argmax_equal: a.len() == b.len() && argmax(a) == argmax(b),
    }
}

/// The comparison of two sequences over one prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parity {
    pub steps: usize,
    pub worst: LogitCmp,
    pub argmax_agree: usize,
    /// The step (0-based, prompt positions then greedy steps) of the
    /// worst KL: where a divergence starts.
    pub worst_kl_step: usize,
    /// Every compared step's KL, in step order.
    pub kls: Vec<f64>,
    /// (MoE layer, step) pairs whose chosen experts differ, of `router_checks`.
    pub router_mismatches: usize,
    pub router_checks: usize,
    pub greedy_a: Vec<u32>,
    pub greedy_b: Vec<u32>,
}

impl Parity {
    /// Nothing compared yet (the worst case starts as agreement).
    fn start() -> Self {
        Parity {
            worst: LogitCmp {
                argmax_equal: true,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The median of the steps' KLs (0 when none was compared).
    pub fn median_kl(&self) -> f64 {
        let mut v = self.kls.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    /// Steps whose KL is above `kl`.
    pub fn steps_over(&self, kl: f64) -> usize {
        self.kls.iter().filter(|&&k| k > kl).count()
    }

    pub fn greedy_equal(&self) -> bool {
        self.greedy_a == self.greedy_b
    }

    /// Every argmax equal, KL within `kl_max`, greedy identical.
    pub fn ok(&self, kl_max: f64) -> bool {
        self.argmax_agree == self.steps && self.worst.kl <= kl_max && self.greedy_equal()
    }
}

fn route_diff(a: &[Vec<u32>], b: &[Vec<u32>]) -> (usize, usize) {
    let n = a.len().max(b.len());
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    (n - same, n)
}

/// Run `prompt` token by token through `a` and `b` (both reset first),
/// comparing the logits and routes at every step; then `n_greedy` greedy
/// tokens on each from there, compared while the two agree.
pub fn compare(
    a: &mut dyn Sequence,
    b: &mut dyn Sequence,
    prompt: &[u32],
    n_greedy: usize,
) -> Result<Parity, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::NoTokens);
    }
    a.reset()?;
    b.reset()?;
    let mut p = Parity::start();
    let (mut la, mut lb) = (Vec::new(), Vec::new());
    for &t in prompt {
        la = a.decode(t)?;
        lb = b.decode(t)?;
        let r = route_diff(&a.last_routes()?, &b.last_routes()?);
        fold(&mut p, compare_logits(&la, &lb), r);
    }
    greedy(a, b, la, lb, n_greedy, &mut p)?;
    Ok(p)
}

fn fold(p: &mut Parity, c: LogitCmp, routes: (usize, usize)) {
    p.worst.max_abs = p.worst.max_abs.max(c.max_abs);
    if c.kl > p.worst.kl {
        p.worst_kl_step = p.steps;
    }
    p.worst.kl = p.worst.kl.max(c.kl);
    p.kls.push(c.kl);
    p.worst.argmax_equal &= c.argmax_equal;
    p.argmax_agree += c.argmax_equal as usize;
    p.steps += 1;
    p.router_mismatches += routes.0;
    p.router_checks += routes.1;
}

/// `n_greedy` greedy tokens on each from the logits `la`, `lb`, compared
/// (logits and routes) while the two agree.
fn greedy(
    a: &mut dyn Sequence,
    b: &mut dyn Sequence,
    mut la: Vec<f32>,
    mut lb: Vec<f32>,
    n_greedy: usize,
    p: &mut Parity,
) -> Result<(), ModelError> {
    let mut same = true;
    for _ in 0..n_greedy {
        let (ta, tb) = (argmax(&la) as u32, argmax(&lb) as u32);
        p.greedy_a.push(ta);
        p.greedy_b.push(tb);
        same &= ta == tb;
        la = a.decode(ta)?;
        lb = b.decode(tb)?;
        if same {
            let r = route_diff(&a.last_routes()?, &b.last_routes()?);
            fold(p, compare_logits(&la, &lb), r);
        }
    }
    Ok(())
}

/// `a` takes the whole prompt in one `prefill` (its batched path, every
/// position's logits), `b` token by token: the logits at every position
/// compared, then `n_greedy` greedy tokens on each from there (routes are
/// compared on those steps only: a batched prefill keeps no per-position
/// routes).
pub fn compare_prefill(
    a: &mut dyn Sequence,
    b: &mut dyn Sequence,
    prompt: &[u32],
    n_greedy: usize,
) -> Result<Parity, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::NoTokens);
    }
    a.reset()?;
    b.reset()?;
    let mut p = Parity::start();
    let all = a.prefill(prompt, redlite_model::Logits::All)?;
    let nv = all.len() / prompt.len();
    if nv == 0 || all.len() != nv * prompt.len() {
        return Err(ModelError::Backend {
            backend: "parity",
            what: format!(
                "prefill returned {} logits for {} positions",
                all.len(),
                prompt.len()
            ),
        });
    }
    let mut lb = Vec::new();
    for (i, &t) in prompt.iter().enumerate() {
        lb = b.decode(t)?;
        fold(&mut p, compare_logits(&all[i * nv..][..nv], &lb), (0, 0));
    }
    let la = all[(prompt.len() - 1) * nv..].to_vec();
    greedy(a, b, la, lb, n_greedy, &mut p)?;
    Ok(p)
}

/// A checkpoint round trip on one sequence: the logits of `next` decoded
/// straight after `prompt`, against the same after a checkpoint, a
/// detour through `detour` and a restore. Returns (steps whose logits
/// differ in any bit, whether the detour changed the first step's logits
/// (a check that the comparison could fail)).
pub fn checkpoint_roundtrip(
    seq: &mut dyn Sequence,
    prompt: &[u32],
    next: &[u32],
    detour: &[u32],
) -> Result<(usize, bool), ModelError> {
    let bits = |v: Vec<f32>| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
    seq.reset()?;
    seq.prefill(prompt, redlite_model::Logits::Last)?;
    let cp = seq.checkpoint()?;
    let mut straight = Vec::with_capacity(next.len());
    for &t in next {
        straight.push(bits(seq.decode(t)?));
    }
    seq.restore(&cp)?;
    let mut moved = false;
    for (i, &t) in detour.iter().enumerate() {
        let l = bits(seq.decode(t)?);
        moved |= i == 0 && l != straight[0];
    }
    seq.restore(&cp)?;
    let mut differing = 0;
    for (&t, want) in next.iter().zip(&straight) {
        differing += (bits(seq.decode(t)?) != *want) as usize;
    }
    Ok((differing, moved))
}

/// Speculative verify passes on one sequence: after `prompt`, a verify
/// pass over `next` must give each token's decode logits bit for bit, and
/// keeping any prefix of it (`accept`) must leave the sequence where
/// decoding that prefix would have: the remaining tokens then decode to
/// the straight run's logits. Returns (logit rows with any bit different,
/// over all keep lengths; rows compared).
pub fn verify_roundtrip(
    seq: &mut dyn Sequence,
    prompt: &[u32],
    next: &[u32],
) -> Result<(usize, usize), ModelError> {
    let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
    seq.reset()?;
    seq.prefill(prompt, redlite_model::Logits::Last)?;
    let cp = seq.checkpoint()?;
    let mut straight = Vec::with_capacity(next.len());
    for &t in next {
        straight.push(bits(&seq.decode(t)?));
    }
    let n_vocab = straight.first().map_or(0, Vec::len);
    let (mut differing, mut compared) = (0, 0);
    for keep in 0..=next.len() {
        seq.restore(&cp)?;
        let rows = seq.verify(next)?;
        for (i, want) in straight.iter().enumerate() {
            differing += (bits(&rows[i * n_vocab..(i + 1) * n_vocab]) != *want) as usize;
            compared += 1;
        }
        seq.accept(keep)?;
        for (i, &t) in next[keep..].iter().enumerate() {
            differing += (bits(&seq.decode(t)?) != straight[keep + i]) as usize;
            compared += 1;
        }
    }
    Ok((differing, compared))
}

/// A state carried from one sequence to another through the image every
/// backend shares (what a state file holds between two runs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Handoff {
    /// Greedy tokens on `to` continuing from `from`'s state after the
    /// prompt, the first one from `from`'s last logits (as a loaded file
    /// gives them).
    pub loaded: Vec<u32>,
    /// Greedy tokens of `to`'s own straight run of the prompt.
    pub straight: Vec<u32>,
    /// Per layer: max |Δ| between `from`'s exported image and `to`'s own
    /// after the same prompt, and the largest |value| in `to`'s (a layout
    /// difference between the backends shows as a Δ of the values' size;
    /// rounding differences stay far below it).
    pub layer_diffs: Vec<(f64, f64)>,
}

/// The largest per-layer |Δ| between two backends' images after the same
/// prompt, relative to the layer's largest value (at least 1), that still
/// counts as rounding: the GPU's batched prefill rounds its GEMM inputs to
/// f16 (2^-11 relative), while a row, head, window or transposition mix-up
/// moves values by their own size.
pub const MAX_LAYER_REL: f64 = 1e-2;

impl Handoff {
    /// The worst layer's max |Δ| over its largest value (at least 1).
    pub fn worst_rel(&self) -> f64 {
        self.layer_diffs
            .iter()
            .map(|&(d, m)| d / m.max(1.0))
            .fold(0.0, |w, d| if d.is_nan() || d > w { d } else { w })
    }

    /// The loaded continuation is the straight run's, or parts from it no
    /// earlier than `part`, where the two backends' own straight runs part
    /// (a small margin; None: they agree, so no difference is allowed).
    pub fn continues(&self, part: Option<usize>) -> bool {
        match (first_diff(&self.loaded, &self.straight), part) {
            (None, _) => true,
            (Some(i), Some(p)) => i >= p,
            (Some(_), None) => false,
        }
    }
}

/// The index of the first differing token (the shorter length when one is
/// a prefix of the other; None when equal).
pub fn first_diff(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Widened K or V values of an image layer.
fn kv_f32(d: &KvData<'_>) -> Vec<f32> {
    match d {
        KvData::F32(v) => v.to_vec(),
        KvData::F16(v) => v
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect(),
    }
}

/// (max |a - b|, max |b|); infinite where the lengths differ.
fn max_diff(a: &[f32], b: &[f32]) -> (f64, f64) {
    if a.len() != b.len() {
        return (f64::INFINITY, 0.0);
    }
    a.iter().zip(b).fold((0f64, 0f64), |(d, m), (&x, &y)| {
        let dx = (x as f64 - y as f64).abs();
        (
            d.max(if dx.is_nan() { f64::INFINITY } else { dx }),
            m.max((y as f64).abs()),
        )
    })
}

/// Per layer (max |Δ|, max |value| of `b`) between two images.
fn image_diffs(a: &StateImage<'_>, b: &StateImage<'_>) -> Vec<(f64, f64)> {
    a.layers
        .iter()
        .zip(&b.layers)
        .map(|(x, y)| match (x, y) {
            (LayerImage::Kv { k: ka, v: va }, LayerImage::Kv { k: kb, v: vb }) => {
                let (dk, mk) = max_diff(&kv_f32(ka), &kv_f32(kb));
                let (dv, mv) = max_diff(&kv_f32(va), &kv_f32(vb));
                (dk.max(dv), mk.max(mv))
            }
            (
                LayerImage::Recurrent { conv: ca, ssm: sa },
                LayerImage::Recurrent { conv: cb, ssm: sb },
            ) => {
                let (dc, mc) = max_diff(ca, cb);
                let (ds, ms) = max_diff(sa, sb);
                (dc.max(ds), mc.max(ms))
            }
            _ => (f64::INFINITY, 0.0),
        })
        .collect()
}

/// `from` prefills `prompt` and exports its checkpoint; `to` runs the
/// prompt straight (its image kept for the comparison) and `n` greedy
/// tokens, then imports `from`'s image, restores it and decodes `n` greedy
/// tokens from there. Both sequences are reset first. An image `to`
/// refuses (another model's layout, another KV type, a context too small)
/// is the error.
pub fn state_handoff(
    from: &mut dyn Sequence,
    to: &mut dyn Sequence,
    prompt: &[u32],
    n: usize,
) -> Result<Handoff, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::NoTokens);
    }
    from.reset()?;
    let lf = from.prefill(prompt, redlite_model::Logits::Last)?;
    let cf = from.checkpoint()?;
    let image = from.export_checkpoint(&cf)?;
    to.reset()?;
    let lt = to.prefill(prompt, redlite_model::Logits::Last)?;
    let ct = to.checkpoint()?;
    let own = to.export_checkpoint(&ct)?;
    let layer_diffs = image_diffs(&image, &own);
    drop(own);
    let straight = greedy_run(to, lt, n)?;
    let cp = to.import_checkpoint(image)?;
    to.restore(&cp)?;
    let loaded = greedy_run(to, lf, n)?;
    Ok(Handoff {
        loaded,
        straight,
        layer_diffs,
    })
}

/// [`state_handoff`] on one sequence: after `prompt`, its checkpoint
/// exported, `n` greedy tokens run straight, then the image imported and
/// restored and `n` greedy tokens from there (no `layer_diffs`: one
/// image). What a state file saved and loaded by the same backend does.
pub fn state_roundtrip(
    seq: &mut dyn Sequence,
    prompt: &[u32],
    n: usize,
) -> Result<Handoff, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::NoTokens);
    }
    seq.reset()?;
    let l = seq.prefill(prompt, redlite_model::Logits::Last)?;
    let cp = seq.checkpoint()?;
    let image = seq.export_checkpoint(&cp)?;
    let straight = greedy_run(seq, l.clone(), n)?;
    let cp = seq.import_checkpoint(image)?;
    seq.restore(&cp)?;
    let loaded = greedy_run(seq, l, n)?;
    Ok(Handoff {
        loaded,
        straight,
        layer_diffs: Vec::new(),
    })
}

/// `n` greedy tokens from the logits `l` (the last one not run).
fn greedy_run(seq: &mut dyn Sequence, mut l: Vec<f32>, n: usize) -> Result<Vec<u32>, ModelError> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = argmax(&l) as u32;
        out.push(t);
        if i + 1 < n {
            l = seq.decode(t)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_diff_and_continues_by_hand() {
        assert_eq!(first_diff(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_diff(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_diff(&[1, 2], &[1, 2, 3]), Some(2));
        let h = Handoff {
            loaded: vec![1, 2, 9],
            straight: vec![1, 2, 3],
            layer_diffs: vec![(0.5, 100.0), (0.001, 0.5)],
        };
        assert!(!h.continues(None));
        assert!(h.continues(Some(2)));
        assert!(!h.continues(Some(3)));
        // 0.5 / 100 against 0.001 / max(0.5, 1).
        assert_eq!(h.worst_rel(), 0.005);
    }

    #[test]
    fn route_comparison() {
        let a = vec![vec![1, 5], vec![2, 3]];
        assert_eq!(route_diff(&a, &a), (0, 2));
        assert_eq!(route_diff(&a, &[vec![1, 5], vec![2, 4]]), (1, 2));
        assert_eq!(route_diff(&a, &[vec![1, 5]]), (1, 2));
    }

    #[test]
    fn compare_logits_by_hand() {
        // Equal inputs: no distance.
        let c = compare_logits(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]);
        assert_eq!((c.max_abs, c.kl, c.argmax_equal), (0.0, 0.0, true));
        // A shift by a constant leaves the softmax (so KL) unchanged.
        let c = compare_logits(&[1.0, 2.0, 3.0], &[2.0, 3.0, 4.0]);
        assert_eq!(c.max_abs, 1.0);
        assert!(c.kl < 1e-12 && c.argmax_equal);
        // Two logits, p = softmax(0, ln 3) = (1/4, 3/4) against q = (1/2, 1/2):
        // KL = 1/4 ln(1/2) + 3/4 ln(3/2).
        let c = compare_logits(&[0.0, 3f32.ln()], &[0.0, 0.0]);
        let want = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((c.kl - want).abs() < 1e-7, "{} vs {want}", c.kl);
        // A NaN on the second side is infinitely far.
        let c = compare_logits(&[0.0, 1.0], &[0.0, f32::NAN]);
        assert!(c.max_abs.is_infinite());
    }
}
