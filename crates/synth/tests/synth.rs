//! redlite-synth: shapes and types per layout, metadata, determinism,
//! block statistics, and that the files load: our GGUF reader, the `gguf`
//! Python package (REDLITE_PYTHON), and the Qwen3-Next forward of
//! redlite-model.

use redlite_gguf::{GgmlType, GgufFile, MetadataValue};
use redlite_synth::{write, Init, Layout, Plan, SynthError, TokenizerSource, WriteOptions};
use std::path::{Path, PathBuf};

fn plan(layout: Layout, layers: usize, seed: u64) -> Plan {
    Plan::new(layout, layers, seed, &TokenizerSource::Embedded).unwrap()
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("redlite-synth-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn spec_type(layout: Layout, name: &str) -> GgmlType {
    use GgmlType::*;
    let experts = |part: &str| match (layout, part) {
        (Layout::Iq2, _) => IQ2_XXS,
        (Layout::Cf2, "down") => IQ2_XS,
        (Layout::Cf2, _) => IQ1_M,
        (Layout::Q4km, "down") => Q6_K,
        (Layout::Q4km, _) => Q4_K,
    };
    let short = name.split('.').nth(2).unwrap_or(name);
    if name.ends_with(".nextn.eh_proj.weight") {
        return Q4_K;
    }
    match name {
        "token_embd.weight" => Q4_K,
        "output.weight" => Q6_K,
        "output_norm.weight" => F32,
        _ => match short {
            "ffn_gate_exps" => experts("gate"),
            "ffn_up_exps" => experts("up"),
            "ffn_down_exps" => experts("down"),
            "attn_q" | "attn_k" | "attn_v" | "attn_output" | "attn_qkv" | "attn_gate"
            | "ssm_ba" | "ssm_out" | "ffn_gate_shexp" | "ffn_up_shexp" | "ffn_down_shexp" => Q4_K,
            _ => F32,
        },
    }
}

/// ggml dims of every tensor of the 80B (qwen3next.md; llama.cpp's
/// `llama_model_qwen3next::load_arch_tensors`).
fn spec_dims(name: &str) -> Vec<u64> {
    let short = name.strip_prefix("blk.").map_or(name, |r| {
        let (_, rest) = r.split_once('.').unwrap();
        rest
    });
    match short {
        "token_embd.weight" | "output.weight" => vec![2048, 151936],
        "output_norm.weight" | "attn_norm.weight" | "post_attention_norm.weight" => vec![2048],
        "attn_q.weight" => vec![2048, 16 * 256 * 2],
        "attn_k.weight" | "attn_v.weight" => vec![2048, 2 * 256],
        "attn_output.weight" => vec![4096, 2048],
        "attn_q_norm.weight" | "attn_k_norm.weight" => vec![256],
        "attn_qkv.weight" => vec![2048, 2 * 16 * 128 + 32 * 128],
        "attn_gate.weight" => vec![2048, 4096],
        "ssm_conv1d.weight" => vec![4, 8192],
        "ssm_dt.bias" | "ssm_a" => vec![32],
        "ssm_ba.weight" => vec![2048, 64],
        "ssm_norm.weight" => vec![128],
        "ssm_out.weight" => vec![4096, 2048],
        "ffn_gate_inp.weight" => vec![2048, 512],
        "ffn_gate_exps.weight" | "ffn_up_exps.weight" => vec![2048, 512, 512],
        "ffn_down_exps.weight" => vec![512, 2048, 512],
        "ffn_gate_inp_shexp.weight" => vec![2048],
        "ffn_gate_shexp.weight" | "ffn_up_shexp.weight" => vec![2048, 512],
        "ffn_down_shexp.weight" => vec![512, 2048],
        // The NextN (MTP) block: llama.cpp's load_block_mtp.
        "nextn.eh_proj.weight" => vec![2 * 2048, 2048],
        "nextn.enorm.weight" | "nextn.hnorm.weight" | "nextn.shared_head_norm.weight" => {
            vec![2048]
        }
        other => panic!("unexpected tensor {other}"),
    }
}

#[test]
fn shapes_and_types_match_the_spec_table() {
    for layout in Layout::ALL {
        let p = plan(layout, 48, 0);
        let n_attn = (0..48)
            .filter(|i| {
                p.tensors
                    .iter()
                    .any(|t| t.name == format!("blk.{i}.attn_q.weight"))
            })
            .count();
        assert_eq!(n_attn, 12);
        // Attention layers: 2 norms + 6 attention tensors + 8 FFN tensors;
        // DeltaNet layers: 2 norms + 8 DeltaNet tensors + 8 FFN tensors; 3
        // globals; the MTP block 48: an attention layer + 4 nextn tensors.
        assert_eq!(p.tensors.len(), 12 * 16 + 36 * 18 + 3 + 20, "{layout}");
        for n in ["attn_q", "ffn_gate_exps", "nextn.eh_proj", "nextn.hnorm"] {
            assert!(p.index_of(&format!("blk.48.{n}.weight")).is_ok(), "{n}");
        }
        assert!(p.index_of("blk.48.attn_qkv.weight").is_err());
        let mtp = p.mtp_bytes() as f64 / 1e9;
        println!("{layout}: the MTP block holds {mtp:.3} GB");
        assert!(
            mtp > 0.0 && mtp < p.data_bytes() as f64 / 1e9 / 30.0,
            "{mtp}"
        );
        let no_mtp = Plan::with_mtp(layout, 48, 0, 0, &TokenizerSource::Embedded).unwrap();
        assert_eq!(no_mtp.tensors.len(), p.tensors.len() - 20);
        assert_eq!(no_mtp.data_bytes() + p.mtp_bytes(), p.data_bytes());
        for t in &p.tensors {
            assert_eq!(t.dims, spec_dims(&t.name), "{layout} {}", t.name);
            assert_eq!(t.ty, spec_type(layout, &t.name), "{layout} {}", t.name);
        }
        for i in [3, 7, 47] {
            assert!(p.index_of(&format!("blk.{i}.attn_q.weight")).is_ok());
            assert!(p.index_of(&format!("blk.{i}.ssm_a")).is_err());
        }
        let gb = p.data_bytes() as f64 / 1e9;
        println!("{layout}: {} tensors, {gb:.2} GB", p.tensors.len());
        let (lo, hi) = match layout {
            Layout::Iq2 => (20.0, 23.0),
            Layout::Cf2 => (18.0, 21.0),
            Layout::Q4km => (48.0, 53.0),
        };
        assert!(gb > lo && gb < hi, "{layout}: {gb} GB");
    }
}

#[test]
fn metadata_matches_qwen3next_md() {
    let p = plan(Layout::Iq2, 6, 3);
    let m = &p.metadata;
    let u = |k: &str| {
        m.get(&format!("qwen3next.{k}"))
            .and_then(|v| v.as_int())
            .unwrap()
    };
    assert_eq!(m.get_str("general.architecture").unwrap(), "qwen3next");
    for (k, v) in [
        ("block_count", 7),
        ("nextn_predict_layers", 1),
        ("context_length", 262144),
        ("embedding_length", 2048),
        ("attention.head_count", 16),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 256),
        ("attention.value_length", 256),
        ("rope.dimension_count", 64),
        ("expert_count", 512),
        ("expert_used_count", 10),
        ("expert_feed_forward_length", 512),
        ("expert_shared_feed_forward_length", 512),
        ("ssm.conv_kernel", 4),
        ("ssm.inner_size", 4096),
        ("ssm.state_size", 128),
        ("ssm.time_step_rank", 32),
        ("ssm.group_count", 16),
        ("full_attention_interval", 4),
    ] {
        assert_eq!(u(k), v, "{k}");
    }
    assert_eq!(m.get_f32("qwen3next.rope.freq_base").unwrap(), 1e7);
    assert_eq!(
        m.get_f32("qwen3next.attention.layer_norm_rms_epsilon")
            .unwrap(),
        1e-6
    );
    assert_eq!(
        m.get_bool_array("qwen3next.attention.recurrent_layers")
            .unwrap(),
        vec![true, true, true, false, true, true, false]
    );
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        151936
    );
    assert!(m.get_str("tokenizer.chat_template").is_ok());
    assert_eq!(m.get_str("tokenizer.ggml.pre").unwrap(), "qwen2");
}

