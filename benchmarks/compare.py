#!/usr/bin/env python3
"""Commit against commit, and both against upstream, in one run: the gate for speed changes.

    make bench-compare BASE=5c92fd2      # the working tree against commit 5c92fd2
    python benchmarks/compare.py --base 5c92fd2 [--head COMMIT] [--rounds 3] [--out DIR]

Every change that can move speed (threads, locks, encodings, metrics, defaults) runs this
against the last landed commit before it lands. Both sides run in one TorchServe install in
one run: each side's ``ts_microbatch`` (from ``git archive``, or the working tree) is copied
into each of its model directories, which TorchServe puts on the worker's PYTHONPATH ahead
of the installed package, and each side's handler and configs come from the same tree.

The models, on each workload:

* ``upstream``: TorchServe's ImageClassifier under upstream's ``MicroBatching`` (0.12.0);
* ``<side>-same``: ImageClassifier itself behind the side's ``MicroBatchingMixin``: upstream's
  exact stages, so the ratio to ``upstream`` is the pipelines' alone (like for like);
* ``<side>-example``: the side's example handler with its ``configs/micro_batching.json`` and
  the example's ``handler:`` settings (``decoder: pil-draft``): what a user of it gets;
* ``plain`` (``--models``): ImageClassifier without micro-batching.

The workloads: ``idle``, the accelerator stand-in (a forward of 2 ms + 0.5 ms per image of
wall time) that computes nothing; ``compute``, the same plus a mean over its input on the
inference thread (torch work, as every model does); ``resnet18``, untrained ResNet-18 on the
CPU. The layouts: ``shared``, one server per workload with every model registered side by
side (a worker each, loaded one at a time); ``alone``, a server per model and round. Every
server runs TorchServe's default metrics config. Batch 32, max delay 50 ms, micro-batch 4,
threads 2/1/2 as the configs say, ``ab -k`` at concurrency 64 (32 for 12 MP photos).

Each round runs every model once, in an order shuffled from round to round
(ts_microbatch.tools.runs.round_order, seed 0, the first round as given), so the
machine's drift and a predecessor's leftovers fall on all alike;
ratios are taken within a round and their medians reported. Next to each: the CPU each
request cost the frontend and the worker (each of its threads, by the OS thread name: stage
threads are ``tsmb-<stage>-<i>``, their OpenMP workers inherit it; read by
ts_microbatch.tools.cpu, which ts-microbatch-benchmark uses too), their wake-ups, and the
machine's bound, the requests per second two cores allow at that CPU cost; and the CPU
ledger of every run (ts_microbatch.tools.ledger): the cores the frontend, the worker, ``ab``,
other processes, the hypervisor's steal and idleness took, summing to the machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "examples/image_classifier")]

import bench_lib  # noqa: E402
import corpus  # noqa: E402
import prepare  # noqa: E402
import yaml  # noqa: E402
from ab import AbError, parse_ab, parse_gnuplot  # noqa: E402

from ts_microbatch.tools.cpu import cpu_per_request, frontend_pid  # noqa: E402
from ts_microbatch.tools.intervals import percentile  # noqa: E402
from ts_microbatch.tools.ledger import MAIN_PARTS, format_ledger, ledger, read_ledger  # noqa: E402
from ts_microbatch.tools.ledger import summary as ledger_summary  # noqa: E402
from ts_microbatch.tools.runs import round_order  # noqa: E402

WORKTREE = "worktree"
# What a side needs from its tree: the package, the example handler, its configs.
SIDE_PATHS = ("ts_microbatch", "handlers", "configs", "examples/image_classifier")
WORKLOADS = ("idle", "compute", "resnet18")
LAYOUTS = ("shared", "alone")
MODELS = ("upstream", "base-same", "head-same", "base-example", "head-example")
ALL_MODELS = (*MODELS, "plain")
ACCELERATOR = {"fixed_ms": 2, "per_item_ms": 0.5}
FRONTEND = {"batch_size": 32, "max_batch_delay_ms": 50}
UPSTREAM_SETTINGS = {
    "micro_batch_size": 4,
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
}
MIXIN_HANDLER = '''"""ImageClassifier behind ts_microbatch's mixin: upstream's exact stages."""

from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import MicroBatchingMixin


class MixinImageClassifier(MicroBatchingMixin, ImageClassifier):
    pass
'''
# Pairs whose ratio the report gives: (numerator, denominator).
RATIOS = (
    ("head-same", "base-same"),
    ("head-example", "base-example"),
    ("head-same", "upstream"),
    ("base-same", "upstream"),
    ("head-example", "upstream"),
    ("base-example", "upstream"),
    # With --models ...,plain: TorchServe's image_classifier without micro-batching, which
    # micro-batching must never leave a user slower than.
    ("head-same", "plain"),
    ("head-example", "plain"),
    ("upstream", "plain"),
)
CORES = os.cpu_count() or 1
ALONE_WARMUP = 1000  # requests before a model alone on a fresh server is measured


# -- the two trees ------------------------------------------------------------------------


@dataclass
class Side:
    name: str  # base or head
    rev: str  # what was asked: a commit-ish or "worktree"
    commit: str  # the commit it is, with "+changes" for a working tree that differs from it
    tree: Path


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def checkout(name: str, rev: str, dest: Path) -> Side:
    """The tree of ``rev`` (or of the working tree) that a side needs, under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    if rev == WORKTREE:
        for path in SIDE_PATHS:
            shutil.copytree(
                ROOT / path, dest / path, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", *SIDE_PATHS]
        ).returncode
        commit = git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
        return Side(name, rev, commit, dest)
    commit = git("rev-parse", "--short", f"{rev}^{{commit}}")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, *SIDE_PATHS], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return Side(name, rev, commit, dest)


