# attnd - build, run, test and benchmark.
#
#   make            build build/attnd
#   make run        install missing packages (as root), build, serve on 127.0.0.1:8080
#   make check      the engine and api unit suites only (fast, offline)
#   make test       install missing packages (as root), build, run every suite (plain, ASan+UBSan,
#                   TSan) and end with "N passed, N failed"
#   make asan       the unit and integration suites under ASan+UBSan only
#   make tsan       the engine suites under TSan only
#   make bench      benchmarks: ratios against OpenBLAS sgemm measured in the same run, and
#                   goodput past capacity (bench_goodput)
#   make bench-report  SVG charts of a make bench log (BENCH_LOG, PEER_LOGS) in build/report
#   make bench-peers   ggml's and PyTorch's attention on this machine, for bench-report
#   make docs-test  run the example blocks of README.md and docs/*.md against a daemon
#   make fuzz       every libFuzzer harness for FUZZ_SECONDS (300) each
#   make load       the load (LOAD_SECONDS at twice capacity) and fault suites; make soak: 30 min
#   make bench-wrk  wrk throughput of small requests at 32 connections
#   make bench-perf-analyzer  Triton's perf_analyzer on model sdpa and a layer (PA_SEQ tokens)
#   make bench-tritonclient  Triton's Python clients, HTTP binary against gRPC raw, one large request
#   make format-check
#
# BUILD selects the output folder and SAN a sanitizer (address,undefined | thread), so that
# sanitizer objects never mix with plain ones.

BUILD ?= build
SAN ?=
CC ?= cc
OPT ?= -O2

WARNINGS := -Wall -Wextra -Wshadow -Wconversion -Wstrict-prototypes -Wmissing-prototypes \
            -Wformat=2 -Wvla -Werror
# Never a fast-math flag: it breaks the -inf handling of masked scores (docs/semantics.md).
CFLAGS_ALL := -std=c11 $(OPT) -g $(WARNINGS) -D_GNU_SOURCE -pthread -MMD -MP -I. $(CFLAGS)
LDFLAGS_ALL := -pthread $(LDFLAGS)
ifneq ($(SAN),)
CFLAGS_ALL += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS_ALL += -fsanitize=$(SAN)
endif

# The ASan build compiles at -O1, as ASan's own documentation advises, to keep make test's
# build short, except the engine's hot loops (the blocked products of each instruction set and
# the attention passes), which stay at $(OPT) so that its suites' long requests keep their pace.
# The few-row products and vector maths stay at -O1: instrumented at -O2 their unrolled blocks
# take longer to compile than the rest of the build, and the ASan suites' requests are not
# long there. The TSan build stays at $(OPT): its suites' reference loops are its cost.
SAN_HOT_SRC := $(wildcard engine/kernels/gemm*_avx2.c engine/kernels/gemm*_avx512*.c \
                          engine/kernels/amx*.c engine/sdpa/*.c)
LIBS := -lmicrohttpd -lnghttp2 -lgnutls -lprotobuf-c -ljansson -lopenblas -lz -lm

ENGINE_SRC := $(wildcard engine/*.c engine/*/*.c)
API_SRC := $(wildcard api/*.c api/*/*.c)
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c))
SUPPORT_SRC := $(wildcard tests/support/*.c)
TEST_SRC := $(sort $(wildcard tests/engine/test_*.c tests/api/test_*.c tests/api/*/test_*.c \
                              tests/server/test_*.c \
                              tests/robustness/test_*.c))
BENCH_SRC := $(wildcard tests/bench/bench_*.c)

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))
TEST_BINS := $(patsubst %.c,$(BUILD)/%,$(TEST_SRC))
BENCH_BINS := $(patsubst %.c,$(BUILD)/%,$(BENCH_SRC))

.PHONY: all tests run check test asan tsan bench sdpa-bits sdpa-bits-record fuzz fuzz-build pa-grpc deps \
        deps-test fresh-check test-builds test-build-plain test-build-asan test-build-tsan \
        test-build-pa-grpc \
        deploy-deps deploy-check format format-check clean browser-deps browser-test load soak \
        bench-wrk bench-perf-analyzer bench-tritonclient bench-report bench-peers docs-test
.DEFAULT_GOAL := all
# Keep the objects that pattern rules make on the way to a test binary.
.SECONDARY:

