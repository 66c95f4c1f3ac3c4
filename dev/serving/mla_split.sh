#!/bin/bash
# Steps that mix prompt chunks with decodes on GLM-5's shape (dummy NVFP4 weights, 6 layers, one
# GPU): A = mn-old (the expanded MLA form for every sequence of such a step) against B = mn (the
# decoding sequences beside the chunks in the absorbed form), serve under bench serve at 64 and
# 128 concurrent requests of 1024 + 128 tokens, A B A B on the same machine; then the whole
# test_cuda suite (FULL=SECONDS, tc.xz carried). carry-f/ carried (mn.xz, mn-old.xz, tokenizer.json.xz, lib/). Results in
# $OUT/results.tgz.
R=$OUT; OUT=$(mktemp -d)
C=$PWD/carry-f; for b in mn mn-old; do xz -dkf $C/$b.xz; chmod +x $C/$b; done; export LD_LIBRARY_PATH=$C/lib
export MOESERVE_BIN=$C/mn
nvidia-smi --query-gpu=name --format=csv,noheader
# serve needs a tokenizer: GLM-4.5's (carry-f/tokenizer.json.xz), with the vocabulary it numbers
# (151,552 rows of embedding and lm_head instead of GLM-5's 154,880)
M=/tmp/glm5; mkdir -p $M; xz -dc $C/tokenizer.json.xz > $M/tokenizer.json
sed -e 's/"vocab_size": *[0-9]*/"vocab_size": 151552/' -e 's/"pad_token_id": *[0-9]*/"pad_token_id": 151329/' \
    -e 's/"eos_token_id": *\[[^]]*\]/"eos_token_id": [151329, 151336, 151338]/' tests/data/configs/glm5/config.json > $M/config.json
for r in ${ROUNDS:-1 2}; do for v in mn-old mn; do
  $C/$v serve --model $M --dummy-weights --num-layers 6 --device cuda --port 8123 --max-running-requests 256 \
      > $OUT/serve-$v-$r.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -sf -o /dev/null http://127.0.0.1:8123/health && break; sleep 0.5; done
  for c in 64 128; do
    timeout 150 $C/mn bench serve --base-url http://127.0.0.1:8123 --dataset-name random-ids --random-vocab-size 150000 \
        --random-input-len 1024 --random-output-len 128 --random-range-ratio 1 --num-prompts $((2 * c)) --max-concurrency $c \
        --label $v-c$c-r$r --output-file $OUT/bench.jsonl > $OUT/bench-$v-c$c-$r.txt 2>&1
    echo "$v r$r c$c rc=$?: $(grep -iE 'output token throughput|median tpot|median ttft' $OUT/bench-$v-c$c-$r.txt | tr -s ' ' | tr '\n' ';')"
  done
  kill $pid; wait $pid 2>/dev/null
done; done
if [ -n "$FULL" ]; then xz -dkf $C/tc.xz; chmod +x $C/tc; timeout "$FULL" $C/tc > $OUT/test_cuda_all.txt 2>&1; echo "test_cuda all rc=$?"; tail -1 $OUT/test_cuda_all.txt; grep -B2 -A3 FAIL $OUT/test_cuda_all.txt | head -30; fi
cd $OUT && tar czf $R/results.tgz *
