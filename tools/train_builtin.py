#!/usr/bin/env python3
"""train_builtin.py -- train moeserve's built-in model: a ~11 M-parameter GLM-4.5-style MoE.

Dev-time tool (not run by CI). Needs torch (2.11 on the GPU machine, 2.15 here), transformers
5.x (5.17.0), tokenizers, safetensors, numpy. PYTHONUNBUFFERED-friendly (flushes every line).

GPU run (one H200; the lead runs it, from the repository root, with corpus/train.txt.xz carried):
    python3 tools/train_builtin.py --data corpus/train.txt.xz --minutes 6 --out models/builtin
CPU smoke test (5 steps on a tiny slice, saves into a temporary directory, full export + check):
    /work/venv/bin/python tools/train_builtin.py --data /work/corpus/train.txt.xz --cpu-smoke

Model (Glm4MoeForCausalLM; the numbers are the defaults, see make_config): vocab 8192, hidden 256,
6 layers (layer 0 dense SwiGLU 640, layers 1-5 MoE), 4 query heads x 64, 2 KV heads, q/k/v bias,
per-head QK RMSNorm, partial NeoX RoPE on the first 32 of 64 dims (theta 1e4), 8 routed experts
top-2 (SwiGLU 160) + 1 shared expert (160), sigmoid router with e_score_correction_bias,
norm_topk_prob, routed_scaling_factor 2.5 (as GLM-4.5, so that an engine that ignores the factor
is caught by the perplexity comparison), untied lm_head, max_position_embeddings 4096.
11.41 M parameters, 22.8 MB in BF16.

Implementation: the training forward is our own vectorised PyTorch code for exactly the maths of
transformers' models/glm4_moe/modeling_glm4_moe.py. The MoE layer evaluates all 8 routed
experts plus the shared expert for every token as two wide matmuls ([T,256]x[256,9*320] and
[T,9*160]x[9*160,256]) and multiplies each expert's activation by its gate, which is 0 for the
6 experts a token did not select (and 1 for the shared expert): the output and the gradients are
the same as a sparse dispatch (an unselected expert gets exactly zero gradient), at 4x the routed
expert FLOPs, which is cheap at this size and needs no sorting, so torch.compile gives one
static graph. The router runs in float32 like transformers'.

Expert balancing: auxiliary-loss-free, after DeepSeek-V3: after every optimiser step each MoE
layer's e_score_correction_bias[e] += rate * (mean_load - load[e]) / mean_load (load = tokens
routed to expert e in that step; --bias-rate 1e-2). DeepSeek-V3's rule is rate * sign(...) with
rate 1e-3 (--bias-update sign): in CPU trials of this model the routing collapsed onto 2 of 8
experts in every layer within the first few steps (the residual stream gains a shared direction
early) and 1e-3 per step took hundreds of steps to undo it, while the proportional rule at 1e-2
rebalanced within ~50-80 steps of warm-up and settles instead of oscillating by +-rate. The bias
only changes which experts are selected, never the gate values (transformers' semantics).
No auxiliary loss by default (--aux-loss W adds W * E * sum_e f_e P_e per MoE layer).

Training: inputs = --data (train.txt.xz from tools/build_corpus.sh: documents separated by
"<|endoftext|>" lines), decompressed and tokenised with the `tokenizers` library (all cores), an
<|endoftext|> id after every document, cached as a uint16 .npy next to the data. Batches are
random windows of --seq-len+1 tokens (default 1024) taken on the GPU. AdamW (0.9, 0.95, wd 0.1 on
matrices), linear warm-up then cosine to 10% of --lr over the WALL-CLOCK budget: the learning
rate is a function of elapsed/budget, the step loop checks the clock and stops at --minutes
(compilation happens in an untimed warm-up step before the clock starts). bf16 autocast,
float32 master weights, TF32 off.

Before exporting, the float32 training state is saved beside --data
(builtin-train-state.pt, git-ignored there; --state PATH to choose): if anything after training
fails, `--export-only PATH` redoes the export and the check without training again.

Output (--out): config.json, generation_config.json, model.safetensors (BF16; the routers'
e_score_correction_bias F32; per-expert tensors model.layers.N.mlp.experts.E.{gate,up,down}_proj
.weight), written by transformers (float32 save_pretrained -> from_pretrained(dtype=bfloat16) ->
save_pretrained); tokenizer.json / tokenizer_config.json are copied from --tokenizer if --out
lacks them. Then the check: the checkpoint is reloaded with Glm4MoeForCausalLM in float32 (eager
attention, eager experts) and its loss on held-out windows is compared with this script's
implementation on the same BF16 weights (must agree to 1e-3 relative, else exit status 3), and
the held-out perplexity is printed (non-overlapping --seq-len windows of --heldout, each scored
from its first token; every token after the first of a window is predicted).
"""
import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import lzma
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPORT_RESERVE_S = 75.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_SEP = "<|endoftext|>"
H200_BF16_PEAK = 989e12  # dense BF16 tensor-core FLOP/s (H100/H200 SXM)


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------- configuration

