//! A tiny random Qwen3-Next written with `GgufWriter`, for tests that need
//! no fixture files.
#![allow(dead_code)]

pub mod npy;
pub mod qwen2;

use redlite_gguf::{GgmlType, GgufFile, GgufWriter, MetadataArray, MetadataValue, ValueType};
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn uniform(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32) / (1u64 << 24) as f32
    }
    pub fn sym(&mut self, scale: f32) -> f32 {
        (self.uniform() * 2.0 - 1.0) * scale
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.sym(scale)).collect()
    }
}

#[derive(Clone, Debug)]
pub struct Tiny {
    pub d: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub n_rot: usize,
    pub recurrent: Vec<bool>,
    pub write_recurrent_array: bool,
    pub n_expert: usize,
    pub n_used: usize,
    pub ff_exp: usize,
    pub ff_sh: usize,
    pub conv: usize,
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    pub vocab: usize,
    /// Write DeltaNet input projections as the legacy fused `ssm_in`.
    pub fused_in: bool,
    /// Type of the 2-D matmul weights.
    pub ty: GgmlType,
    pub seed: u64,
}

impl Tiny {
    /// The smallest shapes that still have every kind of layer (a few KiB
    /// of f32 weights): fuzzing seeds.
    pub fn small() -> Tiny {
        Tiny {
            d: 8,
            n_head: 2,
            n_kv: 1,
            hd: 4,
            n_rot: 2,
            recurrent: vec![true, false],
            n_expert: 2,
            n_used: 1,
            ff_exp: 4,
            ff_sh: 4,
            conv: 2,
            nk: 1,
            nv: 1,
            dk: 4,
            dv: 4,
            vocab: 8,
            ..Tiny::default()
        }
    }
}

