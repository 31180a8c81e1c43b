//! Gated DeltaNet (Qwen3-Next's linear-attention layers).
//!
//! Per batch: project q‖k‖v and z, b and a; causal depthwise conv over
//! q‖k‖v with carried state, SiLU; L2-normalise q and k per head, scale q by
//! 1/√dk; β = sigmoid(b), g = ssm_a · softplus(a + dt_bias) (the file stores
//! `ssm_a = -exp(A_log)`); the scan; per head RMSNorm(o)·ssm_norm·SiLU(z);
//! `ssm_out`.

use crate::exec::Exec;
use crate::trace::Trace;
use crate::weights::Weight;
use crate::ModelError;
use redlite_cpu::conv::conv1d_causal;
use redlite_cpu::deltanet::{GdnInputs, GdnShape};
use redlite_cpu::ops::{l2_norm, rms_norm, sigmoid, silu, silu_inplace, softplus};

/// Epsilon of the q/k L2 norm (flash-linear-attention's and transformers').
pub const L2_EPS: f32 = 1e-6;

/// How the input projection is stored.
#[derive(Debug)]
pub enum InProj {
    /// `attn_qkv` gives q‖k‖v (all q heads, then k, then v); `attn_gate` gives z.
    Split { qkv: Weight, gate: Weight },
    /// Legacy `ssm_in`: per key head, `[q (dk), k (dk), v (r·dv), z (r·dv)]`
    /// with `r = n_v_heads / n_k_heads`.
    Fused(Weight),
}

/// The weights of one DeltaNet layer.
#[derive(Debug)]
pub struct DeltaNetWeights {
    pub in_proj: InProj,
    /// Per key head `[b (r), a (r)]`.
    pub ba: Weight,
    /// `conv_dim × kernel` taps.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub ssm_a: Vec<f32>,
    pub norm: Vec<f32>,
    pub out: Weight,
}

/// Shapes shared by all DeltaNet layers of a model.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetParams {
    pub shape: GdnShape,
    pub conv_kernel: usize,
    pub eps: f32,
}

impl DeltaNetParams {
    pub fn key_dim(&self) -> usize {
        self.shape.n_k_heads * self.shape.dk
    }
    pub fn value_dim(&self) -> usize {
        self.shape.n_v_heads * self.shape.dv
    }
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// The recurrent state of one layer: conv window and the DeltaNet matrix.
#[derive(Clone, Debug)]
pub struct RecurrentState {
    /// `(kernel - 1) × conv_dim`, oldest first.
    pub conv: Vec<f32>,
    /// `n_v_heads × dk × dv`.
    pub ssm: Vec<f32>,
    /// What a verify pass keeps to roll the state back to a prefix of its
    /// tokens (see [`RecurrentState::arm_rollback`]).
    rollback: Rollback,
}

/// A verify pass's record for one DeltaNet layer.
///
/// Unlike a KV cache, the recurrent state cannot drop its last tokens, so a
/// rejected draft has to be undone. Instead of a copy of the whole state
/// after every draft position (`n_v_heads × dk × dv` floats per position
/// and layer, 2 MiB on the 80B shapes), the pass keeps the state it started
/// from and the recurrence's inputs per token (a few KiB), and a rollback
/// replays the recurrence over the accepted tokens only. The pass runs the
/// recurrence token by token, so the replay repeats its arithmetic exactly.
#[derive(Clone, Debug, Default)]
enum Rollback {
    #[default]
    Off,
    /// The next forward records.
    Armed,
    Recorded(Box<RollbackLog>),
}

#[derive(Clone, Debug)]
struct RollbackLog {
    conv: Vec<f32>,
    ssm: Vec<f32>,
    /// The conv inputs (q‖k‖v before the conv), `n × conv_dim`.
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    n: usize,
}

impl RecurrentState {
    pub fn new(p: &DeltaNetParams) -> RecurrentState {
        RecurrentState::from_parts(
            vec![0.0; (p.conv_kernel - 1) * p.conv_dim()],
            vec![0.0; p.shape.state_len()],
        )
    }

    /// A state holding `conv` and `ssm` (a restored state file).
    pub fn from_parts(conv: Vec<f32>, ssm: Vec<f32>) -> RecurrentState {
        RecurrentState {
            conv,
            ssm,
            rollback: Rollback::Off,
        }
    }

