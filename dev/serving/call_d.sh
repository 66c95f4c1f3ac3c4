#!/bin/bash
# Part D: where a step's time goes with the engine alone (bench model, diagnose --model) at batch
# 1 and 64 on the 46-layer shape; then W4A16 activations split against BF16: perplexity of the
# built-in model on the GPU, and serving at 1 and 64 on the 16-layer shape with BF16 activations
# (call_a.sh ran the split default). carry-d/ (moeserve, its libraries, the tokenizer) carried.
cd "$(dirname "$0")/../.."
R=/tmp/resd; mkdir -p $R
C=$PWD/carry-d
xz -dkf $C/mn.xz && chmod +x $C/mn
[ -f $C/tokenizer.json ] || xz -dkf $C/tokenizer.json.xz
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64
S=$SECONDS
for b in ${BATCHES:-1 64}; do
    timeout ${MT:-150} env OUT=$R CARRY=$C bash dev/serving/run.sh model 46 $b 2>&1 | tail -16 | tee -a $R/model.log
    mv $R/diagnose-model-air46.json $R/diagnose-model-air46-b$b.json 2>/dev/null
    mv $R/bench-model-air46.txt $R/bench-model-air46-b$b.txt 2>/dev/null
done
echo "model parts $((SECONDS - S)) s"
timeout ${AT:-100} env OUT=$R CARRY=$C bash dev/serving/run.sh act 2>&1 | tee $R/act.log
MOESERVE_W4_ACT=bf16 timeout ${ST:-150} env OUT=$R CARRY=$C P1=2 ROUNDS=1 BENCH_TIMEOUT=60 TAG=h200-bf16act \
    bash dev/serving/run.sh moe 16 ${SL:-1,64} 2>&1 | tee $R/moe-bf16.log
echo "part D $((SECONDS - S)) s"
tar czf $OUT/res-d.tgz -C $R .
