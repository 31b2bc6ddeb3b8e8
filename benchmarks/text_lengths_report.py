"""``report`` for benchmarks/text_lengths.py: the runs of every corpus and batch size
(each a benchmark-ab.py ``--mar`` result directory under the run directory) summed up.

Ratios are taken within a round (the variants of a round ran back to back on this shared
machine) and their median over the rounds is the headline; throughput, P50, P99, CPU and
the useful-token share are the median-throughput run's. CPU per request counts the server
(TorchServe's frontend and its worker) and the load generator, which share the 2 cores: the
machine's bound for a variant is 2 cores / its CPU per request.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

LOADS = (
    "long_tail-b32",
    "long_tail-b16",
    "short-b32",
    "long-b32",
    # a second run of the uniform corpora with the example's default budget beside ours
    "short-b32-budget2048",
    "long-b32-budget2048",
)
ORDER = ("plain", "upstream4", "arrival4", "upstream8", "arrival8", "ours", "budget2048")
CORES = 2
BINS = ((8, 64), (65, 256), (257, 512))
# (numerator, denominator, what it says); "better" is the faster of plain and upstream4 in
# that round.
PAIRS = (
    ("ours", "upstream4", "ours (length+budget) vs upstream, micro-batch 4"),
    ("ours", "upstream8", "ours (length+budget) vs upstream, micro-batch 8"),
    ("ours", "plain", "ours vs the plain handler"),
    ("ours", "better", "ours vs the better of plain and upstream4"),
    ("arrival4", "upstream4", "like for like: ours in arrival order vs upstream, both 4"),
    ("arrival8", "upstream8", "like for like: ours in arrival order vs upstream, both 8"),
    ("ours", "arrival4", "length order + budget vs arrival order (ours, 4)"),
    ("budget2048", "better", "budget 2048 vs the better of plain and upstream4"),
)
TARGETS = (
    ("long_tail-b32", "ours", "upstream4", "throughput", ">=", 1.8),
    ("long_tail-b32", "ours", "upstream4", "p99", "<=", 0.6),
    ("long_tail-b32", "ours", "plain", "throughput", ">=", 2.0),
    ("short-b32", "ours", "better", "throughput", ">=", 0.95),
    ("long-b32", "ours", "better", "throughput", ">=", 0.95),
    ("short-b32-budget2048", "ours", "better", "throughput", ">=", 0.95),
    ("long-b32-budget2048", "ours", "better", "throughput", ">=", 0.95),
    ("short-b32-budget2048", "budget2048", "better", "throughput", ">=", 0.95),
    ("long-b32-budget2048", "budget2048", "better", "throughput", ">=", 0.95),
)


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
