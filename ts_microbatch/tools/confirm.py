"""``tune --confirm``: a model served by a real TorchServe with each of several
micro-batching configs, measured as a client sees it.

The configs are served as the benchmark serves its variants (``benchmark.run_rounds``):
each run on a fresh server, every config once a round, in an order shuffled from a seed
recorded in results.json, so slow phases of a shared machine hit every config alike and
no config always goes first; a config's result is its median run (``runs.medians``). A
config TorchServe refuses is reported and measured as nothing.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .benchmark import log, run_rounds
from .corpus import Corpus
from .mar import override_mar
from .results import ResultsLog, output_dir
from .runs import medians, new_seed

# TorchServe's default max_request_size (6,553,500 bytes) refuses large samples.
_MIN_REQUEST_SIZE = 6_553_500


@dataclass(frozen=True)
class Load:
    """How each config is served and driven."""

    batch_size: int
    max_batch_delay_ms: int
    concurrency: int
    requests: int
    warmup_requests: int
    response_timeout_s: int = 120


@dataclass(frozen=True)
class Measured:
    """One config's median run (by throughput) and the throughput of every run."""

    config: dict[str, Any]
    requests_per_s: float
    p99_ms: float
    errors: int
    runs: tuple[float, ...] = ()


def measure_configs(
    mar: Path,
    corpus: Corpus,
    configs: Sequence[dict[str, Any]],
    load: Load,
    rounds: int,
    workdir: Path,
    base_config: Path | None = None,
    seed: int | None = None,
) -> list[Measured]:
    """Each config (the .mar or model directory ``mar`` repackaged with it) served and
    measured ``rounds`` times, each run on a fresh server (from ``base_config``, a
    config.properties, when given, whose own settings win over the room these runs need);
    results in ``configs``' order. ``workdir`` is made first; each run is appended to its
    results.jsonl as it is measured, and results.json (medians, every run and the seed,
    new when None) is written at the end."""
    out = output_dir(workdir, "confirm folder")
    seed = new_seed() if seed is None else seed
    frontend = _frontend(load)
    names = [f"c{i}" for i in range(1, len(configs) + 1)]
    variants: list[tuple[str, dict[str, Any] | None]] = list(zip(names, configs))
    effective = {
        name: override_mar(mar, out / "store" / f"{name}.mar", settings, frontend)
        for name, settings in zip(names, configs)
    }
    config, point, room = _run_settings(load, corpus)
    log(f"each round serves the configs in an order shuffled with seed {seed}")
    results = ResultsLog(out / "results.jsonl")
    rows, refused = run_rounds(
        rounds, variants, effective, corpus, config, point, out, base_config, results, seed,
        room=room,
    )  # fmt: skip
    shutil.rmtree(out / "store", ignore_errors=True)  # the repackaged models; logs stay
    middle = {row["handler"]: row for row in medians(rows, lambda row: "")}
    measured = [
        Measured(settings, row["requests_per_s"], row["p99_ms"], row["errors"], tuple(row["runs"]))
        if (row := middle.get(name)) is not None
        else Measured(settings, 0.0, math.nan, load.requests)  # refused: measured as nothing
        for name, settings in zip(names, configs)
    ]
    runs = [{"micro_batching": c, "runs": [r for r in rows if r["handler"] == name]}
            for name, c in zip(names, configs)]  # fmt: skip
    summary = {"load": asdict(load), "seed": seed, "results": [asdict(m) for m in measured]}
    (out / "results.json").write_text(
        json.dumps({**summary, "runs": runs, "refused": refused}, indent=2) + "\n"
    )
    return measured


def _frontend(load: Load) -> dict[str, Any]:
    """The model-config.yaml keys every config is packaged with: one worker, ``load``'s
    batch and timeout."""
    return {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": load.batch_size,
        "maxBatchDelay": load.max_batch_delay_ms,
        "responseTimeout": load.response_timeout_s,
    }


def _run_settings(
    load: Load, corpus: Corpus
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """``measure``'s config and point for ``load``, and the room its servers need: a queue
    for every client, twice the largest body, the timeout."""
    room = {
        "job_queue_size": str(max(1000, 2 * load.concurrency)),
        "max_request_size": str(max(_MIN_REQUEST_SIZE, 2 * corpus.largest)),
        "default_response_timeout": str(load.response_timeout_s),
    }
    config = {
        "metrics_mode": None,  # the server's own
        "warmup_requests": load.warmup_requests,
        "response_timeout": load.response_timeout_s,
    }
    point = {
        "batch_size": load.batch_size,
        "max_batch_delay": load.max_batch_delay_ms,
        "workers": 1,
        "concurrency": load.concurrency,
        "requests": load.requests,
    }
    return config, point, room
