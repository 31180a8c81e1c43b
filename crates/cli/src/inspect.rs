//! `redlite inspect`: what a GGUF file holds and what this build can run.

use anyhow::{Context, Result};
use redlite_gguf::{GgmlType, GgufFile, MetadataValue};
use redlite_outfile::Output;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// The part of a model a tensor belongs to, for the bytes-by-role table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Embeddings,
    Attention,
    Recurrent,
    Router,
    Experts,
    SharedExpert,
    DenseFfn,
    Norms,
    Head,
    /// A NextN (MTP) block after the trunk: the draft head.
    Mtp,
    Other,
}

impl Role {
    pub fn of(name: &str) -> Role {
        let leaf = name.strip_prefix("blk.").map_or(name, |rest| {
            rest.split_once('.').map_or(rest, |(_, leaf)| leaf)
        });
        if name.starts_with("token_embd") {
            Role::Embeddings
        } else if name.starts_with("output.") || name == "output" {
            Role::Head
        } else if leaf.contains("norm") {
            Role::Norms
        } else if leaf.contains("_exps") {
            Role::Experts
        } else if leaf.contains("_shexp") {
            Role::SharedExpert
        } else if leaf.starts_with("ffn_gate_inp") {
            Role::Router
        } else if leaf.starts_with("ffn_") {
            Role::DenseFfn
        } else if leaf.starts_with("ssm_")
            || leaf.starts_with("attn_qkv")
            || leaf.starts_with("attn_gate")
        {
            Role::Recurrent
        } else if leaf.starts_with("attn_") {
            Role::Attention
        } else {
            Role::Other
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Role::Embeddings => "embeddings",
            Role::Attention => "attention",
            Role::Recurrent => "deltanet",
            Role::Router => "router",
            Role::Experts => "experts",
            Role::SharedExpert => "shared expert",
            Role::DenseFfn => "dense ffn",
            Role::Norms => "norms",
            Role::Head => "head",
            Role::Mtp => "mtp (nextn)",
            Role::Other => "other",
        }
    }
}

fn short_value(v: &MetadataValue) -> String {
    match v {
        MetadataValue::String(s) => {
            let one_line: String = s
                .chars()
                .take(60)
                .map(|c| if c == '\n' { ' ' } else { c })
                .collect();
            if s.chars().count() > 60 {
                format!("{one_line:?}… ({} chars)", s.chars().count())
            } else {
                format!("{one_line:?}")
            }
        }
        MetadataValue::Array(a) => {
            let head: Vec<String> = a
                .values
                .iter()
                .take(8)
                .map(|v| short_value(&v.to_value()))
                .collect();
            let more = if a.values.len() > 8 { ", …" } else { "" };
            format!(
                "[{}{}] ({} × {:?})",
                head.join(", "),
                more,
                a.values.len(),
                a.elem_type
            )
        }
        MetadataValue::U8(x) => x.to_string(),
        MetadataValue::I8(x) => x.to_string(),
        MetadataValue::U16(x) => x.to_string(),
        MetadataValue::I16(x) => x.to_string(),
        MetadataValue::U32(x) => x.to_string(),
        MetadataValue::I32(x) => x.to_string(),
        MetadataValue::U64(x) => x.to_string(),
        MetadataValue::I64(x) => x.to_string(),
        MetadataValue::F32(x) => x.to_string(),
        MetadataValue::F64(x) => x.to_string(),
        MetadataValue::Bool(x) => x.to_string(),
    }
}

/// Whether this build has kernels for a tensor type.
pub fn can_compute(ty: GgmlType) -> bool {
    redlite_quant::kernels(ty).is_ok()
}

