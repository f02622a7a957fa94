#!/usr/bin/env bash
# Runs the whole loop on one machine, as plain processes (no containers):
#
#   drafter serve      gRPC drafting, /metrics, REST admin, an empty live datastore
#   drafter-worker     the reference decode worker (a tiny random Llama on CPU) decoding
#                      prompts against the drafter, again and again, with /metrics
#   prometheus         scraping both every 5 s, with the alert rules loaded
#                      (helm/sssd-drafter/files/alerts.yaml, the chart's PrometheusRule)
#
# and prints where to look. Ctrl-C stops everything it started. Needs `make setup`
# (.venv) and the prometheus package (`make tools`).
#
#   deploy/local-run.sh                  # until Ctrl-C
#   DURATION_S=120 deploy/local-run.sh   # stop after two minutes
#
# Settings (environment): GRPC_PORT (50051), METRICS_PORT (9400), ADMIN_PORT (8400),
# WORKER_METRICS_PORT (9401), PROMETHEUS_PORT (9090), RUN_DIR (a new temporary
# directory: logs, datastore, Prometheus data), PROMPTS (a JSONL(.gz) of prompt ids;
# default: the shared dev data, else generated), DURATION_S (0 = until Ctrl-C).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
GRPC_PORT=${GRPC_PORT:-50051}
METRICS_PORT=${METRICS_PORT:-9400}
ADMIN_PORT=${ADMIN_PORT:-8400}
WORKER_METRICS_PORT=${WORKER_METRICS_PORT:-9401}
PROMETHEUS_PORT=${PROMETHEUS_PORT:-9090}
RUN_DIR=${RUN_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sssd-local-XXXXXX")}
PROMPTS=${PROMPTS:-$ROOT/../shared/data/dev/code_humaneval_llama31_8b.jsonl.gz}
DURATION_S=${DURATION_S:-0}
VOCAB_SIZE=128256  # the tiny worker model's vocabulary (Llama 3); the drafter must match

PIDS=()  # each the leader of a process group holding everything it started
log() { printf '[local-run] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# LOG COMMAND...: run COMMAND in the background, in a process group of its own (job
# control is on while it forks), so that cleanup stops it with all its children: killing
# only the PID of the worker's restart loop would leave the worker itself running.
spawn() {
    local log=$1
    shift
    set -m
    "$@" >"$log" 2>&1 &
    PIDS+=($!)
    set +m
}

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    log "stopped; logs and data are in $RUN_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for_http() {  # URL, seconds, what
    local deadline=$((SECONDS + $2))
    until curl -fsS -o /dev/null "$1" 2>/dev/null; do
        ((SECONDS < deadline)) || die "$3 did not answer $1 within $2 s (see $RUN_DIR)"
        sleep 0.5
    done
}

[[ -x $BIN/drafter ]] || die "$BIN/drafter not found: run \`make setup\`"
if [[ -x $BIN/drafter-worker ]]; then
    WORKER=("$BIN/drafter-worker")
else  # an install from before the console script existed
    WORKER=("$BIN/python" -c
        "import sys; from verifier_client.reference_worker.worker_cli import run_cli; sys.exit(run_cli(sys.argv[1:]))")
fi
command -v prometheus >/dev/null && command -v promtool >/dev/null \
    || die "prometheus/promtool not found: run \`make tools\`"
command -v curl >/dev/null || die "curl not found"
for port in "$GRPC_PORT" "$METRICS_PORT" "$ADMIN_PORT" "$WORKER_METRICS_PORT" "$PROMETHEUS_PORT"; do
    if port_in_use "$port"; then die "port $port is in use (set the *_PORT variables)"; fi
done
mkdir -p "$RUN_DIR"

if [[ ! -f $PROMPTS ]]; then
    PROMPTS=$RUN_DIR/prompts.jsonl
    log "no dev data; generating repetitive synthetic prompts in $PROMPTS"
    "$BIN/python" - "$PROMPTS" <<'EOF'
import json, random, sys
rng = random.Random(0)
phrases = [[rng.randrange(1000, 30000) for _ in range(rng.randrange(4, 12))] for _ in range(40)]
with open(sys.argv[1], "w") as out:
    for _ in range(64):
        ids = [t for _ in range(rng.randrange(8, 24)) for t in rng.choice(phrases)]
        out.write(json.dumps({"prompt_ids": ids}) + "\n")
EOF
fi

# --- the drafter ---------------------------------------------------------------------
umask 077
head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$RUN_DIR/admin-token"
umask 022
log "starting drafter serve (log: $RUN_DIR/drafter.log)"
spawn "$RUN_DIR/drafter.log" "$BIN/drafter" serve --host 127.0.0.1 --port "$GRPC_PORT" \
    --metrics-port "$METRICS_PORT" --admin-port "$ADMIN_PORT" \
    --admin-token-file "$RUN_DIR/admin-token" --data-dir "$RUN_DIR/drafter-data" \
    --vocab-size "$VOCAB_SIZE" --draft-threads 2 \
    --rebuild-min-tokens 2000 --rebuild-interval-s 15 --snapshot-interval-s 60
deadline=$((SECONDS + 120))
until grep -q "drafter listening on" "$RUN_DIR/drafter.log"; do
    kill -0 "${PIDS[0]}" 2>/dev/null || die "drafter exited: $(tail -n 5 "$RUN_DIR/drafter.log")"
    ((SECONDS < deadline)) || die "drafter not serving after 120 s"
    sleep 0.5
done
wait_for_http "http://127.0.0.1:$METRICS_PORT/metrics" 30 "the drafter's metrics"

# --- Prometheus ------------------------------------------------------------------------
cat >"$RUN_DIR/prometheus.yml" <<EOF
# Generated by deploy/local-run.sh.
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $ROOT/helm/sssd-drafter/files/alerts.yaml
scrape_configs:
  - job_name: sssd-drafter
    static_configs:
      - targets: ["127.0.0.1:$METRICS_PORT"]
  - job_name: sssd-worker
    static_configs:
      - targets: ["127.0.0.1:$WORKER_METRICS_PORT"]
EOF
promtool check config "$RUN_DIR/prometheus.yml" >"$RUN_DIR/promtool.log" 2>&1 \
    || die "promtool rejected the configuration: $(cat "$RUN_DIR/promtool.log")"
log "starting prometheus (log: $RUN_DIR/prometheus.log)"
spawn "$RUN_DIR/prometheus.log" prometheus --config.file="$RUN_DIR/prometheus.yml" \
    --storage.tsdb.path="$RUN_DIR/prometheus-data" \
    --web.listen-address="127.0.0.1:$PROMETHEUS_PORT"
wait_for_http "http://127.0.0.1:$PROMETHEUS_PORT/-/ready" 60 "Prometheus"

# --- the reference worker, decoding the prompts round after round (each finished
# generation feeds the datastore); restarted if it exits
worker_loop() {
    while true; do
        "${WORKER[@]}" --tiny llama --vocab-size "$VOCAB_SIZE" --prompts "$PROMPTS" \
            --limit 128 --batch 8 --max-new-tokens 128 --drafter "127.0.0.1:$GRPC_PORT" \
            --deadline-ms 20 --metrics-port "$WORKER_METRICS_PORT" --rounds 0 || sleep 5
    done
}
log "starting drafter-worker (log: $RUN_DIR/worker.log)"
spawn "$RUN_DIR/worker.log" worker_loop

cat <<EOF

The loop is running. Where to look:

  Prometheus         http://127.0.0.1:$PROMETHEUS_PORT
    targets          http://127.0.0.1:$PROMETHEUS_PORT/targets
    alert rules      http://127.0.0.1:$PROMETHEUS_PORT/alerts
    e.g.             1 + rate(sssd:spec_decode_num_accepted_tokens_total[1m])
                       / rate(sssd:spec_decode_num_drafts_total[1m])
  drafter metrics    http://127.0.0.1:$METRICS_PORT/metrics
  worker metrics     http://127.0.0.1:$WORKER_METRICS_PORT/metrics
  drafter gRPC       127.0.0.1:$GRPC_PORT (health, reflection)
  admin API          http://127.0.0.1:$ADMIN_PORT/docs
                     token: $RUN_DIR/admin-token (Authorization: Bearer ...)
  dashboards         import helm/sssd-drafter/files/dashboards/*.json into Grafana
                     with a Prometheus data source at http://127.0.0.1:$PROMETHEUS_PORT
  logs and data      $RUN_DIR

EOF
if ((DURATION_S > 0)); then
    log "running for $DURATION_S s"
    spawn /dev/null sleep "$DURATION_S"  # waited for by the builtin, so a signal stops it at once
    wait "${PIDS[-1]}"
else
    log "Ctrl-C to stop"
    wait "${PIDS[0]}"
fi
