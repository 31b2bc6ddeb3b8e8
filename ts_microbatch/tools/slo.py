"""Tuning for a latency objective: ``ts-microbatch-tune --slo-p99-ms 100 [--rate R]``.

Below saturation the frontend's window and batch size set most of a request's latency, and
the fastest configuration at saturation is not the one that holds an objective longest. The
search is in three steps, so that it takes minutes, not hours:

1. **Stage costs, in-process** (``ts_microbatch.tools.slo_plan``). For every micro-batching
   combination of the tuner's grid (micro-batch size, stage threads), the handler runs
   batches of each size of ``--batch-sizes`` from the corpus: milliseconds and CPU
   milliseconds per batch of n. A larger batch measured clearly cheaper than a smaller one
   is measured again, and flagged if it still is.
2. **Batch formation, modelled.** For every ``batchSize`` x ``maxBatchDelay`` x combination,
   ``ts_microbatch.tools.batching_model`` replays Poisson arrivals as TorchServe's frontend
   batches them and finds the highest rate whose P99 is within the objective (with
   ``--rate``, the P99 at that rate), and what bounds it: the queue (the worker's capacity),
   the window, the batch's run, or the CPU the cores have for the frontend and the worker
   (the frontend's CPU per request from ``--frontend-cpu-ms``, or with ``--confirm`` read
   from a short run of the model's rank 1 on a real server).
3. **Confirmed on a real TorchServe** (``--confirm K``, ``ts_microbatch.tools.slo_confirm``):
   the K best that differ in more than the window, each repackaged with its frontend
   settings, get an open-loop ladder of rates from an eighth of the predicted rate to 1.4x
   it; the highest rate held within the objective on the server decides.

What is written (``write_winner``, through ``ts_microbatch.tools.merge``): without
``--confirm`` the model's best; with it, the best the server confirmed, or **nothing**:
when every confirmation held nothing within the objective the tuner says what it tried,
what each held and what was predicted, and exits 1. The file is merged into an existing
``--out`` (every key the tuner does not set kept, a backup beside it first). One worker:
on two cores one worker's pipeline keeps both busy.
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path
from typing import Any

from .merge import MergeError, write_merged
from .results import ResultsLog
from .slo_plan import Candidate, plan, stage_costs, worker_cpu_scale

BOUNDS = {
    "window": "maxBatchDelay: the slowest requests waited most for their batch to fill",
    "service": "batchSize and the pipeline: the slowest requests waited most for their batch "
    "to run",
    "queue": "the worker's capacity: the slowest requests waited most for the worker",
    "cpu": "the CPU: the cores cannot do more for the frontend and the worker together",
}

# The micro_batching keys the tuner chooses; the others of a section it merges into stay.
TUNED_KEYS = ("micro_batch_size", "parallelism")


def available_cores() -> int:
    """The cores this process may run on (the server the tuner starts gets the same)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def print_plan(
    candidates: list[Candidate], slo_p99_ms: float, frontend: str, shown: int = 10
) -> None:
    print(f"\nModelled, P99 within {slo_p99_ms:g} ms (one worker; {frontend}):")
    print(
        "rank | micro_batch_size | threads | batchSize | maxBatchDelay | held req/s | P99 ms"
        " | bound"
    )
    for rank, c in enumerate(candidates[:shown], start=1):
        p = c.settings["parallelism"]
        threads = f"{p['preprocess']}/{p['inference']}/{p['postprocess']}"
        tail = c.tail
        mark = "!" if c.flagged else " "
        print(
            f"{rank:3}{mark} | {c.settings['micro_batch_size']!s:>16} | {threads:>7} | "
            f"{c.batch_size:9} | {c.window_ms:13} | {c.held_per_s:10.1f} | "
            f"{tail.p99_ms if tail else float('nan'):6.1f} | {tail.bound if tail else '-'}"
        )
    if any(c.flagged for c in candidates[:shown]):
        print("  ! stage costs not monotone in the batch size (the warnings above)")


def print_confirmed(top: list[Candidate], ranked: list[Candidate], slo_p99_ms: float) -> None:
    print(f"\nOn TorchServe, within P99 {slo_p99_ms:g} ms:")
    print("model rank | configuration | predicted req/s | held req/s | frontend CPU ms/req")
    for c in top:
        cpu = f"{c.frontend_cpu_ms:.2f}" if c.frontend_cpu_ms is not None else "-"
        print(
            f"{ranked.index(c) + 1:10} | {c.describe()} | {c.held_per_s:.0f} | "
            f"{c.measured_per_s or 0.0:g} | {cpu}"
        )