    pub fn clear(&mut self) {
        self.conv.iter_mut().for_each(|x| *x = 0.0);
        self.ssm.iter_mut().for_each(|x| *x = 0.0);
        self.rollback = Rollback::Off;
    }

    /// Make the next forward record what [`RecurrentState::roll_back`]
    /// needs (and run its recurrence token by token).
    pub fn arm_rollback(&mut self) {
        self.rollback = Rollback::Armed;
    }

    /// Bytes the last recorded pass keeps (for the memory accounting).
    pub fn rollback_bytes(&self) -> usize {
        match &self.rollback {
            Rollback::Recorded(l) => {
                4 * (l.conv.len()
                    + l.ssm.len()
                    + l.qkv.len()
                    + l.q.len()
                    + l.k.len()
                    + l.v.len()
                    + l.g.len()
                    + l.beta.len())
            }
            _ => 0,
        }
    }

    /// Keep the first `keep` tokens of the recorded pass: the state becomes
    /// the one after its `keep`-th token. Ends the record either way.
    pub fn roll_back(
        &mut self,
        pool: &redlite_cpu::Pool,
        p: &DeltaNetParams,
        keep: usize,
    ) -> Result<(), ModelError> {
        let log = match std::mem::take(&mut self.rollback) {
            Rollback::Recorded(l) => l,
            Rollback::Off | Rollback::Armed => {
                return Err(ModelError::Rollback(
                    "no verify pass was recorded for this DeltaNet layer".into(),
                ))
            }
        };
        if keep > log.n {
            return Err(ModelError::Rollback(format!(
                "keeping {keep} tokens of a pass of {}",
                log.n
            )));
        }
        if keep == log.n {
            return Ok(());
        }
        let s = p.shape;
        let (cd, kd, vd, h) = (p.conv_dim(), p.key_dim(), p.value_dim(), s.n_v_heads);
        // The conv window after `keep` tokens: the last kernel-1 rows of
        // the window before the pass followed by the kept inputs.
        let mut window = log.conv;
        window.extend_from_slice(&log.qkv[..keep * cd]);
        let rows = p.conv_kernel - 1;
        self.conv
            .copy_from_slice(&window[window.len() - rows * cd..]);
        self.ssm = log.ssm;
        if keep > 0 {
            let inputs = GdnInputs {
                q: &log.q[..keep * kd],
                k: &log.k[..keep * kd],
                v: &log.v[..keep * vd],
                g: &log.g[..keep * h],
                beta: &log.beta[..keep * h],
            };
            let mut out = vec![0f32; keep * vd];
            redlite_cpu::deltanet::gdn_recurrent(pool, &s, &inputs, &mut self.ssm, &mut out)?;
        }
        Ok(())
    }

