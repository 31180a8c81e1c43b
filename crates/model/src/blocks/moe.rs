//! Feed-forward blocks: the dense SwiGLU FFN and the routed MoE with a
//! sigmoid-gated shared expert.
//!
//! Routing, grouping and compute are kept apart: [`route`] yields
//! (expert, weight) per token; [`group_by_expert`] turns a batch's choices
//! into per-expert token lists; each expert then runs once over its tokens
//! (GEMM-shaped), and the results are added back weighted.

use crate::exec::Exec;
use crate::trace::Trace;
use crate::weights::Weight;
use crate::ModelError;
use redlite_cpu::ops::{sigmoid, softmax};
use redlite_cpu::QMatrix;
use redlite_expertcache::{ExpertKey, ExpertPart, LayerExperts};

/// A dense SwiGLU FFN: `down(SiLU(gate x) ⊙ up x)`.
#[derive(Debug)]
pub struct DenseFfn {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

impl DenseFfn {
    pub fn forward(&self, ex: &Exec, x: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        let [mut g, u] = ex.linear_many([&self.gate, &self.up], x, n)?;
        ex.swiglu(&mut g, &u);
        ex.linear(&self.down, &g, n)
    }
}

/// How the routed experts' gate and up matrices are stored.
#[derive(Debug)]
pub enum ExpertsGateUp {
    /// `ffn_gate_exps` and `ffn_up_exps`, `[d, ff, E]` each.
    Separate { gate: Weight, up: Weight },
    /// `ffn_gate_up_exps`, `[d, 2·ff, E]`: per expert `ff` gate rows then `ff` up rows.
    Merged(Weight),
}

/// A routed MoE layer.
#[derive(Debug)]
pub struct MoeWeights {
    pub router: Weight,
    pub gate_up: ExpertsGateUp,
    /// `[ff, d, E]`.
    pub down: Weight,
    pub n_expert: usize,
    pub n_used: usize,
    pub ff: usize,
    pub norm_topk: bool,
    pub shared: Option<DenseFfn>,
    /// `[d]`: one logit per token for the shared expert's sigmoid gate.
    pub shared_gate: Option<Weight>,
}

/// The chosen experts of one token with their weights.
pub type Route = Vec<(usize, f32)>;

/// Softmax over all router logits, top-k (ties to the lower index), and
/// renormalisation of the chosen weights when `norm_topk`.
pub fn route(logits: &[f32], k: usize, norm_topk: bool) -> Route {
    let mut p = logits.to_vec();
    softmax(&mut p);
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let mut chosen: Route = idx.iter().take(k).map(|&e| (e, p[e])).collect();
    if norm_topk {
        let s: f32 = chosen.iter().map(|&(_, w)| w).sum();
        chosen.iter_mut().for_each(|(_, w)| *w /= s);
    }
    chosen
}

/// Per expert, the (token, weight) pairs routed to it, in token order.
pub fn group_by_expert(routes: &[Route], n_expert: usize) -> Vec<Vec<(usize, f32)>> {
    let mut groups = vec![Vec::new(); n_expert];
    for (t, r) in routes.iter().enumerate() {
        for &(e, w) in r {
            groups[e].push((t, w));
        }
    }
    groups
}

impl MoeWeights {
    /// The MoE over `n` tokens (`n × d`); returns `n × d` and the routes.
    pub fn forward(
        &self,
        ex: &Exec,
        x: &[f32],
        n: usize,
        trace: &mut Trace,
        layer: usize,
    ) -> Result<(Vec<f32>, Vec<Route>), ModelError> {
        let routes = self.route(ex, x, n, trace, layer)?;
        let out = self.forward_routed(ex, x, n, &routes, trace, layer)?;
        Ok((out, routes))
    }

    /// The router: per token, the chosen experts and their weights.
    pub fn route(
        &self,
        ex: &Exec,
        x: &[f32],
        n: usize,
        trace: &mut Trace,
        layer: usize,
    ) -> Result<Vec<Route>, ModelError> {
        let logits = ex.linear(&self.router, x, n)?;
        trace.record(Some(layer), "ffn_moe_logits", n, &logits);
        Ok(logits
            .chunks_exact(self.n_expert)
            .map(|l| route(l, self.n_used, self.norm_topk))
            .collect())
    }