# -- packaging ----------------------------------------------------------------------------


def model_settings(side: Side, variant: str) -> dict[str, Any]:
    """The model-config.yaml of a side's model: the frontend's settings, the side's
    micro-batching config, and for the example its handler section."""
    micro_batching = json.loads((side.tree / "configs/micro_batching.json").read_text())
    settings: dict[str, Any] = {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": FRONTEND["batch_size"],
        "maxBatchDelay": FRONTEND["max_batch_delay_ms"],
        "responseTimeout": 120,
        "micro_batching": micro_batching,
    }
    if variant == "example":
        example = yaml.safe_load(
            (side.tree / "examples/image_classifier/model-config.yaml").read_text()
        )
        settings["handler"] = example.get("handler") or {}
    return settings


def package(store: Path, work: Path, model: str, workload: str, sides: dict[str, Side]) -> None:
    """``model`` on ``workload`` as a model directory ``store/<model>-<workload>``."""
    name = f"{model}-{workload}"
    build = work / name
    build.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    extra = [prepare.write_labels(str(build))]
    if workload == "resnet18":
        model_file = ROOT / "examples/image_classifier/model.py"
        weights = work / "resnet18.pth"
        if not weights.exists():
            shutil.copy(prepare.write_weights(str(build), None), weights)
    else:
        import torch

        model_file = HERE / "models/sim_accelerator.py"
        weights = work / "sim.pth"
        torch.save({"scale": torch.ones(1)}, weights)
        cost = build / "sim_accelerator.json"
        compute = "mean" if workload == "compute" else "none"
        cost.write_text(json.dumps({**ACCELERATOR, "compute": compute}))
        extra.append(str(cost))
    settings: dict[str, Any] = {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": FRONTEND["batch_size"],
        "maxBatchDelay": FRONTEND["max_batch_delay_ms"],
        "responseTimeout": 120,
    }
    if model == "plain":
        handler = "image_classifier"
    elif model == "upstream":
        handler = str(HERE / "handlers/upstream_mb_handler.py")
        settings["micro_batching"] = UPSTREAM_SETTINGS
    else:
        side_name, variant = model.split("-", 1)
        side = sides[side_name]
        settings = model_settings(side, variant)
        if variant == "example":
            handler = str(side.tree / "handlers/micro_batching_handler.py")
        else:
            handler = str(build / "mixin_image_classifier.py")
            Path(handler).write_text(MIXIN_HANDLER)
        vendor = build / "vendor"
        shutil.copytree(
            side.tree / "ts_microbatch",
            vendor / "ts_microbatch",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "tools"),
        )
        extra.append(str(vendor))
    config = build / "model-config.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    cmd = ["--force", "--model-name", name, "--version", "1.0"]
    cmd += ["--handler", handler, "--config-file", str(config), "--export-path", str(store)]
    cmd += ["--archive-format", "no-archive", "--model-file", str(model_file)]
    cmd += ["--serialized-file", str(weights), "--extra-files", ",".join(extra)]
    run_archiver(cmd)


