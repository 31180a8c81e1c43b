"""Read a redlite-synth file with the `gguf` package (llama.cpp's own Python
reader) and check architecture, metadata, tensor shapes/types and the
dequantized statistics of every tensor's first blocks."""
import sys

import numpy as np
import gguf

path, n_layer = sys.argv[1], int(sys.argv[2])
n_nextn = int(sys.argv[3]) if len(sys.argv) > 3 else 0
r = gguf.GGUFReader(path)


def val(key):
    f = r.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode()
    return f.parts[-1].tolist()[0]


assert val("general.architecture") == "qwen3next"
want = {
    "qwen3next.block_count": n_layer + n_nextn,
    "qwen3next.embedding_length": 2048,
    "qwen3next.context_length": 262144,
    "qwen3next.attention.head_count": 16,
    "qwen3next.attention.head_count_kv": 2,
    "qwen3next.attention.key_length": 256,
    "qwen3next.rope.dimension_count": 64,
    "qwen3next.expert_count": 512,
    "qwen3next.expert_used_count": 10,
    "qwen3next.expert_feed_forward_length": 512,
    "qwen3next.expert_shared_feed_forward_length": 512,
    "qwen3next.ssm.conv_kernel": 4,
    "qwen3next.ssm.inner_size": 4096,
    "qwen3next.ssm.state_size": 128,
    "qwen3next.ssm.time_step_rank": 32,
    "qwen3next.ssm.group_count": 16,
    "qwen3next.full_attention_interval": 4,
}
for k, v in want.items():
    assert val(k) == v, (k, val(k), v)
assert abs(val("qwen3next.rope.freq_base") - 1e7) < 1
assert val("qwen3next.attention.recurrent_layers") == [(i + 1) % 4 != 0 for i in range(n_layer)] + [False] * n_nextn
if n_nextn:
    assert val("qwen3next.nextn_predict_layers") == n_nextn
else:
    assert "qwen3next.nextn_predict_layers" not in r.fields
assert len(r.fields["tokenizer.ggml.tokens"].data) == 151936

names = {t.name: t for t in r.tensors}
assert list(names["token_embd.weight"].shape) == [2048, 151936]
assert list(names["output.weight"].shape) == [2048, 151936]
assert list(names["blk.0.ffn_gate_exps.weight"].shape) == [2048, 512, 512]
assert list(names["blk.0.ffn_down_exps.weight"].shape) == [512, 2048, 512]
assert list(names["blk.0.attn_qkv.weight"].shape) == [2048, 8192]
assert list(names["blk.0.ssm_conv1d.weight"].shape) == [4, 8192]
for b in range(n_layer, n_layer + n_nextn):
    # llama.cpp's load_block_mtp: eh_proj {2*n_embd, n_embd}, enorm/hnorm {n_embd}
    assert list(names[f"blk.{b}.nextn.eh_proj.weight"].shape) == [4096, 2048]
    assert list(names[f"blk.{b}.nextn.enorm.weight"].shape) == [2048]
    assert list(names[f"blk.{b}.nextn.hnorm.weight"].shape) == [2048]
    assert list(names[f"blk.{b}.attn_q.weight"].shape) == [2048, 8192]
bad = 0
for t in r.tensors:
    raw = t.data.reshape(-1)
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        y = raw[:65536].astype(np.float64)
    else:
        ts = gguf.GGML_QUANT_SIZES[t.tensor_type][1]
        y = gguf.quants.dequantize(np.ascontiguousarray(raw[: 2048 * ts]), t.tensor_type).reshape(-1)
    ok = np.isfinite(y).all()
    bad += not ok
    print(f"{t.name:34s} {t.tensor_type.name:8s} {str(list(map(int, t.shape))):22s} mean {y.mean():+.4f} std {y.std():.4f}")
    if t.tensor_type != gguf.GGMLQuantizationType.F32:
        fan_in = int(t.shape[0])
        want_std = {"token_embd.weight": 0.5, "output.weight": 3 / np.sqrt(2048)}.get(t.name, 1 / np.sqrt(fan_in))
        # Context subspace (residual dims 0..256, docs/synth.md): zero in the
        # embedding and in every residual writer but attn_output (x8/sqrt(k+1),
        # k-th attention layer).
        rows = y.reshape(-1, fan_in)
        if t.name == "token_embd.weight":
            assert (rows[:, :256] == 0).all(), t.name
            y = rows[:, 256:].reshape(-1)
        elif t.name.endswith(("ssm_out.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight", "attn_output.weight")):
            in_ctx = (np.arange(rows.shape[0]) % int(t.shape[1])) < 256
            if t.name.endswith("attn_output.weight"):
                rows = rows.copy()
                k = int(t.name.split(".")[1]) // 4
                rows[in_ctx] /= 8.0 / np.sqrt(k + 1)
            else:
                assert (rows[in_ctx] == 0).all(), t.name
                rows = rows[~in_ctx]
            if rows.size == 0:
                continue
            y = rows.reshape(-1)
        assert abs(y.std() / want_std - 1) < 0.05, (t.name, y.std(), want_std)
        assert abs(y.mean()) < 0.05 * want_std, (t.name, y.mean())
assert bad == 0
print("gguf package: OK")
