#!/bin/bash
# dev/cuda/ab.sh: variants of the kernels (environment switches of one binary) timed by `moeserve
# bench kernels` alternately, round after round, in one device call, with the SM clock logged, so
# that the between-call spread (sessions 13-19) stays out of the comparison. Here (no GPU): build
# and strip moeserve into carry/ (check_gpu.sh's header); on the device, with carry/ carried:
#
#   bash dev/cuda/ab.sh ROUNDS "BENCH ARGS" NAME:ENV[:MORE BENCH ARGS] ...
#   bash dev/cuda/ab.sh 3 "--no-moe --rows 1,4,8 --iters 20" A:MOESERVE_W4_SK_CLUSTER=1 B:
#
# Each round runs every activation form in $ACTS (default "bf16 split") and every variant NAME with
# its ENV (space-separated VAR=value, none for the tree's defaults) and its own bench arguments
# after a second colon (e.g. WG:MOESERVE_W4_LT_ROWS=0:--tile 36, the dense split-K wgmma tile by its
# index in `moeserve tune`'s table), after a header line
# `=== round R act A var NAME`, into $OUT/ab.txt; nvidia-smi's clocks, power and throttle reasons every 200 ms
# go to $OUT/ab_clocks.txt; tools/bench_ab.py prints the medians at the end (python3 is on the device).
set -u
R=${1:?rounds}; ARGS=${2:?bench arguments}; shift 2
[ $# -ge 1 ] || { echo "ab.sh: name at least one variant (NAME:ENV)"; exit 2; }
export LD_LIBRARY_PATH=$PWD/carry/lib:${LD_LIBRARY_PATH:-}
B=${B:-./carry/moeserve}
OUT=${OUT:-/tmp}
ACTS=${ACTS:-bf16 split}
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 200 > $OUT/ab_clocks.txt 2>&1 &
DMON=$!
for r in $(seq 1 $R); do
  for a in $ACTS; do
    for v in "$@"; do
      name=${v%%:*}; rest=${v#*:}; envs=${rest%%:*}; extra=""
      [ "$rest" != "$envs" ] && extra=${rest#*:}
      echo "=== round $r act $a var $name"
      # shellcheck disable=SC2086
      env MOESERVE_W4_ACT=$a $envs timeout 300 $B bench kernels $ARGS $extra 2>&1
      echo "(exit $?)"
    done
  done
done > $OUT/ab.txt
kill $DMON 2>/dev/null
python3 tools/bench_ab.py $OUT/ab.txt --base "${1%%:*}" | tee $OUT/ab_summary.txt
