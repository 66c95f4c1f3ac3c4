#!/usr/bin/env python3
"""bench_ab: the medians of `moeserve bench kernels` runs taken in rounds, variant against variant.

dev/cuda/ab.sh (or any loop) writes each run of `moeserve bench kernels` after a header line

    === round 2 act bf16 var B

(`key value` pairs after `===`; every key but `round` names the run's variant). This reads such
logs and prints, for each case (MoE routing and tokens, or dense shape and rows), each variant's
median time over its rounds (and the dense chain time), the min-max, the runs, the median SM clock
(the MHz column, where the bench printed one) and the ratio to the first variant of the same
other keys (e.g. var B against var A within act bf16). Standard library only:

    python3 tools/bench_ab.py LOG [LOG ...] [--base A] [--ignore round,at]
"""
import argparse
import re
import statistics
import sys

MOE = re.compile(r"^(random|skewed)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+\d+\s+([\d.]+)%\s+[\d.]+\s+\S+\s+\S+(?:\s+(\d+))?\s*$")
DENSE = re.compile(r"^(.+?)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+\d+\s+([\d.]+)%\s+[\d.]+\s+[\d.]+%"
                   r"(?:\s+([\d.]+)\s+([\d.]+)%)?(?:\s+(\d+\.\d))?(?:\s+(\d+))?\s*$")
CEIL = re.compile(r"^ceilings: copy ([\d.]+) TB/s")


def parse(lines):
    """-> list of (variant dict, case key, time us, chain us or None, MHz or None, % copy, read floor us or None)"""
    out, var, copy = [], None, None
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("=== "):
            words = line[4:].split()
            var = dict(zip(words[0::2], words[1::2]))
            continue
        if var is None:
            continue
        m = CEIL.match(line)
        if m:
            copy = float(m.group(1))
            continue
        m = MOE.match(line)
        if m:
            key = ("moe", m.group(1), int(m.group(2)))
            out.append((var, key, float(m.group(4)), None, int(m.group(6)) if m.group(6) else None, float(m.group(5)), None))
            continue
        m = DENSE.match(line)
        if m and not line.startswith("shape"):
            key = ("dense", m.group(1).strip(), int(m.group(4)))
            chain = float(m.group(7)) if m.group(7) else None
            pct = float(m.group(8)) if m.group(8) else float(m.group(6))
            out.append((var, key, float(m.group(5)), chain, int(m.group(10)) if m.group(10) else None, pct,
                        float(m.group(9)) if m.group(9) else None))
    return out


def summarize(rows, base=None, ignore=("round", "at")):
    """-> printable lines: per case, per group (the variant keys but `var`/`bin`), per variant"""
    vkey = lambda v: tuple(sorted((k, x) for k, x in v.items() if k not in ignore))
    cases, order = {}, []
    for v, key, t, chain, mhz, pct, rd in rows:
        k = vkey(v)
        if key not in cases:
            cases[key] = {}
            order.append(key)
        cases[key].setdefault(k, []).append((t, chain, mhz, pct, rd))
    lines = []
    for key in order:
        lines.append("%s %s %d" % key)
        by = cases[key]
        groups = {}
        for k in by:
            g = tuple((a, b) for a, b in k if a not in ("var", "bin"))
            groups.setdefault(g, []).append(k)
        for g, ks in groups.items():
            ref = None
            names = [dict(k).get("var", dict(k).get("bin", "")) for k in ks]
            if base in names:
                ks = [ks[names.index(base)]] + [k for k, n in zip(ks, names) if n != base]
            for k in ks:
                runs = by[k]
                ts = [r[0] for r in runs]
                cs = [r[1] for r in runs if r[1] is not None]
                ms = [r[2] for r in runs if r[2] is not None]
                med = statistics.median(cs if cs else ts)  # the ratio: on the chain where there is one
                ref = med if ref is None else ref
                label = " ".join("%s %s" % (a, b) for a, b in k)
                rs = [r[4] for r in runs if r[4] is not None]
                chain = "  chain %8.1f (%.1f-%.1f)" % (med, min(cs), max(cs)) if cs else ""
                chain += "  read floor %.1f" % statistics.median(rs) if rs else ""
                lines.append("  %-28s time %8.1f us (%.1f-%.1f)%s  %d runs%s  x%.3f" % (
                    label, statistics.median(ts), min(ts), max(ts), chain, len(runs),
                    "  %4.0f MHz" % statistics.median(ms) if ms else "", med / ref))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--base", help="the variant (var or bin value) the others are compared with")
    ap.add_argument("--ignore", default="round,at", help="header keys that do not name a variant (default round,at)")
    a = ap.parse_args()
    rows = []
    for p in a.logs:
        with open(p) as f:
            rows += parse(f)
    if not rows:
        sys.exit("bench_ab: no `=== round R ...` headed bench kernels output in %s" % " ".join(a.logs))
    try:
        print("\n".join(summarize(rows, a.base, tuple(a.ignore.split(",")))))
    except BrokenPipeError:  # | head
        pass


if __name__ == "__main__":
    main()