    /// Tell the expert cache (if any) which experts the routes need, so
    /// their reads start now, all at once.
    pub fn demand(&self, ex: &Exec, layer: usize, routes: &[Route]) {
        if let Some(c) = ex.experts {
            let keys: Vec<ExpertKey> = used_experts(routes, self.n_expert)
                .into_iter()
                .map(|e| ExpertKey::new(layer, e))
                .collect();
            c.demand(&keys);
        }
    }

    /// Pre-gating: this layer's router applied to a hidden state `h` (one
    /// token, normed as this layer's input will be) predicts its experts;
    /// the cache starts reading the `ex.pregate` most likely ones. Only a
    /// guess: it changes what is resident, never a value.
    pub fn pregate(&self, ex: &Exec, layer: usize, h: &[f32]) -> Result<(), ModelError> {
        let Some(c) = ex.experts else {
            return Ok(());
        };
        if ex.pregate == 0 {
            return Ok(());
        }
        let logits = ex.linear(&self.router, h, 1)?;
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let keys: Vec<ExpertKey> = idx
            .iter()
            .take(ex.pregate)
            .map(|&e| ExpertKey::new(layer, e))
            .collect();
        c.prefetch(&keys);
        Ok(())
    }

    /// Where each expert's parts lie in the file: (gate, up, down) or
    /// (gate_up, down), one stride of bytes per expert each.
    pub fn expert_layout(&self) -> Result<LayerExperts, ModelError> {
        let parts = self
            .parts()
            .into_iter()
            .map(|w| {
                let r = w.file_range();
                if self.n_expert == 0 || r.len() % self.n_expert != 0 {
                    return Err(ModelError::TensorType {
                        name: w.name.clone(),
                        ty: w.ty,
                        what: format!("does not split into {} equal experts", self.n_expert),
                    });
                }
                Ok(ExpertPart {
                    tensor: w.name.clone(),
                    offset: r.start as u64,
                    stride: (r.len() / self.n_expert) as u64,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LayerExperts {
            n_expert: self.n_expert,
            parts,
        })
    }

    /// The stacked tensors an expert is made of, in slot order.
    fn parts(&self) -> Vec<&Weight> {
        match &self.gate_up {
            ExpertsGateUp::Separate { gate, up } => vec![gate, up, &self.down],
            ExpertsGateUp::Merged(gu) => vec![gu, &self.down],
        }
    }

    /// One expert's SwiGLU over its `m` tokens `xs`, from its parts' bytes.
    fn expert_ffn(
        &self,
        ex: &Exec,
        parts: &[&[u8]],
        xs: &[f32],
        m: usize,
        d: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let ff = self.ff;
        let (mut g, u, down) = match &self.gate_up {
            ExpertsGateUp::Separate { gate, up } => {
                let gm = QMatrix::new(gate.ty, parts[0], ff, d)?;
                let um = QMatrix::new(up.ty, parts[1], ff, d)?;
                (
                    ex.linear_matrix(&gm, xs, m)?,
                    ex.linear_matrix(&um, xs, m)?,
                    parts[2],
                )
            }
            ExpertsGateUp::Merged(gu) => {
                let gum = QMatrix::new(gu.ty, parts[0], 2 * ff, d)?;
                let both = ex.linear_matrix(&gum, xs, m)?;
                let mut g = Vec::with_capacity(m * ff);
                let mut u = Vec::with_capacity(m * ff);
                for row in both.chunks_exact(2 * ff) {
                    g.extend_from_slice(&row[..ff]);
                    u.extend_from_slice(&row[ff..]);
                }
                (g, u, parts[1])
            }
        };
        ex.swiglu(&mut g, &u);
        let dm = QMatrix::new(self.down.ty, down, d, ff)?;
        ex.linear_matrix(&dm, &g, m)
    }

    /// Expert `e`'s part bytes in the mapped file.
    fn mapped_parts<'f>(&self, ex: &Exec<'f>, e: usize) -> Vec<&'f [u8]> {
        self.parts()
            .into_iter()
            .map(|w| {
                let b = w.bytes(ex.file);
                let s = b.len() / self.n_expert;
                &b[e * s..(e + 1) * s]
            })
            .collect()
    }

    /// The routed experts and the shared expert over `n` tokens, given the
    /// routes. Experts run in whatever order their bytes are ready (cached:
    /// resident ones first, while the misses are read); their outputs are
    /// added in expert order, so the result does not depend on the cache.
    pub fn forward_routed(
        &self,
        ex: &Exec,
        x: &[f32],
        n: usize,
        routes: &[Route],
        trace: &mut Trace,
        layer: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let d = x.len() / n;
        let t = Some(layer);
        let groups = group_by_expert(routes, self.n_expert);
        let used = used_experts(routes, self.n_expert);
        let inputs = |e: usize| {
            let toks = &groups[e];
            let mut xs = Vec::with_capacity(toks.len() * d);
            for &(tok, _) in toks {
                xs.extend_from_slice(&x[tok * d..(tok + 1) * d]);
            }
            xs
        };
        let mut ys: Vec<Option<Vec<f32>>> = vec![None; used.len()];
        match ex.experts {
            None => {
                for (y, &e) in ys.iter_mut().zip(&used) {
                    let parts = self.mapped_parts(ex, e);
                    *y = Some(self.expert_ffn(ex, &parts, &inputs(e), groups[e].len(), d)?);
                }
            }
            Some(cache) => {
                // parts lie one after the other in a slot
                let mut at = 0;
                let ranges: Vec<(usize, usize)> = self
                    .parts()
                    .iter()
                    .map(|w| {
                        let len = w.file_range().len() / self.n_expert;
                        at += len;
                        (at - len, len)
                    })
                    .collect();
                let run = |slot: &[u8], e: usize| {
                    let parts: Vec<&[u8]> = ranges.iter().map(|&(a, l)| &slot[a..a + l]).collect();
                    self.expert_ffn(ex, &parts, &inputs(e), groups[e].len(), d)
                };
                // `demand` was called by the architecture (or is now).
                for (y, &e) in ys.iter_mut().zip(&used) {
                    if let Some(slot) = cache.try_get(ExpertKey::new(layer, e)) {
                        *y = Some(run(&slot, e)?);
                    }
                }
                for (y, &e) in ys.iter_mut().zip(&used) {
                    if y.is_none() {
                        let slot = cache.get(ExpertKey::new(layer, e))?;
                        *y = Some(run(&slot, e)?);
                    }
                }
            }
        }
        let mut out = vec![0f32; n * d];
        for (y, &e) in ys.iter().zip(&used) {
            let y = y.as_ref().expect("every used expert ran");
            for (i, &(tok, wt)) in groups[e].iter().enumerate() {
                for (o, &v) in out[tok * d..(tok + 1) * d]
                    .iter_mut()
                    .zip(&y[i * d..(i + 1) * d])
                {
                    *o += wt * v;
                }
            }
        }
        trace.record(t, "ffn_moe_out", n, &out);
        if let Some(shared) = &self.shared {
            let mut sh = shared.forward(ex, x, n)?;
            if let Some(gw) = &self.shared_gate {
                let gl = ex.linear(gw, x, n)?;
                for (row, &gv) in sh.chunks_exact_mut(d).zip(&gl) {
                    let s = sigmoid(gv);
                    row.iter_mut().for_each(|v| *v *= s);
                }
            }
            trace.record(t, "ffn_shexp_gated", n, &sh);
            redlite_cpu::ops::add_inplace(&mut out, &sh);
        }
        Ok(out)
    }
}

/// The experts any token chose, in expert order.
pub fn used_experts(routes: &[Route], n_expert: usize) -> Vec<usize> {
    let mut used = vec![false; n_expert];
    for r in routes {
        for &(e, _) in r {
            used[e] = true;
        }
    }
    (0..n_expert).filter(|&e| used[e]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_softmax_topk_renormalise() {
        let logits = [0.0f32, 2.0, 1.0, 2.0];
        let r = route(&logits, 2, true);
        assert_eq!(
            r.iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![1, 3],
            "ties go to the lower index"
        );
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        let r = route(&logits, 1, false);
        let e: Vec<f64> = logits.iter().map(|&x| (x as f64).exp()).collect();
        assert!((r[0].1 as f64 - e[1] / e.iter().sum::<f64>()).abs() < 1e-6);
    }

    #[test]
    fn grouping_keeps_token_order() {
        let routes = vec![vec![(2, 0.6), (0, 0.4)], vec![(0, 1.0)]];
        let g = group_by_expert(&routes, 3);
        assert_eq!(g[0], vec![(0, 0.4), (1, 1.0)]);
        assert!(g[1].is_empty());
        assert_eq!(g[2], vec![(0, 0.6)]);
    }
}