def make_config(a):
    """Keyword arguments of transformers' Glm4MoeConfig (also what config.json holds)."""
    return dict(
        architectures=["Glm4MoeForCausalLM"],
        vocab_size=8192, hidden_size=256, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        intermediate_size=640, moe_intermediate_size=160,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=a.routed_scaling, scoring_func="sigmoid", topk_method="noaux_tc",
        attention_bias=True, use_qk_norm=True, partial_rotary_factor=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5},
        max_position_embeddings=4096, rms_norm_eps=1e-5, hidden_act="silu",
        tie_word_embeddings=False, num_nextn_predict_layers=0, initializer_range=0.02,
        attention_dropout=0.0, use_cache=True,
        bos_token_id=None, eos_token_id=[8168, 8175, 8177], pad_token_id=8168,
    )


# ----------------------------------------------------------------------------- model

def rmsnorm(x, w, eps):
    # transformers' Glm4MoeRMSNorm: normalise in float32, cast back, times the weight
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w.to(x.dtype) * xf.to(x.dtype)


def rope_cos_sin(seq, rot, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot))
    f = torch.arange(seq, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin, rot):
    # x [B, h, S, d]; NeoX half-split rotation of the first `rot` dims
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    rh = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos.to(x.dtype) + rh * sin.to(x.dtype), xp], dim=-1)


