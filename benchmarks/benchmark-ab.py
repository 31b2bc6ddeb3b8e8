#!/usr/bin/env python3
"""Benchmarks TorchServe handlers side by side with apache bench, on this machine, in one run.

    python benchmarks/benchmark-ab.py --config benchmarks/config.json [--out benchmarks/runs/NAME]

For each scenario (real ResNet-18 on the CPU; or the accelerator stand-in, a SIMULATED
device whose forward costs a + b*n ms of wall time and no CPU) and each sweep point (lists
in the config are swept), every handler (plain ImageClassifier, upstream MicroBatching,
ours) is packaged, registered on a fresh TorchServe on loopback, warmed up, and driven by
`ab`. Next to each result: the ideal throughput its stage costs imply and the efficiency.
Writes results.json, results.csv and, for batch-size sweeps, PNG plots.

    python benchmarks/benchmark-ab.py --mar PATH.mar --corpus DIR|FILE.jsonl [--variant NAME=JSON]

benchmarks a user's own .mar instead: as packaged ("ours"), against the same .mar with
micro-batching turned off ("plain"), and any named overrides. That mode is the package's
``ts-microbatch-benchmark`` (ts_microbatch.tools.benchmark), run here with the project's
configs/config.properties.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "examples/image_classifier")]

import ab  # noqa: E402
import bench_lib  # noqa: E402
import corpus  # noqa: E402
from bench_lib import log  # noqa: E402
from bench_limits import ideal_for, stage_limits  # noqa: E402
from bench_packaging import package  # noqa: E402

from ts_microbatch.tools import benchmark, runs  # noqa: E402
from ts_microbatch.tools._cli import SAFE_BESIDE  # noqa: E402
from ts_microbatch.tools.corpus import content_type_of  # noqa: E402
from ts_microbatch.tools.measure import Send, measure  # noqa: E402
from ts_microbatch.tools.results import OutputError, claimed_dir  # noqa: E402
from ts_microbatch.tools.scrape import format_summary  # noqa: E402

PROPERTIES = ROOT / "configs/config.properties"  # every server's, and its metrics.yaml

# -- one measurement -----------------------------------------------------------------------


def run_bodies(
    url: str,
    sends: list[tuple[Path, str, int, int]],
    token: str | None,
    work: Path,
    label: str,
) -> tuple[dict[str, float], dict[str, float]]:
    """One `ab` per (body, content type, requests, clients), all at once; throughput over
    the longest, percentiles over every request's time (`ab -g`), so a single body and a
    mix are measured the same way."""
    running = []
    for i, (body, content_type, requests, clients) in enumerate(sends):
        tsv = work / f"ab-{i}.tsv"
        name = f"{label} {body.stem}" if len(sends) > 1 else label
        wait = ab.start_ab(
            url,
            body,
            requests,
            clients,
            token=token,
            output=["-g", str(tsv)],
            content_type=content_type,
            label=name,
            progress=log,
        )
        running.append((wait, tsv))
    summaries = [ab.parse_ab(wait()) for wait, _ in running]
    ttimes = [t for _, tsv in running for t in ab.parse_gnuplot(tsv.read_text())]
    return ab.merge_ab(summaries, ttimes)


def drive(
    point: dict[str, Any],
    url: str,
    paths: dict[str, Path],
    requests: int,
    token: str | None,
    work: Path,
    label: str,
) -> tuple[dict[str, float], dict[str, float]]:
    """ab at the point's concurrency with its body, or with the corpus mix: each body of
    corpus.MIX with its share of the clients and of the requests."""
    shares = corpus.MIX if point["body"] == "mix" else {point["body"]: 1.0}
    clients = corpus.split(point["concurrency"], shares)
    counts = corpus.split(requests, shares)
    sends = []
    for name, share in clients.items():
        path = paths[name]
        sends.append((path, content_type_of(path), max(counts[name], share), share))
    return run_bodies(url, sends, token, work, label)


def image_sender(point: dict[str, Any], paths: dict[str, Path]) -> tuple[Send, tuple[bytes, str]]:
    """How a point's body (or the mix) is sent, and the body its sample responses use."""

    def send(
        url: str, token: str | None, requests: int, work: Path, label: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        return drive(point, url, paths, requests, token, work, label)

    sample = paths["1080p" if point["body"] == "mix" else point["body"]]
    return send, (sample.read_bytes(), content_type_of(sample))


def handlers_for(scenario: str, point: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """The runs at one point: the noop server-cost run first (unless turned off), then each
    handler. A user's .mar runs alone; upstream has no "auto"."""
    if scenario == "mar":
        return ["mar"]
    handlers = list(config["handlers"])
    if point["micro_batch_size"] == "auto":
        handlers = [h for h in handlers if h != "upstream"]
    return (["noop"] if config["server_overhead"] else []) + handlers


# -- main ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=SAFE_BESIDE)
    parser.add_argument("--config", default=str(HERE / "config.json"))
    parser.add_argument(
        "--out", default=None, help="result directory (default benchmarks/runs/<time>)"
    )
    parser.add_argument(
        "--weights", default=None, help="torchvision resnet18-f37072fd.pth for the real scenario"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep each server's logs in servers/"
    )
    parser.add_argument(
        "--ts-config",
        type=Path,
        default=PROPERTIES,
        help="a config.properties every server starts from; it keeps its settings but the "
        "addresses, worker ports and model store (default: configs/config.properties)",
    )
    parser.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="DIR",
        help="only write the first scenario's model with our handler, at the first point, as "
        "a model directory DIR (for python -m ts_microbatch.tools.tune --mar DIR), and exit",
    )
    benchmark.add_arguments(parser)
    args = parser.parse_args()
    if args.mar:
        return benchmark.run(args, args.ts_config, HERE / "runs")
    if ab.ab_problem():
        print(f"error: {ab.ab_problem()}", file=sys.stderr)
        return 2
    try:
        config = bench_lib.load_config(args.config)
    except bench_lib.BenchConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.export:
        target = args.export.resolve()
        if target.exists():  # torch-model-archiver --force would replace it whole
            print(f"error: --export {target} exists: give a new path", file=sys.stderr)
            return 2
        scenario, point = config["scenarios"][0], bench_lib.sweep_points(config)[0]
        with tempfile.TemporaryDirectory() as work:
            package(target.parent, Path(work), target.name, scenario, "ours", config, point, None)
        log(f"wrote the {scenario} model with our handler to {target}")
        return 0
    out = Path(args.out or HERE / "runs" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    try:  # store/, work/, bodies/ and servers/ in it are deleted at the end
        claimed_dir(out, "benchmarks/benchmark-ab.py")
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if config.get("input"):  # the user's body, named after its file
        paths = {Path(config["input"]).name: Path(config["input"])}
    else:
        paths = corpus.write(out / "bodies")
    for point_body in sorted({p["body"] for p in bench_lib.sweep_points(config)}):
        shown = corpus.MIX if point_body == "mix" else paths[point_body]
        log(f"body {point_body}: {shown}")
    log(f"results in {out}")
    measured = run_all(config, out, paths, args.weights, args.ts_config)
    runs.write_csv(measured, out / "runs.csv")
    rows = runs.medians(measured, bench_lib.point_tag)
    runs.write_csv(rows, out / "results.csv")
    for scenario in config["scenarios"]:
        scenario_rows = [r for r in rows if r["scenario"] == scenario]
        for x_key in bench_lib.SWEEP_KEYS:
            png = out / f"{x_key}_{scenario}.png"
            if bench_lib.plot_sweep(scenario_rows, png, f"{scenario} scenario", x_key):
                log(f"wrote {png}")
    png = out / "bodies.png"
    if bench_lib.plot_bodies(rows, png, "medians by request body"):
        log(f"wrote {png}")
    print("\n" + runs.format_table(rows))
    comparisons = runs.compare_rounds(measured, bench_lib.COMPARISONS, bench_lib.point_tag)
    if comparisons:
        (out / "comparisons.json").write_text(json.dumps(comparisons, indent=2) + "\n")
        print("\n" + runs.format_comparisons(comparisons))
    for scratch in ("store", "work", "bodies") + (() if args.keep_logs else ("servers",)):
        shutil.rmtree(out / scratch, ignore_errors=True)
    return 0


def run_all(
    config: dict[str, Any],
    out: Path,
    paths: dict[str, Path],
    weights: str | None,
    base_config: Path = PROPERTIES,
) -> list[dict[str, Any]]:
    """Every scenario, point and handler, ``repeats`` times round-robin (so slow phases of a
    shared machine hit every config alike); one row per run. results.json is rewritten
    after each point with the runs so far and their medians."""
    points = bench_lib.sweep_points(config)
    plan = [
        (repeat, scenario, point, handler)
        for repeat in range(1, config["repeats"] + 1)
        for scenario in config["scenarios"]
        for point in points
        for handler in handlers_for(scenario, point, config)
    ]
    rows: list[dict[str, Any]] = []
    cache: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    for step, (repeat, scenario, point, handler) in enumerate(plan, start=1):
        limits = stage_limits(scenario, point, config, paths, cache, log)
        name = f"{scenario}-{handler}-{bench_lib.point_tag(point)}"
        shown = {k: v for k, v in point.items() if k != "micro_batching"}
        label = f"[{step}/{len(plan)}] {scenario} {handler} {shown}"
        log(f"{label}: packaging and starting TorchServe")
        work = out / "work" / scenario
        package(out / "store", work, name, scenario, handler, config, point, weights)
        send, sample = image_sender(point, paths)
        result = measure(
            out / "servers" / f"{name}-r{repeat}",
            out / "store",
            name,
            config,
            point,
            label,
            out / "metrics" / f"{name}-r{repeat}.prom",
            send,
            sample,
            base_config=base_config,
        )
        log(
            f"{label}: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']:.0f} ms, "
            f"{result['errors']} errors"
        )
        if "pipeline" in result and result["pipeline"]["micro_batches"]:
            log(f"  /metrics: {format_summary(result['pipeline'])}")
        results[handler] = result
        if step < len(plan) and plan[step][:3] == (repeat, scenario, point):
            continue  # more handlers at this point
        overhead = results.pop("noop", {}).get("requests_per_s")
        for run_handler, run in results.items():
            ideal = (
                ideal_for(scenario, run_handler, limits, overhead) if limits and overhead else None
            )
            rows.append(
                {
                    "scenario": scenario,
                    "handler": run_handler,
                    **point,
                    "repeat": repeat,
                    **run,
                    "server_overhead_requests_per_s": overhead,
                    "stage_limits": limits,
                    "ideal_requests_per_s": ideal,
                    "efficiency": run["requests_per_s"] / ideal if ideal else None,
                }
            )
        results = {}
        (out / "results.json").write_text(
            json.dumps(
                {
                    "machine": runs.machine_info(),
                    "config": config,
                    "stage_limits": cache,
                    "results": runs.medians(rows, bench_lib.point_tag),
                    "runs": rows,
                },
                indent=2,
                default=str,
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
