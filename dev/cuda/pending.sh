#!/bin/bash
# dev/cuda/pending.sh: the measurements the pending patches wait for (dev/cuda/README.md, "Pending"),
# three device calls of ~5 min each. Here (no GPU): apply w4_dense_wg_tt.patch and
# w4_moe_hot_beside.patch to a copy of the tree, build moeserve and test_cuda, strip and `xz -9e`
# them into carry/mn.xz and carry/tc.xz (carry/lib: libmicrohttpd.so.12, libutf8proc.so.2); on
# the device, with carry/ carried: `bash dev/cuda/pending.sh 1`, then `bash dev/cuda/pending.sh 2`
# (logs and medians under $OUT).
#   1: the CUDA tests of w4, graph and moe (the hot class capped, first and at priority where it
#      runs beside), moe and graph again with the routing's cap (auto:1e9:1: a few blocks, most of
#      the grid leaving at once; then auto's defaults), then tile 36 at 65-255 rows against tile 7 (MOESERVE_W4_WG_TT=0|1), and at 256-512 rows the
#      cuBLASLt route against tile 7 and tile 36
#   2: the hot class beside the call's tile on 44 or 66 SMs, launched first or at a higher stream
#      priority, or on the SMs the routing kernel gives it (auto; S1 twice: the spread between
#      processes), the routing's cap at 1024-2048 tokens, the dense read floor at 1-16 rows (the
#      fused shapes among them)
#   3: every CUDA test, then bench model at batch 1/32/64 with the same-input linears fused and
#      apart (MOESERVE_FUSE), both activation forms, two rounds (~6 min)
set -u
cd "$(dirname "$0")/../.."
for f in mn tc; do xz -dkf carry/$f.xz; chmod +x carry/$f; done
export LD_LIBRARY_PATH=$PWD/carry/lib
OUT=${OUT:-/tmp}
S=$SECONDS
case "${1:-}" in
1)
  for t in w4 graph moe; do
    MOESERVE_W4_MOE_HOT_BLOCKS=7 MOESERVE_W4_MOE_HOT_FIRST=1 MOESERVE_W4_MOE_HOT_PRIO=1 MOESERVE_BIN=$PWD/carry/mn timeout 120 ./carry/tc $t >> $OUT/test.txt 2>&1
    echo "test $t rc=$? t=$((SECONDS-S))" | tee -a $OUT/test.txt
  done
  for cap in auto:1e9:1 auto; do
    for t in moe graph; do
      MOESERVE_W4_MOE_HOT_BLOCKS=$cap MOESERVE_W4_MOE_HOT_PRIO=1 MOESERVE_BIN=$PWD/carry/mn timeout 120 ./carry/tc $t >> $OUT/test.txt 2>&1
      echo "test $t cap $cap rc=$? t=$((SECONDS-S))" | tee -a $OUT/test.txt
    done
  done
  grep -E "FAIL|passed" $OUT/test.txt | head -20
  mkdir -p $OUT/tt $OUT/lt
  OUT=$OUT/tt B=./carry/mn bash dev/cuda/ab.sh 2 "--no-moe --rows 65,96,128,192,255 --iters 20" A:MOESERVE_W4_WG_TT=0 B: |
    grep -A4 -E "^dense glm5 (dense gate/up|o_proj|q_b)" | head -120
  echo "t=$((SECONDS-S))"
  OUT=$OUT/lt B=./carry/mn bash dev/cuda/ab.sh 2 "--no-moe --rows 256,384,512 --iters 20" LT: T7:MOESERVE_W4_LT_ROWS=0 \
    "T36:MOESERVE_W4_LT_ROWS=0:--tile 36" | grep -A6 -E "^dense glm5 (dense gate/up|o_proj|q_b)" | head -80
  echo "t=$((SECONDS-S))"
  ;;
2)
  mkdir -p $OUT/hot $OUT/floor
  OUT=$OUT/hot B=./carry/mn bash dev/cuda/ab.sh 2 "--no-dense --tokens 256,512 --iters 20" S1: S1b: S2:MOESERVE_W4_MOE_SIDE=2 \
    "S2A:MOESERVE_W4_MOE_SIDE=2 MOESERVE_W4_MOE_HOT_BLOCKS=auto" \
    "S2AP:MOESERVE_W4_MOE_SIDE=2 MOESERVE_W4_MOE_HOT_BLOCKS=auto MOESERVE_W4_MOE_HOT_PRIO=1" \
    "S2H44F:MOESERVE_W4_MOE_SIDE=2 MOESERVE_W4_MOE_HOT_BLOCKS=44 MOESERVE_W4_MOE_HOT_FIRST=1" \
    "S2H66F:MOESERVE_W4_MOE_SIDE=2 MOESERVE_W4_MOE_HOT_BLOCKS=66 MOESERVE_W4_MOE_HOT_FIRST=1" \
    "S2H66P:MOESERVE_W4_MOE_SIDE=2 MOESERVE_W4_MOE_HOT_BLOCKS=66 MOESERVE_W4_MOE_HOT_PRIO=1" | head -90
  echo "t=$((SECONDS-S))"
  mkdir -p $OUT/hot2 # the routing's cap where the hot class is most of the work (a fixed cap would slow it)
  OUT=$OUT/hot2 B=./carry/mn bash dev/cuda/ab.sh 1 "--no-dense --tokens 1024,2048 --iters 10" S1: \
    "S2AP:MOESERVE_W4_MOE_SIDE=2 MOESERVE_W4_MOE_HOT_BLOCKS=auto MOESERVE_W4_MOE_HOT_PRIO=1" | head -40
  echo "t=$((SECONDS-S))"
  OUT=$OUT/floor B=./carry/mn bash dev/cuda/ab.sh 1 "--no-moe --rows 1,4,8,16 --iters 20" final: | head -100
  echo "t=$((SECONDS-S))"
  ;;
3)
  # every CUDA test on the tree (fused linears: golden logits, dummy weights against the CPU, the
  # strided swiglu), then end to end the fused linears (MOESERVE_FUSE=1, the default) against them
  # apart, two rounds
  MOESERVE_BIN=$PWD/carry/mn timeout 240 ./carry/tc > $OUT/test3.txt 2>&1
  echo "test_cuda rc=$? t=$((SECONDS-S))"; grep -E "FAIL|passed" $OUT/test3.txt | head -20
  for round in 1 2; do
    for act in bf16 split; do
      for fz in 1 0; do
        echo "=== round $round act $act fuse $fz"
        MOESERVE_FUSE=$fz MOESERVE_W4_ACT=$act timeout 120 ./carry/mn bench model --model tests/data/configs/glm5 \
          --dummy-weights --num-layers 6 --device cuda --batch 1,32,64 --input-len 128 --output-len 32 2>&1 |
          grep -v "^upload\|^engine" | tail -5
      done
    done
  done | tee $OUT/model.txt
  echo "t=$((SECONDS-S))"
  ;;
*) echo "usage: bash dev/cuda/pending.sh 1|2|3 (on the device, carry/ carried)"; exit 2 ;;
esac