/// Bytes of `n` units from `first`, generated in pieces of `piece` units.
fn bytes_in_pieces(p: &Plan, idx: usize, first: u64, n: u64, piece: u64) -> Vec<u8> {
    let (_, ub) = p.unit(idx);
    let mut out = vec![0u8; (n * ub) as usize];
    for (k, c) in out.chunks_mut((piece * ub) as usize).enumerate() {
        p.fill(idx, first + k as u64 * piece, c).unwrap();
    }
    out
}

#[test]
fn bytes_do_not_depend_on_chunking_or_layer_count() {
    let a = plan(Layout::Cf2, 48, 11);
    let b = plan(Layout::Cf2, 2, 11);
    let c = plan(Layout::Cf2, 2, 12);
    for name in [
        "blk.1.ffn_up_exps.weight",
        "blk.1.ffn_down_exps.weight",
        "blk.0.attn_qkv.weight",
        "blk.1.ffn_gate_inp.weight",
        "token_embd.weight",
        "output.weight",
    ] {
        let (ia, ib) = (a.index_of(name).unwrap(), b.index_of(name).unwrap());
        let whole = bytes_in_pieces(&a, ia, 100, 300, 300);
        assert_eq!(whole, bytes_in_pieces(&a, ia, 100, 300, 7), "{name}");
        assert_eq!(whole, bytes_in_pieces(&b, ib, 100, 300, 300), "{name}");
        let other_seed = bytes_in_pieces(&c, c.index_of(name).unwrap(), 100, 300, 300);
        assert_ne!(whole, other_seed, "{name}");
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn dequantized_blocks_are_finite_with_the_intended_std() {
    for layout in Layout::ALL {
        let p = plan(layout, 4, 5);
        for (i, t) in p.tensors.iter().enumerate() {
            let Init::Random { std } = t.init else {
                continue;
            };
            let n_blocks = 2048.min(t.n_bytes() / t.ty.type_size() as u64);
            let bytes = bytes_in_pieces(&p, i, 0, n_blocks, n_blocks);
            let mut y = vec![0f32; n_blocks as usize * t.ty.block_size()];
            redlite_quant::dequantize(t.ty, &bytes, &mut y).unwrap();
            assert!(y.iter().all(|v| v.is_finite()), "{}", t.name);
            if t.ctx != redlite_synth::Ctx::Full {
                // Context subspace: blocks scaled by their gain (0: all zero).
                let (bs, row, ctx) = (t.ty.block_size(), t.dims[0] as usize, 256);
                let mut want_ss = 0.0;
                for (b, yb) in y.chunks_exact(bs).enumerate() {
                    let g = match t.ctx {
                        redlite_synth::Ctx::ZeroCols => f64::from(u8::from((b * bs) % row >= ctx)),
                        redlite_synth::Ctx::RowGain(g) => {
                            if (b * bs / row) % t.dims[1] as usize >= ctx {
                                1.0
                            } else {
                                g
                            }
                        }
                        redlite_synth::Ctx::Full => unreachable!(),
                    };
                    if g == 0.0 {
                        assert!(yb.iter().all(|&v| v == 0.0), "{} block {b}", t.name);
                    }
                    want_ss += g * g * std * std * bs as f64;
                }
                let ss: f64 = y.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                if want_ss > 0.0 {
                    assert!((ss / want_ss - 1.0).abs() < 0.1, "{layout} {}", t.name);
                }
                continue;
            }
            let n = y.len() as f64;
            let mean = y.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let sd = (y
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            assert!(
                (sd / std - 1.0).abs() < 0.05,
                "{layout} {}: std {sd} want {std}",
                t.name
            );
            assert!(mean.abs() < 0.05 * std, "{layout} {}: mean {mean}", t.name);
        }
        // The small F32 tensors.
        for (name, lo, hi) in [
            ("blk.0.ssm_a", -16.0, -1.0),
            ("blk.0.ssm_dt.bias", -7.0, -2.2),
            ("blk.0.ssm_conv1d.weight", -0.5, 0.5),
            ("blk.0.attn_norm.weight", 0.9, 1.1),
            ("blk.3.attn_q_norm.weight", 0.05, 0.1),
            ("blk.3.attn_k_norm.weight", 0.9, 1.1),
        ] {
            let v = f32s(&p.tensor_bytes(p.index_of(name).unwrap()).unwrap());
            assert!(v.iter().all(|&x| x >= lo && x <= hi), "{name}");
        }
    }
}

#[test]
fn router_usage_is_skewed_and_correlated() {
    let p = plan(Layout::Iq2, 2, 0);
    let usage = redlite_synth::report::simulate(&p, 512, 0.8).unwrap();
    print!("{}", redlite_synth::report::format(&usage, 512, 0.8));
    for u in &usage {
        assert_eq!(u.picks(), 512 * 10);
        let share = u.top_share(52);
        // Uniform would give ~10%; real MoE layers are skewed but not collapsed.
        assert!(share > 0.2 && share < 0.5, "top-10% share {share}");
        assert!(u.overlap > 0.2, "overlap {}", u.overlap);
    }
    let iid = redlite_synth::report::simulate(&p, 512, 0.0).unwrap();
    assert!(iid.iter().all(|u| u.overlap < 0.2));
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(matches!(
        "iq3".parse::<Layout>(),
        Err(SynthError::UnknownLayout(_))
    ));
    assert!(matches!(
        Plan::new(Layout::Iq2, 0, 0, &TokenizerSource::Embedded),
        Err(SynthError::BadLayers(0))
    ));
    let missing = TokenizerSource::File("/nonexistent/tokenizer.gguf".into());
    assert!(matches!(
        Plan::new(Layout::Iq2, 1, 0, &missing),
        Err(SynthError::Gguf(_))
    ));
    // A GGUF without tokenizer.
    let d = dir();
    let path = d.join("no-tokenizer.gguf");
    let _c = Cleanup(path.clone());
    let mut w = redlite_gguf::GgufWriter::new();
    w.add_kv("general.architecture", "qwen3next");
    w.write(&path).unwrap();
    assert!(matches!(
        Plan::new(Layout::Iq2, 1, 0, &TokenizerSource::File(path.clone())),
        Err(SynthError::NoTokenizer { .. })
    ));
    // A tokenizer with the wrong vocabulary size.
    let mut w = redlite_gguf::GgufWriter::new();
    w.add_kv(
        "tokenizer.ggml.tokens",
        MetadataValue::string_array(["a", "b"]),
    );
    w.write(&path).unwrap();
    assert!(matches!(
        Plan::new(Layout::Iq2, 1, 0, &TokenizerSource::File(path.clone())),
        Err(SynthError::VocabMismatch { got: 2, .. })
    ));
    let p = plan(Layout::Iq2, 1, 0);
    let mut buf = vec![0u8; 10];
    assert!(p.fill(p.tensors.len(), 0, &mut buf).is_err());
    // Output into a missing directory: an error naming the path.
    let e = write(
        &p,
        Path::new("/nonexistent/dir/x.gguf"),
        &WriteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, SynthError::Output(_)), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/dir/x.gguf"), "{e}");
    // Onto a directory, or onto an input: refused before anything is written.
    let e = write(&p, &d, &WriteOptions::default()).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");
    let before = std::fs::read(&path).unwrap();
    let e =
        redlite_synth::write_checked(&p, &path, &[&path], &WriteOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("is the same file as the input"),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 22], vec![0u8; 1 << 22]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        if n == 0 {
            return true;
        }
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
    }
}

fn python_check(path: &Path, layers: usize, mtp_layers: usize) {
    let Some(py) = std::env::var_os("REDLITE_PYTHON") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "REDLITE_PYTHON is not set (needed in CI: a python with the gguf package)"
        );
        eprintln!("SKIPPED: gguf package check (set REDLITE_PYTHON to a python with `gguf`)");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_gguf.py");
    let out = std::process::Command::new(py)
        .arg(&script)
        .arg(path)
        .arg(layers.to_string())
        .arg(mtp_layers.to_string())
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "check_gguf.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One test writes the files (they are large) and runs every check that
/// needs one, deleting them at the end.
#[test]
fn written_files_are_deterministic_and_load() {
    let d = dir();
    // --layers 1: determinism across thread counts, our reader, the gguf package.
    // (Without the MTP block: it would add half the bytes to each write.)
    let p1 = Plan::with_mtp(Layout::Iq2, 1, 0, 7, &TokenizerSource::Embedded).unwrap();
    let (a, b) = (d.join("l1-t1.gguf"), d.join("l1-t3.gguf"));
    let (_ca, _cb) = (Cleanup(a.clone()), Cleanup(b.clone()));
    let one = |t| WriteOptions {
        threads: t,
        progress: false,
    };
    let st = write(&p1, &a, &one(1)).unwrap();
    println!(
        "--layers 1: {:.2} GB in {:.1} s ({:.2} GB/s, 1 thread)",
        st.file_bytes as f64 / 1e9,
        st.seconds,
        st.gb_per_s()
    );
    write(&p1, &b, &one(3)).unwrap();
    assert!(same_file(&a, &b), "1 and 3 threads wrote different bytes");
    drop(_cb);
    let f = GgufFile::open(&a).unwrap();
    assert_eq!(f.tensors().len(), p1.tensors.len());
    for (info, t) in f.tensors().iter().zip(&p1.tensors) {
        assert_eq!((&info.name, &info.dims, info.ty), (&t.name, &t.dims, t.ty));
    }
    for name in ["blk.0.ffn_down_exps.weight", "blk.0.ssm_a", "output.weight"] {
        let i = p1.index_of(name).unwrap();
        assert_eq!(
            f.tensor(name).unwrap().data,
            &p1.tensor_bytes(i).unwrap()[..]
        );
    }
    assert_eq!(f.metadata().get_u64("redlite.synth.seed").unwrap(), 7);
    drop(f);
    python_check(&a, 1, 0);
    drop(_ca);

    // --layers 4 (three DeltaNet layers, one attention layer): the model loads and runs.
    let p4 = plan(Layout::Iq2, 4, 1);
    let c = d.join("l4.gguf");
    let _cc = Cleanup(c.clone());
    write(&p4, &c, &WriteOptions::default()).unwrap();
    let file = std::sync::Arc::new(GgufFile::open(&c).unwrap());
    let model = redlite_model::Model::load(file, redlite_model::LoadOptions::default()).unwrap();
    let mut s = model.new_session(64);
    let toks: Vec<u32> = vec![9707, 11, 1879, 0, 151643, 2, 374, 264];
    let logits = s
        .forward(&model, &toks, redlite_model::Logits::All)
        .unwrap();
    assert_eq!(logits.len(), toks.len() * 151936);
    assert!(logits.iter().all(|v| v.is_finite()), "non-finite logits");
    let last = &logits[(toks.len() - 1) * 151936..];
    let n = last.len() as f64;
    let mean = last.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let sd = (last
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    println!("--layers 4: logits mean {mean:.3} std {sd:.3}");
    // The MTP block (block 4): the trunk ran 4 layers; the head loads and
    // drafts finite logits from the trunk's last hidden row.
    assert_eq!(model.arch().n_layer(), 4);
    let head = model.mtp().expect("the synth file has an MTP block");
    assert_eq!(head.block, 4);
    let mut keep = model.new_session(64);
    keep.set_keep_hidden(true);
    keep.forward(&model, &toks, redlite_model::Logits::Last)
        .unwrap();
    let h = keep.last_hidden();
    let mut st = head.new_state(64);
    let t0 = std::time::Instant::now();
    let out = head
        .forward(
            &model,
            &mut st,
            &h[h.len() - 2048..],
            &[toks[1]],
            redlite_model::Logits::Last,
        )
        .unwrap();
    println!(
        "--layers 4: one MTP draft step {:.1} ms (debug build, 2048 wide, 512 experts)",
        t0.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(out.logits.len(), 151936);
    assert!(out.logits.iter().all(|v| v.is_finite()));
    python_check(&c, 4, 1);
    assert!(sd > 1.0 && sd < 10.0, "logit std {sd}");
    // Routing in the real forward: consecutive tokens share some experts.
    let routes = s.last_routes();
    for (layer, r) in routes.iter().enumerate() {
        let overlap: f64 = r
            .windows(2)
            .map(|w| {
                w[1].iter()
                    .filter(|(e, _)| w[0].iter().any(|(f, _)| f == e))
                    .count() as f64
                    / 10.0
            })
            .sum::<f64>()
            / (r.len() - 1) as f64;
        println!("--layers 4 forward: layer {layer} consecutive-token expert overlap {overlap:.2}");
        // Layer 3 (attention) writes the context subspace the routers read.
        if layer == 3 {
            assert!(overlap > 0.15, "layer 3 overlap {overlap}");
        }
    }
    let _ = std::fs::remove_dir(&d);
}
