//! The kernels' argument structs against the C declarations they mirror,
//! as NVRTC itself lays those out.
//!
//! Each Rust `#[repr(C)]` argument struct is passed to its kernel as raw
//! bytes, so a field out of place in either copy would hand the kernel
//! garbage without any error. The `.cu` files assert the struct sizes
//! (`static_assert(sizeof ...)`), but NVRTC has no `offsetof`, and two
//! fields of one type swapped keep the size. So this test appends a probe
//! kernel to each kernel file that stores `sizeof` and every field's
//! offset (address differences on a local, folded to constants), compiles
//! it with NVRTC and reads the constants back from the PTX, then compares
//! them with `size_of` / `offset_of!` of the Rust struct.
//!
//! It needs libnvrtc at run time (no GPU): `scripts/check-cuda-kernels.sh`
//! runs it with PyPI's NVRTC on the library path; elsewhere, without
//! NVRTC, it says so and passes.

use crate::expert_cache::{ExpertFetchArgs, ExpertPlanArgs, FetchProj};
use crate::gemv::{GemmArgs, GemvQ8Args};
use crate::kernels::{expand, nvrtc_options, FILES};
use crate::ops::{
    AttnChunkArgs, AttnMergeArgs, AttnPrepArgs, AttnSplitArgs, GdnRecurArgs, GdnWyArgs,
    MoeCombineChunkArgs, MoeCombineNormArgs, RmsNormArgs, RouterGemvArgs,
};
use std::collections::HashMap;
use std::mem::{offset_of, size_of};

