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


def settled_scrape(server: TorchServe, model: str, timeout_s: float = 30) -> str:
    """``/metrics`` once ``model``'s pipeline lines stopped moving: equal in two scrapes
    more than an interval apart (``metrics_interval_s``, 1 s by default: the worker writes
    an interval's lines when it ends, so a scrape made at once may miss the last ones)."""

    def pipeline_lines(text: str) -> list[str]:
        label = f'ModelName="{model}"'
        return [
            line for line in text.splitlines() if line.startswith("MicroBatch") and label in line
        ]

    deadline = time.monotonic() + timeout_s
    text = server.scrape_metrics()
    while True:
        time.sleep(1.5)  # longer than an interval and the reporter's 20 ms
        again = server.scrape_metrics()
        if pipeline_lines(again) == pipeline_lines(text) or time.monotonic() > deadline:
            return again
        text = again


def scraped(server: TorchServe, model: str, before: str = "") -> dict[str, Any]:
    """The summary of ``model``'s pipeline metrics since ``before`` (a settled scrape), once
    the worker's lines for the traffic sent have all reached ``/metrics``."""
    return summarize(settled_scrape(server, model), before, model_name=model)
