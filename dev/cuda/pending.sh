#!/bin/bash
# dev/cuda/pending.sh: the measurements waiting for a device call (dev/cuda/README.md, "Pending").
# Here (no GPU): build moeserve and test_cuda, strip them and `xz -9e` them into carry/mn.xz and
# carry/tc.xz (carry/lib: libmicrohttpd.so.12, libutf8proc.so.2); on the device, with carry/
# carried: `bash dev/cuda/pending.sh 1` (logs and medians under $OUT).
#   1 (session 22, ~6 min): every CUDA test (tile 36 above 64 rows, in token tiles of 64, is the
#     built-in dense choice below MOESERVE_W4_LT_ROWS, now 1536); then where tile 36 and the BF16 +
#     cuBLASLt route meet, at 512-4096 rows (LT: the route from 1 row; T36: never the route); then
#     bench model with the route from 256 rows (the choice before session 22) against the default,
#     at prompts of 512 and 2048 tokens (measured: docs/log/2026-12-02-w4a16-kernels-sessions-1-26.md,
#     session 22)
#   2 (session 22, ~4 min): every CUDA test, then the route's rows by weight (1536 where tile 36
#     runs the call, 256 where it does not: kv_a, q_a+kv_a) against 256 for all (OLD) at 256-1024
#     rows, and bench model at prompts of 512 both ways, two rounds
#   3 (session 22, ~4 min): the expanded MLA form's piece kernel on the tensor cores (v1) against
#     v0: its tests first, then every CUDA test, then `moeserve diagnose` (attention's share of a
#     prefill step) and `bench model` prefill at prompts of 512 and 2048 tokens, v0 and v1 (run in
#     session 22 on the tree; session 23 with mla_piece_v2.patch applied, since in the tree)
#   4 (session 23, ~1 min, run): the dense GEMMs at 1-16 rows, both forms, two rounds, with their read
#     floor (`read us`: the same chain of launches only reading the weights)
#   5 (session 23, ~2 min, run): the piece kernels v0, v1 (mla_piece_v2.patch applied) and v3 (the keys
#     and values as BF16 halves in global memory, staged by cp.async in two stages, 128 queries a
#     block): the mla tests (all three kernels), `diagnose` at prompts of 512 and 2048, `bench model`
#     at 2048, v1 against v3 in two rounds (v3 was MOESERVE_MLA_PIECE_KERNEL=v3 then; now the default,
#     so this case runs v3 for v3 and v1 for v1 still)
#   6 (session 23, ~7 min): v3 the default: every CUDA test, scripts/memcheck.sh, bench model v3 / v1;
#     the dense GEMMs at 9-16 rows, tile 35 (the built-in stream-K) against tile 36, one round (run
#     in session 24 on an H100: the piece kernel choice at 99 KB failed, memcheck found the test
#     process's backend never given back, and the T36 variant was cut in two by the shell)
#   7 (session 24, ~3 min): 6's checks again after the fixes (v1's rows end in its dynamic shared
#     memory, the test's backends destroyed at exit), then tile 35 against tile 36 at 9-16 rows, one round
#   8 (session 25, ~3 min on an H100; run there, the sweep still wanted on an H200): every CUDA test; issue #5's acceptance sweep on one tree (the MoE layer
#     at 1-8192 tokens, both routings, both forms, against the torch baseline; the dense GEMMs at
#     1-16 and 4096 rows with their read floor); then where the stream-K tile's time goes at 1 and 16
#     rows: carry/lab.xz is moeserve with dev/cuda/w4_sk_lab.patch (MOESERVE_W4_SK_LAB bits, timing
#     only, wrong results: 1 no staging, 2 no MMA, 4 no shared-memory B loads, 8 no decode), two rounds.
#     With three binaries in carry/ the tree passes the device's 64 MiB: move
#     models/builtin/model.safetensors aside for the call (no CUDA test reads it) and back after.
#   9 (session 26, ~4 min): every CUDA test, then issue #5's acceptance sweep (as 8, without the
#     stream-K probe) in two rounds, so that each figure is the median of two calls of 20 replays
#     and the between-round spread is in the log (carry/mn and carry/tc only: under the 64 MiB)
#   10 (session 26, ~3 min): every CUDA test (then with cuda_shared_side_equals_in_order), then `bench
#     model` on the 6-layer GLM-5 dummy at batch 1, 4, 16 and 64, the shared expert in order (S0:
#     MOESERVE_SHARED_SIDE=0), beside up to 16 rows (S16, the default) and up to 64 (S64), two rounds
#   11 (session 26, ~1 min): 10's bench model alone, S0 and S16 alternated in six rounds, 64 tokens out
#   12 (session 26, ~4 min): every CUDA test (cuda_side_equals_in_order: the shared expert and the
#     indexer beside), scripts/memcheck.sh, then `bench model` as 11 with four variants alternated in
#     six rounds: both in order (N: MOESERVE_SHARED_SIDE=0 MOESERVE_INDEXER_SIDE=0), the shared expert
#     beside (S), the indexer beside (I), both (SI: the defaults)
set -u
cd "$(dirname "$0")/../.."
for f in mn tc lab; do [ -f carry/$f.xz ] && { xz -dkf carry/$f.xz; chmod +x carry/$f; }; done
export LD_LIBRARY_PATH=$PWD/carry/lib
OUT=${OUT:-/tmp}
S=$SECONDS
case "${1:-}" in
1)
  MOESERVE_BIN=$PWD/carry/mn timeout 240 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -20
  mkdir -p $OUT/lt
  OUT=$OUT/lt B=./carry/mn bash dev/cuda/ab.sh 2 "--no-moe --rows 512,1024,1536,2048,4096 --iters 10" LT:MOESERVE_W4_LT_ROWS=1 \
    T36:MOESERVE_W4_LT_ROWS=0 | head -200
  echo "t=$((SECONDS-S))"
  for round in 1 2; do
    for act in bf16 split; do
      for lt in 256 1536; do
        for il in 512 2048; do
          echo "=== round $round act $act lt_rows $lt input $il"
          MOESERVE_W4_LT_ROWS=$lt MOESERVE_W4_ACT=$act timeout 120 ./carry/mn bench model --model tests/data/configs/glm5 \
            --dummy-weights --num-layers 6 --device cuda --batch 1,4 --input-len $il --output-len 16 2>&1 |
            grep -v "^upload\|^engine" | tail -3
        done
      done
    done
  done | tee $OUT/model.txt
  echo "t=$((SECONDS-S))"
  ;;
