#!/usr/bin/env bash
# One prepared device run (issue 32), in this order, each stage under its own time limit,
# every result into $OUT (JSON lines and logs; at most 8 files, no folders):
#   1. the verification tests on CUDA (tree packing, attention masks, greedy and sampled
#      lossless acceptance, the statistical test of the sampled distribution): the same
#      test code that runs on CPU in make test;
#   2. drafter-bench gpu: a real drafter serve on this host's cores (the 6.4M-token corpus)
#      and the reference decode worker on the GPU with Llama-3.1-8B's architecture, random
#      bf16 weights, teacher-forced acceptance: tokens/s without drafts, with trees and with
#      chains at batch 1-256, and the verification cost curve;
#   3. drafter-bench load on the host's cores: batch 64/128/256 with 1, 2, 4, 8 and 16
#      drafting threads (step p50/p99, CPU-us per request-step).
#
# On a GPU host, from the repository root:
#   OUT=results-dir SSSD_DATA=dir-with-dev-and-corpus bash benchmarks/device/run.sh
# Every stage's limit together is 9 minutes; a stage that runs out keeps the rows it wrote.
# Carried wheels (benchmarks/device/fetch_wheels.sh) in .whl/ are installed first; the
# native extension is built here. DEVICE_SMOKE=1 runs every stage tiny, on the CPU, in the
# current environment (what the test suite does).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
SMOKE=${DEVICE_SMOKE:-0}
PY=${PYTHON:-python3}
STAGES="$OUT/stages.txt"
: > "$STAGES"

stage() {  # stage NAME LIMIT_S COMMAND...: runs it, records passed/FAILED and seconds
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  if timeout --kill-after=10 "$limit" "$@"; then r=passed; else r="FAILED (exit $?)"; fi
  printf '%-12s %s in %ss\n' "$name" "$r" "$((SECONDS - start))" | tee -a "$STAGES"
}

setup() {
  if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || return 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . || return 1
  "$PY" -c "import drafter_service.native._core, verifier_client, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
}

if [ "$SMOKE" = 1 ]; then
  DEV=${DEV_FILES:?DEVICE_SMOKE=1 needs DEV_FILES (a dev records file)}
  CORPUS=${CORPUS:?DEVICE_SMOKE=1 needs CORPUS (a records file)}
  VOCAB=${VOCAB:-1000}
  TESTS=(tests/test_tree_packing.py -k "chain")
  GPU_ARGS=(--batch 1 --chains 4 --nodes 1,2 --steps 2 --warmup 1 --max-new-tokens 32 --device cpu --deadline-ms 60000)
  LOAD_BATCHES=(2); LOAD_THREADS=(1); LOAD_ARGS=(--steps 20 --warmup 5)
  TESTS_LIMIT=600; SNAP_LIMIT=300; GPU_LIMIT=600; LOAD_LIMIT=600  # a loaded CI machine
else
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  stage setup 120 bash -c "$(declare -f setup); $(declare -p PY); setup" > "$OUT/setup.log" 2>&1
  DATA=${SSSD_DATA:-.devdata}
  DEV="$DATA/dev/chat_alpacaeval_llama3_8b.jsonl.gz"
  CODE="$DATA/dev/code_humaneval_llama31_8b.jsonl.gz"
  MULTI="$DATA/dev/multilingual_mtbench_suzume.jsonl.gz"
  CORPUS="$DATA/corpus/datastore_llama3_family.jsonl.gz"
  VOCAB=128256
  TESTS=(tests/test_verification.py tests/test_tree_packing.py tests/test_bench_gpu.py
         -k "not drafter_bench_gpu_runs")
  GPU_ARGS=(--data "$CODE" --data "$MULTI" --max-new-tokens 160 --max-prompt-tokens 1024
            --steps 12 --warmup 2)
  LOAD_BATCHES=(64 128 256); LOAD_THREADS=(1 2 4 8 16); LOAD_ARGS=(--steps 200 --warmup 20)
  TESTS_LIMIT=90; SNAP_LIMIT=45; GPU_LIMIT=210; LOAD_LIMIT=90  # + setup 120: 9 minutes
fi
export PYTHONUNBUFFERED=1
{ date -u; uname -a; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3; "$PY" --version; } > "$OUT/env.txt" 2>&1

# 1. CUDA correctness: the CPU suite's own tests, on the device where one is present.
stage cuda-tests "$TESTS_LIMIT" "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}" > "$OUT/cuda-tests.log" 2>&1

# 2. End-to-end decoding speed (the corpus built into a snapshot once, shared with 3).
SNAP=$(mktemp -d)/corpus
stage snapshot "$SNAP_LIMIT" "$PY" -m datastore_builder.builder_cli build --input "$CORPUS" --records token-ids \
  --output "$SNAP" --vocab-size "$VOCAB" --quiet > "$OUT/gpu.log" 2>&1
stage gpu "$GPU_LIMIT" "$PY" -m drafter_bench.bench_cli gpu --data "$DEV" --snapshot "$SNAP" \
  --vocab-size "$VOCAB" --out "$OUT/gpu.jsonl" "${GPU_ARGS[@]}" >> "$OUT/gpu.log" 2>&1

# 3. The drafter on this host's cores: threads pinned to as many cores, the client beside.
load_all() {
  local cpus; cpus=$(nproc)
  for threads in "${LOAD_THREADS[@]}"; do
    [ "$threads" -le "$cpus" ] || continue
    local server="0-$((threads - 1))" client=()
    [ "$threads" -lt "$cpus" ] && client=(--client-cpus "$threads-$((cpus - 1))")
    for batch in "${LOAD_BATCHES[@]}"; do
      "$PY" -m drafter_bench.bench_cli load --data "$DEV" --snapshot "$SNAP" --vocab-size "$VOCAB" \
        --batch "$batch" --server-cpus "$server" "${client[@]}" "${LOAD_ARGS[@]}" --json \
        | sed "s/^{/{\"threads\": $threads, /" >> "$OUT/load.jsonl" || return 1
    done
  done
}
stage load "$LOAD_LIMIT" bash -c "set -o pipefail; $(declare -f load_all); $(declare -p LOAD_THREADS LOAD_BATCHES LOAD_ARGS PY DEV SNAP VOCAB OUT); load_all" > "$OUT/load.log" 2>&1

cat "$STAGES"
! grep -q FAILED "$STAGES"