class Layer(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd, self.eps = nh, nkv, hd, c["rms_norm_eps"]
        self.ln1 = nn.Parameter(torch.ones(H))
        self.ln2 = nn.Parameter(torch.ones(H))
        self.q = nn.Linear(H, nh * hd, bias=True)
        self.k = nn.Linear(H, nkv * hd, bias=True)
        self.v = nn.Linear(H, nkv * hd, bias=True)
        self.o = nn.Linear(nh * hd, H, bias=False)
        self.qn = nn.Parameter(torch.ones(hd))
        self.kn = nn.Parameter(torch.ones(hd))
        self.moe = moe
        if moe:
            E, I = c["n_routed_experts"], c["moe_intermediate_size"]
            assert c["n_shared_experts"] == 1 and c["n_group"] == 1
            self.E, self.I, self.K = E, I, c["num_experts_per_tok"]
            self.scale = c["routed_scaling_factor"]
            self.router = nn.Parameter(torch.empty(E, H))
            self.register_buffer("ebias", torch.zeros(E, dtype=torch.float32))
            # experts 0..E-1 routed, index E the shared expert; rows [gate(I); up(I)]
            self.w_gu = nn.Parameter(torch.empty(E + 1, 2 * I, H))
            self.w_down = nn.Parameter(torch.empty(E + 1, H, I))
        else:
            I = c["intermediate_size"]
            self.I = I
            self.w_gu = nn.Parameter(torch.empty(2 * I, H))
            self.w_down = nn.Parameter(torch.empty(H, I))

    def attn(self, x, cos, sin):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.nh, self.hd)
        k = self.k(x).view(B, S, self.nkv, self.hd)
        v = self.v(x).view(B, S, self.nkv, self.hd)
        cd = v.dtype
        q = rmsnorm(q, self.qn, self.eps).transpose(1, 2)
        k = rmsnorm(k, self.kn, self.eps).transpose(1, 2)
        v = v.transpose(1, 2)
        rot = cos.shape[-1]
        q = apply_rope(q, cos, sin, rot).to(cd)
        k = apply_rope(k, cos, sin, rot).to(cd)
        rep = self.nh // self.nkv
        k = k[:, :, None].expand(B, self.nkv, rep, S, self.hd).reshape(B, self.nh, S, self.hd)
        v = v[:, :, None].expand(B, self.nkv, rep, S, self.hd).reshape(B, self.nh, S, self.hd)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        return self.o(o.transpose(1, 2).reshape(B, S, self.nh * self.hd))

    def mlp(self, x):
        B, S, H = x.shape
        t = x.reshape(B * S, H)
        if not self.moe:
            gu = F.linear(t, self.w_gu)
            g, u = gu.split(self.I, dim=-1)
            return F.linear(F.silu(g) * u, self.w_down).view(B, S, H), None
        E, I, K = self.E, self.I, self.K
        # router in float32 (transformers: F.linear(h.float(), W.float()).sigmoid())
        with torch.autocast(device_type=t.device.type, enabled=False):
            scores = F.linear(t.float(), self.router.float()).sigmoid()
            idx = torch.topk(scores + self.ebias, K, dim=-1, sorted=False)[1]
            w = scores.gather(1, idx)
            w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.scale
            gates = torch.zeros_like(scores).scatter(1, idx, w)
            gates = torch.cat([gates, torch.ones_like(gates[:, :1])], dim=1)  # shared expert
            load = torch.zeros(E, device=t.device, dtype=torch.float32).scatter_add_(
                0, idx.reshape(-1), torch.ones(idx.numel(), device=t.device, dtype=torch.float32))
            # Switch-style balance term E * sum_e f_e * P_e (1.0 when balanced); used only when
            # --aux-loss > 0. f_e: share of the T*K assignments, P_e: mean normalised score
            p_mean = (scores / scores.sum(-1, keepdim=True)).mean(0)
            aux = E * (load / idx.numel() * p_mean).sum()
        h = F.linear(t, self.w_gu.reshape((E + 1) * 2 * I, H)).view(B * S, E + 1, 2, I)
        act = F.silu(h[:, :, 0]) * h[:, :, 1]
        act = act * gates.to(act.dtype)[:, :, None]
        wd = self.w_down.permute(0, 2, 1).reshape((E + 1) * I, H)
        out = torch.matmul(act.reshape(B * S, (E + 1) * I), wd.to(act.dtype))
        return out.view(B, S, H), (load, aux)

    def forward(self, x, cos, sin):
        x = x + self.attn(rmsnorm(x, self.ln1, self.eps), cos, sin)
        m, load = self.mlp(rmsnorm(x, self.ln2, self.eps))
        return x + m, load


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        V, H = c["vocab_size"], c["hidden_size"]
        self.embed = nn.Parameter(torch.empty(V, H))
        self.layers = nn.ModuleList(
            [Layer(c, i >= c["first_k_dense_replace"]) for i in range(c["num_hidden_layers"])])
        self.norm = nn.Parameter(torch.ones(H))
        self.head = nn.Parameter(torch.empty(V, H))
        self.rot = int(c["head_dim"] * c["partial_rotary_factor"])
        self.theta = c["rope_parameters"]["rope_theta"]

    def init_weights(self, gen):
        std = self.c["initializer_range"]
        out_std = std / math.sqrt(2 * len(self.layers))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                else:
                    nn.init.ones_(p)
            elif name.endswith("o.weight") or name.endswith("w_down"):
                nn.init.normal_(p, 0.0, out_std, generator=gen)
            else:
                nn.init.normal_(p, 0.0, std, generator=gen)

    def forward(self, ids, targets):
        B, S = ids.shape
        cos, sin = rope_cos_sin(S, self.rot, self.theta, ids.device)
        x = F.embedding(ids, self.embed)
        loads, auxs = [], []
        for layer in self.layers:
            x, la = layer(x, cos, sin)
            if la is not None:
                loads.append(la[0])
                auxs.append(la[1])
        x = rmsnorm(x, self.norm, self.c["rms_norm_eps"])
        logits = F.linear(x, self.head)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        return loss, torch.stack(loads), torch.stack(auxs)


def count_params(c):
    V, H, L = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, I, K, Id = c["n_routed_experts"], c["moe_intermediate_size"], c["num_experts_per_tok"], c["intermediate_size"]
    nd = c["first_k_dense_replace"]
    attn = H * nh * hd * 2 + H * nkv * hd * 2  # q, o, k, v matrices
    attn_all = attn + nh * hd + 2 * nkv * hd + 2 * hd + 2 * H
    expert = 3 * H * I
    total = 2 * V * H + H + L * attn_all + nd * 3 * H * Id + (L - nd) * ((E + 1) * expert + E * H)
    # matmul parameters a token actually uses (for FLOP counts): lm_head, attention, MLPs
    active = V * H + L * attn + nd * 3 * H * Id + (L - nd) * ((K + 1) * expert + E * H)
    return total, active