# -- measuring ----------------------------------------------------------------------------


@dataclass
class Target:
    """One model registered on a server: what ab loads and whose CPU is read."""

    model: str
    url: str
    token: str | None
    worker_pids: list[int]
    frontend_pid: int


def register(
    server: Any,
    name: str,
    model: str,
    body: Path,
    content_type: str,
    frontend: int,
    **settings: Any,
) -> Target:
    """``name`` registered at FRONTEND's batch size and window (``settings``: the
    registration's own, such as ``initial_workers``), answering a first request."""
    asked = {
        "batch_size": FRONTEND["batch_size"],
        "max_batch_delay_ms": FRONTEND["max_batch_delay_ms"],
    }
    resp = server.register(name, **{**asked, **settings})
    if resp.status != 200:
        raise RuntimeError(f"register {name}: {resp.status} {resp.body!r}")
    name = str(settings.get("model_name", name))  # a .mar registered under a name of its own
    described = server.describe(name)
    target = Target(
        model,
        f"{server.inference_url}/predictions/{name}",
        server.token("inference"),
        [int(worker["pid"]) for worker in described["workers"]],
        frontend,
    )
    answer = server.predict(name, body.read_bytes(), content_type=content_type)
    if answer.status != 200:
        raise RuntimeError(f"{name}: a first request got {answer.status} {answer.body[:300]!r}")
    return target


def ab_run(
    target: Target, body: Path, content_type: str, requests: int, concurrency: int, work: Path
) -> dict[str, Any]:
    """``requests`` sent to ``target``: throughput, percentiles, CPU per request."""
    times = work / f"ab-{target.model}-{time.monotonic_ns()}.tsv"
    cmd = ["ab", "-k", "-n", str(requests), "-c", str(concurrency), "-p", str(body)]
    cmd += ["-T", content_type, "-s", "180", "-g", str(times)]
    if target.token:
        cmd += ["-H", f"Authorization: Bearer {target.token}"]
    before = read_ledger(target.frontend_pid, target.worker_pids)
    out = subprocess.run([*cmd, target.url], capture_output=True, text=True)
    after = read_ledger(target.frontend_pid, target.worker_pids)
    if out.returncode != 0:
        raise AbError(f"ab failed for {target.model}: {out.stderr[-500:]}")
    summary = parse_ab(out.stdout)
    done = summary["complete_requests"]
    errors = summary["failed_requests"] + summary["non_2xx_responses"]
    if errors or not done:
        raise RuntimeError(f"{target.model}: {errors:.0f} of {done:.0f} requests failed")
    latencies = parse_gnuplot(times.read_text())
    times.unlink()
    used = cpu_per_request(before.server, after.server, done)
    frontend_ms = used["frontend_cpu_ms_per_request"]
    per_request = used["worker_threads_ms_per_request"]
    worker_ms = sum(per_request.values())
    return {
        "requests": done,
        "requests_per_s": summary["requests_per_s"],
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "cpu_ms_per_request": {"frontend": frontend_ms, "worker": worker_ms},
        "worker_threads_ms_per_request": per_request,
        "worker_threads_wakeups_per_request": used["worker_threads_wakeups_per_request"],
        "ledger": ledger(before, after),
        # Two busy cores allow at most this many requests a second at this CPU cost.
        "bound_requests_per_s": 1000 * CORES / (frontend_ms + worker_ms),
    }


