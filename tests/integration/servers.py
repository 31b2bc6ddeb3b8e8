"""The example's models and the project's TorchServe, for the integration tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, load_module
from ts_microbatch.tools.scrape import summarize
from ts_microbatch.tools.server import TorchServe

build = load_module("examples/image_classifier/build_mar.py", "ts_microbatch_example_build_mar")
MODEL = "resnet-18_mb"
BAD_MODEL = "resnet-18_badcfg"
BAD_CONFIG = {"micro_batch_size": 4, "parallelism": {"preprocess": 2, "inference": 0}}
AUTO_MODEL = "resnet-18_auto"
AUTO_CONFIG = {
    "micro_batch_size": "auto",
    "min_micro_batch_size": 2,
    "max_micro_batch_size": 6,
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 1},
    # A line per micro-batch: its test reads each micro-batch's size from the histogram.
    "metrics_interval_s": 0,
}


def local_server(model_store: Path, workdir: Path) -> TorchServe:
    """A TorchServe on free loopback ports with the project's config; a context manager
    that starts it and always stops it."""
    return TorchServe(
        model_store=model_store,
        workdir=workdir,
        base_config=Path(ROOT) / "configs/config.properties",
    )


def scraped(
    server: TorchServe, model: str, before: str = "", timeout_s: float = 30
) -> dict[str, Any]:
    """The summary of ``model``'s pipeline metrics since ``before``, once the worker's lines
    for the traffic sent have reached ``/metrics``: they are written by interval
    (``metrics_interval_s``), so a scrape made at once may not hold them yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        summary = summarize(server.scrape_metrics(), before, model_name=model)
        if summary["micro_batches"] or time.monotonic() > deadline:
            return summary
        time.sleep(0.2)  # a bounded poll for lines written within the interval