/// The human-readable report `redlite inspect FILE` prints.
pub fn report(file: &GgufFile, show_all_metadata: bool) -> String {
    let mut out = String::new();
    let meta = file.metadata();
    let path = file
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let arch = meta
        .architecture()
        .unwrap_or("(none: general.architecture missing)");
    let _ = writeln!(out, "file:          {path}");
    let _ = writeln!(
        out,
        "format:        GGUF v{}, {} metadata keys, {} tensors, alignment {}, {}",
        file.version(),
        meta.len(),
        file.tensors().len(),
        file.alignment(),
        crate::memory::human(file.file_size())
    );
    if let Ok(name) = meta.get_str("general.name") {
        let _ = writeln!(out, "name:          {name}");
    }
    let _ = writeln!(out, "architecture:  {arch}");

    let _ = writeln!(out, "\nhyperparameters ({arch}.*):");
    let prefix = format!("{arch}.");
    for (key, value) in meta.iter() {
        if let Some(rest) = key.strip_prefix(&prefix) {
            let _ = writeln!(out, "  {rest:<40} {}", short_value(value));
        }
    }

    let _ = writeln!(out, "\ntokenizer:");
    let tok_model = meta.get_str("tokenizer.ggml.model").unwrap_or("(none)");
    let tok_pre = meta.get_str("tokenizer.ggml.pre").unwrap_or("(none)");
    let n_tokens = meta
        .get_str_array("tokenizer.ggml.tokens")
        .map(|t| t.len())
        .unwrap_or(0);
    let n_merges = meta
        .get_str_array("tokenizer.ggml.merges")
        .map(|t| t.len())
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "  model {tok_model}, pre-tokenizer {tok_pre}, {n_tokens} tokens, {n_merges} merges"
    );
    let special: Vec<String> = ["bos", "eos", "padding", "eot", "unknown"]
        .iter()
        .filter_map(|k| {
            meta.get_u32(&format!("tokenizer.ggml.{k}_token_id"))
                .ok()
                .map(|id| format!("{k}={id}"))
        })
        .collect();
    let _ = writeln!(
        out,
        "  special ids: {}",
        if special.is_empty() {
            "(none)".into()
        } else {
            special.join(", ")
        }
    );
    if let Ok(b) = meta.get_bool("tokenizer.ggml.add_bos_token") {
        let _ = writeln!(out, "  add_bos_token: {b}");
    }
    match meta.get_str("tokenizer.chat_template") {
        Ok(t) => {
            let tools = if t.contains("tool") {
                ", mentions tools"
            } else {
                ""
            };
            let _ = writeln!(out, "  chat template: {} chars{tools}", t.chars().count());
        }
        Err(_) => {
            let _ = writeln!(out, "  chat template: (none)");
        }
    }

    // NextN (MTP) blocks: the last `nextn_predict_layers` of `block_count`
    // (llama.cpp's converter appends them after the trunk).
    let n_block = meta.get_u64(&format!("{arch}.block_count")).unwrap_or(0);
    let n_nextn = meta
        .get_u64(&format!("{arch}.nextn_predict_layers"))
        .unwrap_or(0)
        .min(n_block);
    let nextn_prefixes: Vec<String> = (n_block - n_nextn..n_block)
        .map(|b| format!("blk.{b}."))
        .collect();
    let role_of = |name: &str| {
        if nextn_prefixes.iter().any(|p| name.starts_with(p.as_str())) {
            Role::Mtp
        } else {
            Role::of(name)
        }
    };
    let mut by_type: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
    let mut by_role: BTreeMap<Role, (usize, u64)> = BTreeMap::new();
    let mut unsupported: BTreeMap<GgmlType, Vec<&str>> = BTreeMap::new();
    for t in file.tensors() {
        let e = by_type.entry(t.ty).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        let r = by_role.entry(role_of(&t.name)).or_default();
        r.0 += 1;
        r.1 += t.n_bytes;
        if !can_compute(t.ty) {
            unsupported.entry(t.ty).or_default().push(&t.name);
        }
    }
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let _ = writeln!(
        out,
        "\ntensors: {} ({} parameters, {})",
        file.tensors().len(),
        n_params,
        crate::memory::human(total)
    );
    let _ = writeln!(out, "  by type:");
    for (ty, (n, bytes)) in &by_type {
        let status = if can_compute(*ty) {
            ""
        } else {
            "  (not computable by this build)"
        };
        let _ = writeln!(
            out,
            "    {:<8} {:>6} tensors {:>12}{status}",
            ty.name(),
            n,
            crate::memory::human(*bytes)
        );
    }
    let _ = writeln!(out, "  by role:");
    for (role, (n, bytes)) in &by_role {
        let pct = if total > 0 {
            100.0 * *bytes as f64 / total as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "    {:<14} {:>6} tensors {:>12} {:>5.1}%",
            role.label(),
            n,
            crate::memory::human(*bytes),
            pct
        );
    }
    if n_nextn > 0 {
        let (n, bytes) = by_role.get(&Role::Mtp).copied().unwrap_or_default();
        let _ = writeln!(
            out,
            "\nmtp: {n_nextn} NextN block(s) ({}, {n} tensors, {}): a draft head; the trunk runs {} of {n_block} blocks",
            nextn_prefixes
                .iter()
                .map(|p| p.trim_end_matches('.'))
                .collect::<Vec<_>>()
                .join(", "),
            crate::memory::human(bytes),
            n_block - n_nextn
        );
    }
    if unsupported.is_empty() {
        let _ = writeln!(
            out,
            "\ncompute: every tensor type in this file is supported by this build"
        );
    } else {
        let _ = writeln!(out, "\ncompute: this build cannot compute these tensors:");
        for (ty, names) in &unsupported {
            let shown: Vec<&str> = names.iter().take(4).copied().collect();
            let more = if names.len() > 4 {
                format!(" and {} more", names.len() - 4)
            } else {
                String::new()
            };
            let _ = writeln!(out, "  {}: {}{more}", ty.name(), shown.join(", "));
        }
    }
    if show_all_metadata {
        let _ = writeln!(out, "\nmetadata:");
        for (key, value) in meta.iter() {
            let _ = writeln!(out, "  {key:<48} {}", short_value(value));
        }
        let _ = writeln!(out, "\ntensor table:");
        for t in file.tensors() {
            let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
            let _ = writeln!(
                out,
                "  {:<40} {:<8} [{}] {}",
                t.name,
                t.ty.name(),
                dims.join(", "),
                crate::memory::human(t.n_bytes)
            );
        }
    }
    out
}

