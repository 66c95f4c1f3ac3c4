#!/usr/bin/env python3
"""sass_compare: show that kernels which only moved between source files (or were renamed) still
compile to the same machine code, on a machine without a GPU.

  tools/sass_compare.py dump OUT.json build/src/backend/cuda/*.o
      every kernel of the objects' sm_* code (cuobjdump --dump-sass): its name, its object and its
      instructions with their encodings (control bits included), addresses dropped
  tools/sass_compare.py compare BEFORE.json AFTER.json [--rename OLD=NEW ...] [--loose]
      matches the kernels by name (mangled; --rename substitutes OLD by NEW in the demangled
      names of BEFORE first, so that a renamed kernel meets its new name), then says which are
      identical, which differ (and where first), which went and which are new. Exit status 1
      when any differs. --loose ignores the offsets of relocated globals (c[0x4][...]), which
      depend on what else the object holds.

cuobjdump and nvdisasm come with the CUDA toolkit (or pip's nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm); put their directory on PATH or in $CUOBJDUMP_DIR. c++filt demangles. """
import json
import os
import re
import subprocess
import sys

ADDR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*")
ENC = re.compile(r"/\*\s*(0x[0-9a-f]{16})\s*\*/")


def tool(name):
    d = os.environ.get("CUOBJDUMP_DIR")
    return os.path.join(d, name) if d else name


def dump(out, objs):
    kernels = {}
    for obj in objs:
        env = dict(os.environ)
        if os.environ.get("CUOBJDUMP_DIR"):
            env["PATH"] = os.environ["CUOBJDUMP_DIR"] + os.pathsep + env.get("PATH", "")
        r = subprocess.run([tool("cuobjdump"), "--dump-sass", obj], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            if "does not contain device code" in r.stdout + r.stderr:
                continue  # a host-only object (a .c file beside the .cu ones)
            sys.exit(f"sass_compare: cuobjdump {obj}: {r.stderr.strip()}")
        text = r.stdout
        name, arch, body = None, None, []

        def close():
            if name is not None:
                key = name + "@" + (arch or "?")
                if key in kernels:
                    sys.exit(f"sass_compare: {key} in both {kernels[key]['obj']} and {obj}")
                kernels[key] = {"obj": os.path.basename(obj), "sass": body}

        for line in text.splitlines():
            m = re.match(r"\s*code for (sm_\w+)", line)
            if m:
                close()
                name, body, arch = None, [], m.group(1)
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                close()
                name, body = m.group(1), []
                continue
            if name is None or line.strip().startswith(".headerflags"):
                continue
            encs = ENC.findall(line)
            ins = ENC.sub("", ADDR.sub("", line)).strip()
            if ins:
                body.append(ins + " " + " ".join(encs))
            elif encs and body:
                body[-1] += " " + " ".join(encs)
        close()
    with open(out, "w") as f:
        json.dump(kernels, f, indent=0, sort_keys=True)
    print(f"{len(kernels)} kernels from {len(objs)} objects -> {out}")


def demangle(names):
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, r.stdout.splitlines()))


def loosen(lines):
    return [re.sub(r"c\[0x4\]\[0x[0-9a-f]+\]", "c[0x4][*]", re.sub(r"\s*0x[0-9a-f]{16}", "", l)) if "c[0x4]" in l else l
            for l in lines]


def compare(before, after, renames, loose):
    a = json.load(open(before))
    b = json.load(open(after))
    da, db = demangle(list(a)), demangle(list(b))
    # the demangled name (renamed) -> the key, for each side
    def renamed(s):
        for old, new in renames:
            s = re.sub(r"\b" + re.escape(old) + r"\b", new, s)
        return s
    byname_a = {renamed(da[k]): k for k in a}
    byname_b = {db[k]: k for k in b}
    same, differ = [], []
    for n in sorted(byname_a):
        if n not in byname_b:
            continue
        x, y = a[byname_a[n]]["sass"], b[byname_b[n]]["sass"]
        if loose:
            x, y = loosen(x), loosen(y)
        if x == y:
            same.append(n)
        else:
            i = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            differ.append((n, len(x), len(y), i, x[i] if i < len(x) else "(end)", y[i] if i < len(y) else "(end)"))
    gone = sorted(set(byname_a) - set(byname_b))
    new = sorted(set(byname_b) - set(byname_a))
    print(f"identical: {len(same)} kernels; different: {len(differ)}; only before: {len(gone)}; only after: {len(new)}")
    for n, lx, ly, i, p, q in differ:
        print(f"DIFFERENT {n}\n    {lx} -> {ly} instructions, first difference at {i}:\n    before: {p}\n    after:  {q}")
    for n in gone:
        print(f"ONLY BEFORE {n}  ({a[byname_a[n]]['obj']})")
    for n in new:
        print(f"ONLY AFTER {n}  ({b[byname_b[n]]['obj']})")
    if os.environ.get("SASS_LIST"):
        for n in same:
            print(f"same {n}  ({a[byname_a[n]]['obj']} -> {b[byname_b[n]]['obj']})")
    return 1 if differ else 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "dump":
        dump(argv[1], argv[2:])
        return 0
    if len(argv) >= 3 and argv[0] == "compare":
        renames, loose, rest = [], False, argv[3:]
        while rest:
            if rest[0] == "--rename" and len(rest) > 1 and "=" in rest[1]:
                renames.append(tuple(rest[1].split("=", 1)))
                rest = rest[2:]
            elif rest[0] == "--loose":
                loose, rest = True, rest[1:]
            else:
                sys.exit(f"sass_compare: unknown argument {rest[0]}")
        return compare(argv[1], argv[2], renames, loose)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
