#!/bin/bash
# Part B (see call_a.sh): llama-server from the two halves, the same model shape in Q4_0, at
# concurrency 1 and 256, on the machine part A ran on. carry-b/ carried.
cd "$(dirname "$0")/../.."
R=/tmp/resb; mkdir -p $R
C=$PWD/carry-b
[ -f $C/ls.part1 ] && cp $C/ls.part1 /tmp/ls.part1
[ -f /tmp/ls.part1 ] || { echo "part A's half is not here: another machine"; exit 3; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
cat /tmp/ls.part1 $C/ls.part2 | xz -d > $C/ls && chmod +x $C/ls
xz -dkf $C/mn.xz && chmod +x $C/mn
xz -dkf $C/air16-vocab.gguf.xz
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64
S=$SECONDS
timeout ${LIMIT:-530} env OUT=$R CARRY=$C P1=2 ROUNDS=1 BENCH_TIMEOUT=${BT:-200} bash dev/serving/run.sh llama 16 ${LEVELS:-1,256} 2>&1 | tee $R/llama.log
echo "part B $((SECONDS - S)) s"
tar czf $OUT/res-b.tgz -C $R .
