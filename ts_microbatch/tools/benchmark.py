"""Benchmarks a .mar that uses ts_microbatch on a corpus of your bodies, through TorchServe.

    ts-microbatch-benchmark --mar my_model.mar --corpus my_texts/ \\
        --variant arrival='{"order": "arrival"}' --rounds 3 --out runs/my_model

Variants: ``ours`` as packaged, ``plain`` with ``{"enabled": false}`` (the handler's own
stages on the whole batch) at torch's default intra-op threads and ``plain1`` at one (every
ratio given to both), each ``--variant`` and ``--handler-variant``. Each round serves
every variant once on a fresh TorchServe, in an order shuffled from a recorded seed; the
rows, medians, ratios and files are ts_microbatch.tools.runs'.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ._cli import SAFE_BESIDE, counts, positive, prog, start_tool
from .corpus import Corpus, CorpusError, read_corpus
from .curves import FLOOR_HELP, CurveSender, floor_count, parse_rates
from .intervals import MIN_ANSWERS
from .ledger import SETTLE_S, format_settled
from .mar import (
    AS_PACKAGED,
    BASELINE,
    BASELINE_ONE,
    FRONTEND_KEYS,
    PLAIN_OVERRIDE,
    VARIANT_ENV,
    MarError,
    override_mar,
    split_frontend,
)
from .mar import frontend_of as packaged_frontend
from .measure import RegistrationError, Send, corpus_sender, measure
from .results import ResultsLog, claimed_dir
from .runs import CPU_SIDES, cpu_drift, intra_op_threads, new_seed, report, round_order, shown

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME=JSON``: a variant's name and its override of the micro_batching section."""
    name, sep, raw = text.partition("=")
    if not sep or not _NAME.match(name) or name in (BASELINE, BASELINE_ONE, AS_PACKAGED):
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected NAME=JSON with NAME of letters, digits, - and _ "
            f"(not {BASELINE!r}, {BASELINE_ONE!r} or {AS_PACKAGED!r})"
        )
    try:
        override = json.loads(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: not JSON: {exc}") from None
    if not isinstance(override, dict):
        raise argparse.ArgumentTypeError(f"{name}: got {raw!r}, expected a JSON object")
    for key, least in FRONTEND_KEYS.items():
        value = override.get(key, least)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise argparse.ArgumentTypeError(
                f"{name}: {key}: got {value!r}, expected an integer >= {least}"
            )
    return name, override


def parse_handler_variant(text: str) -> tuple[str, dict[str, Any], Path]:
    """``NAME=HANDLER.py[:JSON]``: a variant's name, its override ({} without one) and the
    handler file it swaps in."""
    name, sep, rest = text.partition("=")
    path, dot_py, raw = rest.partition(".py")
    if not sep or not dot_py or (raw and not raw.startswith(":")):
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected NAME=HANDLER.py or NAME=HANDLER.py:JSON"
        )
    name, override = parse_variant(f"{name}={raw[1:] or '{}'}")
    return name, override, Path(path + dot_py)