2)
  MOESERVE_BIN=$PWD/carry/mn timeout 240 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -20
  mkdir -p $OUT/lt
  OUT=$OUT/lt B=./carry/mn bash dev/cuda/ab.sh 2 "--no-moe --rows 256,512,1024 --iters 10" OLD:MOESERVE_W4_LT_ROWS=256 NEW: |
    grep -A4 -E "^dense glm5 (kv_a|q_a\+kv_a|dense gate/up|q_b)" | head -100
  echo "t=$((SECONDS-S))"
  for round in 1 2; do
    for act in bf16 split; do
      for lt in 256 default; do
        echo "=== round $round act $act lt_rows $lt input 512"
        env $([ $lt = default ] || echo MOESERVE_W4_LT_ROWS=$lt) MOESERVE_W4_ACT=$act timeout 120 ./carry/mn bench model \
          --model tests/data/configs/glm5 --dummy-weights --num-layers 6 --device cuda --batch 1,4 --input-len 512 \
          --output-len 16 2>&1 | grep -v "^upload\|^engine" | tail -3
      done
    done
  done | tee $OUT/model.txt
  echo "t=$((SECONDS-S))"
  ;;
3)
  MOESERVE_BIN=$PWD/carry/mn timeout 120 ./carry/tc mla > $OUT/test_mla.txt 2>&1
  echo "mla tests rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test_mla.txt | head -30
  MOESERVE_BIN=$PWD/carry/mn timeout 240 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -20
  for il in 512 2048; do
    for k in v0 v1; do
      echo "=== diagnose input $il piece kernel $k"
      MOESERVE_MLA_PIECE_KERNEL=$k timeout 60 ./carry/mn diagnose --model tests/data/configs/glm5 --dummy-weights --num-layers 6 \
        --device cuda --batch 1 --input-len $il --output-len 4 --requests 1 --profile-every 1 2>&1 |
        grep -E "^(dense GEMM|MoE GEMM|attention|indexer|norms) | a step takes"
    done
  done | tee $OUT/diag.txt
  for k in v0 v1 v0 v1; do
    echo "=== bench model piece kernel $k"
    MOESERVE_MLA_PIECE_KERNEL=$k timeout 90 ./carry/mn bench model --model tests/data/configs/glm5 --dummy-weights \
      --num-layers 6 --device cuda --batch 1,4 --input-len 2048 --output-len 8 2>&1 | grep -v "^upload\|^engine" | tail -3
  done | tee $OUT/model.txt
  echo "t=$((SECONDS-S))"
  ;;
