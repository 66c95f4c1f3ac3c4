# moeserve: make · make test · make debug · make fuzz · make test-cuda · make bench · make clean
# CUDA is built when nvcc is found (CUDA=0 turns it off); CUDA_ARCH picks the GPU code.

CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
BUILD    ?= build
CUDA     ?= $(shell test -x "$(NVCC)" && ls src/backend/cuda/*.cu >/dev/null 2>&1 && echo 1 || echo 0)
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

PKGS     := jansson libpcre2-8 libutf8proc libmicrohttpd libcurl ompi-c
OPT      ?= -O2 -g
SAN      ?=
CFLAGS   := $(OPT) $(SAN) -std=c11 -Wall -Wextra -Wno-format-zero-length -D_GNU_SOURCE -fopenmp -Isrc -Itests $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS   += $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lcurl -lmpi) -fopenmp -lm -lpthread -ldl
NVFLAGS  ?= -O3 -g -lineinfo
NVFLAGS  += -std=c++17 $(CUDA_ARCH) -Isrc -Itests -Xcompiler -Wall,-fPIC

SRC      := $(filter-out src/cli/main.c,$(wildcard src/*/*.c src/*/*/*.c))
CUSRC    := $(wildcard src/backend/cuda/*.cu)
OBJ      := $(SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/builtin_assets.o $(BUILD)/gen/profiles.o
ifeq ($(CUDA),1)
  OBJ    += $(CUSRC:%.cu=$(BUILD)/%.o)
  CFLAGS += -DMOESERVE_CUDA
  # nccl.h and cuda_runtime.h for src/dist/comm_nccl.c (libnccl itself is opened at run time)
  $(BUILD)/src/dist/comm_nccl.o: CFLAGS += -I$(CUDA_HOME)/include
  # the CUDA runtime statically (it finds the driver itself; no libcuda link), cuBLASLt shared
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart_static -ldl -lrt -lstdc++
endif
TESTSRC  := tests/test_main.c tests/server_harness.c tests/batch_fixture.c tests/engine_harness.c $(wildcard tests/unit/*.c)
TESTOBJ  := $(TESTSRC:%.c=$(BUILD)/%.o)
CUTESTOBJ := $(BUILD)/tests/test_main.o $(BUILD)/tests/batch_fixture.o $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/cuda/*.c))

all: $(BUILD)/moeserve

$(BUILD)/libmoeserve.a: $(OBJ)
	@rm -f $@
	ar rcs $@ $^

# `moeserve --version`: the version, the commit built (with -dirty for local changes; "unknown"
# outside git) and the GPU code built. version.h is rewritten only when one of them changes.
VERSION  := 0.1.0
comma    := ,
GIT_COMMIT = $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git rev-parse HEAD >/dev/null 2>&1 && \
             ! git diff --quiet HEAD -- 2>/dev/null && echo -dirty)
CUDA_ARCHS = $(if $(filter 1,$(CUDA)),$(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(CUDA_ARCH)))),CPU only)
$(BUILD)/gen/version.h: FORCE
	@mkdir -p $(dir $@)
	@printf '#define MOESERVE_VERSION "%s"\n#define MOESERVE_GIT_COMMIT "%s"\n#define MOESERVE_CUDA_ARCHS "%s"\n' \
	    '$(VERSION)' '$(GIT_COMMIT)' '$(CUDA_ARCHS)' | cmp -s - $@ || \
	printf '#define MOESERVE_VERSION "%s"\n#define MOESERVE_GIT_COMMIT "%s"\n#define MOESERVE_CUDA_ARCHS "%s"\n' \
	    '$(VERSION)' '$(GIT_COMMIT)' '$(CUDA_ARCHS)' > $@
$(BUILD)/src/cli/main.o: $(BUILD)/gen/version.h
$(BUILD)/src/cli/main.o: CFLAGS += -I$(BUILD)/gen

$(BUILD)/moeserve: $(BUILD)/src/cli/main.o $(BUILD)/libmoeserve.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/test_unit: $(TESTOBJ) $(BUILD)/libmoeserve.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/test_cuda: $(CUTESTOBJ) $(BUILD)/libmoeserve.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# the built-in model's tokenizer, which `moeserve synth` writes into every checkpoint
$(BUILD)/gen/builtin_assets.c: models/builtin/tokenizer.json models/builtin/tokenizer_config.json scripts/embed.sh
	@mkdir -p $(dir $@)
	scripts/embed.sh $@ builtin_tokenizer_json models/builtin/tokenizer.json \
	    builtin_tokenizer_config_json models/builtin/tokenizer_config.json

$(BUILD)/gen/builtin_assets.o: $(BUILD)/gen/builtin_assets.c
	$(CC) $(CFLAGS) -c $< -o $@

# the device and link profiles `moeserve plan` knows by name (profiles/), compiled in: the binary
# finds them from a clone, after `make install`, anywhere
$(BUILD)/gen/profiles.c: $(wildcard profiles/devices/*.json profiles/links/*.json) scripts/embed_profiles.sh
	@mkdir -p $(dir $@)
	scripts/embed_profiles.sh $@

$(BUILD)/gen/profiles.o: $(BUILD)/gen/profiles.c
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu $(BUILD)/cuda_arch.txt
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MD -MF $(@:.o=.d) -c $< -o $@

# what the CUDA objects were built for: rewritten only when CUDA_ARCH changes, which then rebuilds them
$(BUILD)/cuda_arch.txt: FORCE
	@mkdir -p $(dir $@)
	@echo '$(CUDA_ARCH)' | cmp -s - $@ || echo '$(CUDA_ARCH)' > $@
FORCE:
.PHONY: FORCE

# make test: CPU only; every test, then the server tests again under ASan + UBSan (a server
# must survive hostile input without memory errors); ends with "N passed, N failed".
test: $(BUILD)/moeserve $(BUILD)/test_unit
	MOESERVE_BIN=$(CURDIR)/$(BUILD)/moeserve ./$(BUILD)/test_unit $(FILTER)
	$(if $(FILTER),,$(MAKE) test-server-asan)

ASAN_FLAGS = BUILD=build-debug CUDA=0 OPT="-O1 -g -fno-omit-frame-pointer" \
             SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
test-server-asan:
	$(MAKE) $(ASAN_FLAGS) build-debug/moeserve build-debug/test_unit
	MOESERVE_BIN=$(CURDIR)/build-debug/moeserve ./build-debug/test_unit server

# make run: the main job on the built-in default model (an 11 M-parameter GLM-4.5-style MoE
# trained on Debian's documentation, NVFP4, in models/): continue a prompt on the CPU.
DEFAULT_MODEL ?= models/builtin-nvfp4
PROMPT ?= The Debian package management system
run: $(BUILD)/moeserve
	./$(BUILD)/moeserve generate --model $(DEFAULT_MODEL) --device cpu --max-tokens 120 --seed 1 --prompt "$(PROMPT)"

# make test-cuda: on a machine with a GPU: every CUDA op against its CPU twin, end-to-end logits.
test-cuda: $(BUILD)/moeserve $(BUILD)/test_cuda
	MOESERVE_BIN=$(CURDIR)/$(BUILD)/moeserve ./$(BUILD)/test_cuda $(FILTER)

# make test-cuda-memcheck: compute-sanitizer memcheck over the tiny models on the GPU (clean or it fails).
test-cuda-memcheck: $(BUILD)/moeserve $(BUILD)/test_cuda
	MOESERVE_BIN=$(CURDIR)/$(BUILD)/moeserve scripts/memcheck.sh $(BUILD)/moeserve $(BUILD)/test_cuda

# make test-dist: the parallel layouts (under mpirun) and the diagnosis tests alone.
test-dist: $(BUILD)/moeserve $(BUILD)/test_unit
	MOESERVE_BIN=$(CURDIR)/$(BUILD)/moeserve ./$(BUILD)/test_unit dist_
	MOESERVE_BIN=$(CURDIR)/$(BUILD)/moeserve ./$(BUILD)/test_unit diag_

# make fuzz: the libFuzzer harnesses of tests/fuzz/ (clang; ASan + UBSan) over the bytes a model
# directory or a client hands the parsers: the safetensors header, config.json, tokenizer.json,
# chat templates, the HTTP request body. Each runs FUZZ_SECONDS from its seed corpus
# (tests/fuzz/corpus/TARGET) and what earlier runs kept (build-fuzz/corpus/TARGET); an input that
# crashes, leaks, hangs or breaks a harness's check is saved as build-fuzz/crashes/TARGET-*, and
# the run fails. make fuzz FUZZ_TARGETS=config runs one. `make test` needs no clang.
FUZZ_TARGETS ?= safetensors config tokenizer chat_template openai_request
FUZZ_SECONDS ?= 60
FUZZ_FLAGS = BUILD=build-fuzz CUDA=0 CC=clang OPT="-O1 -g -fno-omit-frame-pointer" \
             SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -Wno-pass-failed"
fuzz:
	$(MAKE) $(FUZZ_FLAGS) fuzz-build
	tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-build: $(FUZZ_TARGETS:%=$(BUILD)/fuzz_%)

$(BUILD)/fuzz_%: $(BUILD)/tests/fuzz/fuzz_%.o $(BUILD)/libmoeserve.a
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)
.SECONDARY: $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz/fuzz_%.o)

# make debug: AddressSanitizer + UndefinedBehaviorSanitizer, CPU only, runs the tests.
debug:
	$(MAKE) $(ASAN_FLAGS) build-debug/moeserve build-debug/test_unit
	MOESERVE_BIN=$(CURDIR)/build-debug/moeserve ./build-debug/test_unit $(FILTER)

# make install [PREFIX=/usr/local] [DESTDIR=...]: moeserve into PREFIX/bin
PREFIX  ?= /usr/local
install: $(BUILD)/moeserve
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(BUILD)/moeserve $(DESTDIR)$(PREFIX)/bin/moeserve

clean:
	rm -rf build build-debug build-fuzz

.PHONY: all install run test test-server-asan test-cuda test-cuda-memcheck test-dist fuzz fuzz-build debug clean
-include $(OBJ:.o=.d) $(TESTOBJ:.o=.d) $(CUTESTOBJ:.o=.d) $(BUILD)/src/cli/main.d $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz/fuzz_%.d)