# -- the run ------------------------------------------------------------------------------


@dataclass
class Plan:
    sides: dict[str, Side]
    workloads: list[str]
    layouts: list[str]
    models: list[str]
    bodies: list[str]
    rounds: int
    requests: int
    resnet_requests: int
    store: Path
    work: Path
    results: list[dict[str, Any]] = field(default_factory=list)


def body_settings(body: str, requests: int) -> tuple[int, int]:
    """Concurrency and requests for a body: fewer clients and requests for 12 MP photos."""
    if body == "12mp":
        return 32, max(1, requests // 5)
    return 64, requests


def server_for(plan: Plan, label: str) -> Any:
    config = plan.work / "config.properties"
    if not config.exists():
        # The project's settings with TorchServe's own metrics config, as users start it.
        lines = (ROOT / "configs/config.properties").read_text().splitlines()
        keep = [ln for ln in lines if not ln.startswith(("metrics_config", "metrics_mode"))]
        config.write_text("\n".join(keep) + "\n")
    from ts_microbatch.tools.server import TorchServe

    return TorchServe(
        model_store=plan.store, workdir=plan.work / f"server-{label}", base_config=config
    )


def run_round(
    plan: Plan, layout: str, workload: str, body: str, round_no: int, targets: dict[str, Target]
) -> None:
    """One round: every model once, the order turned by ``round_no``."""
    path, content_type = bodies()[body]
    requests = plan.resnet_requests if workload == "resnet18" else plan.requests
    concurrency, requests = body_settings(body, requests)
    order = round_order(plan.models, round_no, first_as_given=True)
    for model in order:
        if layout == "alone":
            with server_for(plan, f"{model}-{workload}-{round_no}") as server:
                target = register(
                    server, f"{model}-{workload}", model, path, content_type, frontend_pid(server)
                )
                # A fresh frontend JIT-compiles its request path over the first thousand
                # requests or so (1.5 ms of frontend CPU a request at 200, 0.3 warm).
                warm_up(target, path, content_type, concurrency, min(ALONE_WARMUP, requests // 2))
                result = ab_run(target, path, content_type, requests, concurrency, plan.work)
        else:
            result = ab_run(targets[model], path, content_type, requests, concurrency, plan.work)
        result.update(layout=layout, workload=workload, body=body, round=round_no, model=model)
        plan.results.append(result)
        bench_lib.log(
            f"  {layout:6} {workload:8} {body:5} round {round_no + 1} {model:13} "
            f"{result['requests_per_s']:7.1f} req/s  P99 {result['p99_ms']:7.0f} ms  "
            f"CPU/req {result['cpu_ms_per_request']['frontend']:.2f} + "
            f"{result['cpu_ms_per_request']['worker']:.2f} ms; {format_ledger(result['ledger'])}"
        )


def warm_up(
    target: Target, body: Path, content_type: str, concurrency: int, requests: int = 200
) -> None:
    ab_run(
        target, body, content_type, requests, concurrency, Path(os.environ.get("TMPDIR", "/tmp"))
    )


_BODIES: dict[str, tuple[Path, str]] = {}


def bodies() -> dict[str, tuple[Path, str]]:
    return _BODIES


def write_bodies(work: Path, names: list[str]) -> None:
    for name in names:
        made = corpus.bodies()[name]
        path = work / f"body-{name}"
        path.write_bytes(made.data)
        _BODIES[name] = (path, made.content_type)


def run(plan: Plan) -> None:
    for workload in plan.workloads:
        for model in plan.models:
            package(plan.store, plan.work / "build", model, workload, plan.sides)
        for layout in plan.layouts:
            for body in plan.bodies:
                if layout == "alone":
                    for round_no in range(plan.rounds):
                        run_round(plan, layout, workload, body, round_no, {})
                    continue
                with server_for(plan, f"shared-{workload}-{body}") as server:
                    pass  # started by the context manager
                    path, content_type = bodies()[body]
                    concurrency, _ = body_settings(body, plan.requests)
                    targets, frontend = {}, frontend_pid(server)
                    for model in plan.models:
                        targets[model] = register(
                            server, f"{model}-{workload}", model, path, content_type, frontend
                        )
                        warm_up(targets[model], path, content_type, concurrency)
                    for round_no in range(plan.rounds):
                        run_round(plan, layout, workload, body, round_no, targets)


# -- the report ---------------------------------------------------------------------------


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each layout, workload and body, each pair of RATIOS: throughput and P99 ratio per
    round, and their medians."""
    groups: dict[tuple[str, str, str], dict[int, dict[str, dict[str, Any]]]] = {}
    for r in results:
        key = (r["layout"], r["workload"], r["body"])
        groups.setdefault(key, {}).setdefault(r["round"], {})[r["model"]] = r
    rows = []
    for (layout, workload, body), rounds in groups.items():
        for num, den in RATIOS:
            both = [m for m in rounds.values() if num in m and den in m]
            if not both:
                continue
            throughput = [m[num]["requests_per_s"] / m[den]["requests_per_s"] for m in both]
            p99 = [m[num]["p99_ms"] / m[den]["p99_ms"] for m in both]
            rows.append(
                {
                    "layout": layout,
                    "workload": workload,
                    "body": body,
                    "ratio": f"{num} / {den}",
                    "throughput": throughput,
                    "p99": p99,
                    "throughput_median": statistics.median(throughput),
                    "p99_median": statistics.median(p99),
                }
            )
    return rows


def model_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each model's medians over its rounds, per layout, workload and body."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["layout"], r["workload"], r["body"], r["model"]), []).append(r)
    rows = []
    for (layout, workload, body, model), runs in groups.items():
        threads: dict[str, list[float]] = {}
        wakeups: dict[str, list[float]] = {}
        for run_ in runs:
            for group, ms in run_["worker_threads_ms_per_request"].items():
                threads.setdefault(group, []).append(ms)
            for group, n in run_.get("worker_threads_wakeups_per_request", {}).items():
                wakeups.setdefault(group, []).append(n)
        rows.append(
            {
                "layout": layout,
                "workload": workload,
                "body": body,
                "model": model,
                "requests_per_s": statistics.median(r["requests_per_s"] for r in runs),
                "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                "frontend_ms": statistics.median(r["cpu_ms_per_request"]["frontend"] for r in runs),
                "worker_ms": statistics.median(r["cpu_ms_per_request"]["worker"] for r in runs),
                "threads_ms": {g: statistics.median(v) for g, v in sorted(threads.items())},
                "threads_wakeups": {g: statistics.median(v) for g, v in sorted(wakeups.items())},
                "bound_requests_per_s": statistics.median(r["bound_requests_per_s"] for r in runs),
                "ledger": ledger_medians(runs),
            }
        )
    return rows


def ledger_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each of the ledger's main parts (cores), its share accounted for, the median over
    runs; empty for results that have no ledger (older results.json)."""
    entries = [r["ledger"] for r in runs if r.get("ledger")]
    if not entries:
        return {}
    folded = [ledger_summary(e) for e in entries]
    medians = {part: statistics.median(f[part] for f in folded) for part in MAIN_PARTS}
    medians["accounted"] = statistics.median(e["accounted"] for e in entries)
    medians["cores"] = max(e["cores"] for e in entries)  # the ledger's own, not os.cpu_count
    return medians


def ledger_table(rows: list[dict[str, Any]]) -> list[str]:
    """The ledger of each model's runs: where the machine's cores went (medians), and the
    share of what a client elsewhere would leave the server that it used."""
    lines = [
        "",
        "Where the cores went (the CPU ledger, ts_microbatch.tools.ledger; cores, "
        "medians over rounds; `ab` is the load generator; 'served' is frontend + worker "
        "over the cores ab left them):",
        "",
        "| layout | workload | body | model | frontend | worker | ab | others | steal | idle "
        "| accounted | served |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cores = row["ledger"]
        if not cores:
            continue
        left = cores["cores"] - cores["generator"]
        served = (cores["frontend"] + cores["worker"]) / left if left > 0 else float("nan")
        lines.append(
            f"| {row['layout']} | {row['workload']} | {row['body']} | {row['model']} | "
            + " | ".join(f"{cores[p]:.2f}" for p in MAIN_PARTS)
            + f" | {cores['accounted']:.0%} | {served:.0%} |"
        )
    return lines


def report(plan_info: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [
        f"# {plan_info['head']} against {plan_info['base']} and upstream",
        "",
        f"{plan_info['rounds']} interleaved rounds, medians; {plan_info['machine']}.",
        "",
        "| layout | workload | body | ratio | throughput per round | median | P99 per round "
        "| median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in ratios(results):
        tp = ", ".join(f"{x:.2f}" for x in row["throughput"])
        p99 = ", ".join(f"{x:.2f}" for x in row["p99"])
        lines.append(
            f"| {row['layout']} | {row['workload']} | {row['body']} | {row['ratio']} | {tp} | "
            f"**{row['throughput_median']:.3f}x** | {p99} | {row['p99_median']:.2f}x |"
        )
    lines += [
        "",
        "| layout | workload | body | model | req/s | P99 ms | CPU ms/req frontend + worker "
        "| worker threads: CPU ms (wake-ups) per request | bound req/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = model_rows(results)
    for row in rows:
        wakeups = row["threads_wakeups"]
        threads = ", ".join(
            f"{g} {ms:.2f}" + (f" ({wakeups[g]:.1f})" if g in wakeups else "")
            for g, ms in row["threads_ms"].items()
        )
        lines.append(
            f"| {row['layout']} | {row['workload']} | {row['body']} | {row['model']} | "
            f"{row['requests_per_s']:.1f} | {row['p99_ms']:.0f} | {row['frontend_ms']:.2f} + "
            f"{row['worker_ms']:.2f} | {threads} | {row['bound_requests_per_s']:.0f} |"
        )
    lines += ledger_table(rows)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--head", default=WORKTREE, help="a commit; the working tree by default")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(ALL_MODELS)}")
    parser.add_argument("--bodies", default="720px", help="720px, 12mp (corpus names)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000, help="per model and round")
    parser.add_argument("--resnet-requests", type=int, default=400, help="the same on resnet18")
    parser.add_argument("--out", type=Path, help="where results.json and report.md go")
    args = parser.parse_args()
    chosen = {
        "workloads": (args.workloads.split(","), WORKLOADS),
        "layouts": (args.layouts.split(","), LAYOUTS),
        "models": (args.models.split(","), ALL_MODELS),
    }
    for key, (values, allowed) in chosen.items():
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            parser.error(f"--{key}: unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
    if shutil.which("ab") is None:
        parser.error("`ab` not found: apt-get install apache2-utils (make ab does it)")
    work = bench_lib.scratch_dir("ts-microbatch-compare-")
    sides = {
        "base": checkout("base", args.base, work / "base"),
        "head": checkout("head", args.head, work / "head"),
    }
    write_bodies(work, args.bodies.split(","))
    plan = Plan(
        sides,
        chosen["workloads"][0],
        chosen["layouts"][0],
        chosen["models"][0],
        args.bodies.split(","),
        args.rounds,
        args.requests,
        args.resnet_requests,
        work / "store",
        work,
    )
    info = {
        "base": sides["base"].commit,
        "head": sides["head"].commit,
        "rounds": args.rounds,
        "requests": args.requests,
        "resnet_requests": args.resnet_requests,
        "machine": f"{CORES} cores",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    bench_lib.log(f"comparing head {info['head']} with base {info['base']} in {work}")
    try:
        run(plan)
    finally:
        text = report(info, plan.results)
        print(text)
        bench_lib.save_json(args.out, "results.json", {"plan": info, "results": plan.results})
        if args.out is not None:
            (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
