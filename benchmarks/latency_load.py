#!/usr/bin/env python3
"""Latency against offered load, open loop: the study behind README's latency table.

    make bench-latency [WORKLOAD=compute] [ROUNDS=3] [TUNED=model-config.yaml]
    python benchmarks/latency_load.py --workload compute --rates 30:390:60 --rounds 3 \\
        [--tuned model-config.yaml] --out benchmarks/results/latency_load/compute

A production service runs below saturation, under a latency objective: there the frontend's
window and batch size set most of a request's latency. This serves one workload, each
variant on a fresh TorchServe, rounds in a seeded shuffled order, each run an open-loop
sweep of Poisson rates (ts_microbatch.tools.curves, the same as ``ts-microbatch-benchmark
--rates``). The image workloads are benchmarks/compare.py's on its 720px photo
(``compute``: the accelerator stand-in with a mean over its input; ``resnet18``: untrained
ResNet-18):

* ``plain-w<ms>``: TorchServe's image_classifier without micro-batching, torch's default
  intra-op threads; ``plain1-w<ms>`` the same at one intra-op thread;
* ``upstream-w<ms>``: ImageClassifier under upstream's ``MicroBatching`` (0.12.0);
* ``ours-w<ms>``: the image example as it ships (its micro_batching.json), at each window;
* ``ours-tuned``: with ``--tuned``, the example with the frontend settings and micro-batching
  section ``ts-microbatch-tune --slo-p99-ms`` wrote.

``text`` is benchmarks/text_lengths.py's (``make bench-text``): the BERT example on the
long-tailed mix of token lengths (70% 8-64, 25% 65-256, 5% 257-512), ``plain`` its handler
without micro-batching, ``upstream`` the example's stages under upstream's ``MicroBatching``
at micro-batch 4 (threads 1/1/1), ``ours`` the example as it ships (length order, a token
budget of 2048); its objective is P99 within 250 ms.

``tabular`` is the fraud scorer example (examples/tabular_scorer: an MLP over 128 JSON
features) on its corpus of 512 bodies, ``plain`` and ``upstream`` its stages without
micro-batching and under upstream's ``MicroBatching`` at its micro-batch size
(benchmarks/tabular_workload.py); its objective is P99 within 25 ms, about twice a lone
request's latency at the 5 ms window (11 ms median; 61 ms at 50 ms), so only windows well
under 25 ms can hold it.

Every model keeps batchSize 32 unless tuned. Each point lasts ``--rate-seconds`` and at
least ``--min-answers`` requests (1,500: a P99 with 15 answers above it), and is run once
more when other processes took CPU meanwhile (ts_microbatch.tools.curves). The generator asks
for niceness ``--nice`` (-10 unless given: this study runs on a machine of its own, where a
generator ahead of the server keeps its schedule; beside a TorchServe that serves others it
would take their cores, so the tools never do it unasked), and report.md says at what
niceness it ran. report.md gives, per variant and round, the highest rate held with P99
within ``--slo-p99-ms`` (nothing lost), the P99 with its 95% interval at 25/50/75% of ours'
capacity (the most the shipped window's variant, ``ours-w2``, answered per second in any
point; a point past capacity may answer more than it is offered while its backlog drains,
so read capacity off the curves too), the ratios of rates held, and P99 at equal offered
load, each window of ours against upstream's and plain's best (plain at either intra-op
setting), called a win or a loss only when the ratio's interval excludes 1; and each
round's floor: ``--floor-requests`` (else ``--min-answers``) requests sent one at a time
after the warm-up (one request's latency on the idle server, its window included, P99 with
its interval), with the P99 at 25% of capacity over it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import compare  # noqa: E402
import text_lengths  # noqa: E402
from tabular_workload import tabular_models  # noqa: E402

from ts_microbatch.tools import curves  # noqa: E402
from ts_microbatch.tools._cli import counts  # noqa: E402
from ts_microbatch.tools.corpus import Corpus, read_corpus  # noqa: E402
from ts_microbatch.tools.curve_report import (  # noqa: E402
    by_round,
    compare_curves,
    format_comparisons,
    rounds_of,
    write_curves,
)
from ts_microbatch.tools.intervals import MIN_ANSWERS  # noqa: E402
from ts_microbatch.tools.mar import PLAIN_OVERRIDE, override_mar  # noqa: E402
from ts_microbatch.tools.measure import measure  # noqa: E402
from ts_microbatch.tools.openloop import GENERATOR_NICE  # noqa: E402
from ts_microbatch.tools.runs import round_order  # noqa: E402

SHIPPED_WINDOW = 2  # the image example's model-config.yaml
MODELS = {"plain": "plain", "upstream": "upstream", "ours": "head-example"}
# ``plain1``: the plain handler with torch at one intra-op thread (its server's workers get
# OMP_NUM_THREADS=1). Torch's default (a thread a core) spins its idle threads: on a small
# model the plain handler cost about three times the worker CPU a request that it costs at
# one thread, so the fair baseline is whichever of the two serves more.
MODELS["plain1"] = MODELS["plain"]
ENV = {"plain1": {"OMP_NUM_THREADS": "1"}}
# Per workload: the rates swept (10% of ours' capacity to past it, measured on this
# machine), the objective, and what the bodies are.
WORKLOADS: dict[str, dict[str, Any]] = {
    "idle": {"rates": "30:390:60", "slo_p99_ms": 100.0, "label": "idle, 720px"},
    "compute": {"rates": "30:390:60", "slo_p99_ms": 100.0, "label": "compute, 720px"},
    "resnet18": {"rates": "4:40:4", "slo_p99_ms": 100.0, "label": "ResNet-18, 720px"},
    "text": {"rates": "10:130:20", "slo_p99_ms": 250.0, "label": "BERT, long-tailed text"},
    "tabular": {"rates": "250:3250:500", "slo_p99_ms": 25.0, "label": "fraud scorer MLP, JSON"},
}
TEXT_UPSTREAM_MICRO_BATCH = 4  # upstream's best on this mix at saturation (text_lengths)


def variants(
    windows: dict[str, list[int]], tuned: Path | None, batch_sizes: list[int] | None = None
) -> dict[str, tuple[str, Any]]:
    """name -> (model built by compare.package, (section override or None, frontend)).
    With ``batch_sizes``, ours at each window and each of them, ``ours-w<ms>-b<size>``
    (else at the .mar's batchSize)."""
    out: dict[str, tuple[str, Any]] = {}
    for model, model_windows in windows.items():
        for window in model_windows:
            if model == "ours" and batch_sizes:
                for size in batch_sizes:
                    frontend = {"maxBatchDelay": window, "batchSize": size}
                    out[f"ours-w{window}-b{size}"] = (MODELS[model], (None, frontend))
                continue
            out[f"{model}-w{window}"] = (MODELS[model], (None, {"maxBatchDelay": window}))
    if tuned is not None:
        chosen = yaml.safe_load(tuned.read_text())
        frontend = {"batchSize": chosen["batchSize"], "maxBatchDelay": chosen["maxBatchDelay"]}
        out["ours-tuned"] = (MODELS["ours"], (chosen["micro_batching"], frontend))
    return out


def capacity(rows: list[dict[str, Any]], name: str) -> float:
    return max(
        (p["achieved_per_s"] for r in rows if r["handler"] == name for p in r["curve"]), default=0.0
    )


def nearest_points(rows: list[dict[str, Any]], name: str, rate: float) -> tuple[float, list[Any]]:
    """The offered rate of ``name``'s points nearest ``rate`` (NaN: none), and each round's
    (run, its point there or None: that round stopped before it), in round order."""
    runs = sorted((r for r in rows if r["handler"] == name), key=lambda r: r["repeat"])
    offered = {p["offered_per_s"] for r in runs for p in r["curve"]}
    nearest = min(offered, key=lambda o: abs(o - rate), default=math.nan)
    return nearest, [
        (r, next((p for p in r["curve"] if p["offered_per_s"] == nearest), None)) for r in runs
    ]


def p99_near(rows: list[dict[str, Any]], name: str, rate: float) -> str:
    """Each round's P99 with its 95% interval at the offered rate nearest ``rate``, ms, in
    round order ("-": that round stopped before it); "-" when ``name`` has no point."""
    nearest, at = nearest_points(rows, name, rate)

    def shown(p: dict[str, Any] | None) -> str:
        if p is None:
            return "-"
        if "p99_low_ms" not in p:
            return f"{p['p99_ms']:.0f}"
        return f"{p['p99_ms']:.0f} [{p['p99_low_ms']:.0f}, {p['p99_high_ms']:.0f}]"

    return "-" if math.isnan(nearest) else f"{nearest:g}/s: " + " · ".join(shown(p) for _, p in at)


def floor_near(rows: list[dict[str, Any]], name: str, rate: float) -> str:
    """Each round's floor (one request at a time, after its warm-up: P99 [95% interval]) and
    the P99 at the offered rate nearest ``rate`` over it; "-" for a round without one."""

    def shown(run: dict[str, Any], p: dict[str, Any] | None) -> str:
        if not (alone := run.get("floor")):
            return "-"
        cell = f"{alone['p99_ms']:.0f} [{alone['p99_low_ms']:.0f}, {alone['p99_high_ms']:.0f}]"
        return cell + (f" ({p['p99_ms'] / alone['p99_ms']:.2f}x)" if p else "")

    nearest, at = nearest_points(rows, name, rate)
    return "-" if math.isnan(nearest) else " · ".join(shown(run, p) for run, p in at)


PLAIN = ("plain-", "plain1-")  # plain at either intra-op setting: one baseline


def best(
    names: list[str],
    median: dict[tuple[str, float], float],
    prefix: str | tuple[str, ...],
    slo: float,
) -> str:
    """The variant of a family (``prefix``) that held the most within ``slo`` (median over
    rounds of each round's rate held); "" when the family was not run."""
    family = [n for n in names if n.startswith(prefix)]
    return max(family, key=lambda n: median[n, slo], default="")


def equal_load_pairs(
    names: list[str], median: dict[tuple[str, float], float], slo: float
) -> list[tuple[str, str]]:
    """Each window of ours against upstream's and plain's best (rates held within ``slo``):
    the window to ship is read off these."""
    others = [best(names, median, family, slo) for family in ("upstream-", PLAIN)]
    ours = [n for n in names if n.startswith("ours-")]
    return [(mine, other) for mine in ours for other in others if other]


def report(
    rows: list[dict[str, Any]], names: list[str], slos: list[float], info: dict[str, Any]
) -> str:
    """The table: per variant, the rate held within each objective of ``slos`` (the first
    is the study's) and P99 at 25/50/75% of ours' capacity; then the ratios per objective."""
    held = {
        (n, slo): sorted(curves.sustained(r["curve"], slo) for r in rows if r["handler"] == n)
        for n in names
        for slo in slos
    }
    median = {(n, slo): _median_held(rows, n, slo) for n in names for slo in slos}
    shipped = f"ours-w{SHIPPED_WINDOW}"
    reference = (
        shipped
        if shipped in names
        else max(
            (n for n in names if n.startswith("ours-")),
            key=lambda n: capacity(rows, n),
            default=shipped,
        )
    )
    ours_capacity = capacity(rows, reference)
    within = " | ".join(f"held within P99 {slo:g} ms, req/s (median; per round)" for slo in slos)
    niceness = sorted({p.get("generator_nice") for r in rows for p in r["curve"]} - {None})
    asked = info.get("nice")
    nice = (
        f"the generator asked for niceness {asked} and ran at {', '.join(map(str, niceness))}"
        if asked is not None
        else "the generator at its own priority"
    )
    lines = [
        f"# Latency against offered load: {info['label']}, open loop",
        "",
        f"{info['rounds']} rounds (seed {info['seed']}), {info['seconds']} s a rate and at "
        f"least {info.get('min_answers', 50)} requests, 2 cores; {nice}; ours' capacity (most "
        f"answered/s of {reference}): {ours_capacity:.0f} req/s.",
        "",
        f"| variant | {within} | P99 at 25% / 50% / 75% of ours' capacity, ms, "
        "each round [95% interval] | one at a time: P99 ms [95% interval] (P99 at 25% over it), "
        "each round |",
        "|---|" + "---|" * (len(slos) + 2),
    ]
    for name in names:
        shown = " / ".join(p99_near(rows, name, f * ours_capacity) for f in (0.25, 0.5, 0.75))
        cells = " | ".join(
            f"**{median[name, slo]:g}** ({', '.join(f'{v:g}' for v in held[name, slo])})"
            for slo in slos
        )
        lines.append(
            f"| {name} | {cells} | {shown} | {floor_near(rows, name, ours_capacity / 4)} |"
        )
    lines.append("")

    for slo in slos:
        ours, upstream, plain = (
            median.get((best(names, median, p, slo), slo), 0.0)
            for p in ("ours-", "upstream-", PLAIN)
        )
        lines.append(
            f"Within P99 {slo:g} ms, ours at its best against upstream at its best window: "
            f"{ours / upstream if upstream else float('inf'):.2f}x; against plain: "
            f"{ours / plain if plain else float('inf'):.2f}x (rates held)."
        )
    pairs = equal_load_pairs(names, median, slos[0])
    if pairs:
        lines += ["", "P99 at equal offered load, each family at its best within P99 "
                  f"{slos[0]:g} ms (95% bootstrap interval; a win or a loss only when it "
                  "excludes 1):", "", format_comparisons(compare_curves(rows, pairs))]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="compute")
    parser.add_argument("--rates", type=curves.parse_rates, help="default: the workload's")
    parser.add_argument("--rate-seconds", type=float, default=5.0)
    answers = "requests a point offers at least, whatever --rate-seconds (default %(default)s)"
    parser.add_argument("--min-answers", type=int, default=MIN_ANSWERS, help=answers)
    parser.add_argument("--floor-requests", type=counts, help=curves.FLOOR_HELP)
    parser.add_argument(
        "--nice",
        type=int,
        default=GENERATOR_NICE,
        help="the generator's niceness during each point (default %(default)s, when allowed: "
        "ahead of the server it measures; beside a TorchServe serving others, 0)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slo-p99-ms", type=float, help="default: the workload's")
    parser.add_argument("--windows", default="plain:5;plain1:5;upstream:5,50;ours:1,2,5,50")
    parser.add_argument(
        "--batch-sizes", default="", help="ours at each of these batchSize values, comma-separated"
    )
    parser.add_argument("--tuned", type=Path, help="a model-config.yaml from the SLO tuner")
    parser.add_argument(
        "--also-p99-ms", default="", help="more objectives for report.md, ms, comma-separated"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite report.md from --out's runs.jsonl"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    args.rates = args.rates or curves.parse_rates(workload["rates"])
    args.slo_p99_ms = args.slo_p99_ms or workload["slo_p99_ms"]
    pairs = [part.split(":") for part in args.windows.split(";")]
    ok = all(len(p) == 2 and p[0] in MODELS for p in pairs)
    if not ok or not all(w.isdigit() for p in pairs for w in p[1].split(",")):
        parser.error(f"--windows: expected MODEL:MS[,MS...];... with MODEL in {list(MODELS)}")
    windows = {m: [int(w) for w in ws.split(",")] for m, ws in pairs}
    sizes = [int(v) for v in args.batch_sizes.split(",") if v]
    chosen = variants(windows, args.tuned, sizes)
    args.slos = [args.slo_p99_ms] + [float(v) for v in args.also_p99_ms.split(",") if v]
    if args.report_only:
        write_report(args, [json.loads(line) for line in (args.out / "runs.jsonl").open()])
        return
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tsmb-latency-"))
    try:
        run(args, chosen, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def image_models(workload: str, models: set[str], work: Path) -> tuple[dict[str, Path], Corpus]:
    """compare.py's models on ``workload`` (model directories) and its 720px photo."""
    sides = {"head": compare.checkout("head", compare.WORKTREE, work / "head")}
    built = work / "built"
    for model in sorted(models):
        compare.package(built, work / "build", model, workload, sides)
    compare.write_bodies(work, ["720px"])
    body_path, _ = compare.bodies()["720px"]
    corpus = read_corpus(body_path.rename(body_path.with_suffix(".jpg")))
    return {model: built / f"{model}-{workload}" for model in models}, corpus


def text_models(models: set[str], work: Path) -> tuple[dict[str, Path], Corpus]:
    """The BERT example's .mar (built if missing) as text_lengths.py serves it: as packaged
    (``head-example``), with its plain handler (``plain``) and under upstream's
    ``MicroBatching`` (``upstream``); and its long-tailed corpus."""
    mar = text_lengths.ROOT / "model_store" / "bert_mb.mar"
    text_lengths.ensure_mar(mar)
    text_lengths.write_corpora(work / "corpora", ["long_tail"])
    swaps = {
        "plain": (PLAIN_OVERRIDE, text_lengths.PLAN["baseline_handler"]),
        "upstream": (
            text_lengths.upstream_override(TEXT_UPSTREAM_MICRO_BATCH),
            text_lengths.PLAN["upstream_handler"],
        ),
    }
    sources: dict[str, Path] = {}
    for model in models:
        if model in swaps:
            override, handler = swaps[model]
            sources[model] = work / "built" / f"{model}-text.mar"
            override_mar(mar, sources[model], override, None, text_lengths.ROOT / handler)
        else:
            sources[model] = mar
    return sources, read_corpus(work / "corpora" / "long_tail")


def run(args: argparse.Namespace, chosen: dict[str, tuple[str, Any]], work: Path) -> None:
    models = {model for model, _ in chosen.values()}
    if args.workload == "text":
        sources, corpus = text_models(models, work)
    elif args.workload == "tabular":
        sources, corpus = tabular_models(models, work)
    else:
        sources, corpus = image_models(args.workload, models, work)
    store = work / "store"
    for name, (model, (section, frontend)) in chosen.items():
        override_mar(sources[model], store / f"{name}.mar", section, frontend)
    first = corpus.bodies[0]
    config = {"warmup_requests": 300, "response_timeout": 120}
    rows: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        for name in round_order(list(chosen), round_no + 1, args.seed):
            # Registered with its own window: TorchServe 0.12 takes the registration's
            # maxBatchDelay over the .mar's model-config.yaml.
            frontend = chosen[name][1][1]
            point = {
                "batch_size": frontend.get("batchSize", 32),
                "max_batch_delay": frontend.get("maxBatchDelay", 50),
                "concurrency": 64,
                "requests": 1,
                "workers": 1,
            }
            sender = curves.CurveSender(
                corpus, args.rates, args.rate_seconds, 64, print, args.seed, nice=args.nice,
                min_answers=args.min_answers, floor_requests=curves.floor_count(args),
            )  # fmt: skip
            label = f"[round {round_no + 1}/{args.rounds}] {name}"
            print(f"{label}: starting TorchServe", flush=True)
            result = measure(
                work / "servers" / f"{name}-{round_no}",
                store,
                name,
                config,
                point,
                label,
                args.out / "metrics" / f"{name}-{round_no}.prom",
                sender,
                (first.data, first.content_type),
                archive=f"{name}.mar",
                env=ENV.get(name.rsplit("-w", 1)[0]),
            )
            rows.append(
                {
                    "handler": name,
                    "repeat": round_no + 1,
                    "curve": result["curve"],
                    "floor": result.get("floor"),
                    "served_frontend": result["served_frontend"],
                    "cpu": {k: v for k, v in result.items() if "cpu" in k},
                }
            )
            with (args.out / "runs.jsonl").open("a") as runs:
                runs.write(json.dumps(rows[-1], default=str) + "\n")
    write_report(args, rows, {n: v[1] for n, v in chosen.items()})


def _median_held(rows: list[dict[str, Any]], name: str, slo: float) -> float:
    held = sorted(curves.sustained(r["curve"], slo) for r in rows if r["handler"] == name)
    return held[len(held) // 2] if held else 0.0


def plot(rows: list[dict[str, Any]], path: Path, title: str, slo_p99_ms: float) -> None:
    """P99 against offered load on a log scale, each round of each variant its own line
    (one colour a variant), with its 95% interval as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = ["-", "--", ":", "-."]
    for index, (name, rates) in enumerate(by_round(rows).items()):
        for k, n in enumerate(rounds_of(rows, name)):
            points = [rates[r][n] for r in sorted(rates) if n in rates[r]]
            finite = [p for p in points if math.isfinite(p["p99_ms"])]
            if not finite:  # lost past its P99 at every rate: nothing to draw
                continue
            ys = [p["p99_ms"] for p in finite]
            low = [y - min(y, p.get("p99_low_ms", y)) for y, p in zip(ys, finite)]
            high = [
                (p.get("p99_high_ms", y) - y) if math.isfinite(p.get("p99_high_ms", y)) else 0.0
                for y, p in zip(ys, finite)
            ]
            ax.errorbar(
                [p["offered_per_s"] for p in finite], ys, yerr=[low, high],
                color=f"C{index % 10}", linestyle=styles[k % len(styles)], marker="o",
                markersize=3, capsize=2, label=f"{name}, round {n}",
            )  # fmt: skip
    ax.axhline(slo_p99_ms, color="grey", linestyle="--", label=f"P99 {slo_p99_ms:g} ms")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s, Poisson, open loop)")
    ax.set_ylabel("P99 latency from the scheduled send (ms), 95% interval")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    args: argparse.Namespace, rows: list[dict[str, Any]], served: dict[str, Any] | None = None
) -> None:
    """curves (json, md), p99.png, report.md and, after a run (``served``), plan.json."""
    info = {
        "workload": args.workload,
        "label": WORKLOADS[args.workload]["label"],
        "rates": args.rates,
        "slo_p99_ms": args.slo_p99_ms,
        "rounds": args.rounds,
        "seed": args.seed,
        "seconds": args.rate_seconds,
        "min_answers": args.min_answers,
        "floor_requests": curves.floor_count(args),
        "nice": args.nice,
        "variants": served,
    }
    if served is None:  # --report-only: the plan the runs were made with
        info = json.loads((args.out / "plan.json").read_text())
        info.setdefault("label", WORKLOADS[info["workload"]]["label"])
    names = list(dict.fromkeys([*(info["variants"] or {}), *(row["handler"] for row in rows)]))
    text = report(rows, names, args.slos, info)
    held = {(n, args.slos[0]): _median_held(rows, n, args.slos[0]) for n in names}
    pairs = equal_load_pairs(names, held, args.slos[0])
    write_curves(args.out, rows, args.slo_p99_ms, pairs=pairs)
    (args.out / "report.md").write_text(text)
    if served is not None:
        (args.out / "plan.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    plot(rows, args.out / "p99.png", info["label"], args.slo_p99_ms)  # last: needs matplotlib
    print("\n" + text)


if __name__ == "__main__":
    main()