impl Default for Tiny {
    fn default() -> Tiny {
        Tiny {
            d: 64,
            n_head: 4,
            n_kv: 2,
            hd: 32,
            n_rot: 16,
            recurrent: vec![true, true, true, false, true, false],
            write_recurrent_array: true,
            n_expert: 8,
            n_used: 3,
            ff_exp: 32,
            ff_sh: 64,
            conv: 4,
            nk: 2,
            nv: 4,
            dk: 32,
            dv: 32,
            vocab: 96,
            fused_in: false,
            ty: GgmlType::F32,
            seed: 1234,
        }
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Q8_0 written here (scale = amax/127, f16 scale, 32 int8) so the test does
/// not lean on the crate it is testing against.
pub fn q8_0(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in v.chunks(32) {
        let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(half_bits(d).to_le_bytes());
        out.extend(b.iter().map(|x| (x * id).round() as i8 as u8));
    }
    out
}

fn half_bits(x: f32) -> u16 {
    // f32 → f16, round to nearest even, for normal values in range (enough
    // for scales of random weights).
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if x == 0.0 || exp <= 0 {
        return sign;
    }
    let mant = bits & 0x7f_ffff;
    let mut h = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

/// The weights by name, f32, ggml dims.
pub struct TinyWeights {
    pub tensors: BTreeMap<String, (Vec<u64>, Vec<f32>)>,
}

impl Tiny {
    pub fn weights(&self) -> TinyWeights {
        let mut r = Rng::new(self.seed);
        let mut t = BTreeMap::new();
        let d = self.d;
        let mat = |t: &mut BTreeMap<_, _>, r: &mut Rng, name: String, cols: usize, rows: usize| {
            let s = 1.7 / (cols as f32).sqrt();
            t.insert(
                name,
                (vec![cols as u64, rows as u64], r.vec(cols * rows, s)),
            );
        };
        mat(&mut t, &mut r, "token_embd.weight".into(), d, self.vocab);
        // Embeddings of unit scale per element.
        if let Some((_, v)) = t.get_mut("token_embd.weight") {
            v.iter_mut().for_each(|x| *x *= (d as f32).sqrt() / 1.7);
        }
        mat(&mut t, &mut r, "output.weight".into(), d, self.vocab);
        let norm = |r: &mut Rng, n: usize| (0..n).map(|_| 1.0 + r.sym(0.2)).collect::<Vec<f32>>();
        t.insert(
            "output_norm.weight".into(),
            (vec![d as u64], norm(&mut r, d)),
        );
        let (kd, vd) = (self.nk * self.dk, self.nv * self.dv);
        for (i, &rec) in self.recurrent.iter().enumerate() {
            let b = |s: &str| format!("blk.{i}.{s}");
            t.insert(b("attn_norm.weight"), (vec![d as u64], norm(&mut r, d)));
            t.insert(
                b("post_attention_norm.weight"),
                (vec![d as u64], norm(&mut r, d)),
            );
            if rec {
                if self.fused_in {
                    mat(&mut t, &mut r, b("ssm_in.weight"), d, 2 * kd + 2 * vd);
                } else {
                    mat(&mut t, &mut r, b("attn_qkv.weight"), d, 2 * kd + vd);
                    mat(&mut t, &mut r, b("attn_gate.weight"), d, vd);
                }
                mat(&mut t, &mut r, b("ssm_ba.weight"), d, 2 * self.nv);
                let cd = 2 * kd + vd;
                t.insert(
                    b("ssm_conv1d.weight"),
                    (
                        vec![self.conv as u64, cd as u64],
                        r.vec(cd * self.conv, 0.6),
                    ),
                );
                t.insert(
                    b("ssm_dt.bias"),
                    (vec![self.nv as u64], r.vec(self.nv, 1.0)),
                );
                let a: Vec<f32> = (0..self.nv).map(|_| -(0.2 + 3.0 * r.uniform())).collect();
                t.insert(b("ssm_a"), (vec![self.nv as u64], a));
                t.insert(
                    b("ssm_norm.weight"),
                    (vec![self.dv as u64], norm(&mut r, self.dv)),
                );
                mat(&mut t, &mut r, b("ssm_out.weight"), vd, d);
            } else {
                mat(
                    &mut t,
                    &mut r,
                    b("attn_q.weight"),
                    d,
                    self.hd * self.n_head * 2,
                );
                mat(&mut t, &mut r, b("attn_k.weight"), d, self.hd * self.n_kv);
                mat(&mut t, &mut r, b("attn_v.weight"), d, self.hd * self.n_kv);
                mat(
                    &mut t,
                    &mut r,
                    b("attn_output.weight"),
                    self.hd * self.n_head,
                    d,
                );
                t.insert(
                    b("attn_q_norm.weight"),
                    (vec![self.hd as u64], norm(&mut r, self.hd)),
                );
                t.insert(
                    b("attn_k_norm.weight"),
                    (vec![self.hd as u64], norm(&mut r, self.hd)),
                );
            }
            mat(&mut t, &mut r, b("ffn_gate_inp.weight"), d, self.n_expert);
            for (n, c, rows) in [
                ("ffn_gate_exps", d, self.ff_exp),
                ("ffn_up_exps", d, self.ff_exp),
                ("ffn_down_exps", self.ff_exp, d),
            ] {
                let s = 1.7 / (c as f32).sqrt();
                t.insert(
                    b(&format!("{n}.weight")),
                    (
                        vec![c as u64, rows as u64, self.n_expert as u64],
                        r.vec(c * rows * self.n_expert, s),
                    ),
                );
            }
            t.insert(
                b("ffn_gate_inp_shexp.weight"),
                (vec![d as u64], r.vec(d, 1.0 / (d as f32).sqrt())),
            );
            mat(&mut t, &mut r, b("ffn_gate_shexp.weight"), d, self.ff_sh);
            mat(&mut t, &mut r, b("ffn_up_shexp.weight"), d, self.ff_sh);
            mat(&mut t, &mut r, b("ffn_down_shexp.weight"), self.ff_sh, d);
        }
        TinyWeights { tensors: t }
    }

    pub fn metadata(&self, w: &mut GgufWriter) {
        let a = "qwen3next";
        let u = |x: usize| x as u32;
        w.add_kv("general.architecture", a);
        w.add_kv(format!("{a}.block_count"), u(self.recurrent.len()));
        w.add_kv(format!("{a}.context_length"), 256u32);
        w.add_kv(format!("{a}.embedding_length"), u(self.d));
        w.add_kv(format!("{a}.feed_forward_length"), u(self.ff_exp));
        w.add_kv(format!("{a}.attention.head_count"), u(self.n_head));
        w.add_kv(format!("{a}.attention.head_count_kv"), u(self.n_kv));
        w.add_kv(format!("{a}.attention.key_length"), u(self.hd));
        w.add_kv(format!("{a}.attention.value_length"), u(self.hd));
        w.add_kv(format!("{a}.attention.layer_norm_rms_epsilon"), 1e-6f32);
        w.add_kv(format!("{a}.rope.freq_base"), 10000f32);
        w.add_kv(format!("{a}.rope.dimension_count"), u(self.n_rot));
        w.add_kv(format!("{a}.expert_count"), u(self.n_expert));
        w.add_kv(format!("{a}.expert_used_count"), u(self.n_used));
        w.add_kv(format!("{a}.expert_feed_forward_length"), u(self.ff_exp));
        w.add_kv(
            format!("{a}.expert_shared_feed_forward_length"),
            u(self.ff_sh),
        );
        w.add_kv(format!("{a}.ssm.conv_kernel"), u(self.conv));
        w.add_kv(format!("{a}.ssm.inner_size"), u(self.nv * self.dv));
        w.add_kv(format!("{a}.ssm.state_size"), u(self.dk));
        w.add_kv(format!("{a}.ssm.time_step_rank"), u(self.nv));
        w.add_kv(format!("{a}.ssm.group_count"), u(self.nk));
        w.add_kv(format!("{a}.full_attention_interval"), 4u32);
        if self.write_recurrent_array {
            let vals = self
                .recurrent
                .iter()
                .map(|&b| MetadataValue::Bool(b))
                .collect();
            w.add_kv(
                format!("{a}.attention.recurrent_layers"),
                MetadataArray::new(ValueType::Bool, vals),
            );
        }
    }

    /// The GGUF bytes, with `edit` applied to the weights first.
    pub fn bytes_with(&self, edit: impl FnOnce(&mut TinyWeights)) -> Vec<u8> {
        self.bytes_edit(edit, |_| {})
    }

    /// The GGUF bytes, with `edit` applied to the weights and `meta` to the
    /// writer after the metadata (a key added again keeps the last value).
    pub fn bytes_edit(
        &self,
        edit: impl FnOnce(&mut TinyWeights),
        meta: impl FnOnce(&mut GgufWriter),
    ) -> Vec<u8> {
        let mut tw = self.weights();
        edit(&mut tw);
        let mut w = GgufWriter::new();
        self.metadata(&mut w);
        meta(&mut w);
        for (name, (dims, v)) in &tw.tensors {
            let quantize = self.ty == GgmlType::Q8_0
                && dims.len() >= 2
                && dims[0] % 32 == 0
                && !name.contains("conv1d");
            if quantize {
                w.add_tensor(name.clone(), dims.clone(), GgmlType::Q8_0, q8_0(v))
                    .unwrap();
            } else {
                w.add_tensor(name.clone(), dims.clone(), GgmlType::F32, f32_bytes(v))
                    .unwrap();
            }
        }
        w.to_bytes().unwrap()
    }

    pub fn file(&self) -> Arc<GgufFile> {
        Arc::new(GgufFile::from_bytes(self.bytes_with(|_| {})).unwrap())
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w })
}

pub fn prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..n)
        .map(|_| (r.uniform() * vocab as f32) as u32 % vocab as u32)
        .collect()
}
