"""Latency against offered load: open-loop sweeps over request rates, and what they mean.

For one served model, ``sweep`` offers rising request rates (``ts_microbatch.tools.
openloop``: Poisson arrivals sent on schedule) and records, per rate, what was achieved, the
latency percentiles from each request's scheduled time, errors, timeouts and late sends.
It stops one rate after the model fell behind (achieved under ``FELL_BEHIND`` of offered,
or a P99 over ``GAVE_UP_P99_MS``): past saturation every point says the same thing, and each
costs a queue's worth of waiting. ``sustained`` reads a latency objective off the curve (the
highest rate held with its P99 within it, nothing lost), and ``plot`` draws every variant's
P99 against offered load on one PNG.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .corpus import Corpus
from .drive import send_corpus, summarize
from .openloop import OpenLoopResult, run_open_loop

# Past the model's capacity the queue grows through a run: the last quarter's median latency
# is this much over the first quarter's (or fewer than FELL_BEHIND of the requests drawn
# were answered, or P99 passed GAVE_UP_P99_MS). One more point is kept to show it, then the
# sweep stops.
QUEUE_GROWTH_MS = 100.0
FELL_BEHIND = 0.9
GAVE_UP_P99_MS = 10_000.0


def behind(row: dict[str, Any]) -> bool:
    """Whether a point is past the model's capacity (module constants)."""
    return bool(
        row.get("queue_growth_ms", 0.0) > QUEUE_GROWTH_MS
        or row["achieved_per_s"] < FELL_BEHIND * row.get("realized_per_s", row["offered_per_s"])
        or row["p99_ms"] > GAVE_UP_P99_MS
    )


def parse_rates(text: str) -> list[float]:
    """``"20,40,80"`` or a range ``"20:200:20"`` (start:stop:step, stop included): rates in
    requests per second, rising.

    Raises:
        ValueError: not numbers > 0, or not rising.
    """
    try:
        if ":" in text:
            start, stop, step = (float(part) for part in text.split(":"))
            if step <= 0:
                raise ValueError
            count = int(math.floor((stop - start) / step + 1e-9)) + 1
            rates = [round(start + i * step, 6) for i in range(count)]
        else:
            rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        rates = []
    if not rates or any(not rate > 0 or not math.isfinite(rate) for rate in rates):
        raise ValueError(f"--rates: got {text!r}, expected rates > 0 as 20,40,80 or 20:200:20")
    if sorted(set(rates)) != rates:
        raise ValueError(f"--rates: got {text!r}, expected rising rates")
    return rates


