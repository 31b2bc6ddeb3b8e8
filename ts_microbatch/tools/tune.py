"""``ts-microbatch-tune --slo-p99-ms 100``: the settings that hold the most load within a
latency objective, merged into a model-config.yaml.

    ts-microbatch-tune --mar model_store/resnet-18_mb.mar --input kitten.jpg \\
        --slo-p99-ms 100 --confirm 3 --out model-config.yaml

Below saturation the frontend's window and batch size set most of a request's latency, so
the frontend's batchSize and maxBatchDelay are searched with the pipeline's settings, in
three steps that take minutes: stage costs in-process (ts_microbatch.tools.inprocess) and
every configuration through a model of TorchServe's batching (slo_plan, batching_model),
then with ``--confirm K`` the best few on a real server beside the configuration the user
serves now (slo_confirm). The user's configuration is replaced only by one that beat it
with intervals that part (slo_verdict); the winner is merged into ``--out``
(ts_microbatch.tools.merge). Without ``--confirm`` the model's best is written only to an
``--out`` that does not exist yet. One worker: on two cores one worker's pipeline keeps
both busy.

There is no throughput tuner: at saturation ``"auto"`` served as much as the best an
in-process grid found (docs/tuning.md); a generous objective asks this one for the most load.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import tempfile
from pathlib import Path

from ..core.config import MicroBatchingConfig
from ._cli import SAFE_BESIDE, counts, prog, start_tool
from .batching_model import BOUNDS
from .corpus import OCTET_STREAM, Body, Corpus, CorpusError, content_type_of, read_corpus
from .inprocess import load_handler, make_context, model_dir_of
from .merge import MergeError, read_existing, write_merged
from .results import OutputError, ResultsLog, claimed_dir, output_file
from .server import java_problem
from .slo_confirm import Servers, calibrate, fit
from .slo_plan import (
    Candidate,
    StageCosts,
    capacity_per_s,
    floor_ms,
    plan,
    stage_costs,
    worker_cpu_scale,
)
from .slo_replace import confirm_best, current_candidate

# The micro_batching keys the tuner chooses; the others of a section it merges into stay.
TUNED_KEYS = ("micro_batch_size", "parallelism")
PLAN_HEADER = (
    "rank | micro_batch_size | threads | batchSize | maxBatchDelay | held req/s | P99 ms | bound"
)


def available_cores() -> int:
    """The cores this process may run on (the server the tuner starts gets the same)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def print_plan(candidates: list[Candidate], slo_p99_ms: float, frontend: str) -> None:
    print(f"\nModelled, P99 within {slo_p99_ms:g} ms (one worker; {frontend}):")
    print(PLAN_HEADER)
    columns = PLAN_HEADER.split(" | ")
    for rank, c in enumerate(candidates[:10], start=1):
        cells: list[object] = [f"{rank}{'!' if c.flagged else ' '}", c.settings["micro_batch_size"]]
        cells += [c.threads(), c.batch_size, c.window_ms, f"{c.held_per_s:.1f}"]
        cells += [f"{c.tail.p99_ms:.1f}", c.tail.bound] if c.tail else ["nan", "-"]
        print(" | ".join(f"{cell!s:>{len(name)}}" for cell, name in zip(cells, columns)))
    if any(c.flagged for c in candidates[:10]):
        print("  ! stage costs not monotone in the batch size (the warnings above)")


def write_winner(winner: Candidate, out: Path, slo_p99_ms: float, how: str) -> None:
    """``winner`` merged into ``out``: batchSize, maxBatchDelay and the tuned
    micro_batching keys set; one worker and the whole section where the file has none.
    ``how``: why it was chosen, for the file's first line."""
    tuned = {key: winner.settings[key] for key in TUNED_KEYS}
    values = {**winner.frontend(), "micro_batching": tuned}
    header = f"ts-microbatch-tune --slo-p99-ms {slo_p99_ms:g} ({how})"
    written, backup = write_merged(out, values, winner.model_config(), header)
    print(f"\nWrote {out} ({how}): {winner.describe()}")
    if backup is not None:
        kept = ", ".join(sorted(set(written) - set(values))) or "nothing else"
        print(f"merged into your file (kept: {kept}); it was copied to {backup} first")
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


def tuning_corpus(args: argparse.Namespace) -> Corpus:
    """``--corpus``, or ``--input`` as a corpus of one body sent as bytes, or as an image
    when it is one (TorchServe decodes text/* and JSON bodies, the in-process runs do not;
    an image reaches the handler as bytes either way)."""
    if args.corpus is not None:
        try:
            return read_corpus(args.corpus)
        except CorpusError as err:
            raise SystemExit(f"--corpus: {err}") from None
    guessed = content_type_of(args.input)
    content_type = guessed if guessed.startswith("image/") else OCTET_STREAM
    body = Body(args.input.name, args.input.read_bytes(), content_type)
    return Corpus(str(args.input), (body,))


