#!/bin/bash
# A device call (dev/serving/README.md): the CUDA tests of what changed for GLM-4.5-Air's shape
# (the GQA kernel, the padded FFN widths), then moeserve and llama.cpp served on the same GPU.
# carry/: mn.xz, tc.xz (test_cuda), ls.xz, lib/, gguf-py/, air16-vocab.gguf, tokenizer.json.xz.
cd "$(dirname "$0")/../.."
R=/tmp/res; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee $R/gpu.txt
C=$PWD/carry
for f in mn tc ls; do [ -f $C/$f.xz ] && { xz -dkf $C/$f.xz; chmod +x $C/$f; }; done
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64
S=$SECONDS
for t in ${TESTS:-cuda_attention_gqa cuda_padded_ffn_logits cuda_golden_logits cuda_engine_graphs}; do
    MOESERVE_BIN=$C/mn timeout 120 $C/tc $t >> $R/test.txt 2>&1
    echo "test_cuda $t rc=$? $((SECONDS - S)) s"
done
grep -E "FAIL|passed|tiny-air" $R/test.txt | head -24
timeout 300 env OUT=$R BENCH_TIMEOUT=120 bash dev/serving/run.sh moe 16 ${MOE_LEVELS:-1,64,256} 2>&1 | tee $R/moe.log
[ -x $C/ls ] && timeout 300 env OUT=$R P1=4 ROUNDS=1 bash dev/serving/run.sh llama 16 ${LLAMA_LEVELS:-1,256} 2>&1 | tee $R/llama.log
echo "total $((SECONDS - S)) s"
tar czf $OUT/res.tgz -C $R .