/// Write tensor `name` of `file` dequantized to little-endian f32, in GGUF
/// element order, to `out_path`. The file appears only when complete; an
/// output that is the GGUF file itself (or a directory) is refused before
/// anything is written.
pub fn dump_tensor(file: &GgufFile, name: &str, out_path: &Path) -> Result<u64> {
    let inputs: Vec<&Path> = file.path().into_iter().collect();
    let mut out = Output::create(out_path, &inputs).context("--dump")?;
    let view = file.tensor(name)?;
    let ty = view.info.ty;
    let n = usize::try_from(view.info.n_elements()).context("tensor too large for this machine")?;
    let mut values = vec![0f32; n];
    redlite_quant::dequantize(ty, view.data, &mut values)
        .with_context(|| format!("dequantizing tensor {name} of type {ty}"))?;
    for chunk in values.chunks(1 << 16) {
        let mut bytes = Vec::with_capacity(chunk.len() * 4);
        for v in chunk {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        out.write_all(&bytes)
            .with_context(|| format!("writing {}", out_path.display()))?;
    }
    out.commit()?;
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_names() {
        assert_eq!(Role::of("token_embd.weight"), Role::Embeddings);
        assert_eq!(Role::of("output.weight"), Role::Head);
        assert_eq!(Role::of("output_norm.weight"), Role::Norms);
        assert_eq!(Role::of("blk.3.ffn_up_exps.weight"), Role::Experts);
        assert_eq!(Role::of("blk.3.ffn_down_shexp.weight"), Role::SharedExpert);
        assert_eq!(Role::of("blk.3.ffn_gate_inp.weight"), Role::Router);
        assert_eq!(
            Role::of("blk.3.ffn_gate_inp_shexp.weight"),
            Role::SharedExpert
        );
        assert_eq!(Role::of("blk.0.attn_qkv.weight"), Role::Recurrent);
        assert_eq!(Role::of("blk.0.ssm_out.weight"), Role::Recurrent);
        assert_eq!(Role::of("blk.3.attn_q.weight"), Role::Attention);
        assert_eq!(Role::of("blk.3.attn_q_norm.weight"), Role::Norms);
        assert_eq!(Role::of("blk.3.ffn_down.weight"), Role::DenseFfn);
    }
}
