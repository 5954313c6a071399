# megabatch - build, test, CUDA compile checks, sanitizers, install.
#
#   make run         the multi-timeframe example: synthetic data, then training
#   make test        CPU tests, compile checks (nvcc's too), docs tests; the CUDA programs only
#                    where a GPU is present (GPU=1 forces them, GPU= leaves them out)
#   make build       everything buildable on this machine (the benchmarks only syntax-checked, BENCH=1 builds them)
#   make bench       the benchmarks (build/bench/), -O3
#   make cuda        every CUDA source through nvcc -Werror (sm_90 + sm_80)
#   make gpu-test    run the CUDA tests (what a GPU machine runs)
#   make gpu-bundle  binaries + shared libraries for a bare GPU machine (build/gpu/)
#   make asan        CPU tests under AddressSanitizer + UBSan
#   make tsan        threaded tests under ThreadSanitizer
#   make fuzz        the libFuzzer target build/fuzz/fuzz_dataset (needs clang; not part of build/test)
#   make fuzz-run    fuzz for FUZZ_TIME seconds (default 60); make fuzz-seeds rewrites tests/fuzz/seeds;
#                    make fuzz-cov builds the coverage binary for tests/fuzz/coverage.sh
#   make install PREFIX=/usr/local   headers (examples' in include/megabatch/) + megabatch.pc
#   make deps        install the Debian packages (as root), else print the command
#   make mpi-test    data parallel on CPU ranks: mpirun -np 2 and -np 3 (tests/dist/run.sh; also in make test)
#   make onnx-test   the ONNX export under onnxruntime (tests/onnx/run.sh; make onnx-venv installs onnx,
#                    onnxruntime and numpy from PyPI into build/onnx-venv): not in make test (no Python
#                    there); CI runs it as its own stage
#
# Overrides: NO_CUDA=1 (skip nvcc even when present), NO_CBLAS=1 (plain C gemm),
# NVCC=..., CUDA_ARCHS="90 80", BENCH=1 (make build and make test build the benchmarks too).

CC      ?= cc
CXX     ?= c++
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
# Clang, where there is one: compile-checks also build and check the CPU rows with it
CLANG   ?= $(shell command -v clang 2>/dev/null)
PREFIX  ?= /usr/local
CUDA_ARCHS ?= 90 80
BUILD   := build
DEB_PACKAGES := pkg-config libcmocka-dev libhdf5-dev libopenblas-dev libopenmpi-dev openmpi-bin

ifeq ($(NO_CUDA),1)
NVCC :=
endif
# A GPU here (nvidia-smi lists one), or GPU=1: make test also builds nvcc's CUDA programs (the
# CUDA tests, example and benchmarks) and runs the tests. Without one they would only skip,
# after most of a fresh build's time in nvcc: make test builds nvcc's compile checks alone,
# make sim-test runs the CUDA tests on the CPU, make cuda / cuda-check build the programs.
GPU ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)

HDF5_CFLAGS := $(shell pkg-config --cflags hdf5 2>/dev/null)
HDF5_LIBS   := $(shell pkg-config --libs hdf5 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)
ifeq ($(NO_CBLAS),1)
BLAS_CFLAGS := -DMEGABATCH_NO_CBLAS
BLAS_LIBS   :=
else
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null)
endif
DEP_CFLAGS := $(HDF5_CFLAGS) $(BLAS_CFLAGS)
DEP_LIBS   := $(HDF5_LIBS) $(BLAS_LIBS) -lpthread -lm
ifeq ($(BUNDLE),1)
# make gpu-bundle: every binary (gcc's and nvcc's) finds build/gpu/lib through DT_RPATH
# $ORIGIN/lib. Not RUNPATH (the linker's default): ld.so searches RUNPATH for the binary's own
# NEEDED libraries only, RPATH also for theirs (libhdf5 -> libsz, libaec, libcurl, ...).
DEP_LIBS   += -Xlinker -rpath='$$ORIGIN/lib' -Xlinker --disable-new-dtags
endif

WARN    := -Wall -Wextra -Werror -pedantic
# -g1: line tables (backtraces, perf), not full debug info, which costs a third of an -O3
# compile (train_multitf: 15 s of CPU against 22); CFLAGS="-O3 -g" for a debugger's locals
CFLAGS  ?= -O3 -g1  # the LSTM cell loops vectorize at -O2 too (tests/compile/vectorized.sh)
# The test programs (build/tests/) at CI's -O1 -g1 unless CFLAGS is given: 2.3x faster to
# compile, the same numbers (ISO C, no FP contraction), and the -O3 library is still built
# -Werror and run by the tests through the examples, test_train and Clang's test_lstm.
TEST_OPT ?= $(if $(filter file,$(origin CFLAGS)),-O1 -g1)
ALL_CFLAGS := -std=c11 $(WARN) $(CFLAGS) -I. -Itests $(DEP_CFLAGS) -pthread
CXXFLAGS ?= -O3 -g1
ALL_CXXFLAGS := -std=c++17 -Wall -Wextra -Werror $(CXXFLAGS) -I. -Itests $(DEP_CFLAGS) -pthread
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
NVCC_OPT   ?= -O2 -g # the host code's (CI, which runs no nvcc-built program: -O0)
NVCC_FLAGS := -std=c++17 $(NVCC_OPT) $(NVCC_GENCODE) -Werror all-warnings \
              -Xcompiler -Wall,-Wextra,-Werror -I. -Itests $(DEP_CFLAGS)
NVCC_LIBS  := -lcublas $(DEP_LIBS) $(if $(filter 1,$(BUNDLE)),,-Xlinker -rpath='$$ORIGIN/lib')
SAN_FLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all

