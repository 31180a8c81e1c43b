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
        let d = x.len() / n;
        let t = Some(layer);
        let logits = ex.linear(&self.router, x, n)?;
        trace.record(t, "ffn_moe_logits", n, &logits);
        let routes: Vec<Route> = logits
            .chunks_exact(self.n_expert)
            .map(|l| route(l, self.n_used, self.norm_topk))
            .collect();
        let mut out = vec![0f32; n * d];
        for (e, toks) in group_by_expert(&routes, self.n_expert).iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let m = toks.len();
            let mut xs = Vec::with_capacity(m * d);
            for &(tok, _) in toks {
                xs.extend_from_slice(&x[tok * d..(tok + 1) * d]);
            }
            let ff = self.ff;
            let (mut g, u) = match &self.gate_up {
                ExpertsGateUp::Separate { gate, up } => (
                    ex.linear_rows(gate, e * ff, ff, &xs, m)?,
                    ex.linear_rows(up, e * ff, ff, &xs, m)?,
                ),
                ExpertsGateUp::Merged(gu) => {
                    let both = ex.linear_rows(gu, e * 2 * ff, 2 * ff, &xs, m)?;
                    let mut g = Vec::with_capacity(m * ff);
                    let mut u = Vec::with_capacity(m * ff);
                    for row in both.chunks_exact(2 * ff) {
                        g.extend_from_slice(&row[..ff]);
                        u.extend_from_slice(&row[ff..]);
                    }
                    (g, u)
                }
            };
            ex.swiglu(&mut g, &u);
            let y = ex.linear_rows(&self.down, e * d, d, &g, m)?;
            for (i, &(tok, wt)) in toks.iter().enumerate() {
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
        Ok((out, routes))
    }
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
