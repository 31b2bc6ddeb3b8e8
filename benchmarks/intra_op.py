#!/usr/bin/env python3
"""A stage thread's torch intra-op threads: one against torch's default, on the preprocess of
TorchServe's ImageClassifier (the 720px body), in-process, no server.

    python benchmarks/intra_op.py --rounds 6 --out benchmarks/results/intra_op

Two shapes: one thread preprocessing one image per call (a lone request), and two threads
preprocessing micro-batches of four (the pipeline's preprocess at threads 2/1/2). Each
thread sets its count as the pipeline does (``ts_microbatch.core.intra_op``); rounds
alternate the settings, and the medians of the wall and CPU milliseconds per image (every
thread of the process) are reported with their ratios. This is why ``intra_op_threads``
gives preprocess and postprocess threads one thread each by default.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "examples" / "image_classifier")]

SHAPES = {"one thread, one image": (1, 1, 60), "two threads, micro-batches of 4": (2, 4, 12)}


def preprocessor() -> Any:
    import torch
    from ts.torch_handler.image_classifier import ImageClassifier

    handler = ImageClassifier()
    handler.device = torch.device("cpu")  # what initialize sets on a machine without a GPU
    return handler


def measure(
    handler: Any, rows: list[dict[str, Any]], threads: int, calls: int, one: bool
) -> tuple[float, float]:
    """Wall and CPU milliseconds per image: ``threads`` threads, ``calls`` calls each."""
    from ts_microbatch.core.intra_op import limit_intra_op_threads

    def work() -> None:
        if one and not limit_intra_op_threads(1):
            raise RuntimeError("could not set one intra-op thread on this thread")
        for _ in range(calls):
            handler.preprocess(rows)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    wall, cpu = time.perf_counter(), time.process_time()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    images = threads * calls * len(rows)
    return (
        1000 * (time.perf_counter() - wall) / images,
        1000 * (time.process_time() - cpu) / images,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import corpus
    import torch

    body = corpus.bodies()["720px"].data
    handler = preprocessor()
    default = torch.get_num_threads()
    results: dict[str, Any] = {"torch_default_intra_op_threads": default, "shapes": {}}
    for shape, (threads, size, calls) in SHAPES.items():
        rows = [{"body": body} for _ in range(size)]
        measure(handler, rows, threads, 2, one=False)  # warm-up
        runs: dict[str, list[tuple[float, float]]] = {"one": [], "default": []}
        for r in range(args.rounds):
            for setting in ("one", "default") if r % 2 == 0 else ("default", "one"):
                runs[setting].append(measure(handler, rows, threads, calls, setting == "one"))
        row = {
            setting: {
                "wall_ms_per_image": statistics.median(w for w, _ in values),
                "cpu_ms_per_image": statistics.median(c for _, c in values),
            }
            for setting, values in runs.items()
        }
        row["one_over_default"] = {key: row["one"][key] / row["default"][key] for key in row["one"]}
        results["shapes"][shape] = row
        print(shape, json.dumps(row), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
