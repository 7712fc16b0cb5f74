#!/usr/bin/env bash
# One call on a GPU machine: the GPU tests, then compute-sanitizer memcheck and racecheck on one
# generated kernel of every family (benchmarks/sanitize.py). Logs go to $OUT (or ./gpu-check).
set -u
out="${OUT:-gpu-check}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
timeout "${TEST_TIMEOUT:-180}" python3 -m pytest -q -m gpu -n "${WORKERS:-8}" -p no:cacheprovider >"$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -n 25 "$out/gpu_tests.log"
for tool in memcheck racecheck; do
  timeout "${SAN_TIMEOUT:-100}" compute-sanitizer --tool "$tool" --error-exitcode 9 python3 benchmarks/sanitize.py \
    >"$out/$tool.log" 2>&1
  echo "$tool rc=$?"; tail -n 12 "$out/$tool.log"
done
