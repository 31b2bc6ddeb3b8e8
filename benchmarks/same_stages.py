#!/usr/bin/env python3
"""The pipeline against upstream's on the same stages, with the CPU each request costs.

Upstream's MicroBatching, ours on upstream's stages (PIL decoding as ImageClassifier, no
EXIF turn: ``ours-same``), and the same without the pipeline's metric lines
(``no-metrics``), round-robin (the order turned by one each round), one body, the
accelerator stand-in, batch 32, micro-batch 4, threads 2/1/2, concurrency 64: throughput,
P50 and P99 over every request's time (``ab -g``), and the CPU milliseconds per request of
the frontend (Java) and of the worker. On two busy cores throughput follows the CPU per
request, so this says where a difference comes from. Each round's ours/upstream ratios are
kept: rounds swing by 10-20%, so only ratios taken in one run, over several rounds, say
anything. The workers import the ts_microbatch of this checkout (PYTHONPATH).

    python benchmarks/same_stages.py --rounds 5 --requests 3000 --out benchmarks/results/same_stages
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "examples" / "image_classifier")]

import bench_lib  # noqa: E402
import bench_packaging  # noqa: E402
import corpus  # noqa: E402
import yaml as pyyaml  # noqa: E402

from ts_microbatch.tools.ab import parse_ab, parse_gnuplot, percentile  # noqa: E402

bench_packaging.HANDLER_FILES["no-metrics"] = str(HERE / "handlers/no_metrics_handler.py")
bench_packaging.HANDLER_FILES["ours-ic"] = str(HERE / "handlers/mixin_image_classifier.py")
# Ours on upstream's stages with torch's default intra-op threads on every stage thread, as
# upstream runs them (ours gives preprocess and postprocess threads one each by default):
# what the pipeline alone does, without that setting (ts_microbatch.core.intra_op).
SETTINGS_VARIANTS = {
    "ours-ic-torch-threads": (
        "ours-ic",
        {"intra_op_threads": {"preprocess": None, "inference": None, "postprocess": None}},
    ),
}
HANDLERS = ("upstream", "ours-ic", "ours-same", "no-metrics", *SETTINGS_VARIANTS)


def package(work: Path, handler: str) -> str:
    """Packages ``handler`` on the accelerator stand-in into ``work/store``; its model name."""
    config = bench_lib.load_config(HERE / "configs/photos.json")
    point = bench_lib.sweep_points(config)[0]
    name = f"same-{handler}"
    if (work / "store" / name).exists():
        return name
    base, settings = SETTINGS_VARIANTS.get(handler, (handler, {}))
    bench_packaging.package(
        work / "store", work / "build", name, "accelerator", base, config, point, None
    )
    if settings:
        path = model_config(work / "store" / name)
        model = pyyaml.safe_load(path.read_text())
        model["micro_batching"].update(settings)
        path.write_text(pyyaml.safe_dump(model))
    if handler == "no-metrics":
        # ours-same's model config, and our handler beside the subclass that imports it
        model_config(work / "store" / name).write_text(
            pyyaml.safe_dump(bench_packaging.model_yaml(config, point, "ours-same"))
        )
        shutil.copy(HERE.parent / "handlers/micro_batching_handler.py", work / "store" / name)
    return name


def model_config(directory: Path) -> Path:
    """The model config TorchServe reads for a model directory: the file its manifest names
    (the archiver keeps the --config-file's own name)."""
    manifest = json.loads((directory / "MAR-INF" / "MANIFEST.json").read_text())
    return directory / manifest["model"]["configFile"]


def server(work: Path, label: str) -> Any:
    # The workers import this checkout's ts_microbatch, not whichever one is installed.
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return bench_lib.project_server(work / "store", work / f"server-{label}", env=env)


def serve(ts: Any, name: str, body: Path) -> list[str]:
    """Registers ``name`` on ``ts`` and warms it up; the ab command line that loads it."""
    resp = ts.register(name, batch_size=32, max_batch_delay_ms=50)
    if resp.status != 200:
        raise RuntimeError(f"register {name}: {resp.status} {resp.body!r}")
    url = f"{ts.inference_url}/predictions/{name}"
    ab = ["ab", "-k", "-c", "64", "-p", str(body), "-T", "image/jpeg"]
    ab += ["-H", f"Authorization: Bearer {ts.token('inference')}"]
    subprocess.run([*ab, "-n", "300", url], capture_output=True, check=True)  # warm-up
    return [*ab, url]


def load(ab: list[str], requests: int, times: Path, label: str) -> dict[str, float]:
    """``requests`` sent by ``ab``, each one's time appended to ``times``; ab's summary."""
    out = subprocess.run(
        [*ab[:-1], "-g", str(times), "-n", str(requests), ab[-1]], capture_output=True, text=True
    )
    summary = parse_ab(out.stdout)
    done = summary["complete_requests"]
    errors = summary["failed_requests"] + summary["non_2xx_responses"]
    if errors or not done:
        raise RuntimeError(f"{label}: {errors:.0f} of {done:.0f} requests failed")
    return summary


def result(
    handler: str, done: float, seconds: float, ms: list[float], cpu: dict[str, float]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "handler": handler,
        "requests_per_s": done / seconds,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
    }
    for side, used in cpu.items():
        out[f"{side}_cpu_ms_per_request"] = 1000 * used / done
    return out


def run(work: Path, handler: str, body: Path, requests: int, label: str) -> dict[str, Any]:
    """One handler alone on its own TorchServe: ``requests`` in one go."""
    name = package(work, handler)
    with server(work, label.replace(" ", "-")) as ts:
        ab = serve(ts, name, body)
        before = bench_lib.cpu_seconds(ts)
        times = work / f"{label.replace(' ', '-')}.tsv"
        summary = load(ab, requests, times, label)
        after = bench_lib.cpu_seconds(ts)
    done = summary["complete_requests"]
    cpu = {side: after[side] - before[side] for side in before}
    row = result(
        handler, done, done / summary["requests_per_s"], parse_gnuplot(times.read_text()), cpu
    )
    print(label, {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    return row


def run_interleaved(
    work: Path, handlers: list[str], body: Path, requests: int, segments: int, rounds: int
) -> list[dict[str, Any]]:
    """Every handler registered on one TorchServe (a worker each), loaded in turn: each
    round, ``segments`` turns of ``requests / segments`` requests per handler (the order
    turned by one each turn), so that the machine's drift over minutes, which made
    separate runs of the same code differ by 10-20%, falls on every handler alike."""
    names = {handler: package(work, handler) for handler in handlers}
    runs = []
    per_segment = requests // segments
    with server(work, "interleaved") as ts:
        abs_ = {handler: serve(ts, names[handler], body) for handler in handlers}
        for round_ in range(1, rounds + 1):
            done = dict.fromkeys(handlers, 0.0)
            seconds = dict.fromkeys(handlers, 0.0)
            cpu = {h: {"frontend": 0.0, "workers": 0.0} for h in handlers}
            times = {h: work / f"round-{round_}-{h}.tsv" for h in handlers}
            for segment in range(segments):
                turn = (round_ - 1 + segment) % len(handlers)
                for handler in handlers[turn:] + handlers[:turn]:
                    part = work / "segment.tsv"
                    before = bench_lib.cpu_seconds(ts)
                    summary = load(abs_[handler], per_segment, part, f"round {round_} {handler}")
                    after = bench_lib.cpu_seconds(ts)
                    done[handler] += summary["complete_requests"]
                    seconds[handler] += summary["complete_requests"] / summary["requests_per_s"]
                    for side in before:
                        cpu[handler][side] += after[side] - before[side]
                    text = part.read_text()
                    if times[handler].exists():  # ab -g starts each file with a header
                        text = text.split("\n", 1)[1]
                    with times[handler].open("a") as f:
                        f.write(text)
            for handler in handlers:
                ms = parse_gnuplot(times[handler].read_text())
                row = result(handler, done[handler], seconds[handler], ms, cpu[handler])
                print(
                    f"round {round_} {handler}",
                    {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()},
                )
                runs.append({"round": round_, **row})
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--body", default="720px", choices=list(corpus.SPECS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--handlers", nargs="+", default=list(HANDLERS[:3]), choices=HANDLERS)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="SEGMENTS",
        help="one TorchServe serving every handler, each round loading them in turn in "
        "SEGMENTS parts of --requests / SEGMENTS (0: each handler on its own server, in one go)",
    )
    args = parser.parse_args()
    handlers = ["upstream", *(h for h in args.handlers if h != "upstream")]
    work = bench_lib.scratch_dir("same_stages_")
    body = corpus.write(work / "bodies")[args.body]
    runs = []
    if args.interleave:
        runs = run_interleaved(work, handlers, body, args.requests, args.interleave, args.rounds)
    for round_ in range(1, args.rounds + 1 if not args.interleave else 1):
        turn = (round_ - 1) % len(handlers)  # no handler always first, or after the same one
        for handler in handlers[turn:] + handlers[:turn]:
            runs.append(
                {
                    "round": round_,
                    **run(work, handler, body, args.requests, f"round {round_} {handler}"),
                }
            )
    medians = {
        handler: {
            key: statistics.median(r[key] for r in runs if r["handler"] == handler)
            for key in runs[0]
            if key not in ("round", "handler")
        }
        for handler in handlers
    }
    ratios = round_ratios(runs, handlers)
    for handler, row in medians.items():
        ratio = row["requests_per_s"] / medians["upstream"]["requests_per_s"]
        p99 = row["p99_ms"] / medians["upstream"]["p99_ms"]
        print(
            f"{handler}: median {row['requests_per_s']:.1f} req/s ({ratio:.2f}x upstream), "
            f"P99 {row['p99_ms']:.0f} ms ({p99:.2f}x), "
            f"CPU ms per request: frontend {row['frontend_cpu_ms_per_request']:.2f}, "
            f"worker {row['workers_cpu_ms_per_request']:.2f}"
        )
        if handler in ratios:
            rows = ratios[handler]
            print(f"  per round, throughput: {[round(r['requests_per_s'], 2) for r in rows]}")
            print(f"  per round, P99: {[round(r['p99_ms'], 2) for r in rows]}")
    bench_lib.save_json(
        args.out,
        "results.json",
        {
            "body": args.body,
            "requests": args.requests,
            "rounds": args.rounds,
            "interleave": args.interleave,
            "commit": commit(),
            "medians": medians,
            "round_ratios_to_upstream": ratios,
            "runs": runs,
        },
    )
    return 0


def round_ratios(
    runs: list[dict[str, Any]], handlers: list[str]
) -> dict[str, list[dict[str, float]]]:
    """Each handler's throughput and P99 over upstream's, round by round."""
    upstream = {r["round"]: r for r in runs if r["handler"] == "upstream"}
    return {
        handler: [
            {
                "round": r["round"],
                "requests_per_s": r["requests_per_s"] / upstream[r["round"]]["requests_per_s"],
                "p99_ms": r["p99_ms"] / upstream[r["round"]]["p99_ms"],
            }
            for r in runs
            if r["handler"] == handler
        ]
        for handler in handlers
        if handler != "upstream"
    }


def commit() -> str:
    """The checkout's commit, "+dirty" when it has changes: what the workers ran."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "ts_microbatch", "handlers"],
        capture_output=True,
        text=True,
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    raise SystemExit(main())
