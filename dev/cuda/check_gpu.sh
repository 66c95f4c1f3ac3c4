#!/bin/bash
# dev/cuda/check_gpu.sh: the GPU checks and kernel timings of the tree, in one device call (~6 min
# of an H200). Here (no GPU): make -j2 build/moeserve build/test_cuda; strip both into carry/
# (gitignored; carry/lib holds libmicrohttpd.so.12 and libutf8proc.so.2, which the GPU machine
# lacks); then on the device: bash dev/cuda/check_gpu.sh with carry/ carried (logs into $OUT).
# The numbers go into docs/log/ (the dated experiment) and, where they are the current figures,
# docs/PERFORMANCE.md, with the card and the command.
export LD_LIBRARY_PATH=$PWD/carry/lib:$LD_LIBRARY_PATH PATH=$PATH:/usr/local/cuda/bin
export MOESERVE_BIN=$PWD/carry/moeserve
B=./carry/moeserve
OUT=${OUT:-/tmp}
TJ=docs/data/2026-12-02-h200-torch-grouped-mm.jsonl
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# every CUDA test: each W4A16 tile against the CPU twin, the tuner under 99/101 KB, MLA, graphs
timeout 300 ./carry/test_cuda > $OUT/test_cuda.log 2>&1; echo "test_cuda rc=$? $(tail -1 $OUT/test_cuda.log)"
grep -E "FAIL" $OUT/test_cuda.log | head -12
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 10 ./carry/test_cuda cuda_w4_moe_ragged \
  > $OUT/ragged_memcheck.log 2>&1
echo "ragged memcheck rc=$? $(grep 'ERROR SUMMARY' $OUT/ragged_memcheck.log | tail -1)"
# the MoE layer with the built-in tile choice, both activation modes, against torch._grouped_mm
for m in bf16 split; do
  MOESERVE_W4_ACT=$m timeout 150 $B bench kernels --no-dense --routing random,skewed --iters 20 --torch $TJ \
    > $OUT/bench_$m.txt 2>&1
  echo "== MoE, $m activations rc=$?"; grep -E "^random|^skewed|rror" $OUT/bench_$m.txt
done
# MLA decode: the grouped kernel (CUDA cores) against the tensor cores' (auto, the default), 6 GLM-5
# layers, 2048 context
for k in grouped auto; do
  echo "== MLA $k"
  MOESERVE_MLA_KERNEL=$k timeout 60 $B bench model --model tests/data/configs/glm5 --dummy-weights --num-layers 6 \
    --device cuda --batch 1,16 --input-len 2048 --output-len 8 2>&1 | grep -v "^upload\|^engine" | tail -3
done
