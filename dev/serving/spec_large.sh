#!/bin/bash
# Speculative decoding's step on GLM-5's shape (dummy NVFP4 weights, 6 layers and the MTP layer,
# on one GPU): bench model without drafts, with K = 1 and 3, and K = 3 with a 32,768-id draft
# vocabulary, 2 runs each (random weights: the drafts are rejected, so TPOT is the step's time).
# Before them, A = mn-old against B = mn on the built-in NVFP4 model, 3 runs each, the same
# machine. carry-f/ carried (mn.xz, mn-old.xz, lib/). Results in $OUT/results.tgz.
R=$OUT; OUT=$(mktemp -d)
C=$PWD/carry-f; for b in mn mn-old; do xz -dkf $C/$b.xz; chmod +x $C/$b; done; export LD_LIBRARY_PATH=$C/lib
nvidia-smi --query-gpu=name --format=csv,noheader
S3='--speculative-config {"num_speculative_tokens":3}'
for r in 1 2 3; do for v in mn-old mn; do
  timeout 60 $C/$v bench model models/builtin-nvfp4 --device cuda --batch 1,16,64 --input-len 128 --output-len 64 --json > $OUT/ab-$v-plain-$r.jsonl 2>/dev/null
  timeout 60 $C/$v bench model models/builtin-nvfp4 --device cuda --batch 1,16,64 --input-len 128 --output-len 64 --json $S3 > $OUT/ab-$v-spec3-$r.jsonl 2>/dev/null
  echo "ab $v $r: $(grep -o '"tpot_ms": [0-9.]*' $OUT/ab-$v-plain-$r.jsonl | cut -d' ' -f2 | tr '\n' ' ') / $(grep -o '"tpot_ms": [0-9.]*' $OUT/ab-$v-spec3-$r.jsonl | cut -d' ' -f2 | tr '\n' ' ')"
done; done
M=tests/data/configs/glm5
G="--model $M --dummy-weights --num-layers 6 --device cuda --batch 1,16,64 --input-len 128 --output-len 32 --json"
for r in 1 2; do
  for v in plain k1 k3 k3dv; do
    case $v in plain) X=();; k1) X=(--speculative-config '{"num_speculative_tokens":1}');; k3) X=(--speculative-config '{"num_speculative_tokens":3}');;
      k3dv) X=(--speculative-config '{"num_speculative_tokens":3,"draft_vocab_size":32768}');; esac
    t0=$SECONDS; timeout 150 $C/mn bench model $G "${X[@]}" > $OUT/glm5-$v-$r.jsonl 2> $OUT/glm5-$v-$r.err
    echo "glm5 $v $r rc=$? $((SECONDS - t0)) s: $(grep -o '"tpot_ms": [0-9.]*\|"accept_length": [0-9.]*' $OUT/glm5-$v-$r.jsonl | cut -d' ' -f2 | tr '\n' ' ')"
  done
done
cd $OUT && tar czf $R/results.tgz *