4)
  # the dense GEMMs at 1-16 rows against their read floor (`read us`, session 20; never run yet)
  mkdir -p $OUT/dense
  OUT=$OUT/dense B=./carry/mn bash dev/cuda/ab.sh 2 "--no-moe --rows 1,2,4,8,12,16 --iters 20" T: | tail -80
  echo "t=$((SECONDS-S))"
  ;;
5)
  # session 23: the piece kernels v0, v1 (with mla_piece_v2.patch) and v3 (the halves by cp.async)
  MOESERVE_BIN=$PWD/carry/mn timeout 150 ./carry/tc mla > $OUT/test_mla.txt 2>&1
  echo "mla tests rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test_mla.txt | head -30
  for il in 512 2048; do
    for k in v0 v1 v3; do
      [ $il = 512 ] && [ $k = v0 ] && continue
      echo "=== diagnose input $il piece kernel $k"
      MOESERVE_MLA_PIECE_KERNEL=$k timeout 60 ./carry/mn diagnose --model tests/data/configs/glm5 --dummy-weights --num-layers 6 \
        --device cuda --batch 1 --input-len $il --output-len 4 --requests 1 --profile-every 1 2>&1 |
        grep -E "^(dense GEMM|MoE GEMM|attention|indexer|norms) | a step takes"
    done
  done | tee $OUT/diag.txt
  echo "t=$((SECONDS-S))"
  for k in v1 v3 v1 v3; do
    echo "=== bench model piece kernel $k"
    MOESERVE_MLA_PIECE_KERNEL=$k timeout 90 ./carry/mn bench model --model tests/data/configs/glm5 --dummy-weights \
      --num-layers 6 --device cuda --batch 1,4 --input-len 2048 --output-len 8 2>&1 | grep -v "^upload\|^engine" | tail -3
  done | tee $OUT/model.txt
  echo "t=$((SECONDS-S))"
  ;;
6)
  # session 23: v3 the default (its halves reserved): every CUDA test, memcheck, bench model v3 / v1;
  # then the dense GEMMs at 9-16 rows on the built-in tile 35 (stream-K) against tile 36
  MOESERVE_BIN=$PWD/carry/mn timeout 200 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -20
  MOESERVE_BIN=$PWD/carry/mn timeout 200 sh scripts/memcheck.sh ./carry/mn ./carry/tc > $OUT/memcheck.txt 2>&1
  echo "memcheck rc=$? t=$((SECONDS-S))"; tail -4 $OUT/memcheck.txt
  for k in default v1; do
    echo "=== bench model piece kernel $k"
    env $([ $k = default ] || echo MOESERVE_MLA_PIECE_KERNEL=$k) timeout 90 ./carry/mn bench model --model tests/data/configs/glm5 \
      --dummy-weights --num-layers 6 --device cuda --batch 1,4 --input-len 2048 --output-len 8 2>&1 | grep -v "^upload\|^engine" | tail -3
  done | tee $OUT/model.txt
  mkdir -p $OUT/dense
  OUT=$OUT/dense B=./carry/mn bash dev/cuda/ab.sh 1 "--no-moe --rows 9,12,16 --iters 20" T35: T36::--tile 36 | tail -5
  echo "t=$((SECONDS-S))"
  ;;
7)
  MOESERVE_BIN=$PWD/carry/mn timeout 200 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -10
  MOESERVE_BIN=$PWD/carry/mn timeout 200 sh scripts/memcheck.sh ./carry/mn ./carry/tc > $OUT/memcheck.txt 2>&1
  echo "memcheck rc=$? t=$((SECONDS-S))"; grep -E "FAIL|Leaked|clean" $OUT/memcheck.txt | head -10
  mkdir -p $OUT/dense
  OUT=$OUT/dense B=./carry/mn bash dev/cuda/ab.sh 1 "--no-moe --rows 9,12,16 --iters 20" T35: "T36::--tile 36" >/dev/null
  grep -E "^dense|T3" $OUT/dense/ab_summary.txt | head -90
  echo "t=$((SECONDS-S))"
  ;;
