#!/usr/bin/env python3
"""bench_torch_moe: the PyTorch BF16 baseline for `moeserve bench kernels`.

Measures one full routed-MoE layer forward of GLM-5's shape (E=256 experts,
top-8, hidden D=6144, expert width F=2048) in BF16 with torch._grouped_mm
(the CUTLASS grouped GEMM that PyTorch uses on sm90/sm100), at decode and
prefill token counts, for uniform ("random") and hot-expert ("skewed")
routing. The timed region is what an engine does per MoE layer:

    sort the T*k (token, slot) pairs by expert (stable argsort of the ids)
    offsets = cumulative per-expert counts, int32 (bincount + cumsum; the
              count is a scatter_add_ of ones, since torch.bincount on CUDA
              reads max() back to the host and cannot be graph-captured)
    x_sorted = x[token of each sorted pair]                      [P, D]
    h = torch._grouped_mm(x_sorted, w13, offs=offsets)           [P, 2F]
    a = silu(h[:, :F]) * h[:, F:]                                [P, F]
    y = torch._grouped_mm(a, w2, offs=offsets)                   [P, D]
    out = zeros[T, D]; out.index_add_(0, token, y * routing weight)

with P = T*k, w13 [E, D, 2F] (gate | up along the output dim) and w2
[E, F, D], both BF16 (~19.3 GB at the default shape). After --warmup eager
runs, the region is captured in a CUDA graph (eager if capture fails; the
output says which) and --iters replays are timed one by one with CUDA events.
Reported: median and min ms, the experts touched, the BF16 bytes of the
touched experts' weights (touched * 3 * D * F * 2), the effective GB/s over
those bytes and TFLOP/s (2*P*D*2F + 2*P*F*D flops) at the median time.

At start-up the script checks torch._grouped_mm's operand convention
(mat_a 2-D [M_total, K], mat_b 3-D [E, K, N], offs int32 cumulative row ends
per group, empty groups included) against a per-expert loop of plain matmul,
then the whole layer against a per-token loop, on a small shape and on the
real weights, and checks that the graph replay reproduces the eager output.
It stops if any of these disagree.

On the GPU machine (one H200, ~1-2 min):

    python3 tools/bench_torch_moe.py --out torch_moe.jsonl

writes one JSON object per (routing, tokens) line:

    {"routing", "tokens", "median_ms", "min_ms", "touched_experts",
     "bf16_bytes", "gbps", "tflops", "graph", "torch", "device",
     plus "pairs", "experts", "topk", "hidden", "width", "layout"}

and `moeserve bench kernels --torch torch_moe.jsonl` reads those lines and
prints the speedup of its NVFP4 grouped-MoE kernels over them.

--layout nk stores the weights as [E, N, K] and passes the transposed view
(mat_b column-major, as torchtitan does); the default kn passes [E, K, N]
row-major. Both are valid operands; run both to take the faster baseline.
--device cpu runs the same code eagerly, timed with perf_counter, for a smoke
test on small shapes where the CPU build of torch has _grouped_mm.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as tfn
except ImportError:  # --help works without torch
    torch = None
    tfn = None

ROUTINGS = ("random", "skewed")
ZIPF_S = 1.2


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="BF16 torch._grouped_mm MoE-layer baseline for "
                    "`moeserve bench kernels --torch FILE`.")
    p.add_argument("--experts", type=int, default=256, help="routed experts E (256)")
    p.add_argument("--topk", type=int, default=8, help="experts per token k (8)")
    p.add_argument("--hidden", type=int, default=6144, help="hidden size D (6144)")
    p.add_argument("--width", type=int, default=2048, help="expert width F (2048)")
    p.add_argument("--tokens", default="1,8,64,256,512,2048,8192",
                   help="comma-separated token counts T")
    p.add_argument("--routing", default="random,skewed",
                   help="comma-separated routings: random, skewed")
    p.add_argument("--iters", type=int, default=20, help="timed replays per point (20)")
    p.add_argument("--warmup", type=int, default=5, help="eager warm-up runs per point (5)")
    p.add_argument("--out", metavar="FILE", help="write one JSON object per point here")
    p.add_argument("--seed", type=int, default=0, help="weights and routing seed (0)")
    p.add_argument("--layout", choices=("kn", "nk"), default="kn",
                   help="weight storage: kn = [E, K, N] row-major (default), "
                        "nk = [E, N, K] passed transposed")
    p.add_argument("--no-graph", action="store_true", help="time eager runs, no CUDA graph")
    p.add_argument("--check-only", action="store_true",
                   help="run the correctness checks and exit")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test)")
    a = p.parse_args(argv)
    try:
        a.tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
    except ValueError:
        p.error("--tokens: comma-separated integers expected")
    a.routing = [r.strip() for r in a.routing.split(",") if r.strip()]
    for r in a.routing:
        if r not in ROUTINGS:
            p.error("--routing: unknown routing %r (random, skewed)" % r)
    if not a.tokens or min(a.tokens) < 1:
        p.error("--tokens: positive integers expected")
    if a.experts < 1 or not 1 <= a.topk <= a.experts:
        p.error("need 1 <= --topk <= --experts")
    if a.hidden % 8 or a.width % 8 or a.hidden < 8 or a.width < 8:
        p.error("--hidden and --width must be positive multiples of 8 "
                "(_grouped_mm needs 16-byte aligned BF16 rows)")
    if a.iters < 1 or a.warmup < 0:
        p.error("need --iters >= 1 and --warmup >= 0")
    return a


# ----------------------------------------------------------------------------
# weights, routing


def make_weights(E, D, F, layout, device, seed):
    """w13 [E, D, 2F] (gate | up) and w2 [E, F, D] as the operands passed to
    _grouped_mm; with layout nk they are transposed views of [E, N, K]."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def one(k, n):
        shape = (E, k, n) if layout == "kn" else (E, n, k)
        w = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16)
        w.mul_(0.02)
        return w if layout == "kn" else w.transpose(1, 2)

    w13 = one(D, 2 * F)
    w2 = one(F, D)
    return w13, w2


