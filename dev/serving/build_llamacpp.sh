#!/bin/sh
# dev/serving/build_llamacpp.sh: llama.cpp's llama-server with CUDA for the H100/H200 (sm_90a), built
# here (2 cores: about 2-3 hours; the GPU machine's 16 would take minutes of device time), from the
# llama.cpp source vendored unmodified in llama-cpp-python's source distribution on PyPI (the only
# place this machine can fetch it from). Nothing of it is committed.
#   dev/serving/build_llamacpp.sh [DIR]     (default /work/llama.cpp: DIR/src, DIR/build)
set -eu
DIR=${1:-/work/llama.cpp}
VER=${LLAMA_CPP_PYTHON:-0.3.36}    # vendors llama.cpp 0c1e57098bba (2026-10-01)
mkdir -p "$DIR"
if [ ! -d "$DIR/src" ]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$DIR/sdist"
    tar xzf "$DIR/sdist/llama_cpp_python-$VER.tar.gz" -C "$DIR/sdist"
    mv "$DIR/sdist/llama_cpp_python-$VER/vendor/llama.cpp" "$DIR/src"
fi
# static (one binary to carry), CUDA for sm_90a only, FlashAttention for the f16/q4_0/q8_0 caches
# (q8_0 KV needs it), no network features, CPU code for any x86-64 with AVX2
cmake -S "$DIR/src" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_COMPILER=${NVCC:-/usr/local/cuda/bin/nvcc} \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CUDA_NCCL=OFF
nice -n 15 ninja -C "$DIR/build" -j"$(nproc)" llama-server llama-cli llama-bench
