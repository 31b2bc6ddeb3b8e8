"""A .mar's handler loaded with a TorchServe context built here, and batches of a corpus run
through it: the latency tuner's in-process stage costs (``tune``, ``slo_plan``)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from ..torchserve.micro_batching import MicroBatching
from .corpus import Body, rows_of


def model_dir_of(path: Path, scratch: Path) -> Path:
    """The model directory: ``path`` itself, or the .mar unpacked into ``scratch``."""
    if path.is_dir():
        return path
    with zipfile.ZipFile(path) as mar:
        mar.extractall(scratch)
    return scratch


def make_context(
    model_dir: Path,
    batch_size: int,
    manifest: dict[str, Any] | None = None,
    yaml_config: dict[str, Any] | None = None,
) -> Any:
    """A TorchServe Context for ``model_dir``, as the backend worker builds one, with
    TorchServe's default metrics cache. The manifest and model-config.yaml are read from the
    directory unless given."""
    import ts
    from ts.context import Context
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
    from ts.utils.util import get_yaml_config

    if manifest is None:
        manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    if yaml_config is None:
        config_file = manifest["model"].get("configFile")
        yaml_config = get_yaml_config(str(model_dir / config_file)) if config_file else {}
    metrics = MetricsCacheYamlImpl(
        os.path.join(os.path.dirname(ts.__file__), "configs", "metrics.yaml")
    )
    metrics.initialize_cache()
    name = manifest["model"]["modelName"]
    metrics.model_name = name
    context = Context(
        name,
        str(model_dir),
        manifest,
        batch_size,
        None,
        ts.__version__,
        metrics=metrics,
        model_yaml_config=yaml_config or {},
    )
    fresh_batch(context, batch_size)
    return context


def load_handler(model_dir: Path, context: Any) -> tuple[Any, MicroBatching]:
    """Imports and initializes the .mar's handler; returns it and its MicroBatching."""
    handler_file = context.manifest["model"]["handler"].split(":")[0]
    sys.path.insert(0, str(model_dir))  # as TorchServe does: model.py and extra files
    model_file = context.manifest["model"].get("modelFile")
    if model_file:  # BaseHandler imports it by name; a same-named module may be cached
        sys.modules.pop(Path(model_file).stem, None)
    spec = importlib.util.spec_from_file_location(Path(handler_file).stem, model_dir / handler_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import the handler {handler_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes = [
        c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__
    ]
    if len(classes) != 1:
        raise SystemExit(f"{handler_file} must define exactly one class, found {len(classes)}")
    handler = classes[0]()
    handler.initialize(context)
    mb = getattr(handler, "micro_batching", None) or getattr(handler, "handle", None)
    if not isinstance(mb, MicroBatching):
        raise SystemExit(f"{handler_file} does not use ts_microbatch.MicroBatching")
    return handler, mb


def fresh_batch(context: Any, batch_size: int) -> None:
    """What TorchServe's Service.predict does before each batch: new request ids and
    per-request response state."""
    from ts.context import RequestProcessor

    context.request_ids = {i: f"req-{i}" for i in range(batch_size)}
    context.request_processor = [RequestProcessor({}) for _ in range(batch_size)]
    context.metrics.request_ids = context.request_ids


# A batch over this many times the median is run again (``STALL_RERUNS`` times) and its
# fastest run kept: a long body is slow every time, the machine's stall once.
STALL_FACTOR = 3.0
STALL_RERUNS = 2


def measure_with_cpu(
    mb: MicroBatching, context: Any, batches: list[list[Body]]
) -> tuple[float, float, tuple[float, ...]]:
    """Seconds per batch (the median over ``batches`` after the first, a warm-up), the
    process's CPU seconds per batch over the same batches (the mean: every stage thread's
    CPU, the cost a worker would put on the cores) and each batch's seconds (bodies of
    different lengths make some batches much slower than the median). A batch slower than
    ``STALL_FACTOR`` times the median is measured again and its fastest run kept, so one
    stall of a busy machine is not taken for the corpus's spread (the tuner's P99)."""
    runs = [_run_batch(mb, context, batch) for batch in batches]
    if len(runs) < 2:
        raise ValueError("measure: got one batch, expected a warm-up and at least one more")
    times = [seconds for seconds, _ in runs[1:]]
    cpu_s = sum(cpu for _, cpu in runs[1:])
    median = sorted(times)[len(times) // 2]
    for i, seconds in enumerate(times):
        if seconds > STALL_FACTOR * median:
            again = [_run_batch(mb, context, batches[i + 1])[0] for _ in range(STALL_RERUNS)]
            times[i] = min(seconds, *again)
    return sorted(times)[len(times) // 2], cpu_s / len(times), tuple(times)


def _run_batch(mb: MicroBatching, context: Any, batch: list[Body]) -> tuple[float, float]:
    """One batch through ``mb``: its seconds and the process's CPU seconds; a request the
    handler failed ends the run (the tuner needs bodies the handler accepts)."""
    rows = rows_of(batch)
    fresh_batch(context, len(rows))
    cpu = time.process_time()
    start = time.perf_counter()
    mb(rows, context)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    failed = [s for s in range(len(rows)) if context.get_response_status(s)[0] != 200]
    if failed:
        names = ", ".join(sorted({batch[s].name for s in failed})[:5])
        raise SystemExit(
            f"the sample input failed ({len(failed)} of {len(rows)} requests: {names}): "
            "give bodies the handler accepts"
        )
    return seconds, cpu_s