def make_routing(kind, T, E, k, seed):
    """Expert ids [T, k] int64 (distinct per token) and routing weights
    [T, k] float32, on the CPU with their own generator, so a point's routing
    depends only on (seed, kind, T, E, k), not on the device or the order."""
    g = torch.Generator()
    g.manual_seed((seed * 1000003 + T * 7919 + ROUTINGS.index(kind) * 31) % (2 ** 62))
    if kind == "random":
        ids = torch.rand(T, E, generator=g).topk(k, dim=1).indices
    else:
        perm = torch.randperm(E, generator=g)
        w = torch.empty(E)
        w[perm] = 1.0 / torch.arange(1, E + 1, dtype=torch.float32) ** ZIPF_S
        ids = torch.multinomial(w.expand(T, E), k, replacement=False, generator=g)
    wts = torch.softmax(torch.randn(T, k, generator=g), dim=1)
    return ids.to(torch.int64), wts


# ----------------------------------------------------------------------------
# the timed region


def moe_forward(x, ids, wts, w13, w2):
    """One routed-MoE layer: x [T, D] bf16, ids [T, k] int64, wts [T, k] bf16
    -> [T, D] bf16. No host synchronisation (CUDA-graph capturable)."""
    T, k = ids.shape
    E = w13.shape[0]
    F = w2.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    tok = torch.div(order, k, rounding_mode="floor")
    xs = x.index_select(0, tok)
    h = torch._grouped_mm(xs, w13, offs=offs)
    a = tfn.silu(h[:, :F]) * h[:, F:]
    y = torch._grouped_mm(a, w2, offs=offs)
    y = y * wts.reshape(-1).index_select(0, order).unsqueeze(1)
    out = torch.zeros_like(x)
    out.index_add_(0, tok, y)
    return out


# ----------------------------------------------------------------------------
# correctness checks


