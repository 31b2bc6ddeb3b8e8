#!/usr/bin/env bash
# Regenerates benchmarks/results/: the default comparison and the sweeps. Long: each step
# also runs alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
$PY benchmarks/benchmark-ab.py --config benchmarks/config.json --out benchmarks/results/default
for sweep in batch_sweep concurrency_sweep delay_sweep real_batch_sweep real_batch64_recheck \
             auto_sweep workers_sweep; do
  $PY benchmarks/benchmark-ab.py --config "benchmarks/configs/$sweep.json" --out "benchmarks/results/$sweep"
done
