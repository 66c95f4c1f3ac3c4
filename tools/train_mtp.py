#!/usr/bin/env python3
"""train_mtp.py -- train the built-in model's MTP (nextn) layer, the drafter of speculative decoding.

Dev-time tool (not run by CI). Needs torch, tokenizers, safetensors, numpy (the packages of
tools/train_builtin.py, whose model code it imports). The main model stays frozen: only the MTP
layer's own weights are trained, and the checkpoint's main tensors are written back unchanged.

CPU (this machine, 2 cores; about 25 minutes of training):
    /work/venv/bin/python tools/train_mtp.py --data /work/corpus/train.txt.xz --minutes 25
GPU (one H100/H200, from the repository root with corpus/train.txt.xz carried; a longer run, more
tokens, a higher acceptance):
    python3 tools/train_mtp.py --data corpus/train.txt.xz --minutes 10 --device cuda --batch 64 --seq-len 512
Then `moeserve generate models/builtin --prompt ... --speculative-config
'{"method":"mtp","num_speculative_tokens":3}'` shows the acceptance on stderr.

What the layer computes (src/model/mtp.c says the same for the engine): for the main model's
final-normed hidden state h_t at position t and the next token x_{t+1},
    u = eh_proj([enorm(embed(x_{t+1})) | hnorm(h_t)]),  u = DecoderLayer(u) at position t,
    logits(x_{t+2}) = lm_head(shared_head.norm(u)).
The decoder layer is a MoE layer of the main model's shape (as GLM-4.5's MTP layer), with a KV
cache of its own (its attention sees the earlier positions' u). The built-in layer shares the main
model's embedding and lm_head (GLM-5's and DeepSeek-V3's arrangement: no tensors of its own), so
the checkpoint grows by one layer (1.44 M parameters, 2.9 MB in BF16).

Objective: distillation toward the main model's own next-token distribution. Row t is trained to
match softmax(main logits at t+1) -- the distribution the verifier samples x_{t+2} from -- by
KL(teacher || student): greedy acceptance is the event that the draft equals the main model's
argmax, so matching the teacher (not the corpus) is what maximises it. The MTP layer starts from a
copy of the main model's last layer (its MoE and attention shapes are the same), eh_proj from
[I/2 | I/2]; the MoE's routing bias is balanced by train_builtin's proportional rule.

Progress lines report, on held-out windows (tests/data/heldout.txt), the first draft's expected
greedy acceptance: the share of positions where argmax(student) == argmax(teacher), and of them
the two-step chain (the layer applied to its own output, as the engine's chain does), which bounds
what K = 3 accepts.

--resume starts from the layer already in --model (a second run continues the first).

Output: --out (default models/builtin): model.safetensors rewritten with model.layers.L.* added
(L = num_hidden_layers; BF16, the router's e_score_correction_bias F32 as the main layers'), and
config.json's num_nextn_predict_layers set to 1.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_builtin as tb  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, flush=True)


def load_main(model_dir):
    """The built-in checkpoint as train_builtin's Model (float32), and its raw tensors."""
    from safetensors import safe_open
    c = json.load(open(os.path.join(model_dir, "config.json")))
    raw = {}
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        for k in f.keys():
            raw[k] = f.get_tensor(k)
    L, E = c["num_hidden_layers"], c["n_routed_experts"]
    sd = {k: v.float() for k, v in raw.items()}
    for i in range(L):  # per-expert tensors on disk -> the fused in-memory names from_hf_state reads
        p = "model.layers.%d.mlp.experts." % i
        if p + "0.gate_proj.weight" not in sd:
            continue
        sd[p[:-1] + ".gate_up_proj"] = torch.stack(
            [torch.cat([sd[p + "%d.gate_proj.weight" % e], sd[p + "%d.up_proj.weight" % e]]) for e in range(E)])
        sd[p[:-1] + ".down_proj"] = torch.stack([sd[p + "%d.down_proj.weight" % e] for e in range(E)])
    cfg = dict(c)
    cfg["num_nextn_predict_layers"] = 0
    model = tb.Model(cfg)
    tb.from_hf_state(model, sd)
    for p in model.parameters():
        p.requires_grad_(False)
    return c, model, raw


class MTP(nn.Module):
    def __init__(self, c, main):
        super().__init__()
        H = c["hidden_size"]
        self.eps = c["rms_norm_eps"]
        self.enorm = nn.Parameter(torch.ones(H))
        self.hnorm = nn.Parameter(torch.ones(H))
        self.eh = nn.Parameter(torch.cat([torch.eye(H), torch.eye(H)], dim=1) * 0.5)
        self.layer = tb.Layer(c, True)
        self.head_norm = nn.Parameter(main.norm.detach().clone())
        self.layer.load_state_dict(main.layers[-1].state_dict())  # warm start: the last main layer
        for p in self.layer.parameters():
            p.requires_grad_(True)

    def forward(self, h, nxt, embed, head, cos, sin):
        e = F.embedding(nxt, embed)
        x = F.linear(torch.cat([tb.rmsnorm(e, self.enorm, self.eps), tb.rmsnorm(h, self.hnorm, self.eps)], -1), self.eh)
        u, load = self.layer(x, cos, sin)
        return F.linear(tb.rmsnorm(u, self.head_norm, self.eps), head), u, load


