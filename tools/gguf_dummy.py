#!/usr/bin/env python3
"""gguf_dummy.py: a GGUF of a Glm4MoeForCausalLM shape with random weights, for llama.cpp beside
moeserve's --dummy-weights (dev-time; see tools/README.md, "llama.cpp beside moeserve").

A real-shape checkpoint in BF16 (GLM-4.5-Air: 220 GB) does not fit the GPU machine's disk, so the
weights never exist in BF16: the metadata comes from llama.cpp's own converter run on the model
directory with --vocab-only (hyper-parameters and the tokenizer, exactly as a conversion writes
them), and this script adds the tensors under the names and shapes that converter gives them,
filled with random Q4_0 blocks (4.5 bits a weight, as NVFP4's 4 + 8/16) made from one random
buffer repeated. What a token reads per step is the same as moeserve's: the linears of the
layers, attention and experts in Q4_0 (moeserve: NVFP4), lm_head in F16 (moeserve: BF16), the
router and the norms in F32. The embedding is Q4_0 (llama.cpp gathers its rows on the host).

    python3 tools/gguf_dummy.py --model DIR --vocab vocab.gguf --out model.gguf [--layers N]

DIR holds config.json; vocab.gguf is `convert_hf_to_gguf.py DIR --vocab-only --no-mtp` of a copy
of DIR whose config.json has num_hidden_layers N (the converter writes block_count from it).
gguf-py (llama.cpp's gguf-py/ folder) must be importable: PYTHONPATH=.../llama.cpp/gguf-py.
"""
import argparse
import json
import sys

import numpy as np

import gguf

Q4_0_BLOCK = 32          # weights a block
Q4_0_BYTES = 18          # an fp16 scale and 16 bytes of nibbles


