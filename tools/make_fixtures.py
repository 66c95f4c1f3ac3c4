#!/usr/bin/env python3
"""make_fixtures.py -- golden test fixtures for moeserve (dev-time tool, not run by CI).

What it does
    Builds small random GLM-5 (glm_moe_dsa) and GLM-4.5 (glm4_moe) checkpoints with
    transformers, writes them the way transformers / ModelOpt would (BF16 safetensors with
    per-expert tensors; ModelOpt NVFP4 with U8 weights + F8_E4M3 block scales + F32 scalars),
    and records float32 reference logits for every position of a random prompt:
    model(input_ids).logits with the model in float32, eager attention, eager experts,
    no cache, batch 1.

    Fixtures (one directory each under --out):
      glm5-bf16         GlmMoeDsaForCausalLM, BF16, DSA index_topk 8 < prompt length
      glm5-shared-bf16  same shapes, IndexShare: indexer_types F,S,S,F (shared layers carry
                        no indexer weights and reuse the previous full layer's top-k)
      glm5-nvfp4        glm5-bf16's weights quantised to ModelOpt NVFP4, hf_quant_config.json
      glm4moe-bf16      Glm4MoeForCausalLM, BF16, GQA + QK-norm + partial NeoX RoPE,
                        group-limited routing (n_group 4, topk_group 2)
      glm4moe-nvfp4     glm4moe-bf16's weights quantised to NVFP4, described by
                        config.json "quantization_config" (no hf_quant_config.json)

    The reference logits of an NVFP4 fixture come from the same transformers model with
    every quantised linear weight replaced by the exact float32 dequantisation
    E2M1(code) * float(weight_scale) * weight_scale_2 of what was written.

    Discrimination: weights are drawn wider than transformers' init (normal, std =
    gain/sqrt(fan_in)), norm weights 1 + 0.3*N, biases and e_score_correction_bias random;
    quantisable weights get a per-16-block magnitude texture plus one zero / one 2^-16 / one
    2^-20 block per matrix, so the NVFP4 files exercise F8_E4M3 scales over many binades,
    subnormal scales, the 2^-9 clamp and the all-zero-block scale 1.0.
    During the reference run every top-k transformers takes is recomputed from inside the
    modules (forward hooks) and must have a clear gap between the k-th and (k+1)-th score:
      router expert top-k (scores + bias after group masking), router group top-k
      (group scores = sum of top-2), DSA indexer top-k (rows with > index_topk causal keys).
    gap_rel = (v[k-1] - v[k]) / max|v| over the finite scores of that row; a draw is
    accepted only if every gap_rel >= --min-rel-gap (default 2e-3) for the BF16 model AND
    (for families with an NVFP4 variant) for the dequantised NVFP4 model, and if the
    e_score_correction_bias / group masking / DSA selection each change at least one
    selection and move the logits by >= 1e-2 * std. Otherwise the next sub-seed is drawn.

How to run (CPU only, a few minutes; most of it is re-drawing glm5 until all gaps pass):
    /work/venv/bin/python tools/make_fixtures.py --out tests/data/golden
    options: --seed N (default 20260501)  --only NAME (repeatable or comma separated)
             --min-rel-gap X  --max-redraws N  --prompt-len T  --verbose
             --check  (no regeneration: recompute every fixture's logits with the independent
                       numpy float64 forward spec_forward and compare with golden)
Needs: torch, transformers 5.x (5.17.0 used), safetensors, numpy.
"""

import argparse
import copy
import json
import math
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM, GlmMoeDsaConfig, GlmMoeDsaForCausalLM

torch.set_num_threads(1)  # reproducible CPU reductions

# --------------------------------------------------------------------------------------------
# configurations
# --------------------------------------------------------------------------------------------

ROPE_THETA = 10000.0

GLM5_KW = dict(
    vocab_size=512, hidden_size=128, num_hidden_layers=4, first_k_dense_replace=1,
    num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
    index_n_heads=8, index_head_dim=32, index_topk=8,
    n_routed_experts=16, num_experts_per_tok=4, n_group=1, topk_group=1, norm_topk_prob=True,
    moe_intermediate_size=32, intermediate_size=96, n_shared_experts=1, routed_scaling_factor=2.5,
    rope_parameters={"rope_theta": ROPE_THETA, "rope_type": "default"},
    rms_norm_eps=1e-5, max_position_embeddings=4096, attention_bias=False,
    bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False,
    # release-config fields transformers 5.17 does not use (it always applies interleaved RoPE,
    # sigmoid noaux_tc routing); written so the files look like the real GLM-5 config.json
    rope_interleave=True, indexer_rope_interleave=True, scoring_func="sigmoid",
    topk_method="noaux_tc", num_nextn_predict_layers=0,
)

GLM5_SHARED_KW = dict(GLM5_KW, index_topk_freq=3, index_skip_topk_offset=1)  # -> F,S,S,F

GLM4_KW = dict(
    vocab_size=512, hidden_size=128, num_hidden_layers=4, first_k_dense_replace=1,
    num_attention_heads=8, num_key_value_heads=2, head_dim=32,
    rope_parameters={"rope_theta": ROPE_THETA, "rope_type": "default", "partial_rotary_factor": 0.5},
    attention_bias=True, use_qk_norm=True,
    n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True,
    moe_intermediate_size=32, intermediate_size=96, n_shared_experts=1, routed_scaling_factor=2.5,
    rms_norm_eps=1e-5, max_position_embeddings=4096, tie_word_embeddings=False,
    bos_token_id=None, eos_token_id=1, pad_token_id=None, num_mtp_layers=0,
    scoring_func="sigmoid", topk_method="noaux_tc",
)

# weight-draw parameters (see draw_weights)
DRAW = dict(
    gain=1.0,          # nn.Linear / expert weights: N(0, (gain/sqrt(fan_in))^2)
    gain_lm=2.0,       # lm_head: N(0, (gain_lm/sqrt(H))^2)  -> logits std ~ O(1..few)
    gain_router=1.5,   # router: N(0, (gain_router/sqrt(H))^2) -> sigmoid spread over (0, 1)
    norm_std=0.3,      # RMSNorm / LayerNorm weights 1 + norm_std*N
    bias_std=0.3,      # linear / LayerNorm biases N(0, bias_std^2)
    ebias_std=0.15,    # e_score_correction_bias N(0, ebias_std^2)
)

FAMILIES = {
    # family: (model class, config class, config kwargs, fixtures produced)
    "glm5": (GlmMoeDsaForCausalLM, GlmMoeDsaConfig, GLM5_KW, ["glm5-bf16", "glm5-nvfp4"]),
    "glm5-shared": (GlmMoeDsaForCausalLM, GlmMoeDsaConfig, GLM5_SHARED_KW, ["glm5-shared-bf16"]),
    "glm4moe": (Glm4MoeForCausalLM, Glm4MoeConfig, GLM4_KW, ["glm4moe-bf16", "glm4moe-nvfp4"]),
}
FAMILY_CODE = {"glm5": 1, "glm5-shared": 2, "glm4moe": 3}
ALL_FIXTURES = [f for fam in FAMILIES.values() for f in fam[3]]

MODELOPT_VERSION = "0.x (emulated by tools/make_fixtures.py)"
SPEC_TOL = 1e-4  # max|numpy float64 spec_forward - golden| / std accepted (observed ~4e-6)

# --------------------------------------------------------------------------------------------
# NVFP4 (ModelOpt) quantisation, as NVIDIA/Model-Optimizer's NVFP4QTensor
# (modelopt/torch/quantization/qtensor/nvfp4_tensor.py) does it
# --------------------------------------------------------------------------------------------

E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                           dtype=torch.float32)
E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
FP4_GLOBAL = 6.0 * 448.0  # 2688


