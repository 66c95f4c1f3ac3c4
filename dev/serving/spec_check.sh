#!/bin/bash
# Speculative decoding on one GPU: greedy output with drafts equal to without (generate, K = 1 and 3),
# and bench model with and without K = 3 drafts, on the built-in model. carry-e/ carried (moeserve
# xz'd and the libraries the GPU machine lacks). Results under $OUT.
C=$PWD/carry-e; xz -dkf $C/mn.xz; chmod +x $C/mn; export LD_LIBRARY_PATH=$C/lib
M=models/builtin
P="Applying the attribute to a function f allows code within f to get a hint of the Location of the topmost tracked call"
nvidia-smi --query-gpu=name --format=csv,noheader
$C/mn generate $M --device cuda --prompt "$P" --max-tokens 200 --temperature 0 --ignore-eos > $OUT/plain.txt 2> $OUT/plain.err; echo plain rc=$?
for K in 1 3; do $C/mn generate $M --device cuda --prompt "$P" --max-tokens 200 --temperature 0 --ignore-eos --speculative-config "{\"num_speculative_tokens\":$K}" > $OUT/spec$K.txt 2> $OUT/spec$K.err; echo spec$K rc=$?; cmp $OUT/plain.txt $OUT/spec$K.txt && echo "spec$K equal"; done
tail -1 $OUT/plain.err; tail -1 $OUT/spec1.err; tail -1 $OUT/spec3.err
timeout 120 $C/mn bench model $M --device cuda --batch 1,16,64 --input-len 128 --output-len 64 --json > $OUT/bm-plain.jsonl 2>$OUT/bm-plain.err; echo bm rc=$?
timeout 120 $C/mn bench model $M --device cuda --batch 1,16,64 --input-len 128 --output-len 64 --json --speculative-config '{"num_speculative_tokens":3}' > $OUT/bm-spec3.jsonl 2>$OUT/bm-spec3.err; echo bm3 rc=$?
cat $OUT/bm-plain.jsonl $OUT/bm-spec3.jsonl | cut -c1-300
