//! Softmax attention with a KV cache: Qwen3-Next's gated form (query ‖ gate
//! per head, per-head q/k RMSNorm, partial RoPE) and the plain form with
//! optional q/k/v biases (Qwen2).

use crate::exec::Exec;
use crate::trace::Trace;
use crate::weights::Weight;
use crate::ModelError;
use redlite_cpu::attention::AttnShape;
use redlite_cpu::ops::{rms_norm, sigmoid, Rope};

/// The weights of one attention layer.
#[derive(Debug)]
pub struct AttnWeights {
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// `wq` emits, per head, `head_dim` query values then `head_dim` gate
    /// values; the output is multiplied by sigmoid(gate).
    pub gated: bool,
}

/// The hyper-parameters of the attention layers of a model.
#[derive(Clone, Debug)]
pub struct AttnParams {
    pub shape: AttnShape,
    pub rope: Rope,
    pub eps: f32,
    pub scale: f32,
}

/// Keys and values of the positions seen so far:
/// `len × n_kv_head × head_dim` each.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub len: usize,
}

impl KvCache {
    pub fn clear(&mut self) {
        self.k.clear();
        self.v.clear();
        self.len = 0;
    }

    /// Drop the positions from `len` on (rejected draft tokens).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let (krow, vrow) = (self.k.len() / self.len, self.v.len() / self.len);
        self.k.truncate(len * krow);
        self.v.truncate(len * vrow);
        self.len = len;
    }
}

fn add_bias(x: &mut [f32], b: &Option<Vec<f32>>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            redlite_cpu::ops::add_inplace(row, b);
        }
    }
}

/// Attention over `n` tokens `x` (`n × d`) at positions `pos0..pos0+n`;
/// appends to the cache, returns `n × d`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    ex: &Exec,
    w: &AttnWeights,
    p: &AttnParams,
    x: &[f32],
    n: usize,
    pos0: usize,
    kv: &mut KvCache,
    trace: &mut Trace,
    layer: usize,
) -> Result<Vec<f32>, ModelError> {
    let AttnShape {
        n_head,
        n_kv_head,
        head_dim: hd,
    } = p.shape;
    let t = Some(layer);
    let [qfull, mut k, mut v] = ex.linear_many([&w.wq, &w.wk, &w.wv], x, n)?;
    // Split query and gate.
    let (mut q, gate) = if w.gated {
        let mut q = Vec::with_capacity(n * n_head * hd);
        let mut g = Vec::with_capacity(n * n_head * hd);
        for head in qfull.chunks_exact(2 * hd) {
            q.extend_from_slice(&head[..hd]);
            g.extend_from_slice(&head[hd..]);
        }
        (q, Some(g))
    } else {
        (qfull, None)
    };
    add_bias(&mut q, &w.bq);
    add_bias(&mut k, &w.bk);
    add_bias(&mut v, &w.bv);
    if let Some(qn) = &w.q_norm {
        rms_norm(&mut q, qn, p.eps);
    }
    if let Some(kn) = &w.k_norm {
        rms_norm(&mut k, kn, p.eps);
    }
    for i in 0..n {
        p.rope
            .apply(&mut q[i * n_head * hd..(i + 1) * n_head * hd], hd, pos0 + i);
        p.rope.apply(
            &mut k[i * n_kv_head * hd..(i + 1) * n_kv_head * hd],
            hd,
            pos0 + i,
        );
    }
    trace.record(t, "Qcur", n, &q);
    trace.record(t, "Kcur", n, &k);
    trace.record(t, "Vcur", n, &v);
    if kv.len != pos0 {
        return Err(ModelError::Layer {
            layer,
            what: format!(
                "KV cache holds {} positions, the batch starts at {pos0}",
                kv.len
            ),
        });
    }
    kv.k.extend_from_slice(&k);
    kv.v.extend_from_slice(&v);
    kv.len += n;
    let mut o = ex.attention(&p.shape, &q, &kv.k, &kv.v, pos0, n, p.scale)?;
    trace.record(t, "attn_pregate", n, &o);
    if let Some(g) = gate {
        for (x, &gv) in o.iter_mut().zip(&g) {
            *x *= sigmoid(gv);
        }
    }
    let out = ex.linear(&w.wo, &o, n)?;
    trace.record(t, "attn_output", n, &out);
    Ok(out)
}