def variants_of(args: argparse.Namespace) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, override) in the order each round serves them; None: as packaged."""
    variants: list[tuple[str, dict[str, Any] | None]] = []
    if not args.no_baseline:  # both thread settings: either may be the better baseline
        variants += [(BASELINE, PLAIN_OVERRIDE), (BASELINE_ONE, PLAIN_OVERRIDE)]
    variants.append((AS_PACKAGED, None))
    for name, override, *_ in [*args.variant, *args.handler_variant]:
        if name in dict(variants):
            raise SystemExit(f"error: --variant {name} given twice")
        variants.append((name, override))
    return variants


def handlers_of(args: argparse.Namespace) -> dict[str, Path]:
    """The handler file each variant swaps in; a variant not named keeps the .mar's."""
    handlers = {name: path for name, _, path in args.handler_variant}
    if args.baseline_handler is not None:
        handlers[BASELINE] = handlers[BASELINE_ONE] = args.baseline_handler
    return handlers


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
        help="also serve the .mar with this handler swapped in (the old one stays, to be "
        "subclassed) and, after a colon, this override; repeatable",
    )
    group.add_argument(
        "--baseline-handler",
        type=Path,
        metavar="HANDLER.py",
        help='serve the "plain" baseline with this handler file swapped in (e.g. one that '
        "also counts its padded tokens)",
    )
    what = 'skip the baselines: "plain" at torch\'s default intra-op threads, "plain1" at one'
    group.add_argument("--no-baseline", action="store_true", help=what)
    group.add_argument("--batch-size", type=int, help="default: the .mar's batchSize, else 32")
    group.add_argument("--max-batch-delay", type=int, help="ms; default: the .mar's, else 50")
    group.add_argument("--concurrency", type=int, help="parallel clients (default 2 x batch)")
    workers = "workers each variant gets (default: the .mar's minWorkers, else 1)"
    group.add_argument("--workers", type=positive, help=workers)
    group.add_argument("--requests", type=int, default=1000, help="measured per run")
    group.add_argument("--warmup-requests", type=int, default=200)
    settle = "warm at most this long until the frontend's JIT settles (0: no; ledger.py)"
    group.add_argument("--settle-s", type=float, default=SETTLE_S, help=settle)
    group.add_argument("--rounds", type=int, default=3, help="each serves every variant once")
    seed = "each round's shuffle seed (default: a new one, printed, in results.json)"
    group.add_argument("--seed", type=int, help=seed)
    group.add_argument("--response-timeout", type=int, default=120, help="seconds")
    curve = parser.add_argument_group("latency against offered load (open loop)")
    curve.add_argument(
        "--rates",
        type=parse_rates,
        help="offer these request rates, Poisson, open loop, instead of parallel clients "
        "(20,40,80 or 20:200:20): per variant P50/P90/P99 against offered load, curves.md and "
        "curves.json; a sweep stops one rate after the model fell behind",
    )
    curve.add_argument("--rate-seconds", type=float, default=5.0, help="seconds a rate")
    answers = "requests per rate at least (default %(default)s: 15 answers above a P99)"
    curve.add_argument("--min-answers", type=int, default=MIN_ANSWERS, help=answers)
    curve.add_argument("--floor-requests", type=counts, help=FLOOR_HELP)
    curve.add_argument(
        "--nice",
        type=int,
        help="the load generator's niceness (e.g. -10): it then takes CPU ahead of every "
        "TorchServe on the machine, a production one too (default: left alone)",
    )
    curve.add_argument("--slo-p99-ms", type=float, help="report the highest rate held within it")


def frontend_of(args: argparse.Namespace, mar: Path) -> dict[str, int]:
    """batchSize and maxBatchDelay: the flags, else the .mar's (``mar.frontend_of``).
    Each variant is also registered with them: TorchServe 0.12 takes the registration's
    maxBatchDelay over the YAML's."""
    return packaged_frontend(mar, args.batch_size, args.max_batch_delay)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(args: argparse.Namespace, base_config: Path | None, runs: Path) -> int:
    """The benchmark of ``args`` (add_arguments' options, ``out`` and ``keep_logs``), each
    server from ``base_config`` (None: built-in settings); results in ``args.out``, else a
    new directory under ``runs``. Returns the exit status."""
    try:
        if not (args.corpus or args.body):
            raise CorpusError("--mar needs --corpus DIR|FILE.jsonl or --body FILE")
        corpus = read_corpus(args.corpus or args.body)
        frontend = frontend_of(args, args.mar)
        out = Path(args.out or runs / time.strftime("%Y%m%d-%H%M%S")).resolve()
        results = ResultsLog(claimed_dir(out, "ts-microbatch-benchmark") / "results.jsonl")
        variants, handlers = variants_of(args), handlers_of(args)
        effective, served = package(args.mar, out / "store", frontend, variants, handlers)
    except (CorpusError, MarError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    log(f"body {corpus.label} ({corpus.source}); results in {out}")
    config, point = run_settings(args, corpus, frontend)
    log(f"each run is appended to {results.path} as it is measured")
    if args.seed is None:
        args.seed = new_seed()
    log(f"each round serves the variants in an order shuffled with seed {args.seed} (--seed)")
    sender = None
    if args.rates:  # an open-loop sweep instead of parallel clients
        sender = CurveSender(
            corpus, args.rates, args.rate_seconds, point["concurrency"], log, args.seed,
            min_answers=args.min_answers, nice=args.nice, floor_requests=floor_count(args),
        )  # fmt: skip
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
            sender,
            served,
        )
    except BaseException:
        log(f"stopped: the runs measured so far are in {results.path}")
        raise
    report(args, out, corpus, variants, effective, point, rows, refused, handlers, served)
    for scratch in ("store",) + (() if args.keep_logs else ("servers",)):
        shutil.rmtree(out / scratch, ignore_errors=True)
    return 0


