"""Benchmarks a .mar that uses ts_microbatch on a corpus of your bodies, through TorchServe.

    ts-microbatch-benchmark --mar my_model.mar --corpus my_texts/ \\
        --variant arrival='{"order": "arrival"}' --rounds 3 --out runs/my_model

(``python -m ts_microbatch.tools.benchmark``, or in a checkout ``python
benchmarks/benchmark-ab.py --mar ...``, take the same arguments.) Variants are the .mar
repackaged by ts_microbatch.tools.mar (only the micro-batching section and the frontend's
batchSize/maxBatchDelay change): ``ours`` as packaged, ``plain`` with ``{"enabled": false}``
(the handler's preprocess, inference and postprocess on the whole batch, as
BaseHandler.handle), each ``--variant NAME=JSON`` and each ``--handler-variant``. Each round
serves every variant once, in an order shuffled from a seed (printed, recorded, --seed),
each on a fresh TorchServe, with the corpus sent by ts_microbatch.tools.drive (parallel
clients, each request the next body of the corpus's fixed order). Each run's CPU per
request, the frontend's and the worker's, is in the tables; a variant whose CPU per
request moved by more than a quarter between rounds is warned about (the machine changed,
not the variant). Results are the median round per variant and per-round ratios against
the baseline: results.jsonl (each run as it came), results.json, results.csv, runs.csv,
comparisons.json, metrics/, samples/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ._cli import SAFE_BESIDE, prog
from .benchmark_report import load_tag as load_tag
from .benchmark_report import report
from .corpus import Corpus, CorpusError, read_corpus
from .curves import CurveSender, parse_rates
from .drive import send_corpus
from .intervals import MIN_ANSWERS
from .mar import MarError, override_mar, read_entries, settings_of
from .measure import RegistrationError, Send, measure
from .results import ResultsLog, claimed_dir
from .rounds import CPU_SIDES, cpu_drift, new_seed, round_order
from .variants import (
    BASELINE,
    handlers_of,
    parse_handler_variant,
    parse_variant,
    split_frontend,
    variants_of,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("your own .mar")
    group.add_argument("--mar", type=Path, help="a .mar (or model directory) using ts_microbatch")
    bodies = group.add_mutually_exclusive_group()
    bodies.add_argument("--corpus", type=Path, help="a directory of bodies or a .jsonl file")
    bodies.add_argument("--body", type=Path, help="one request body")
    group.add_argument(
        "--variant",
        action="append",
        default=[],
        type=parse_variant,
        metavar="NAME=JSON",
        help="also serve the .mar with this override of its micro_batching section "
        """(e.g. arrival='{"order": "arrival"}'); repeatable""",
    )
    group.add_argument(
        "--handler-variant",
        action="append",
        default=[],
        type=parse_handler_variant,
        metavar="NAME=HANDLER.py[:JSON]",
        help="also serve the .mar with this handler file swapped in (the old one stays "
        "beside it, so it can subclass it) and, after a colon, this override; repeatable",
    )
    group.add_argument(
        "--baseline-handler",
        type=Path,
        metavar="HANDLER.py",
        help='serve the "plain" baseline with this handler file swapped in (e.g. one that '
        "also counts its padded tokens)",
    )
    group.add_argument(
        "--no-baseline", action="store_true", help='skip the "plain" (enabled: false) variant'
    )
    group.add_argument("--batch-size", type=int, help="default: the .mar's batchSize, else 32")
    group.add_argument("--max-batch-delay", type=int, help="ms; default: the .mar's, else 50")
    group.add_argument("--concurrency", type=int, help="parallel clients (default 2 x batch)")
    group.add_argument("--requests", type=int, default=1000, help="measured per run")
    group.add_argument("--warmup-requests", type=int, default=200)
    group.add_argument(
        "--rounds", type=int, default=3, help="rounds; each serves every variant once"
    )
    group.add_argument(
        "--seed",
        type=int,
        help="the seed of each round's shuffled order (default: a new one, printed and "
        "recorded in results.json; give it to repeat a run's orders)",
    )
    group.add_argument("--response-timeout", type=int, default=120, help="seconds")
    curve = parser.add_argument_group("latency against offered load (open loop)")
    curve.add_argument(
        "--rates",
        type=parse_rates,
        help="offer these request rates, Poisson, open loop, instead of parallel clients "
        "(20,40,80 or 20:200:20): per variant P50/P90/P99 against offered load, curves.md, "
        "curves.json and p99.png; a sweep stops one rate after the model fell behind",
    )
    curve.add_argument(
        "--rate-seconds", type=float, default=5.0, help="seconds of requests per rate"
    )
    curve.add_argument(
        "--min-answers",
        type=int,
        default=MIN_ANSWERS,
        help="requests per rate at least (default %(default)s: 15 answers above a P99)",
    )
    curve.add_argument(
        "--nice",
        type=int,
        help="the load generator's niceness (e.g. -10): it then takes CPU ahead of every "
        "TorchServe on the machine, a production one too (default: left alone)",
    )
    curve.add_argument(
        "--slo-p99-ms", type=float, help="report the highest rate each variant holds within it"
    )


def registered(point: dict[str, Any], frontend: dict[str, int] | None) -> dict[str, Any]:
    """``point`` with a variant's own batch size and window, as it is registered."""
    if not frontend:
        return point
    return {
        **point,
        "batch_size": frontend["batchSize"],
        "max_batch_delay": frontend["maxBatchDelay"],
    }


