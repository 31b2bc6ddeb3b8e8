#!/usr/bin/env python3
"""The worker side alone: upstream's MicroBatching and ours on the same stages, each loaded
by TorchServe's own model loader in a process of its own and handed batches through
``Service.predict`` back to back, as the backend worker does under a full queue.

    python benchmarks/dev/worker_ab.py --rounds 3 --batches 60 [--variants upstream ours-same]
    python benchmarks/dev/worker_ab.py --profile ours-same   # py-spy of one child (speedscope)

No frontend and no client: what is left is the worker's own time per batch (its makespan,
P50/P99) and its CPU per batch (every thread of the process). Rounds alternate the variants;
ratios are taken within a round. The same stages as benchmarks/compare.py's ``-same``
models (the 720px body, the accelerator stand-in, batch 32, micro-batch 4, threads 2/1/2,
PIL decoding).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "examples" / "image_classifier")]

VARIANTS = ("upstream", "ours-same", "no-metrics", "ours-ic")


def package(work: Path, variant: str) -> Path:
    import shutil

    import bench_lib
    import bench_packaging
    import yaml

    bench_packaging.HANDLER_FILES["no-metrics"] = str(HERE / "handlers/no_metrics_handler.py")
    bench_packaging.HANDLER_FILES["ours-ic"] = str(HERE / "handlers/mixin_image_classifier.py")
    config = bench_lib.load_config(BENCH / "configs/photos.json")
    point = bench_lib.sweep_points(config)[0]
    name = f"worker-{variant}"
    bench_packaging.package(
        work / "store", work / "build", name, "accelerator", variant, config, point, None
    )
    directory = work / "store" / name
    if variant == "no-metrics":
        # The model config TorchServe reads: the file the manifest names (the archiver keeps
        # the --config-file's own name).
        manifest = json.loads((directory / "MAR-INF" / "MANIFEST.json").read_text())
        model = bench_packaging.model_yaml(config, point, "ours-same")
        (directory / manifest["model"]["configFile"]).write_text(yaml.safe_dump(model))
        shutil.copy(ROOT / "handlers/micro_batching_handler.py", directory)
    return directory


def child(directory: Path) -> None:
    """Runs in its own process: loads the model as the backend worker does, then for each
    line ``N`` on stdin times N batches and answers with one JSON line of their times."""
    import corpus
    from worker_loader import load_worker_service

    manifest = json.loads((directory / "MAR-INF" / "MANIFEST.json").read_text())["model"]
    service = load_worker_service(directory, manifest["modelName"], manifest["handler"], 32)
    body = corpus.bodies()["720px"].data
    out = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the worker's own prints stay off the pipe
    n = 0
    for line in sys.stdin:
        times, cpu = [], []
        for _ in range(int(line)):
            n += 1
            batch = [
                {
                    "requestId": f"r{n}-{i}".encode(),
                    "parameters": [{"name": "body", "value": body, "contentType": "image/jpeg"}],
                }
                for i in range(32)
            ]
            wall0, cpu0 = time.perf_counter(), time.process_time()
            service.predict(batch)
            times.append((time.perf_counter() - wall0) * 1000)
            cpu.append((time.process_time() - cpu0) * 1000)
        out.write(json.dumps({"ms": times, "cpu_ms": cpu}) + "\n")
        out.flush()
    os._exit(0)  # the pipeline's threads are daemons; TorchServe's worker exits the same way


def summarize(raw: dict[str, list[float]]) -> dict[str, float]:
    ms = sorted(raw["ms"])
    return {
        "batch_ms_p50": statistics.median(ms),
        "batch_ms_p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
        "batch_ms_mean": statistics.fmean(ms),
        "cpu_ms_per_batch": statistics.fmean(raw["cpu_ms"]),
    }


class Worker:
    """One variant's child process, loaded once and told how many batches to run."""

    def __init__(self, variant: str, directory: Path, env: dict[str, str], prefix: list[str]):
        self.variant = variant
        cmd = [*prefix, sys.executable, __file__, "--child", str(directory)]
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, batches: int) -> dict[str, list[float]]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{batches}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.variant}: the worker exited ({self.proc.wait()})")
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS[:2]), choices=VARIANTS)
    parser.add_argument("--rounds", type=int, default=10, help="segments per variant, alternated")
    parser.add_argument("--batches", type=int, default=15, help="batches per segment")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profile", choices=VARIANTS, help="py-spy record this variant once")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(BENCH)])}
    variants = [args.profile] if args.profile else args.variants
    with tempfile.TemporaryDirectory(prefix="worker_ab_") as tmp:
        work = Path(tmp)
        prefix: list[str] = []
        if args.profile:
            speedscope = Path(f"/tmp/worker_ab_{args.profile}.speedscope.json")
            prefix = [str(Path(sys.executable).with_name("py-spy")), "record", "--threads"]
            prefix += ["-f", "speedscope", "-o", str(speedscope), "--"]
        workers = [Worker(v, package(work, v), env, prefix) for v in variants]
        try:
            for w in workers:
                w.run(args.warmup)
            rounds: list[dict[str, dict[str, float]]] = []
            for r in range(args.rounds):
                turn = workers[r % len(workers) :] + workers[: r % len(workers)]
                rounds.append({w.variant: summarize(w.run(args.batches)) for w in turn})
                print(
                    f"round {r + 1}: "
                    + ", ".join(
                        f"{v} {x['batch_ms_mean']:.0f} ms {x['cpu_ms_per_batch']:.0f} cpu"
                        for v, x in rounds[-1].items()
                    ),
                    flush=True,
                )
        finally:
            for w in workers:
                w.close()
    if not args.profile:
        report(rounds, variants, args.out)
    return 0


def report(
    rounds: list[dict[str, dict[str, float]]], variants: list[str], out: Path | None
) -> None:
    """Per variant the medians over rounds, and each one's ratio to the first variant taken
    within each round (median of the round ratios)."""
    base = variants[0]
    summary: dict[str, Any] = {}
    for v in variants:
        keys = rounds[0][v].keys()
        summary[v] = {k: statistics.median(r[v][k] for r in rounds) for k in keys}
        if v != base:
            summary[v]["ratio_to_" + base] = {
                k: statistics.median(r[v][k] / r[base][k] for r in rounds)
                for k in keys
                if all(r[base][k] > 0 for r in rounds)
            }
    print(json.dumps(summary, indent=1))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(
            json.dumps({"rounds": rounds, "summary": summary}, indent=1)
        )


if __name__ == "__main__":
    sys.exit(main())
