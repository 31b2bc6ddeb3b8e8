#!/usr/bin/env bash
# "auto" against the best fixed config the tuner finds, on the accelerator stand-in.
#  1. export the stand-in model with our handler (benchmark-ab.py --export);
#  2. tune it in-process over micro-batch sizes x threads, confirm the 3 best on TorchServe;
#  3. benchmark the tuner's winner against "auto" with the same threads, round-robin.
# Results in benchmarks/results/auto_vs_tuned/ (about 15 minutes here).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=${OUT:-benchmarks/results/auto_vs_tuned}
REPEATS=${REPEATS:-5}
BUILD=build/auto_vs_tuned
mkdir -p "$OUT" "$BUILD"
rm -rf "$BUILD/sim-accelerator"
$PY benchmarks/benchmark-ab.py --config benchmarks/config.json --export "$BUILD/sim-accelerator"
PYTHONPATH=examples/image_classifier $PY -c \
  "import prepare, sys; open(sys.argv[1], 'wb').write(prepare.make_jpeg(seed=0))" "$BUILD/input.jpg"

$PY -m ts_microbatch.tools.tune --mar "$BUILD/sim-accelerator" --input "$BUILD/input.jpg" \
  --batch-size 32 --micro-batch-sizes 1,2,4,8,16 --threads 1,2 \
  --confirm 3 --requests 1500 --concurrency 64 --confirm-out "$OUT/confirm" \
  --out "$OUT/micro_batching.tuned.json" | tee "$OUT/tune.txt"

$PY - "$OUT" "$BUILD/input.jpg" "${REPEATS}" <<'PY'
import json, sys
from pathlib import Path
out, body, repeats = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
tuned = json.loads((out / "micro_batching.tuned.json").read_text())
auto = dict(tuned, micro_batch_size="auto")
config = {
    "scenarios": ["accelerator"], "handlers": ["ours"], "server_overhead": False,
    "input": body, "batch_size": 32, "concurrency": 64, "requests": 1500,
    "warmup_requests": 200, "repeats": repeats, "micro_batching": [tuned, auto],
}
(out / "compare.json").write_text(json.dumps(config, indent=2))
PY
$PY benchmarks/benchmark-ab.py --config "$OUT/compare.json" --out "$OUT/compare" | tee "$OUT/compare.txt"
$PY - "$OUT" <<'PY' | tee -a "$OUT/compare.txt"
import json, statistics, sys
from pathlib import Path
results = json.loads((Path(sys.argv[1]) / "compare" / "results.json").read_text())
tuned = next(r for r in results["results"] if r["micro_batch_size"] != "auto")
auto = next(r for r in results["results"] if r["micro_batch_size"] == "auto")
by_round = {}
for run in results["runs"]:
    by_round.setdefault(run["repeat"], {})[run["micro_batch_size"] == "auto"] = run
paired = [r[True]["requests_per_s"] / r[False]["requests_per_s"] for r in by_round.values()]
print(f"tuned (micro_batch_size {tuned['micro_batch_size']}, threads {tuned['parallelism']}): "
      f"median {tuned['requests_per_s']:.1f} req/s of {tuned['runs']}")
print(f"auto (mean micro-batch {auto['mean_micro_batch_size']:.1f}): "
      f"median {auto['requests_per_s']:.1f} req/s of {auto['runs']}")
print(f"auto / tuned: {auto['requests_per_s'] / tuned['requests_per_s']:.3f} (medians); "
      f"per round {', '.join(f'{p:.2f}' for p in paired)}, median {statistics.median(paired):.2f}")
PY
sed -i '/: Completed /d' "$OUT/tune.txt" "$OUT/compare.txt"  # keep the saved logs short
