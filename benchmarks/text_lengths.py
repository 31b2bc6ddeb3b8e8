#!/usr/bin/env python3
"""Text of variable length: the BERT example through a real TorchServe, ours (length order
and a token budget) against ours in arrival order, upstream's MicroBatching on the same
handler stages and the plain handler, on three corpora whose lengths are in tokens.

    python benchmarks/text_lengths.py run [--rounds 3] [--lock FILE]   # make bench-text, ~30 min

``run`` builds the example's .mar if missing, writes the corpora into the run directory
(benchmarks/runs/text-lengths-<time>), sweeps our length settings for one round on the
long-tailed mix and packs the fastest as "ours", runs each load of the plan through
benchmark-ab.py --mar (every TorchServe run under ``flock LOCK`` with ``--lock``) and ends
with ``report``. The plan (corpora, sweep, loads, variants, ratios, targets) is
benchmarks/configs/text_lengths.json. The steps alone:

    python benchmarks/text_lengths.py corpus --mix "70:8-64,25:65-256,5:257-512" --count 500 \\
        --out corpora/long_tail [--tokenizer build/bert_mb/model]
    python benchmarks/text_lengths.py pick RUN/sweep --mar bert_mb.mar --out RUN/bert_ours.mar
    python benchmarks/text_lengths.py report RUN --out benchmarks/results/text_lengths

``corpus``: ``--mix`` is ``PERCENT:MIN-MAX`` words, comma-separated; each bin gets its share
of ``--count`` bodies (largest remainders), each body a length drawn evenly from its bin, its
text from examples/bert_classifier/texts.py's ``make_text(seed, n_words)`` (``--generator
module:function`` names another). Files are ``<index>-<words>w.txt``; the same arguments
write the same files. With ``--tokenizer DIR`` (a ``save_pretrained`` tokenizer) the mix is
in TOKENS as the model sees them, [CLS] and [SEP] included (what the example's
``item_length`` counts): each body is the longest text of its seed whose token count is at
most the length drawn, in ``<index>-<tokens>t.txt``.

``pick`` writes the .mar with the sweep's fastest override. ``report`` gathers the runs of
every load into results.json, results.csv, tables.md and plot.png: medians, per-round ratios
(taken within a round, their median the headline), CPU per request of the server and the
load generator, which share the 2 cores (the machine's bound for a variant is 2 cores / its
CPU per request), the useful-token share, and each target met or not.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from ts_microbatch.tools.mar import override_mar  # noqa: E402

PLAN: dict[str, Any] = json.loads((HERE / "configs" / "text_lengths.json").read_text())
LOADS = tuple(load["name"] for load in PLAN["loads"])
ORDER = tuple(PLAN["order"])
# (numerator, denominator, what it says); "better" is the faster of plain and upstream4 in
# that round.
PAIRS = tuple(tuple(pair) for pair in PLAN["pairs"])
TARGETS = tuple(tuple(target) for target in PLAN["targets"])
CORES = 2
BINS = ((8, 64), (65, 256), (257, 512))
DEFAULT_GENERATOR = "examples.bert_classifier.texts:make_text"

# -- corpora ---------------------------------------------------------------------------------


def parse_mix(text: str) -> list[tuple[float, int, int]]:
    """``"70:8-64,30:65-128"`` -> [(70.0, 8, 64), (30.0, 65, 128)]."""
    bins = []
    for part in text.split(","):
        try:
            share, span = part.split(":")
            low, high = (int(v) for v in span.split("-"))
            bins.append((float(share), low, high))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"got {part!r}, expected PERCENT:MIN-MAX words (e.g. 70:8-64)"
            ) from None
        if bins[-1][0] <= 0 or not 1 <= low <= high:
            raise argparse.ArgumentTypeError(
                f"got {part!r}, expected a share > 0 and 1 <= MIN <= MAX"
            )
    return bins


def counts(total: int, shares: list[float]) -> list[int]:
    """``total`` split by ``shares`` (largest remainders)."""
    raw = [total * s / sum(shares) for s in shares]
    parts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - parts[i], reverse=True):
        if sum(parts) >= total:
            break
        parts[i] += 1
    return parts


def lengths(mix: list[tuple[float, int, int]], total: int, seed: int) -> list[int]:
    """Every body's length in words, bin after bin."""
    rng = random.Random(seed)
    n_per_bin = counts(total, [share for share, _, _ in mix])
    return [rng.randint(low, high) for (_, low, high), n in zip(mix, n_per_bin) for _ in range(n)]


