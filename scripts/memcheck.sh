#!/bin/sh
# scripts/memcheck.sh BIN [TEST_CUDA]: compute-sanitizer memcheck over the CUDA forward of the tiny models
# (issue #4): the golden fixtures of both architectures (BF16 and NVFP4) at full length and in
# chunks of 7, MLA's expanded and absorbed forms, an FP8 KV cache, and the built-in model
# generating through the engine (CUDA graphs, greedy and sampled); with TEST_CUDA also the W4A16
# MoE tiles over ragged experts (every tile, prefill ones included). Any error fails the run.
# Run on a machine with a GPU: make test-cuda-memcheck.
set -eu
BIN=${1:-build/moeserve}
SAN=${COMPUTE_SANITIZER:-compute-sanitizer}
command -v "$SAN" >/dev/null 2>&1 || { echo "memcheck: $SAN not found (CUDA toolkit)" >&2; exit 2; }
OUTD=$(mktemp -d)
trap 'rm -rf "$OUTD"' EXIT
run() {
    echo "memcheck: $*"
    "$SAN" --tool memcheck --error-exitcode 9 --leak-check full --print-limit 20 "$@" >"$OUTD/log" 2>&1 ||
        { cat "$OUTD/log"; echo "memcheck: FAILED: $*" >&2; exit 1; }
    grep -q "ERROR SUMMARY: 0 errors" "$OUTD/log" || { cat "$OUTD/log"; echo "memcheck: no clean summary: $*" >&2; exit 1; }
    grep "ERROR SUMMARY\|LEAK SUMMARY" "$OUTD/log" | sed 's/^/    /'
}
for fx in glm5-bf16 glm5-nvfp4 glm5-shared-bf16 glm4moe-bf16 glm4moe-nvfp4; do
    d=tests/data/golden/$fx
    toks=$(tr -d ' \n' <"$d/golden.json" | sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p')
    [ -n "$toks" ] || { echo "memcheck: no tokens in $d/golden.json" >&2; exit 2; }
    run "$BIN" logits --model "$d" --device cuda --tokens "$toks" --out "$OUTD/l.f32"
    run "$BIN" logits --model "$d" --device cuda --tokens "$toks" --chunk 7 --kv-cache-dtype fp8 --out "$OUTD/l.f32"
    case $fx in glm5*) MOESERVE_MLA_EXPAND_MIN=1 MOESERVE_MLA_PIECE=8 run "$BIN" logits --model "$d" --device cuda \
        --tokens "$toks" --out "$OUTD/l.f32" ;; esac
done
run "$BIN" generate --model models/builtin-nvfp4 --device cuda --max-tokens 24 --seed 1 --prompt "The Debian package"
run "$BIN" generate --model models/builtin-nvfp4 --device cuda --max-tokens 24 --seed 1 --temperature 0.8 --top-k 40 \
    --top-p 0.9 --prompt "The Debian package"
if [ -n "${2:-}" ]; then
    run "$2" cuda_w4_moe_ragged
fi
echo "memcheck: clean"
