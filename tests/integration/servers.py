"""The example's models and the project's TorchServe, for the integration tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, load_module
from ts_microbatch.tools import measure
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


@contextlib.contextmanager
def registered(server: TorchServe, *names: str, **settings: Any) -> Iterator[TorchServe]:
    """``<name>.mar`` of each of ``names`` (in ``server``'s store) registered under that
    name with ``register``'s ``settings``, and unregistered on exit: a module's models on
    the shared server, gone before the next module's tests run."""
    try:
        for name in names:
            resp = server.register(f"{name}.mar", model_name=name, **settings)
            assert resp.status == 200, (resp.body, server.log()[-3000:])
        yield server
    finally:
        for name in names:
            server.unregister(name, drain=False)


def model_log(server: TorchServe, name: str) -> str:
    """The lines of the model log that ``name``'s workers wrote (``W-<port>-<name>_<version>``):
    on the shared server, the other models' lines are in the same file."""
    return "\n".join(line for line in server.log().splitlines() if f"-{name}_" in line)


def settled_scrape(server: TorchServe, model: str, timeout_s: float = 30) -> str:
    """``/metrics`` once the worker's lines stopped moving (``measure.settled_scrape``, the
    tools' rule); ``model`` names whose lines the caller reads."""
    return measure.settled_scrape(server, timeout_s)


def scraped(server: TorchServe, model: str, before: str = "") -> dict[str, Any]:
    """The summary of ``model``'s pipeline metrics since ``before`` (a settled scrape), once
    the worker's lines for the traffic sent have all reached ``/metrics``."""
    return summarize(settled_scrape(server, model), before, model_name=model)