# ----------------------------------------------------------------------------- HF export

def to_hf_state(model):
    c = model.c
    E = c["n_routed_experts"]
    sd = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm,
          "lm_head.weight": model.head}
    for i, L in enumerate(model.layers):
        p = "model.layers.%d." % i
        sd[p + "input_layernorm.weight"] = L.ln1
        sd[p + "post_attention_layernorm.weight"] = L.ln2
        for a, m in (("q", L.q), ("k", L.k), ("v", L.v)):
            sd[p + "self_attn.%s_proj.weight" % a] = m.weight
            sd[p + "self_attn.%s_proj.bias" % a] = m.bias
        sd[p + "self_attn.o_proj.weight"] = L.o.weight
        sd[p + "self_attn.q_norm.weight"] = L.qn
        sd[p + "self_attn.k_norm.weight"] = L.kn
        if L.moe:
            I = L.I
            sd[p + "mlp.gate.weight"] = L.router
            sd[p + "mlp.gate.e_score_correction_bias"] = L.ebias
            sd[p + "mlp.experts.gate_up_proj"] = L.w_gu[:E]
            sd[p + "mlp.experts.down_proj"] = L.w_down[:E]
            sd[p + "mlp.shared_experts.gate_proj.weight"] = L.w_gu[E, :I]
            sd[p + "mlp.shared_experts.up_proj.weight"] = L.w_gu[E, I:]
            sd[p + "mlp.shared_experts.down_proj.weight"] = L.w_down[E]
        else:
            I = L.I
            sd[p + "mlp.gate_proj.weight"] = L.w_gu[:I]
            sd[p + "mlp.up_proj.weight"] = L.w_gu[I:]
            sd[p + "mlp.down_proj.weight"] = L.w_down
    return {k: v.detach().float().cpu().contiguous() for k, v in sd.items()}


def from_hf_state(model, sd):
    """Load transformers' (in-memory) state dict into our model -- the inverse of to_hf_state."""
    E = model.c["n_routed_experts"]
    with torch.no_grad():
        def put(dst, src):
            dst.copy_(src.to(dst.dtype))
        put(model.embed, sd["model.embed_tokens.weight"])
        put(model.norm, sd["model.norm.weight"])
        put(model.head, sd["lm_head.weight"])
        for i, L in enumerate(model.layers):
            p = "model.layers.%d." % i
            put(L.ln1, sd[p + "input_layernorm.weight"])
            put(L.ln2, sd[p + "post_attention_layernorm.weight"])
            for a, m in (("q", L.q), ("k", L.k), ("v", L.v)):
                put(m.weight, sd[p + "self_attn.%s_proj.weight" % a])
                put(m.bias, sd[p + "self_attn.%s_proj.bias" % a])
            put(L.o.weight, sd[p + "self_attn.o_proj.weight"])
            put(L.qn, sd[p + "self_attn.q_norm.weight"])
            put(L.kn, sd[p + "self_attn.k_norm.weight"])
            if L.moe:
                I = L.I
                put(L.router, sd[p + "mlp.gate.weight"])
                put(L.ebias, sd[p + "mlp.gate.e_score_correction_bias"])
                put(L.w_gu[:E], sd[p + "mlp.experts.gate_up_proj"])
                put(L.w_down[:E], sd[p + "mlp.experts.down_proj"])
                put(L.w_gu[E, :I], sd[p + "mlp.shared_experts.gate_proj.weight"])
                put(L.w_gu[E, I:], sd[p + "mlp.shared_experts.up_proj.weight"])
                put(L.w_down[E], sd[p + "mlp.shared_experts.down_proj.weight"])
            else:
                I = L.I
                put(L.w_gu[:I], sd[p + "mlp.gate_proj.weight"])
                put(L.w_gu[I:], sd[p + "mlp.up_proj.weight"])
                put(L.w_down, sd[p + "mlp.down_proj.weight"])