TEST_SRCS    := $(wildcard tests/test_*.c)
TEST_BINS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS)) $(BUILD)/tests/test_gemm_nocblas
ASAN_BINS    := $(patsubst tests/%.c,$(BUILD)/asan/%,$(TEST_SRCS))
TSAN_SRCS    := $(wildcard tests/test_loader*.c) tests/test_lstm_many.c tests/test_dist_shard.c tests/test_series.c
TSAN_BINS    := $(patsubst tests/%.c,$(BUILD)/tsan/%,$(TSAN_SRCS))
CUDA_SRCS    := $(wildcard tests/cuda/test_*.cu)
CUDA_BINS    := $(patsubst tests/cuda/%.cu,$(BUILD)/cuda/%,$(CUDA_SRCS))
EXAMPLE_SRCS := $(wildcard examples/*.c)
EXAMPLE_BINS := $(patsubst examples/%.c,$(BUILD)/%,$(EXAMPLE_SRCS))
EXAMPLE_CUDA := $(patsubst examples/%.cu,$(BUILD)/%,$(wildcard examples/*.cu))
BENCH_SRCS   := $(wildcard bench/*.c)
BENCH_BINS   := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
BENCH_CUDA   := $(patsubst bench/%.cu,$(BUILD)/bench/%,$(wildcard bench/*.cu))
# what make build does with the benchmarks without BENCH=1 (see bench: below)
BENCH_TESTED := $(BUILD)/bench/bench_series
BENCH_SYNTAX := $(filter-out $(BENCH_TESTED:%=%.syntax),$(BENCH_BINS:%=%.syntax))
DOC_TESTS    := tests/docs/check.sh tests/docs/build_own.sh tests/docs/toc.sh tests/docs/modules.sh tests/docs/api.sh tests/docs/trading.sh
# issue 45: the plain-cc builds and make install's headers; names, the step walkthrough, one source
DOC_TESTS    += tests/docs/build_cc.sh tests/docs/walkthrough.sh tests/docs/names.sh tests/docs/one_source.sh
# every C snippet of the docs run (issue 48: tests/docs/snippets.c with MB_SNIPPETS_MAIN)
DOC_TESTS    += tests/docs/snippets.sh
# the CPU step from main to its kernels in at most 8 calls, and the docs' chains (issue 45)
DOC_TESTS    += tests/docs/call_depth.sh
# the CPU planted faults (issue 48): each check written for a fault fails on it (tests/neg_cpu.sh)
DOC_TESTS    += tests/neg_cpu.sh
# every program that reads a data file, over the CVE corpus and the fuzz files (docs/RELIABILITY.md)
HOSTILE_TESTS := tests/hostile_tools.sh
# model selection through the tools (docs/TRADING.md, "Choosing the model to trade")
SELECT_TESTS := tests/select_cli.sh
# every tool over hostile command lines: the output-path rule, each flag's mistakes (issue 46)
HOSTILE_TESTS += tests/hostile_cli.sh
# the ONNX export under onnxruntime (make onnx-test only: it needs Python packages)
ONNX_TESTS   := tests/onnx/run.sh
ONNX_BINS    := $(BUILD)/tests/onnx_inputs
HEADERS      := megabatch.h megabatch_cuda.cuh $(wildcard tests/*.h) $(wildcard tests/fuzz/*.h) $(wildcard examples/*.h)

ifneq ($(NVCC),)
CUDA_TARGETS := $(CUDA_BINS) $(EXAMPLE_CUDA) $(BENCH_CUDA) $(BUILD)/compile/nvcc.o
# what make build / make test compile with nvcc where no GPU is present (besides compile-checks' own)
CUDA_COMPILE := $(BUILD)/compile/nvcc.o
endif

# ---- mpi: data parallel (docs/DIST.md) ----
# The default build needs no MPI (the dist calls see a world of one). With mpicc, the MPI
# builds of the dist test and of the example; tests/dist/run.sh runs them under mpirun
# (and skips, saying so, without mpirun or these binaries). NO_MPI=1 leaves them out.
MPICC    ?= $(shell command -v mpicc 2>/dev/null)
ifeq ($(NO_MPI),1)
MPICC :=
endif
MPI_TESTS := tests/dist/run.sh
ifneq ($(MPICC),)
MPI_TARGETS := $(BUILD)/mpi/test_dist $(BUILD)/train_multitf_mpi $(BUILD)/prepare $(BUILD)/train_multitf
MPI_BENCH   := $(BUILD)/bench/bench_dist_mpi
endif
$(BUILD)/bench/%_mpi : bench/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(MPICC) $(ALL_CFLAGS) -DMEGABATCH_MPI -o $@ $< $(DEP_LIBS)
$(BUILD)/mpi/% : tests/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(MPICC) $(ALL_CFLAGS) -DMEGABATCH_MPI -o $@ $< $(CMOCKA_LIBS) $(DEP_LIBS)
$(BUILD)/%_mpi : examples/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(MPICC) $(ALL_CFLAGS) -DMEGABATCH_MPI -o $@ $< $(DEP_LIBS)
mpi-test: $(MPI_TARGETS)
	@sh tests/run.sh $(MPI_TESTS)
# CUDA + NCCL (with nvcc and mpicc): the dist test on CUDA params, part of `make cuda`
# (compiled, not run here: it needs a GPU per rank; docs/DIST.md)
ifneq ($(MPICC),)
ifneq ($(NVCC),)
MPI_NVCC_CFLAGS := $(filter-out -pthread,$(shell $(MPICC) -showme:compile 2>/dev/null))
MPI_NVCC_LIBS   := $(filter-out -pthread,$(shell $(MPICC) -showme:link 2>/dev/null))
CUDA_TARGETS += $(BUILD)/mpi/test_cuda_dist $(BUILD)/train_multitf_cuda_mpi
$(BUILD)/mpi/test_cuda_dist: tests/cuda/test_cuda_dist.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -DMEGABATCH_MPI -DMEGABATCH_NCCL $(MPI_NVCC_CFLAGS) -o $@ $< $(CMOCKA_LIBS) $(NVCC_LIBS) \
	  -lnccl $(MPI_NVCC_LIBS)
$(BUILD)/train_multitf_cuda_mpi: examples/train_multitf_cuda.cu examples/train_multitf.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -DMEGABATCH_MPI -DMEGABATCH_NCCL $(MPI_NVCC_CFLAGS) -o $@ $< $(NVCC_LIBS) -lnccl $(MPI_NVCC_LIBS)
endif
endif

.PHONY: mpi-test
.PHONY: all build bench run test check-deps compile-checks cuda cuda-check gpu-test gpu-bundle asan tsan fuzz fuzz-run fuzz-cov fuzz-seeds install deps clean \
        onnx-venv onnx-test
all: build

check-deps:
	@pkg-config --exists hdf5 && echo "✓ hdf5 $$(pkg-config --modversion hdf5)" || { echo "✗ hdf5 not found (make deps)"; exit 1; }
	@pkg-config --exists cmocka && echo "✓ cmocka $$(pkg-config --modversion cmocka)" || { echo "✗ cmocka not found (make deps)"; exit 1; }
ifneq ($(NO_CBLAS),1)
	@pkg-config --exists openblas && echo "✓ openblas $$(pkg-config --modversion openblas)" || { echo "✗ openblas not found (make deps, or NO_CBLAS=1)"; exit 1; }
endif
ifneq ($(NVCC),)
	@echo "✓ nvcc $$($(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
else
	@echo "✗ nvcc not found (or NO_CUDA=1): CUDA targets not built"
endif
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo "✓ GPU: $$(nvidia-smi -L | head -n 1)"; \
	 else echo "✗ no GPU: $(if $(GPU),GPU=1: nvcc builds the CUDA programs anyway,nvcc builds its compile checks only (make sim-test runs the CUDA tests on the CPU))"; fi

build: check-deps $(TEST_BINS) $(EXAMPLE_BINS) $(if $(BENCH),$(BENCH_BINS),$(BENCH_SYNTAX) $(BENCH_TESTED)) compile-checks \
       $(if $(GPU),$(CUDA_TARGETS),$(CUDA_COMPILE)) $(MPI_TARGETS) $(if $(BENCH),$(MPI_BENCH))

# The benchmarks: make bench builds them (-O3, like the examples); make build and make test
# check only that they compile (gcc -fsyntax-only with the warnings: a tenth of a build's time;
# test_cli then skips their command lines, saying so), unless BENCH=1, as in CI (.ci/run),
# which builds them and runs test_cli over them. bench_series reads data files: always built
# (tests/hostile_tools.sh runs it over the hostile ones).
bench: $(BENCH_BINS) $(MPI_BENCH)
$(BUILD)/bench/%.syntax: bench/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fsyntax-only $<
	@touch $@

$(BUILD)/tests/% : tests/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(if $(filter $(BUILD)/tests/test_train,$@),,$(TEST_OPT)) -o $@ $< $(CMOCKA_LIBS) $(DEP_LIBS)

# tests/onnx/run.sh's inputs for onnxruntime (raw feature windows; it includes examples/prepare.c)
$(BUILD)/tests/onnx_inputs: tests/onnx/onnx_inputs.c examples/prepare.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(DEP_LIBS)

# the plain C gemm fallback, checked by the same tests
$(BUILD)/tests/test_gemm_nocblas: tests/test_gemm.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_OPT) -DMEGABATCH_NO_CBLAS -o $@ $< $(CMOCKA_LIBS) $(HDF5_LIBS) -lpthread -lm

$(BUILD)/asan/% : tests/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -O1 $(SAN_FLAGS) -o $@ $< $(CMOCKA_LIBS) $(DEP_LIBS)

$(BUILD)/tsan/% : tests/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -O1 -fsanitize=thread -o $@ $< $(CMOCKA_LIBS) $(DEP_LIBS)

# -fmad=false: the tests assert bitwise CPU == CUDA results, true only without FMA contraction
$(BUILD)/cuda/% : tests/cuda/%.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -fmad=false -o $@ $< $(CMOCKA_LIBS) $(NVCC_LIBS)

$(BUILD)/% : examples/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(DEP_LIBS)
# the programs whose tests train for a while keep -O3 when CFLAGS lowers it (CI's -O1: test_train
# took 130 s there instead of 33, the example's tests 4x as long)
$(BUILD)/tests/test_train $(BUILD)/train_multitf $(BUILD)/train_multitf_mpi: ALL_CFLAGS += -O3
# the compile checks that run (C11, C++17, two translation units, the docs' code) at the tests'
# -O1 -g1 too: they check that the header builds and links in each mode (the examples build
# the same code at -O3), at 40% of an -O3 compile's time
COMPILE_RUN := $(addprefix $(BUILD)/compile/,c11 cxx17 two_tu_static snippets_c.o snippets_cxx.o snippets_run docs_live)
$(COMPILE_RUN): ALL_CFLAGS += $(TEST_OPT)
$(COMPILE_RUN): ALL_CXXFLAGS += $(TEST_OPT)

$(BUILD)/% : examples/%.cu $(HEADERS) $(wildcard examples/*.c)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -o $@ $< $(NVCC_LIBS)

$(BUILD)/bench/% : bench/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(DEP_LIBS)

$(BUILD)/bench/% : bench/%.cu $(HEADERS) $(wildcard bench/*.c)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -o $@ $< $(NVCC_LIBS)

# Compile checks: the headers as C11 -pedantic, as C++17, two translation units
# linked together (one with the implementation), and through nvcc.
compile-checks: $(BUILD)/compile/c11 $(BUILD)/compile/cxx17 $(BUILD)/compile/two_tu_static \
                $(BUILD)/compile/c11_strict $(BUILD)/compile/zero_init_c.o $(BUILD)/compile/zero_init_cxx.o \
                $(if $(NVCC),$(BUILD)/compile/zero_init_nvcc.o) \
                $(BUILD)/compile/snippets_c.o $(BUILD)/compile/snippets_cxx.o $(BUILD)/compile/docs_live \
                $(BUILD)/compile/call_depth $(BUILD)/compile/vectorized.ok \
                $(if $(CLANG),$(BUILD)/compile/vectorized_clang.ok $(BUILD)/compile/test_lstm_clang)
# the CPU cell rows vectorize at -O2 (a user's usual flags; CI's own builds are -O1), with
# $(CC) and, where there is one, Clang; under Clang the LSTM tests (its rows' bits) too
$(BUILD)/compile/vectorized.ok: tests/compile/tu_impl.c tests/compile/vectorized.sh $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -I. $(DEP_CFLAGS) -c -o $(BUILD)/compile/vectorized.o $<
	sh tests/compile/vectorized.sh $(BUILD)/compile/vectorized.o
	@touch $@
$(BUILD)/compile/vectorized_clang.ok: tests/compile/tu_impl.c tests/compile/vectorized.sh $(HEADERS)
	@mkdir -p $(dir $@)
	$(CLANG) -std=c11 -O2 -I. $(DEP_CFLAGS) -c -o $(BUILD)/compile/vectorized_clang.o $<
	sh tests/compile/vectorized.sh $(BUILD)/compile/vectorized_clang.o
	@touch $@
$(BUILD)/compile/test_lstm_clang: tests/test_lstm.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CLANG) -std=c11 $(WARN) -O3 -I. -Itests $(DEP_CFLAGS) -pthread -o $@ $< $(CMOCKA_LIBS) $(DEP_LIBS)
$(BUILD)/compile/docs_live: tests/docs/live.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Iexamples -o $@ $< $(DEP_LIBS)
# the example traced (tests/docs/call_depth.sh): every function's deepest path from main; -O0,
# no PIE (addr2line reads the addresses as they are)
$(BUILD)/compile/call_depth: examples/train_multitf.c tests/docs/call_depth.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -O0 -g -fno-pie -no-pie -finstrument-functions -o $@ examples/train_multitf.c \
	  tests/docs/call_depth.c $(DEP_LIBS)
# the docs' code: every C block in README.md and docs/ is a region of these files (tests/docs/check.sh)
$(BUILD)/compile/snippets_c.o: tests/docs/snippets.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<
# ... and run (tests/docs/snippets.sh): every snippet called as a program would
compile-checks: $(BUILD)/compile/snippets_run
$(BUILD)/compile/snippets_run: tests/docs/snippets.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DMB_SNIPPETS_MAIN -o $@ $< $(DEP_LIBS)
$(BUILD)/compile/snippets_cxx.o: tests/docs/snippets.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_CXXFLAGS) -Wno-missing-field-initializers -x c++ -c -o $@ $<
# (in CI's cuda-check; make test builds the same program by the README's recipe, tests/docs/build_own.sh)
$(BUILD)/compile/cuda_open: tests/docs/cuda_open.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -Xcompiler -Wno-missing-field-initializers -o $@ $< $(NVCC_LIBS)
# strict C11 as a user compiles it: -pedantic, no -pthread, no feature macros on the command line
$(BUILD)/compile/c11_strict: tests/compile/tu_impl.c tests/compile/tu_user.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -pedantic $(WARN) -O1 -I. $(DEP_CFLAGS) -o $@ tests/compile/tu_impl.c tests/compile/tu_user.c $(DEP_LIBS)
# every public struct zero-initialises with `= {0}` in C, C++ and nvcc (the list is read from the header)
$(BUILD)/compile/zero_init.c: tests/compile/zero_init.sh megabatch.h
	@mkdir -p $(dir $@)
	sh tests/compile/zero_init.sh megabatch.h > $@
$(BUILD)/compile/zero_init_c.o: $(BUILD)/compile/zero_init.c
	$(CC) -std=c11 $(WARN) -I. -c -o $@ $<
$(BUILD)/compile/zero_init_cxx.o: $(BUILD)/compile/zero_init.c
	$(CXX) -std=c++17 -Wall -Wextra -Werror -Wno-missing-field-initializers -I. -x c++ -c -o $@ $<
$(BUILD)/compile/zero_init_nvcc.o: $(BUILD)/compile/zero_init.c
	$(NVCC) -std=c++17 -Werror all-warnings -I. -x cu -c -o $@ $<
$(BUILD)/compile/c11: tests/compile/tu_impl.c tests/compile/tu_user.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ tests/compile/tu_impl.c tests/compile/tu_user.c $(DEP_LIBS)
$(BUILD)/compile/cxx17: tests/compile/tu_impl.c tests/compile/tu_user.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_CXXFLAGS) -x c++ -o $@ tests/compile/tu_impl.c tests/compile/tu_user.c $(DEP_LIBS)
$(BUILD)/compile/two_tu_static: tests/compile/tu_static.c tests/compile/tu_user.c tests/compile/tu_impl.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DMEGABATCH_NO_CBLAS -o $@ tests/compile/tu_impl.c tests/compile/tu_user.c tests/compile/tu_static.c -lm -lpthread $(HDF5_LIBS)
# the compile check builds every kernel for sm_90 and sm_80 whatever CUDA_ARCHS is (CI builds the
# programs for sm_90 alone), its host code at -O0 as CI's (an object nothing runs: 30% less time)
$(BUILD)/compile/nvcc.o: tests/compile/tu_cuda.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out -gencode arch=% $(NVCC_OPT),$(NVCC_FLAGS)) -O0 $(foreach a,$(sort $(CUDA_ARCHS) 80 90),-gencode arch=compute_$(a),code=sm_$(a)) -c -o $@ $<

# the build runs with one job per core (JOBS=1 for a serial build), and so do the tests
# (tests/run.sh: MB_TEST_JOBS at a time, results printed in order)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
export MB_TEST_JOBS ?= $(JOBS)
test:
	@$(MAKE) --no-print-directory -j$(JOBS) build
	@for b in $(BUILD)/compile/c11 $(BUILD)/compile/cxx17 $(BUILD)/compile/two_tu_static $(BUILD)/compile/c11_strict \
	          $(if $(CLANG),$(BUILD)/compile/test_lstm_clang); do \
	  $$b >/dev/null || { echo "compile check $$b failed"; exit 1; }; done
	@sh tests/run.sh $(foreach t,$(SLOW_TESTS),$(filter $(t),$(ALL_TESTS))) $(filter-out $(SLOW_TESTS),$(ALL_TESTS))
ALL_TESTS := $(TEST_BINS) $(DOC_TESTS) $(HOSTILE_TESTS) $(SELECT_TESTS) $(if $(and $(NVCC),$(GPU)),$(CUDA_BINS)) $(MPI_TESTS)
# the longest first (a minute or so each on 2 cores), so that no core idles at the end
SLOW_TESTS := tests/hostile_cli.sh tests/neg_cpu.sh tests/hostile_tools.sh tests/docs/build_own.sh \
              $(BUILD)/tests/test_train tests/dist/run.sh

# The ONNX export under onnxruntime (docs/TRADING.md, "ONNX"): not part of make test (nothing
# there needs Python; tests/test_onnx checks the files without it); .ci/run runs it as a stage
# of its own. onnx-venv: build/onnx-venv with onnx, onnxruntime and numpy from PyPI (pinned;
# kept once made; nothing cached elsewhere).
onnx-venv:
	@sh tests/onnx/venv.sh
onnx-test: onnx-venv
	@$(MAKE) --no-print-directory -j$(JOBS) check-deps $(BUILD)/prepare $(BUILD)/train_multitf $(BUILD)/predict $(ONNX_BINS)
	@sh tests/run.sh $(ONNX_TESTS)

cuda:
ifeq ($(NVCC),)
	@echo "✗ nvcc not found: nothing to compile"; exit 1
else
	@$(MAKE) --no-print-directory $(CUDA_TARGETS)
	@echo "✓ every CUDA source compiled with -Werror for sm_$(CUDA_ARCHS)"
endif

# CI's CUDA build (no GPU there): the library's kernels and host code for sm_80 and sm_90
# (build/compile/nvcc.o), the CUDA programs (make test's hostile-file and CLI checks run them:
# they open their data before the device), and with MPI their NCCL builds; not the CUDA tests,
# which would only skip there (they compile and run under the simulator, make sim-build, and
# for a GPU run, make gpu-bundle). make cuda builds everything.
CUDA_CHECK := $(filter-out $(CUDA_BINS),$(CUDA_TARGETS)) $(BUILD)/compile/cuda_open
cuda-check:
ifeq ($(NVCC),)
	@echo "✗ nvcc not found: nothing to compile"; exit 1
else
	@$(MAKE) --no-print-directory -j$(JOBS) $(CUDA_CHECK)
	@echo "✓ the library (sm_80, sm_90) and the CUDA programs compiled with -Werror (not the CUDA tests)"
endif

gpu-test: $(CUDA_BINS)
	@sh tests/run.sh $(CUDA_BINS)

# The GPU machine has CUDA but no HDF5, cmocka or BLAS: the bundle is built with the plain C
# gemm (NO_CBLAS=1; OpenBLAS alone would not fit the 64 MiB a device call carries).
# Binaries linked before BUNDLE=1 existed (RUNPATH) are relinked.
BUNDLE_BINS := $(BUILD)/gpu-build/prepare $(patsubst $(BUILD)/%,$(BUILD)/gpu-build/%,$(CUDA_BINS) $(EXAMPLE_CUDA) $(BENCH_CUDA))
gpu-bundle:
	@for b in $(BUNDLE_BINS); do [ ! -f $$b ] || readelf -d $$b | grep -q '(RPATH)' || rm -f $$b; done
	@$(MAKE) --no-print-directory NO_CBLAS=1 BUNDLE=1 BUILD=$(BUILD)/gpu-build $(BUNDLE_BINS)
	@rm -rf $(BUILD)/gpu
	@sh tests/gpu/bundle.sh $(BUILD)/gpu $(BUNDLE_BINS)

asan: check-deps
	@$(MAKE) --no-print-directory -j$(JOBS) $(ASAN_BINS)
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 sh tests/run.sh $(ASAN_BINS)

tsan: check-deps
	@$(MAKE) --no-print-directory -j$(JOBS) $(TSAN_BINS)
	@if [ -n "$(TSAN_BINS)" ]; then TSAN_OPTIONS=halt_on_error=1 sh tests/run.sh $(TSAN_BINS); else echo "no threaded tests yet"; fi

# libFuzzer over open + validate + first/last reads (docs/RELIABILITY.md, "Fuzzing"). Needs
# clang with libFuzzer; the reproducers it found run in `make test` (tests/test_fuzz_regress.c).
FUZZ_CC   ?= clang
FUZZ_TIME ?= 60
FUZZ_CVE  ?= ../shared/testdata/hdf5-cve
FUZZ_BASE  := -std=c11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Werror -DMEGABATCH_NO_CBLAS -I. -Itests \
              $(HDF5_CFLAGS) -pthread
FUZZ_FLAGS := $(FUZZ_BASE) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
FUZZ_OPTS := -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -detect_leaks=0 -timeout=10 \
             -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
fuzz: $(BUILD)/fuzz/fuzz_dataset
$(BUILD)/fuzz/fuzz_dataset: tests/fuzz/fuzz_dataset.c $(HEADERS)
	@command -v $(FUZZ_CC) >/dev/null 2>&1 || { echo "✗ $(FUZZ_CC) not found: make fuzz needs clang with libFuzzer"; exit 1; }
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(HDF5_LIBS) -lpthread -lm
fuzz-run: $(BUILD)/fuzz/fuzz_dataset
	@mkdir -p $(BUILD)/fuzz/corpus $(BUILD)/fuzz/artifacts
	ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 $(BUILD)/fuzz/fuzz_dataset $(FUZZ_OPTS) \
	  -max_total_time=$(FUZZ_TIME) -artifact_prefix=$(BUILD)/fuzz/artifacts/ $(BUILD)/fuzz/corpus tests/fuzz/seeds \
	  $(wildcard $(FUZZ_CVE))
# line coverage of the dataset section by a corpus: make fuzz-cov; tests/fuzz/coverage.sh DIR...
fuzz-cov: tests/fuzz/fuzz_dataset.c $(HEADERS)
	@mkdir -p $(BUILD)/fuzz
	$(FUZZ_CC) $(FUZZ_BASE) -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping \
	  -o $(BUILD)/fuzz/fuzz_dataset_cov $< $(HDF5_LIBS) -lpthread -lm
fuzz-seeds: tests/fuzz/gen_seeds.c
	@mkdir -p $(BUILD)/fuzz tests/fuzz/seeds
	$(CC) $(ALL_CFLAGS) -o $(BUILD)/fuzz/gen_seeds $< $(HDF5_LIBS)
	$(BUILD)/fuzz/gen_seeds tests/fuzz/seeds

# the examples' headers (mtf_live.h, multitf.h, mb_features.h, ...: the docs' recipes include
# them) go to include/megabatch/, which megabatch.pc's Cflags add (generic names kept apart)
install:
	install -d $(DESTDIR)$(PREFIX)/include/megabatch $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 megabatch.h megabatch_cuda.cuh $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(wildcard examples/*.h) $(DESTDIR)$(PREFIX)/include/megabatch/
	for pc in megabatch megabatch-cuda; do \
	  sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(shell sed -n 's/.*MEGABATCH_VERSION_STRING "\(.*\)"/\1/p' megabatch.h)|' \
	      $$pc.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/$$pc.pc; done
	@echo "✓ installed megabatch.h, megabatch_cuda.cuh, the examples' headers (include/megabatch/), megabatch.pc and megabatch-cuda.pc under $(DESTDIR)$(PREFIX)"

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "✓ Debian packages present: $(DEB_PACKAGES)"; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "✗ missing Debian packages; run as root: apt-get install -y $$missing"; exit 1; fi

# The multi-timeframe example end to end: synthetic data, then training (GPU when there
# is one and nvcc built the CUDA program, else the CPU; about a minute on 2 cores).
# data/.make-run records what make run wrote (the prepare flags and the files' checksums): the
# set is reused only when data/train.h5 and data/val.h5 are still those files; other files
# there (a user's own prepare run) are kept as FILE.prev and the synthetic set written anew.
RUN_DATA  := --synthetic --bars 150000 --features 8 --stride 30
RUN_TRAIN := --epochs 4 --batch 32 --hidden 16 --head 32 --metrics data/metrics.csv
RUN_STAMP := data/.make-run
run: deps
	@$(MAKE) --no-print-directory check-deps $(BUILD)/prepare $(BUILD)/train_multitf $(if $(NVCC),$(BUILD)/train_multitf_cuda)
	@want="prepare $(RUN_DATA)"; sums() { echo "$$want $$(cksum < data/train.h5) $$(cksum < data/val.h5)"; }; \
	 if [ -f data/train.h5 ] && [ -f data/val.h5 ] && [ -f $(RUN_STAMP) ] && [ "$$(cat $(RUN_STAMP))" = "$$(sums)" ]; then \
	   echo "make run: reusing data/train.h5 and data/val.h5, the synthetic set an earlier make run wrote"; \
	 else \
	   for f in data/train.h5 data/val.h5; do if [ -f $$f ]; then mv -f $$f $$f.prev; \
	     echo "make run: $$f was not written by make run (your own data?): kept as $$f.prev"; fi; done; \
	   $(BUILD)/prepare $(RUN_DATA) && sums > $(RUN_STAMP) || exit 1; \
	 fi; \
	 echo "make run: training on data/train.h5 and data/val.h5 (synthetic: build/prepare $(RUN_DATA))"
	@if [ -x $(BUILD)/train_multitf_cuda ] && nvidia-smi -L >/dev/null 2>&1; then \
	  $(BUILD)/train_multitf_cuda $(RUN_TRAIN); else $(BUILD)/train_multitf $(RUN_TRAIN); fi

clean:
	rm -rf $(BUILD)

# ---- simulator: the CUDA sources built by g++ against tests/cudasim and run on the CPU ----
#   make sim-test    every tests/cuda test, the CUDA example and benchmarks on the CPU, plain, ASan, TSan;
#                    with MPI, the CUDA dist path (NCCL over MPI) under mpirun (tests/cudasim/mpi.sh)
#   make sim-build   the plain binaries (build/sim/), same names and flags as the nvcc builds
# Needs NVIDIA's host headers (cuda_runtime.h, cublas_v2.h; CUDA_INC); skips with a message without them.
CUDA_INC   ?= $(firstword $(wildcard $(dir $(NVCC))../include) /usr/local/cuda/include)
SIM_OK     := $(if $(wildcard $(CUDA_INC)/cuda_runtime.h),1,)
SIM_CXX    ?= g++
# -g1: line tables only (file:line in the sanitizers' reports) at 3/4 of -g's compile time
SIM_FLAGS  := -std=c++17 -x c++ -Wall -Wextra -Werror -g1 -include tests/cudasim/cudasim.h \
              -I. -Itests -isystem $(CUDA_INC) $(HDF5_CFLAGS) -pthread
SIM_NAMES  := $(patsubst tests/cuda/%.cu,%,$(CUDA_SRCS)) $(patsubst tests/cudasim/%.cu,%,$(wildcard tests/cudasim/test_*.cu))
# the programs sim-test runs (tests/cudasim/example.sh): the example in each build, the benchmarks
# plain; the others build on demand (make build/sim/predict_cuda, build/sim/bench/bench_series_cuda)
SIM_PROGS_sim      := train_multitf_cuda bench/bench_lstm_cuda bench/bench_loader_cuda
SIM_PROGS_sim-asan := train_multitf_cuda
SIM_PROGS_sim-tsan := train_multitf_cuda
SIM_DEPS   := $(HEADERS) $(wildcard tests/cudasim/*.h) $(wildcard examples/*.c) $(wildcard bench/*.c)
SIM_SRC     = $(firstword $(wildcard tests/cuda/$(1).cu tests/cudasim/$(1).cu examples/$(1).cu $(1).cu))

# a build's programs link its one copy of the simulator's implementation (build/VARIANT/cudasim.o)
define SIM_RULE
$(BUILD)/$(1)/cudasim.o: tests/cudasim/cudasim_impl.cu $(wildcard tests/cudasim/*.h)
	@mkdir -p $$(dir $$@)
	$$(SIM_CXX) $$(SIM_FLAGS) $(2) -DCUDASIM_IMPLEMENTATION -c -o $$@ $$<
$(BUILD)/$(1)/%: $$(SIM_DEPS) $$(wildcard tests/cuda/*.cu tests/cudasim/*.cu examples/*.cu bench/*.cu) $(BUILD)/$(1)/cudasim.o
	@mkdir -p $$(dir $$@)
	$$(SIM_CXX) $$(SIM_FLAGS) $(2) -o $$@ $$(call SIM_SRC,$$*) -x none $(BUILD)/$(1)/cudasim.o $$(CMOCKA_LIBS) $(3) -lpthread -lm
endef
SIM_OPT_sim       := -O2 $(BLAS_CFLAGS)
SIM_LIB_sim       := $(HDF5_LIBS) $(BLAS_LIBS)
# ASan without UBSan here (UBSan checks the same C in make asan; it made each compile half as long again)
SIM_OPT_sim-asan  := -O1 -fsanitize=address -fno-omit-frame-pointer $(BLAS_CFLAGS)
SIM_LIB_sim-asan  := $(HDF5_LIBS) $(BLAS_LIBS)
SIM_OPT_sim-tsan  := -O1 -fsanitize=thread -DMEGABATCH_NO_CBLAS
SIM_LIB_sim-tsan  := $(HDF5_LIBS)
SIM_VARIANTS := sim sim-asan sim-tsan
$(foreach v,$(SIM_VARIANTS),$(eval $(call SIM_RULE,$(v),$(SIM_OPT_$(v)),$(SIM_LIB_$(v)))))
# The planted faults of tests/cudasim/neg.sh: tests/cudasim/planted.cu built under TSan from
# copies of the sources in which real library sites can be taken out at run time
# (tests/cudasim/plant.sh).
NEG_SRC    := $(BUILD)/neg-src
NEG_BINS   := $(BUILD)/sim-tsan/planted
$(NEG_SRC)/.planted: tests/cudasim/plant.sh $(HEADERS) $(wildcard examples/*.c examples/*.cu)
	sh tests/cudasim/plant.sh $(NEG_SRC) && touch $@
$(BUILD)/sim-tsan/planted: tests/cudasim/planted.cu $(NEG_SRC)/.planted $(wildcard tests/cudasim/*.h) $(BUILD)/sim-tsan/cudasim.o
	@mkdir -p $(dir $@)
	$(SIM_CXX) -I$(NEG_SRC) -I$(NEG_SRC)/examples $(SIM_FLAGS) $(SIM_OPT_sim-tsan) -o $@ $< -x none \
	  $(BUILD)/sim-tsan/cudasim.o $(SIM_LIB_sim-tsan) \
	  -lpthread -lm
SIM_BINS   := $(foreach v,$(SIM_VARIANTS),$(foreach t,$(SIM_NAMES) neg $(SIM_PROGS_$(v)),$(BUILD)/$(v)/$(t))) $(NEG_BINS)
.PHONY: sim-build sim-test
sim-build: $(if $(SIM_OK),$(SIM_BINS) $(BUILD)/prepare $(BUILD)/train_multitf)
sim-test:
ifeq ($(SIM_OK),)
	@echo "✗ no CUDA host headers ($(CUDA_INC)/cuda_runtime.h): simulator tests skipped (install the CUDA toolkit)"
else
	@$(MAKE) --no-print-directory -j$(JOBS) sim-build
	@s=0; sh tests/cudasim/run.sh $(BUILD) $(SIM_NAMES) || s=1; \
	 echo "== sim-mpi"; BUILD=$(BUILD) sh tests/run.sh tests/cudasim/mpi.sh || s=1; exit $$s
endif

# ---- simulator + MPI: the CUDA dist path (NCCL over MPI: tests/cudasim/cudasim_nccl.h) ----
# build/sim-mpi/test_cuda_dist and build/sim-mpi/train_multitf_cuda: the simulator builds of
# build/mpi/test_cuda_dist and build/train_multitf_cuda_mpi; tests/cudasim/mpi.sh runs them
# under mpirun (part of sim-test; it skips, saying so, without MPI).
ifneq ($(MPICC),)
ifneq ($(SIM_OK),)
SIM_MPI_CFLAGS := $(shell $(MPICC) -showme:compile 2>/dev/null)
SIM_MPI_LIBS   := $(shell $(MPICC) -showme:link 2>/dev/null)
$(eval $(call SIM_RULE,sim-mpi,-O2 $(BLAS_CFLAGS) -DMEGABATCH_MPI -DMEGABATCH_NCCL $(SIM_MPI_CFLAGS),$(HDF5_LIBS) $(BLAS_LIBS) $(SIM_MPI_LIBS)))
SIM_MPI_BINS   := $(BUILD)/sim-mpi/nccl $(BUILD)/sim-mpi/test_cuda_dist $(BUILD)/sim-mpi/train_multitf_cuda
endif
endif
sim-build: $(SIM_MPI_BINS)

# ---- cross: Windows x64 (MinGW-w64, run under Wine) and ARM64 (run under qemu-aarch64) ----
# docs/PLATFORMS.md. Not part of build/test (other compilers); CI's `cross` stage runs it.
#   make cross-deps   install the Debian packages below (as root)
#   make cross        build everything below with -Werror (and -Wvla: MSVC's C11 has no VLAs)
#   make cross-test   build, then tests/cross/run.sh: the CPU tests and lstm_bits under Wine and
#                     qemu-aarch64, the DLL replayed by live_host.exe against Linux's predict --live
# Windows builds: MEGABATCH_NO_HDF5 (Debian has no MinGW HDF5) and MEGABATCH_NO_CBLAS; static
# executables (libwinpthread's clock_gettime, used by mb_args.h's mba_now), and a DLL that
# needs only KERNEL32 and msvcrt. ARM64: static, so qemu-aarch64 needs no sysroot.
MINGW_CC ?= x86_64-w64-mingw32-gcc
ARM64_CC ?= aarch64-linux-gnu-gcc
CROSS_DEB_PACKAGES := gcc-mingw-w64-x86-64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross wine64 qemu-user
CROSS      := $(BUILD)/cross
CROSS_OPT  ?= -O2
CROSS_FLAGS := -std=c11 $(WARN) -Wvla $(CROSS_OPT) -I. -Itests/cross -Itests -DMEGABATCH_NO_HDF5 -DMEGABATCH_NO_CBLAS
# the cmocka tests run under Wine and QEMU (tests/cross/cmocka.h runs them): the LSTM against
# its double reference and PyTorch's golden file, the numerics, and tests/cross/test_platform.c
# (checkpoint + safetensors under a UTF-8 path, replace, cores, memory, clock, threads). More
# build (numerics_layers params gemm lstm_many graph: CROSS_TESTS="..."), at CI's time cost.
CROSS_TESTS ?= lstm numerics
CROSS_WIN   := $(CROSS)/win/mtf_live.dll $(CROSS)/win/live_host.exe $(CROSS)/win/lstm_bits.exe $(CROSS)/win/live_bits.exe \
               $(CROSS)/win/test_platform.exe $(CROSS)/win/quickstart_nothreads.exe $(CROSS)/win/vectorized.o \
               $(CROSS_TESTS:%=$(CROSS)/win/test_%.exe)
CROSS_ARM64 := $(CROSS)/arm64/lstm_bits $(CROSS)/arm64/live_bits $(CROSS)/arm64/test_platform $(CROSS_TESTS:%=$(CROSS)/arm64/test_%)
CROSS_LINUX := $(CROSS)/linux/predict $(CROSS)/linux/libmtf_live.so $(CROSS)/linux/live_host \
               $(CROSS)/linux/make_live_case $(CROSS)/linux/cmp_live $(CROSS)/linux/lstm_bits $(CROSS)/linux/live_bits \
               $(CROSS)/linux/test_platform
CROSS_DEPS  := $(HEADERS) examples/dll/mtf_live_dll.h tests/cross/cmocka.h tests/cross/bits.h

$(CROSS)/win/mtf_live.dll: examples/dll/mtf_live_dll.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(MINGW_CC) $(CROSS_FLAGS) -shared -static-libgcc -o $@ $<
# the LSTM rows vectorize with FMA instructions in the Windows build too (tests/compile/vectorized.sh,
# run by tests/cross/run.sh): at -O2, a user's flags, whatever CROSS_OPT is
$(CROSS)/win/vectorized.o: tests/compile/tu_impl.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(MINGW_CC) -std=c11 -O2 -I. -DMEGABATCH_NO_HDF5 -DMEGABATCH_NO_CBLAS -c -o $@ $<
$(CROSS)/win/quickstart_nothreads.exe: examples/quickstart.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(MINGW_CC) $(CROSS_FLAGS) -DMEGABATCH_NO_THREADS -static -o $@ $<
$(CROSS)/win/%.exe: tests/cross/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(MINGW_CC) $(CROSS_FLAGS) -static -o $@ $< -lpthread
$(CROSS)/win/%.exe: tests/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(MINGW_CC) $(CROSS_FLAGS) -static -o $@ $< -lpthread
$(CROSS)/win/%.exe: examples/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(MINGW_CC) $(CROSS_FLAGS) -static -o $@ $< -lpthread
$(CROSS)/win/%.exe: bench/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(MINGW_CC) $(CROSS_FLAGS) -static -o $@ $< -lpthread
$(CROSS)/arm64/%: tests/cross/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(ARM64_CC) $(CROSS_FLAGS) -static -pthread -o $@ $< -lm
$(CROSS)/arm64/%: tests/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(ARM64_CC) $(CROSS_FLAGS) -static -pthread -o $@ $< -lm
$(CROSS)/arm64/%: examples/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(ARM64_CC) $(CROSS_FLAGS) -static -pthread -o $@ $< -lm
# the Linux side of the comparisons: predict --live built as the DLL is (no CBLAS), the same
# DLL source as a .so, the host, the case generator
$(CROSS)/linux/predict: examples/predict.c $(HEADERS) examples/prepare.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) $(CROSS_OPT) -I. -Itests $(HDF5_CFLAGS) -DMEGABATCH_NO_CBLAS -pthread -o $@ $< $(HDF5_LIBS) -lpthread -lm
$(CROSS)/linux/libmtf_live.so: examples/dll/mtf_live_dll.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CROSS_FLAGS) -fPIC -fvisibility=hidden -shared -pthread -o $@ $< -lm
$(CROSS)/linux/live_host: tests/cross/live_host.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CROSS_FLAGS) -o $@ $< -ldl -lm
$(CROSS)/linux/%: tests/cross/%.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CROSS_FLAGS) -pthread -o $@ $< -lm

.PHONY: cross cross-test cross-deps cross-bench
cross: $(CROSS_WIN) $(CROSS_ARM64) $(CROSS_LINUX)
# bench_live under Wine next to Linux (docs/BENCHMARKS.md): make cross-bench
cross-bench: $(CROSS)/win/bench_live.exe $(CROSS)/linux/bench_live $(CROSS)/linux/make_live_case $(CROSS)/linux/predict
	@sh tests/cross/bench.sh $(CROSS)
$(CROSS)/linux/bench_live: bench/bench_live.c $(CROSS_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CROSS_FLAGS) -pthread -o $@ $< -lm
cross-test: cross
	@sh tests/cross/run.sh $(CROSS)
cross-deps:
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y --no-install-recommends $(CROSS_DEB_PACKAGES); \
	 else echo "run as root: apt-get install -y --no-install-recommends $(CROSS_DEB_PACKAGES)"; exit 1; fi