def cast_e2m1(x: torch.Tensor) -> torch.Tensor:
    """float32 -> 4-bit code (uint8), round half to even, saturating at +-6 (ModelOpt _cast_fp4)."""
    sign = (x < 0).to(torch.uint8)
    a = x.abs()
    code = torch.searchsorted(E2M1_BOUNDS, a, right=False).to(torch.uint8)
    # a tie exactly at 0.75 / 1.75 / 3.5 goes up to the even-mantissa neighbour (1.0, 2.0, 4.0);
    # ties at 0.25 / 1.25 / 2.5 / 5 stay at the lower (even) neighbour via searchsorted(left).
    odd = ((a == 0.75) | (a == 1.75) | (a == 3.5)).to(torch.uint8)
    return (sign << 3) + code + odd


def nvfp4_quantize(w: torch.Tensor, amax: torch.Tensor):
    """w: float32 [N, K] (BF16 values), amax: float32 0-d (the tensor amax, or the synced gate/up amax).
    Returns packed U8 [N, K/2], F8_E4M3 scales [N, K/16], F32 0-d weight_scale_2."""
    n, k = w.shape
    assert k % 16 == 0, (n, k)
    ws2 = (amax.float() / FP4_GLOBAL).reshape(())
    blocks = w.float().view(n, k // 16, 16)
    bamax = blocks.abs().amax(dim=-1)
    s = bamax / (6.0 * ws2)
    s[s == 0] = 1.0
    s8 = s.clamp(min=2.0 ** -9, max=448.0).to(torch.float8_e4m3fn)
    scaled = blocks / (s8.to(torch.float32) * ws2).unsqueeze(-1)
    codes = cast_e2m1(scaled.view(n, k))
    packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed.contiguous(), s8.contiguous(), ws2.clone()


def nvfp4_dequantize(packed: torch.Tensor, s8: torch.Tensor, ws2: torch.Tensor) -> torch.Tensor:
    """Exact float32 dequantisation: (E2M1 * float(scale)) * scale_2 (E2M1*scale is exact in fp32)."""
    n = packed.shape[0]
    codes = torch.empty((n, packed.shape[1] * 2), dtype=torch.long)
    codes[:, 0::2] = (packed & 0x0F).long()
    codes[:, 1::2] = (packed >> 4).long()
    vals = E2M1_VALUES[codes].view(n, -1, 16)
    return ((vals * s8.to(torch.float32).unsqueeze(-1)) * ws2).view(n, -1)


# --------------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------------

def bf16_round(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def draw_weights(model, gen: torch.Generator):
    """Overwrite every parameter / persistent buffer with a discriminating random draw.
    All values are BF16-representable except e_score_correction_bias (kept F32 like HF)."""
    H = model.config.hidden_size
    d = DRAW

    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    with torch.no_grad():
        for name, p in model.named_parameters():
            shp = tuple(p.shape)
            if name.endswith("embed_tokens.weight"):
                v = normal(shp, 1.0)
            elif name == "lm_head.weight":
                v = normal(shp, d["gain_lm"] / math.sqrt(H))
            elif name.endswith("mlp.gate.weight"):
                v = normal(shp, d["gain_router"] / math.sqrt(H))
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                v = block_texture(normal(shp, d["gain"] / math.sqrt(shp[-1])), gen)
            elif p.dim() == 2:
                v = block_texture(normal(shp, d["gain"] / math.sqrt(shp[1])), gen)
            elif p.dim() == 1 and name.endswith(".weight"):
                v = 1.0 + normal(shp, d["norm_std"])
            elif p.dim() == 1 and name.endswith(".bias"):
                v = normal(shp, d["bias_std"])
            else:
                raise RuntimeError(f"no draw rule for {name} {shp}")
            p.copy_(bf16_round(v))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(normal(tuple(b.shape), d["ebias_std"]))


def block_texture(w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Give a [..., N, K] linear weight (each [N, K] matrix separately, RMS preserved) NVFP4-relevant
    structure: every 16-element block along K is scaled by 2^-U, U ~ U[0, 3], so the F8_E4M3 block
    scales span several binades; plus, per matrix, one all-zero block (ModelOpt stores scale 1.0),
    one block at 2^-16 of its size (F8_E4M3 subnormal scale) and one at 2^-20 (scale clamped to 2^-9)."""
    *lead, n, k = w.shape
    nb = k // 16
    B = int(np.prod(lead)) if lead else 1
    m = torch.pow(2.0, -3.0 * torch.rand((B, n * nb), generator=gen))
    for factor in (0.0, 2.0 ** -16, 2.0 ** -20):
        pos = torch.randint(0, n * nb, (B, 1), generator=gen)
        m.scatter_(1, pos, factor)
    wb = w.reshape(B, n, nb, 16)
    out = wb * m.view(B, n, nb, 1)
    rms_in = wb.pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt()
    rms_out = out.pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt()
    return (out * (rms_in / rms_out)).reshape(w.shape)


def eager(cfg):
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


# --------------------------------------------------------------------------------------------
# reference run with top-k gap checks
# --------------------------------------------------------------------------------------------

def sorted_gap(v: torch.Tensor, k: int):
    """v: [R, n] scores with -inf for excluded entries.  Returns rel gap per row (inf when no
    (k+1)-th finite entry exists)."""
    vs = torch.sort(v.double(), dim=-1, descending=True).values
    finite = torch.isfinite(vs)
    scale = torch.where(finite, vs.abs(), torch.zeros_like(vs)).amax(dim=-1).clamp_min(1e-30)
    kth, nxt = vs[:, k - 1], vs[:, k]
    gap = torch.where(torch.isfinite(nxt), kth - nxt, torch.full_like(kth, float("inf")))
    return gap / scale, gap


def same_sets(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(torch.sort(a.long(), dim=-1).values, torch.sort(b.long(), dim=-1).values))


class Recorder:
    """Forward hooks on routers and DSA indexers; recompute the scores transformers takes top-k of."""

    def __init__(self, model, fail_below=None):
        self.model = model
        self.fail_below = fail_below  # raise EarlyReject as soon as a gap is below this
        self.handles = []
        self.rows = {"expert": [], "group": [], "indexer": []}
        self.mismatch = []
        self.bias_changes = 0
        self.group_changes = 0
        self.router_rows = 0
        self.idx_zero_frac = []
        self.idx_boundary_zero = 0
        self.idx_rows = 0
        self.idx_short_rows_ok = True
        for name, mod in model.named_modules():
            cls = type(mod).__name__
            if cls.endswith("TopkRouter"):
                self.handles.append(mod.register_forward_hook(self._router_hook(name)))
            elif cls.endswith("Indexer"):
                self.handles.append(mod.register_forward_hook(self._indexer_hook(name), with_kwargs=True))

    def remove(self):
        for h in self.handles:
            h.remove()

    def _router_hook(self, name):
        def hook(mod, args, out):
            h = args[0].reshape(-1, mod.hidden_dim)
            _, _, tk_idx = out
            logits = F.linear(h.float(), mod.weight.float())
            s = logits.sigmoid()
            c = s + mod.e_score_correction_bias
            E, G, TG, K = mod.num_experts, mod.num_group, mod.topk_group, mod.top_k

            def select(c_):
                if G > 1:
                    gs = c_.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
                    gidx = gs.topk(TG, dim=-1)[1]
                    gmask = torch.zeros_like(gs).scatter_(1, gidx, 1.0).bool()
                    emask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
                    cm = c_.masked_fill(~emask, float("-inf"))
                else:
                    gs, cm = None, c_
                return gs, cm, cm.topk(K, dim=-1)[1]

            gs, cm, idx = select(c)
            if not same_sets(idx, tk_idx):
                self.mismatch.append(f"{name}: router recomputation differs from transformers")
            rel, _ = sorted_gap(cm, K)
            self.rows["expert"].append(rel)
            self._maybe_fail(rel, "expert")
            if G > 1 and TG < G:
                grel, _ = sorted_gap(gs, TG)
                self.rows["group"].append(grel)
                self._maybe_fail(grel, "group")
                _, _, idx_nogroup = select_nogroup(c, K)
                self.group_changes += int((~row_sets_equal(idx, idx_nogroup)).sum())
            _, _, idx_nobias = select(s)
            self.bias_changes += int((~row_sets_equal(idx, idx_nobias)).sum())
            self.router_rows += h.shape[0]
        return hook

    def _indexer_hook(self, name):
        def hook(mod, args, kwargs, out):
            hs, q_resid, pos_emb = args[0], args[1], args[2]
            assert hs.shape[0] == 1, "batch 1 only"
            from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave
            B, S, _ = hs.shape
            cos, sin = pos_emb
            q = mod.wq_b(q_resid).view(B, S, mod.n_heads, mod.head_dim)
            r = mod.qk_rope_head_dim
            q_rot, q_pass = torch.split(q, [r, mod.head_dim - r], dim=-1)
            k = mod.k_norm(mod.wk(hs)).unsqueeze(2)
            k_rot, k_pass = torch.split(k, [r, mod.head_dim - r], dim=-1)
            q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
            q = torch.cat([q_rot, q_pass], dim=-1)
            k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
            sc = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
            w = mod.weights_proj(hs.to(mod.weights_proj.weight.dtype)).float() * (mod.n_heads ** -0.5)
            I = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]  # [S, S]
            causal = torch.ones(S, S, dtype=torch.bool).tril()
            I = I.masked_fill(~causal, float("-inf"))
            topk = mod.index_topk
            out_idx = out[0].long()  # [S, min(topk, S)]
            long_rows = torch.arange(S) + 1 > topk
            if long_rows.any():
                my = I[long_rows].topk(topk, dim=-1)[1]
                if not same_sets(my, out_idx[long_rows]):
                    self.mismatch.append(f"{name}: indexer recomputation differs from transformers")
                rel, _ = sorted_gap(I[long_rows], topk)
                self.rows["indexer"].append(rel)
                self._maybe_fail(rel, "indexer")
                vs = torch.sort(I[long_rows], dim=-1, descending=True).values
                self.idx_boundary_zero += int(((vs[:, topk - 1] == 0) & (vs[:, topk] == 0)).sum())
                self.idx_rows += int(long_rows.sum())
            fin = I[torch.isfinite(I)]
            self.idx_zero_frac.append(float((fin == 0).float().mean()))
            for s_ in range(S):  # short rows: every causal key must be selected
                if s_ + 1 <= topk:
                    got = set(out_idx[s_].tolist())
                    if not set(range(s_ + 1)) <= got:
                        self.idx_short_rows_ok = False
        return hook

    def _maybe_fail(self, rel, kind):
        if self.fail_below is not None and float(rel.min()) < self.fail_below:
            raise EarlyReject(kind)

    def summary(self):
        res = {}
        for kind, lst in self.rows.items():
            if lst:
                v = torch.cat(lst)
                res[kind] = {"rows": int(v.numel()), "min_rel_gap": float(v.min())}
        return res


def select_nogroup(c, K):
    return None, c, c.topk(K, dim=-1)[1]


def row_sets_equal(a, b):
    return (torch.sort(a, dim=-1).values == torch.sort(b, dim=-1).values).all(dim=-1)


class EarlyReject(Exception):
    pass


def run_reference(model, tokens, check=True, fail_below=None):
    """float32 forward, no cache, batch 1.  Returns (logits [T, V], Recorder or None);
    logits is None when fail_below was given and a top-k gap fell below it (early reject)."""
    rec = Recorder(model, fail_below) if check else None
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()
    except EarlyReject as e:
        logits = None
        rec.early_kind = str(e)
    finally:
        if rec is not None:
            rec.remove()
    return logits, rec


def logits_delta(model, tokens, ref, mutate):
    """max|logits(mutated) - ref| / std(ref) with `mutate(model)` applied to a deep copy."""
    m = copy.deepcopy(model)
    mutate(m)
    lg, _ = run_reference(m, tokens, check=False)
    return float((lg - ref).abs().max() / ref.std())


def mutate_no_dsa(m):
    for mod in m.modules():
        if type(mod).__name__.endswith("Indexer"):
            mod.index_topk = 10 ** 9


def mutate_no_ebias(m):
    for mod in m.modules():
        if type(mod).__name__.endswith("TopkRouter"):
            mod.e_score_correction_bias.zero_()


def mutate_no_group(m):
    for mod in m.modules():
        if type(mod).__name__.endswith("TopkRouter"):
            mod.num_group = 1
            mod.topk_group = 1


def evaluate(model, tokens, min_rel_gap, label, quick=False):
    """Reference run + acceptance checks.  Returns (logits, stats, ok, reasons)."""
    logits, rec = run_reference(model, tokens, fail_below=min_rel_gap if quick else None)
    if logits is None:
        return None, None, False, [f"{label}: {rec.early_kind} gap < {min_rel_gap:g} (early reject)"]
    cfg = model.config
    stats = {"logits_std": float(logits.std()), "logits_max_abs": float(logits.abs().max()),
             "mean_max_prob": float(logits.softmax(-1).max(-1).values.mean())}
    stats["gaps"] = rec.summary()
    stats["router_rows"] = rec.router_rows
    stats["ebias_changed_rows"] = rec.bias_changes
    reasons = list(rec.mismatch)
    for kind, g in stats["gaps"].items():
        if g["min_rel_gap"] < min_rel_gap:
            reasons.append(f"{kind} min rel gap {g['min_rel_gap']:.2e} < {min_rel_gap:g}")
    if reasons and quick:  # cheap early exit while searching draws
        return logits, stats, False, [f"{label}: {r}" for r in reasons]
    if not (1.0 <= stats["logits_std"] <= 20.0):
        reasons.append(f"logits std {stats['logits_std']:.3f} out of [1, 20]")
    if stats["mean_max_prob"] > 0.9:
        reasons.append("softmax saturated")
    sens = {}
    if rec.bias_changes == 0:
        reasons.append("e_score_correction_bias changes no selection")
    sens["no_e_score_correction_bias"] = logits_delta(model, tokens, logits, mutate_no_ebias)
    if cfg.n_group > 1 and cfg.topk_group < cfg.n_group:
        stats["group_mask_changed_rows"] = rec.group_changes
        if rec.group_changes == 0:
            reasons.append("group masking changes no selection")
        sens["no_group_limit"] = logits_delta(model, tokens, logits, mutate_no_group)
    if "indexer" in stats["gaps"] or any(type(m).__name__.endswith("Indexer") for m in model.modules()):
        stats["indexer_rows_checked"] = rec.idx_rows
        stats["indexer_zero_frac"] = max(rec.idx_zero_frac) if rec.idx_zero_frac else 0.0
        stats["indexer_boundary_zero_ties"] = rec.idx_boundary_zero
        if rec.idx_boundary_zero or stats["indexer_zero_frac"] > 0.25:
            reasons.append("indexer scores too often exactly zero")
        if not rec.idx_short_rows_ok:
            reasons.append("indexer short rows do not select all causal keys")
        if rec.idx_rows == 0:
            reasons.append("no indexer row has more than index_topk causal keys")
        sens["dense_attention_instead_of_dsa"] = logits_delta(model, tokens, logits, mutate_no_dsa)
    stats["sensitivity_maxabs_over_std"] = sens
    for k, v in sens.items():
        if v < 1e-2:
            reasons.append(f"{k} moves logits only {v:.2e}*std")
    return logits, stats, not reasons, [f"{label}: {r}" for r in reasons]


# --------------------------------------------------------------------------------------------
# NVFP4 conversion of a loaded (float32, BF16-valued) model
# --------------------------------------------------------------------------------------------

def quantized_linear_names(model):
    """Names (module prefixes) of nn.Linear modules to quantise: all except lm_head.
    (Routers are not nn.Linear in transformers; embeddings are nn.Embedding.)"""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            out.append(name)
    return out


def calibrate_input_amax(model, tokens):
    """amax |input| of each quantised linear (and of each expert's gate/up and down input,
    calibrated on all tokens of the MoE block input) on the reference prompt."""
    amax = {}
    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            def h(m, a, o, name=name):
                amax[name] = max(amax.get(name, 0.0), float(a[0].abs().max()))
            handles.append(mod.register_forward_hook(h))
        elif type(mod).__name__.endswith("Experts"):
            def he(m, a, o, name=name):
                x = a[0].float()
                amax[name + ".__in"] = float(x.abs().max())
                I = m.intermediate_dim
                downs = []
                for e in range(m.num_experts):
                    gu = F.linear(x, m.gate_up_proj[e])
                    act = m.act_fn(gu[:, :I]) * gu[:, I:]
                    downs.append(float(act.abs().max()))
                amax[name + ".__down"] = downs
            handles.append(mod.register_forward_hook(he))
    run_reference(model, tokens, check=False)
    for hd in handles:
        hd.remove()
    return amax


def build_nvfp4(model, tokens):
    """Quantise `model` (float32 with BF16 values).  Returns (qtensors, deq_model, n_quantised):
    qtensors: dict checkpoint-name -> tensor for the NVFP4 pieces; deq_model: deep copy of the
    model whose quantised weights are replaced by their exact float32 dequantisation."""
    amax_in = calibrate_input_amax(model, tokens)
    q = {}
    deq = copy.deepcopy(model)
    mods = dict(deq.named_modules())
    names = quantized_linear_names(model)
    nq = 0

    def put(prefix, w, amax_w, in_amax):
        nonlocal nq
        packed, s8, ws2 = nvfp4_quantize(w, amax_w)
        q[prefix + ".weight"] = packed
        q[prefix + ".weight_scale"] = s8
        q[prefix + ".weight_scale_2"] = ws2.reshape(()).float()
        q[prefix + ".input_scale"] = torch.tensor(max(in_amax, 1e-12) / FP4_GLOBAL, dtype=torch.float32)
        nq += 1
        return nvfp4_dequantize(packed, s8, ws2)

    with torch.no_grad():
        for name in names:
            mod = mods[name]
            w = mod.weight.detach().float()
            amax_w = w.abs().max()
            for a, b in (("gate_proj", "up_proj"), ("up_proj", "gate_proj")):
                if name.endswith("." + a):  # dense MLP / shared expert: gate and up share weight_scale_2
                    other = mods[name[: -len(a)] + b].weight.detach().float()
                    amax_w = torch.maximum(amax_w, other.abs().max())
            mod.weight.copy_(put(name, w, amax_w, amax_in[name]))
        for name, mod in list(mods.items()):
            if not type(mod).__name__.endswith("Experts"):
                continue
            I = mod.intermediate_dim
            for e in range(mod.num_experts):
                gu = mod.gate_up_proj[e].detach().float()
                g, u = gu[:I], gu[I:]
                amax_gu = torch.maximum(g.abs().max(), u.abs().max())
                pfx = f"{name}.{e}"
                dg = put(pfx + ".gate_proj", g, amax_gu, amax_in[name + ".__in"])
                du = put(pfx + ".up_proj", u, amax_gu, amax_in[name + ".__in"])
                mod.gate_up_proj[e].copy_(torch.cat([dg, du], 0))
                d = mod.down_proj[e].detach().float()
                mod.down_proj[e].copy_(put(pfx + ".down_proj", d, d.abs().max(), amax_in[name + ".__down"][e]))
    return q, deq, nq


# --------------------------------------------------------------------------------------------
# independent safetensors reader (no torch) for cross-checks
# --------------------------------------------------------------------------------------------

def st_read_raw(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        buf = f.read()
    return hdr, buf


def fp8_e4m3_decode(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 0x7
    val = np.where(e == 0, 2.0 ** -6 * (m / 8.0), 2.0 ** (e - 7.0) * (1.0 + m / 8.0))
    val = np.where((e == 15) & (m == 7), np.nan, val)
    return s * val


E2M1_NP = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def independent_dequant(hdr, buf, prefix):
    def raw(name, dtype):
        t = hdr[name]
        a, b = t["data_offsets"]
        return np.frombuffer(buf[a:b], dtype=dtype).reshape(t["shape"]), t
    w, tw = raw(prefix + ".weight", np.uint8)
    sc, ts = raw(prefix + ".weight_scale", np.uint8)
    s2, t2 = raw(prefix + ".weight_scale_2", "<f4")
    assert tw["dtype"] == "U8" and ts["dtype"] == "F8_E4M3" and t2["dtype"] == "F32" and t2["shape"] == []
    assert hdr[prefix + ".input_scale"]["dtype"] == "F32" and hdr[prefix + ".input_scale"]["shape"] == []
    N, K2 = w.shape
    assert list(sc.shape) == [N, K2 * 2 // 16]
    lo = E2M1_NP[w & 0x0F]
    hi = E2M1_NP[w >> 4]
    vals = np.empty((N, K2 * 2))
    vals[:, 0::2] = lo
    vals[:, 1::2] = hi
    scale = np.repeat(fp8_e4m3_decode(sc), 16, axis=1)
    return vals * scale * float(s2)


def bf16_np(buf, t):
    a, b = t["data_offsets"]
    u = np.frombuffer(buf[a:b], dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32).reshape(t["shape"])


# --------------------------------------------------------------------------------------------
# writing fixtures
# --------------------------------------------------------------------------------------------

def write_logits(d, logits):
    arr = logits.detach().cpu().numpy().astype("<f4")
    arr.tofile(os.path.join(d, "logits.f32"))


def write_golden(d, tokens, logits, seed, notes, extra):
    g = {"tokens": list(map(int, tokens)), "n_tokens": len(tokens), "vocab": int(logits.shape[1]),
         "logits_file": "logits.f32", "std": float(logits.std()), "max_abs": float(logits.abs().max()),
         "seed": seed, "notes": notes}
    g.update(extra)
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(g, f, indent=2)
        f.write("\n")


def dir_sizes(d):
    return {fn: os.path.getsize(os.path.join(d, fn)) for fn in sorted(os.listdir(d))}


def exclude_list():
    """Modules left unquantised (routers are not nn.Linear in transformers but are listed, as ModelOpt does)."""
    return ["lm_head", "model.embed_tokens", "model.layers.*.mlp.gate"]


def make_family(family, fixtures, args, tmp):
    cls, cfg_cls, kw, _ = FAMILIES[family]
    want_nvfp4 = any(f.endswith("nvfp4") for f in FAMILIES[family][3])
    accepted = None
    cfg = eager(cfg_cls(**kw))
    model = cls(cfg).eval()
    rejected = {}
    for attempt in range(args.max_redraws):
        ss = np.random.SeedSequence([args.seed, FAMILY_CODE[family], attempt])
        sub_seed = int(ss.generate_state(1, dtype=np.uint64)[0] % (2 ** 63))
        gen = torch.Generator().manual_seed(sub_seed)
        draw_weights(model, gen)  # every parameter and the bias buffers are overwritten
        tokens = torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist()
        logits, stats, ok, why = evaluate(model, tokens, args.min_rel_gap, "bf16", quick=True)
        if ok:
            logits, stats, ok, why = evaluate(model, tokens, args.min_rel_gap, "bf16")
        if ok and want_nvfp4:
            q, deq, nq = build_nvfp4(model, tokens)
            qlogits, qstats, qok, qwhy = evaluate(deq, tokens, args.min_rel_gap, "nvfp4", quick=True)
            if qok:
                qlogits, qstats, qok, qwhy = evaluate(deq, tokens, args.min_rel_gap, "nvfp4")
            if qok:
                d = float((qlogits - logits).abs().max() / logits.std())
                if d < 1e-2:
                    qok, qwhy = False, qwhy + [f"nvfp4: dequantised logits only {d:.2e}*std from bf16"]
            ok, why = qok, why + qwhy
        if ok:
            accepted = (attempt, sub_seed, model, tokens, logits, stats)
            break
        key = why[0].split(" gap")[0].split(" min rel")[0] if why else "?"
        rejected[key] = rejected.get(key, 0) + 1
        if args.verbose:
            print(f"  [{family}] draw {attempt} rejected: " + "; ".join(why[:3]), flush=True)
    if accepted is None:
        sys.exit(f"{family}: no acceptable draw in {args.max_redraws} attempts")
    attempt, sub_seed, model, tokens, logits, stats = accepted
    print(f"  [{family}] accepted draw {attempt} (sub-seed {sub_seed}) after {attempt} re-draw(s); "
          f"first failing check of the rejected draws: {rejected}")

    # ---- save through transformers: fp32 -> from_pretrained(dtype=bf16) -> save_pretrained
    f32dir = os.path.join(tmp, family + "-f32")
    bfdir = os.path.join(tmp, family + "-bf16")
    model.save_pretrained(f32dir)
    mb = cls.from_pretrained(f32dir, dtype=torch.bfloat16)
    mb.save_pretrained(bfdir)
    ref = cls.from_pretrained(bfdir, dtype=torch.float32, attn_implementation="eager",
                              experts_implementation="eager").eval()
    assert ref.config._attn_implementation == "eager"
    rlogits, rstats, rok, rwhy = evaluate(ref, tokens, args.min_rel_gap, "reloaded-bf16")
    d_reload = float((rlogits - logits).abs().max())
    assert rok, rwhy
    assert d_reload <= 1e-5 * float(logits.std()), f"reloaded model differs: {d_reload}"
    rstats["reload_vs_inmemory_maxabs"] = d_reload
    common = {"family": family, "draw_attempt": attempt, "redraws": attempt, "redraw_reasons": rejected,
              "sub_seed": sub_seed,
              "min_rel_gap_required": args.min_rel_gap, "transformers": transformers.__version__,
              "torch": torch.__version__}
    report = {}

    for fx in fixtures:
        out = os.path.join(args.out, fx)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        if not fx.endswith("nvfp4"):
            for fn in ("config.json", "generation_config.json", "model.safetensors"):
                shutil.copy(os.path.join(bfdir, fn), os.path.join(out, fn))
            verify_bf16_file(os.path.join(out, "model.safetensors"), ref)
            if family == "glm5-shared":
                verify_shared(out, ref.config)
            write_logits(out, rlogits)
            notes = ("BF16 checkpoint written by transformers save_pretrained (per-expert tensors, "
                     "e_score_correction_bias F32); logits = float32 forward of these exact BF16 values, "
                     "eager attention + eager experts, no cache, batch 1.")
            write_golden(out, tokens, rlogits, args.seed, notes, dict(common, checks=rstats))
            report[fx] = dict(rstats, sizes=dir_sizes(out))
        else:
            # re-quantise from the reloaded model (identical BF16 values) so the files match it exactly
            q, deq, nq = build_nvfp4(ref, tokens)
            qlogits, qstats, qok, qwhy = evaluate(deq, tokens, args.min_rel_gap, "nvfp4")
            assert qok, qwhy
            qstats["nvfp4_vs_bf16_maxabs_over_std"] = float((qlogits - rlogits).abs().max() / rlogits.std())
            write_nvfp4_checkpoint(out, bfdir, q, family, ref)
            nchk = verify_nvfp4_file(out, deq, q)
            qstats["n_quantised_linears"] = nq
            qstats["independent_readback_checked_tensors"] = nchk
            write_logits(out, qlogits)
            notes = ("ModelOpt-style NVFP4 (group 16, F8_E4M3 block scales, F32 weight_scale_2 and input_scale "
                     "0-d scalars; gate/up share weight_scale_2) of the BF16 weights of the sibling bf16 fixture; "
                     "lm_head, routers (mlp.gate), embeddings, norms, biases stay BF16 (e_score_correction_bias F32). "
                     "logits = float32 forward with every quantised weight replaced by "
                     "(E2M1 * float(weight_scale)) * weight_scale_2; activations NOT quantised (input_scale unused, "
                     "calibrated as amax/2688 on this prompt, experts on all tokens).")
            write_golden(out, tokens, qlogits, args.seed, notes, dict(common, checks=qstats))
            report[fx] = dict(qstats, sizes=dir_sizes(out))
    return report


def verify_bf16_file(path, ref):
    """Read the file back without torch and compare every tensor with the reference model."""
    hdr, buf = st_read_raw(path)
    sd = ref.state_dict()
    n = 0
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        if ".experts." in name:
            pre, rest = name.split(".experts.")
            e, proj = rest.split(".")[0], rest.split(".")[1]
            e = int(e)
            I = ref.config.moe_intermediate_size
            if proj == "gate_proj":
                exp = sd[pre + ".experts.gate_up_proj"][e][:I]
            elif proj == "up_proj":
                exp = sd[pre + ".experts.gate_up_proj"][e][I:]
            else:
                exp = sd[pre + ".experts.down_proj"][e]
        else:
            exp = sd[name]
        if t["dtype"] == "BF16":
            got = bf16_np(buf, t)
        elif t["dtype"] == "F32":
            a, b = t["data_offsets"]
            got = np.frombuffer(buf[a:b], dtype="<f4").reshape(t["shape"])
        else:
            raise AssertionError(f"unexpected dtype {t['dtype']} for {name}")
        assert list(exp.shape) == t["shape"], name
        assert np.array_equal(got, exp.detach().numpy()), name
        n += 1
    covered = set()
    for name in hdr:
        if name == "__metadata__":
            continue
        if ".experts." in name:
            pre = name.split(".experts.")[0]
            covered.update({pre + ".experts.gate_up_proj", pre + ".experts.down_proj"})
        else:
            covered.add(name)
    assert covered == set(sd.keys()), set(sd.keys()) ^ covered
    return n


def verify_shared(out, cfg):
    hdr, _ = st_read_raw(os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json")) as f:
        cj = json.load(f)
    assert cj["indexer_types"] == cfg.indexer_types and "shared" in cj["indexer_types"], cj.get("indexer_types")
    for L, kind in enumerate(cj["indexer_types"]):
        has = any(k.startswith(f"model.layers.{L}.self_attn.indexer.") for k in hdr)
        assert has == (kind == "full"), (L, kind, has)


def write_nvfp4_checkpoint(out, bfdir, q, family, ref):
    tensors = {}
    with safe_open(os.path.join(bfdir, "model.safetensors"), "pt") as f:
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    qprefixes = {k[: -len(".weight")] for k in q if k.endswith(".weight")}
    for p in qprefixes:
        assert p + ".weight" in tensors, p
        del tensors[p + ".weight"]
    tensors.update(q)
    tensors = {k: v.contiguous() for k, v in sorted(tensors.items())}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(bfdir, "generation_config.json"), os.path.join(out, "generation_config.json"))
    with open(os.path.join(bfdir, "config.json")) as f:
        cj = json.load(f)
    producer = {"name": "modelopt", "version": MODELOPT_VERSION}
    excl = exclude_list()
    if family == "glm5":
        with open(os.path.join(out, "hf_quant_config.json"), "w") as f:
            json.dump({"producer": producer,
                       "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                                        "exclude_modules": excl}}, f, indent=2)
            f.write("\n")
    else:
        grp = {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False}
        cj["quantization_config"] = {
            "quant_method": "modelopt", "quant_algo": "NVFP4",
            "config_groups": {"group_0": {"weights": dict(grp), "input_activations": dict(grp),
                                          "targets": ["Linear"]}},
            "ignore": excl, "producer": producer}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")


def verify_nvfp4_file(out, deq, q):
    """Independent read-back: parse the file without torch, decode F8_E4M3 / E2M1 by formula,
    compare with the weights of the dequantised reference model."""
    hdr, buf = st_read_raw(os.path.join(out, "model.safetensors"))
    sd = deq.state_dict()
    I = deq.config.moe_intermediate_size
    n = 0
    for key in q:
        if not key.endswith(".weight"):
            continue
        p = key[: -len(".weight")]
        got = independent_dequant(hdr, buf, p)
        if ".experts." in p:
            pre, rest = p.split(".experts.")
            e, proj = int(rest.split(".")[0]), rest.split(".")[1]
            if proj == "gate_proj":
                exp = sd[pre + ".experts.gate_up_proj"][e][:I]
            elif proj == "up_proj":
                exp = sd[pre + ".experts.gate_up_proj"][e][I:]
            else:
                exp = sd[pre + ".experts.down_proj"][e]
        else:
            exp = sd[p + ".weight"]
        exp = exp.detach().double().numpy()
        err = np.abs(got - exp).max()
        tol = 2.0 ** -23 * np.abs(exp).max()  # exact up to the one float32 rounding of the product
        assert err <= tol, (p, err, tol)
        # gate/up share weight_scale_2
        if p.endswith("gate_proj"):
            up = p[: -len("gate_proj")] + "up_proj"
            a, b = hdr[p + ".weight_scale_2"]["data_offsets"]
            c, d = hdr[up + ".weight_scale_2"]["data_offsets"]
            assert buf[a:b] == buf[c:d], p
        n += 1
    # no BF16 weight left for a quantised prefix, and nothing else got lost
    for key in hdr:
        if key.endswith(".weight") and hdr[key]["dtype"] == "U8":
            assert key[:-7] + ".weight_scale" in hdr
    return n



# --------------------------------------------------------------------------------------------
# independent forward pass from the model definitions (numpy float64, reads the fixture files directly,
# no transformers modules) -- validates the golden logits and documents the math the C engine follows
# --------------------------------------------------------------------------------------------

class SpecWeights:
    def __init__(self, d):
        self.hdr, self.buf = st_read_raw(os.path.join(d, "model.safetensors"))

    def has(self, name):
        return name in self.hdr

    def __call__(self, name):
        """Dense float64 tensor for `name`; a quantised linear is addressed by its `.weight` name."""
        t = self.hdr[name]
        if t["dtype"] == "U8" and name.endswith(".weight"):
            return independent_dequant(self.hdr, self.buf, name[: -len(".weight")])
        if t["dtype"] == "BF16":
            return bf16_np(self.buf, t).astype(np.float64)
        if t["dtype"] == "F32":
            a, b = t["data_offsets"]
            return np.frombuffer(self.buf[a:b], dtype="<f4").reshape(t["shape"]).astype(np.float64)
        raise ValueError(f"{name}: {t['dtype']}")


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _topk_lowest_index(v, k):
    """indices of the k largest values, ties broken by the lowest index"""
    return np.lexsort((np.arange(v.shape[0]), -v))[:k]


def _rope_interleaved(x, pos, theta):
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None] * inv[None, :]                                  # [T, d/2]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (d // 2,)
    c, s_ = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = x0 * c - x1 * s_
    y[..., 1::2] = x0 * s_ + x1 * c
    return y


def _rope_neox(x, pos, theta, rot):
    inv = theta ** (-np.arange(0, rot, 2) / rot)
    ang = pos[:, None] * inv[None, :]
    c, s_ = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]          # [T, 1, rot/2]
    h = rot // 2
    y = x.copy()
    a, b = x[..., :h], x[..., h:rot]
    y[..., :h] = a * c - b * s_
    y[..., h:rot] = b * c + a * s_
    return y


def _moe(m, W, p, cfg):
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, TG = cfg.get("n_group", 1), cfg.get("topk_group", 1)
    s = 1.0 / (1.0 + np.exp(-(m @ W(p + "gate.weight").T)))
    c = s + W(p + "gate.e_score_correction_bias")
    out = np.zeros_like(m)
    for t in range(m.shape[0]):
        ct = c[t].copy()
        if G > 1:
            gsc = np.sort(ct.reshape(G, E // G), axis=-1)[:, -2:].sum(-1)
            keep = _topk_lowest_index(gsc, TG)
            mask = np.ones(G, bool)
            mask[keep] = False
            ct.reshape(G, E // G)[mask] = -np.inf
        idx = _topk_lowest_index(ct, K)
        g = s[t, idx] / (s[t, idx].sum() + 1e-20) * cfg["routed_scaling_factor"]
        for gi, e in zip(g, idx):
            q = f"{p}experts.{e}."
            hdn = _silu(W(q + "gate_proj.weight") @ m[t]) * (W(q + "up_proj.weight") @ m[t])
            out[t] += gi * (W(q + "down_proj.weight") @ hdn)
    q = p + "shared_experts."
    out += (_silu(m @ W(q + "gate_proj.weight").T) * (m @ W(q + "up_proj.weight").T)) @ W(q + "down_proj.weight").T
    return out


def _dense_mlp(m, W, p):
    return (_silu(m @ W(p + "gate_proj.weight").T) * (m @ W(p + "up_proj.weight").T)) @ W(p + "down_proj.weight").T


def _theta(cfg):
    rp = cfg.get("rope_parameters") or {}
    return float(rp.get("rope_theta", cfg.get("rope_theta")))


def _attn_glm5(a, W, p, cfg, pos, prev_sel):
    T = a.shape[0]
    H, dn, dr, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr = cfg["kv_lora_rank"]
    th = _theta(cfg)
    qr = _rms(a @ W(p + "q_a_proj.weight").T, W(p + "q_a_layernorm.weight"), 1e-6)
    q = (qr @ W(p + "q_b_proj.weight").T).reshape(T, H, dn + dr)
    q_nope, q_pe = q[..., :dn], _rope_interleaved(q[..., dn:], pos, th)
    ckv = a @ W(p + "kv_a_proj_with_mqa.weight").T
    c = _rms(ckv[:, :kvr], W(p + "kv_a_layernorm.weight"), 1e-6)
    k_pe = _rope_interleaved(ckv[:, kvr:], pos, th)                   # [T, dr]
    kv = (c @ W(p + "kv_b_proj.weight").T).reshape(T, H, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    if W.has(p + "indexer.wq_b.weight"):                              # "full" layer: own indexer
        nh, D, topk = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
        qi = (qr @ W(p + "indexer.wq_b.weight").T).reshape(T, nh, D)
        qi[..., :dr] = _rope_interleaved(qi[..., :dr], pos, th)        # rope dims FIRST in the indexer
        ki = a @ W(p + "indexer.wk.weight").T
        mu, var = ki.mean(-1, keepdims=True), ki.var(-1, keepdims=True)
        ki = (ki - mu) / np.sqrt(var + 1e-6) * W(p + "indexer.k_norm.weight") + W(p + "indexer.k_norm.bias")
        ki[:, :dr] = _rope_interleaved(ki[:, :dr], pos, th)
        wh = (a @ W(p + "indexer.weights_proj.weight").T) * nh ** -0.5 * D ** -0.5   # [T, nh]
        sc = np.maximum(np.einsum("shd,td->sht", qi, ki), 0.0)        # relu(q.k)
        I = np.einsum("sh,sht->st", wh, sc)
        sel = []
        for s_ in range(T):
            n = min(topk, s_ + 1)
            sel.append(np.sort(_topk_lowest_index(I[s_, : s_ + 1], n)))
    else:                                                             # "shared": previous top-k
        sel = prev_sel
    out = np.zeros((T, H, dv))
    scale = (dn + dr) ** -0.5
    for s_ in range(T):
        idx = sel[s_]
        z = (np.einsum("hd,thd->ht", q_nope[s_], k_nope[idx]) + np.einsum("hd,td->ht", q_pe[s_], k_pe[idx])) * scale
        z = np.exp(z - z.max(-1, keepdims=True))
        z /= z.sum(-1, keepdims=True)
        out[s_] = np.einsum("ht,thd->hd", z, v[idx])
    return out.reshape(T, H * dv) @ W(p + "o_proj.weight").T, sel


def _attn_glm4(a, W, p, cfg, pos):
    T = a.shape[0]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rp = cfg.get("rope_parameters") or {}
    prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    rot = int(hd * prf)
    th = _theta(cfg)

    def proj(n, heads):
        y = a @ W(p + n + ".weight").T
        if W.has(p + n + ".bias"):
            y = y + W(p + n + ".bias")
        return y.reshape(T, heads, hd)
    q, k, v = proj("q_proj", H), proj("k_proj", KV), proj("v_proj", KV)
    if cfg.get("use_qk_norm"):
        q = _rms(q, W(p + "q_norm.weight"), cfg["rms_norm_eps"])
        k = _rms(k, W(p + "k_norm.weight"), cfg["rms_norm_eps"])
    q, k = _rope_neox(q, pos, th, rot), _rope_neox(k, pos, th, rot)
    rep = H // KV
    out = np.zeros((T, H, hd))
    for h in range(H):
        z = q[:, h] @ k[:, h // rep].T / math.sqrt(hd)
        z = np.where(np.tril(np.ones((T, T), bool)), z, -np.inf)
        z = np.exp(z - z.max(-1, keepdims=True))
        z /= z.sum(-1, keepdims=True)
        out[:, h] = z @ v[:, h // rep]
    return out.reshape(T, H * hd) @ W(p + "o_proj.weight").T


def spec_forward(d):
    """float64 logits [T, V] of fixture directory d, computed from the files and the maths alone."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(d, "golden.json")) as f:
        tokens = json.load(f)["tokens"]
    W = SpecWeights(d)
    eps = cfg["rms_norm_eps"]
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    h = W("model.embed_tokens.weight")[tokens]
    sel = None
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        a = _rms(h, W(p + "input_layernorm.weight"), eps)
        if cfg["model_type"] == "glm_moe_dsa":
            o, sel = _attn_glm5(a, W, p + "self_attn.", cfg, pos, sel)
        else:
            o = _attn_glm4(a, W, p + "self_attn.", cfg, pos)
        h = h + o
        m = _rms(h, W(p + "post_attention_layernorm.weight"), eps)
        if W.has(p + "mlp.gate.weight"):
            h = h + _moe(m, W, p + "mlp.", cfg)
        else:
            h = h + _dense_mlp(m, W, p + "mlp.")
    h = _rms(h, W("model.norm.weight"), eps)
    return h @ W("lm_head.weight").T


def check_fixture(d):
    """max|spec_forward - golden| / std(golden)"""
    with open(os.path.join(d, "golden.json")) as f:
        g = json.load(f)
    ref = np.fromfile(os.path.join(d, g["logits_file"]), dtype="<f4").reshape(g["n_tokens"], g["vocab"])
    assert abs(float(ref.std(ddof=1)) - g["std"]) <= 1e-5 * g["std"]
    got = spec_forward(d)
    return float(np.abs(got - ref).max() / g["std"])

# --------------------------------------------------------------------------------------------

README = """# Golden fixtures (tests/data/golden)

Small random checkpoints plus float32 reference logits from Hugging Face transformers, used by the
C tests to check the moeserve forward pass end to end. Generated by `tools/make_fixtures.py`
(dev-time tool; CPU only, a few minutes):

    python3 tools/make_fixtures.py --out tests/data/golden                    # all (~5 min)
    python3 tools/make_fixtures.py --out tests/data/golden --only glm5-nvfp4  # one (its family is redrawn)
    python3 tools/make_fixtures.py --out tests/data/golden --check            # verify only, no rewrite

(python3 with torch, transformers 5.x, safetensors, numpy; here `/work/venv/bin/python`.)
Generated with transformers {tf}, torch {torch} (CPU), seed {seed}. The draws are deterministic for a
given seed and library versions (single-threaded CPU); re-running reproduces the files byte for byte.

## Files in every fixture directory

| file | content |
|---|---|
| `config.json` (+ `generation_config.json`) | as written by transformers `save_pretrained` (NVFP4: see below) |
| `model.safetensors` | the checkpoint (single file, no index json) |
| `golden.json` | `tokens` (prompt ids), `n_tokens` T, `vocab` V, `logits_file`, `std` and `max_abs` of all reference logits, `seed`, `notes`, plus `checks` (gap / sensitivity statistics of the draw) |
| `logits.f32` | little-endian float32, row-major [T, V]: logits for every prompt position, `model(input_ids).logits` with the model in float32, eager attention, eager experts, no cache, batch 1 |

## Fixtures

{table}

Common to all: 4 layers, layer 0 dense SwiGLU (intermediate 96), layers 1-3 MoE (16 routed experts,
top-4, moe_intermediate 32, 1 shared expert, sigmoid `noaux_tc` router with F32
`e_score_correction_bias`, norm_topk_prob, routed_scaling_factor 2.5), hidden 128, vocab 512,
RMSNorm eps 1e-5, RoPE theta 10000, untied lm_head, prompt of {T} random token ids, no MTP layer
(`num_nextn_predict_layers` 0).

* GLM-5 (`glm_moe_dsa`): 4 heads, q_lora_rank 64, kv_lora_rank 64, qk_nope 32, qk_rope 16, v_head 32
  (softmax scale 48^-0.5), interleaved RoPE for MLA and indexer; indexer 8 heads x 32 (rope dims
  first), index_topk 8, so every query row from position 8 on really selects 8 of its causal keys.
  n_group 1. `q_a_layernorm` / `kv_a_layernorm` use transformers' eps 1e-6; indexer `k_norm` is a
  LayerNorm (weight + bias, eps 1e-6). `head_dim` in config.json is 16 (= qk_rope_head_dim).
* glm5-shared-bf16: `indexer_types` = {shared_types} (from `index_topk_freq` 3,
  `index_skip_topk_offset` 1; both the list and the two keys are in config.json). Shared layers have
  no `self_attn.indexer.*` tensors and reuse the top-k of the previous layer (i.e. of the last full one).
* GLM-4.5 (`glm4_moe`): 8 heads, 2 KV heads, head_dim 32, q/k/v bias, QK-norm (RMSNorm per head, eps
  1e-5, before RoPE), partial NeoX RoPE on the first 16 dims (partial_rotary_factor 0.5), n_group 4,
  topk_group 2 (group score = sum of the top-2 biased scores of the group; non-selected groups masked).

## NVFP4 fixtures

Weights of the sibling `-bf16` fixture, quantised exactly as ModelOpt does (NVIDIA/Model-Optimizer:
`NVFP4QTensor` in modelopt/torch/quantization/qtensor/nvfp4_tensor.py, `sync_moe_gate_up_amax` in
modelopt/torch/export/layer_utils.py): every `nn.Linear` except `lm_head` becomes `<p>.weight`
U8 [N, K/2] (element 2j in the low nibble), `<p>.weight_scale` F8_E4M3 [N, K/16],
`<p>.weight_scale_2` F32 0-d, `<p>.input_scale` F32 0-d.
This includes attention (q_a/q_b/kv_a/kv_b/o, glm4moe q/k/v/o), the GLM-5 indexer (wq_b, wk,
weights_proj), the dense MLP, shared experts and every routed expert (per-expert names
`mlp.experts.E.{{gate,up,down}}_proj`). Routers (`mlp.gate.weight`, not an nn.Linear), embeddings,
lm_head, norms and biases stay BF16; `e_score_correction_bias` F32. gate_proj and up_proj of one
expert / shared expert / dense MLP share `weight_scale_2` = max(amax_gate, amax_up)/2688; q/k/v (and
q_a/kv_a) have their own. `input_scale` = amax of the layer input on this prompt / 2688 (experts
calibrated on all tokens); the reference does NOT quantise activations, so the C engine must ignore
`input_scale` (weight-only, W4A16 semantics) to match.

* glm5-nvfp4 describes the quantisation in `hf_quant_config.json` (config.json has no quantization_config).
* glm4moe-nvfp4 describes it only in config.json `quantization_config` (`quant_method` modelopt,
  `config_groups`, `ignore`); there is no hf_quant_config.json.

Reference logits: the same transformers model with every quantised weight replaced by its exact float32
dequantisation `(E2M1 * float(weight_scale)) * weight_scale_2`.

## Discrimination and top-k gaps

Weights are N(0, (gain/sqrt(fan_in))^2) (gain 1; lm_head 2, router 1.5), embeddings N(0,1), norm
weights 1+0.3N, biases 0.3N, e_score_correction_bias 0.15N; logits std is O(1..few). Every
quantisable linear weight also gets a block texture (each 16-wide block scaled by 2^-U, U~U[0,3], RMS
restored) plus, per matrix, one all-zero block, one block at 2^-16 and one at 2^-20 of its size, so the
NVFP4 files contain F8_E4M3 block scales over many binades, subnormal scales, the 2^-9 clamp (byte
0x01) and the all-zero-block scale 1.0 (byte 0x38). During the
reference run every top-k transformers takes is recomputed inside the modules (forward hooks) and
must match transformers' choice and have relative gap (v[k-1]-v[k]) / max|v| >= {gap:g} (max over the
finite scores of that row): router expert top-k (biased scores after group masking), router group
top-k, DSA indexer top-k (rows with more than index_topk causal keys). A draw is also rejected unless
the e_score_correction_bias, group masking and DSA selection each change selections and move the
logits by >= 1e-2 * std. Failing draws are re-drawn with the next sub-seed; `golden.json` records the
attempt, min gaps, and the sensitivities (max|logits change| / std when the feature is switched off).

## Independent check

`tools/make_fixtures.py` also contains `spec_forward`, a numpy float64 forward pass written from
the model definitions (transformers' modeling files restated as plain maths)
that reads `config.json` and `model.safetensors` directly (its own safetensors parser,
BF16 / F8_E4M3 / E2M1 decoding by bit formula; no transformers code). It reproduces every golden file
to max|d| <= ~5e-6 * std (`golden.json` checks.spec_forward_maxabs_over_std; `--check` re-runs it), so
transformers 5.17 and `spec_forward` agree on all the features these fixtures use. Typical bugs move the
logits by whole standard deviations: half-split instead of interleaved RoPE (MLA or indexer only),
interleaved instead of NeoX RoPE for glm4moe, swapped nibble order, ignoring weight_scale_2, ignoring
e_score_correction_bias, routed_scaling_factor or group-limited routing: 2.4 to 5.4 * std each.

## Tolerance used by the C tests

    max |logits_C - logits_ref| <= 1e-3 * std(logits_ref)     (std = golden.json "std")

The float64 `spec_forward` is ~5e-6 * std from the float32 reference, so a float32 engine has ample room.
Not distinguishable at this tolerance: eps 1e-5 instead of transformers' 1e-6 for q_a_layernorm /
kv_a_layernorm (moves the logits by ~4e-5 * std).
"""


def write_readme(out, report, args, shared_types):
    rows = ["| fixture | model | quantisation | logits std | min rel gap expert / group / indexer | model.safetensors bytes |",
            "|---|---|---|---|---|---|"]
    desc = {"glm5-bf16": ("GlmMoeDsaForCausalLM", "BF16"),
            "glm5-shared-bf16": ("GlmMoeDsaForCausalLM, IndexShare", "BF16"),
            "glm5-nvfp4": ("GlmMoeDsaForCausalLM", "NVFP4, hf_quant_config.json"),
            "glm4moe-bf16": ("Glm4MoeForCausalLM", "BF16"),
            "glm4moe-nvfp4": ("Glm4MoeForCausalLM", "NVFP4, config.json quantization_config")}
    for fx in ALL_FIXTURES:
        gj = os.path.join(out, fx, "golden.json")
        if not os.path.exists(gj):
            continue
        with open(gj) as f:
            g = json.load(f)
        gaps = g["checks"]["gaps"]
        gs = " / ".join(f"{gaps[k]['min_rel_gap']:.2e}" if k in gaps else "-" for k in ("expert", "group", "indexer"))
        size = os.path.getsize(os.path.join(out, fx, "model.safetensors"))
        rows.append(f"| {fx} | {desc[fx][0]} | {desc[fx][1]} | {g['std']:.3f} | {gs} | {size} |")
    text = README.format(tf=transformers.__version__, torch=torch.__version__, seed=args.seed,
                         table="\n".join(rows), T=args.prompt_len, shared_types=shared_types,
                         gap=args.min_rel_gap)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--seed", type=int, default=20260501)
    ap.add_argument("--only", action="append", default=[], help="fixture name(s); repeatable or comma separated")
    ap.add_argument("--min-rel-gap", type=float, default=2e-3)
    ap.add_argument("--max-redraws", type=int, default=20000)
    ap.add_argument("--prompt-len", type=int, default=28)
    ap.add_argument("--verbose", action="store_true", help="print why each rejected draw failed")
    ap.add_argument("--check", action="store_true",
                    help="only re-check existing fixtures in --out against the independent numpy forward "
                         "(spec_forward)")
    args = ap.parse_args()
    only = [x for o in args.only for x in o.split(",") if x]
    for o in only:
        if o not in ALL_FIXTURES:
            sys.exit(f"unknown fixture {o}; known: {', '.join(ALL_FIXTURES)}")
    os.makedirs(args.out, exist_ok=True)
    if args.check:
        bad = 0
        for fx in only or ALL_FIXTURES:
            d = os.path.join(args.out, fx)
            if not os.path.isdir(d):
                continue
            e = check_fixture(d)
            bad += e > SPEC_TOL
            print(f"{fx}: max|spec_forward - golden| / std = {e:.2e}" + ("  FAIL" if e > SPEC_TOL else ""))
        sys.exit(1 if bad else 0)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, seed {args.seed}")
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family, (_, _, _, fixtures) in FAMILIES.items():
            sel = [f for f in fixtures if not only or f in only]
            if not sel:
                continue
            print(f"family {family}: {', '.join(sel)}", flush=True)
            report.update(make_family(family, sel, args, tmp))
    for fx, r in report.items():  # independent check: numpy float64 forward from the files alone
        d = os.path.join(args.out, fx)
        e = check_fixture(d)
        assert e <= SPEC_TOL, f"{fx}: spec_forward differs from transformers by {e:.2e}*std"
        r["spec_forward_maxabs_over_std"] = e
        with open(os.path.join(d, "golden.json")) as f:
            g = json.load(f)
        g["checks"]["spec_forward_maxabs_over_std"] = e
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(g, f, indent=2)
            f.write("\n")
    shared_types = json.dumps(GlmMoeDsaConfig(**GLM5_SHARED_KW).indexer_types)
    write_readme(args.out, report, args, shared_types)
    print("\nsummary")
    for fx, r in report.items():
        gaps = ", ".join(f"{k} {v['min_rel_gap']:.2e} ({v['rows']} rows)" for k, v in r["gaps"].items())
        print(f"  {fx}: logits std {r['logits_std']:.3f} max|.| {r['logits_max_abs']:.2f} "
              f"mean max-prob {r['mean_max_prob']:.3f}")
        print(f"    min rel gap: {gaps}")
        print(f"    sensitivity (max|d|/std): " +
              ", ".join(f"{k} {v:.3f}" for k, v in r["sensitivity_maxabs_over_std"].items()) +
              (f", nvfp4 vs bf16 {r['nvfp4_vs_bf16_maxabs_over_std']:.3f}" if "nvfp4_vs_bf16_maxabs_over_std" in r else ""))
        extra = {k: r[k] for k in ("ebias_changed_rows", "group_mask_changed_rows", "router_rows",
                                   "indexer_rows_checked", "indexer_zero_frac", "n_quantised_linears",
                                   "independent_readback_checked_tensors") if k in r}
        print(f"    {extra}")
        print(f"    independent numpy forward (spec_forward): max|d|/std {r['spec_forward_maxabs_over_std']:.2e}")
        print(f"    files: {r['sizes']}")


if __name__ == "__main__":
    main()