def export_hf(model, cfg, out, tokenizer_dir):
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM, GenerationConfig
    hc = Glm4MoeConfig(**cfg)
    hf = Glm4MoeForCausalLM(hc).float()
    sd = to_hf_state(model)
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise SystemExit("state-dict mapping mismatch: missing %s unexpected %s" % (missing, unexpected))
    hf.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=cfg["eos_token_id"],
                                            pad_token_id=cfg["pad_token_id"])
    with tempfile.TemporaryDirectory() as tmp:
        f32, bf = os.path.join(tmp, "f32"), os.path.join(tmp, "bf16")
        hf.save_pretrained(f32)
        Glm4MoeForCausalLM.from_pretrained(f32, dtype=torch.bfloat16).save_pretrained(bf)
        os.makedirs(out, exist_ok=True)
        for fn in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copy(os.path.join(bf, fn), os.path.join(out, fn))
            os.chmod(os.path.join(out, fn), 0o644)
    for fn in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        src = os.path.join(tokenizer_dir, fn)
        if os.path.exists(src) and not os.path.exists(os.path.join(out, fn)):
            shutil.copy(src, os.path.join(out, fn))
    # inventory of what was written
    from safetensors import safe_open
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        dts = {}
        for k in keys:
            dts.setdefault(str(f.get_slice(k).get_dtype()), []).append(k)
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in keys, "per-expert names expected"
    assert all("e_score_correction_bias" in k for k in dts.get("F32", [])), dts.get("F32")
    assert len(dts.get("F32", [])) == cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    log("saved %s: %d tensors (%s), model.safetensors %.2f MB" % (
        out, len(keys), ", ".join("%s %d" % (k, len(v)) for k, v in sorted(dts.items())),
        os.path.getsize(os.path.join(out, "model.safetensors")) / 1e6))


# ----------------------------------------------------------------------------- data

def read_docs(path, limit_bytes=None):
    op = lzma.open if path.endswith(".xz") else open
    with op(path, "rt", encoding="utf-8") as f:
        text = f.read(limit_bytes) if limit_bytes else f.read()
    docs = [d.strip("\n") for d in text.split("\n" + DOC_SEP + "\n")]
    if limit_bytes:
        docs = docs[:-1] or docs  # last one may be cut
    return [d for d in docs if d]


def tokenize_docs(tok, docs, eos):
    enc = tok.encode_batch(docs, add_special_tokens=False)
    n = sum(len(e.ids) + 1 for e in enc)
    arr = np.empty(n, dtype=np.uint16)
    o = 0
    for e in enc:
        k = len(e.ids)
        arr[o:o + k] = e.ids
        arr[o + k] = eos
        o += k + 1
    return arr


def load_tokens(a, tok, eos):
    import hashlib
    th = hashlib.sha1(open(os.path.join(a.tokenizer, "tokenizer.json"), "rb").read()).hexdigest()[:10]
    st = os.stat(a.data)
    cache = "%s.%s-%d-%d%s.u16.npy" % (a.data, th, st.st_size, int(st.st_mtime),
                                       "-smoke" if a.cpu_smoke else "")
    if os.path.exists(cache) and not a.cpu_smoke:
        arr = np.load(cache)
        log("data: %d tokens from cache %s" % (len(arr), cache))
        return arr
    t0 = time.time()
    docs = read_docs(a.data, limit_bytes=400_000 if a.cpu_smoke else None)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    t1 = time.time()
    arr = tokenize_docs(tok, docs, eos)
    log("data: %d documents, %.1f MB text, %d tokens (%.3f bytes/token); read %.1f s, "
        "tokenised %.1f s" % (len(docs), nbytes / 1e6, len(arr), nbytes / len(arr), t1 - t0,
                              time.time() - t1))
    if not a.cpu_smoke:
        try:
            np.save(cache, arr)
        except OSError as e:
            log("data: could not write cache %s: %s" % (cache, e))
    return arr