    /// Drop a recorded pass (every token kept).
    pub fn end_rollback(&mut self) {
        self.rollback = Rollback::Off;
    }
}

/// Reorder a legacy fused projection (`n × (2kd + 2vd)`) into q‖k‖v and z.
fn unfuse(p: &DeltaNetParams, fused: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let s = p.shape;
    let r = s.n_v_heads / s.n_k_heads;
    let group = 2 * s.dk + 2 * r * s.dv;
    let (kd, vd) = (p.key_dim(), p.value_dim());
    let mut qkv = vec![0f32; n * p.conv_dim()];
    let mut z = vec![0f32; n * vd];
    for t in 0..n {
        let src = &fused[t * (2 * kd + 2 * vd)..(t + 1) * (2 * kd + 2 * vd)];
        let dst = &mut qkv[t * p.conv_dim()..(t + 1) * p.conv_dim()];
        for g in 0..s.n_k_heads {
            let gsrc = &src[g * group..(g + 1) * group];
            dst[g * s.dk..(g + 1) * s.dk].copy_from_slice(&gsrc[..s.dk]);
            dst[kd + g * s.dk..kd + (g + 1) * s.dk].copy_from_slice(&gsrc[s.dk..2 * s.dk]);
            let vlen = r * s.dv;
            dst[2 * kd + g * vlen..2 * kd + (g + 1) * vlen]
                .copy_from_slice(&gsrc[2 * s.dk..2 * s.dk + vlen]);
            z[t * vd + g * vlen..t * vd + (g + 1) * vlen].copy_from_slice(&gsrc[2 * s.dk + vlen..]);
        }
    }
    (qkv, z)
}

/// The DeltaNet mixer over `n` tokens `x` (`n × d`); returns `n × d`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    ex: &Exec,
    w: &DeltaNetWeights,
    p: &DeltaNetParams,
    x: &[f32],
    n: usize,
    st: &mut RecurrentState,
    trace: &mut Trace,
    layer: usize,
) -> Result<Vec<f32>, ModelError> {
    let s = p.shape;
    let t = Some(layer);
    let (kd, vd, cd) = (p.key_dim(), p.value_dim(), p.conv_dim());
    let (qkv, z) = match &w.in_proj {
        InProj::Split { qkv, gate } => (ex.linear(qkv, x, n)?, ex.linear(gate, x, n)?),
        InProj::Fused(wi) => unfuse(p, &ex.linear(wi, x, n)?, n),
    };
    trace.record(t, "linear_attn_qkv_mixed", n, &qkv);
    trace.record(t, "z", n, &z);
    let ba = ex.linear(&w.ba, x, n)?;
    // β and g per value head, from the per-key-head grouped [b, a].
    let r = s.n_v_heads / s.n_k_heads;
    let mut beta = vec![0f32; n * s.n_v_heads];
    let mut g = vec![0f32; n * s.n_v_heads];
    for i in 0..n {
        for kh in 0..s.n_k_heads {
            for j in 0..r {
                let h = kh * r + j;
                let b = ba[i * 2 * s.n_v_heads + kh * 2 * r + j];
                let a = ba[i * 2 * s.n_v_heads + kh * 2 * r + r + j];
                beta[i * s.n_v_heads + h] = sigmoid(b);
                g[i * s.n_v_heads + h] = w.ssm_a[h] * softplus(a + w.dt_bias[h]);
            }
        }
    }
    trace.record(t, "beta", n, &beta);
    trace.record(t, "gate", n, &g);
    let record = matches!(st.rollback, Rollback::Armed);
    let (conv_before, ssm_before) = if record {
        (st.conv.clone(), st.ssm.clone())
    } else {
        (Vec::new(), Vec::new())
    };
    let mut conv = vec![0f32; n * cd];
    conv1d_causal(&mut st.conv, &w.conv, p.conv_kernel, &qkv, &mut conv)?;
    silu_inplace(&mut conv);
    trace.record(t, "conv_output_silu", n, &conv);
    let mut q = Vec::with_capacity(n * kd);
    let mut k = Vec::with_capacity(n * kd);
    let mut v = Vec::with_capacity(n * vd);
    for row in conv.chunks_exact(cd) {
        q.extend_from_slice(&row[..kd]);
        k.extend_from_slice(&row[kd..2 * kd]);
        v.extend_from_slice(&row[2 * kd..]);
    }
    l2_norm(&mut q, s.dk, L2_EPS);
    l2_norm(&mut k, s.dk, L2_EPS);
    let scale = 1.0 / (s.dk as f32).sqrt();
    q.iter_mut().for_each(|x| *x *= scale);
    let inputs = GdnInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
    };
    let mut o = if record {
        ex.gdn_stepwise(&s, &inputs, &mut st.ssm)?
    } else {
        ex.gdn(&s, &inputs, &mut st.ssm)?
    };
    if record {
        st.rollback = Rollback::Recorded(Box::new(RollbackLog {
            conv: conv_before,
            ssm: ssm_before,
            qkv,
            q,
            k,
            v,
            g,
            beta,
            n,
        }));
    }
    trace.record(t, "attn_output_raw", n, &o);
    // Gated RMSNorm per value head: RMSNorm(o)·w·SiLU(z).
    rms_norm(&mut o, &w.norm, p.eps);
    for (x, &zv) in o.iter_mut().zip(&z) {
        *x *= silu(zv);
    }
    trace.record(t, "final_output", n, &o);
    let out = ex.linear(&w.out, &o, n)?;
    trace.record(t, "linear_attn_out", n, &out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfuse_matches_the_grouped_layout() {
        let p = DeltaNetParams {
            shape: GdnShape {
                n_k_heads: 2,
                n_v_heads: 4,
                dk: 1,
                dv: 1,
            },
            conv_kernel: 4,
            eps: 1e-6,
        };
        // per group: q k v0 v1 z0 z1
        let fused = [1., 2., 3., 4., 5., 6., 11., 12., 13., 14., 15., 16.];
        let (qkv, z) = unfuse(&p, &fused, 1);
        assert_eq!(qkv, vec![1., 11., 2., 12., 3., 4., 13., 14.]);
        assert_eq!(z, vec![5., 6., 15., 16.]);
    }
}
