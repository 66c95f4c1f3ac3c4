#!/bin/bash
# dev/serving/run.sh: moeserve serving on one GPU under `bench serve`, and llama.cpp beside it
# (dev/serving/README.md). Run on the GPU machine from the repository root with carry/ carried:
#   carry/mn.xz        moeserve, built and stripped here (dev/serving/pack.sh)
#   carry/lib/         libmicrohttpd.so.12, libutf8proc.so.2 (the GPU machine lacks them)
#   carry/ls.xz        llama-server built here with CUDA for sm_90a (dev/serving/build_llamacpp.sh)
#   carry/gguf-py/     llama.cpp's gguf-py; carry/air<N>-vocab.gguf its converter's --vocab-only output
#   carry/tokenizer.json.xz  the GLM-4.5 tokenizer (the model directory's)
# Parts (each prints a table last; every bench line goes to $OUT/*.jsonl):
#   moe N LEVELS [EXTRA]     moeserve serve, GLM-4.5-Air's shape, N layers, NVFP4 dummy weights, FP8 KV;
#                            bench serve at each concurrency of LEVELS (comma list), diagnose --url sampled
#   llama N LEVELS           llama-server on the same shape in Q4_0 (tools/gguf_dummy.py), q8_0 KV,
#                            as many slots as the concurrency, one server per level
#   model N BATCHES          bench model and diagnose --model (the engine without HTTP)
#   act                      W4A16 activations BF16 against split halves: perplexity of the built-in
#                            NVFP4 model on the GPU, serving at 64 on the 16-layer shape
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
C=${CARRY:-$ROOT/carry}
for f in mn ls; do [ -f $C/$f.xz ] && [ ! -x $C/$f ] && { xz -dkf $C/$f.xz; chmod +x $C/$f; }; done
[ -f $C/tokenizer.json.xz ] && [ ! -f $C/tokenizer.json ] && xz -dkf $C/tokenizer.json.xz
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
MN=${MN:-$C/mn}
LS=${LS:-$C/ls}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -cd 'A-Za-z0-9 ')
TAG=${TAG:-$(case "$GPU" in *H200*) echo h200;; *H100*) echo h100;; *) echo cpu;; esac)}
IN=${IN:-1024}
OUTLEN=${OUTLEN:-512}
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*"; }

# the model directory: GLM-4.5-Air's config.json and its tokenizer
model_dir() {
    local d=/tmp/air
    mkdir -p $d
    cp ${CONFIG:-$ROOT/tests/data/configs/glm4.5-air/config.json} $d/config.json
    [ -f $C/tokenizer.json ] && cp $C/tokenizer.json $d/
    [ -f $ROOT/${TOKDIR:-}/tokenizer.json ] && cp $ROOT/$TOKDIR/tokenizer.json $d/
    echo $d
}

wait_up() { # url seconds
    local i
    for ((i = 0; i < $2 * 2; i++)); do
        curl -sf -o /dev/null "$1/health" && return 0
        sleep 0.5
    done
    return 1
}

# prompts a level gets: a few at 1, two rounds above
prompts_for() {
    local c=$1 n=$(($1 * ${ROUNDS:-2}))
    [ $c -le 1 ] && n=${P1:-4}
    [ $n -gt ${PMAX:-512} ] && n=$(( c > ${PMAX:-512} ? c : ${PMAX:-512} ))
    echo $n
}

bench() { # url label conc file
    local n=$(prompts_for $3)
    timeout ${BENCH_TIMEOUT:-300} $MN bench serve --base-url $1 --dataset-name random-ids --random-input-len $IN \
        --random-output-len $OUTLEN --random-range-ratio 1 --num-prompts $n --max-concurrency $3 --temperature 0 \
        --label $2 --output-file $4 --quiet 2>&1 | grep -E "Successful|Failed|Peak concurrent|Output token|Mean TTFT|Median TTFT|Mean TPOT|Median TPOT|P99 TPOT|sent again|reason|Benchmark duration|error"
}

# diagnose --url every 10 s while a bench runs (the last answer is the run's steady state)
diag_loop() { # url file
    while sleep ${DIAG_EVERY:-10}; do $MN diagnose --url $1 --json >> $2 2>/dev/null || true; done
}

