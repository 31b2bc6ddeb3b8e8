#!/usr/bin/env python3
"""Time of a clean batch of 32 against the same batch with one truncated JPEG, in-process.

    .venv/bin/python benchmarks/corrupt_batch_timing.py

Untrained ResNet-18, the example's micro_batching.json, the torchvision decoder; the median
of 5 batches each, measured twice in alternation. Prints the statuses too.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples/image_classifier")]

import prepare  # noqa: E402
import torch  # noqa: E402
from torchvision.models import resnet18  # noqa: E402

from tests.torchserve.images import (  # noqa: E402
    jpeg_rows,
    load_handler_module,
    make_context,
    statuses,
)


def model_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="ts-microbatch-timing-"))
    shutil.copy(ROOT / "examples/image_classifier/model.py", directory / "model.py")
    torch.manual_seed(0)
    torch.save(resnet18(weights=None).state_dict(), directory / "resnet18.pth")
    prepare.write_labels(str(directory))
    shutil.copy(ROOT / "configs/micro_batching.json", directory / "micro_batching.json")
    sys.path.insert(0, str(directory))
    return directory


def main() -> None:
    directory = model_dir()
    handler = load_handler_module().MicroBatchingHandler()
    handler.initialize(make_context(directory, 32, {"handler": {"decoder": "torchvision"}}))
    clean = jpeg_rows(32, size=(720, 720))
    corrupt = list(clean)
    corrupt[13] = {"body": clean[13]["body"][: len(clean[13]["body"]) // 3]}

    def timed(rows: list[dict[str, Any]]) -> tuple[float, list[int]]:
        seconds = []
        for _ in range(5):
            context = make_context(directory, 32)
            start = time.perf_counter()
            handler.handle(rows, context)
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds), statuses(context, 32)

    timed(clean)  # warm-up
    for name, rows in [("clean", clean), ("one corrupt", corrupt)] * 2:
        median_s, codes = timed(rows)
        print(
            f"{name}: {median_s * 1000:.0f} ms per batch of 32, "
            f"200 x{codes.count(200)}, 400 x{codes.count(400)}"
        )
    handler.micro_batching.shutdown()
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
