#!/bin/bash
# Session 27's serving call, part A (dev/serving/README.md): llama-server travels in two halves
# (its CUDA code is 42 MB compressed, the device's tree limit 64 MiB), so part A keeps the first
# half in /tmp for part B on the same warm machine, runs the CUDA tests of the GQA kernel and the
# padded FFN widths, then moeserve at concurrency 1, 64 and 256. carry-a/ carried.
cd "$(dirname "$0")/../.."
R=/tmp/res; mkdir -p $R
C=$PWD/carry-a
[ -f $C/ls.part1 ] && cp $C/ls.part1 /tmp/ls.part1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
for f in mn tc; do xz -dkf $C/$f.xz; chmod +x $C/$f; done
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64
S=$SECONDS
for t in cuda_attention_gqa cuda_padded_ffn_logits; do
    MOESERVE_BIN=$C/mn timeout 60 $C/tc $t >> $R/test.txt 2>&1
    echo "test_cuda $t rc=$? $((SECONDS - S)) s"
done
grep -E "FAIL|passed|tiny-air" $R/test.txt | head -12
timeout 400 env OUT=$R CARRY=$C P1=2 ROUNDS=1 BENCH_TIMEOUT=120 bash dev/serving/run.sh moe 16 1,64,256 2>&1 | tee $R/moe.log
echo "part A $((SECONDS - S)) s"
tar czf $OUT/res-a.tgz -C $R .
