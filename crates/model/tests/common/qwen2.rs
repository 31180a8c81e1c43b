//! A tiny random Qwen2 written with `GgufWriter`.

use super::Rng;
use redlite_gguf::{GgmlType, GgufWriter};

#[derive(Clone, Debug)]
pub struct Qwen2Tiny {
    pub d: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub ff: usize,
    pub n_layer: usize,
    pub vocab: usize,
    pub seed: u64,
}

impl Default for Qwen2Tiny {
    fn default() -> Qwen2Tiny {
        Qwen2Tiny {
            d: 8,
            n_head: 2,
            n_kv: 1,
            hd: 4,
            ff: 8,
            n_layer: 2,
            vocab: 8,
            seed: 7,
        }
    }
}

impl Qwen2Tiny {
    /// The GGUF bytes; `meta` edits the writer after the metadata.
    pub fn bytes_edit(&self, meta: impl FnOnce(&mut GgufWriter)) -> Vec<u8> {
        let a = "qwen2";
        let u = |x: usize| x as u32;
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", a);
        w.add_kv(format!("{a}.block_count"), u(self.n_layer));
        w.add_kv(format!("{a}.context_length"), 128u32);
        w.add_kv(format!("{a}.embedding_length"), u(self.d));
        w.add_kv(format!("{a}.feed_forward_length"), u(self.ff));
        w.add_kv(format!("{a}.attention.head_count"), u(self.n_head));
        w.add_kv(format!("{a}.attention.head_count_kv"), u(self.n_kv));
        w.add_kv(format!("{a}.attention.layer_norm_rms_epsilon"), 1e-6f32);
        w.add_kv(format!("{a}.rope.freq_base"), 10000f32);
        meta(&mut w);
        let mut r = Rng::new(self.seed);
        let (d, q, kv) = (self.d, self.hd * self.n_head, self.hd * self.n_kv);
        let mut add = |name: String, dims: &[usize], r: &mut Rng| {
            let n: usize = dims.iter().product();
            let v: Vec<u8> = r.vec(n, 0.5).iter().flat_map(|x| x.to_le_bytes()).collect();
            let dims: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
            w.add_tensor(name, dims, GgmlType::F32, v).unwrap();
        };
        add("token_embd.weight".into(), &[d, self.vocab], &mut r);
        add("output_norm.weight".into(), &[d], &mut r);
        for i in 0..self.n_layer {
            let b = |s: &str| format!("blk.{i}.{s}");
            add(b("attn_norm.weight"), &[d], &mut r);
            add(b("attn_q.weight"), &[d, q], &mut r);
            add(b("attn_k.weight"), &[d, kv], &mut r);
            add(b("attn_v.weight"), &[d, kv], &mut r);
            add(b("attn_q.bias"), &[q], &mut r);
            add(b("attn_k.bias"), &[kv], &mut r);
            add(b("attn_v.bias"), &[kv], &mut r);
            add(b("attn_output.weight"), &[q, d], &mut r);
            add(b("ffn_norm.weight"), &[d], &mut r);
            add(b("ffn_gate.weight"), &[d, self.ff], &mut r);
            add(b("ffn_up.weight"), &[d, self.ff], &mut r);
            add(b("ffn_down.weight"), &[self.ff, d], &mut r);
        }
        w.to_bytes().unwrap()
    }
}
