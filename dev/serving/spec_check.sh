#!/bin/bash
# Speculative decoding on one GPU, the built-in NVFP4 model (M= to change): the CUDA graph tests
# (test_cuda "graph": decode and verification steps, the MTP layer's passes), greedy output with
# drafts equal to without (generate, K = 1 and 3, 3 runs each, interleaved), and with BENCH=1 bench
# model without drafts, with K = 3 eagerly and with K = 3 from graphs, 3 runs each. carry-f/ carried (moeserve and test_cuda xz'd
# as mn.xz and tc.xz, and lib/ with the libraries the GPU machine lacks). Results in
# $OUT/results.tgz (FULL=SECONDS: the whole test_cuda suite too).
R=$OUT; OUT=$(mktemp -d)
C=$PWD/carry-f; for b in mn tc; do xz -dkf $C/$b.xz; chmod +x $C/$b; done; export LD_LIBRARY_PATH=$C/lib
export MOESERVE_BIN=$C/mn
M=${M:-models/builtin-nvfp4}
P="Applying the attribute to a function f allows code within f to get a hint of the Location of the topmost tracked call"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 $C/tc graph > $OUT/test_cuda_graph.txt 2>&1; echo "test_cuda graph rc=$?"; grep -E "passed|FAIL|graphs:" $OUT/test_cuda_graph.txt
for r in 1 2 3; do  # generate: 200 greedy tokens without drafts, with K = 1 and 3, interleaved
  $C/mn generate $M --device cuda --prompt "$P" --max-tokens 200 --temperature 0 --ignore-eos > $OUT/plain.txt 2> $OUT/plain-$r.err; echo "plain $r rc=$?"
  for K in 1 3; do $C/mn generate $M --device cuda --prompt "$P" --max-tokens 200 --temperature 0 --ignore-eos --speculative-config "{\"num_speculative_tokens\":$K}" > $OUT/spec$K.txt 2> $OUT/spec$K-$r.err; echo "spec$K $r rc=$?"; cmp $OUT/plain.txt $OUT/spec$K.txt && echo "spec$K equal"; done
done
tail -qn1 $OUT/plain-*.err $OUT/spec1-*.err $OUT/spec3-*.err
[ -n "$BENCH" ] || { [ -z "$FULL" ] || { timeout "$FULL" $C/tc > $OUT/test_cuda_all.txt 2>&1; echo "test_cuda all rc=$?"; tail -1 $OUT/test_cuda_all.txt; }; cd $OUT && tar czf $R/results.tgz *.txt *.err; exit 0; }
S='--speculative-config {"num_speculative_tokens":3}'
for r in 1 2 3; do
  timeout 120 $C/mn bench model $M --device cuda --batch 1,16,64 --input-len 128 --output-len 64 --json > $OUT/bm-plain-$r.jsonl 2>$OUT/bm-plain-$r.err; echo "bm plain $r rc=$?"
  timeout 120 $C/mn bench model $M --device cuda --batch 1,16,64 --input-len 128 --output-len 64 --json --disable-cuda-graph $S > $OUT/bm-spec3-eager-$r.jsonl 2>$OUT/bm-spec3-eager-$r.err; echo "bm spec3 eager $r rc=$?"
  timeout 120 $C/mn bench model $M --device cuda --batch 1,16,64 --input-len 128 --output-len 64 --json $S > $OUT/bm-spec3-$r.jsonl 2>$OUT/bm-spec3-$r.err; echo "bm spec3 graphs $r rc=$?"
done
cat $OUT/bm-plain-1.jsonl $OUT/bm-spec3-eager-1.jsonl $OUT/bm-spec3-1.jsonl | cut -c1-400
if [ -n "$FULL" ]; then timeout "$FULL" $C/tc > $OUT/test_cuda_all.txt 2>&1; echo "test_cuda all rc=$?"; tail -3 $OUT/test_cuda_all.txt; grep -B2 -A3 FAIL $OUT/test_cuda_all.txt | head -40; fi
cd $OUT && tar czf $R/results.tgz *.txt *.err *.jsonl
