"""Config, sweep points and plots for benchmark-ab.py, and helpers the studies share;
importable so tests can check them.

What a benchmark of any .mar needs lives in the package (ts_microbatch.tools: ``ab``,
``measure``, ``runs``, ``benchmark``), so that it runs after ``pip install
ts_microbatch[tools]``; the names the studies use from there are re-exported here."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ts_microbatch.core.config import MicroBatchingConfig
from ts_microbatch.core.errors import ConfigError
from ts_microbatch.tools.measure import RegistrationError as RegistrationError
from ts_microbatch.tools.measure import cpu_seconds as cpu_seconds
from ts_microbatch.tools.runs import machine_info as machine_info

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CONFIG_KEYS = {
    "url",
    "requests",
    "concurrency",
    "input",
    "workers",
    "batch_size",
    "max_batch_delay",
    "micro_batch_size",
    "parallelism",
    "handlers",
    "scenarios",
    "accelerator",
    "warmup_requests",
    "decoder",
    "response_timeout",
    "micro_batching",
    "metrics_mode",
    "mar",
    "repeats",
    "server_overhead",
    "bodies",
}
SWEEP_KEYS = ("batch_size", "micro_batch_size", "max_batch_delay", "concurrency", "workers")
INT_SWEEP_KEYS = ("batch_size", "max_batch_delay", "concurrency", "workers")
DEFAULTS: dict[str, Any] = {
    "requests": 1000,
    "concurrency": 64,
    "workers": 1,
    "batch_size": 32,
    "max_batch_delay": 50,
    "micro_batch_size": 4,
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
    "handlers": ["plain", "upstream", "ours"],
    "scenarios": ["accelerator"],
    "accelerator": {"fixed_ms": 2.0, "per_item_ms": 0.5},
    "warmup_requests": 200,
    "decoder": "torchvision",
    "response_timeout": 120,
    "micro_batching": None,
    "metrics_mode": "prometheus",
    "mar": None,
    "repeats": 1,
    "server_overhead": True,
    "bodies": ["720px"],
}
# ours-same: our handler with upstream's stages (PIL decoding as ImageClassifier, no EXIF
# turn): the pipeline's own gain. ours: our handler with the config's decoder.
HANDLERS = ("plain", "upstream", "ours-same", "ours")
BODY_KEYS = ("body", "concurrency", "requests")
SCENARIOS = ("real", "accelerator", "mar")
METRICS_MODES = ("prometheus",)  # the runner reads the pipeline from /metrics

if TYPE_CHECKING:
    from ts_microbatch.tools.server import TorchServe


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class BenchConfigError(ValueError):
    """The benchmark config has an unknown key or a bad value."""


def load_config(path: str | Path) -> dict[str, Any]:
    """Reads config.json: TorchServe benchmark keys plus ours; a list value is a sweep."""
    raw = json.loads(Path(path).read_text())
    unknown = sorted(set(raw) - CONFIG_KEYS)
    if unknown:
        raise BenchConfigError(
            f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(CONFIG_KEYS))}"
        )
    config = {**DEFAULTS, **raw}
    # The reference writes "workers": "1".
    workers = config["workers"]
    config["workers"] = [_int(w) for w in workers] if isinstance(workers, list) else _int(workers)
    for key in INT_SWEEP_KEYS + ("requests", "warmup_requests", "repeats"):
        for value in as_list(config[key]):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < (0 if key in ("max_batch_delay", "warmup_requests") else 1)
            ):
                raise BenchConfigError(f"{path}: {key}: got {value!r}, expected a positive integer")
    if config["requests"] < max(as_list(config["concurrency"])):
        raise BenchConfigError(
            f"{path}: requests: got {config['requests']}, expected at least the largest "
            f"concurrency ({max(as_list(config['concurrency']))}); ab refuses fewer"
        )
    for name, allowed in (("handlers", HANDLERS), ("scenarios", SCENARIOS)):
        bad = [h for h in config[name] if h not in allowed]
        if bad:
            raise BenchConfigError(
                f"{path}: {name}: got {bad[0]!r}, expected some of {', '.join(allowed)}"
            )
    if not isinstance(config["server_overhead"], bool):
        raise BenchConfigError(
            f"{path}: server_overhead: got {config['server_overhead']!r}, expected true or false"
        )
    if config["metrics_mode"] not in METRICS_MODES:
        raise BenchConfigError(
            f"{path}: metrics_mode: got {config['metrics_mode']!r}, "
            f"expected one of {', '.join(METRICS_MODES)}"
        )
    if "mar" in config["scenarios"] and not (config["mar"] and config.get("input")):
        raise BenchConfigError(
            f"{path}: scenarios: 'mar' needs \"mar\" (a .mar or model directory) and "
            '"input" (a request body the model accepts)'
        )
    if config.get("input"):
        # The user's body is named after its file, never after a corpus image it replaces.
        name = Path(config["input"]).name
        if "bodies" not in raw:
            config["bodies"] = [name]
        if any(_body_name(b) == "mix" for b in as_list(config["bodies"])):
            raise BenchConfigError(f'{path}: bodies: "mix" cannot be sent with "input" (one body)')
        config["bodies"] = _body_entries(config["bodies"], path, (name,))
    else:
        config["bodies"] = _body_entries(config["bodies"], path, _corpus().names())
    explicit = config["micro_batching"] is not None
    try:
        config["micro_batching"] = [
            _micro_batching_entry(entry, f"micro_batching[{i}]: " if explicit else "")
            for i, entry in enumerate(_micro_batching_settings(config))
        ]
    except ConfigError as err:
        raise BenchConfigError(f"{path}: {err}") from None
    return config


def _body_name(entry: Any) -> Any:
    return entry.get("body") if isinstance(entry, dict) else entry


def _body_entries(bodies: Any, path: str | Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """``bodies``: ``names`` (benchmarks/corpus.py's and "mix", or the ``input`` file's), or
    mappings of a name and the concurrency and request count to send it with."""
    entries = []
    for entry in as_list(bodies):
        entry = {"body": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "body" not in entry or set(entry) - set(BODY_KEYS):
            raise BenchConfigError(
                f"{path}: bodies: got {entry!r}, expected a name or a mapping of "
                f"{', '.join(BODY_KEYS)}"
            )
        if entry["body"] not in names:
            raise BenchConfigError(
                f"{path}: bodies: got {entry['body']!r}, expected one of {', '.join(names)}"
            )
        for key in ("concurrency", "requests"):
            value = entry.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise BenchConfigError(
                    f"{path}: bodies: {key}: got {value!r}, expected an integer >= 1"
                )
        entries.append(entry)
    return entries


def _corpus() -> Any:
    """benchmarks/corpus.py, which needs the example's prepare.py on the path."""
    for path in (HERE, ROOT / "examples" / "image_classifier"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import corpus

    return corpus


def _int(value: Any) -> Any:
    """An integer written as a string becomes the integer; anything else is left to check."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


def _micro_batching_settings(config: dict[str, Any]) -> list[Any]:
    """The micro-batching configs to measure: the explicit list, or every combination of
    the micro_batch_size and parallelism values."""
    if config["micro_batching"] is not None:
        if not isinstance(config["micro_batching"], list) or not config["micro_batching"]:
            raise ConfigError(
                f"micro_batching: got {config['micro_batching']!r}, expected a non-empty list of "
                "micro_batching.json objects"
            )
        return list(config["micro_batching"])
    return [
        {"micro_batch_size": size, "parallelism": parallelism}
        for size in as_list(config["micro_batch_size"])
        for parallelism in as_list(config["parallelism"])
    ]


def _micro_batching_entry(entry: Any, prefix: str) -> dict[str, Any]:
    """``entry`` checked by ts_microbatch's own schema; errors start with ``prefix``."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{prefix}got {entry!r}, expected a micro_batching.json object")
    try:
        MicroBatchingConfig.from_mapping(entry)
    except ConfigError as err:
        raise ConfigError(f"{prefix}{err}") from None
    return dict(entry)


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def sweep_points(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the swept keys and micro-batching configs, in config order.

    A point has the swept values, ``micro_batch_size`` and ``parallelism`` ("pre/inf/post")
    as the pipeline will run them, and ``micro_batching``, the settings to package."""
    points = []
    for body, batch_size, settings, delay, concurrency, workers in itertools.product(
        config.get("bodies") or [{"body": "720px"}],
        as_list(config["batch_size"]),
        config["micro_batching"],
        as_list(config["max_batch_delay"]),
        as_list(config["concurrency"]),
        as_list(config["workers"]),
    ):
        effective = MicroBatchingConfig.from_mapping(settings)
        points.append(
            {
                "body": body["body"],
                "batch_size": batch_size,
                "micro_batch_size": effective.micro_batch_size,
                "max_batch_delay": delay,
                "concurrency": body.get("concurrency", concurrency),
                "requests": body.get("requests", config["requests"]),
                "workers": workers,
                "parallelism": "/".join(str(n) for n in effective.parallelism.as_dict().values()),
                "micro_batching": settings,
            }
        )
    return points


def point_tag(point: dict[str, Any]) -> str:
    """A short unique-enough name for a point, usable in a TorchServe model name."""
    parts = [point.get("body", "720px")] + [f"{key[:3]}{point[key]}" for key in SWEEP_KEYS]
    parts.append("par" + point["parallelism"].replace("/", "-"))
    extra = sorted(set(point["micro_batching"]) - {"micro_batch_size", "parallelism"})
    if extra:  # other settings differ between explicit configs: keep the names apart
        digest = hashlib.sha1(json.dumps(point["micro_batching"], sort_keys=True).encode())
        parts.append(digest.hexdigest()[:6])
    return re.sub(r"[^A-Za-z0-9-]", "", "-".join(parts))


# The ratios benchmark-ab.py reports round by round: ours on upstream's stages, and ours
# with its decoder, each against upstream.
COMPARISONS = (("ours-same", "upstream"), ("ours", "upstream"))


def plot_bodies(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Median throughput and P99 per body, one bar per handler, the do-nothing handler's
    ceiling marked; False (nothing written) with a single body."""
    bodies = list(dict.fromkeys(r["body"] for r in rows))
    if len(bodies) < 2:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    handlers = list(dict.fromkeys(r["handler"] for r in rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(handlers)
    for i, handler in enumerate(handlers):
        got = {r["body"]: r for r in rows if r["handler"] == handler}
        xs = [b + (i - (len(handlers) - 1) / 2) * width for b in range(len(bodies))]
        ax1.bar(
            xs, [got[b]["requests_per_s"] if b in got else 0 for b in bodies], width, label=handler
        )
        ax2.bar(xs, [got[b]["p99_ms"] if b in got else 0 for b in bodies], width, label=handler)
    ceilings = {r["body"]: r.get("server_overhead_requests_per_s") for r in rows}
    for b, body in enumerate(bodies):
        if ceilings.get(body):
            ax1.plot([b - 0.45, b + 0.45], [ceilings[body]] * 2, "k--", linewidth=1)
    ax1.plot([], [], "k--", label="do-nothing handler (server ceiling)")
    ax1.set(ylabel="throughput (requests/s)", yscale="log", title=title)
    ax2.set(ylabel="P99 latency (ms)", yscale="log", title=title)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(bodies)), bodies)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# -- the limit ---------------------------------------------------------------------------


def ideal_throughput(stage_rates: dict[str, float], *, shared_cpu: Iterable[str] = ()) -> float:
    """Requests/s a perfect pipeline reaches: its slowest stage. Stages named in
    ``shared_cpu`` run on the same cores and each was measured with all of them, so
    together they count as one stage whose time is the sum of theirs."""
    shared = [s for s in shared_cpu if s in stage_rates]
    rates = [r for s, r in stage_rates.items() if s not in shared]
    if shared:
        rates.append(1.0 / sum(1.0 / stage_rates[s] for s in shared))
    return min(rates)


def _sort_key(value: Any) -> tuple[bool, float, str]:
    """Numbers in order, then strings ("auto")."""
    return (isinstance(value, str), 0.0 if isinstance(value, str) else float(value), str(value))


def plot_sweep(
    rows: list[dict[str, Any]], path: Path, title: str, x_key: str = "batch_size"
) -> bool:
    """Throughput and P99 over ``x_key``, one curve per handler and micro-batch size (the
    plain handler is the "NO MB" baseline). Returns False, writing nothing, when fewer than
    two values of ``x_key`` were measured."""
    if len({r[x_key] for r in rows}) < 2:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    # "auto" micro-batch sizes make the axis categorical: plot at positions, label with values.
    all_xs = sorted({r[x_key] for r in rows}, key=_sort_key)
    categorical = any(isinstance(x, str) for x in all_xs)
    several_parallelisms = len({r.get("parallelism") for r in rows}) > 1
    curves: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        label = "NO MB (plain)" if r["handler"] == "plain" else r["handler"]
        if r["handler"] != "plain" and x_key != "micro_batch_size":
            label += f" MBS={r['micro_batch_size']}"
        if r["handler"] != "plain" and several_parallelisms:
            label += f" threads {r['parallelism']}"
        curves.setdefault(label, []).append(r)
    for label, points in sorted(curves.items()):
        # The plain handler ignores micro_batch_size, so a sweep over it measures the
        # baseline several times at the same x: plot the mean of those runs.
        by_x: dict[Any, list[dict[str, Any]]] = {}
        for p in points:
            by_x.setdefault(p[x_key], []).append(p)
        xs = sorted(by_x, key=_sort_key)
        at = [all_xs.index(x) for x in xs] if categorical else xs
        ys = [
            [sum(p[k] for p in by_x[x]) / len(by_x[x]) for x in xs]
            for k in ("requests_per_s", "p99_ms")
        ]
        ax1.plot(at, ys[0], marker="o", label=label)
        ax2.plot(at, ys[1], marker="o", label=label)
    for ax in (ax1, ax2):
        ax.set_xticks(list(range(len(all_xs))) if categorical else all_xs, [str(x) for x in all_xs])
    label = x_key.replace("_", " ")
    scale = "log" if x_key in ("batch_size", "concurrency") and not categorical else "linear"
    ax1.set(xlabel=label, ylabel="throughput (requests/s)", xscale=scale, title=title)
    ax2.set(xlabel=label, ylabel="P99 latency (ms)", xscale=scale, title=title)
    for ax in (ax1, ax2):
        ax.minorticks_off()
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def project_server(
    model_store: Path,
    workdir: Path,
    properties: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> TorchServe:
    """A TorchServe on free loopback ports with the project's configs/config.properties
    (``properties`` over it, ``env`` added to its environment); a context manager, or
    start() and stop() by hand."""
    from ts_microbatch.tools.server import TorchServe

    return TorchServe(
        model_store=model_store,
        workdir=workdir,
        properties=dict(properties or {}),
        env=dict(env or {}),
        base_config=ROOT / "configs/config.properties",
    )


def scratch_dir(prefix: str) -> Path:
    """A new directory for one run's packages, servers and logs (tens to hundreds of MB),
    removed when the process exits; ``BENCH_KEEP=1`` keeps it (and prints where)."""
    import atexit
    import os
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("BENCH_KEEP"):
        print(f"keeping the run's files in {path} (BENCH_KEEP)", flush=True)
    else:
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def save_json(out_dir: Path | None, name: str, data: Any) -> Path | None:
    """Writes ``data`` as ``out_dir/name`` (a benchmark's --out; nothing when None)."""
    if out_dir is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
    return path