def curve_sender(args: argparse.Namespace, corpus: Corpus, concurrency: int) -> Send | None:
    """With ``--rates``: each run's load is an open-loop sweep over them (warm-up as usual)."""
    if not getattr(args, "rates", None):
        return None
    return CurveSender(
        corpus, args.rates, args.rate_seconds, concurrency, log, args.seed or 0,
        min_answers=args.min_answers, nice=args.nice,
    )  # fmt: skip


def frontend_of(args: argparse.Namespace, mar: Path) -> dict[str, int]:
    """batchSize and maxBatchDelay: the flags, else the .mar's model-config.yaml, else 32/50.
    Written into every variant's YAML and given to its registration: TorchServe 0.12 takes
    the registration's maxBatchDelay over the YAML's (a variant whose YAML said 5 ms ran at
    the 50 ms it was registered with)."""
    packaged = settings_of(read_entries(mar))["yaml"] or {}
    return {
        "batchSize": args.batch_size or int(packaged.get("batchSize", 32)),
        "maxBatchDelay": (
            args.max_batch_delay
            if args.max_batch_delay is not None
            else int(packaged.get("maxBatchDelay", 50))
        ),
    }


def shown(effective: dict[str, Any]) -> tuple[Any, str]:
    """micro_batch_size and threads (pre/inf/post) for the table; "off" when disabled."""
    if effective.get("enabled", True) is False:
        return "off", "-"
    parallelism = effective.get("parallelism") or {}
    stages = ("preprocess", "inference", "postprocess")
    return effective.get("micro_batch_size", 1), "/".join(
        str(parallelism.get(s, 1)) for s in stages
    )