def hf_tensors(cfg, n_layers):
    """(name, shape) of every tensor a Glm4MoeForCausalLM checkpoint of n_layers holds, the
    experts of a layer merged into one [E, N, K] tensor as the converter merges them."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    E, Im, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    n_shared = cfg.get("n_shared_experts", 0)
    dense = cfg.get("first_k_dense_replace", 0)
    out = [("model.embed_tokens.weight", (V, H))]
    for l in range(n_layers):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (nh * hd, H)), (p + "self_attn.k_proj.weight", (nkv * hd, H)),
                (p + "self_attn.v_proj.weight", (nkv * hd, H)), (p + "self_attn.o_proj.weight", (H, nh * hd))]
        if cfg.get("attention_bias", False):
            out += [(p + "self_attn.q_proj.bias", (nh * hd,)), (p + "self_attn.k_proj.bias", (nkv * hd,)),
                    (p + "self_attn.v_proj.bias", (nkv * hd,))]
        if cfg.get("use_qk_norm", False):
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        if l < dense:
            out += [(p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                    (p + "mlp.down_proj.weight", (H, I))]
            continue
        out += [(p + "mlp.gate.weight", (E, H)), (p + "mlp.gate.e_score_correction_bias", (E,)),
                (p + "mlp.experts.gate_proj.weight", (E, Im, H)), (p + "mlp.experts.up_proj.weight", (E, Im, H)),
                (p + "mlp.experts.down_proj.weight", (E, H, Im))]
        if n_shared:
            out += [(p + "mlp.shared_experts.gate_proj.weight", (Im * n_shared, H)),
                    (p + "mlp.shared_experts.up_proj.weight", (Im * n_shared, H)),
                    (p + "mlp.shared_experts.down_proj.weight", (H, Im * n_shared))]
    out += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    return out


def gguf_type(gname, shape):
    if len(shape) == 1 or gname.endswith("ffn_gate_inp.weight"):
        return gguf.GGMLQuantizationType.F32
    if gname == "output.weight":
        return gguf.GGMLQuantizationType.F16
    if shape[-1] % Q4_0_BLOCK:
        return gguf.GGMLQuantizationType.F16
    return gguf.GGMLQuantizationType.Q4_0


class Filler:
    """Tensor bytes: one random buffer repeated (the content does not change the speed), Q4_0
    blocks with a fixed scale so that activations stay finite through many random layers."""

    def __init__(self, seed, hidden):
        rng = np.random.default_rng(seed)
        self.blocks = rng.integers(0, 256, size=(1 << 20, Q4_0_BYTES), dtype=np.uint8)
        scale = np.float16(1.0 / (4.6 * np.sqrt(hidden)))   # std of (q - 8) * d about 1/sqrt(K)
        self.blocks[:, 0:2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
        self.f = (rng.standard_normal(1 << 22) / np.sqrt(hidden)).astype(np.float32)

    def q4_0(self, shape):
        n_blocks = int(np.prod(shape)) // Q4_0_BLOCK
        reps = -(-n_blocks // len(self.blocks))
        data = np.tile(self.blocks, (reps, 1))[:n_blocks] if reps > 1 else self.blocks[:n_blocks]
        return np.ascontiguousarray(data).reshape(*shape[:-1], shape[-1] // Q4_0_BLOCK * Q4_0_BYTES)

    def floats(self, shape, dtype, value=None):
        n = int(np.prod(shape))
        if value is not None:
            return np.full(shape, value, dtype=dtype)
        reps = -(-n // len(self.f))
        return np.tile(self.f, reps)[:n].astype(dtype).reshape(shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="directory with config.json")
    ap.add_argument("--vocab", required=True, help="convert_hf_to_gguf.py --vocab-only output for this layer count")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0, help="layers (default: the vocab file's block_count)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    cfg = json.load(open(f"{a.model}/config.json"))
    if cfg.get("architectures", [None])[0] != "Glm4MoeForCausalLM":
        sys.exit(f"gguf_dummy: {a.model}: only Glm4MoeForCausalLM is written")
    reader = gguf.GGUFReader(a.vocab)
    arch = reader.fields["general.architecture"].contents()
    if arch != "glm4moe":
        sys.exit(f"gguf_dummy: {a.vocab}: architecture {arch}, expected glm4moe")
    blocks = int(reader.fields[f"{arch}.block_count"].contents())
    n_layers = a.layers or blocks
    if n_layers != blocks:
        sys.exit(f"gguf_dummy: --layers {n_layers} but {a.vocab} says block_count {blocks}: convert a config of {n_layers} layers")

    w = gguf.GGUFWriter(a.out, arch)
    for field in reader.fields.values():      # every key the converter wrote, as it wrote it
        if field.name in ("general.architecture", "general.file_type") or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM4_MOE, n_layers)
    plan = []
    for hf, shape in hf_tensors(cfg, n_layers):
        hf = hf.replace("e_score_correction_bias", "e_score_correction.bias")   # as the converter renames it
        base, suffix = hf.rsplit(".", 1)
        g = names.get_name(base)
        if g is None:
            sys.exit(f"gguf_dummy: no GGUF name for {hf}")
        gname = f"{g}.{suffix}"
        plan.append((gname, shape, gguf_type(gname, shape)))
    fill = Filler(a.seed, cfg["hidden_size"])
    total = 0
    for gname, shape, t in plan:
        if t == gguf.GGMLQuantizationType.Q4_0:
            nbytes = int(np.prod(shape)) // Q4_0_BLOCK * Q4_0_BYTES
            bshape = (*shape[:-1], shape[-1] // Q4_0_BLOCK * Q4_0_BYTES)
            w.add_tensor_info(gname, bshape, np.dtype(np.uint8), nbytes, raw_dtype=t)
        else:
            dt = np.float32 if t == gguf.GGMLQuantizationType.F32 else np.float16
            nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
            w.add_tensor_info(gname, shape, np.dtype(dt), nbytes)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for gname, shape, t in plan:
        if t == gguf.GGMLQuantizationType.Q4_0:
            data = fill.q4_0(shape)
        elif gname.endswith("norm.weight"):
            data = fill.floats(shape, np.float32, 1.0)
        elif gname.endswith(".bias"):
            data = fill.floats(shape, np.float32, 0.0)
        else:
            data = fill.floats(shape, np.float32 if t == gguf.GGMLQuantizationType.F32 else np.float16)
        w.write_tensor_data(data)
    w.close()
    print(f"gguf_dummy: {a.out}: {len(plan)} tensors, {total / 2**30:.2f} GiB, {n_layers} layers", file=sys.stderr)


if __name__ == "__main__":
    main()