all: $(BUILD)/attnd

tests: $(BUILD)/attnd $(TEST_BINS)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

ifneq ($(findstring address,$(SAN)),)
$(call obj,$(filter-out $(SAN_HOT_SRC),$(wildcard engine/*.c engine/*/*.c api/*.c api/*/*.c \
    server/*.c tests/*/*.c tests/*/*/*.c))): CFLAGS_ALL += -O1
endif

$(BUILD)/libengine.a: $(call obj,$(ENGINE_SRC))
$(BUILD)/libapi.a: $(call obj,$(API_SRC))
$(BUILD)/libserver.a: $(call obj,$(SERVER_SRC))
$(BUILD)/libtestsupport.a: $(call obj,$(SUPPORT_SRC))
$(BUILD)/%.a:
	@mkdir -p $(@D)
	rm -f $@
	ar rcs $@ $^

MODULE_LIBS := $(BUILD)/libserver.a $(BUILD)/libapi.a $(BUILD)/libengine.a

# The inspector page (GET /, server/page.c): server/assets/embed_page.c, a host tool built with
# plain flags (never a sanitizer), turns server/assets/inspector.html into a C file with the
# page's bytes, its hash-based Content-Security-Policy and its ETag, compiled into libserver.a.
PAGE_GEN := $(BUILD)/gen/embed_page
PAGE_C := $(BUILD)/gen/inspector_page.c

$(PAGE_GEN): server/assets/embed_page.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -O1 $(WARNINGS) $< -o $@

$(PAGE_C): server/assets/inspector.html $(PAGE_GEN)
	$(PAGE_GEN) $< $@

$(BUILD)/gen/inspector_page.o: $(PAGE_C)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/libserver.a: $(BUILD)/gen/inspector_page.o

# KServe v2 over gRPC (api/proto/grpc_*.c): protoc-c turns Triton's service and model
# configuration protos (api/proto/grpc/, unmodified) into C in $(BUILD)/gen, compiled into
# libapi.a with the generator's own style of code (its warnings are not ours).
PROTOS := api/proto/grpc/grpc_service.proto api/proto/grpc/model_config.proto
PB_C := $(patsubst api/proto/grpc/%.proto,$(BUILD)/gen/%.pb-c.c,$(PROTOS))
PB_H := $(PB_C:.c=.h)
PB_CFLAGS := -std=c11 $(OPT) -g -pthread -I$(BUILD)/gen $(filter -fsanitize=% -fno-%,$(CFLAGS_ALL))

$(PB_C) $(PB_H) &: $(PROTOS)
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -Iapi/proto/grpc $(PROTOS)

$(BUILD)/gen/%.pb-c.o: $(BUILD)/gen/%.pb-c.c $(PB_H)
	$(CC) $(PB_CFLAGS) -c $< -o $@

$(BUILD)/libapi.a: $(PB_C:.c=.o)
$(call obj,$(wildcard api/proto/grpc_*.c)): $(PB_H)
$(call obj,$(wildcard api/proto/grpc_*.c)): CFLAGS_ALL += -I$(BUILD)/gen
PB_TESTS := $(BUILD)/tests/server/test_grpc.o $(BUILD)/tests/server/test_batching.o \
            $(BUILD)/tests/support/attention_bodies.o \
            $(BUILD)/tests/api/proto/test_grpc_infer.o \
            $(BUILD)/tests/api/proto/test_grpc_unary.o \
            $(BUILD)/tests/bench/bench_decode.o
$(PB_TESTS): $(PB_H)
$(PB_TESTS): CFLAGS_ALL += -I$(BUILD)/gen

