#!/usr/bin/env bash
# Prepares what benchmarks/device/run.sh needs on a GPU host that has no package index:
#   .whl/      wheels (CPython 3.12, manylinux x86-64) of our runtime dependencies that the
#              device image lacks, at the versions this checkout's .venv has;
#   .devdata/  the development data (dev/ and corpus/ token files) from SSSD_DATA.
# Both are git-ignored here (.git/info/exclude); name them in the device call's carry.
# Run from the repository root on a machine with PyPI:  bash benchmarks/device/fetch_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV_PY=${VENV_PY:-.venv/bin/python}
DATA=${SSSD_DATA:-../shared/data}
# Not in the device image (its list: the device tool's KINDS.md), or needed at our pins.
PACKAGES=(pydantic pydantic_core pydantic-settings annotated-types typing-inspection
          python-dotenv fastapi starlette fastapi_offline uvicorn redis grpcio protobuf
          grpcio-health-checking grpcio-reflection typing_extensions)
for line in .whl/ .devdata/; do
  grep -qxF "/$line" .git/info/exclude 2>/dev/null || echo "/$line" >> .git/info/exclude
done
rm -rf .whl && mkdir -p .whl
pins=()
for name in "${PACKAGES[@]}"; do
  version=$("$VENV_PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$version" ] || { echo "fetch_wheels: $name is not installed in $VENV_PY" >&2; exit 2; }
  pins+=("$name==$version")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${pins[@]}"
rm -rf .devdata && mkdir -p .devdata/dev .devdata/corpus
cp "$DATA"/dev/*_*.jsonl.gz .devdata/dev/
cp "$DATA"/corpus/datastore_llama3_family.jsonl.gz .devdata/corpus/
du -sh .whl .devdata
