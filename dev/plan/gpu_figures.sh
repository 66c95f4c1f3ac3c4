#!/bin/bash
# The GPU figures `plan` is checked against: bench model and diagnose on GLM-5's shape (dummy NVFP4
# weights, 6 and 24 layers; 12 on an H100, where 24 do not fit) at batch 1-256, on one GPU. carry-e/ carried (moeserve xz'd and the
# libraries the GPU machine lacks). Results under $OUT.
cd "$(dirname "$0")/../.."
C=$PWD/carry-e
xz -dkf $C/mn.xz && chmod +x $C/mn
export LD_LIBRARY_PATH=$C/lib:$LD_LIBRARY_PATH
M=tests/data/configs/glm5
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
B=1,2,4,8,16,32,64,128,256
run() { local name=$1; shift; local t0=$SECONDS; timeout ${T:-150} "$@" > $OUT/$name.jsonl 2> $OUT/$name.err; echo "$name rc=$? $((SECONDS - t0)) s"; }
for r in 1 2 3; do
    run bench6-r$r $C/mn bench model --model $M --dummy-weights --num-layers 6 --device cuda --batch $B --input-len 128 --output-len 32 --json
done
run bench6-long $C/mn bench model --model $M --dummy-weights --num-layers 6 --device cuda --batch 1,16,64,256 --input-len 1024 --output-len 32 --json
run diag6 $C/mn diagnose --model $M --dummy-weights --num-layers 6 --device cuda --batch 1,16,64,256 --input-len 128 --output-len 32 --json
for r in 1 2; do
    run bench24-r$r $C/mn bench model --model $M --dummy-weights --num-layers 24 --device cuda --batch $B --input-len 128 --output-len 32 --json
done
run diag24 $C/mn diagnose --model $M --dummy-weights --num-layers 24 --device cuda --batch 1,64,256 --input-len 128 --output-len 32 --json