part_moe() { # N LEVELS [extra serve options]
    local N=$1 LEVELS=$2; shift 2
    local M=$(model_dir) port=8000 url=http://127.0.0.1:8000 log=$OUT/serve-moe-$N.log
    local maxc=$(echo $LEVELS | tr , '\n' | sort -n | tail -1)
    say "moeserve serve: $N layers, levels $LEVELS, $*"
    $MN serve --model $M --dummy-weights --num-layers $N --kv-cache-dtype fp8 --port $port \
        --max-running-requests $maxc --served-model-name glm45air-$N "$@" > $log 2>&1 &
    local pid=$!
    if ! wait_up $url 300; then say "serve did not come up"; tail -20 $log; kill $pid; return 1; fi
    say "up: $(grep -E 'KV|kv' $log | tail -2 | tr '\n' ' ')"
    for c in $(echo $LEVELS | tr , ' '); do
        local f=$OUT/moeserve-$TAG-air$N-tp1.jsonl
        diag_loop $url $OUT/diag-air$N-c$c.jsonl & local dl=$!
        say "bench concurrency $c"
        bench $url moeserve-air$N-c$c $c $f
        kill $dl 2>/dev/null; wait $dl 2>/dev/null
    done
    curl -s $url/metrics | grep -E "^moeserve_(preempt|requests|kv|steps)" | head -20 > $OUT/metrics-air$N.txt
    kill -TERM $pid; wait $pid
    say "serve stopped"
}

part_llama() { # N LEVELS
    local N=$1 LEVELS=$2
    local M=$(model_dir) g=/tmp/air$N.gguf url=http://127.0.0.1:8001
    if [ ! -f $g ]; then
        say "gguf: writing $g"
        PYTHONPATH=$C/gguf-py python3 tools/gguf_dummy.py --model $M --vocab $C/air$N-vocab.gguf --out $g || return 1
        say "gguf written: $(du -h $g | cut -f1)"
    fi
    for c in $(echo $LEVELS | tr , ' '); do
        local ctx=$(( c * (IN + OUTLEN + 64) )) log=$OUT/llama-server-$N-c$c.log
        say "llama-server: $N layers, $c slots, context $ctx"
        $LS -m $g -ngl 999 -fa on -ctk q8_0 -ctv q8_0 -np $c -c $ctx --port 8001 --host 127.0.0.1 \
            --no-webui ${LLAMA_EXTRA:-} > $log 2>&1 &
        local pid=$!
        if ! wait_up $url 300; then say "llama-server did not come up"; tail -30 $log; kill $pid; return 1; fi
        bench $url llamacpp-air$N-c$c $c $OUT/llamacpp-$TAG-air$N.jsonl
        kill -TERM $pid; wait $pid
    done
}

part_model() { # N BATCHES
    local M=$(model_dir)
    say "bench model: $1 layers, batch $2"
    timeout 300 $MN bench model --model $M --dummy-weights --num-layers $1 --kv-cache-dtype fp8 --batch $2 \
        --input-len $IN --output-len 64 --warmup 1 2>&1 | grep -v "^upload" | tail -12 | tee $OUT/bench-model-air$1.txt
    say "diagnose --model: $1 layers, batch $2"
    timeout 300 $MN diagnose --model $M --dummy-weights --num-layers $1 --kv-cache-dtype fp8 --batch $2 \
        --input-len $IN --output-len 32 --json > $OUT/diagnose-model-air$1.json 2> $OUT/diagnose-model-air$1.log
    tail -3 $OUT/diagnose-model-air$1.log
}

part_act() {
    for a in split bf16; do
        say "perplexity, W4 activations $a"
        MOESERVE_W4_ACT=$a timeout 120 $MN perplexity --model models/builtin-nvfp4 --text-file tests/data/heldout.txt \
            --device cuda --json 2>/dev/null | tee $OUT/ppl-$a.json
        echo
    done
}

case "${1:-}" in
moe) shift; part_moe "$@" ;;
llama) shift; part_llama "$@" ;;
model) shift; part_model "$@" ;;
act) shift; part_act "$@" ;;
*) echo "usage: dev/serving/run.sh moe|llama|model|act ..."; exit 2 ;;
esac