@torch.no_grad()
def teacher(main, ids):
    """The main model's final-normed hidden state and logits at every position of ids [B, S]."""
    B, S = ids.shape
    cos, sin = tb.rope_cos_sin(S, main.rot, main.theta, ids.device)
    x = F.embedding(ids, main.embed)
    for layer in main.layers:
        x, _ = layer(x, cos, sin)
    h = tb.rmsnorm(x, main.norm, main.c["rms_norm_eps"])
    return h, F.linear(h, main.head)


def mtp_loss(mtp, main, ids, chain):
    """KL(teacher || student) of the first draft (and with chain, of the second, the layer applied to
    its own output state and the next token); the argmax agreement of each; the router loads."""
    B, S = ids.shape
    h, tl = teacher(main, ids)
    cos, sin = tb.rope_cos_sin(S - 1, main.rot, main.theta, ids.device)
    logits, u, la = mtp(h[:, :-1], ids[:, 1:], main.embed, main.head, cos, sin)
    tgt = F.log_softmax(tl[:, 1:].float(), -1)
    lq = F.log_softmax(logits.float(), -1)
    loss = F.kl_div(lq.reshape(-1, lq.shape[-1]), tgt.reshape(-1, tgt.shape[-1]), log_target=True,
                    reduction="batchmean")
    agree = (lq.argmax(-1) == tgt.argmax(-1)).float()
    out = {"loss1": float(loss.detach()), "acc1": float(agree.mean()), "loads": [la[0]]}
    if chain:  # step 2: u at t paired with x_{t+2}, at position t + 1, against the teacher at t + 2
        cos2, sin2 = tb.rope_cos_sin(S - 2, main.rot, main.theta, ids.device)
        l2, _, la2 = mtp(u[:, :-1], ids[:, 2:], main.embed, main.head, cos2, sin2)
        lq2 = F.log_softmax(l2.float(), -1)
        tgt2 = tgt[:, 1:]
        loss2 = F.kl_div(lq2.reshape(-1, lq2.shape[-1]), tgt2.reshape(-1, tgt2.shape[-1]), log_target=True,
                         reduction="batchmean")
        both = agree[:, :-1] * (lq2.argmax(-1) == tgt2.argmax(-1)).float()
        out.update(loss2=float(loss2.detach()), acc2=float(both.mean()))
        out["loads"].append(la2[0])
        loss = loss + chain * loss2
    return loss, out


def balance(layer, loads, rate):
    """train_builtin's proportional e_score_correction_bias update from this step's expert loads."""
    load = sum(loads)
    mean = load.mean()
    layer.ebias += rate * (mean - load) / mean.clamp(min=1e-9)


def resume(c, raw, mtp):
    """Start from the MTP layer already in the checkpoint (export's inverse); False when it has none."""
    L, E, I = c["num_hidden_layers"], c["n_routed_experts"], c["moe_intermediate_size"]
    p = "model.layers.%d." % L
    if p + "eh_proj.weight" not in raw:
        return False
    ly = mtp.layer
    with torch.no_grad():
        def put(dst, name):
            dst.copy_(raw[p + name].float())
        put(mtp.enorm, "enorm.weight")
        put(mtp.hnorm, "hnorm.weight")
        put(mtp.eh, "eh_proj.weight")
        put(mtp.head_norm, "shared_head.norm.weight")
        put(ly.ln1, "input_layernorm.weight")
        put(ly.ln2, "post_attention_layernorm.weight")
        put(ly.o.weight, "self_attn.o_proj.weight")
        put(ly.qn, "self_attn.q_norm.weight")
        put(ly.kn, "self_attn.k_norm.weight")
        put(ly.router, "mlp.gate.weight")
        put(ly.ebias, "mlp.gate.e_score_correction_bias")
        for a, m in (("q", ly.q), ("k", ly.k), ("v", ly.v)):
            put(m.weight, "self_attn.%s_proj.weight" % a)
            put(m.bias, "self_attn.%s_proj.bias" % a)
        put(ly.w_gu[E, :I], "mlp.shared_experts.gate_proj.weight")
        put(ly.w_gu[E, I:], "mlp.shared_experts.up_proj.weight")
        put(ly.w_down[E], "mlp.shared_experts.down_proj.weight")
        for e in range(E):
            put(ly.w_gu[e, :I], "mlp.experts.%d.gate_proj.weight" % e)
            put(ly.w_gu[e, I:], "mlp.experts.%d.up_proj.weight" % e)
            put(ly.w_down[e], "mlp.experts.%d.down_proj.weight" % e)
    return True


