#!/usr/bin/env python3
"""perplexity_ref: the reference for `moeserve perplexity`, computed with Hugging Face
transformers in float32 on the same windows: the text encoded with the model directory's
tokenizer.json (no special tokens), cut into consecutive windows of --ctx tokens, each evaluated
on its own, every position but a window's first predicting the next token; perplexity =
exp(mean NLL). ModelOpt NVFP4 checkpoints are dequantized exactly (E2M1 * weight_scale *
weight_scale_2) first, since transformers has no ModelOpt NVFP4 loader.

    /work/venv/bin/python tools/perplexity_ref.py --model models/builtin --text-file tests/data/heldout.txt --ctx 1025
"""
import argparse
import json
import math
import os

import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def load_state(model_dir):
    """Every tensor of the checkpoint as float32, NVFP4 linears dequantized."""
    files = [f for f in os.listdir(model_dir) if f.endswith(".safetensors")]
    raw = {}
    for f in files:
        with safe_open(os.path.join(model_dir, f), "pt") as st:
            for k in st.keys():
                raw[k] = st.get_tensor(k)
    state = {}
    for k, v in raw.items():
        if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        p = k[: -len(".weight")] if k.endswith(".weight") else None
        if p and v.dtype == torch.uint8 and p + ".weight_scale" in raw:
            codes = torch.stack([v & 15, v >> 4], dim=-1).reshape(v.shape[0], -1).long()
            scale = raw[p + ".weight_scale"].float().repeat_interleave(16, dim=1)
            state[k] = (E2M1[codes] * scale) * raw[p + ".weight_scale_2"].float()
        else:
            state[k] = v.float()
    # transformers 5 keeps a layer's experts fused: gate_up_proj [E, 2F, D], down_proj [E, D, F]
    import re
    layers = sorted({int(m.group(1)) for k in state for m in [re.match(r"model\.layers\.(\d+)\.mlp\.experts\.0\.gate_proj\.weight$", k)] if m})
    for L in layers:
        pre = f"model.layers.{L}.mlp.experts"
        E = 0
        while f"{pre}.{E}.gate_proj.weight" in state:
            E += 1
        gu = [torch.cat([state.pop(f"{pre}.{e}.gate_proj.weight"), state.pop(f"{pre}.{e}.up_proj.weight")]) for e in range(E)]
        dn = [state.pop(f"{pre}.{e}.down_proj.weight") for e in range(E)]
        state[f"{pre}.gate_up_proj"] = torch.stack(gu)
        state[f"{pre}.down_proj"] = torch.stack(dn)
    return state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text-file", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    text = open(a.text_file, "rb").read().decode("utf-8")
    ids = tok.encode(text, add_special_tokens=False).ids
    cfg = AutoConfig.from_pretrained(a.model)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager")
    missing, unexpected = model.load_state_dict(load_state(a.model), strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing:
        raise SystemExit(f"missing tensors: {missing[:5]}")
    model.eval()
    nll, count, windows = 0.0, 0, 0
    with torch.no_grad():
        for w0 in range(0, len(ids) - 1, a.ctx):
            w = ids[w0 : w0 + a.ctx]
            if len(w) < 2:
                break
            x = torch.tensor([w])
            logp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
            nll += -logp[torch.arange(len(w) - 1), x[0, 1:]].sum().item()
            count += len(w) - 1
            windows += 1
    print(json.dumps({"perplexity": math.exp(nll / count), "nll": nll / count, "tokens": count, "windows": windows,
                      "ctx": a.ctx, "model": a.model}))


if __name__ == "__main__":
    main()