def rel_err(got, ref):
    """max |got - ref| / max |ref|, in float32."""
    got = got.float()
    ref = ref.float()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def check_grouped_mm(a, w, offs, what, tol=1e-2):
    """_grouped_mm(a [M, K], w [E, K, N], offs) against a per-expert loop of
    plain float32 matmul over the row ranges offs[e-1]:offs[e]."""
    got = torch._grouped_mm(a, w, offs=offs)
    assert got.shape == (a.shape[0], w.shape[2]), (what, tuple(got.shape))
    ref = torch.zeros(a.shape[0], w.shape[2], dtype=torch.float32, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            ref[start:end] = a[start:end].float() @ w[e].float()
        start = end
    err = rel_err(got, ref)
    if not err <= tol:
        sys.exit("FAIL: %s: torch._grouped_mm differs from the per-expert matmul "
                 "loop (max rel err %.3g > %.g)" % (what, err, tol))
    return err


def reference_layer(x, ids, wts, w13, w2):
    """The layer as a per-token loop in float32 (no intermediate rounding)."""
    F = w2.shape[1]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(ids.shape[0]):
        xt = x[t].float()
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = xt @ w13[e].float()
            a = tfn.silu(h[:F]) * h[F:]
            out[t] += float(wts[t, j]) * (a @ w2[e].float())
    return out


def check_layer(x, ids, wts, w13, w2, what, tol=2e-2):
    got = moe_forward(x, ids, wts, w13, w2)
    err = rel_err(got, reference_layer(x, ids, wts, w13, w2))
    if not err <= tol:
        sys.exit("FAIL: %s: MoE layer differs from the per-token reference "
                 "(max rel err %.3g > %.g)" % (what, err, tol))
    return err


def offsets_of(ids, E):
    counts = torch.bincount(ids.reshape(-1).cpu(), minlength=E)
    return torch.cumsum(counts, 0).to(torch.int32).to(ids.device)


def run_checks(args, device, w13, w2):
    """Small synthetic shape first (empty groups, both layouts), then the
    real weights at a few tokens. Returns a one-line summary."""
    msgs = []
    g = torch.Generator(device="cpu")
    g.manual_seed(args.seed + 12345)
    E, k, D, F, T = 6, 2, 64, 32, 11
    for layout in ("kn", "nk"):
        sw13, sw2 = make_weights(E, D, F, layout, device, args.seed + 1)
        r = torch.rand(T, E, generator=g)
        r[:, 3] = -1.0  # expert 3 gets no rows: an empty group
        ids = r.topk(k, dim=1).indices.to(device)
        wts = torch.softmax(torch.randn(T, k, generator=g), 1).to(device, torch.bfloat16)
        x = torch.randn(T, D, generator=g).to(device, torch.bfloat16)
        order = torch.argsort(ids.reshape(-1), stable=True)
        xs = x.index_select(0, torch.div(order, k, rounding_mode="floor"))
        offs = offsets_of(ids, E)
        assert offs[3] == offs[2], "the check wants an empty group"
        check_grouped_mm(xs, sw13, offs, "small %s w13" % layout)
        check_layer(x, ids, wts, sw13, sw2, "small %s layer" % layout)
    msgs.append("small shape ok")

    E, D = w13.shape[0], w13.shape[1]
    T = 3
    ids, wts = make_routing("random", T, E, args.topk, args.seed + 777)
    ids = ids.to(device)
    wts = wts.to(device, torch.bfloat16)
    x = torch.randn(T, D, generator=g).to(device, torch.bfloat16)
    order = torch.argsort(ids.reshape(-1), stable=True)
    xs = x.index_select(0, torch.div(order, args.topk, rounding_mode="floor"))
    offs = offsets_of(ids, E)
    e1 = check_grouped_mm(xs, w13, offs, "full-shape w13")
    err = check_layer(x, ids, wts, w13, w2, "full-shape layer")
    msgs.append("full shape ok (w13 rel err %.2g, layer rel err %.2g)" % (e1, err))
    return "; ".join(msgs)


# ----------------------------------------------------------------------------
# timing


def time_point(args, device, x, ids, wts, w13, w2):
    """Returns (list of ms per run, graph used?, note)."""
    fwd = lambda: moe_forward(x, ids, wts, w13, w2)  # noqa: E731
    if device.type != "cuda":
        for _ in range(args.warmup):
            fwd()
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            fwd()
            times.append((time.perf_counter() - t0) * 1e3)
        return times, False, ""

    # warm-up on a side stream, as recommended before capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(args.warmup, 1)):
            ref = fwd()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = None
    note = ""
    if not args.no_graph:
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                static_out = fwd()
            g.replay()
            torch.cuda.synchronize()
            err = rel_err(static_out, ref)
            if not err <= 2e-2:
                sys.exit("FAIL: graph replay differs from the eager run "
                         "(max rel err %.3g)" % err)
            graph = g
        except Exception as exc:  # capture failed: time eager runs
            torch.cuda.synchronize()
            note = "graph capture failed (%s: %s); eager" % (
                type(exc).__name__, str(exc).splitlines()[0][:120])
            del g
    run = graph.replay if graph is not None else fwd

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
    for i in range(args.iters):
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    used = graph is not None
    del graph, run
    return times, used, note


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        sys.exit("torch is not importable")
    if not hasattr(torch, "_grouped_mm"):
        sys.exit("this torch (%s) has no torch._grouped_mm" % torch.__version__)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device (use --device cpu for a smoke test)")
        dev_name = torch.cuda.get_device_name(device)
        cap = torch.cuda.get_device_capability(device)
        fast = cap in ((9, 0), (10, 0))
        dev_line = "%s (sm%d%d; %s)" % (
            dev_name, cap[0], cap[1],
            "CUTLASS grouped GEMM" if fast
            else "NOT sm90/sm100: torch falls back to a per-group mm loop with a host sync")
    else:
        dev_name = "cpu"
        dev_line = "cpu (eager, perf_counter timing)"

    E, k, D, F = args.experts, args.topk, args.hidden, args.width
    torch.manual_seed(args.seed)
    w13, w2 = make_weights(E, D, F, args.layout, device, args.seed)
    wbytes = (w13.numel() + w2.numel()) * 2
    print("torch %s, %s" % (torch.__version__, dev_line))
    print("MoE layer: E=%d top-%d D=%d F=%d, BF16 weights %.2f GB, layout %s"
          % (E, k, D, F, wbytes / 1e9, args.layout))
    print("check: " + run_checks(args, device, w13, w2), flush=True)
    if args.check_only:
        return 0

    out_f = open(args.out, "w") if args.out else None
    hdr = "%-7s %6s %6s %7s %9s %9s %9s %8s %8s  %s" % (
        "routing", "T", "pairs", "touched", "MB", "median_ms", "min_ms",
        "GB/s", "TFLOP/s", "graph")
    print(hdr)
    print("-" * len(hdr), flush=True)
    for routing in args.routing:
        for T in args.tokens:
            ids, wts = make_routing(routing, T, E, k, args.seed)
            touched = int(torch.unique(ids).numel())
            P = T * k
            ids = ids.to(device)
            wts = wts.to(device, torch.bfloat16)
            gx = torch.Generator(device=device)
            gx.manual_seed(args.seed + T)
            x = torch.randn(T, D, generator=gx, device=device, dtype=torch.bfloat16)
            times, graph, note = time_point(args, device, x, ids, wts, w13, w2)
            med = statistics.median(times)
            mn = min(times)
            nbytes = touched * 3 * D * F * 2
            flops = 2 * P * D * 2 * F + 2 * P * F * D
            gbps = nbytes / (med * 1e-3) / 1e9
            tflops = flops / (med * 1e-3) / 1e12
            print("%-7s %6d %6d %7d %9.1f %9.4f %9.4f %8.1f %8.2f  %s%s" % (
                routing, T, P, touched, nbytes / 1e6, med, mn, gbps, tflops,
                "yes" if graph else "no", ("  " + note) if note else ""), flush=True)
            if out_f:
                rec = {
                    "routing": routing, "tokens": T,
                    "median_ms": round(med, 5), "min_ms": round(mn, 5),
                    "touched_experts": touched, "bf16_bytes": nbytes,
                    "gbps": round(gbps, 2), "tflops": round(tflops, 3),
                    "graph": graph, "torch": torch.__version__, "device": dev_name,
                    "pairs": P, "experts": E, "topk": k, "hidden": D, "width": F,
                    "layout": args.layout,
                }
                assert all(math.isfinite(v) for v in (med, mn, gbps, tflops))
                out_f.write(json.dumps(rec) + "\n")
                out_f.flush()
            del x, ids, wts
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if out_f:
        out_f.close()
        print("wrote " + args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