def write_winner(winner: Candidate, out: Path, slo_p99_ms: float, how: str) -> None:
    """``winner`` merged into ``out`` (``merge.write_merged``): batchSize, maxBatchDelay and
    the tuned micro_batching keys set; one worker where the file says nothing of workers;
    the whole measured section where the file has none."""
    section = {key: winner.settings[key] for key in TUNED_KEYS}
    values = {
        "batchSize": winner.batch_size,
        "maxBatchDelay": winner.window_ms,
        "micro_batching": section,
    }
    defaults = {"minWorkers": 1, "maxWorkers": 1, "micro_batching": winner.settings}
    header = f"ts-microbatch-tune --slo-p99-ms {slo_p99_ms:g} ({how})"
    written, backup = write_merged(out, values, defaults, header)
    print(f"\nWrote {out} ({how}): {winner.describe()}")
    if backup is not None:
        kept = sorted(set(written) - set(values))
        print(f"merged into your file (kept: {', '.join(kept) or 'nothing else'}); "
              f"it was copied to {backup} first")  # fmt: skip
    if written.get("maxWorkers", 1) != 1 or written.get("minWorkers", 1) != 1:
        print(
            f"note: your file asks for {written.get('minWorkers')}-{written.get('maxWorkers')} "
            "workers, kept; the tuner modelled and measured one"
        )
    tail = winner.tail
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
        "maxBatchDelay too) that hold the most load with P99 within this; merges them into "
        "the model-config.yaml at --out (a backup of an existing one beside it)",
    )
    group.add_argument("--rate", type=float, help="with --slo-p99-ms: the lowest P99 at this rate")
    group.add_argument("--batch-sizes", type=ints, default=[1, 2, 4, 8, 16, 32])
    group.add_argument(
        "--windows", type=ints, default=[1, 2, 5, 10, 20, 50], help="maxBatchDelay values, ms"
    )
    group.add_argument(
        "--frontend-cpu-ms",
        type=float,
        help="the frontend's CPU per request, ms, for the model's CPU cap (default: with "
        "--confirm, read from a short run on a real server; without, left out; 0: left out)",
    )


def _refuse(top: list[Candidate], args: argparse.Namespace) -> int:
    at = f" at {args.rate:g} req/s or more" if args.rate else ""
    print(
        f"\nNothing written to {args.out}: the server held nothing within P99 "
        f"{args.slo_p99_ms:g} ms{at} for any of the {len(top)} configurations confirmed "
        "(above: what each was predicted and held). Try a longer objective, smaller batches "
        "or windows, or measure at the loads you run with ts-microbatch-benchmark --rates."
    )
    return 1


def run(args: argparse.Namespace, trials: ResultsLog) -> int:
    """``ts-microbatch-tune --slo-p99-ms``: the three steps, the winner merged into --out."""
    import tempfile

    from ..core.config import load_config
    from .confirm import model_dir_of
    from .inprocess import load_handler, make_context, tuning_corpus
    from .slo_confirm import best_confirmed, calibrate_frontend_cpu, confirm, confirm_slots

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
    cores = available_cores()
    frontend_ms = args.frontend_cpu_ms or None
    scale = 1.0  # the worker's CPU on a real server against in-process (worker_cpu_scale)

    def modelled() -> list[Candidate]:
        return plan(
            costs, batch_sizes, args.windows, args.slo_p99_ms, args.rate, frontend_ms, cores,
            scale,
        )  # fmt: skip

    candidates = modelled()
    if args.confirm and args.frontend_cpu_ms is None and candidates[0].tail is not None:
        calibrated = calibrate_frontend_cpu(
            candidates[0], args.mar, corpus, args.confirm_out, trials, args.ts_config
        )
        if calibrated:
            frontend_ms, worker_ms = calibrated
            scale = worker_cpu_scale(costs, candidates[0], worker_ms)
            candidates = modelled()
    for c in candidates:
        trials.append(
            {
                "kind": "modelled",
                **c.model_config(),
                "held_per_s": c.held_per_s,
                "p99_ms": c.tail.p99_ms if c.tail else None,
                "bound": c.tail.bound if c.tail else None,
                "frontend_cpu_ms": frontend_ms,
                "worker_cpu_scale": scale,
                "not_monotone": c.flagged,
            }
        )
    frontend = (
        f"the frontend's CPU {frontend_ms:.2f} ms a request, the worker's {scale:.2f}x its "
        f"in-process CPU, {cores} cores"
        if frontend_ms
        else "the frontend's CPU left out"
    )
    print_plan(candidates, args.slo_p99_ms, frontend)
    if candidates[0].tail is None:
        at = f" at {args.rate:g} req/s" if args.rate else ""
        print(
            f"\nNo configuration holds P99 {args.slo_p99_ms:g} ms{at} in the model; "
            "nothing written (try longer objectives, smaller batches or windows)"
        )
        return 1
    winner = candidates[0]
    how = "modelled, not confirmed"
    if args.confirm:
        top = confirm_slots(candidates, args.confirm)
        skipped = [c for c in candidates[: candidates.index(top[-1])] if c not in top]
        if skipped:
            ranks = ", ".join(str(candidates.index(c) + 1) for c in skipped)
            print(f"\nNot confirmed, as each differs from one confirmed in maxBatchDelay alone: "
                  f"model ranks {ranks}")  # fmt: skip
        confirm(top, args.mar, corpus, args.slo_p99_ms, args.confirm_out, trials, args.ts_config)
        print_confirmed(top, candidates, args.slo_p99_ms)
        confirmed = best_confirmed(top, args.rate)
        if confirmed is None:
            trials.append(
                {
                    "kind": "refused",
                    "tried": [
                        {**c.model_config(), "predicted_per_s": c.held_per_s,
                         "measured_per_s": c.measured_per_s}
                        for c in top
                    ],
                }
            )  # fmt: skip
            return _refuse(top, args)
        winner = confirmed
        how = (
            f"held {winner.measured_per_s:g} req/s on TorchServe, predicted {winner.held_per_s:.0f}"
        )
    try:
        write_winner(winner, args.out, args.slo_p99_ms, how)
    except MergeError as err:
        print(f"\nerror: {err}")
        return 1
    trials.append({"kind": "best", **winner.model_config(), "out": str(args.out)})
    return 0
