#!/bin/bash
# dev/serving/pack.sh: what dev/serving/run.sh needs on the GPU machine, into carry/ (ignored by
# git; name it in the device call's carry). Run here after `make` (moeserve with CUDA) and, for
# the llama part, dev/serving/build_llamacpp.sh and the vocab files (dev/serving/README.md).
set -eu
cd "$(dirname "$0")/../.."
LLAMA=${LLAMA:-/work/llama.cpp}
mkdir -p carry/lib
strip -o carry/mn build/moeserve && xz -T2 -9 -f carry/mn
cp -L /usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12 /usr/lib/x86_64-linux-gnu/libutf8proc.so.2 carry/lib/
[ -f carry/tokenizer.json.xz ] || xz -9 -c ${TOKENIZER:-../shared/assets/tokenizers/glm4/tokenizer.json} > carry/tokenizer.json.xz
rm -f carry/tokenizer.json
if [ -x $LLAMA/build/bin/llama-server ]; then
    strip -o carry/ls $LLAMA/build/bin/llama-server && xz -T2 -9 -f carry/ls
    rm -rf carry/gguf-py && cp -r $LLAMA/src/gguf-py carry/gguf-py && rm -rf carry/gguf-py/tests
fi
for v in ${VOCABS:-}; do cp $v carry/; done
du -sh carry; du -ach carry/* | tail -1