def sweep(
    url: str,
    bodies: Sequence[bytes],
    rates: Iterable[float],
    *,
    requests_per_rate: int | Callable[[float], int],
    headers: dict[str, str] | None = None,
    seed: int = 0,
    timeout_s: float = 60.0,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[OpenLoopResult]:
    """One result per rate offered, rising, until one past the point where the model fell
    behind. ``requests_per_rate``: a count, or one per rate (so that every point lasts about
    as long)."""
    results: list[OpenLoopResult] = []
    past = False
    for index, rate in enumerate(rates):
        count = requests_per_rate(rate) if callable(requests_per_rate) else requests_per_rate
        result = run_open_loop(
            url, bodies, rate, max(1, count), seed=seed + index, headers=headers,
            timeout_s=timeout_s,
        )  # fmt: skip
        results.append(result)
        row = result.summary()
        if progress is not None:
            progress(row)
        if past:
            break
        past = behind(row)
    return results


class CurveSender:
    """A ``measure.Send`` for the benchmark's ``--rates``: the warm-up from parallel
    clients as usual, the measured run a sweep over ``rates`` on the same server (the
    curve rides in the summary under ``"curve"``; the summary's own figures are over every
    request of the sweep, latency from each one's scheduled send)."""

    def __init__(
        self,
        corpus: Corpus,
        rates: Sequence[float],
        seconds_per_rate: float,
        concurrency: int,
        log: Callable[[str], None],
        seed: int = 0,
    ) -> None:
        self.corpus = corpus
        self.rates = list(rates)
        self.seconds_per_rate = seconds_per_rate
        self.concurrency = concurrency
        self.log = log
        self.seed = seed

    def __call__(
        self, url: str, token: str | None, requests: int, work: Path, label: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        if label.endswith("warm-up"):
            return send_corpus(url, self.corpus, requests, self.concurrency, token=token)
        bodies = [self.corpus.bodies[i].data for i in self.corpus.sequence(len(self.corpus.order))]
        headers = {"Content-Type": self.corpus.bodies[self.corpus.order[0]].content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"

        def progress(row: dict[str, Any]) -> None:
            self.log(
                f"  {label}: {row['offered_per_s']:g}/s offered, {row['achieved_per_s']:.1f} "
                f"answered, P99 {row['p99_ms']:.0f} ms, {row['late_sends']} late sends"
            )

        results = sweep(
            url, bodies, self.rates, headers=headers, seed=self.seed, progress=progress,
            requests_per_rate=lambda rate: max(50, int(rate * self.seconds_per_rate)),
        )  # fmt: skip
        every = [
            (s.status, math.inf if s.latency_s is None else 1000 * s.latency_s)
            for result in results
            for s in result.sends
        ]
        summary, latency = summarize(
            every, sum(r.elapsed_s for r in results), sum(r.cpu_s for r in results)
        )
        summary["curve"] = [result.summary() for result in results]
        return summary, latency


def median_curves(runs: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per variant (``handler``), per offered rate: the median over rounds of each figure."""
    points: dict[str, dict[float, list[dict[str, Any]]]] = {}
    for run in runs:
        for row in run.get("curve") or ():
            points.setdefault(run["handler"], {}).setdefault(row["offered_per_s"], []).append(row)
    return {
        name: [
            {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            for _, rows in sorted(by_rate.items())
        ]
        for name, by_rate in points.items()
    }


def write_curves(
    out: Path, runs: Sequence[dict[str, Any]], slo_p99_ms: float | None, title: str = ""
) -> str:
    """curves.json (every round's points, and the medians), curves.md and p99.png in
    ``out``; returns the markdown."""
    middle = median_curves(runs)
    every = [{"handler": r["handler"], "round": r.get("repeat"), "curve": r.get("curve")}
             for r in runs if r.get("curve")]  # fmt: skip
    (out / "curves.json").write_text(json.dumps({"medians": middle, "runs": every}, indent=2))
    table = format_curves(middle, slo_p99_ms)
    (out / "curves.md").write_text(table + "\n")
    if plot(middle, out / "p99.png", title=title, slo_p99_ms=slo_p99_ms) is None:
        table += "\n(no p99.png: matplotlib is not installed)"
    return table


def sustained(rows: Iterable[dict[str, Any]], slo_p99_ms: float) -> float:
    """The highest offered rate held within the objective: P99 at most ``slo_p99_ms``, no
    error nor timeout, and not past the model's capacity (``behind``); 0 if none was."""
    held = [
        row["offered_per_s"]
        for row in rows
        if row["p99_ms"] <= slo_p99_ms
        and row["errors"] == 0
        and row["timeouts"] == 0
        and not behind(row)
    ]
    return max(held, default=0.0)


def plot(
    curves: dict[str, list[dict[str, Any]]],
    path: Path,
    *,
    title: str = "",
    slo_p99_ms: float | None = None,
) -> Path | None:
    """P99 against offered load, one line per variant, on a log scale; None (and nothing
    written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, rows in curves.items():
        finite = [r for r in rows if math.isfinite(r["p99_ms"])]
        ax.plot(
            [r["offered_per_s"] for r in finite], [r["p99_ms"] for r in finite],
            marker="o", label=name,
        )  # fmt: skip
    if slo_p99_ms is not None:
        ax.axhline(slo_p99_ms, color="grey", linestyle="--", label=f"P99 {slo_p99_ms:g} ms")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s, Poisson, open loop)")
    ax.set_ylabel("P99 latency from the scheduled send (ms)")
    ax.set_title(title or "latency against offered load")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_HEADER = "| offered/s | achieved/s | P50 ms | P90 ms | P99 ms | errors | timeouts | late sends |"


def format_curves(curves: dict[str, list[dict[str, Any]]], slo_p99_ms: float | None) -> str:
    """A markdown table per variant: offered, achieved, P50/P90/P99, errors, late sends."""
    lines = []
    for name, rows in curves.items():
        held = (
            f", holds {sustained(rows, slo_p99_ms):g} req/s within P99 {slo_p99_ms:g} ms"
            if (slo_p99_ms is not None)
            else ""
        )
        lines += [f"**{name}**{held}", ""]
        lines.append(
            "| offered/s | achieved/s | P50 ms | P90 ms | P99 ms | errors | timeouts | late sends |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in rows:
            lines.append(
                f"| {r['offered_per_s']:g} | {r['achieved_per_s']:.1f} | {r['p50_ms']:.1f} | "
                f"{r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | {r['timeouts']} | "
                f"{r['late_sends']} |"
            )
        lines.append("")
    return "\n".join(lines)