def write_corpus(
    out: Path,
    mix: list[tuple[float, int, int]],
    total: int,
    make_text: Callable[[int, int], str],
    seed: int = 0,
) -> list[Path]:
    """The corpus as ``out/<index>-<words>w.txt``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n_words in enumerate(lengths(mix, total, seed)):
        path = out / f"{i:05d}-{n_words}w.txt"
        path.write_text(make_text(seed * 1_000_003 + i, n_words), encoding="utf-8")
        paths.append(path)
    return paths


def fit_tokens(
    make_text: Callable[[int, int], str], count_tokens: Callable[[str], int], seed: int, target: int
) -> tuple[str, int]:
    """The text of ``seed`` with the most words whose token count is at most ``target``
    (one word if even that is longer), and its token count. Counts grow with words, so a
    binary search over the word count finds it. A last word of several tokens can leave
    the count a little under ``target``, even under its bin: ``describe`` says so."""
    low, high = 1, max(1, target)  # a word is at least one token
    best = make_text(seed, 1)
    best_count = count_tokens(best)
    while low <= high:
        words = (low + high) // 2
        text = make_text(seed, words)
        count = count_tokens(text)
        if count <= target:
            if count >= best_count or best_count > target:
                best, best_count = text, count
            low = words + 1
        else:
            high = words - 1
    return best, best_count


def write_token_corpus(
    out: Path,
    mix: list[tuple[float, int, int]],
    total: int,
    make_text: Callable[[int, int], str],
    count_tokens: Callable[[str], int],
    seed: int = 0,
) -> list[tuple[Path, int]]:
    """The corpus as ``out/<index>-<tokens>t.txt``, lengths drawn in tokens; the paths
    written with their real token counts."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, target in enumerate(lengths(mix, total, seed)):
        text, count = fit_tokens(make_text, count_tokens, seed * 1_000_003 + i, target)
        path = out / f"{i:05d}-{count}t.txt"
        path.write_text(text, encoding="utf-8")
        written.append((path, count))
    return written


def token_counter(tokenizer_dir: Path) -> Callable[[str], int]:
    """Tokens of a text as a ``save_pretrained`` tokenizer makes them, special ones included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return lambda text: len(tokenizer(text)["input_ids"])


def describe(counts: list[int], mix: list[tuple[float, int, int]]) -> str:
    """The real distribution: per bin of the mix, its share and min/median/max."""
    lines = []
    for _, low, high in mix:
        inside = sorted(c for c in counts if low <= c <= high)
        if inside:
            lines.append(
                f"  {low}-{high}: {len(inside)} bodies ({len(inside) / len(counts):.0%}), "
                f"min {inside[0]}, median {inside[len(inside) // 2]}, max {inside[-1]}"
            )
    outside = [c for c in counts if not any(lo <= c <= hi for _, lo, hi in mix)]
    if outside:
        lines.append(f"  outside the bins: {len(outside)} bodies {sorted(outside)[:10]}")
    return "\n".join(lines)


def load_generator(spec: str) -> Callable[[int, int], str]:
    module, _, name = spec.partition(":")
    sys.path.insert(0, str(ROOT))
    generator: Callable[[int, int], str] = getattr(importlib.import_module(module), name)
    return generator


# -- the run ---------------------------------------------------------------------------------


def pick(sweep: Path, mar: Path, out: Path) -> dict[str, Any]:
    """The sweep's fastest variant (its median run's throughput); ``out``: ``mar`` with its
    override (none for "ours", the .mar as packaged). Writes ``out``.choice.json."""
    data = json.loads((sweep / "results.json").read_text())
    best = max(data["results"], key=lambda row: row["requests_per_s"])
    override = data["variants"][best["handler"]]["override"]
    effective = override_mar(mar, out, override)
    choice = {
        "variant": best["handler"],
        "override": override,
        "micro_batching": effective,
        "sweep": {r["handler"]: round(r["requests_per_s"], 1) for r in data["results"]},
    }
    Path(f"{out}.choice.json").write_text(json.dumps(choice, indent=2) + "\n")
    print(f"picked {best['handler']} ({choice['sweep']}): {json.dumps(effective)}")
    return choice


def upstream_override(micro_batch_size: int) -> dict[str, Any]:
    """The micro_batching section upstream's handler reads: our pipeline off, upstream's at
    ``micro_batch_size`` with the plan's threads."""
    return {"enabled": False, "micro_batch_size": micro_batch_size, "parallelism": PLAN["threads"]}