def package(
    mar: Path,
    store: Path,
    frontend: dict[str, int],
    variants: list[tuple[str, dict[str, Any] | None]],
    handlers: dict[str, Path],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, int]]]:
    """Each variant's .mar written to ``store``: its effective micro_batching section, and
    the batchSize and maxBatchDelay it is served with (``frontend``, then its own)."""
    effective, served = {}, {}
    for name, override in variants:
        section, own_frontend = split_frontend(override)
        served[name] = sizes = {**frontend, **own_frontend}
        handler = handlers.get(name)
        effective[name] = override_mar(mar, store / f"{name}.mar", section, sizes, handler)
        log(
            f"variant {name}: batchSize {sizes['batchSize']}, maxBatchDelay "
            f"{sizes['maxBatchDelay']}, micro_batching {json.dumps(effective[name])}, "
            f"intra-op threads {intra_op_threads(effective[name], VARIANT_ENV.get(name))}"
            + (f", handler {handler}" if handler else "")
        )
    return effective, served


def registration(frontend: dict[str, int]) -> dict[str, int]:
    """model-config.yaml's batchSize and maxBatchDelay as ``measure``'s point has them."""
    return {"batch_size": frontend["batchSize"], "max_batch_delay": frontend["maxBatchDelay"]}


def run_settings(
    args: argparse.Namespace, corpus: Corpus, frontend: dict[str, int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``measure``'s config and point (the load every variant gets) for ``args``."""
    config = {k: getattr(args, k) for k in ("warmup_requests", "response_timeout", "settle_s")}
    concurrency = args.concurrency or 2 * frontend["batchSize"]
    point = {
        "body": corpus.label,
        **registration(frontend),
        "concurrency": concurrency,
        "requests": max(args.requests, concurrency),
        "workers": args.workers,
    }
    return config, point


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
    """Every variant once per round (runs.round_order), one row per run, each appended to
    ``results`` as it comes and a CPU drift warned about at once. A variant TorchServe
    will not register is reported and left out of the later rounds. ``sender``: the load
    instead of parallel clients (``--rates``)."""
    send = sender or corpus_sender(corpus, point["concurrency"], log)
    first = corpus.bodies[corpus.order[0]]
    rows: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    overrides = dict(variants)
    warned: dict[str, list[str]] = {}
    for repeat in range(1, rounds + 1):
        order = round_order(list(overrides), repeat - 1, seed)
        log(f"round {repeat}/{rounds}: {', '.join(order)}")
        for step, name in enumerate(order, start=1):
            if name in refused:
                continue
            label = f"[round {repeat}/{rounds}, {step}/{len(variants)}] {name}"
            log(f"{label}: starting TorchServe")
            own = (served or {}).get(name)  # its own batch size and window, if any
            registered = {**point, **registration(own)} if own else point
            try:
                result = measure(
                    out / "servers" / f"{name}-r{repeat}",
                    out / "store",
                    f"mar-{name}",
                    config,
                    registered,
                    label,
                    out / "metrics" / f"{name}-r{repeat}.prom",
                    send,
                    (first.data, first.content_type),
                    archive=f"{name}.mar",
                    base_config=base_config,
                    env=VARIANT_ENV.get(name),
                )
            except RegistrationError as err:
                refused[name] = str(err)
                if results is not None:
                    results.append({"kind": "not_measured", "handler": name, "why": str(err)})
                hint = " (the baseline needs the 'enabled' key: --no-baseline skips it)"
                baseline = name in (BASELINE, BASELINE_ONE)
                log(f"{label}: NOT MEASURED, {err}{hint if baseline else ''}")
                continue
            cpu = [result.get(k, float("nan")) for _, k in CPU_SIDES]
            log(
                f"{label}: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']:.0f} ms, "
                f"CPU/req {cpu[0]:.2f} + {cpu[1]:.2f} ms, "
                f"{result['errors']} errors {result.get('statuses', '')}"
                + format_settled(result.get("settled"))
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
                    "intra_op_threads": intra_op_threads(effective[name], VARIANT_ENV.get(name)),
                    "override": overrides[name],
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
    parser.add_argument("--keep-logs", action="store_true", help="keep servers/, their logs")
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mar is None:
        parser.error("--mar is required")
    with start_tool("ts_microbatch.tools.benchmark"):
        return run(args, args.ts_config, Path("runs"))


if __name__ == "__main__":
    sys.exit(main())