def heldout_windows(tok, path, seq, eos):
    text = open(path, encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids
    n = len(ids) // (seq + 1)
    if n == 0:
        raise SystemExit("held-out text %s too short for --seq-len %d" % (path, seq))
    w = torch.tensor(ids[: n * (seq + 1)], dtype=torch.long).view(n, seq + 1)
    return w, len(ids)


# ----------------------------------------------------------------------------- train

def lr_at(progress, a):
    if progress < a.warmup:
        return a.lr * max(progress, 1e-4) / a.warmup
    p = min(1.0, (progress - a.warmup) / max(1e-9, 1.0 - a.warmup))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def eval_loss(model, windows, device, bs, autocast):
    tot, n = 0.0, 0
    for i in range(0, len(windows), bs):
        w = windows[i:i + bs].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, _, _ = model(w[:, :-1], w[:, 1:])
        k = w[:, 1:].numel()
        tot += float(loss) * k
        n += k
    return tot / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "corpus/train.txt.xz"))
    ap.add_argument("--heldout", default=os.path.join(REPO, "tests/data/heldout.txt"))
    ap.add_argument("--tokenizer", default=os.path.join(REPO, "models/builtin"))
    ap.add_argument("--out", default=os.path.join(REPO, "models/builtin"))
    ap.add_argument("--minutes", type=float, default=6.0, help="wall-clock budget of the step loop")
    ap.add_argument("--max-total-minutes", type=float, default=9.0,
                    help="the step loop is shortened so that the whole run ends within this")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=float, default=0.03, help="fraction of the budget")
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--bias-rate", type=float, default=1e-2, help="e_score_correction_bias step")
    ap.add_argument("--bias-update", choices=["prop", "sign"], default="prop",
                    help="prop: rate*(mean-load)/mean; sign: rate*sign(mean-load) (DeepSeek-V3)")
    ap.add_argument("--aux-loss", type=float, default=0.0,
                    help="weight of a Switch-style balance loss per MoE layer (0: none)")
    ap.add_argument("--routed-scaling", type=float, default=2.5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--evals", type=int, default=6, help="held-out evaluations during training")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps too (0: clock only)")
    ap.add_argument("--check-windows", type=int, default=0,
                    help="held-out windows for the final perplexity check (0: all)")
    ap.add_argument("--state", default="",
                    help="where the float32 training state is saved (default: beside --data)")
    ap.add_argument("--export-only", default="", metavar="STATE",
                    help="skip training: export + check the weights of a saved training state")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="5 steps on a tiny slice on the CPU, saved to a temporary directory")
    a = ap.parse_args()

    smoke_tmp = None
    if a.cpu_smoke:
        smoke_tmp = tempfile.mkdtemp(prefix="builtin-smoke-")
        if a.out == os.path.join(REPO, "models/builtin"):
            a.out = smoke_tmp
        a.seq_len, a.batch, a.max_steps, a.log_every, a.evals = 128, 4, 5, 1, 1
        a.check_windows = 12
        a.no_compile = True
        a.minutes = min(a.minutes, 2.0)
    device = torch.device("cpu" if a.cpu_smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not a.cpu_smoke:
        log("WARNING: no CUDA device; training on the CPU")
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    cfg = make_config(a)
    eos = tok.token_to_id(DOC_SEP)
    assert eos == cfg["pad_token_id"] and tok.get_vocab_size() == cfg["vocab_size"]
    log("torch %s, device %s%s; out %s" % (torch.__version__, device,
                                           " (%s)" % torch.cuda.get_device_name() if device.type == "cuda" else "",
                                           a.out))

    held, n_held = heldout_windows(tok, a.heldout, a.seq_len, eos)
    log("held-out: %s, %d tokens -> %d windows of %d" % (a.heldout, n_held, len(held), a.seq_len + 1))
    if a.export_only:
        st = torch.load(a.export_only, map_location="cpu")
        cfg = st["config"]
        model = Model(cfg)
        model.load_state_dict(st["state"])
        model.to(device)
        log("export-only: %s (%d steps, %.1f M tokens)" % (a.export_only, st["steps"], st["tokens"] / 1e6))
        finish(a, cfg, model, held, device, smoke_tmp)
        return
    data = load_tokens(a, tok, eos)
    data_t = torch.from_numpy(data.astype(np.int32)).to(device)
    N = len(data)
    if N < a.seq_len + 2:
        raise SystemExit("not enough data")

    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    model = Model(cfg)
    model.init_weights(gen)  # on the CPU, so that the draw does not depend on the device
    model.to(device)
    total, active = count_params(cfg)
    n_real = sum(p.numel() for p in model.parameters())
    assert n_real == total, (n_real, total)
    # training FLOPs/token: 6 x matmul params used by a token + causal attention (QK^T and PV)
    L, S = cfg["num_hidden_layers"], a.seq_len
    flops_tok = 6 * active + 6 * L * S * cfg["num_attention_heads"] * cfg["head_dim"]
    log("model: %.3f M parameters (%.2f MB in BF16), %.3f M matmul parameters active per token; "
        "%.1f MFLOP/token for training" % (total / 1e6, total * 2 / 1e6, active / 1e6, flops_tok / 1e6))

    decay, no_decay = [], []
    for n_, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt_kw = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        opt_kw["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kw)

    fwd = model
    if not a.no_compile:
        try:
            fwd = torch.compile(model)
        except Exception as e:  # noqa: BLE001
            log("torch.compile unavailable (%s); eager" % e)
            fwd = model
    bgen = torch.Generator(device=device).manual_seed(a.seed + 1)
    ar = torch.arange(a.seq_len + 1, device=device)
    ebias = [l.ebias for l in model.layers if l.moe]
    autocast = True

    def batch():
        off = torch.randint(0, N - a.seq_len - 1, (a.batch, 1), device=device, generator=bgen)
        w = data_t[off + ar].long()
        return w[:, :-1], w[:, 1:]

    def step(x, y, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, load, aux = fwd(x, y)
        (loss + a.aux_loss * aux.sum() if a.aux_loss > 0 else loss).backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            if a.bias_rate > 0:
                for b, ld in zip(ebias, load):
                    err = ld.mean() - ld
                    b.add_(a.bias_rate * (torch.sign(err) if a.bias_update == "sign" else err / ld.mean()))
        return loss, gn, load

    # untimed warm-up: compile forward+backward (no optimiser step, grads dropped)
    t0 = time.time()
    x, y = batch()
    try:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, _, _ = fwd(x, y)
        loss.backward()
    except Exception as e:  # noqa: BLE001
        if fwd is model:
            raise
        log("torch.compile failed (%s: %s); falling back to eager" % (type(e).__name__, str(e)[:300]))
        fwd = model
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, _, _ = fwd(x, y)
        loss.backward()
    opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    log("warm-up (compile=%s) %.1f s, initial loss %.4f (ln V = %.4f)" % (
        fwd is not model, time.time() - t0, loss.item(), math.log(cfg["vocab_size"])))

    budget = a.minutes * 60.0
    # never run past --max-total-minutes of the whole script (the device command limit): keep
    # EXPORT_RESERVE_S for the held-out evaluation, export and check
    left = a.max_total_minutes * 60.0 - (time.time() - T_START) - EXPORT_RESERVE_S
    if left < budget:
        log("budget cut from %.0f s to %.0f s to finish within --max-total-minutes %.1f" % (
            budget, max(left, 0), a.max_total_minutes))
        budget = max(left, 1.0)
    tok_step = a.batch * a.seq_len
    eval_marks = [(i + 1) / (a.evals + 1) for i in range(a.evals)] if a.evals else []
    start = time.time()
    last_t, last_step = start, 0
    step_i = 0
    loss_acc = []
    while True:
        el = time.time() - start
        if el >= budget or (a.max_steps and step_i >= a.max_steps):
            break
        progress = el / budget
        lr = lr_at(progress, a)
        x, y = batch()
        loss, gn, load = step(x, y, lr)
        step_i += 1
        loss_acc.append(loss.detach())
        if step_i % a.log_every == 0:
            ls = float(torch.stack(loss_acc).mean())
            loss_acc = []
            now = time.time()
            if device.type == "cuda":
                torch.cuda.synchronize()
                now = time.time()
            tps = (step_i - last_step) * tok_step / (now - last_t)
            last_t, last_step = now, step_i
            ld = load.float()
            imb = float((ld.max(-1).values / ld.mean(-1)).max())
            bmax = max(float(b.abs().max()) for b in ebias)
            mfu = (" MFU %.1f%%" % (100 * tps * flops_tok / H200_BF16_PEAK)) if device.type == "cuda" else ""
            log("step %6d  %5.1f%%  loss %.4f  lr %.2e  gnorm %.2f  %8.0f tok/s%s  "
                "load max/mean %.2f  |bias| %.3f  tokens %.1f M" % (
                    step_i, 100 * progress, ls, lr, float(gn), tps, mfu, imb, bmax,
                    step_i * tok_step / 1e6))
        while eval_marks and progress >= eval_marks[0]:
            eval_marks.pop(0)
            hl = eval_loss(model, held, device, max(1, a.batch // 2), autocast)
            log("eval  step %d: held-out loss %.4f  ppl %.2f" % (step_i, hl, math.exp(hl)))
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.time() - start
    ntok = step_i * tok_step
    log("trained %d steps, %.1f M tokens (%.2f epochs of %.1f M) in %.1f s: %.0f tok/s" % (
        step_i, ntok / 1e6, ntok / N, N / 1e6, train_s, ntok / max(train_s, 1e-9)))
    # float32 weights saved before anything else can fail (--export-only reuses them)
    state_path = a.state or os.path.join(os.path.dirname(os.path.abspath(a.data)),
                                         "builtin-train-state%s.pt" % ("-smoke" if a.cpu_smoke else ""))
    try:
        torch.save({"config": cfg, "state": model.state_dict(), "steps": step_i, "tokens": ntok},
                   state_path)
        log("saved float32 training state to %s" % state_path)
    except OSError as e:
        log("could not save the training state to %s: %s" % (state_path, e))
    hl = eval_loss(model, held, device, max(1, a.batch // 2), autocast)
    log("final held-out loss (bf16 autocast, our implementation) %.4f  ppl %.2f" % (hl, math.exp(hl)))
    finish(a, cfg, model, held, device, smoke_tmp)


def finish(a, cfg, model, held, device, smoke_tmp=None):
    # ---------------------------------------------------------------- export + check
    export_hf(model, cfg, a.out, a.tokenizer)
    ok = check(a, cfg, held, device)
    if smoke_tmp:
        log("cpu-smoke: output left in %s" % a.out)
    sys.exit(0 if ok else 3)


def check(a, cfg, held, device):
    from transformers import Glm4MoeForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    hf = Glm4MoeForCausalLM.from_pretrained(a.out, dtype=torch.float32, attn_implementation="eager",
                                            experts_implementation="eager").to(device).eval()
    mine = Model(cfg).to(device).eval()
    from_hf_state(mine, hf.state_dict())  # BF16 values from the file, as float32
    nb = min(len(held), 8)
    w = held[:nb].to(device)
    with torch.no_grad():
        hf_loss = float(hf(input_ids=w[:, :-1], labels=w[:, :-1].clone()).loss)
        # transformers shifts labels itself: compare like with like (its loss over positions 0..S-2)
        my_loss_same = float(mine(w[:, :-2], w[:, 1:-1])[0])
        hf_full = []
        my_full = []
        for i in range(a.check_windows or len(held)):
            wi = held[i:i + 1].to(device)
            logits = hf(input_ids=wi[:, :-1]).logits.float()
            hf_full.append(float(F.cross_entropy(logits[0], wi[0, 1:])))
            my_full.append(float(mine(wi[:, :-1], wi[:, 1:])[0]))
    rel = abs(hf_loss - my_loss_same) / abs(hf_loss)
    hf_ppl = math.exp(sum(hf_full) / len(hf_full))
    my_ppl = math.exp(sum(my_full) / len(my_full))
    ok = rel < 1e-3 and abs(hf_ppl - my_ppl) / hf_ppl < 1e-3
    log("check: reloaded %s with transformers Glm4MoeForCausalLM (float32, eager)" % a.out)
    log("check: held-out batch (%d x %d tokens): transformers loss %.6f, ours %.6f, rel diff %.2e -> %s"
        % (nb, w.shape[1] - 2, hf_loss, my_loss_same, rel, "OK" if rel < 1e-3 else "MISMATCH"))
    log("check: held-out perplexity of the BF16 checkpoint (float32 compute, %d windows of %d "
        "tokens): transformers %.4f, ours %.4f" % (len(hf_full), a.seq_len, hf_ppl, my_ppl))
    try:
        from transformers import AutoTokenizer
        t = AutoTokenizer.from_pretrained(a.out)
        for prompt in ["The Debian package management system", "In this chapter we"]:
            ids = t(prompt, return_tensors="pt").input_ids.to(device)
            g = hf.generate(ids, max_new_tokens=40, do_sample=False)
            log("sample (greedy): %r" % t.decode(g[0], skip_special_tokens=False))
    except Exception as e:  # noqa: BLE001
        log("sample generation failed: %s" % e)
    return ok


if __name__ == "__main__":
    main()