def log(message: str) -> None:
    """A progress line with the time, for the command's output."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(args: argparse.Namespace, base_config: Path | None, runs: Path) -> int:
    """The benchmark of ``args`` (add_arguments' options, ``out`` and ``keep_logs``); each
    server from ``base_config`` (a config.properties; built-in settings when None). Results
    go to ``args.out``, else a new directory under ``runs``, made before the first run;
    each run is appended to its results.jsonl as it is measured. Returns the exit status."""
    try:
        corpus = read_corpus(args.corpus or args.body) if args.corpus or args.body else None
        if corpus is None:
            raise CorpusError("--mar needs --corpus DIR|FILE.jsonl or --body FILE")
        frontend = frontend_of(args, args.mar)
        out = Path(args.out or runs / time.strftime("%Y%m%d-%H%M%S")).resolve()
        results = ResultsLog(claimed_dir(out, "ts-microbatch-benchmark") / "results.jsonl")
    except (CorpusError, MarError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    variants = variants_of(args)
    handlers = handlers_of(args)
    concurrency = args.concurrency or 2 * frontend["batchSize"]
    store = out / "store"
    effective = {}
    served: dict[str, dict[str, int]] = {}  # each variant's batchSize and maxBatchDelay
    try:
        for name, override in variants:
            target = store / f"{name}.mar"
            handler = handlers.get(name)
            section, own_frontend = split_frontend(override)
            served[name] = {**frontend, **own_frontend}
            effective[name] = override_mar(args.mar, target, section, served[name], handler)
            shown_handler = f", handler {handler}" if handler else ""
            sizes = served[name]
            window = f"batchSize {sizes['batchSize']}, maxBatchDelay {sizes['maxBatchDelay']}"
            settings = json.dumps(effective[name])
            log(f"variant {name}: {window}, micro_batching {settings}{shown_handler}")
    except MarError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    log(f"body {corpus.label} ({corpus.source}); results in {out}")
    config = {
        "metrics_mode": "prometheus",
        "warmup_requests": args.warmup_requests,
        "response_timeout": args.response_timeout,
    }
    point = {
        "body": corpus.label,
        "batch_size": frontend["batchSize"],
        "max_batch_delay": frontend["maxBatchDelay"],
        "concurrency": concurrency,
        "requests": max(args.requests, concurrency),
        "workers": 1,
    }
    log(f"each run is appended to {results.path} as it is measured")
    if args.seed is None:
        args.seed = new_seed()
    log(f"each round serves the variants in an order shuffled with seed {args.seed} (--seed)")
    try:
        rows, refused = run_rounds(
            args.rounds,
            variants,
            effective,
            corpus,
            config,
            point,
            out,
            base_config,
            results,
            args.seed,
            curve_sender(args, corpus, point["concurrency"]),
            served,
        )
    except BaseException:
        log(f"stopped: the runs measured so far are in {results.path}")
        raise
    report(args, out, corpus, variants, effective, point, rows, refused, handlers, served)
    for scratch in ("store",) + (() if args.keep_logs else ("servers",)):
        shutil.rmtree(out / scratch, ignore_errors=True)
    return 0


def run_rounds(
    rounds: int,
    variants: list[tuple[str, dict[str, Any] | None]],
    effective: dict[str, dict[str, Any]],
    corpus: Corpus,
    config: dict[str, Any],
    point: dict[str, Any],
    out: Path,
    base_config: Path | None = None,
    results: ResultsLog | None = None,
    seed: int = 0,
    sender: Send | None = None,
    served: dict[str, dict[str, int]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every variant once per round, in an order shuffled from ``seed`` and the round
    (rounds.round_order); one row per run, with its CPU per request, each also appended to
    ``results`` as it comes. A variant whose CPU per request moves by more than a quarter
    between rounds is warned about at once (rounds.cpu_drift). A variant TorchServe will
    not register (a setting this ts_microbatch refuses) is reported and left out of the
    later rounds; the others go on. ``sender``: the load instead of parallel clients (the
    latency-load sweep of ``--rates``)."""

    def send(
        url: str, token: str | None, requests: int, work: Path, label: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        if sender is not None:
            return sender(url, token, requests, work, label)
        return send_corpus(
            url, corpus, requests, point["concurrency"], token=token, label=label, progress=log
        )

    first = corpus.bodies[corpus.order[0]]
    rows: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    overrides = dict(variants)
    warned: dict[str, list[str]] = {}
    for repeat in range(1, rounds + 1):
        order = round_order(list(overrides), repeat - 1, seed)
        log(f"round {repeat}/{rounds}: {', '.join(order)}")
        for step, name in enumerate(order, start=1):
            override = overrides[name]
            if name in refused:
                continue
            label = f"[round {repeat}/{rounds}, {step}/{len(variants)}] {name}"
            log(f"{label}: starting TorchServe")
            try:
                result = measure(
                    out / "servers" / f"{name}-r{repeat}",
                    out / "store",
                    f"mar-{name}",
                    config,
                    registered(point, (served or {}).get(name)),
                    label,
                    out / "metrics" / f"{name}-r{repeat}.prom",
                    send,
                    (first.data, first.content_type),
                    archive=f"{name}.mar",
                    base_config=base_config,
                )
            except RegistrationError as err:
                refused[name] = str(err)
                if results is not None:
                    results.append({"kind": "not_measured", "handler": name, "why": str(err)})
                hint = " (the baseline needs the 'enabled' key: --no-baseline skips it)"
                log(f"{label}: NOT MEASURED, {err}{hint if name == BASELINE else ''}")
                continue
            cpu = [result.get(k, float("nan")) for _, k in CPU_SIDES]
            log(
                f"{label}: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']:.0f} ms, "
                f"CPU/req {cpu[0]:.2f} + {cpu[1]:.2f} ms, "
                f"{result['errors']} errors {result.get('statuses', '')}"
            )
            micro_batch_size, parallelism = shown(effective[name])
            rows.append(
                {
                    "scenario": "mar",
                    "handler": name,
                    **point,
                    "micro_batch_size": micro_batch_size,
                    "parallelism": parallelism,
                    "micro_batching": effective[name],
                    "override": override,
                    "repeat": repeat,
                    "position": step,
                    **result,
                }
            )
            if results is not None:
                results.append({"kind": "run", **rows[-1]})
            drift = cpu_drift([r for r in rows if r["handler"] == name])
            if drift != warned.get(name, []):
                for warning in drift:
                    log(f"WARNING {warning}")
                warned[name] = drift
    return rows, refused


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog("ts_microbatch.tools.benchmark"),
        description=__doc__.split("\n\n")[0],
        epilog=SAFE_BESIDE,
    )
    parser.add_argument("--out", type=Path, help="result directory (default runs/<time>)")
    parser.add_argument(
        "--ts-config",
        type=Path,
        help="a config.properties every server starts from (addresses and model store are "
        "set here); its metrics_config should declare the pipeline's metrics for the per-stage "
        "columns. Default: built-in settings, Prometheus metrics",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep each server's logs in servers/"
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mar is None:
        parser.error("--mar is required")
    return run(args, args.ts_config, Path("runs"))


if __name__ == "__main__":
    sys.exit(main())