def measure_costs(
    args: argparse.Namespace, corpus: Corpus, trials: ResultsLog, current: Candidate
) -> list[StageCosts]:
    """Step 1: every combination of the grid at each of ``--batch-sizes``, in-process, over
    the settings the user serves now (``current``: the .mar's with ``--out``'s keys over
    them), so what is measured is what would be written."""
    combos = [
        {"micro_batch_size": m, "parallelism": {"preprocess": t, "inference": i, "postprocess": t}}
        for m, t, i in itertools.product(
            args.micro_batch_sizes, args.threads, args.inference_threads
        )
    ]
    print(
        f"Stage costs of {len(combos)} combinations at batch sizes {args.batch_sizes}, "
        f"in-process, on {corpus.label}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ts-microbatch-slo-") as scratch:
        model_dir = model_dir_of(args.mar, Path(scratch) / "model")
        context = make_context(model_dir, max(args.batch_sizes))
        base = MicroBatchingConfig.from_mapping(current.settings)
        _, mb = load_handler(model_dir, context)
        try:
            return stage_costs(
                mb, context, corpus, base, combos, args.batch_sizes, args.repeats, trials
            )
        finally:
            mb.shutdown()


def model(
    args: argparse.Namespace, costs: list[StageCosts], servers: Servers, current: Candidate
) -> tuple[list[Candidate], list[str]]:
    """Step 2: every configuration through the model, best first (``current`` predicted
    too when its settings were measured), and what it knew of the CPU. With ``--confirm``
    and no ``--frontend-cpu-ms``, the model's rank 1 is served closed loop: the frontend's
    and the worker's CPU feed its CPU cap, what the server answered against the model's
    capacity scales every configuration's (said first when they differ by over ``FITS``)."""
    cores = available_cores()
    frontend_ms, scale, capacity, overhead = args.frontend_cpu_ms or None, 1.0, 1.0, 0.0

    def planned(cost: list[StageCosts], sizes: list[int], windows: list[int]) -> list[Candidate]:
        slo, rate = args.slo_p99_ms, args.rate
        return plan(cost, sizes, windows, slo, rate, frontend_ms, cores, scale, capacity, overhead)

    candidates = planned(costs, args.batch_sizes, args.windows)
    said: list[str] = []
    if args.confirm and args.frontend_cpu_ms is None and candidates[0].tail is not None:
        first = candidates[0]
        calibrated = calibrate(first, servers)
        if calibrated:
            frontend_ms = calibrated.frontend_cpu_ms
            scale = worker_cpu_scale(costs, first, calibrated.worker_cpu_ms)
            cost = next(c for c in costs if c.settings == first.settings)
            modelled = capacity_per_s(cost, first.batch_size, frontend_ms, cores, scale)
            capacity = calibrated.answered_per_s / modelled if calibrated.answered_per_s else 1.0
            alone = floor_ms(costs, cost, first.batch_size, first.window_ms, capacity)
            if math.isfinite(calibrated.floor_p99_ms):
                overhead = max(0.0, calibrated.floor_p99_ms - alone)
            said = fit(calibrated, modelled, alone, scale, first)
            candidates = planned(costs, args.batch_sizes, args.windows)
    same = [c for c in costs if c.settings == current.settings]
    if same:
        current.tail = planned(same, [current.batch_size], [current.window_ms])[0].tail
    for c in candidates:
        servers.record.append(
            {
                "kind": "modelled",
                **c.model_config(),
                "held_per_s": c.held_per_s,
                "p99_ms": c.tail.p99_ms if c.tail else None,
                "bound": c.tail.bound if c.tail else None,
                "frontend_cpu_ms": frontend_ms,
                "worker_cpu_scale": scale,
                "capacity_scale": capacity,
                "overhead_ms": overhead,
                "not_monotone": c.flagged,
            }
        )
    if not frontend_ms:
        return candidates, [*said, "the frontend's CPU left out"]
    return candidates, [
        *said,
        f"the frontend's CPU {frontend_ms:.2f} ms a request, the worker's {scale:.2f}x its "
        f"in-process CPU, {cores} cores"
        + (f", capacities x{capacity:.2f} from the calibration run" if capacity != 1.0 else "")
        + (f", {overhead:.1f} ms a request outside the stages" if overhead else ""),
    ]


def run(args: argparse.Namespace, trials: ResultsLog) -> int:
    """``ts-microbatch-tune --slo-p99-ms``: the three steps, the winner merged into --out."""
    corpus = tuning_corpus(args)
    current = current_candidate(args.mar, args.out)  # unreadable: refused before measuring
    servers = Servers(args.mar, corpus, args.confirm_out, trials, args.ts_config)
    candidates, frontend = model(
        args, measure_costs(args, corpus, trials, current), servers, current
    )
    for line in frontend[:-1]:
        print(f"\n{line}")
    print_plan(candidates, args.slo_p99_ms, frontend[-1])
    if candidates[0].tail is None:
        at = f" at {args.rate:g} req/s" if args.rate else ""
        print(
            f"\nNo configuration holds P99 {args.slo_p99_ms:g} ms{at} in the model; "
            "nothing written (try longer objectives, smaller batches or windows)"
        )
        return 1
    if not args.confirm:
        if args.out.exists():
            print(
                f"\n{args.out} left as it is: without --confirm nothing was measured against "
                "your configuration (run with --confirm K to replace it only by one that beat "
                f"it on a server). The model's best: {candidates[0].describe()}"
            )
            return 0
        winner, how = candidates[0], "modelled, not confirmed"
    else:
        chosen = confirm_best(candidates, current, args, servers)
        if chosen is None:
            return 0 if current.measured_per_s > 0 else 1
        winner, how = chosen
    try:
        write_winner(winner, args.out, args.slo_p99_ms, how)
    except MergeError as err:
        print(f"\nerror: {err}")
        return 1
    trials.append({"kind": "best", **winner.model_config(), "out": str(args.out)})
    return 0


def ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected integers >= 1 separated by commas, got {text!r}"
        )
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog("ts_microbatch.tools.tune"),
        description=__doc__.split("\n\n")[0],
        epilog=SAFE_BESIDE,
    )
    parser.add_argument(
        "--mar", required=True, type=Path, help=".mar file or unpacked model directory"
    )
    parser.add_argument(
        "--slo-p99-ms",
        required=True,
        type=float,
        help="the objective: the settings (the frontend's batchSize and maxBatchDelay too) "
        "that hold the most load with P99 within this. For throughput at saturation the "
        'answer is "micro_batch_size": "auto", or give a generous objective',
    )
    parser.add_argument("--rate", type=float, help="the lowest P99 at this rate instead")
    bodies = parser.add_mutually_exclusive_group(required=True)
    bodies.add_argument("--input", type=Path, help="a sample request body (sent as bytes)")
    bodies.add_argument(
        "--corpus",
        type=Path,
        help="a directory of request bodies or a .jsonl file (one string or object a line); "
        "batches are drawn from it in a fixed order, and --confirm sends it",
    )
    parser.add_argument("--micro-batch-sizes", type=ints, default=[1, 2, 4, 8, 16])
    parser.add_argument(
        "--threads", type=ints, default=[1, 2], help="preprocess and postprocess threads"
    )
    parser.add_argument("--inference-threads", type=ints, default=[1])
    parser.add_argument("--batch-sizes", type=ints, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument(
        "--windows", type=ints, default=[1, 2, 5, 10, 20, 50], help="maxBatchDelay values, ms"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=6,
        help="batches measured per combination and batch size (their spread is the length "
        "mix's: more for a corpus of very different bodies)",
    )
    parser.add_argument(
        "--frontend-cpu-ms",
        type=float,
        help="the frontend's CPU per request, ms, for the model's CPU cap (default: with "
        "--confirm, read from a short run on a real server; without, left out; 0: left out)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("model-config.yaml"),
        help="the model-config.yaml the best is merged into (a backup of an existing one "
        "beside it; a .json is refused: only a model-config.yaml holds the frontend's keys)",
    )
    confirming = parser.add_argument_group("confirming on a real TorchServe")
    confirming.add_argument(
        "--confirm", type=counts, default=0, metavar="K", help="run the K best (default 0: no)"
    )
    confirming.add_argument(
        "--confirm-out",
        type=Path,
        help="the servers' scratch folders and logs; default: <out>-confirm/ beside --out",
    )
    confirming.add_argument(
        "--ts-config",
        type=Path,
        help="a config.properties every server starts from; it keeps its settings but the "
        "addresses, worker ports and model store",
    )
    return parser


def prepare_outputs(args: argparse.Namespace) -> ResultsLog:
    """Before anything is measured: ``--out`` checked, ``--confirm``'s needs checked, the
    folders of ``--out`` and ``--confirm-out`` made (``<out>-confirm/`` by default; a
    non-empty one the tuner did not make is refused) and the trials file every measurement
    is appended to."""
    out = args.out
    if out.suffix.lower() == ".json":  # the package's config check refuses these keys there
        raise SystemExit(
            f"error: --out {out}: --slo-p99-ms tunes the frontend's batchSize and "
            "maxBatchDelay with a micro_batching section, which only a model-config.yaml "
            f"holds, not a micro_batching.json; give --out {out.with_name('model-config.yaml')}"
        )
    if args.confirm:
        problem = java_problem()
        if problem:
            raise SystemExit(f"--confirm needs TorchServe: {problem}")
    try:
        output_file(out, "--out")
        read_existing(out)  # a file that cannot be merged into fails now, not at the end
        if args.confirm:
            # The confirm runs delete and rewrite store/ and servers/ in it: never in a
            # folder of the user's (results.claimed_dir).
            args.confirm_out = claimed_dir(
                args.confirm_out or out.with_name(f"{out.stem}-confirm"),
                "ts-microbatch-tune",
                "--confirm-out",
            )
        return ResultsLog(out.with_name(f"{out.stem}.trials.jsonl"))
    except (OutputError, MergeError) as err:
        raise SystemExit(f"error: {err}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with start_tool("ts_microbatch.tools.tune"):
        args.batch_sizes = sorted(set(args.batch_sizes))  # measured and modelled once, rising
        trials = prepare_outputs(args)
        print(f"Each measurement is appended to {trials.path} as it comes", flush=True)
        return run(args, trials)


if __name__ == "__main__":
    sys.exit(main())
