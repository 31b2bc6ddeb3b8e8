#!/usr/bin/env python3
"""What the pipelines themselves cost: CPU per batch with stages that do almost nothing.

    python benchmarks/dev/pipeline_overhead.py [--batches 1000] [--rounds 3]

A handler whose stages make a 32x4 tensor, add one and answer a small dict per request runs
behind upstream's MicroBatching, behind ours, and behind ours without metric lines, each
loaded by TorchServe's own model loader in a process of its own and handed batches of 32
through ``Service.predict`` (TorchServe's reading of the batch and writing of the answers
included, as in a worker). Micro-batch 4, threads 2/1/2. What is left is the pipelines'
bookkeeping, per batch and per thread (from /proc, so the reporter thread's lines count):
the part of the CPU per request that is not the model's. Rounds alternate the variants.
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

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("upstream", "ours", "ours-no-metrics")
SETTINGS = {
    "micro_batch_size": 4,
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
}

HANDLER = """
import torch
from ts.handler_utils.micro_batching import MicroBatching
from ts.torch_handler.base_handler import BaseHandler
from ts_microbatch import MicroBatchingMixin

SETTINGS = {settings!r}


class Trivial(BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True

    def preprocess(self, data):
        return torch.zeros(len(data), 4)

    def inference(self, x):
        return x + 1

    def postprocess(self, y):
        return [{{"label": 1.0}} for _ in range(y.shape[0])]


class Upstream(Trivial):
    def __init__(self):
        super().__init__()
        self.handle = MicroBatching(self, SETTINGS["micro_batch_size"], SETTINGS["parallelism"])


class Ours(MicroBatchingMixin, Trivial):
    pass


class OursNoMetrics(Ours):
    def micro_batching_observer(self, context):
        return None

"""
ENTRY = "import trivial\n\n\nclass Handler(trivial.{cls}):\n    pass\n"  # one class
CLASSES = {"upstream": "Upstream", "ours": "Ours", "ours-no-metrics": "OursNoMetrics"}


def model_dir(work: Path, variant: str) -> Path:
    directory = work / variant
    (directory / "MAR-INF").mkdir(parents=True)
    manifest = {"handler": "handler.py", "modelName": "trivial", "configFile": "config.yaml"}
    (directory / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"model": manifest}))
    (directory / "config.yaml").write_text(json.dumps({"micro_batching": SETTINGS}))
    (directory / "trivial.py").write_text(HANDLER.format(settings=SETTINGS))
    (directory / "handler.py").write_text(ENTRY.format(cls=CLASSES[variant]))
    return directory


def thread_cpu_ms() -> dict[str, float]:
    """CPU milliseconds (user + system) of each live thread of this process, by name."""
    import threading

    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:
            continue  # exited in between
        fields = stat.rsplit(")", 1)[1].split()
        used[thread.name] = (int(fields[11]) + int(fields[12])) * 1000 / ticks
    return used


def context_switches() -> int:
    """Voluntary and involuntary context switches of every thread of this process so far."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                total += int(line.split()[1])
    return total


def child(directory: Path, batches: int) -> None:
    from worker_loader import load_worker_service  # beside this file

    service = load_worker_service(directory, "trivial", "handler.py", 32)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the metric lines go where a worker's go
    warmup = 50
    for n in range(warmup + batches):
        if n == warmup:
            threads, cpu = thread_cpu_ms(), time.process_time()
            switched = context_switches()
        batch = [
            {
                "requestId": f"r{n}-{i}".encode(),
                "parameters": [{"name": "body", "value": b"x" * 100, "contentType": "text/plain"}],
            }
            for i in range(32)
        ]
        service.predict(batch)
    cpu_ms = (time.process_time() - cpu) * 1000 / batches
    switches = (context_switches() - switched) / batches
    after = thread_cpu_ms()
    per_thread = {k: (v - threads.get(k, 0.0)) / batches for k, v in after.items()}
    result = {"cpu_ms_per_batch": cpu_ms, "switches_per_batch": switches, "threads": per_thread}
    out.write(json.dumps(result) + "\n")
    out.flush()
    os._exit(0)  # pipeline threads are daemons, as in a worker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batches)
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[str, list[dict[str, object]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="pipeline_overhead_") as tmp:
        dirs = {v: model_dir(Path(tmp), v) for v in VARIANTS}
        for r in range(args.rounds):
            for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
                cmd = [sys.executable, __file__, "--child", str(dirs[variant])]
                cmd += ["--batches", str(args.batches)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                results[variant].append(result)
                print(f"round {r + 1} {variant:16} {result['cpu_ms_per_batch']:.2f} ms", flush=True)
    summary = {}
    for variant, rows in results.items():
        cpu = statistics.median(float(row["cpu_ms_per_batch"]) for row in rows)  # type: ignore[arg-type]
        names = set().union(*(row["threads"] for row in rows))  # type: ignore[arg-type]
        threads = {
            name: statistics.median(row["threads"].get(name, 0.0) for row in rows)  # type: ignore[union-attr]
            for name in sorted(names)
        }
        switches = statistics.median(float(row["switches_per_batch"]) for row in rows)  # type: ignore[arg-type]
        summary[variant] = {
            "cpu_ms_per_batch": cpu,
            "switches_per_batch": switches,
            "threads_ms_per_batch": threads,
        }
        print(
            f"{variant}: {cpu:.2f} ms of CPU and {switches:.0f} context switches per batch of"
            f" 32 (median of {len(rows)} rounds)"
        )
        for name, ms in threads.items():
            print(f"    {name:32} {ms:.2f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
