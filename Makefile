# flashattn - hand-written Makefile.
#   make            library (static + shared) and the flashattn CLI
#   make run        the main job: flashattn run on the best backend
#   make test       every test (GPU tests too when a GPU is present)
#   make sanitize   CPU tests under ASan + UBSan
#   make install PREFIX=/usr/local
# Knobs: FA_CUDA=0 (skip CUDA even if nvcc is found), FA_CUDA_ARCHS="80 90a", NVCC=..., OMP=0.

PREFIX   ?= /usr/local
BUILD    ?= build
CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
OMP      ?= 1
NATIVE   ?= 1

CFLAGS_BASE = -std=c11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -fPIC -fvisibility=hidden \
              -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc
ifeq ($(NATIVE),1)
CFLAGS_BASE += -march=native
endif
ifeq ($(OMP),1)
CFLAGS_BASE += -fopenmp -DFA_WITH_OPENMP
LDOMP = -fopenmp
endif
CFLAGS  ?=
ALL_CFLAGS = $(CFLAGS_BASE) $(CFLAGS)
LDLIBS  = -lm $(LDOMP)

# CUDA is built when nvcc is found, unless FA_CUDA=0.
ifeq ($(FA_CUDA),0)
NVCC :=
endif
ifneq ($(NVCC),)
CUDA_HOME     ?= $(patsubst %/bin/nvcc,%,$(NVCC))
FA_CUDA_ARCHS ?= 80 90a
NVCC_GENCODE   = $(foreach a,$(FA_CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a))
NVCC_FLAGS    ?= -O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden,-Wall -Iinclude -Isrc -lineinfo \
                 --threads 0 -Xptxas --warn-on-spills -DFA_WITH_CUDA
CUDA_SRC       = $(wildcard src/cuda/*.cu)
CUDA_OBJ       = $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC))
ALL_CFLAGS    += -DFA_WITH_CUDA -I$(CUDA_HOME)/include
LDLIBS        += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
endif

LIB_SRC  = $(wildcard src/*.c src/reference/*.c src/cpu/*.c)
LIB_OBJ  = $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC)) $(CUDA_OBJ)
CLI_SRC  = $(wildcard cli/*.c)
CLI_OBJ  = $(patsubst %.c,$(BUILD)/%.o,$(CLI_SRC))
TEST_SRC = $(wildcard tests/test_*.c)
TEST_BIN = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
# Test binaries share tests/*.c (not test_*) and the CLI's verification module.
TEST_COMMON = $(patsubst %.c,$(BUILD)/%.o,$(filter-out tests/test_%.c,$(wildcard tests/*.c)) $(wildcard cli/verify.c))

.PHONY: all run test clean
all: $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so $(BUILD)/flashattn
ifeq ($(NVCC),)
	@echo "note: nvcc not found (or FA_CUDA=0): built the CPU and reference backends only"
endif

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h src/*/*.h cli/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(wildcard include/*.h src/*.h src/cuda/*.h src/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_GENCODE) -c $< -o $@

$(BUILD)/libflashattn.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libflashattn.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/flashattn: $(CLI_OBJ) $(BUILD)/libflashattn.a
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libflashattn.a $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_COMMON) $(BUILD)/libflashattn.a
	$(CC) -o $@ $< $(TEST_COMMON) $(BUILD)/libflashattn.a $(LDLIBS)

run: all
	$(BUILD)/flashattn run

test: all $(TEST_BIN)
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; $$t; done

clean:
	rm -rf $(BUILD)
