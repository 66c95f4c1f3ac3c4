#!/bin/bash
# dev/cuda/check_wg.sh: the GPU checks of w4_wg_v1.patch and mla_decode_v2.patch, in one device
# call (~7 min of an H200). Here (no GPU): git apply both patches; make -j2 BUILD=build-gpu
# build-gpu/moeserve build-gpu/test_cuda; strip both into carry/ (gitignored, with carry/lib holding
# libmicrohttpd.so.12 and libutf8proc.so.2); then on the device: bash dev/cuda/check_wg.sh (logs
# into $OUT).
export LD_LIBRARY_PATH=$PWD/carry/lib:$LD_LIBRARY_PATH PATH=$PATH:/usr/local/cuda/bin
export MOESERVE_BIN=$PWD/carry/moeserve
B=./carry/moeserve
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# correctness first: every tile, wg ones included, against the CPU twin (0-300 pairs per expert)
timeout 150 ./carry/test_cuda cuda_w4_moe_ragged > $OUT/ragged.log 2>&1; echo "ragged rc=$? $(tail -1 $OUT/ragged.log)"
grep FAIL $OUT/ragged.log | head -12
for t in cuda_moe cuda_tune cuda_golden cuda_attention_mla cuda_graph; do
  timeout 90 ./carry/test_cuda $t > $OUT/$t.log 2>&1; echo "$t rc=$? $(tail -1 $OUT/$t.log)"
done
# speed, BF16 activations then the split default: the wg tiles against the best earlier ones
for t in 22 23 24 25 26 19 1 12; do
  echo "== tile $t bf16"
  MOESERVE_W4_ACT=bf16 timeout 40 $B bench kernels --tokens 64,256,512,2048,8192 --no-dense --routing random --iters 10 --tile $t 2>&1 | grep -E "^random|rror"
done | tee $OUT/wg_bench_bf16.txt
for t in 22 26 19 1; do
  echo "== tile $t split"
  timeout 40 $B bench kernels --tokens 256,512,2048,8192 --no-dense --routing random --iters 10 --tile $t 2>&1 | grep -E "^random|rror"
done | tee $OUT/wg_bench_split.txt
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 10 ./carry/test_cuda cuda_w4_moe_ragged \
  > $OUT/ragged_memcheck.log 2>&1
echo "ragged memcheck rc=$? $(grep 'ERROR SUMMARY' $OUT/ragged_memcheck.log | tail -1)"
# MLA decode: v1 (CUDA cores) against v2 (tensor cores), 6 GLM-5 layers at a 2048-token context
for k in v1 v2; do
  echo "== MLA $k"
  MOESERVE_MLA_KERNEL=$k timeout 60 $B bench model --model tests/data/configs/glm5 --dummy-weights --num-layers 6 \
    --device cuda --batch 1,16,64 --input-len 2048 --output-len 8 2>&1 | grep -v "^upload\|^engine" | tail -4
done | tee $OUT/mla_bench.txt
