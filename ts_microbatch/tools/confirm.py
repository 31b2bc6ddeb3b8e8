"""``tune --confirm``: a model served by a real TorchServe with each of several
micro-batching configs in turn (``measure.measure``), measured as a client sees it.

Each run gets a fresh server and configs take turns round by round, so slow phases of a
shared machine hit every config alike; a config's result is its median run.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.config import CONFIG_FILE_NAME
from .corpus import Corpus
from .measure import corpus_sender, measure
from .results import ResultsLog, output_dir

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


def model_dir_of(path: Path, scratch: Path) -> Path:
    """The model directory: ``path`` itself, or the .mar unpacked into ``scratch``."""
    if path.is_dir():
        return path
    with zipfile.ZipFile(path) as mar:
        mar.extractall(scratch)
    return scratch


def with_config(
    source: Path, target: Path, settings: dict[str, Any], frontend: dict[str, Any]
) -> Path:
    """A copy of the model directory ``source`` at ``target``, named after it, with
    ``settings`` in both micro_batching.json and model-config.yaml (where the YAML's section
    would otherwise win) and ``frontend`` (model-config.yaml keys such as batchSize)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    manifest_path = target / "MAR-INF" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"]["modelName"] = target.name
    config_file = manifest["model"].setdefault("configFile", "model-config.yaml")
    yaml_path = target / config_file
    model = yaml.safe_load(yaml_path.read_text()) if yaml_path.exists() else None
    model = {**(model or {}), **frontend, "micro_batching": settings}
    yaml_path.write_text(yaml.safe_dump(model, sort_keys=False))
    (target / CONFIG_FILE_NAME).write_text(json.dumps(settings, indent=4))
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return target


def measure_configs(
    model_dir: Path,
    body: Corpus,
    configs: Sequence[dict[str, Any]],
    load: Load,
    rounds: int,
    workdir: Path,
    progress: Callable[[str], None] = print,
    base_config: Path | None = None,
) -> list[Measured]:
    """Each config served and measured ``rounds`` times, round-robin, each run on a fresh
    server (from ``base_config``, a config.properties, when given); in ``configs``' order.
    ``workdir`` is made first; each run is appended to its results.jsonl as it is
    measured, and results.json (medians and every run) is written at the end."""
    log = ResultsLog(output_dir(workdir, "confirm folder") / "results.jsonl")
    runs: list[list[dict[str, Any]]] = [[] for _ in configs]
    for round_ in range(1, rounds + 1):
        for i, settings in enumerate(configs):
            label = f"[round {round_}/{rounds}] config {i + 1}/{len(configs)}"
            progress(f"{label}: starting TorchServe with {json.dumps(settings)}")
            work = workdir / f"r{round_}-c{i}"
            run = measure_one(model_dir, body, settings, load, work, label, progress, base_config)
            log.append({"round": round_, "config": i + 1, "micro_batching": settings, **run})
            progress(
                f"{label}: {run['requests_per_s']:.1f} req/s, p99 {run['p99_ms']:.0f} ms, "
                f"{run['errors']} errors"
            )
            runs[i].append(run)
    measured = [median_of(settings, rs) for settings, rs in zip(configs, runs)]
    (workdir / "results.json").write_text(
        json.dumps(
            {
                "load": asdict(load),
                "results": [asdict(m) for m in measured],
                "runs": [{"micro_batching": c, "runs": rs} for c, rs in zip(configs, runs)],
            },
            indent=2,
        )
        + "\n"
    )
    return measured


def median_of(settings: dict[str, Any], runs: list[dict[str, Any]]) -> Measured:
    """The run with the median throughput (the lower middle of an even count)."""
    middle = sorted(runs, key=lambda r: r["requests_per_s"])[(len(runs) - 1) // 2]
    return Measured(
        settings,
        middle["requests_per_s"],
        middle["p99_ms"],
        middle["errors"],
        tuple(r["requests_per_s"] for r in runs),
    )


def measure_one(
    model_dir: Path,
    body: Corpus,
    settings: dict[str, Any],
    load: Load,
    work: Path,
    label: str,
    progress: Callable[[str], None] = print,
    base_config: Path | None = None,
) -> dict[str, Any]:
    """A fresh TorchServe (``measure.measure``) serving ``model_dir`` with ``settings``:
    warm-up, then the measured run (``body``, a corpus, from parallel clients: drive.py).
    From ``base_config`` when given, whose own settings win over the room this run needs."""
    store = work / "store"
    frontend = {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": load.batch_size,
        "maxBatchDelay": load.max_batch_delay_ms,
        "responseTimeout": load.response_timeout_s,
    }
    with_config(model_dir, store / "tuned", settings, frontend)
    room = {
        "job_queue_size": str(max(1000, 2 * load.concurrency)),
        "max_request_size": str(max(_MIN_REQUEST_SIZE, 2 * body.largest)),
        "default_response_timeout": str(load.response_timeout_s),
    }
    send = corpus_sender(body, load.concurrency, progress)
    config = {
        "metrics_mode": None,
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
    run = measure(
        work / "server",
        store,
        "tuned",
        config,
        point,
        label,
        work / "metrics.prom",  # prometheus mode only; confirm runs in the server's own
        send,
        None,
        base_config=base_config,
        room=room,
    )
    shutil.rmtree(store)  # a copy of the model per run; the server's logs stay
    return run
