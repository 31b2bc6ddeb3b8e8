#!/usr/bin/env python3
"""An image example on photos of many sizes, against the same handler without
micro-batching: the study behind ``make bench-detect`` and ``make bench-segment``.

    python benchmarks/image_sizes.py --example image_segmenter \\
        --out benchmarks/results/segmentation [--variant NAME=JSON ...] \\
        [--handler-variant NAME=HANDLER.py ...] [--rounds 3]

Builds the example's self-contained .mar (``examples/<example>/build_mar.py``: its
``build_mar`` and its corpus of photos of several sizes, ``write_corpus``) under
build/<example>/, then serves it as ``benchmark-ab.py --mar`` does (ts_microbatch.tools.
benchmark: ``plain`` with micro-batching off, ``ours`` as packaged, each variant; a fresh
TorchServe per run, the corpus from parallel clients), with one difference: each round
serves the variants in its own shuffled order (seeded, the orders are in results.json), so
a slow phase of a shared machine does not always fall on the same variant.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from tests.helpers import load_module  # noqa: E402
from ts_microbatch.tools import benchmark  # noqa: E402
from ts_microbatch.tools.corpus import read_corpus  # noqa: E402
from ts_microbatch.tools.mar import override_mar  # noqa: E402
from ts_microbatch.tools.results import OutputError, claimed_dir  # noqa: E402
from ts_microbatch.tools.runs import round_order  # noqa: E402

PROPERTIES = ROOT / "configs/config.properties"  # every server's, and its metrics.yaml
EXAMPLES = ("object_detector", "image_segmenter")


def build_example(example: str, work: Path, weights: str | None) -> tuple[Path, Path]:
    """The example's self-contained .mar and its corpus directory, under ``work``."""
    build = load_module(f"examples/{example}/build_mar.py", f"ts_microbatch_{example}_build")
    mar = build.build_mar(work, work_dir=work / "model", weights=weights, self_contained=True)
    corpus = work / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    build.write_corpus(corpus)
    return mar, corpus


def shuffled_rounds(
    args: argparse.Namespace, out: Path
) -> tuple[list[dict[str, Any]], dict[str, str], list[list[str]], dict[str, Any]]:
    """benchmark.run's plan, each round in a seeded shuffled order: every round is
    benchmark.run_rounds over one round's order, in a directory of its own (its servers
    and metrics), its rows renumbered."""
    corpus = read_corpus(args.corpus)
    frontend = benchmark.frontend_of(args, args.mar)
    variants, handlers = benchmark.variants_of(args), benchmark.handlers_of(args)
    store = out / "store"
    effective = {
        name: override_mar(args.mar, store / f"{name}.mar", override, frontend, handlers.get(name))
        for name, override in variants
    }
    config, point = benchmark.run_settings(args, corpus, frontend)
    rows, refused, orders = [], {}, []
    for repeat in range(1, args.rounds + 1):
        left = [v for v in variants if v[0] not in refused]
        # run_rounds shuffles its one round from this seed: the order recorded is the one run
        seed = args.seed * 1_000 + repeat
        orders.append(round_order([name for name, _ in left], 0, seed))
        here = out / f"round-{repeat}"
        here.mkdir(parents=True, exist_ok=True)
        (here / "store").symlink_to(store, target_is_directory=True)
        got, failed = benchmark.run_rounds(
            1, left, effective, corpus, config, point, here, seed=seed
        )
        refused.update(failed)
        rows += renumbered(got, repeat, here, out)
    report_args = {"corpus": corpus, "variants": variants, "effective": effective, "point": point}
    return rows, refused, orders, {**report_args, "handlers": handlers}


def renumbered(
    rows: list[dict[str, Any]], repeat: int, here: Path, out: Path
) -> list[dict[str, Any]]:
    """A round's rows as round ``repeat``, its metrics and samples moved to ``out`` under
    that number (run_rounds, run one round at a time, numbers each one round 1)."""
    for row in rows:
        row["repeat"] = repeat
        for kind, suffix in (("metrics", ".prom"), ("samples", ".json")):
            kept = here / kind / f"{row['handler']}-r1{suffix}"
            if kept.exists():
                (out / kind).mkdir(exist_ok=True)
                kept.rename(out / kind / f"{row['handler']}-r{repeat}{suffix}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", choices=EXAMPLES, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the result directory")
    parser.add_argument("--weights", help="the example's model weights (else untrained)")
    parser.add_argument("--keep-logs", action="store_true", help="keep each server's logs")
    benchmark.add_arguments(parser)
    args = parser.parse_args()
    args.seed = 0 if args.seed is None else args.seed  # --seed is benchmark's: no new one here
    out = args.out.resolve()
    try:  # a run deletes what an earlier one wrote there: only in a folder it made itself
        claimed_dir(out, "benchmarks/image_sizes.py")
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for earlier in ["store", "metrics", "samples", *(p.name for p in out.glob("round-*"))]:
        shutil.rmtree(out / earlier, ignore_errors=True)  # a variant left out stays out
    work = ROOT / "build" / f"{args.example}-bench"
    args.mar, args.corpus = build_example(args.example, work, args.weights)
    rows, refused, orders, parts = shuffled_rounds(args, out)
    benchmark.report(args, out, rows=rows, refused=refused, **parts)
    results = json.loads((out / "results.json").read_text())
    results["round_orders"] = orders
    results["command"] = " ".join(sys.argv)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    scratch = ["store", *(f"round-{r}" for r in range(1, args.rounds + 1))]
    for name in scratch if not args.keep_logs else ["store"]:
        shutil.rmtree(out / name, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
