#!/usr/bin/env python3
"""Latency and per-item time of a model's forward pass for batch sizes 1..256.

    python benchmarks/dev/profile_batch.py [--model resnet18] [--max-batch 256] [--repeats 5]

The table a user reads to choose TorchServe's batch size and the micro-batch size: the
per-item time falls while the batch amortizes fixed costs, then flattens (compute-bound),
while latency keeps growing. Each size is warmed up before it is timed; the median of
``--repeats`` runs is reported. Untrained weights: the time does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def profile(model_name: str, sizes: list[int], repeats: int) -> list[dict[str, float]]:
    import torch
    import torchvision

    model = getattr(torchvision.models, model_name)(weights=None).eval()
    rows = []
    with torch.inference_mode():
        for n in sizes:
            x = torch.randn(n, 3, 224, 224)
            model(x)  # warm-up: allocator and kernel selection for this shape
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - start)
            latency_ms = statistics.median(times) * 1000
            rows.append(
                {
                    "batch_size": n,
                    "latency_ms": latency_ms,
                    "per_item_ms": latency_ms / n,
                    "items_per_s": n * 1000 / latency_ms,
                }
            )
            print(
                f"batch {n:4}: {latency_ms:9.1f} ms, {latency_ms / n:7.2f} ms per item, "
                f"{n * 1000 / latency_ms:7.1f} items/s",
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", help="a torchvision.models constructor name")
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args()
    import torch

    sizes = [2**i for i in range(args.max_batch.bit_length()) if 2**i <= args.max_batch]
    print(f"{args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    rows = profile(args.model, sizes, args.repeats)
    if args.out:
        args.out.write_text(
            json.dumps(
                {"model": args.model, "torch_threads": torch.get_num_threads(), "rows": rows},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
