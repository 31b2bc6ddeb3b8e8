"""Finds the micro-batching config that serves a model fastest, in-process.

    python -m ts_microbatch.tools.tune --mar model_store/resnet-18_mb.mar --input kitten.jpg \\
        --batch-size 32 --micro-batch-sizes 1,2,4,8,16 --threads 1,2 --out micro_batching.json

The .mar's handler (it must use ts_microbatch) is loaded in-process (ts_microbatch.tools.
inprocess) and full batches of ``--input``, or of ``--corpus`` in its fixed order, run
through every combination of micro_batch_size, stage threads and, with ``order: length``,
token budgets (``--budgets``). The ranking is printed and the best merged into ``--out``
(ts_microbatch.tools.merge: other keys kept, a backup first). ``--confirm K`` serves the
K best on a real TorchServe (ts_microbatch.tools.confirm) and writes the one it measures
fastest: in-process runs leave out the frontend, which shares the cores. ``--slo-p99-ms``
tunes for a latency objective instead (ts_microbatch.tools.slo).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.config import MicroBatchingConfig, load_config
from ..torchserve.micro_batching import MicroBatching
from . import slo
from ._cli import SAFE_BESIDE, prog
from .confirm import Load, measure_configs
from .corpus import Body, Corpus
from .inprocess import (
    load_handler,
    make_context,
    measure_with_cpu,
    model_dir_of,
    threads_of,
    tuning_corpus,
)
from .merge import MergeError, read_existing, write_merged
from .results import OutputError, ResultsLog, claimed_dir, output_file
from .server import java_problem

# The micro_batching keys this tuner chooses; merged into an existing --out, the others stay.
TUNED_KEYS = ("micro_batch_size", "parallelism", "max_micro_batch_tokens")


@dataclass(frozen=True)
class Trial:
    """One combination measured in-process."""

    micro_batch_size: int
    parallelism: dict[str, int]
    requests_per_s: float
    batch_ms: float
    max_micro_batch_tokens: int | None = None

    def as_config(self, base: MicroBatchingConfig) -> dict[str, Any]:
        settings = base.as_dict()
        settings.update(
            micro_batch_size=self.micro_batch_size,
            parallelism=self.parallelism,
            max_micro_batch_tokens=self.max_micro_batch_tokens,
        )
        return settings


@dataclass(frozen=True)
class Confirmed:
    """A config as a real TorchServe measured it; ``trial`` is None for ``"auto"``."""

    trial: Trial | None
    config: dict[str, Any]
    requests_per_s: float
    p99_ms: float
    errors: int


def print_ranking(ranked: list[Trial]) -> None:
    print(
        "\nrank | micro_batch_size | max_micro_batch_tokens | threads pre/inf/post |"
        " requests/s | ms per batch"
    )
    for rank, t in enumerate(ranked, start=1):
        print(
            f"{rank:4} | {t.micro_batch_size:16} | {t.max_micro_batch_tokens!s:>22} |"
            f" {threads_of(t.parallelism):>20} | {t.requests_per_s:10.1f} | {t.batch_ms:.1f}"
        )


def print_confirmed(confirmed: list[Confirmed], ranked: list[Trial]) -> None:
    print(
        "\nOn TorchServe:\nrank | in-process rank | micro_batch_size | threads pre/inf/post |"
        " requests/s | p99 ms | errors"
    )
    for rank, c in enumerate(confirmed, start=1):
        in_process = "-" if c.trial is None else str(ranked.index(c.trial) + 1)
        print(
            f"{rank:4} | {in_process:>15} | {c.config['micro_batch_size']!s:>16} |"
            f" {threads_of(c.config['parallelism']):>20} | {c.requests_per_s:10.1f} |"
            f" {c.p99_ms:6.0f} | {c.errors}"
        )


def tune(
    mb: MicroBatching,
    context: Any,
    batches: list[list[Body]],
    sizes: list[int],
    threads: list[int],
    inference_threads: list[int],
    budgets: list[int | None] | None = None,
    record: Callable[[dict[str, Any]], None] | None = None,
) -> list[Trial]:
    """Every combination measured on the same ``batches`` (the first a warm-up); fastest
    first. ``budgets``: the max_micro_batch_tokens values to try; None: the config's own.
    ``record`` gets each trial as it is measured."""
    base = mb.config
    tried = budgets or [base.max_micro_batch_tokens]
    grid = list(itertools.product(sizes, tried, threads, inference_threads))
    trials = []
    for i, (size, budget, pre_post, infer) in enumerate(grid, start=1):
        parallelism = {"preprocess": pre_post, "inference": infer, "postprocess": pre_post}
        settings = {
            "micro_batch_size": size,
            "parallelism": parallelism,
            "max_micro_batch_tokens": budget,
        }
        mb.configure(MicroBatchingConfig.from_mapping(settings, base))
        seconds = measure_with_cpu(mb, context, batches)[0]
        trial = Trial(size, parallelism, len(batches[0]) / seconds, seconds * 1000, budget)
        trials.append(trial)
        if record is not None:
            record({"kind": "in-process", **asdict(trial)})
        tokens = "" if budget is None else f" tokens<={budget:<5}"
        print(
            f"[{i}/{len(grid)}] micro_batch_size={size:<3}{tokens} threads "
            f"{threads_of(parallelism)}: {trial.requests_per_s:8.1f} requests/s, "
            f"{trial.batch_ms:8.1f} ms per batch",
            flush=True,
        )
    return sorted(trials, key=lambda t: -t.requests_per_s)


def confirm(
    ranked: list[Trial], base: MicroBatchingConfig, args: argparse.Namespace, corpus: Corpus
) -> list[Confirmed]:
    """The ``args.confirm`` best trials (and "auto" with ``--with-auto``) measured on a
    real TorchServe, sent ``corpus`` (one ``--input`` is a corpus of one); fastest first,
    those with errors last."""
    top: list[Trial | None] = list(ranked[: args.confirm])
    configs = [t.as_config(base) for t in ranked[: args.confirm]]
    if args.with_auto:  # "auto" with the best threads, measured against the fixed sizes
        top.append(None)
        configs.append(dict(configs[0], micro_batch_size="auto"))
    concurrency = args.concurrency or 2 * args.batch_size
    load = Load(
        batch_size=args.batch_size,
        max_batch_delay_ms=args.max_batch_delay,
        concurrency=concurrency,
        requests=max(args.requests, concurrency),
        warmup_requests=max(100, concurrency),
    )
    out = args.confirm_out
    print(f"\nConfirming {len(top)} configs on TorchServe (results in {out})", flush=True)
    measured = measure_configs(
        args.mar, corpus, configs, load, args.confirm_repeats, Path(out), args.ts_config
    )
    confirmed = [
        Confirmed(trial, m.config, m.requests_per_s, m.p99_ms, m.errors)
        for trial, m in zip(top, measured)
    ]
    return sorted(confirmed, key=lambda c: (c.errors > 0, -c.requests_per_s))


def ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def budgets(text: str) -> list[int | None]:
    """``--budgets``: integers >= 1 or "none" (no budget), separated by commas."""
    values: list[int | None] = []
    for part in text.split(","):
        if part.strip().lower() == "none":
            values.append(None)
            continue
        values.extend(ints(part))
    return values


def default_budgets(base: MicroBatchingConfig) -> list[int | None]:
    """With ``order: length`` the budget decides the cut, so a few are tried around the
    config's own; otherwise the config's own alone."""
    own = base.max_micro_batch_tokens
    if base.order != "length":
        return [own]
    return list(dict.fromkeys([own, 1024, 2048, 4096]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog("ts_microbatch.tools.tune"),
        description=__doc__.split("\n\n")[0],
        epilog=SAFE_BESIDE,
    )
    parser.add_argument(
        "--mar", required=True, type=Path, help=".mar file or unpacked model directory"
    )
    bodies = parser.add_mutually_exclusive_group(required=True)
    bodies.add_argument("--input", type=Path, help="a sample request body (sent as bytes)")
    bodies.add_argument(
        "--corpus",
        type=Path,
        help="a directory of request bodies or a .jsonl file (one string or object a line); "
        "batches are drawn from it in a fixed order, and --confirm sends it",
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="frontend batch size to tune for"
    )
    parser.add_argument("--micro-batch-sizes", type=ints, default=[1, 2, 4, 8, 16])
    parser.add_argument(
        "--threads", type=ints, default=[1, 2], help="preprocess and postprocess threads"
    )
    parser.add_argument("--inference-threads", type=ints, default=[1])
    parser.add_argument(
        "--budgets",
        type=budgets,
        default=None,
        help="max_micro_batch_tokens values to try, e.g. 1024,2048,none (in the handler's "
        "item_length unit); default: the config's own, and with order: length also "
        "1024,2048,4096",
    )
    parser.add_argument("--repeats", type=int, default=3, help="batches measured per combination")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the file the best is merged into: micro_batching.json by default, "
        "model-config.yaml with --slo-p99-ms (which refuses a .json: see out_file)",
    )
    confirming = parser.add_argument_group("confirming on a real TorchServe")
    confirming.add_argument(
        "--confirm", type=int, default=0, metavar="K", help="benchmark the K best (default 0: no)"
    )
    confirming.add_argument("--requests", type=int, default=1000, help="measured per config")
    confirming.add_argument(
        "--concurrency", type=int, default=0, help="parallel clients (default 2 x batch size)"
    )
    confirming.add_argument("--max-batch-delay", type=int, default=50, help="milliseconds")
    confirming.add_argument(
        "--confirm-repeats",
        type=int,
        default=3,
        help="rounds, each serving every config once on a fresh TorchServe in an order "
        "shuffled from a seed recorded in results.json; a config's median run counts "
        "(default 3)",
    )
    confirming.add_argument(
        "--with-auto",
        action="store_true",
        help='also benchmark "auto" with the best threads; written if it measures fastest',
    )
    confirming.add_argument(
        "--confirm-out",
        type=Path,
        default=None,
        help="the benchmark's results (results.jsonl as runs come, results.json at the end); "
        "default: <out>-confirm/ beside --out",
    )
    confirming.add_argument(
        "--ts-config",
        type=Path,
        help="a config.properties every server starts from; it keeps its settings but the "
        "addresses, worker ports and model store",
    )
    slo.add_arguments(parser, ints)
    return parser


def out_file(args: argparse.Namespace) -> Path:
    """``--out``, or its default: micro_batching.json, or model-config.yaml with
    ``--slo-p99-ms``, whose frontend keys only model-config.yaml holds (a ``.json`` is
    refused: the package's config check refuses those keys there)."""
    if args.out is None:
        return Path("model-config.yaml" if args.slo_p99_ms else "micro_batching.json")
    if args.slo_p99_ms and args.out.suffix.lower() == ".json":
        raise SystemExit(
            f"error: --out {args.out}: --slo-p99-ms tunes the frontend's batchSize and "
            "maxBatchDelay with a micro_batching section, which only a model-config.yaml "
            "holds, not a micro_batching.json; give --out "
            f"{args.out.with_name('model-config.yaml')}"
        )
    return Path(args.out)


def prepare_outputs(args: argparse.Namespace) -> ResultsLog:
    """Before anything is measured: ``--confirm``'s needs checked, the folders of ``--out``
    and ``--confirm-out`` made (``<out>-confirm/`` by default; a non-empty one the tuner did
    not make is refused) and the trials file every measurement is appended to."""
    if args.confirm:
        problem = java_problem()
        if problem:
            raise SystemExit(f"--confirm needs TorchServe: {problem}")
    try:
        output_file(args.out, "--out")
        read_existing(args.out)  # a file that cannot be merged into fails now, not at the end
        if args.confirm:
            default = args.out.with_name(f"{args.out.stem}-confirm")
            # The confirm runs delete and rewrite store/, servers/, samples/ and
            # results.json in it: never in a folder of the user's (results.claimed_dir).
            args.confirm_out = claimed_dir(
                args.confirm_out or default, "ts-microbatch-tune", "--confirm-out"
            )
        return ResultsLog(args.out.with_name(f"{args.out.stem}.trials.jsonl"))
    except (OutputError, MergeError) as err:
        raise SystemExit(f"error: {err}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out = out_file(args)
    trials = prepare_outputs(args)
    print(f"Each measurement is appended to {trials.path} as it comes", flush=True)
    if args.slo_p99_ms:
        return slo.run(args, trials)
    sizes = [s for s in args.micro_batch_sizes if s <= args.batch_size] or [args.batch_size]
    corpus = tuning_corpus(args)
    batches = corpus.batches(args.batch_size, args.repeats + 1)
    with tempfile.TemporaryDirectory(prefix="ts-microbatch-tune-") as scratch:
        model_dir = model_dir_of(args.mar, Path(scratch) / "model")
        context = make_context(model_dir, args.batch_size)
        base = load_config(model_dir, context.model_yaml_config)
        _, mb = load_handler(model_dir, context)
        tried = args.budgets or default_budgets(base)
        print(
            f"Tuning {args.mar} at batch size {args.batch_size} on {corpus.label}: "
            f"{len(sizes)} sizes x {len(tried)} token budgets x {len(args.threads)} x "
            f"{len(args.inference_threads)} thread counts",
            flush=True,
        )
        try:
            grid = (sizes, args.threads, args.inference_threads, tried)
            ranked = tune(mb, context, batches, *grid, record=trials.append)
        finally:
            mb.shutdown()
        print_ranking(ranked)
        best = ranked[0].as_config(base)
        if args.confirm:
            confirmed = confirm(ranked, base, args, corpus)
            print_confirmed(confirmed, ranked)
            best = confirmed[0].config
    # Into the user's file: the keys tuned set, every other key of theirs kept (merge.py).
    tuned = {key: best[key] for key in TUNED_KEYS if key in best}
    try:
        _, backup = write_merged(args.out, tuned, best)
    except MergeError as err:
        print(f"\nerror: {err}")
        return 1
    trials.append({"kind": "best", "micro_batching": best, "out": str(args.out)})
    print(f"\nWrote the best config to {args.out}")
    if backup is not None:
        print(f"merged into your file, which was copied to {backup} first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