$(BUILD)/attnd: $(BUILD)/server/main.o $(MODULE_LIBS)
	$(CC) $(LDFLAGS_ALL) $^ $(LIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libtestsupport.a $(MODULE_LIBS)
	$(CC) $(LDFLAGS_ALL) $^ $(LIBS) -lcurl -o $@

# Benchmarks measure the engine alone...
DAEMON_BENCHES := $(patsubst %,$(BUILD)/tests/bench/%,bench_e2e bench_session bench_goodput \
                                                      bench_checkpoint bench_decode \
                                                      bench_wire bench_stages)
BENCH_HARNESS := $(BUILD)/tests/bench/harness/harness.o
$(filter-out $(DAEMON_BENCHES),$(BENCH_BINS)): $(BUILD)/tests/bench/%: $(BUILD)/tests/bench/%.o \
                                          $(BENCH_HARNESS) $(BUILD)/tests/support/rng.o \
                                          $(BUILD)/tests/support/engine_env.o \
                                          $(BUILD)/libengine.a
	$(CC) $(LDFLAGS_ALL) $^ -lopenblas -lm -o $@

$(BENCH_HARNESS): tests/bench/harness/harness.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

# ... except bench_e2e, bench_session (a KV-cache decode step over HTTP), bench_goodput
# (open-loop offers past capacity), bench_checkpoint (start-up and RSS serving one layer of a
# generated 1 GiB checkpoint), bench_decode (sequences decoding through a generated layer,
# batched and not, over HTTP and gRPC), bench_wire (api/'s tensor codecs) and bench_stages
# (where a large request's time goes), which time api/ and most a real daemon too.
$(DAEMON_BENCHES): $(BUILD)/tests/bench/%: \
        $(BUILD)/tests/bench/%.o $(BUILD)/libtestsupport.a $(MODULE_LIBS) | $(BUILD)/attnd
	$(CC) $(LDFLAGS_ALL) $(filter %.o,$^) $(filter %.a,$^) $(LIBS) -lcurl -o $@
# bench_decode and bench_stages divide rates by the harness's FMA peak, and bench_decode and
# bench_session set steps against the harness's streaming read (objects link before the
# libraries they call).
$(BUILD)/tests/bench/bench_decode $(BUILD)/tests/bench/bench_session \
    $(BUILD)/tests/bench/bench_stages: $(BENCH_HARNESS)

# ---- Set-up on a fresh Debian 12 machine --------------------------------------------------

# What building and running the daemon needs (make deps, make run).
RUN_PACKAGES := build-essential pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev \
                zlib1g-dev libgnutls28-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler
# What the suites, benchmarks and examples need on top (make deps-test, make test): the test
# client library and command-line tools, the sanitizers and libFuzzer, the inspector page's
# browser, the Python clients of the examples and of Triton's, and what perf_analyzer builds with.
TEST_PACKAGES := $(RUN_PACKAGES) libcurl4-openssl-dev clang libclang-rt-14-dev chromium \
                 fonts-dejavu-core wrk openssl ca-certificates \
                 python3-numpy python3-requests python3-matplotlib \
                 python3-geventhttpclient python3-rapidjson python3-aiohttp python3-packaging \
                 python3-grpcio python3-grpc-tools python3-protobuf universal-ctags \
                 libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev \
                 rapidjson-dev libb64-dev
# Commands the tests run, as COMMAND:PACKAGE: Debian's package is installed only where the
# command is missing, so that a Node.js installed another way (Node 18 and later) is kept.
TEST_COMMANDS := curl:curl node:nodejs npm:npm
# Debian's interpreter, which the python3-* packages above install into (the examples test and
# make bench-report).
PYTHON ?= /usr/bin/python3

# Installs the packages in $(1) and the commands in $(2) that are missing: as root with
# apt-get, otherwise it names them and fails.
define install_missing
	@missing=$$(for p in $(1); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; \
	done; for c in $(2); do command -v $${c%%:*} >/dev/null || echo $${c#*:}; done); \
	if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ]; then \
	        echo "installing:" $$missing; \
	        apt-get update -qq && \
	        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	    else \
	        echo "missing packages:" $$missing "- run 'make $@' as root"; exit 1; \
	    fi; \
	fi
endef

deps:
	$(call install_missing,$(RUN_PACKAGES),)

deps-test:
	$(call install_missing,$(TEST_PACKAGES),$(TEST_COMMANDS))

# make run ARGS='--port 9000 --threads 2': flags after the defaults, so that they win.
ARGS ?=
run: deps
	$(MAKE) all
	$(BUILD)/attnd --host 127.0.0.1 --port 8080 $(ARGS)

# Triton's client, perf_analyzer and ggml for the checks and benchmarks that compare with them:
# a folder with tritonclient/, perf_analyzer/ and ggml/ (see docs/benchmarks.md). Where one is
# missing, its suite or benchmark prints a skip line that says how to get it.
ATTND_PEERS ?= $(abspath ../shared/peers)
export ATTND_PEERS

# ---- Tests --------------------------------------------------------------------------------

ASAN_BUILD := build/asan
TSAN_BUILD := build/tsan
# TSan runs the suites that exercise the pool (the engine's, and the wire's codecs in pieces:
# test_chunks), the order of a session's or a v2 sequence's requests across threads
# (api_session_turn), the gRPC thread's handoffs to the workers (test_grpc), and the I/O threads'
# callbacks of many connections at once (test_io_threads, test_upload); the rest gain nothing
# from it. Their daemons run four I/O threads (ATTND_IO_THREADS), whatever the machine's CPUs.
TSAN_TESTS := $(filter tests/engine/% tests/api/wire/test_chunks.c tests/api/ops/test_sessions.c \
                      tests/server/test_sessions.c \
                      tests/server/test_v2_sequences.c tests/server/test_grpc.c \
                      tests/server/test_job.c tests/server/test_batch.c \
                      tests/server/test_batching.c tests/server/test_io_threads.c \
                      tests/server/test_upload.c,$(TEST_SRC))

# The engine suites run once per kernel set (ATTND_KERNELS); a set the CPU lacks prints a skip
# line. The bf16 suites run once more on the VDPBF16PS path (ATTND_BF16=native), which the
# engine picks on its own only where that instruction is fast, and the layer and bf16 attention
# suites once more on the emulated AMX tiles (ATTND_BF16=amx-emulated), which run on any CPU the code the
# hardware tiles run where the CPU and the OS grant them. The other suites, and the sanitizer
# runs, use the set the engine picks (auto).
AMX_SUITES := test_mha test_layer16 test_mha_session test_mha_batch
# The attention's bf16 suites on the emulated tiles run quick: the emulation is scalar, and the
# largest case (L = S = 8192) would take it many minutes.
AMX_SDPA_SUITES := test_sdpa_bf16 test_sdpa_bf16_views test_sdpa_amx
KERNEL_SETS := avx512 avx2 generic openblas
# The runs of the suites built from the sources in $(1): the plain build's (engine suites once
# per kernel set, the others against the plain daemon), the ASan+UBSan build's (quick sizes),
# and the TSan build's (those of TSAN_TESTS).
plain_runs = $(foreach t,$(patsubst %.c,$(BUILD)/%,$(filter-out tests/engine/%,$(1))),\
        "ATTND_BIN=$(BUILD)/attnd $(t)") \
    $(foreach k,$(KERNEL_SETS),$(foreach t,$(patsubst %.c,$(BUILD)/%,$(filter tests/engine/%,$(1))),\
        "ATTND_KERNELS=$(k) $(t)"))
asan_runs = $(foreach t,$(patsubst %.c,$(ASAN_BUILD)/%,$(1)),\
    "ATTND_BIN=$(ASAN_BUILD)/attnd ATTND_TEST_QUICK=1 $(t)")
tsan_runs = $(foreach t,$(patsubst %.c,$(TSAN_BUILD)/%,$(filter $(TSAN_TESTS),$(1))),\
    "ATTND_BIN=$(TSAN_BUILD)/attnd ATTND_IO_THREADS=4 ATTND_TEST_QUICK=1 TSAN_OPTIONS=halt_on_error=1 $(t)")
all_runs = $(call plain_runs,$(1)) $(call asan_runs,$(1)) $(call tsan_runs,$(1))
# The bf16 paths that the kernel sets alone do not reach: VDPBF16PS, and the emulated tiles.
asan_tile_runs = $(foreach t,$(AMX_SUITES) $(AMX_SDPA_SUITES),\
    "ATTND_TEST_QUICK=1 ATTND_BF16=amx-emulated $(ASAN_BUILD)/tests/engine/$(t)")
bf16_path_runs = "ATTND_KERNELS=avx512 ATTND_BF16=native $(BUILD)/tests/engine/test_sdpa_bf16" \
    "ATTND_KERNELS=avx512 ATTND_BF16=native $(BUILD)/tests/engine/test_sdpa_bf16_views" \
    $(foreach t,$(AMX_SUITES),"ATTND_BF16=amx-emulated $(BUILD)/tests/engine/$(t)") \
    $(foreach t,$(AMX_SDPA_SUITES),"ATTND_TEST_QUICK=1 ATTND_BF16=amx-emulated $(BUILD)/tests/engine/$(t)") \
    $(asan_tile_runs)
asan_suites = $(call asan_runs,$(TEST_SRC)) $(asan_tile_runs)
tsan_suites = $(call tsan_runs,$(TEST_SRC))

# make test runs TEST_JOBS suites at a time (tests/run.sh -j): most of them wait on sockets,
# timers and child processes more than they compute. The longest start first, so that none is
# left running by itself at the end. The suites that measure a latency or a capacity and derive
# their bounds from it (ALONE_TESTS, the load suites, perf_analyzer's stability windows) run
# afterwards one at a time, with the machine to themselves.
TEST_JOBS ?= 3
ALONE_TESTS := tests/server/test_resilience.c tests/engine/test_pool.c
LONG_TESTS := tests/robustness/test_hostile.c tests/engine/test_sdpa.c tests/engine/test_sdpa_bf16.c
SHORT_TESTS := $(filter-out $(ALONE_TESTS) $(LONG_TESTS),$(TEST_SRC))

# Triton's Python gRPC client, unmodified, against --grpc-port (plain and ASan+UBSan builds),
# and Triton's perf_analyzer with its gRPC backend (plain build; pa-grpc builds it); a skip line
# where $(ATTND_PEERS) or a Debian package is missing.
grpc_client_suites = "tests/server/check_grpc_tritonclient.sh $(BUILD)/attnd" \
    "tests/server/check_grpc_tritonclient.sh $(ASAN_BUILD)/attnd"
pa_grpc_suite = "tests/server/check_perf_analyzer_grpc.sh $(BUILD)/attnd"

FUZZ_SMOKE_SECONDS ?= 10
# Each harness is a suite of its own, so that they run beside the others.
fuzz_suites = $(foreach f,$(FUZZ_BINS),"tests/fuzz/run.sh $(FUZZ_SMOKE_SECONDS) $(patsubst $(FUZZ_BUILD)/fuzz_%,%,$(f))")

# The fast loop: the engine and api unit suites (with the data cases in tests/api/cases), plain
# build, the kernel set the engine picks, no daemon, no network, no sanitizers; and the source
# checks (no tier has a cycle, tests/ has one random generator, no function has over 8
# parameters).
CHECK_BINS := $(filter $(BUILD)/tests/engine/% $(BUILD)/tests/api/%,$(TEST_BINS))
# No include or call cycle between the files of a tier (reads the sources and the tier's library).
cycle_checks = $(foreach t,server api engine,"tests/check_cycles.sh $(t) $(BUILD)/lib$(t).a")
# One random generator in the tests (tests/support/rng.h): no test file carries its own.
rng_check = "tests/check_rng.sh tests"
# No function outside the micro-kernels takes more than 8 parameters.
params_check = "tests/check_params.sh"

check: deps-test
	$(MAKE) $(CHECK_BINS) $(MODULE_LIBS)
	@ATTND_TEST_QUICK=1 tests/run.sh $(CHECK_BINS) $(cycle_checks) $(rng_check) $(params_check)

# The SDPA case matrix's output bits per kernel set (tests/engine/check_sdpa_bits.sh): record
# them on the tree before a change that must keep every bit, then compare on the tree after.
SDPA_BITS := $(BUILD)/tests/engine/sdpa_bits
SDPA_BITS_DIR ?= build/sdpa_bits

sdpa-bits-record: deps-test
	$(MAKE) $(SDPA_BITS)
	@tests/engine/check_sdpa_bits.sh record $(SDPA_BITS) $(SDPA_BITS_DIR)

sdpa-bits: deps-test
	$(MAKE) $(SDPA_BITS)
	@tests/engine/check_sdpa_bits.sh compare $(SDPA_BITS) $(SDPA_BITS_DIR)

# The builds of make test use every core (.ci/run calls plain `make test`); the suites run one
# at a time.
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

# The four builds of make test share the cores through make's job server.
test-build-plain:
	$(MAKE) tests $(DEPLOY_CLIENT) $(LOAD_GEN)
test-build-asan:
	$(MAKE) BUILD=$(ASAN_BUILD) SAN=address,undefined tests
test-build-tsan:
	$(MAKE) BUILD=$(TSAN_BUILD) SAN=thread $(TSAN_BUILD)/attnd $(patsubst %.c,$(TSAN_BUILD)/%,$(TSAN_TESTS))
test-build-pa-grpc:
	@tests/bench/build_perf_analyzer_grpc.sh || echo "perf_analyzer (gRPC) was not built: its check says why"
test-builds: test-build-plain test-build-asan test-build-tsan fuzz-build test-build-pa-grpc

test: deps-test deploy-deps browser-deps
	$(MAKE) -j$(BUILD_JOBS) test-builds
	@tests/run.sh -j $(TEST_JOBS) $(bf16_path_runs) $(call all_runs,$(LONG_TESTS)) $(fuzz_suites) \
	    $(docs_suites) $(deploy_suites) $(browser_suites) $(grpc_client_suites) \
	    $(call all_runs,$(SHORT_TESTS)) $(cycle_checks) $(rng_check) $(params_check) \
	    --alone $(call all_runs,$(ALONE_TESTS)) $(load_suites) $(pa_grpc_suite)

# Triton's perf_analyzer with its gRPC client backend, from $(ATTND_PEERS), in build/pa-grpc.
pa-grpc: deps-test
	@tests/bench/build_perf_analyzer_grpc.sh

asan: deps-test
	$(MAKE) BUILD=$(ASAN_BUILD) SAN=address,undefined tests
	@tests/run.sh $(asan_suites) "tests/server/check_grpc_tritonclient.sh $(ASAN_BUILD)/attnd"

tsan: deps-test
	$(MAKE) BUILD=$(TSAN_BUILD) SAN=thread $(TSAN_BUILD)/attnd $(patsubst %.c,$(TSAN_BUILD)/%,$(TSAN_TESTS))
	@tests/run.sh $(tsan_suites)

bench: deps-test
	$(MAKE) $(BENCH_BINS)
	@for b in $(BENCH_BINS); do $$b || exit 1; done

# Charts of a make bench log: `make bench 2>&1 | tee build/bench.log`, optionally
# `make bench-peers` on the same machine, then `make bench-report` (docs/benchmarks.md). Without
# build/bench.log it charts the log committed with the README's chart. Peer logs are read only
# with a log of this build folder, so that no chart mixes machines; PEER_LOGS overrides.
BENCH_LOG ?= $(firstword $(wildcard $(BUILD)/bench.log) docs/bench/zen5-2026-12-02.log)
PEER_LOGS ?= $(if $(filter $(BUILD)/%,$(BENCH_LOG)),$(wildcard $(BUILD)/peers/*.log))
REPORT_DIR ?= $(BUILD)/report
bench-report: deps-test
	$(PYTHON) tests/bench/report.py $(REPORT_DIR) $(BENCH_LOG) $(PEER_LOGS)

# The peers of the charts, on this machine, into $(BUILD)/peers: ggml's CPU flash attention
# (tests/bench/ggml, built from GGML_SRC: a ggml checkout at d99724f2 or its source archive) and
# PyTorch's attention where a torch module is importable (a skip line otherwise). A benchmark
# (minutes): run it on a quiet machine.
GGML_SRC ?= $(firstword $(wildcard $(ATTND_PEERS)/ggml/ggml-src-*.tgz))
bench-peers: deps-test
	@mkdir -p $(BUILD)/peers
	@if [ -n "$(GGML_SRC)" ] && [ -e "$(GGML_SRC)" ]; then \
	    bash tests/bench/ggml/build.sh $(GGML_SRC) $(abspath $(BUILD))/ggml >/dev/null && \
	    tests/bench/ggml/run.sh $(abspath $(BUILD))/ggml/ggml_fa_bench | tee $(BUILD)/peers/ggml.log; \
	else echo "skip ggml peer: set GGML_SRC to a ggml checkout (ggml-org/ggml d99724f2) or its source archive"; fi
	$(PYTHON) tests/bench/torch_sdpa.py | tee $(BUILD)/peers/torch.log

# ---- The README's two commands on a bare Debian 12 (tests/check_fresh.sh) ------------------

# A debootstrap root with make and git, a clone of the committed tree, make run and make test
# inside it. As root; the time of a whole make test and its package installs. Not in make test.
fresh-check:
	@tests/check_fresh.sh

# ---- Examples of README.md and docs/*.md (tests/docs), against a real daemon --------------

docs_suites = "$(PYTHON) tests/docs/run_examples.py $(BUILD)/attnd" \
    "$(PYTHON) tests/docs/check_flags_table.py $(BUILD)/attnd" "$(PYTHON) tests/bench/check_report.py"

docs-test: deps-test
	$(MAKE) all
	@tests/run.sh $(docs_suites)

# ---- Deployment checks (deploy/, tests/deploy; see docs/deployment.md) ---------------------

DEPLOY_CLIENT := $(BUILD)/tests/deploy/shard_client
# nginx for tests/deploy/check_compose.sh, unpacked from Debian's package rather than
# installed, so that no nginx service starts on the machine. Best effort: without it that
# suite reports a skip.
NGINX_DIR := build/nginx
NGINX := $(NGINX_DIR)/usr/sbin/nginx

deploy_suites = "tests/deploy/check_image.sh $(BUILD)/attnd" \
    "ATTND_NGINX=$(NGINX) tests/deploy/check_manifests.sh" \
    "tests/deploy/check_live.sh $(BUILD)/attnd $(DEPLOY_CLIENT)" \
    "ATTND_NGINX=$(NGINX) tests/deploy/check_compose.sh $(BUILD)/attnd $(DEPLOY_CLIENT)"

$(DEPLOY_CLIENT): tests/deploy/shard_client.c tests/support/rng.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(filter %.c,$^) $(LDFLAGS_ALL) -lcurl -ljansson -lm -o $@

$(NGINX):
	@rm -rf $(NGINX_DIR) && mkdir -p $(NGINX_DIR)/deb
	cd $(NGINX_DIR)/deb && { apt-get download nginx 2>/dev/null || \
	    { apt-get update -qq && apt-get download nginx 2>/dev/null; }; }
	dpkg-deb --fsys-tarfile $(NGINX_DIR)/deb/nginx_*.deb | tar -xf - -C $(NGINX_DIR) ./usr/sbin/nginx

# The npm packages of the manifest checks (tests/deploy/package-lock.json), and nginx.
deploy-deps: deps-test
	@cd tests/deploy && { [ -f node_modules/.package-lock.json ] && \
	    [ ! package-lock.json -nt node_modules/.package-lock.json ] || \
	    npm ci --no-audit --no-fund --loglevel=error; }
	@$(MAKE) --no-print-directory $(NGINX) || echo "nginx unavailable: check_compose.sh will skip"

deploy-check: deps-test deploy-deps
	$(MAKE) all $(DEPLOY_CLIENT)
	@tests/run.sh $(deploy_suites)

# ---- Load and fault suites (tests/load: a real daemon on 127.0.0.1; plain build only) -----

LOAD_GEN := $(BUILD)/tests/load/loadgen
LOAD_SECONDS ?= 10
load_suites = "ATTND_BIN=$(BUILD)/attnd $(LOAD_GEN) --duration $(LOAD_SECONDS)" \
    "ATTND_BIN=$(BUILD)/attnd $(LOAD_GEN) --faults"

load: deps-test
	$(MAKE) all $(LOAD_GEN)
	@tests/run.sh $(load_suites)

# Thirty minutes at twice capacity, RSS and descriptors printed every minute; not in make test.
soak: deps-test
	$(MAKE) all $(LOAD_GEN)
	@TEST_TIMEOUT=2400 tests/run.sh "ATTND_BIN=$(BUILD)/attnd $(LOAD_GEN) --soak"

# wrk's throughput of small requests at 32 connections (a benchmark, not a test).
bench-wrk: all
	@rm -f $(BUILD)/wrk.port; \
	$(BUILD)/attnd --port 0 --port-file $(BUILD)/wrk.port --log-level warn >/dev/null & pid=$$!; \
	while [ ! -s $(BUILD)/wrk.port ]; do sleep 0.1; done; \
	wrk -t2 -c32 -d10s -s tests/load/wrk_small.lua http://127.0.0.1:$$(cat $(BUILD)/wrk.port); \
	kill $$pid; wait $$pid

# Triton's perf_analyzer (on PATH, or built from $(ATTND_PEERS)/perf_analyzer into build/pa) against a local
# daemon: model sdpa at (1, PA_HEADS, PA_SEQ, 64) and the demo layer at (1, PA_SEQ, 64), over
# PA_CONCURRENCY; then small requests at concurrency 8 over HTTP and gRPC (build/pa-grpc). A
# benchmark (minutes), not part of make test.
PA_SEQ ?= 2048
PA_HEADS ?= 8
PA_CONCURRENCY ?= 1:4
bench-perf-analyzer: deps-test
	$(MAKE) all
	tests/bench/perf_analyzer.sh $(BUILD)/attnd $(PA_SEQ) $(PA_HEADS) $(PA_CONCURRENCY)

# Triton's Python clients on one large sdpa request at (1, TC_HEADS, TC_SEQ, 64): tritonclient.http
# with binary tensors against tritonclient.grpc with raw ones (tests/bench/tritonclient_large.sh).
TC_SEQ ?= 4096
TC_HEADS ?= 8
bench-tritonclient: deps-test
	$(MAKE) all
	tests/bench/tritonclient_large.sh $(BUILD)/attnd $(TC_SEQ) $(TC_HEADS)

# ---- Browser tests of the inspector page (tests/browser; see inspector.test.mjs) ----------

# Debian's chromium (DEB_PACKAGES) driven by playwright-core from npm against a real daemon;
# the suite writes build/browser/inspector.png and inspector-preset.png.
browser_suites = "ATTND_BIN=$(BUILD)/attnd tests/browser/run.sh"

# The npm packages of the browser tests (tests/browser/package-lock.json).
browser-deps: deps-test
	@cd tests/browser && { [ -f node_modules/.package-lock.json ] && \
	    [ ! package-lock.json -nt node_modules/.package-lock.json ] || \
	    npm ci --no-audit --no-fund --loglevel=error; }

browser-test: deps-test browser-deps
	$(MAKE) all
	@tests/run.sh $(browser_suites)

# ---- Fuzzing (clang's libFuzzer with ASan and UBSan) --------------------------------------

FUZZ_BUILD := build/fuzz
FUZZ_CFLAGS := -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
               -D_GNU_SOURCE -pthread -I.
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SECONDS ?= 300

FUZZ_PB_C := $(patsubst api/proto/grpc/%.proto,$(FUZZ_BUILD)/gen/%.pb-c.c,$(PROTOS))

$(FUZZ_PB_C) &: $(PROTOS)
	@mkdir -p $(FUZZ_BUILD)/gen
	protoc-c --c_out=$(FUZZ_BUILD)/gen -Iapi/proto/grpc $(PROTOS)

# The engine and api objects are compiled once for every harness (instrumented, not linked with
# libFuzzer's main), each harness then only compiles itself and links them.
FUZZ_OBJ_CFLAGS := $(filter-out -fsanitize=fuzzer%,$(FUZZ_CFLAGS)) -fsanitize=fuzzer-no-link \
                   -I$(FUZZ_BUILD)/gen -MMD -MP
FUZZ_OBJS := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(ENGINE_SRC) $(API_SRC)) $(FUZZ_PB_C:.c=.o)

$(FUZZ_BUILD)/obj/%.o: %.c | $(FUZZ_PB_C)
	@mkdir -p $(@D)
	clang $(FUZZ_OBJ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/gen/%.pb-c.o: $(FUZZ_BUILD)/gen/%.pb-c.c
	clang $(FUZZ_OBJ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/libfuzzed.a: $(FUZZ_OBJS)
	rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_BUILD)/libfuzzed.a
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -I$(FUZZ_BUILD)/gen -MMD -MP $< $(FUZZ_BUILD)/libfuzzed.a \
	    -lprotobuf-c -ljansson -lopenblas -lz -lm -o $@

fuzz-build: $(FUZZ_BINS)

fuzz: deps-test
	$(MAKE) fuzz-build
	tests/fuzz/run.sh $(FUZZ_SECONDS)

# ---- Style --------------------------------------------------------------------------------

FORMAT_FILES = $(wildcard engine/*.[ch] engine/*/*.[ch] api/*.[ch] api/*/*.[ch] server/*.[ch] server/assets/*.c tests/*/*.[ch] tests/api/*/*.[ch] \
                            tests/bench/harness/*.[ch])

format:
	clang-format -i $(FORMAT_FILES)

format-check:
	clang-format --dry-run --Werror $(FORMAT_FILES)

clean:
	rm -rf build

# Our dependency files; build/fresh holds make fresh-check's Debian root, whose *.d are not ours.
-include $(shell find $(BUILD) -path $(BUILD)/fresh -prune -o -name '*.d' -type f -print 2>/dev/null)