def ensure_mar(mar: Path) -> None:
    """The example's .mar at ``mar`` and the tokenizer the corpora count with, built when
    either is missing (the latency study, benchmarks/latency_load.py, builds it here too)."""
    if not mar.exists() or not (ROOT / PLAN["tokenizer"]).is_dir():
        build = [sys.executable, "examples/bert_classifier/build_mar.py"]
        build += ["--export-path", str(mar.parent), "--model-name", mar.stem]
        build += ["--model-config", "examples/bert_classifier/model-config.yaml"]
        subprocess.run(build, cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def write_corpora(out: Path, names: list[str]) -> None:
    """The plan's corpora ``names`` as ``out/<name>/``, lengths in the example's tokens."""
    make_text = load_generator(DEFAULT_GENERATOR)
    count_tokens = token_counter(ROOT / PLAN["tokenizer"])
    for name in names:
        spec = PLAN["corpora"][name]
        mix = parse_mix(spec["mix"])
        written = write_token_corpus(
            out / name, mix, spec["count"], make_text, count_tokens, spec["seed"]
        )
        print(f"corpus {name}: {len(written)} bodies; tokens per body:")
        print(describe([count for _, count in written], mix))


def load_arguments(load: dict[str, Any]) -> list[str]:
    """benchmark-ab.py's variants for one load: upstream at each micro-batch size on the
    example's stages (and ours in arrival order at the same size, same threads), or the
    load's own overrides beside ours."""
    threads = PLAN["threads"]
    args = ["--baseline-handler", PLAN["baseline_handler"]]
    for n in load["sizes"]:
        upstream = upstream_override(n)
        args += [
            "--handler-variant",
            f"upstream{n}={PLAN['upstream_handler']}:{json.dumps(upstream)}",
        ]
        if load["arrival"]:
            arrival = {"order": "arrival", "max_micro_batch_tokens": None, "micro_batch_size": n}
            args += ["--variant", f"arrival{n}={json.dumps({**arrival, 'parallelism': threads})}"]
    for name, override in load.get("variants", {}).items():
        args += ["--variant", f"{name}={json.dumps(override)}"]
    return args


def ab_command(
    run_dir: Path, out: str, mar: Path, load: dict[str, Any], rounds: int, extra: Sequence[str]
) -> list[str]:
    """benchmark-ab.py --mar on one load of the plan (its corpus, batch size, clients and
    requests; its own rounds or ``rounds``), results in ``run_dir/out``."""
    cmd = [sys.executable, "benchmarks/benchmark-ab.py", *PLAN["load"], "--mar", str(mar)]
    cmd += ["--corpus", str(run_dir / "corpora" / load["corpus"]), *extra]
    for key in ("batch_size", "concurrency", "requests", "rounds"):
        cmd += [f"--{key.replace('_', '-')}", str(load.get(key, rounds))]
    return [*cmd, "--out", str(run_dir / out)]


def run(mar: Path, run_dir: Path, results: Path, rounds: int, lock: str | None) -> None:
    """The whole study into ``run_dir``; the summary into ``results``."""
    ensure_mar(mar)
    write_corpora(run_dir / "corpora", list(PLAN["corpora"]))

    def bench(out: str, source: Path, load: dict[str, Any], *extra: str) -> None:
        cmd = ab_command(run_dir, out, source, load, rounds, extra)
        subprocess.run(["flock", lock, *cmd] if lock else cmd, cwd=ROOT, check=True)

    sweep = PLAN["sweep"]
    variants = [f"--variant={n}={json.dumps(o)}" for n, o in sweep["variants"].items()]
    bench("sweep", mar, sweep, "--no-baseline", *variants)
    pick(run_dir / "sweep", mar, run_dir / "bert_ours.mar")
    for load in PLAN["loads"]:
        bench(load["name"], run_dir / "bert_ours.mar", load, *load_arguments(load))
    report(run_dir, results)


# -- the report ------------------------------------------------------------------------------


def cpu_ms(run: dict[str, Any]) -> dict[str, float]:
    server = run["workers_cpu_ms_per_request"] + run["frontend_cpu_ms_per_request"]
    client = run.get("client_cpu_ms_per_request", 0.0)
    return {"server": server, "client": client, "total": server + client}


def tokens_of(corpus: dict[str, Any]) -> dict[str, Any]:
    """The token lengths sent (from the ``-<n>t.txt`` body names), weighted by requests."""
    sent: list[int] = []
    for body in corpus["bodies"]:
        match = re.search(r"-(\d+)t\.", body["name"])
        if match:
            sent += [int(match.group(1))] * body["requests"]
    if not sent:
        return {}
    sent.sort()
    bins = {
        f"{lo}-{hi}": sum(lo <= n <= hi for n in sent) / len(sent)
        for lo, hi in BINS
        if any(lo <= n <= hi for n in sent)
    }
    return {
        "requests": len(sent),
        "min": sent[0],
        "median": statistics.median(sent),
        "mean": round(sum(sent) / len(sent), 1),
        "p95": sent[int(0.95 * (len(sent) - 1))],
        "max": sent[-1],
        "share_by_bin": bins,
    }


def ratios(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per pair: each round's throughput and P99 ratio, and their medians."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for run in runs:
        by_round.setdefault(run["repeat"], {})[run["handler"]] = run
    out: dict[str, dict[str, Any]] = {}
    for num, den, what in PAIRS:
        rounds = []
        for repeat, handlers in sorted(by_round.items()):
            if den == "better" and {"plain", "upstream4"} <= handlers.keys():
                handlers = {
                    **handlers,
                    "better": max(
                        handlers["plain"], handlers["upstream4"], key=lambda r: r["requests_per_s"]
                    ),
                }
            if num in handlers and den in handlers:
                a, b = handlers[num], handlers[den]
                rounds.append(
                    {
                        "round": repeat,
                        "throughput": a["requests_per_s"] / b["requests_per_s"],
                        "p99": a["p99_ms"] / b["p99_ms"],
                        "against": b["handler"],
                    }
                )
        if rounds:
            out[f"{num}/{den}"] = {
                "what": what,
                "rounds": rounds,
                "throughput": statistics.median(r["throughput"] for r in rounds),
                "p99": statistics.median(r["p99"] for r in rounds),
            }
    return out


def variant_rows(load: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per variant: its median-throughput run, with every round's throughput."""
    rows = []
    runs = data["runs"]
    plain = [r for r in runs if r["handler"] == "plain"]
    plain_cpu = statistics.median(cpu_ms(r)["total"] for r in plain) if plain else math.nan
    for name in sorted({r["handler"] for r in runs}, key=_order):
        group = sorted((r for r in runs if r["handler"] == name), key=lambda r: r["requests_per_s"])
        mid = group[(len(group) - 1) // 2]
        cpu = cpu_ms(mid)
        settings = data["variants"][name]["micro_batching"]
        rows.append(
            {
                "load": load,
                "corpus": load.split("-")[0],
                "batch_size": mid["batch_size"],
                "concurrency": mid["concurrency"],
                "variant": name,
                "handler": "upstream MicroBatching"
                if name.startswith("upstream")
                else ("BaseHandler.handle" if name == "plain" else "ts_microbatch"),
                "settings": _settings(name, settings),
                "requests": mid["complete_requests"],
                "errors": mid["errors"],
                "requests_per_s": mid["requests_per_s"],
                "rounds_requests_per_s": [r["requests_per_s"] for r in group],
                "p50_ms": mid["p50_ms"],
                "p99_ms": mid["p99_ms"],
                "server_cpu_ms_per_request": cpu["server"],
                "client_cpu_ms_per_request": cpu["client"],
                "cpu_ms_per_request": cpu["total"],
                "machine_use": mid["requests_per_s"] * cpu["total"] / (1000 * CORES),
                "plain_bound_requests_per_s": 1000 * CORES / plain_cpu,
                "of_plain_bound": mid["requests_per_s"] * plain_cpu / (1000 * CORES),
                "useful_token_share": mid.get("useful_token_share"),
                "mean_batch_size": mid.get("pipeline", {}).get("mean_batch_size"),
                "mean_micro_batch_size": mid.get("mean_micro_batch_size"),
            }
        )
    return rows


def _order(name: str) -> tuple[int, str]:
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def _settings(name: str, mb: dict[str, Any]) -> str:
    if name == "plain":
        return "whole batch"
    stages = "/".join(
        str((mb.get("parallelism") or {}).get(s, 1))
        for s in ("preprocess", "inference", "postprocess")
    )
    if name.startswith("upstream"):
        return f"micro-batch {mb.get('micro_batch_size')}, arrival order, threads {stages}"
    budget = mb.get("max_micro_batch_tokens")
    text = f"micro-batch {mb.get('micro_batch_size')}, {mb.get('order', 'arrival')} order"
    if budget:
        text += f", budget {budget} tokens"
    return f"{text}, threads {stages}"


def check_targets(comparisons: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for load, num, den, metric, op, goal in TARGETS:
        got = comparisons.get(load, {}).get(f"{num}/{den}")
        if got is None:
            continue
        value = got[metric]
        met = value >= goal if op == ">=" else value <= goal
        out.append(
            {
                "load": load,
                "ratio": f"{num}/{den} {metric}",
                "target": f"{op} {goal}",
                "median": value,
                "rounds": [r[metric] for r in got["rounds"]],
                "met": met,
                "missed_by": None if met else (goal / value if op == ">=" else value / goal),
            }
        )
    return out


def report(run: Path, out: Path) -> dict[str, Any]:
    """Reads ``run``'s load directories; writes ``out``/results.json, results.csv,
    tables.md and plot.png. Returns what results.json holds."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    comparisons: dict[str, dict[str, Any]] = {}
    loads: dict[str, Any] = {}
    machine = None
    for load in LOADS:
        path = run / load / "results.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        machine = machine or data.get("machine")
        rows += variant_rows(load, data)
        comparisons[load] = ratios(data["runs"])
        loads[load] = {
            "load": data["load"],
            "tokens": tokens_of(data["corpus"]),
            "variants": data["variants"],
            "not_measured": data.get("not_measured"),
            "rounds": max(r["repeat"] for r in data["runs"]),
        }
    choice_path = run / "bert_ours.mar.choice.json"
    choice = json.loads(choice_path.read_text()) if choice_path.exists() else None
    targets = check_targets(comparisons)
    result = {
        "machine": machine,
        "ours": choice,
        "loads": loads,
        "results": rows,
        "comparisons": comparisons,
        "targets": targets,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    write_csv(rows, out / "results.csv")
    (out / "tables.md").write_text(tables(rows, comparisons, targets, loads, choice))
    plot(rows, out / "plot.png")
    print((out / "tables.md").read_text())
    return result


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    keys = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))] if rows else []
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv(row[k]) for k in keys})


def _csv(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def _f(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def tables(
    rows: list[dict[str, Any]],
    comparisons: dict[str, dict[str, Any]],
    targets: list[dict[str, Any]],
    loads: dict[str, Any],
    choice: dict[str, Any] | None,
) -> str:
    lines = []
    if choice:
        lines.append(
            f"ours: `{json.dumps(choice['override'])}` over the example's config "
            f"(sweep, req/s, 1 round: {choice['sweep']})\n"
        )
    for load, info in loads.items():
        t = info["tokens"]
        lines.append(
            f"### {load}: batch {info['load']['batch_size']}, concurrency "
            f"{info['load']['concurrency']}, {info['load']['requests']} requests x "
            f"{info['rounds']} rounds\n"
        )
        if t:
            bins = ", ".join(f"{k}: {v:.0%}" for k, v in t["share_by_bin"].items())
            lines.append(
                f"Tokens per request sent: {bins}; min {t['min']}, median {t['median']:g}, "
                f"mean {t['mean']}, p95 {t['p95']}, max {t['max']}.\n"
            )
        lines += [
            "| variant | settings | req/s (median; rounds) | P50 ms | P99 ms | CPU ms/req "
            "server+client | of the 2 cores | vs plain's bound | useful tokens | "
            "mean micro-batch |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r["load"] == load):
            rounds = ", ".join(f"{x:.1f}" for x in r["rounds_requests_per_s"])
            lines.append(
                f"| {r['variant']} | {r['settings']} | **{r['requests_per_s']:.1f}** ({rounds}) | "
                f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['server_cpu_ms_per_request']:.1f}"
                f"+{r['client_cpu_ms_per_request']:.1f} | {r['machine_use']:.0%} | "
                f"{r['of_plain_bound']:.2f}x | {_f(r['useful_token_share'], '.0%')} | "
                f"{_f(r['mean_micro_batch_size'], '.1f')} |"
            )
        lines += ["", "| ratio | throughput (median; per round) | P99 (median; per round) |"]
        lines.append("|---|---|---|")
        for key, c in comparisons.get(load, {}).items():
            thr = ", ".join(f"{r['throughput']:.2f}" for r in c["rounds"])
            p99 = ", ".join(f"{r['p99']:.2f}" for r in c["rounds"])
            lines.append(
                f"| {key}: {c['what']} | **{c['throughput']:.2f}x** ({thr}) | "
                f"**{c['p99']:.2f}x** ({p99}) |"
            )
        lines.append("")
    lines += [
        "### Targets\n",
        "| load | ratio | target | median (rounds) | met |",
        "|---|---|---|---|---|",
    ]
    for t in targets:
        rounds = ", ".join(f"{x:.2f}" for x in t["rounds"])
        verdict = "yes" if t["met"] else f"no (short by {t['missed_by']:.2f}x)"
        lines.append(
            f"| {t['load']} | {t['ratio']} | {t['target']} | {t['median']:.2f} ({rounds}) | "
            f"{verdict} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median throughput and P99 per variant, one group of bars per corpus and batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = list(dict.fromkeys(r["load"] for r in rows))
    variants = sorted({r["variant"] for r in rows}, key=_order)
    fig, axes = plt.subplots(1, 2, figsize=(15, 5))
    width = 0.8 / len(variants)
    for i, name in enumerate(variants):
        got = {r["load"]: r for r in rows if r["variant"] == name}
        xs = [k + (i - (len(variants) - 1) / 2) * width for k in range(len(loads))]
        for ax, key in zip(axes, ("requests_per_s", "p99_ms")):
            ax.bar(xs, [got[load][key] if load in got else 0 for load in loads], width, label=name)
    axes[0].set(
        ylabel="throughput (requests/s)", yscale="log", title="BERT 4x256, CPU: median throughput"
    )
    axes[1].set(ylabel="P99 latency (ms)", title="P99 latency (median-throughput run)")
    labels = [load.replace("-budget2048", " (2nd run)").replace("-b", "\nbatch ") for load in loads]
    for ax in axes:
        ax.set_xticks(range(len(loads)), labels, fontsize=8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="everything: corpora, sweep, every load, the report")
    r.add_argument("--mar", type=Path, default=ROOT / "model_store/bert_mb.mar")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--run", type=Path, help="default benchmarks/runs/text-lengths-<time>")
    r.add_argument("--results", type=Path, default=HERE / "results/text_lengths")
    r.add_argument("--lock", help="a file: every TorchServe run is taken under flock on it")
    c = sub.add_parser("corpus", help="a text corpus with a mix of lengths")
    c.add_argument("--mix", type=parse_mix, required=True, help="PERCENT:MIN-MAX,...")
    c.add_argument("--count", type=int, default=500)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--generator", default=DEFAULT_GENERATOR, help="module:function")
    c.add_argument("--tokenizer", type=Path, help="a tokenizer directory: the mix is in its tokens")
    p = sub.add_parser("pick", help="the .mar with the sweep's fastest setting")
    p.add_argument("sweep", type=Path)
    p.add_argument("--mar", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("report", help="results.json, results.csv, tables.md, plot.png")
    s.add_argument("run", type=Path)
    s.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "run":
        run_dir = args.run or HERE / "runs" / time.strftime("text-lengths-%Y%m%d-%H%M%S")
        run(args.mar.resolve(), run_dir.resolve(), args.results.resolve(), args.rounds, args.lock)
    elif args.command == "corpus":
        corpus(args)
    elif args.command == "pick":
        pick(args.sweep, args.mar, args.out)
    else:
        report(args.run, args.out)
    return 0


def corpus(args: argparse.Namespace) -> None:
    make_text = load_generator(args.generator)
    if args.tokenizer is None:
        paths = write_corpus(args.out, args.mix, args.count, make_text, args.seed)
        print(f"wrote {len(paths)} bodies to {args.out}")
        return
    written = write_token_corpus(
        args.out, args.mix, args.count, make_text, token_counter(args.tokenizer), args.seed
    )
    print(f"wrote {len(written)} bodies to {args.out}; tokens per body:")
    print(describe([count for _, count in written], args.mix))


if __name__ == "__main__":
    sys.exit(main())
