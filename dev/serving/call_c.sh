#!/bin/bash
# Part C: moeserve on GLM-4.5-Air's whole shape (46 layers, about 69 GB of NVFP4 dummy weights) at
# concurrency 1, 16, 64, 256 and 512 on one H200. carry-b/ carried (moeserve and its libraries).
cd "$(dirname "$0")/../.."
R=/tmp/resc; mkdir -p $R
C=$PWD/carry-b
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
xz -dkf $C/mn.xz && chmod +x $C/mn
S=$SECONDS
timeout ${LIMIT:-560} env OUT=$R CARRY=$C P1=2 ROUNDS=1 BENCH_TIMEOUT=${BT:-240} \
    bash dev/serving/run.sh moe 46 ${LEVELS:-1,16,64,256,512} 2>&1 | tee $R/moe.log
echo "part C $((SECONDS - S)) s"
tar czf $OUT/res-c.tgz -C $R .
