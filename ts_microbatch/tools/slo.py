"""Tuning for a latency objective: ``ts-microbatch-tune --slo-p99-ms 100 [--rate R]``.

Below saturation the frontend's window and batch size set most of a request's latency, and
the fastest configuration at saturation is not the one that holds an objective longest. The
search is in three steps, so that it takes minutes, not hours:

1. **Stage costs, in-process.** For every micro-batching combination of the tuner's grid
   (micro-batch size, stage threads), the handler runs batches of each size of
   ``--batch-sizes`` from the corpus: milliseconds per batch of n (``service_curve``).
2. **Batch formation, modelled.** For every ``batchSize`` x ``maxBatchDelay`` x combination,
   ``ts_microbatch.tools.batching_model`` replays Poisson arrivals as TorchServe's frontend
   batches them and finds the highest rate whose P99 is within the objective (with
   ``--rate``, the P99 at that rate), and what bounds it: the queue (the worker's capacity),
   the window, or the batch's run.
3. **Confirmed on a real TorchServe** (``--confirm K``): the K best, each repackaged with its
   frontend settings, get an open-loop sweep around the rate the model predicted
   (``ts_microbatch.tools.curves``); the highest rate measured within the objective wins.

The winner is written as a model-config.yaml: ``batchSize``, ``maxBatchDelay`` and the
``micro_batching`` section. One worker: on two cores one worker's pipeline keeps both busy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.config import MicroBatchingConfig
from .batching_model import Tail, service_curve, sustained, tail_at
from .corpus import Corpus
from .curves import CurveSender
from .curves import sustained as measured_sustained
from .mar import override_mar
from .measure import RegistrationError, measure
from .results import ResultsLog

BOUNDS = {
    "window": "maxBatchDelay: the slowest requests waited most for their batch to fill",
    "service": "batchSize and the pipeline: the slowest requests waited most for their batch "
    "to run",
    "queue": "the worker's capacity: the slowest requests waited most for the worker",
}


@dataclass
class Candidate:
    """One configuration: its micro-batching section, the frontend's batch size and window,
    and what the model predicts (``tail``: at the highest rate held, or at ``--rate``)."""

    settings: dict[str, Any]
    batch_size: int
    window_ms: int
    tail: Tail | None
    measured_per_s: float | None = None  # the rate a real server held within the objective

    @property
    def held_per_s(self) -> float:
        return self.tail.rate_per_s if self.tail else 0.0

    def model_config(self) -> dict[str, Any]:
        return {
            "minWorkers": 1,
            "maxWorkers": 1,
            "batchSize": self.batch_size,
            "maxBatchDelay": self.window_ms,
            "micro_batching": self.settings,
        }

    def describe(self) -> str:
        p = self.settings["parallelism"]
        return (
            f"micro_batch_size {self.settings['micro_batch_size']}, threads "
            f"{p['preprocess']}/{p['inference']}/{p['postprocess']}, batchSize "
            f"{self.batch_size}, maxBatchDelay {self.window_ms} ms"
        )


def stage_costs(
    mb: Any,
    context: Any,
    corpus: Corpus,
    base: MicroBatchingConfig,
    combos: list[dict[str, Any]],
    batch_sizes: list[int],
    repeats: int,
    record: ResultsLog,
) -> list[tuple[dict[str, Any], dict[int, float]]]:
    """Step 1: per combination, milliseconds per batch of each size, in-process."""
    from .inprocess import measure as seconds_per_batch

    costs = []
    for index, combo in enumerate(combos, start=1):
        settings = {**base.as_dict(), **combo}
        mb.configure(MicroBatchingConfig.from_mapping(settings, base))
        per_size = {}
        for n in batch_sizes:
            per_size[n] = 1000 * seconds_per_batch(mb, context, corpus.batches(n, repeats + 1))
        costs.append((settings, per_size))
        record.append({"kind": "stage-costs", "settings": settings, "batch_ms": per_size})
        shown = ", ".join(f"{n}: {ms:.1f}" for n, ms in per_size.items())
        print(f"[{index}/{len(combos)}] {json.dumps(combo)}: ms per batch of n {shown}", flush=True)
    return costs


def plan(
    costs: list[tuple[dict[str, Any], dict[int, float]]],
    batch_sizes: list[int],
    windows: list[int],
    slo_p99_ms: float,
    rate: float | None = None,
) -> list[Candidate]:
    """Step 2: every configuration through the batching model, best first: the highest
    rate held within the objective, or with ``rate``, the lowest P99 at it among those
    within the objective."""
    candidates = []
    for (settings, per_size), size, window in itertools.product(costs, batch_sizes, windows):
        service = service_curve({n: ms for n, ms in per_size.items() if n <= size})
        if rate is None:
            tail = sustained(slo_p99_ms, size, window, service)
        else:
            at_rate = tail_at(rate, size, window, service)
            tail = at_rate if at_rate.p99_ms <= slo_p99_ms else None
        candidates.append(Candidate(settings, size, window, tail))
    if rate is None:
        return sorted(candidates, key=lambda c: -c.held_per_s)
    return sorted(candidates, key=lambda c: c.tail.p99_ms if c.tail else float("inf"))


def confirm(
    top: list[Candidate],
    mar: Path,
    corpus: Corpus,
    slo_p99_ms: float,
    out: Path,
    record: ResultsLog,
    base_config: Path | None = None,
) -> list[Candidate]:
    """Step 3: each of ``top`` on a real TorchServe, an open-loop sweep around its
    predicted rate; ranked by the rate measured within the objective."""
    first = corpus.bodies[corpus.order[0]]
    for index, candidate in enumerate(top, start=1):
        label = f"[confirm {index}/{len(top)}] {candidate.describe()}"
        predicted = max(candidate.held_per_s, 1.0)
        # The model leaves out the frontend's CPU, so the sweep starts well below it.
        rates = sorted({round(predicted * f, 1) for f in (0.3, 0.45, 0.6, 0.75, 0.9, 1.05)})
        frontend = {"batchSize": candidate.batch_size, "maxBatchDelay": candidate.window_ms}
        override_mar(mar, out / "store" / f"c{index}.mar", candidate.settings, frontend)
        point = {
            "batch_size": candidate.batch_size,
            "max_batch_delay": candidate.window_ms,
            "concurrency": 2 * candidate.batch_size,
            "requests": 1,
            "workers": 1,
        }
        config = {"metrics_mode": "prometheus", "warmup_requests": 100, "response_timeout": 120}
        sender = CurveSender(corpus, rates, 4.0, point["concurrency"], print)
        try:
            result = measure(
                out / "servers" / f"c{index}",
                out / "store",
                f"c{index}",
                config,
                point,
                label,
                out / "metrics" / f"c{index}.prom",
                sender,
                (first.data, first.content_type),
                archive=f"c{index}.mar",
                base_config=base_config,
            )
        except RegistrationError as err:
            print(f"{label}: not registered: {str(err).splitlines()[0]}", flush=True)
            candidate.measured_per_s = 0.0
            continue
        candidate.measured_per_s = measured_sustained(result["curve"], slo_p99_ms)
        record.append(
            {
                "kind": "confirmed",
                **candidate.model_config(),
                "predicted_per_s": candidate.held_per_s,
                "measured_per_s": candidate.measured_per_s,
                "curve": result["curve"],
            }
        )
        print(
            f"{label}: holds {candidate.measured_per_s:g} req/s within P99 {slo_p99_ms:g} ms "
            f"(predicted {candidate.held_per_s:.0f})",
            flush=True,
        )
    for scratch in ("store", "servers"):  # the repackaged .mars and the servers' logs
        shutil.rmtree(out / scratch, ignore_errors=True)
    return sorted(top, key=lambda c: -(c.measured_per_s or 0.0))


_PLAN_HEADER = (
    "rank | micro_batch_size | threads | batchSize | maxBatchDelay | held req/s | P99 ms | bound"
)


def print_plan(candidates: list[Candidate], slo_p99_ms: float, shown: int = 10) -> None:
    print(f"\nModelled, P99 within {slo_p99_ms:g} ms (one worker; frontend CPU left out):")
    print(
        "rank | micro_batch_size | threads | batchSize | maxBatchDelay | held req/s | P99 ms"
        " | bound"
    )
    for rank, c in enumerate(candidates[:shown], start=1):
        p = c.settings["parallelism"]
        threads = f"{p['preprocess']}/{p['inference']}/{p['postprocess']}"
        tail = c.tail
        print(
            f"{rank:4} | {c.settings['micro_batch_size']!s:>16} | {threads:>7} | "
            f"{c.batch_size:9} | {c.window_ms:13} | {c.held_per_s:10.1f} | "
            f"{tail.p99_ms if tail else float('nan'):6.1f} | {tail.bound if tail else '-'}"
        )


def write_winner(winner: Candidate, out: Path, slo_p99_ms: float) -> None:
    text = yaml.safe_dump(winner.model_config(), sort_keys=False)
    out.write_text(f"# ts-microbatch-tune --slo-p99-ms {slo_p99_ms:g}\n" + text)
    tail = winner.tail
    print(f"\nWrote {out}: {winner.describe()}")
    if tail is not None:
        print(
            f"bound by {BOUNDS[tail.bound]} (at {tail.rate_per_s:.0f} req/s, modelled: "
            f"queue {tail.queue_ms:.0f} + window {tail.window_ms:.0f} + run "
            f"{tail.service_ms:.0f} ms)"
        )


def add_arguments(parser: argparse.ArgumentParser, ints: Any) -> None:
    group = parser.add_argument_group("tuning for a latency objective (--slo-p99-ms)")
    group.add_argument(
        "--slo-p99-ms",
        type=float,
        help="find the settings (the frontend's batchSize and "
        "maxBatchDelay too) that hold the most load with P99 within this; writes a "
        "model-config.yaml to --out",
    )
    group.add_argument("--rate", type=float, help="with --slo-p99-ms: the lowest P99 at this rate")
    group.add_argument("--batch-sizes", type=ints, default=[1, 2, 4, 8, 16, 32])
    group.add_argument(
        "--windows", type=ints, default=[1, 2, 5, 10, 20, 50], help="maxBatchDelay values, ms"
    )


def run(args: argparse.Namespace, trials: ResultsLog) -> int:
    """``ts-microbatch-tune --slo-p99-ms``: the three steps, the winner written to --out."""
    import tempfile

    from ..core.config import load_config
    from .confirm import model_dir_of
    from .inprocess import load_handler, make_context, tuning_corpus

    corpus = tuning_corpus(args)
    batch_sizes = sorted({n for n in args.batch_sizes if n >= 1})
    combos = [
        {"micro_batch_size": m, "parallelism": {"preprocess": t, "inference": i, "postprocess": t}}
        for m, t, i in itertools.product(
            args.micro_batch_sizes, args.threads, args.inference_threads
        )
    ]
    print(
        f"Stage costs of {len(combos)} combinations at batch sizes {batch_sizes}, in-process, "
        f"on {corpus.label}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ts-microbatch-slo-") as scratch:
        model_dir = model_dir_of(args.mar, Path(scratch) / "model")
        context = make_context(model_dir, max(batch_sizes))
        base = load_config(model_dir, context.model_yaml_config)
        _, mb = load_handler(model_dir, context)
        try:
            costs = stage_costs(
                mb, context, corpus, base, combos, batch_sizes, args.repeats, trials
            )
        finally:
            mb.shutdown()
    candidates = plan(costs, batch_sizes, args.windows, args.slo_p99_ms, args.rate)
    for c in candidates:
        trials.append(
            {
                "kind": "modelled",
                **c.model_config(),
                "held_per_s": c.held_per_s,
                "p99_ms": c.tail.p99_ms if c.tail else None,
                "bound": c.tail.bound if c.tail else None,
            }
        )
    print_plan(candidates, args.slo_p99_ms)
    if candidates[0].tail is None:
        at = f" at {args.rate:g} req/s" if args.rate else ""
        print(
            f"\nNo configuration holds P99 {args.slo_p99_ms:g} ms{at} in the model; "
            "nothing written (try longer objectives, smaller batches or windows)"
        )
        return 1
    winner = candidates[0]
    if args.confirm:
        held = [c for c in candidates if c.tail is not None][: args.confirm]
        confirmed = confirm(
            held, args.mar, corpus, args.slo_p99_ms, args.confirm_out, trials, args.ts_config
        )
        if (confirmed[0].measured_per_s or 0) > 0:
            winner = confirmed[0]
    write_winner(winner, args.out, args.slo_p99_ms)
    trials.append({"kind": "best", **winner.model_config(), "out": str(args.out)})
    return 0