/// One struct: the kernel file declaring it, its C name, the Rust size,
/// and (C field expression, Rust offset) for every field.
struct Probe {
    file: &'static str,
    c_struct: &'static str,
    size: usize,
    fields: Vec<(&'static str, usize)>,
}

/// `fields!(Type; "c" = rust, ...)`: the C field names beside the Rust
/// fields' offsets.
macro_rules! fields {
    ($t:ty; $($c:literal = $r:ident),* $(,)?) => {
        vec![$(($c, offset_of!($t, $r))),*]
    };
}

fn probes() -> Vec<Probe> {
    let proj =
        |i: usize, f: usize| offset_of!(ExpertFetchArgs, proj) + i * size_of::<FetchProj>() + f;
    let mut fetch = vec![("miss", offset_of!(ExpertFetchArgs, miss))];
    for (i, names) in [
        ["proj[0].src", "proj[0].dst", "proj[0].stride"],
        ["proj[1].src", "proj[1].dst", "proj[1].stride"],
        ["proj[2].src", "proj[2].dst", "proj[2].stride"],
    ]
    .into_iter()
    .enumerate()
    {
        fetch.push((names[0], proj(i, offset_of!(FetchProj, src))));
        fetch.push((names[1], proj(i, offset_of!(FetchProj, dst))));
        fetch.push((names[2], proj(i, offset_of!(FetchProj, stride))));
    }
    vec![
        Probe {
            file: "attn_prep.cu",
            c_struct: "AttnPrepArgs",
            size: size_of::<AttnPrepArgs>(),
            fields: fields!(AttnPrepArgs; "q_full" = q_full, "k" = k, "v" = v,
                "q_norm" = q_norm, "k_norm" = k_norm, "inv_freq" = inv_freq, "pos_p" = pos,
                "q_out" = q_out, "k_cache" = k_cache, "v_cache" = v_cache, "ld_q" = ld_q,
                "ld_k" = ld_k, "ld_v" = ld_v, "n_rot" = n_rot, "pos0" = pos0,
                "n_head" = n_head, "n_kv" = n_kv, "hd" = hd, "gated" = gated, "eps" = eps,
                "pad" = pad),
        },
        Probe {
            file: "router.cu",
            c_struct: "RouterGemvArgs",
            size: size_of::<RouterGemvArgs>(),
            fields: fields!(RouterGemvArgs; "w" = w, "x" = x, "logits" = logits,
                "counter" = counter, "slot_of" = slot_of, "slots_out" = slots_out,
                "experts_out" = experts_out, "w_out" = w_out, "resid" = resid, "mix" = mix,
                "norm_w" = norm_w, "hq" = hq, "hqd" = hqd, "rows" = rows, "cols" = cols,
                "n" = n, "k" = k, "norm" = norm, "eps" = eps),
        },
        Probe {
            file: "expert_cache.cu",
            c_struct: "ExpertPlanArgs",
            size: size_of::<ExpertPlanArgs>(),
            fields: fields!(ExpertPlanArgs; "experts" = experts, "clock" = clock,
                "slot_of" = slot_of, "expert_in" = expert_in, "stamp" = stamp, "used" = used,
                "pref" = pref, "slots_out" = slots_out, "miss" = miss, "counters" = counters,
                "k" = k, "n_slots" = n_slots, "prefetch" = prefetch, "pad" = pad),
        },
        Probe {
            file: "expert_cache.cu",
            c_struct: "ExpertFetchArgs",
            size: size_of::<ExpertFetchArgs>(),
            fields: fetch,
        },
        Probe {
            file: "elementwise.cu",
            c_struct: "MoeCombineNormArgs",
            size: size_of::<MoeCombineNormArgs>(),
            fields: fields!(MoeCombineNormArgs; "x" = x, "ys" = ys, "w" = w, "sh" = sh,
                "sh_logit" = sh_logit, "norm_w" = norm_w, "h" = h, "q" = q, "qd" = qd,
                "mix" = mix, "k" = k, "d" = d, "eps" = eps, "pad" = pad),
        },
        Probe {
            file: "elementwise.cu",
            c_struct: "MoeCombineChunkArgs",
            size: size_of::<MoeCombineChunkArgs>(),
            fields: fields!(MoeCombineChunkArgs; "x" = x, "ys" = ys, "pair" = pair, "w" = w,
                "sh" = sh, "sh_logit" = sh_logit, "sh_ld" = sh_ld, "k" = k, "d" = d),
        },
        Probe {
            file: "deltanet_chunk.cu",
            c_struct: "GdnRecurArgs",
            size: size_of::<GdnRecurArgs>(),
            fields: fields!(GdnRecurArgs; "conv" = conv, "ba" = ba, "ld_ba" = ld_ba,
                "dt_bias" = dt_bias, "ssm_a" = ssm_a, "state" = state, "raw" = raw,
                "n_k" = n_k, "n_v" = n_v, "dk" = dk, "dv" = dv, "W" = w, "tokens" = tokens),
        },
        Probe {
            file: "deltanet_wy.cu",
            c_struct: "GdnWyArgs",
            size: size_of::<GdnWyArgs>(),
            fields: fields!(GdnWyArgs; "conv" = conv, "ba" = ba, "ld_ba" = ld_ba,
                "dt_bias" = dt_bias, "ssm_a" = ssm_a, "wy" = wy, "state" = state, "raw" = raw,
                "n_k" = n_k, "n_v" = n_v, "dk" = dk, "dv" = dv, "tokens" = tokens,
                "n_sub" = n_sub),
        },
        Probe {
            file: "attn_chunk.cu",
            c_struct: "AttnChunkArgs",
            size: size_of::<AttnChunkArgs>(),
            fields: fields!(AttnChunkArgs; "q" = q, "kc" = kc, "vc" = vc, "gate" = gate,
                "gate_ld" = gate_ld, "out" = out, "part" = part, "n_head" = n_head,
                "n_kv" = n_kv, "pos0" = pos0, "tokens" = tokens, "scale" = scale,
                "n_split" = n_split),
        },
        Probe {
            file: "gemv_q8act.cu",
            c_struct: "GemvQ8Args",
            size: size_of::<GemvQ8Args>(),
            fields: fields!(GemvQ8Args; "w0" = w0, "w1" = w1, "mat_bytes" = mat_bytes,
                "slots" = slots, "xq" = xq, "xd" = xd, "x_stride" = x_stride, "y" = y,
                "n_first" = n_first, "rows" = rows, "nb" = nb, "max_lanes" = max_lanes),
        },
        Probe {
            file: "attention.cu",
            c_struct: "AttnSplitArgs",
            size: size_of::<AttnSplitArgs>(),
            fields: fields!(AttnSplitArgs; "q" = q, "kc" = kc, "vc" = vc, "pos_p" = pos,
                "part_o" = part_o, "part_ml" = part_ml, "n_head" = n_head, "n_kv" = n_kv,
                "nsplit" = nsplit, "scale" = scale),
        },
        Probe {
            file: "attention.cu",
            c_struct: "AttnMergeArgs",
            size: size_of::<AttnMergeArgs>(),
            fields: fields!(AttnMergeArgs; "part_o" = part_o, "part_ml" = part_ml,
                "gate" = gate, "out" = out, "q8" = q8, "q8d" = q8d,
                "gate_stride" = gate_stride, "nsplit" = nsplit, "hd" = hd, "pad" = pad),
        },
        Probe {
            file: "norm.cu",
            c_struct: "RmsNormArgs",
            size: size_of::<RmsNormArgs>(),
            fields: fields!(RmsNormArgs; "x" = x, "res" = res, "w" = w, "out" = out,
                "q" = q, "qd" = qd, "d" = d, "eps" = eps, "add_one" = add_one, "pad" = pad),
        },
        Probe {
            file: "gemv_q4k.cu",
            c_struct: "GemmArgs",
            size: size_of::<GemmArgs>(),
            fields: fields!(GemmArgs; "w" = w, "mat_bytes" = mat_bytes, "slots" = slots,
                "tiles" = tiles, "x" = x, "xh" = xh, "gather" = gather, "y" = y,
                "n_tiles_dev" = n_tiles_dev, "ldx" = ldx, "ldy" = ldy, "rows" = rows, "nb" = nb,
                "n" = n, "ksplit" = ksplit),
        },
    ]
}

/// The probe kernel: o[0] = sizeof, o[1 + i] = offset of field i.
fn probe_source(p: &Probe) -> String {
    let mut s = format!(
        "\nextern \"C\" __global__ void layout_probe(long long* o) {{\n    {} a;\n    o[0] = (long long)sizeof(a);\n",
        p.c_struct
    );
    for (i, (f, _)) in p.fields.iter().enumerate() {
        s.push_str(&format!(
            "    o[{}] = (long long)((const char*)&a.{f} - (const char*)&a);\n",
            i + 1
        ));
    }
    s.push_str("}\n");
    s
}

/// The constants the probe stores, by index: `mov.u64 %rdA, V` then
/// `st.global.u64 [%rdB+8*i], %rdA` (or `[%rdB]` for index 0).
fn probe_values(ptx: &str) -> HashMap<usize, i64> {
    let body = ptx
        .split(".entry layout_probe")
        .nth(1)
        .expect("the probe kernel in the PTX");
    let mut regs = HashMap::new();
    let mut out = HashMap::new();
    for line in body.lines() {
        let t: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == ',' || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        match t.as_slice() {
            ["mov.u64", r, v] => {
                if let Ok(v) = v.parse::<i64>() {
                    regs.insert(r.to_string(), v);
                }
            }
            ["st.global.u64", addr, r] => {
                let a = addr.trim_matches(|c| c == '[' || c == ']');
                let off = a.split_once('+').map_or(Some(0), |(_, o)| o.parse().ok());
                if let (Some(off), Some(v)) = (off, regs.get(*r)) {
                    out.insert(off as usize / 8, *v);
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn kernel_arg_structs_match_their_c_layout() {
    // SAFETY: only tries to open libnvrtc by its usual names (what cudarc
    // does on first use anyway); nothing of the library is called here.
    // Exercised by every run of this test, with and without NVRTC.
    let have = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if !have {
        eprintln!("kernel_arg_structs_match_their_c_layout: no libnvrtc, skipped");
        return;
    }
    let probes = probes();
    assert_eq!(probes.len(), 14);
    for p in &probes {
        let file = FILES
            .iter()
            .find(|f| f.name == p.file)
            .unwrap_or_else(|| panic!("{} not in FILES", p.file));
        let src = expand(file.source).unwrap() + &probe_source(p);
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, nvrtc_options(p.file, &[]))
            .unwrap_or_else(|e| panic!("{} probe of {}: {e:?}", p.file, p.c_struct))
            .to_src();
        let v = probe_values(&ptx);
        assert_eq!(v.get(&0), Some(&(p.size as i64)), "sizeof {}", p.c_struct);
        for (i, (f, off)) in p.fields.iter().enumerate() {
            assert_eq!(
                v.get(&(i + 1)),
                Some(&(*off as i64)),
                "{}.{f}: C offset (left) vs Rust offset {off}",
                p.c_struct
            );
        }
    }
}

/// The PTX reader on a hand-written probe body: the constants by slot,
/// through the registers they were moved into.
#[test]
fn probe_values_reads_the_stored_constants() {
    let ptx = ".entry layout_probe(\n\t.param .u64 p\n)\n{\n\tmov.u64 \t%rd3, 0;\n\tmov.u64 \t%rd4, 80;\n\tst.global.u64 \t[%rd2], %rd4;\n\tmov.u64 \t%rd5, 48;\n\tst.global.u64 \t[%rd2+8], %rd5;\n\tst.global.u64 \t[%rd2+16], %rd3;\n\tret;\n}\n";
    let v = probe_values(ptx);
    assert_eq!(v.len(), 3);
    assert_eq!((v[&0], v[&1], v[&2]), (80, 48, 0));
}
