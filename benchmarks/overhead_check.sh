#!/usr/bin/env bash
# One device call for the PyTorch integration (issue #14): the napkin.torch GPU tests, the GPU
# tests of every family through the compiled-diagram launch path, then benchmarks/overhead.py
# (launch overhead, small matmuls against cuBLAS, compile times). Logs and results go to $OUT
# (or ./overhead-check). Status non-zero when a step fails.
set -u
out="${OUT:-overhead-check}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
status=0
timeout "${OWN_TIMEOUT:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/torchops \
  >"$out/torch_gpu_tests.log" 2>&1
rc=$?; [ "$rc" -ne 0 ] && status=$rc; echo "torch gpu tests rc=$rc"; tail -n 30 "$out/torch_gpu_tests.log"
if [ -n "${FAMILY_TESTS:-}" ]; then
  timeout "${FAMILY_TIMEOUT:-150}" python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider $FAMILY_TESTS \
    >"$out/family_gpu_tests.log" 2>&1
  rc=$?; [ "$rc" -ne 0 ] && status=$rc; echo "family gpu tests rc=$rc"; tail -n 25 "$out/family_gpu_tests.log"
fi
timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/overhead.py --out "$out/results" ${BENCH_ARGS:-} \
  >"$out/overhead.log" 2>&1
rc=$?; [ "$rc" -ne 0 ] && status=$rc; echo "benchmark rc=$rc"; tail -n 60 "$out/overhead.log"
cp "$out"/results/*/overhead.json "$out/" 2>/dev/null
exit "$status"