8)
  MOESERVE_BIN=$PWD/carry/mn timeout 200 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -10
  mkdir -p $OUT/lab
  OUT=$OUT/lab B=./carry/lab ACTS=bf16 bash dev/cuda/ab.sh 2 "--no-moe --rows 1,16 --iters 20" L0: L1:MOESERVE_W4_SK_LAB=1 \
    L2:MOESERVE_W4_SK_LAB=2 L4:MOESERVE_W4_SK_LAB=4 L8:MOESERVE_W4_SK_LAB=8 L15:MOESERVE_W4_SK_LAB=15 >/dev/null
  echo "lab t=$((SECONDS-S))"
  for a in bf16 split; do
    MOESERVE_W4_ACT=$a timeout 150 ./carry/mn bench kernels --no-dense --tokens 1,8,64,256,512,2048,8192 \
      --routing random,skewed --iters 20 --torch docs/data/2026-12-02-h200-torch-grouped-mm.jsonl > $OUT/moe_$a.txt 2>&1
    echo "moe $a rc=$? t=$((SECONDS-S))"
  done
  for a in bf16 split; do
    MOESERVE_W4_ACT=$a timeout 100 ./carry/mn bench kernels --no-moe --rows 1,4,8,16,4096 --iters 20 > $OUT/dense_$a.txt 2>&1
    echo "dense $a rc=$? t=$((SECONDS-S))"
  done
  ;;
9)
  MOESERVE_BIN=$PWD/carry/mn timeout 200 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -10
  for r in 1 2; do
    for a in bf16 split; do
      MOESERVE_W4_ACT=$a timeout 150 ./carry/mn bench kernels --no-dense --tokens 1,8,64,256,512,2048,8192 \
        --routing random,skewed --iters 20 --torch docs/data/2026-12-02-h200-torch-grouped-mm.jsonl > $OUT/moe_${a}_$r.txt 2>&1
      echo "moe $a round $r rc=$? t=$((SECONDS-S))"
    done
    for a in bf16 split; do
      MOESERVE_W4_ACT=$a timeout 100 ./carry/mn bench kernels --no-moe --rows 1,4,8,16,4096 --iters 20 > $OUT/dense_${a}_$r.txt 2>&1
      echo "dense $a round $r rc=$? t=$((SECONDS-S))"
    done
  done
  ;;
10)
  MOESERVE_BIN=$PWD/carry/mn timeout 200 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -10
  for r in 1 2; do
    for v in 0 16 64; do
      echo "=== round $r S$v"
      MOESERVE_SHARED_SIDE=$v timeout 150 ./carry/mn bench model --model tests/data/configs/glm5 --dummy-weights --num-layers 6 \
        --device cuda --batch 1,4,16,64 --input-len 128 --output-len 32 2>&1 | grep -v "^upload\|^engine" | tail -6
      echo "t=$((SECONDS-S))"
    done
  done | tee $OUT/model.txt
  ;;
11)
  for r in 1 2 3 4 5 6; do
    for v in 0 16; do
      echo "=== round $r S$v"
      MOESERVE_SHARED_SIDE=$v timeout 150 ./carry/mn bench model --model tests/data/configs/glm5 --dummy-weights --num-layers 6 \
        --device cuda --batch 1,4,16 --input-len 128 --output-len 64 2>&1 | grep -v "^upload\|^engine" | tail -5
    done
  done | tee $OUT/model.txt
  echo "t=$((SECONDS-S))"
  ;;
12)
  MOESERVE_BIN=$PWD/carry/mn timeout 200 ./carry/tc > $OUT/test.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test.txt | head -10
  MOESERVE_BIN=$PWD/carry/mn timeout 200 sh scripts/memcheck.sh ./carry/mn ./carry/tc > $OUT/memcheck.txt 2>&1
  echo "memcheck rc=$? t=$((SECONDS-S))"; tail -1 $OUT/memcheck.txt
  for r in 1 2 3 4 5 6; do
    for v in N:0:0 S:16:0 I:0:16 SI:16:16; do
      IFS=: read -r name se ix <<< "$v"
      echo "=== round $r $name"
      MOESERVE_SHARED_SIDE=$se MOESERVE_INDEXER_SIDE=$ix timeout 150 ./carry/mn bench model --model tests/data/configs/glm5 \
        --dummy-weights --num-layers 6 --device cuda --batch 1,4,16 --input-len 128 --output-len 64 2>&1 |
        grep -v "^upload\|^engine" | tail -5
    done
  done > $OUT/model.txt
  echo "t=$((SECONDS-S))"
  ;;
*) echo "usage: bash dev/cuda/pending.sh 1|2|3|4|5|6|7|8|9|10|11|12 (on the device, carry/ carried)"; exit 2 ;;
esac