def export(c, raw, mtp, out):
    from safetensors.torch import save_file
    L = c["num_hidden_layers"]
    E, I = c["n_routed_experts"], c["moe_intermediate_size"]
    ly = mtp.layer
    p = "model.layers.%d." % L
    t = {p + "enorm.weight": mtp.enorm, p + "hnorm.weight": mtp.hnorm, p + "eh_proj.weight": mtp.eh,
         p + "shared_head.norm.weight": mtp.head_norm,
         p + "input_layernorm.weight": ly.ln1, p + "post_attention_layernorm.weight": ly.ln2,
         p + "self_attn.o_proj.weight": ly.o.weight, p + "self_attn.q_norm.weight": ly.qn,
         p + "self_attn.k_norm.weight": ly.kn, p + "mlp.gate.weight": ly.router,
         p + "mlp.shared_experts.gate_proj.weight": ly.w_gu[E, :I],
         p + "mlp.shared_experts.up_proj.weight": ly.w_gu[E, I:],
         p + "mlp.shared_experts.down_proj.weight": ly.w_down[E]}
    for a, m in (("q", ly.q), ("k", ly.k), ("v", ly.v)):
        t[p + "self_attn.%s_proj.weight" % a] = m.weight
        t[p + "self_attn.%s_proj.bias" % a] = m.bias
    for e in range(E):
        t[p + "mlp.experts.%d.gate_proj.weight" % e] = ly.w_gu[e, :I]
        t[p + "mlp.experts.%d.up_proj.weight" % e] = ly.w_gu[e, I:]
        t[p + "mlp.experts.%d.down_proj.weight" % e] = ly.w_down[e]
    tensors = {k: v for k, v in raw.items() if not k.startswith(p)}
    for k, v in t.items():
        tensors[k] = v.detach().to(torch.bfloat16).cpu().contiguous()
    tensors[p + "mlp.gate.e_score_correction_bias"] = ly.ebias.detach().float().cpu().contiguous()
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cp = os.path.join(out, "config.json")
    text = open(cp).read()
    key = '"num_nextn_predict_layers": '
    i = text.index(key) + len(key)
    j = i
    while text[j].isdigit():
        j += 1
    open(cp, "w").write(text[:i] + "1" + text[j:])
    log("export: %d tensors of layer %d into %s (num_nextn_predict_layers 1)" % (len(t) + 1, L, out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "corpus/train.txt.xz"))
    ap.add_argument("--data-mb", type=float, default=24.0, help="training text read from --data (MB)")
    ap.add_argument("--heldout", default=os.path.join(REPO, "tests/data/heldout.txt"))
    ap.add_argument("--model", default=os.path.join(REPO, "models/builtin"))
    ap.add_argument("--out", default=None, help="default: --model")
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=float, default=0.03)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--chain", type=float, default=0.5, help="weight of the second chain step's loss (0: off)")
    ap.add_argument("--bias-rate", type=float, default=1e-2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--resume", action="store_true", help="start from the MTP layer already in --model")
    a = ap.parse_args()
    out = a.out or a.model
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    c, main_model, raw = load_main(a.model)
    main_model.to(dev)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    eos = c["eos_token_id"][0]
    t0 = time.time()
    docs = tb.read_docs(a.data, limit_bytes=int(a.data_mb * 1e6))
    data = torch.from_numpy(tb.tokenize_docs(tok, docs, eos).astype(np.int64))
    log("data: %d documents, %d tokens (%.1f s)" % (len(docs), len(data), time.time() - t0))
    held, _ = tb.heldout_windows(tok, a.heldout, a.seq_len, eos)
    held = held[:16, :-1].to(dev)
    mtp = MTP(c, main_model)
    if a.resume and not resume(c, raw, mtp):
        raise SystemExit("--resume: %s has no MTP layer" % a.model)
    mtp.to(dev)
    params = [p for n, p in mtp.named_parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    budget = a.minutes * 60.0
    g = torch.Generator().manual_seed(a.seed)

    def evaluate():
        with torch.no_grad():
            _, o = mtp_loss(mtp, main_model, held, 1.0)
        return o

    o = evaluate()
    log("held-out before: first draft agrees %.3f, two-step chain %.3f, KL %.3f" % (o["acc1"], o["acc2"], o["loss1"]))
    start, step, last = time.time(), 0, 0.0
    while True:
        el = time.time() - start
        if el >= budget:
            break
        lr = tb.lr_at(el / budget, argparse.Namespace(lr=a.lr, warmup=a.warmup, min_lr_frac=a.min_lr_frac))
        for grp in opt.param_groups:
            grp["lr"] = lr
        ix = torch.randint(0, len(data) - a.seq_len - 1, (a.batch,), generator=g)
        ids = torch.stack([data[i:i + a.seq_len] for i in ix]).to(dev)
        loss, o = mtp_loss(mtp, main_model, ids, a.chain)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            balance(mtp.layer, o["loads"], a.bias_rate)
        step += 1
        if time.time() - last > 60 or step == 1:
            last = time.time()
            log("step %d, %.1f min, lr %.2e: KL %.3f, first draft agrees %.3f (train)" %
                (step, el / 60, lr, o["loss1"], o["acc1"]))
    o = evaluate()
    log("held-out after %d steps (%d tokens): first draft agrees %.3f, two-step chain %.3f, KL %.3f" %
        (step, step * a.batch * a.seq_len, o["acc1"], o["acc2"], o["loss1"]))
    export(c, raw, mtp, out)


if __name__ == "__main__":
    main()
